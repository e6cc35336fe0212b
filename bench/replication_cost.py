#!/usr/bin/env python3
"""What a replicated store costs a claim (issue 20, item 7): the same closed-loop claim load
on three setups, alternated in one run:

  solo     one sbx-server with --kube_leader_election and no standby (acks alone)
  leader   the leader of two replicas, its standby in sync (every claim acknowledged only
           once the standby has it on disk), claims sent to the leader's port
  standby  the same pair, claims sent to the standby's port (relay + replication)

Starts kube-emulator (for the Leases: the solo server's in namespace bench-solo, the pair's
in bench-pair) and the three servers with --runtime instant and a warm pool, then runs
sbx-loadgen (--workload claim: each claim's latency, its Release sent after it outside the
measured time; --baseline: a Ping run with the same settings on the same port first) for
every round x concurrency x setup, the setups' order reversed every other round. Before
each run the pool is full again; for the pair's runs the Lease's sbx.dev/sync-replica
and the leader's sbx_replication_sync_standby are read before and after (the "sync"
column). Prints each run, then the medians over the
rounds and their differences from solo. Loopback only; stops by itself (--max_seconds).

Usage: python3 bench/replication_cost.py --server build/clang/src/cmd/sbx-server \\
         --emulator build/clang/tests/kube_emulator/kube-emulator \\
         --loadgen build/clang/bench/sbx-loadgen [--claims 2000] [--rounds 2] \\
         [--concurrency 1,8] [--allow_unsynced]

--allow_unsynced measures the pair even when its standby never reports in sync (binaries
without replication: then "leader" is a plain leader with an idle standby).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import start_emulator, stop_all, wait_for  # noqa: E402

POOL_SIZE = 500
CONFIG = """templates:
  - {name: bench, runtime: local, local: {network: false}}
pools:
  - {name: bench, template: bench, min_warm: %d, max_warm: %d, empty_pool_policy: wait, default_wait: 10s}
""" % (POOL_SIZE, POOL_SIZE)
SYNC_REPLICA = "sbx.dev/sync-replica"
SETUPS = ("solo", "leader", "standby")


def read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text else None
    except OSError:
        return None


class Server:
    def __init__(self, args, work, name, namespace, kubeconfig, config):
        self.name = name
        self.log = os.path.join(work, name + ".log")
        self.port_file = os.path.join(work, name + ".port")
        self.metrics_file = os.path.join(work, name + ".metrics-port")
        self.proc = subprocess.Popen(
            [args.server, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0",
             "--port_file", self.port_file, "--metrics_port_file", self.metrics_file,
             "--runtime", "instant", "--config", config, "--refill_qps", "100000",
             "--durability", args.durability, "--data_dir", os.path.join(work, name),
             "--kubeconfig", kubeconfig, "--kube_leader_election", "--kube_lease_namespace",
             namespace, "--kube_identity", name, "--sandbox_key_secret", "sbx-sandbox-key"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.port = wait_for(lambda: read_int(self.port_file) or self.dead(), 30,
                             name + " to serve")
        self.metrics_port = wait_for(lambda: read_int(self.metrics_file) or self.dead(), 30,
                                     name + "'s metrics")

    def dead(self):
        if self.proc.poll() is not None:
            with open(self.log) as f:
                raise SystemExit("%s exited:\n%s" % (self.name, f.read()[-3000:]))
        return None

    def leads(self):
        with open(self.log) as f:
            return "this replica leads" in f.read()

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port,
                                    timeout=10) as r:
            return r.read().decode()

    def warm(self):
        m = re.search(r'(?m)^sbx_pool_warm_sandboxes\{[^}]*pool="bench"[^}]*\} ([0-9.e+]+)$',
                      self.metrics())
        return float(m.group(1)) if m else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--emulator", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--claims", type=int, default=2000, help="measured claims per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--run_seconds", type=float, default=120,
                    help="a run (Ping baseline and claims) is abandoned after this long")
    ap.add_argument("--max_seconds", type=float, default=1200,
                    help="no run starts after this long (the whole benchmark)")
    ap.add_argument("--durability", default="sync")
    ap.add_argument("--allow_unsynced", action="store_true")
    args = ap.parse_args()
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    began = time.time()
    work = tempfile.mkdtemp(prefix="replication-cost-")
    procs = []
    try:
        kubeconfig = start_emulator(args.emulator, work, procs)
        kubectl = ["kubectl", "--kubeconfig", kubeconfig]
        namespaces = "".join('---\n{"apiVersion": "v1", "kind": "Namespace", "metadata": '
                             '{"name": "%s"}}\n' % ns for ns in ("bench-solo", "bench-pair"))
        subprocess.run(kubectl + ["apply", "-f", "-"], input=namespaces, text=True, check=True,
                       stdout=subprocess.DEVNULL)
        config = os.path.join(work, "bench.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)

        def lease(ns):
            out = subprocess.run(kubectl + ["-n", ns, "get", "lease", "sbx-controller", "-o",
                                            "json"], capture_output=True, text=True)
            return json.loads(out.stdout) if out.returncode == 0 else {}

        def sync_replica():
            return ((lease("bench-pair").get("metadata") or {}).get("annotations") or {}).get(
                SYNC_REPLICA)

        solo = Server(args, work, "solo", "bench-solo", kubeconfig, config)
        procs.append(solo.proc)
        a = Server(args, work, "replica-a", "bench-pair", kubeconfig, config)
        procs.append(a.proc)
        wait_for(lambda: a.leads() or a.dead(), 30, "replica-a to lead")  # the first one leads
        b = Server(args, work, "replica-b", "bench-pair", kubeconfig, config)
        procs.append(b.proc)
        wait_for(lambda: solo.leads() or solo.dead(), 30, "solo to lead")
        end = time.time() + 60
        while sync_replica() != "replica-b" and time.time() < end:
            time.sleep(0.5)
        if sync_replica() != "replica-b":
            if not args.allow_unsynced:
                raise SystemExit("replica-b never in sync (the Lease's %s is %r after 60 s); "
                                 "--allow_unsynced measures anyway"
                                 % (SYNC_REPLICA, sync_replica()))
            print("note: replica-b not in sync (%s %r): the pair runs measure a leader with an "
                  "idle standby" % (SYNC_REPLICA, sync_replica()), flush=True)
        ports = {"solo": solo.port, "leader": a.port, "standby": b.port}
        leaders = {"solo": solo, "leader": a, "standby": a}

        def sync_state():
            s = sync_replica()
            m = re.search(r"(?m)^sbx_replication_sync_standby(?:\{[^}]*\})? ([0-9.]+)$",
                          a.metrics())
            return "%s/%s" % (s if s is not None else "-", m.group(1) if m else "-")

        print("%-8s %4s %5s %6s %6s %8s %8s %8s %8s %9s %9s  %s"
              % ("setup", "conc", "round", "count", "failed", "p50 us", "p90 us", "p99 us",
                 "ops/s", "ping p50", "ping p99", "sync before -> after (Lease/metric)"),
              flush=True)
        results = {}
        stopped_early = False
        for r in range(args.rounds):
            for conc in concurrencies:
                order = SETUPS if r % 2 == 0 else tuple(reversed(SETUPS))
                for setup in order:
                    if time.time() - began > args.max_seconds:
                        stopped_early = True
                        break
                    leader = leaders[setup]
                    wait_for(lambda: leader.warm() >= POOL_SIZE or leader.dead(), 60,
                             "the pool of %s to be full" % leader.name)
                    before = sync_state() if setup != "solo" else ""
                    # --requests alone: with --duration too, sbx-loadgen divides by the
                    # whole duration even when the requests end first (its elapsed_s is the
                    # planned end). The run's bound is this process's timeout instead.
                    try:
                        out = subprocess.run(
                            [args.loadgen, "--server", "127.0.0.1:%d" % ports[setup],
                             "--workload", "claim", "--pool", "bench", "--concurrency",
                             str(conc), "--requests", str(args.claims), "--warmup", "0.5s",
                             "--baseline", "--json"],
                            check=True, capture_output=True, text=True,
                            timeout=args.run_seconds).stdout
                    except subprocess.TimeoutExpired:
                        print("%-8s %4d %5d  timed out after %g s (--run_seconds)"
                              % (setup, conc, r + 1, args.run_seconds), flush=True)
                        continue
                    report = json.loads(out)
                    res, ping = report["result"], report["baseline"]
                    after = sync_state() if setup != "solo" else ""
                    results.setdefault((setup, conc), []).append((res, ping))
                    lat, plat = res["latency_us"], ping["latency_us"]
                    print("%-8s %4d %5d %6d %6d %8.0f %8.0f %8.0f %8.0f %9.0f %9.0f  %s"
                          % (setup, conc, r + 1, lat["count"], res["failed"], lat["p50"],
                             lat["p90"], lat["p99"], res["throughput_ops_per_s"], plat["p50"],
                             plat["p99"], "%s -> %s" % (before, after) if before else ""),
                          flush=True)
                    if res["errors"]:
                        print("         errors: %s" % json.dumps(res["errors"])[:300], flush=True)

        print("\nmedians over the rounds (us; delta: minus solo's at the same concurrency)")
        print("%-8s %4s %6s %8s %8s %8s %9s %9s %9s %9s %9s"
              % ("setup", "conc", "count", "p50", "p90", "p99", "d p50", "d p90", "d p99",
                 "ping p50", "ping p99"))
        for conc in concurrencies:
            med = {}
            for setup in SETUPS:
                runs = results.get((setup, conc))
                if not runs:
                    continue
                med[setup] = {k: statistics.median(x["latency_us"][k] for x, _ in runs)
                              for k in ("p50", "p90", "p99")}
                med[setup]["count"] = sum(x["latency_us"]["count"] for x, _ in runs)
                for k in ("p50", "p99"):
                    med[setup]["ping " + k] = statistics.median(p["latency_us"][k]
                                                                for _, p in runs)
            for setup, m in med.items():
                base = med.get("solo")
                delta = ["%9.0f" % (m[k] - base[k]) if base else "%9s" % "-"
                         for k in ("p50", "p90", "p99")]
                print("%-8s %4d %6d %8.0f %8.0f %8.0f %s %9.0f %9.0f"
                      % (setup, conc, m["count"], m["p50"], m["p90"], m["p99"], " ".join(delta),
                         m["ping p50"], m["ping p99"]))
        if stopped_early:
            print("(stopped early: --max_seconds %g reached; not every round ran)"
                  % args.max_seconds)
    finally:
        stop_all(procs, work, "REPLICATION_COST_KEEP")


if __name__ == "__main__":
    sys.exit(main())
