#!/usr/bin/env python3
"""Failover time: kill -9 of the leader to the first claim served by its standby.

Runs e2e.k8s_pool's test_14 (two replicas with replicated stores against kube-emulator, a
storm of gRPC claims on both ports and SandboxClaims through the API, the leader killed -9
two seconds in) RUNS times for each sbx-server binary given, alternating them run by run
so that the machine's drift falls on both, and prints each run's takeover time (the test
measures it: from the kill to the first claim the standby answered) with the median,
minimum and maximum per binary. The first binary is the baseline.

  bench/failover_bench.py --emulator build/clang/tests/kube_emulator/kube-emulator \\
      --source . --runs 10 BASELINE/sbx-server NEW/sbx-server

Loopback only; each run is bounded by the test's own waits (and 300 s here).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

TAKEOVER = re.compile(r"first claim answered by replica-b ([0-9.]+) s after the kill")


def one_run(server, emulator, source):
    test = os.path.join(source, "tests", "e2e", "k8s_pool_test.py")
    started = time.time()
    p = subprocess.run(
        [sys.executable, test, server, emulator, source,
         "PoolTest.test_14_leader_killed_under_a_claim_storm_loses_no_acknowledged_claim"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        stdin=subprocess.DEVNULL)
    m = TAKEOVER.search(p.stdout)
    ok = p.returncode == 0
    return (float(m.group(1)) if m else None), ok, time.time() - started, p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--emulator", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("servers", nargs="+", help="sbx-server binaries; the first is the baseline")
    args = ap.parse_args()
    times = {s: [] for s in args.servers}
    for i in range(args.runs):
        for server in args.servers:
            t, ok, took, out = one_run(server, args.emulator, args.source)
            print("run %d %s: takeover %s s, test %s (%.0f s)" % (
                i + 1, server, "%.2f" % t if t is not None else "?",
                "passed" if ok else "FAILED", took), flush=True)
            if not ok:
                print(out[-3000:], flush=True)
            if t is not None:
                times[server].append(t)
    print("\n| sbx-server | runs | takeover p50 | min | max |\n|---|---:|---:|---:|---:|")
    for server, ts in times.items():
        if ts:
            print("| %s | %d | %.2f s | %.2f s | %.2f s |" % (
                server, len(ts), statistics.median(ts), min(ts), max(ts)))
        else:
            print("| %s | 0 | - | - | - |" % server)


if __name__ == "__main__":
    main()
