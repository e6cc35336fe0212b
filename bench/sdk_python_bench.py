#!/usr/bin/python3
"""What the Python SDK costs over raw grpcio, on one sbx-server (instant runtime).

    /usr/bin/python3 bench/sdk_python_bench.py [--iterations 2000] [--server HOST:PORT]

Without --server it starts build/clang/src/cmd/sbx-server --runtime instant (or
$SBX_TEST_SERVER_BIN) on 127.0.0.1:0 with a pool "bench" kept at 2,200 warm (store in a
temp dir under /tmp, --durability sync unless --durability buffered), and stops it at the end. It
measures, in one run:

1. claim + release latency, p50 / p90 / p99, through sbx.Client (sync), sbx.AsyncClient,
   and a raw grpcio stub (ClaimService.Claim + Release with a fresh claim_id) on a channel
   made with the SDK's own channel options; the three alternate in rounds so that drift
   (warm-up, other work on the machine) hits them alike;
2. 1,000 claims: one claim_batch(pool, 1000) vs 1,000 sequential client.claim() vs
   1,000 concurrent AsyncClient claims (time to hold all 1,000; releases timed apart).

It prints numbers; it does not pass or fail.
"""

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
import harness  # noqa: E402  (puts clients/python on sys.path)

import grpc  # noqa: E402

import sbx  # noqa: E402
from sbx import _common  # noqa: E402
from sbx.v1 import claims_pb2, claims_pb2_grpc  # noqa: E402

POOL = "bench"
WARM = 2200


def config():
    return f"""
templates:
  - name: bench
    runtime: local
    local: {{network: false}}
pools:
  - name: {POOL}
    template: bench
    min_warm: {WARM}
    max_warm: {WARM}
    empty_pool_policy: wait
    default_wait: 30s
"""


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def row(name, samples_s):
    us = [x * 1e6 for x in samples_s]
    return (f"{name:<28} {len(us):>6} {pct(us, 50):>9.0f} {pct(us, 90):>9.0f} "
            f"{pct(us, 99):>9.0f} {statistics.mean(us):>9.0f}")


def wait_warm(client, n, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        warm = {p.name: p.warm for p in client.pools()}.get(POOL, 0)
        if warm >= n:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"pool {POOL!r} has {warm} warm after {timeout} s, not {n}")
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="an sbx-server with a pool 'bench' (default: start one)")
    ap.add_argument("--iterations", type=int, default=2000,
                    help="claim+release pairs per client kind")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--durability", default="sync", choices=["sync", "buffered"],
                    help="of the server it starts: sync fsyncs each group commit (the "
                    "default); buffered isolates the client side from the disk")
    a = ap.parse_args()
    harness.clean_env()

    srv = None
    if a.server:
        target = a.server
    else:
        srv = harness.Server(config=config(), runtime="instant", durability=a.durability,
                             extra=["--refill_qps=100000", "--refill_max_creating=100000"])
        target = srv.target
    try:
        run(target, a.iterations, a.rounds)
    finally:
        if srv:
            srv.stop()


def run(target, iterations, rounds):
    client = sbx.Client(target)
    opts = _common.ConnectionSettings.resolve(target, None, False, None, None, None,
                                              None).options()
    raw_channel = grpc.insecure_channel(target, opts)
    raw = claims_pb2_grpc.ClaimServiceStub(raw_channel)
    loop = asyncio.new_event_loop()
    aclient = loop.run_until_complete(_make_async(target))
    wait_warm(client, WARM)

    def sdk_once():
        t = time.perf_counter()
        client.claim(POOL).release()
        return time.perf_counter() - t

    def raw_once():
        t = time.perf_counter()
        r = raw.Claim(claims_pb2.ClaimRequest(claim_id=f"raw-{uuid.uuid4().hex}", pool=POOL),
                      timeout=30)
        raw.Release(claims_pb2.ReleaseRequest(claim_id=r.claim.claim_id), timeout=30)
        return time.perf_counter() - t

    async def async_once():
        t = time.perf_counter()
        sb = await aclient.claim(POOL)
        await sb.release()
        return time.perf_counter() - t

    for _ in range(200):  # warm-up: connections, caches, the server's first claims
        sdk_once()
        raw_once()
        loop.run_until_complete(async_once())
    per_round = max(1, iterations // rounds)
    samples = {"raw grpcio stub (sync)": [], "sbx.Client (sync)": [],
               "sbx.AsyncClient": []}
    for _ in range(rounds):
        samples["raw grpcio stub (sync)"] += [raw_once() for _ in range(per_round)]
        samples["sbx.Client (sync)"] += [sdk_once() for _ in range(per_round)]
        samples["sbx.AsyncClient"] += [loop.run_until_complete(async_once())
                                       for _ in range(per_round)]
    print(f"claim + release, one at a time, {target} (instant runtime); microseconds")
    print(f"{'client':<28} {'n':>6} {'p50':>9} {'p90':>9} {'p99':>9} {'mean':>9}")
    for name, s in samples.items():
        print(row(name, s))

    print()
    print("1,000 claims (seconds to hold all 1,000; then seconds to release them)")
    wait_warm(client, 1000)
    t = time.perf_counter()
    group = client.claim_batch(POOL, 1000)
    t_batch = time.perf_counter() - t
    t = time.perf_counter()
    group.release()
    r_batch = time.perf_counter() - t
    assert len(group) == 1000

    wait_warm(client, 1000)
    t = time.perf_counter()
    held = [client.claim(POOL) for _ in range(1000)]
    t_single = time.perf_counter() - t
    t = time.perf_counter()
    for sb in held:
        sb.release()
    r_single = time.perf_counter() - t

    wait_warm(client, 1000)

    async def concurrent():
        t0 = time.perf_counter()
        got = await asyncio.gather(*(aclient.claim(POOL) for _ in range(1000)))
        t1 = time.perf_counter()
        await asyncio.gather(*(sb.release() for sb in got))
        return t1 - t0, time.perf_counter() - t1
    t_conc, r_conc = loop.run_until_complete(concurrent())
    for name, held_s, released_s, how in (
            ("claim_batch(pool, 1000), one call", t_batch, r_batch, "16 threads"),
            ("1,000 x client.claim(), sequential", t_single, r_single, "sequential"),
            ("1,000 x AsyncClient.claim(), concurrent", t_conc, r_conc, "concurrent")):
        print(f"{name:<44} {held_s:>7.3f} s   release {released_s:.3f} s ({how})")

    loop.run_until_complete(aclient.close())
    loop.close()
    raw_channel.close()
    client.close()


async def _make_async(target):
    return sbx.AsyncClient(target)


if __name__ == "__main__":
    main()
