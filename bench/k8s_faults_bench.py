#!/usr/bin/python3
"""gRPC claims on a Kubernetes-backed pool with and without API faults, side by side.

One kube-emulator (5 ms latency) and one `sbx-server --runtime kubernetes` with a warm pool;
the same open-loop gRPC claim load (WAIT policy, 10 s deadline, each claim released once
acknowledged so that the pool keeps refilling) runs first fault-free, then with injected
faults (429 5%, 500 5%, 503 2%, 409 on 5% of writes, 5% watch drops, one compaction forcing
410 relists). Prints, per phase, claims acknowledged per second, p50 and p99 of the
acknowledged ones, and how many ended DEADLINE_EXCEEDED or with another error. Bounded in
time; loopback only; prints numbers, asserts nothing.

Usage: k8s_faults_bench.py --server PATH --emulator PATH --source DIR
       [--replicas 200] [--rate 20] [--seconds 20]
"""

import argparse
import os
import sys
import threading
import time


class Cleanups:
    """Stands in for the unittest.TestCase the e2e cluster harness expects."""

    def __init__(self):
        self.fns = []

    def addCleanup(self, fn, *args):  # noqa: N802  (unittest's name)
        self.fns.append((fn, args))

    def run(self):
        for fn, args in reversed(self.fns):
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001
                print("cleanup: %s" % e, file=sys.stderr)


FAULTS = {"errors": {"429": 0.05, "500": 0.05, "503": 0.02, "409": 0.05},
          "watch_drop_rate": 0.05}
NO_FAULTS = {"errors": {"429": 0, "500": 0, "503": 0, "409": 0}, "watch_drop_rate": 0}


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100.0 * (len(s) - 1) + 0.5))]


def run_phase(name, stub, pb, rate, seconds, threads=8):
    """Open loop: `rate` claims per second for `seconds`, spread over `threads` senders."""
    import grpc
    from sbx.v1 import types_pb2
    latencies, errors = [], {}
    lock = threading.Lock()
    start = time.time()
    interval = threads / float(rate)

    def sender(t):
        n = 0
        next_at = start + t * interval / threads
        while True:
            now = time.time()
            if now - start >= seconds:
                return
            if now < next_at:
                time.sleep(next_at - now)
            next_at += interval
            cid = "%s-%d-%d" % (name, t, n)
            n += 1
            t0 = time.time()
            try:
                stub.Claim(pb.ClaimRequest(pool="py", claim_id=cid,
                                           empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT),
                           timeout=10)
                with lock:
                    latencies.append((time.time() - t0) * 1000)
                try:
                    stub.Release(pb.ReleaseRequest(claim_id=cid), timeout=10)
                except grpc.RpcError:
                    pass
            except grpc.RpcError as e:
                with lock:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1

    workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.time() - start
    return {"phase": name, "acked_per_s": len(latencies) / took, "acked": len(latencies),
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "errors": errors}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--emulator", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--replicas", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20, help="offered gRPC claims per second")
    ap.add_argument("--seconds", type=float, default=20, help="length of each phase")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.source, "tests", "e2e"))
    import k8s_pool_test as pools  # noqa: E402
    import k8s_sandbox_test as base  # noqa: E402
    import sbx_e2e  # noqa: E402
    import grpc  # noqa: E402
    base.SBX_SERVER, base.KUBE_EMULATOR, base.SOURCE_DIR = (
        os.path.abspath(args.server), os.path.abspath(args.emulator), os.path.abspath(args.source))
    sbx_e2e.generate_stubs(os.path.join(args.source, "proto"))
    from sbx.v1 import claims_pb2, claims_pb2_grpc

    cleanups = Cleanups()
    try:
        c = pools.PoolCluster(cleanups, "--latency_ms", "5", "--seed", "23")
        server = c.start_pools()
        c.apply(pools.template(), pools.pool("py", args.replicas))
        c.wait_pool("py", args.replicas, timeout=300)
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        stub = claims_pb2_grpc.ClaimServiceStub(channel)
        results = [run_phase("clean", stub, claims_pb2, args.rate, args.seconds)]
        c.wait_pool("py", args.replicas, timeout=300)
        c.faults(FAULTS)
        compaction = threading.Timer(args.seconds / 2, c.http, ("POST", "/emulator/compact"))
        compaction.start()
        try:
            results.append(run_phase("faulted", stub, claims_pb2, args.rate, args.seconds))
        finally:
            compaction.cancel()
            c.faults(NO_FAULTS)
        channel.close()
    finally:
        cleanups.run()
    print("%-8s %10s %8s %9s %9s  %s" % ("phase", "acked/s", "acked", "p50 ms", "p99 ms",
                                          "errors"))
    for r in results:
        print("%-8s %10.1f %8d %9.1f %9.1f  %s" % (r["phase"], r["acked_per_s"], r["acked"],
                                                  r["p50_ms"], r["p99_ms"], r["errors"] or "-"))


if __name__ == "__main__":
    main()
