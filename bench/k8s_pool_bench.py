#!/usr/bin/env python3
"""Warm pools and claims on Kubernetes, against kube-emulator with injected latency.

Measures, in one run on one machine:
  1. refill: a SandboxWarmPool of N members filled from empty (Sandbox + pod each):
     sandboxes/s until status.readyReplicas == N, and API writes per member;
  2. gRPC claims on that Kubernetes-backed pool with sbx-loadgen (claims kept, so no
     refill work races them), with the Ping baseline of the same server in the same run;
  3. SandboxClaims created the way kubectl does (POST of the object): created -> Ready
     (seen on a watch) p50/p99, and API writes per claim counted by the emulator.

Usage: k8s_pool_bench.py --server sbx-server --emulator kube-emulator --loadgen sbx-loadgen
                         --source REPO [--members 10000] [--latency_ms 5] [--claims 300]
                         [--grpc_requests 3000] [--max_creating 500] [--emulator_nice 0] [--json]
Prints numbers; never passes or fails on them (exit 1 only when something breaks).
With SBX_BENCH_KEEP=1 in the environment the work folder (server.log, emu.log) is kept.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import urllib.parse

GROUP = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default"


def log(msg):
    sys.stderr.write("[%s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


class Api:
    """A tiny JSON client for the emulator (one connection per thread)."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.local = threading.local()

    def conn(self):
        if getattr(self.local, "c", None) is None:
            self.local.c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        return self.local.c

    def call(self, method, path, body=None, ctype="application/json"):
        for attempt in range(3):
            try:
                c = self.conn()
                c.request(method, path, body=json.dumps(body) if body is not None else None,
                          headers={"Content-Type": ctype, "Accept": "application/json"})
                r = c.getresponse()
                data = r.read()
                return r.status, json.loads(data) if data else None
            except (ConnectionError, http.client.HTTPException):
                self.local.c = None
                if attempt == 2:
                    raise


def cpu_seconds(pid):
    """User + system CPU time of process `pid` so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def claim_reconciles(port_file):
    """sbx_k8s_claim_reconciles_total{kind="kubectl"} scraped from the server's /metrics."""
    with open(port_file) as f:
        port = int(f.read().strip())
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("sbx_k8s_claim_reconciles_total") and 'kind="kubectl"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--emulator", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--members", type=int, default=10000)
    ap.add_argument("--latency_ms", type=int, default=5)
    ap.add_argument("--claims", type=int, default=300)
    ap.add_argument("--grpc_requests", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every claim succeeded and a SandboxClaim took at most "
                         "3 API writes (counts, never times: for the scaled-down ctest)")
    ap.add_argument("--kube_workers", type=int, default=64,
                    help="Sandbox controller workers (each waits on one request at a time)")
    ap.add_argument("--write_workers", type=int, default=64, help="--kube_write_workers")
    ap.add_argument("--emulator_nice", type=int, default=0,
                    help="run the emulator at this nice value (a stand-in for an API server on "
                         "other machines: its CPU then stops sitting in front of sbx's)")
    ap.add_argument("--max_creating", type=int, default=500,
                    help="--refill_max_creating (members in flight per pool)")
    ap.add_argument("--kube_http", default="socket", choices=["socket", "cpprest"],
                    help="sbx's HTTP client for the API server (--kube_http)")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="k8s-pool-bench-")
    procs = []

    def cleanup():
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        if not os.environ.get("SBX_BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)

    try:
        niced = ["nice", "-n", str(args.emulator_nice)] if args.emulator_nice else []
        emu = subprocess.Popen(niced + [args.emulator, "--listen", "127.0.0.1:0", "--latency_ms",
                                str(args.latency_ms), "--pod_ready_delay_ms", "0",
                                "--watch_history", "1000000"],
                               stdout=subprocess.PIPE, stderr=open(os.path.join(work, "emu.log"), "w"),
                               text=True)
        procs.append(emu)
        url = emu.stdout.readline().strip().split("serving on ")[1]
        api = Api(url)
        kubeconfig = os.path.join(work, "kubeconfig")
        with open(kubeconfig, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config",
                       "clusters": [{"name": "e", "cluster": {"server": url}}],
                       "users": [{"name": "e", "user": {"token": "t"}}],
                       "contexts": [{"name": "e", "context": {"cluster": "e", "user": "e"}}],
                       "current-context": "e"}, f)
        subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--validate=false", "-f",
                        os.path.join(args.source, "charts", "sbx", "crds")],
                       check=True, capture_output=True)
        subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "wait", "--for=condition=Established",
                        "crd", "--all", "--timeout=30s"], check=True, capture_output=True)
        port_file = os.path.join(work, "port")
        metrics_port_file = os.path.join(work, "metrics-port")
        server_log = open(os.path.join(work, "server.log"), "w")
        server = subprocess.Popen(
            [args.server, "--listen", "127.0.0.1:0", "--port_file", port_file, "--data_dir",
             os.path.join(work, "data"), "--runtime", "kubernetes", "--kubeconfig", kubeconfig,
             "--kube_namespace", "default", "--kube_qps", "0", "--kube_workers", str(args.kube_workers),
             "--kube_write_workers", str(args.write_workers), "--kube_write_qps", "0", "--refill_qps", "100000",
             "--refill_max_creating", str(args.max_creating), "--kube_http", args.kube_http,
             "--metrics_listen", "127.0.0.1:0", "--metrics_port_file", metrics_port_file,
             "--log_level", "warn"],
            stdout=server_log, stderr=subprocess.STDOUT)
        procs.append(server)
        deadline = time.time() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > deadline or server.poll() is not None:
                raise RuntimeError("sbx-server did not start; see its log")
            time.sleep(0.05)
        grpc_addr = "127.0.0.1:" + open(port_file).read().strip()
        api.call("POST", "/emulator/faults", {"latency_ms": 0})
        status, _ = api.call("POST", GROUP + "/sandboxtemplates", {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
            "metadata": {"name": "bench"},
            "spec": {"podTemplate": {"spec": {"containers": [
                {"name": "main", "image": "busybox", "command": ["sleep", "infinity"]}]}}}})
        assert status in (200, 201), status
        api.call("POST", "/emulator/faults", {"latency_ms": args.latency_ms})
        api.call("POST", "/emulator/stats/reset")

        # 1. Refill.
        log("refill: pool of %d members, %d ms API latency" % (args.members, args.latency_ms))
        cpu0 = (cpu_seconds(server.pid), cpu_seconds(emu.pid))
        t0 = time.time()
        status, _ = api.call("POST", GROUP + "/sandboxwarmpools", {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": "bench"},
            "spec": {"replicas": args.members, "sandboxTemplateRef": {"name": "bench"}}})
        assert status in (200, 201), status
        ready = 0
        while ready < args.members:
            if time.time() - t0 > 600 or server.poll() is not None:
                raise RuntimeError("pool not full: %d of %d ready" % (ready, args.members))
            time.sleep(0.1)
            _, p = api.call("GET", GROUP + "/sandboxwarmpools/bench")
            ready = ((p or {}).get("status") or {}).get("readyReplicas", 0)
        refill_s = time.time() - t0
        _, stats = api.call("GET", "/emulator/stats")
        cpu1 = (cpu_seconds(server.pid), cpu_seconds(emu.pid))
        refill = {"members": args.members, "seconds": round(refill_s, 2),
                  "sbx_cpu_ms_per_member": round((cpu1[0] - cpu0[0]) * 1000 / args.members, 3),
                  "emulator_cpu_ms_per_member": round((cpu1[1] - cpu0[1]) * 1000 / args.members, 3),
                  "sandboxes_per_s": round(args.members / refill_s, 1),
                  "writes_per_member": round(stats["writes"] / args.members, 2),
                  "requests": stats["requests"]}
        log("refill: %s" % json.dumps(refill))

        # 2. gRPC claims on the Kubernetes-backed pool, Ping baseline first.
        n = min(args.grpc_requests, args.members // 2)
        # Open loop at a steady rate: every claim also starts a refill and a binding (six
        # API writes) on the same two cores.
        rate = max(1, n // 5)
        out = subprocess.run([args.loadgen, "--server", grpc_addr, "--workload", "claim",
                              "--keep_claims", "--pool", "bench", "--empty_pool_policy", "fail",
                              "--rate", str(rate), "--requests", str(n), "--warmup", "0s",
                              "--baseline", "--json"], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError("sbx-loadgen failed: %s %s" % (out.stdout, out.stderr))
        grpc_result = json.loads(out.stdout)
        log("grpc claims: %s" % out.stdout.strip()[:600])

        # Let the binder write the SandboxClaims of those claims (all Ready) and the pool
        # refill, so that the next phase measures claims alone.
        t1 = time.time()
        while True:
            _, p = api.call("GET", GROUP + "/sandboxwarmpools/bench")
            _, cl = api.call("GET", GROUP + "/sandboxclaims?labelSelector=sbx.dev%2Fsource%3Dgrpc")
            bound = sum(1 for o in cl["items"] if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (o.get("status") or {}).get("conditions") or []))
            if (((p or {}).get("status") or {}).get("readyReplicas", 0) >= args.members and
                    bound >= n):
                grpc_result["sandboxclaims_bound_s"] = round(time.time() - t1, 2)
                break
            if time.time() - t1 > 600:
                raise RuntimeError("pool did not refill after the gRPC claims")
            time.sleep(0.2)
        time.sleep(1)

        # 3. SandboxClaims as kubectl creates them; Ready seen on a watch.
        ready_at = {}
        created_at = {}
        lock = threading.Lock()
        _, lst = api.call("GET", GROUP + "/sandboxclaims")
        rv = lst["metadata"]["resourceVersion"]
        wconn = http.client.HTTPConnection(api.host, api.port, timeout=600)
        wconn.request("GET", GROUP + "/sandboxclaims?watch=1&resourceVersion=" + rv)
        wresp = wconn.getresponse()

        def watch():
            for line in wresp:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                obj = ev.get("object") or {}
                name = (obj.get("metadata") or {}).get("name", "")
                for c in (obj.get("status") or {}).get("conditions") or []:
                    if c.get("type") == "Ready" and c.get("status") == "True":
                        with lock:
                            ready_at.setdefault(name, time.time())
        threading.Thread(target=watch, daemon=True).start()
        api.call("POST", "/emulator/stats/reset")
        reconciles0 = claim_reconciles(metrics_port_file)
        names = ["sandbox-claim-%08x" % i for i in range(args.claims)]
        for name in names:
            body = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
                    "metadata": {"name": name, "labels": {"agents.x-k8s.io/created-by": "bench"}},
                    "spec": {"warmPoolRef": {"name": "bench"}}}
            created_at[name] = time.time()
            status, obj = api.call("POST", GROUP + "/sandboxclaims", body)
            assert status == 201, (status, obj)
            time.sleep(0.02)  # 50 claims/s offered
        t2 = time.time()
        while True:
            with lock:
                done = sum(1 for n_ in names if n_ in ready_at)
            if done == len(names):
                break
            if time.time() - t2 > 120:
                raise RuntimeError("%d of %d claims Ready" % (done, len(names)))
            time.sleep(0.05)
        _, stats = api.call("GET", "/emulator/stats")
        # Settle: the echoes of the last claims' writes come back after Ready was seen.
        time.sleep(1)
        reconciles = claim_reconciles(metrics_port_file) - reconciles0
        lat = [(ready_at[n_] - created_at[n_]) * 1000 for n_ in names]
        req = stats["requests"]
        claim_writes = (req.get("create sandboxclaims", 0) + req.get("patch sandboxes", 0) +
                        req.get("patch sandboxclaims/status", 0) + req.get("update sandboxclaims/status", 0) +
                        0)
        claims = {"claims": len(names), "ready_p50_ms": round(percentile(lat, 50), 2),
                  "ready_p99_ms": round(percentile(lat, 99), 2),
                  "ready_max_ms": round(max(lat), 2),
                  "claim_writes_per_claim": round(claim_writes / len(names), 2),
                  "reconciles_per_claim": round(reconciles / len(names), 2),
                  "all_writes_per_claim_incl_refill": round(stats["writes"] / len(names), 2),
                  # The slowest claims by name, to look them up in server.log / emu.log.
                  "slowest": sorted(((round((ready_at[n_] - created_at[n_]) * 1000, 2), n_)
                                     for n_ in names), reverse=True)[:5],
                  "requests": req}
        log("kubectl-style claims: %s" % json.dumps(claims))
        result = {"latency_ms": args.latency_ms, "refill": refill, "grpc": grpc_result,
                  "sandboxclaims": claims}
        if args.json:
            print(json.dumps(result))
        else:
            print("refill: %d members in %.2f s = %.0f sandboxes/s, %.2f API writes per member"
                  % (args.members, refill_s, args.members / refill_s, refill["writes_per_member"]))
            print("SandboxClaim created -> Ready: p50 %.2f ms, p99 %.2f ms, max %.2f ms; "
                  "%.2f claim writes per claim (user's create included)"
                  % (claims["ready_p50_ms"], claims["ready_p99_ms"], claims["ready_max_ms"],
                     claims["claim_writes_per_claim"]))
            print("SandboxClaim reconciles per claim: %.2f (sbx_k8s_claim_reconciles_total"
                  "{kind=\"kubectl\"}, 1 s after the last Ready)" % claims["reconciles_per_claim"])
            b = grpc_result["baseline"]["latency_us"]
            r = grpc_result["result"]["latency_us"]
            print("gRPC claims on the Kubernetes-backed pool (sbx-loadgen, open loop %d/s, %d "
                  "claims): p50 %.0f us, p99 %.0f us, max %.0f us; Ping baseline p50 %.0f us, "
                  "p99 %.0f us; %d failed; their SandboxClaims all Ready %.2f s after the last"
                  % (rate, n, r["p50"], r["p99"], r["max"], b["p50"], b["p99"],
                     grpc_result["result"]["failed"], grpc_result.get("sandboxclaims_bound_s", -1)))
        if args.check:
            problems = []
            if grpc_result["result"]["failed"]:
                problems.append("%d gRPC claims failed" % grpc_result["result"]["failed"])
            if claims["claim_writes_per_claim"] > 3:
                problems.append("%.2f writes per SandboxClaim" % claims["claim_writes_per_claim"])
            if problems:
                print("CHECK FAILED: " + "; ".join(problems))
                return 1
        return 0
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
