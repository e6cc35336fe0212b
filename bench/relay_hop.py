#!/usr/bin/env python3
"""The cost of a standby's relay (issue 20, item 7): the same load on the leader's port and
on a standby's, in one run.

Starts kube-emulator (for the Lease) and two sbx-server replicas with
--kube_leader_election, --runtime instant and a deep warm pool, then runs sbx-loadgen
against each port in turn, alternating leader / standby, for Ping (answered by the standby
itself, so it shows the plain gRPC cost on that port) and Claim+Release (relayed). Prints
each run's line and the p50/p99 differences. Loopback only; stops by itself.

Usage: python3 bench/relay_hop.py --server build/clang/src/cmd/sbx-server \
         --emulator build/clang/tests/kube_emulator/kube-emulator \
         --loadgen build/clang/bench/sbx-loadgen [--duration 5s] [--rounds 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import start_emulator, stop_all, wait_for  # noqa: E402

CONFIG = """templates:
  - {name: bench, runtime: local, local: {network: false}}
pools:
  - {name: bench, template: bench, min_warm: 2000, max_warm: 2000, empty_pool_policy: wait, default_wait: 10s}
"""


def port_of(log_path):
    with open(log_path) as f:
        for line in f:
            if "sbx-server serving on port " in line:
                return int(line.split("serving on port ")[1].split()[0])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--emulator", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--duration", default="5s")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-hop-")
    procs = []
    try:
        kubeconfig = start_emulator(args.emulator, work, procs)
        config = os.path.join(work, "bench.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)
        logs = []
        for name in ("replica-a", "replica-b"):
            log = os.path.join(work, name + ".log")
            logs.append(log)
            procs.append(subprocess.Popen(
                [args.server, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0",
                 "--runtime", "instant", "--config", config, "--refill_qps", "100000",
                 "--data_dir", os.path.join(work, name), "--kubeconfig", kubeconfig,
                 "--kube_leader_election", "--kube_identity", name,
                 "--sandbox_key_secret", "sbx-sandbox-key"],
                stdout=open(log, "w"), stderr=subprocess.STDOUT))
            if name == "replica-a":
                # The first one leads.
                wait_for(lambda: "this replica leads" in open(log).read() or
                         procs[-1].poll() is not None, 30, "replica-a to lead")
        leader, standby = [wait_for(lambda p=p: port_of(p), 30, "a port") for p in logs]
        time.sleep(2)  # the pool fills (instant runtime) and the standby learns the leader
        results = {}
        for r in range(args.rounds):
            for workload in ("ping", "claim-release"):
                for role, port in (("leader", leader), ("standby", standby)):
                    out = subprocess.run(
                        [args.loadgen, "--server", "127.0.0.1:%d" % port, "--workload", workload,
                         "--pool", "bench", "--concurrency", str(args.concurrency),
                         "--duration", args.duration, "--json"],
                        check=True, capture_output=True, text=True).stdout
                    res = json.loads(out)["result"]
                    results.setdefault((workload, role), []).append(res)
                    lat = res["latency_us"]
                    print("round %d %-13s %-7s ok %d failed %d  %.0f ops/s  p50 %.0f us  p99 %.0f us"
                          % (r + 1, workload, role, res["ok"], res["failed"],
                             res["throughput_ops_per_s"], lat["p50"], lat["p99"]), flush=True)
        for workload in ("ping", "claim-release"):
            line = []
            for role in ("leader", "standby"):
                rs = results[(workload, role)]
                p50 = ["%.0f" % x["latency_us"]["p50"] for x in rs]
                p99 = ["%.0f" % x["latency_us"]["p99"] for x in rs]
                ops = ["%.0f" % x["throughput_ops_per_s"] for x in rs]
                line.append("%s p50 %s us, p99 %s us, %s ops/s" % (role, "/".join(p50),
                                                                  "/".join(p99), "/".join(ops)))
            print("%s: %s" % (workload, "; ".join(line)))
    finally:
        stop_all(procs, work, "RELAY_HOP_KEEP")


if __name__ == "__main__":
    sys.exit(main())
