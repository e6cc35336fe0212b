#!/usr/bin/python3
"""How far the durable claim path is from its physical floor, measured in one run.

    /usr/bin/python3 bench/claim_floor.py --server build/release/src/cmd/sbx-server \\
        --loadgen build/release/bench/sbx-loadgen [--duration 10s] [--data_dir DIR]

It starts sbx-server (--runtime instant, --durability sync: every acknowledged claim is
fsynced) with a deep warm pool, then measures on the same machine and disk:

1. the floor's parts: a 4 KiB append + fdatasync on the store's disk (the store's folder,
   a quiet disk, before any load; p50/p99 of --fsync_samples), and Ping at 2,000/s open
   loop (sbx-loadgen --baseline, same run as 2.);
2. durable Claim at 2,000/s open loop: p50 and p99, and the ratios of issue 21:
       claim p50 / (Ping p50 + fdatasync p50)   goal <= 1.5
       claim p99 / (Ping p99 + fdatasync p99)   goal <= 2.0
3. saturated Claim+Release (closed loop, 64 in flight, 2 connections) against saturated
   Ping in the same run: the throughput ratio, goal >= 0.35.

The third ratio of issue 21 (gRPC claims on a Kubernetes-backed pool during a full refill,
p99 <= 3 x Ping p99) is printed by bench/k8s_pool_bench.py. This script prints numbers and
the goals beside them; it does not pass or fail (--json for one JSON object).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

POOL = "bench"
CONFIG = """templates:
  - {name: bench, runtime: local, local: {network: false}}
pools:
  - {name: bench, template: bench, min_warm: %d, max_warm: %d, empty_pool_policy: wait, default_wait: 10s}
"""


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(round(p / 100.0 * len(s) + 0.5)) - 1))]


def fdatasync_floor(folder, samples):
    """p50 and p99 (us) of appending 4 KiB and fdatasync, as a write-ahead log does."""
    path = os.path.join(folder, "fdatasync-probe")
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        times = []
        for _ in range(samples):
            t0 = time.perf_counter_ns()
            os.write(fd, block)
            os.fdatasync(fd)
            times.append((time.perf_counter_ns() - t0) / 1000.0)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"p50": pct(times, 50), "p99": pct(times, 99), "samples": samples}


def loadgen(args, addr, *flags):
    cmd = [args.loadgen, "--server", addr, "--pool", POOL, "--duration", args.duration,
           "--warmup", args.warmup, "--baseline", "--json", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("sbx-loadgen failed (%d): %s %s" % (out.returncode, out.stdout,
                                                                 out.stderr))
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="sbx-server binary")
    ap.add_argument("--loadgen", required=True, help="sbx-loadgen binary")
    ap.add_argument("--data_dir", help="store folder (default: a new one under /tmp); the "
                    "fdatasync floor is measured there, so put it on the disk under test")
    ap.add_argument("--rate", type=int, default=2000, help="open-loop rate of 2. (claims/s)")
    ap.add_argument("--duration", default="10s", help="measured time of each loadgen run")
    ap.add_argument("--warmup", default="1s")
    ap.add_argument("--fsync_samples", type=int, default=2000)
    ap.add_argument("--warm", type=int, default=5000, help="warm sandboxes in the pool")
    ap.add_argument("--durability", default="sync", choices=["sync", "buffered"],
                    help="the server's --durability; buffered (no fsync per commit) shows what "
                         "the claim path costs besides the fsync, not a claim sbx acknowledges "
                         "durably")
    ap.add_argument("--server_arg", action="append", default=[],
                    help="one more sbx-server argument (repeatable), e.g. "
                         "--server_arg=--store_pipeline=false to compare the serial commit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="claim-floor-")
    data_dir = args.data_dir or os.path.join(work, "data")
    os.makedirs(data_dir, exist_ok=True)
    config = os.path.join(work, "bench.yaml")
    with open(config, "w") as f:
        f.write(CONFIG % (args.warm, args.warm))
    port_file = os.path.join(work, "port")
    server = None
    try:
        floor_fsync = fdatasync_floor(data_dir, args.fsync_samples)
        server = subprocess.Popen(
            [args.server, "--runtime", "instant", "--config", config, "--refill_qps", "100000",
             "--listen", "127.0.0.1:0", "--port_file", port_file, "--data_dir", data_dir,
             "--durability", args.durability, "--metrics_listen", "off", "--log_level", "warn",
             "--insecure_no_auth"] + args.server_arg,
            stdout=open(os.path.join(work, "server.log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > deadline or server.poll() is not None:
                raise RuntimeError("sbx-server did not start: %s" %
                                   open(os.path.join(work, "server.log")).read()[-2000:])
            time.sleep(0.05)
        addr = "127.0.0.1:" + open(port_file).read().strip()
        # The pool full before measuring (the instant runtime makes a sandbox at once).
        time.sleep(1)

        durable = loadgen(args, addr, "--workload", "claim", "--rate", str(args.rate))
        saturated = loadgen(args, addr, "--workload", "claim-release", "--concurrency", "64",
                            "--connections", "2")
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
        if not os.environ.get("SBX_BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)

    claim = durable["result"]["latency_us"]
    ping = durable["baseline"]["latency_us"]
    floor50 = ping["p50"] + floor_fsync["p50"]
    floor99 = ping["p99"] + floor_fsync["p99"]
    tput = saturated["result"]["throughput_ops_per_s"]
    ping_tput = saturated["baseline"]["throughput_ops_per_s"]
    result = {
        "fdatasync_us": floor_fsync,
        "open_loop": {"rate": args.rate, "claim_us": {"p50": claim["p50"], "p99": claim["p99"]},
                      "ping_us": {"p50": ping["p50"], "p99": ping["p99"]},
                      "claim_failed": durable["result"]["failed"]},
        "ratio_p50": round(claim["p50"] / floor50, 3),
        "ratio_p99": round(claim["p99"] / floor99, 3),
        "saturated": {"claim_release_per_s": tput, "ping_per_s": ping_tput,
                      "claim_release_failed": saturated["result"]["failed"]},
        "ratio_throughput": round(tput / ping_tput, 3) if ping_tput else None,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print("floor: 4 KiB append + fdatasync p50 %.0f us, p99 %.0f us (%d samples, %s)"
          % (floor_fsync["p50"], floor_fsync["p99"], floor_fsync["samples"], data_dir))
    print("open loop %d/s: durable claim p50 %.0f us, p99 %.0f us; Ping p50 %.0f us, p99 %.0f us;"
          " %d claims failed" % (args.rate, claim["p50"], claim["p99"], ping["p50"], ping["p99"],
                                 durable["result"]["failed"]))
    print("  claim p50 / (Ping p50 + fdatasync p50) = %.0f / %.0f = %.2f   (goal <= 1.5)"
          % (claim["p50"], floor50, result["ratio_p50"]))
    print("  claim p99 / (Ping p99 + fdatasync p99) = %.0f / %.0f = %.2f   (goal <= 2.0)"
          % (claim["p99"], floor99, result["ratio_p99"]))
    print("saturated (64 in flight, 2 connections): claim+release %.0f/s, Ping %.0f/s: "
          "ratio %.3f   (goal >= 0.35); %d failed"
          % (tput, ping_tput, result["ratio_throughput"] or 0,
             saturated["result"]["failed"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
