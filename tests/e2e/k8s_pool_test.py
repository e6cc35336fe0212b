"""End-to-end test of sbx serving SandboxWarmPools and SandboxClaims (--runtime kubernetes).

sbx-server runs against kube-emulator; the real kubectl makes pools and claims as a user
would, Python's grpcio makes gRPC claims. Every test starts its own emulator and server and
kills them at the end, even on failure. Nothing here asserts timing (failover times are
measured and printed).

Usage: python3 k8s_pool_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR
"""
import json
import os
import socket
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_sandbox_test as base  # noqa: E402  (Cluster, helpers)
import sbx_e2e  # noqa: E402

NS = base.NS
WARM = "agents.x-k8s.io/warm-pool-sandbox"
CLAIM_UID = "agents.x-k8s.io/claim-uid"
LAUNCH = "agents.x-k8s.io/launch-type"
POOLS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/%s/sandboxwarmpools" % NS
CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/%s/sandboxclaims" % NS
note = base.note


def template(name="python", env_policy=None, env=None):
    container = {"name": "main", "image": "python:3.12-slim", "command": ["sleep", "infinity"]}
    if env:
        container["env"] = env
    spec = {"podTemplate": {"spec": {"containers": [container]}}}
    if env_policy:
        spec["envVarsInjectionPolicy"] = env_policy
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def pool(name, replicas, template_name="python", strategy=None):
    spec = {"replicas": replicas, "sandboxTemplateRef": {"name": template_name}}
    if strategy:
        spec["updateStrategy"] = {"type": strategy}
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def claim(name, pool_name, **spec):
    body = {"warmPoolRef": {"name": pool_name}}
    body.update(spec)
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": body}


class PoolCluster(base.Cluster):
    def start_pools(self, *flags, namespace=NS, store="store"):
        """sbx-server with --runtime kubernetes serving `namespace` (None: every one)."""
        # One store for every server of the cluster (unless told): a restart finds its claims.
        metrics_port_file = os.path.join(self.dir, "metrics-port-%d" % len(self.servers))
        scope = ["--kube_namespace", namespace] if namespace else []
        server = self.start_server("--runtime", "kubernetes", *scope,
                                   "--refill_qps", "1000", "--data_dir",
                                   os.path.join(self.dir, store), "--metrics_port_file",
                                   metrics_port_file, *flags)
        server["metrics_port_file"] = metrics_port_file
        self.wait_for(lambda: "sbx-server serving on port" in self.read_log(server) or
                      server["proc"].poll() is not None, 20, "gRPC to serve")
        if server["proc"].poll() is not None:
            raise AssertionError("sbx-server exited:\n" + self.read_log(server)[-3000:])
        return server

    def metrics(self, server):
        """The server's /metrics text."""
        with open(server["metrics_port_file"]) as f:
            port = int(f.read().strip())
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            return r.read().decode()

    def grpc_port(self, server):
        for line in self.read_log(server).splitlines():
            if "sbx-server serving on port " in line:
                return int(line.split("serving on port ")[1].split()[0])
        raise AssertionError("no port in the log:\n" + self.read_log(server)[-2000:])

    def apply(self, *objects, check=True):
        """kubectl apply, repeated while injected faults make it fail (it is idempotent). An
        injected 409 reads like any conflict, and the answer to a conflict is to apply again."""
        retried = ("injected fault", "the object has been modified", "try again later")
        for attempt in range(20):
            r = super().apply(*objects, check=False)
            if r.returncode == 0 or not any(text in r.stderr for text in retried):
                break
            time.sleep(0.2)
        if check and r.returncode != 0:
            raise AssertionError("apply failed: %s\n%s" % (r.stderr, self.logs_tail(2000)))
        return r

    def wait_ready(self, name, timeout=60):
        self.wait_for(lambda: base.is_ready(self.claim_obj(name)), timeout,
                      "SandboxClaim %s to be Ready" % name)

    def members(self, pool_name):
        return [s for s in self.list(base.SANDBOXES)
                if (s["metadata"].get("labels") or {}).get(WARM) == base.name_hash(pool_name)
                and not s["metadata"].get("deletionTimestamp")]

    def swp(self, name):
        return self.get("%s/%s" % (POOLS, name))

    def claim_obj(self, name):
        return self.get("%s/%s" % (CLAIMS, name))

    def claims(self):
        return self.list(CLAIMS)

    def wait_pool(self, name, ready, timeout=60):
        def done():
            p = self.swp(name)
            st = (p or {}).get("status") or {}
            return st.get("readyReplicas") == ready and len(self.members(name)) == ready
        self.wait_for(done, timeout, "pool %s to have %d ready members" % (name, ready))


class PoolTest(unittest.TestCase):
    def cluster(self, *emu_flags):
        c = PoolCluster(self, *emu_flags)
        return c

    def grpc_stubs(self, c, server):
        from sbx.v1 import claims_pb2, claims_pb2_grpc
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        return claims_pb2, claims_pb2_grpc.ClaimServiceStub(channel)

    def assert_no_double_binding(self, c):
        """Every Sandbox has at most one claim, every claim at most one Sandbox."""
        owners = {}
        for s in c.list(base.SANDBOXES):
            refs = [r for r in s["metadata"].get("ownerReferences") or []
                    if r.get("kind") == "SandboxClaim"]
            self.assertLessEqual(len(refs), 1, s["metadata"])
            for r in refs:
                self.assertNotIn(r["uid"], owners, "claim %s holds two sandboxes" % r["name"])
                owners[r["uid"]] = s["metadata"]["name"]
        named = [(cl.get("status") or {}).get("sandbox", {}).get("name") for cl in c.claims()]
        named = [n for n in named if n]
        self.assertEqual(len(named), len(set(named)), "two claims name one sandbox: %s" % named)

    def test_01_pool_fills_scales_and_reports_status(self):
        c = self.cluster()
        c.start_pools()
        c.apply(template(), pool("py", 5))
        c.wait_pool("py", 5)
        p = c.swp("py")
        self.assertEqual(p["status"]["selector"], "%s=%s" % (WARM, base.name_hash("py")))
        self.assertEqual(p["status"]["observedGeneration"], p["metadata"]["generation"])
        for m in c.members("py"):
            labels = m["metadata"]["labels"]
            self.assertTrue(m["metadata"]["name"].startswith("py-"), m["metadata"]["name"])
            self.assertEqual(labels[LAUNCH], "warm")
            self.assertEqual(labels["agents.x-k8s.io/sandbox-template-ref-hash"],
                             base.name_hash("python"))
            self.assertEqual(m["metadata"]["ownerReferences"][0]["kind"], "SandboxWarmPool")
            self.assertIsNotNone(c.pod(m["metadata"]["name"]), "member without a pod")
        first = {m["metadata"]["name"] for m in c.members("py")}
        time.sleep(1.1)  # creationTimestamp has whole seconds: the next ones are newer
        c.kubectl("scale", "swp/py", "--replicas=8")
        c.wait_pool("py", 8)
        got = c.kubectl("get", "swp", "py", "-o", "jsonpath={.status.readyReplicas}").stdout
        self.assertEqual(got, "8")
        c.kubectl("scale", "swp/py", "--replicas=2")
        c.wait_pool("py", 2)
        left = {m["metadata"]["name"] for m in c.members("py")}
        # Scale-down removes the newest first: the two left are among the first five.
        self.assertTrue(left <= first, (left, first))
        c.kubectl("scale", "swp/py", "--replicas=0")
        c.wait_pool("py", 0)

    def test_02_kubectl_claim_adopts_a_warm_member(self):
        c = self.cluster()
        server = c.start_pools()
        c.apply(template(), pool("py", 3))
        c.wait_pool("py", 3)
        before = {m["metadata"]["name"] for m in c.members("py")}
        c.http("POST", "/emulator/stats/reset")
        job = claim("job-1", "py", additionalPodMetadata={"labels": {"team": "rl"}})
        # As upstream's Python client makes them.
        job["metadata"]["labels"] = {"agents.x-k8s.io/created-by": "python-client"}
        job["metadata"]["annotations"] = {
            "agents.x-k8s.io/client-first-requested-at":
                time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}
        c.apply(job)
        c.kubectl("wait", "sandboxclaim/job-1", "--for=condition=Ready", "--timeout=30s")
        cl = c.claim_obj("job-1")
        name = cl["status"]["sandbox"]["name"]
        self.assertIn(name, before, "the claim did not get a warm member")
        self.assertTrue(cl["status"]["sandbox"].get("podIPs"), cl["status"])
        sb = c.sandbox(name)
        labels = sb["metadata"]["labels"]
        self.assertNotIn(WARM, labels)
        self.assertEqual(labels[CLAIM_UID], cl["metadata"]["uid"])
        self.assertEqual(labels[LAUNCH], "warm")
        ref = sb["metadata"]["ownerReferences"][0]
        self.assertEqual((ref["kind"], ref["uid"]), ("SandboxClaim", cl["metadata"]["uid"]))
        # Upstream's notes on an adopted member: its pod and its template.
        self.assertEqual(sb["metadata"]["annotations"]["agents.x-k8s.io/pod-name"], name)
        self.assertEqual(sb["metadata"]["annotations"]["agents.x-k8s.io/sandbox-template-ref"],
                         "python")
        # As upstream: the claim's created-by replaces the member's "controller".
        self.assertEqual(labels["agents.x-k8s.io/created-by"], "python-client")
        self.assertEqual(c.pod(name)["metadata"]["labels"].get("team"), "rl")
        c.wait_pool("py", 3)  # refilled
        stats = c.stats()["requests"]
        note("requests after the claim: %s", json.dumps(stats, sort_keys=True))
        # The claim's own writes: one Sandbox patch, one status write (+ the pod metadata
        # patch asked for by additionalPodMetadata). A second reconcile before the informer
        # showed the binding sent the Sandbox patch again (2 in 3 of 10 runs at 660dada).
        self.assertEqual(stats.get("patch sandboxes", 0), 1, stats)
        self.assertEqual(stats.get("patch sandboxclaims/status", 0), 1, stats)
        # The pod metadata patch goes again only when the Sandbox changed (at most once
        # more, after the binding's echo), not on every reconcile of the claim.
        self.assertLessEqual(stats.get("patch pods", 0), 2, stats)
        # The upstream-compatible metrics saw it.
        text = c.metrics(server)
        self.assertIn('agent_sandbox_claim_creation_total{created_by="python-client",'
                      'launch_type="warm",namespace="default",pod_condition="ready",'
                      'sandbox_template="python",warmpool_name="py"} 1', text)
        self.assertRegex(text, r'agent_sandbox_build_info\{compiler="[^"]+",git_commit="[^"]+",'
                               r'git_version="[^"]+",platform="linux/[a-z0-9]+"\} 1')
        for latency in ("claim_startup", "claim_controller_startup", "client_claim_startup"):
            self.assertIn('agent_sandbox_%s_latency_ms_count{launch_type="warm",'
                          'sandbox_template="python"} 1' % latency, text)
        self.assertRegex(text, r'agent_sandboxes\{created_by="python-client",expired="false",'
                               r'launch_type="warm",namespace="default",owned_by="SandboxClaim",'
                               r'ready_condition="true",sandbox_template="python"\} 1')
        self.assertRegex(text, r'agent_sandboxes\{created_by="controller",expired="false",'
                               r'launch_type="warm",namespace="default",owned_by="SandboxWarmPool",'
                               r'ready_condition="true",sandbox_template="python"\} 3')
        c.kubectl("delete", "sandboxclaim", "job-1")
        c.wait_for(lambda: c.sandbox(name) is None, 30, "the claim's Sandbox to go")
        self.assert_no_double_binding(c)

    def test_03_cold_claim_and_policies(self):
        c = self.cluster()
        c.start_pools()
        c.apply(template(), template("strict", env_policy="Disallowed"),
                template("open", env_policy="Allowed", env=[{"name": "A", "value": "1"}]),
                pool("empty", 0), pool("strictp", 1, "strict"), pool("openp", 1, "open"))
        c.apply(claim("cold-1", "empty"))
        c.kubectl("wait", "sandboxclaim/cold-1", "--for=condition=Ready", "--timeout=30s")
        sb = c.sandbox("cold-1")
        self.assertEqual(sb["metadata"]["labels"][LAUNCH], "cold")
        self.assertEqual(sb["metadata"]["annotations"]["agents.x-k8s.io/sandbox-template-ref"],
                         "python")
        self.assertEqual(c.claim_obj("cold-1")["status"]["sandbox"]["name"], "cold-1")
        c.apply(claim("env-no", "strictp", env=[{"name": "X", "value": "1"}]),
                claim("env-clash", "openp", env=[{"name": "A", "value": "2"}]),
                claim("env-ok", "openp", env=[{"name": "B", "value": "2"}]),
                claim("nopool", "missing"))
        for name, reason in (("env-no", "EnvVarsInjectionRejected"),
                             ("env-clash", "EnvVarsInjectionRejected"),
                             ("nopool", "WarmPoolNotFound")):
            c.wait_for(lambda: base.cond_is(c.claim_obj(name), "Ready", "False", reason), 30,
                       "%s to be rejected with %s" % (name, reason))
        c.kubectl("wait", "sandboxclaim/env-ok", "--for=condition=Ready", "--timeout=30s")
        env = c.pod("env-ok")["spec"]["containers"][0]["env"]
        self.assertIn({"name": "B", "value": "2"}, env)
        self.assertIn({"name": "A", "value": "1"}, env)
        # shutdownTime in the past with Delete: the claim and its Sandbox go.
        c.apply(claim("old", "empty", lifecycle={"shutdownTime": "2020-01-01T00:00:00Z",
                                                 "shutdownPolicy": "Delete"}))
        c.wait_for(lambda: c.claim_obj("old") is None, 30, "the expired claim to be deleted")

    def test_04_grpc_claims_become_sandboxclaims(self):
        c = self.cluster()
        server = c.start_pools()
        c.apply(template(), pool("py", 4))
        c.wait_pool("py", 4)
        pb, stub = self.grpc_stubs(c, server)
        members = {m["metadata"]["name"] for m in c.members("py")}
        resp = stub.Claim(pb.ClaimRequest(pool="py", claim_id="agent-1"), timeout=10)
        sandbox = resp.claim.sandbox.id
        self.assertIn(sandbox, members)

        def bound():
            objs = [o for o in c.claims()
                    if (o.get("status") or {}).get("sandbox", {}).get("name") == sandbox]
            return objs and base.is_ready(objs[0]) and objs[0]
        c.wait_for(bound, 30, "the gRPC claim's SandboxClaim to be Ready")
        obj = bound()
        self.assertEqual(obj["metadata"]["annotations"]["sbx.dev/claim-id"], "agent-1")
        sb = c.sandbox(sandbox)
        self.assertEqual(sb["metadata"]["ownerReferences"][0]["uid"], obj["metadata"]["uid"])
        out = c.kubectl("get", "sandboxclaims", "-o", "name").stdout
        self.assertIn(obj["metadata"]["name"], out)
        # A retry gets the same sandbox; no second SandboxClaim.
        again = stub.Claim(pb.ClaimRequest(pool="py", claim_id="agent-1"), timeout=10)
        self.assertEqual(again.claim.sandbox.id, sandbox)
        stub.Release(pb.ReleaseRequest(claim_id="agent-1"), timeout=10)
        c.wait_for(lambda: c.claim_obj(obj["metadata"]["name"]) is None, 30,
                   "the SandboxClaim to go after Release")
        c.wait_for(lambda: c.sandbox(sandbox) is None, 30, "the released Sandbox to go")
        c.wait_pool("py", 4)

    def test_05_restart_during_a_claim_storm(self):
        c = self.cluster()
        server = c.start_pools()
        c.apply(template(), pool("py", 30))
        c.wait_pool("py", 30)
        pb, stub = self.grpc_stubs(c, server)
        # A storm: four clients claim as fast as they can while kubectl claims arrive; the
        # server is killed in the middle of it.
        acked = {}
        lock = threading.Lock()

        def client(t):
            for i in range(100):
                cid = "storm-%d-%d" % (t, i)
                try:
                    r = stub.Claim(pb.ClaimRequest(pool="py", claim_id=cid), timeout=10)
                except grpc.RpcError:
                    return  # the server is gone (or the pool empty): the storm is over
                with lock:
                    acked[cid] = r.claim.sandbox.id
                time.sleep(0.02)  # paced, so that the kill lands in the middle of the storm
        threads = [threading.Thread(target=client, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        c.apply(*[claim("k-%d" % i, "py") for i in range(6)])
        c.wait_for(lambda: len(acked) >= 12, 30, "12 acknowledged gRPC claims")
        server["proc"].send_signal(signal.SIGKILL)
        server["proc"].wait()
        for th in threads:
            th.join()
        note("killed sbx-server during the storm with %d gRPC claims acknowledged", len(acked))
        server2 = c.start_pools()
        pb, stub = self.grpc_stubs(c, server2)
        for cid, sandbox in acked.items():
            got = stub.GetClaim(pb.GetClaimRequest(claim_id=cid), timeout=10).claim
            self.assertEqual(got.sandbox.id, sandbox, cid)
            from sbx.v1 import types_pb2
            self.assertEqual(types_pb2.ClaimState.Name(got.state), "CLAIM_STATE_ACTIVE", cid)
        # Claims whose answer the kill cut off may exist too; all of them count.
        # (Every page: a storm that ran long acknowledges more claims than one page holds.)
        active, token = 0, ""
        while True:
            page = stub.ListClaims(pb.ListClaimsRequest(page_token=token), timeout=10)
            active += len(page.claims)
            token = page.next_page_token
            if not token:
                break
        self.assertGreaterEqual(active, len(acked))
        for i in range(6):
            c.kubectl("wait", "sandboxclaim/k-%d" % i, "--for=condition=Ready", "--timeout=60s")

        claimed_names = lambda: {(o.get("status") or {}).get("sandbox", {}).get("name")
                                 for o in c.claims()}

        def orphans():
            """Pods without a Sandbox; Sandboxes that are neither members nor claimed."""
            sandboxes = c.list(base.SANDBOXES)
            names = {s["metadata"]["name"] for s in sandboxes}
            keep = claimed_names() | {m["metadata"]["name"] for m in c.members("py")}
            return ([p["metadata"]["name"] for p in c.pods() if p["metadata"]["name"] not in names]
                    + [n for n in names if n not in keep])

        def converged():
            ready = [o for o in c.claims() if base.is_ready(o)]
            return len(ready) == active + 6 and len(c.members("py")) == 30 and not orphans()
        # Creates cut short by the kill are swept after the orphan grace period (30 s).
        c.wait_for(converged, 120, "every claim Ready, a full pool and no orphans after the restart",
                   state=lambda: {"ready": sorted(o["metadata"]["name"] for o in c.claims()
                                                  if base.is_ready(o)),
                                  "members": len(c.members("py")),
                                  "orphans": orphans()})
        self.assert_no_double_binding(c)

    def test_06_converges_under_api_faults(self):
        c = self.cluster("--seed", "7")
        c.start_pools()
        # 10% of requests fail: 429, 500, 409 (writes), 410 (watches and continues), and
        # watch streams drop.
        c.faults({"errors": {"429": 0.03, "500": 0.03, "409": 0.02, "410": 0.02},
                  "watch_drop_rate": 0.02})
        c.apply(template(), pool("py", 20))
        c.wait_pool("py", 20, timeout=120)
        c.apply(*[claim("f-%d" % i, "py") for i in range(8)])
        for i in range(8):
            c.wait_ready("f-%d" % i, 120)
        c.wait_pool("py", 20, timeout=120)
        c.faults({"errors": {"429": 0, "500": 0, "409": 0, "410": 0}, "watch_drop_rate": 0})
        total = len([s for s in c.list(base.SANDBOXES)])
        # 20 members + 8 claimed; anything beyond is surplus, which must stay bounded.
        self.assertLessEqual(total, 28 + 4, "surplus of %d Sandboxes" % (total - 28))
        self.assert_no_double_binding(c)

    def test_07_exec_and_files_through_sandboxd_in_the_pod(self):
        """A template whose pod runs sbx-sandboxd on a container port named sbx-sandboxd:
        the claim's endpoint is podIP:port and exec and files go through that daemon (here
        every pod's IP is 127.0.0.1 and one real sbx-sandboxd listens there, started with
        the secret sbx put into the claimed member's pod). A call without that secret is
        refused (issue 17: at 660dada the daemon took calls from anyone who reached it)."""
        from sbx.v1 import sandboxes_pb2, sandboxes_pb2_grpc
        from sbx.sandboxd.v1 import sandboxd_pb2, sandboxd_pb2_grpc
        sandboxd = os.path.join(os.path.dirname(base.SBX_SERVER), "sbx-sandboxd")
        c = self.cluster("--pod_ip", "127.0.0.1")
        work = os.path.join(c.dir, "workspace")
        os.makedirs(work)
        with socket.socket() as probe:  # a free port for the template to declare
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = c.start_pools()
        t = template()
        t["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = [
            {"name": "sbx-sandboxd", "containerPort": port}]
        c.apply(t, pool("py", 1))
        c.wait_pool("py", 1)
        pb, stub = self.grpc_stubs(c, server)
        resp = stub.Claim(pb.ClaimRequest(pool="py", claim_id="exec-1"), timeout=10)
        self.assertEqual(resp.claim.sandbox.endpoint, "127.0.0.1:%d" % port)
        pod = c.get("/api/v1/namespaces/%s/pods/%s" % (NS, resp.claim.sandbox.id))
        env = {e["name"]: e.get("value") for e in
               pod["spec"]["containers"][0].get("env", [])}
        secret = env.get("SBX_SANDBOXD_SECRET")
        self.assertTrue(secret and len(secret) == 64, pod["spec"]["containers"][0])
        log = open(os.path.join(c.dir, "sandboxd.log"), "w")
        self.addCleanup(log.close)
        daemon = subprocess.Popen([sandboxd, "--listen", "127.0.0.1:%d" % port,
                                   "--workspace", work], stdout=log, stderr=subprocess.STDOUT,
                                  env={"PATH": os.environ["PATH"], "SBX_SANDBOXD_SECRET": secret})
        self.addCleanup(base.proc_stop, daemon)
        direct = grpc.insecure_channel("127.0.0.1:%d" % port)
        self.addCleanup(direct.close)
        grpc.channel_ready_future(direct).result(timeout=20)
        daemon_stub = sandboxd_pb2_grpc.SandboxdStub(direct)
        for md in ((), (("sbx-sandbox-secret", "f" * 64),)):
            with self.assertRaises(grpc.RpcError) as e:
                daemon_stub.WriteFile(sandboxd_pb2.WriteFileRequest(path="pwned", content=b"x"),
                                      metadata=md, timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertFalse(os.path.exists(os.path.join(work, "pwned")))
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(channel)
        start = sandboxes_pb2.ExecStart(
            claim_id="exec-1",
            argv=["/bin/sh", "-c", "echo hello > f.txt; cat f.txt; env | grep -c SBX_ || true"])
        out, code = b"", None
        for r in sandboxes.Exec(iter([sandboxes_pb2.ExecRequest(start=start)]), timeout=20):
            if r.HasField("stdout_chunk"):
                out += r.stdout_chunk
            if r.HasField("exit"):
                code = r.exit.exit_code
        # The command does not see the secret in its environment.
        self.assertEqual((out, code), (b"hello\n0\n", 0))
        with open(os.path.join(work, "f.txt")) as f:
            self.assertEqual(f.read(), "hello\n")

    def test_07b_processes_files_and_ports_of_a_pod(self):
        """Issue 35 on the Kubernetes runtime: a background process, streamed files at an
        absolute path, and a port reached through sbx-server's port proxy at the pod's IP.
        As in test_07 every pod's IP is 127.0.0.1 and one real sbx-sandboxd listens there
        (with --sandbox_root standing for the container's root); the "pod's" web server is
        a real HTTP server on another loopback port, which the proxy must reach by the
        claim's pod IP, not through the daemon (the daemon's port relay is the local
        runtime's)."""
        import hashlib
        import http.server
        import threading
        from sbx.v1 import sandboxes_pb2 as sp, sandboxes_pb2_grpc
        sandboxd = os.path.join(os.path.dirname(base.SBX_SERVER), "sbx-sandboxd")
        c = self.cluster("--pod_ip", "127.0.0.1")
        work = os.path.join(c.dir, "workspace")
        root = os.path.join(c.dir, "container-root")
        os.makedirs(work)
        os.makedirs(os.path.join(root, "home", "user"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]

        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = ("pod page at %s" % self.path).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
        threading.Thread(target=web.serve_forever, daemon=True).start()
        self.addCleanup(web.server_close)
        self.addCleanup(web.shutdown)
        proxy_port_file = os.path.join(c.dir, "proxy-port")
        server = c.start_pools("--proxy_listen=127.0.0.1:0",
                               "--proxy_port_file=" + proxy_port_file)
        t = template()
        t["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = [
            {"name": "sbx-sandboxd", "containerPort": port}]
        c.apply(t, pool("py", 1))
        c.wait_pool("py", 1)
        pb, stub = self.grpc_stubs(c, server)
        resp = stub.Claim(pb.ClaimRequest(pool="py", claim_id="inside-1"), timeout=10)
        pod = c.get("/api/v1/namespaces/%s/pods/%s" % (NS, resp.claim.sandbox.id))
        env = {e["name"]: e.get("value") for e in
               pod["spec"]["containers"][0].get("env", [])}
        log = open(os.path.join(c.dir, "sandboxd.log"), "w")
        self.addCleanup(log.close)
        daemon = subprocess.Popen([sandboxd, "--listen", "127.0.0.1:%d" % port,
                                   "--workspace", work, "--sandbox_root", root],
                                  stdout=log, stderr=subprocess.STDOUT,
                                  env={"PATH": os.environ["PATH"],
                                       "SBX_SANDBOXD_SECRET": env["SBX_SANDBOXD_SECRET"]})
        self.addCleanup(base.proc_stop, daemon)
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        grpc.channel_ready_future(channel).result(timeout=20)
        sb = sandboxes_pb2_grpc.SandboxServiceStub(channel)
        claim = "inside-1"

        def daemon_up():
            try:
                sb.ListProcesses(sp.ListProcessesRequest(claim_id=claim), timeout=5)
                return True
            except grpc.RpcError:
                return False
        c.wait_for(daemon_up, 20, "the pod's daemon to answer through sbx-server")

        # A process that outlives its call, found again by its tag, fed and waited for.
        started = list(sb.StartProcess(sp.StartProcessRequest(
            claim_id=claim, argv=["/bin/sh", "-c", "echo up; read line; echo got $line"],
            tag="reader", stdin=True, detach=True), timeout=20))
        self.assertTrue(started and started[0].HasField("started"), started)
        listed = sb.ListProcesses(sp.ListProcessesRequest(claim_id=claim), timeout=10)
        self.assertEqual([p.tag for p in listed.processes], ["reader"])
        by_tag = sp.ProcessSelector(tag="reader")
        sb.SendProcessInput(sp.SendProcessInputRequest(claim_id=claim, process=by_tag,
                                                       data=b"pod\n"), timeout=10)
        done = sb.WaitProcess(sp.WaitProcessRequest(claim_id=claim, process=by_tag), timeout=20)
        self.assertEqual(done.exit.exit_code, 0)
        out = b"".join(e.stdout for e in sb.ConnectProcess(
            sp.ConnectProcessRequest(claim_id=claim, process=by_tag), timeout=20)
            if e.HasField("stdout"))
        self.assertEqual(out, b"up\ngot pod\n")

        # 3 MiB streamed to an absolute path, in the container's root, and back.
        blob = os.urandom(3 << 20)

        def upload():
            yield sp.UploadRequest(start=sp.UploadStart(claim_id=claim,
                                                        path="/home/user/data.bin"))
            for i in range(0, len(blob), 1 << 20):
                yield sp.UploadRequest(chunk=blob[i:i + (1 << 20)])
            yield sp.UploadRequest(finish=True)
        self.assertEqual(sb.UploadFile(upload(), timeout=30).bytes, len(blob))
        with open(os.path.join(root, "home", "user", "data.bin"), "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).digest(), hashlib.sha256(blob).digest())
        got = b"".join(ch.data for ch in sb.DownloadFile(
            sp.DownloadRequest(claim_id=claim, path="/home/user/data.bin"), timeout=30))
        self.assertEqual(got, blob)
        # Absolute paths mean the container's root, never the host's: /etc/hostname is not
        # in it, and ".." is refused outright.
        for path, code in (("/etc/hostname", grpc.StatusCode.NOT_FOUND),
                           ("/../../../etc/hostname", grpc.StatusCode.INVALID_ARGUMENT)):
            with self.assertRaises(grpc.RpcError) as e:
                list(sb.DownloadFile(sp.DownloadRequest(claim_id=claim, path=path), timeout=10))
            self.assertEqual(e.exception.code(), code, path)

        # A port of the pod through the proxy, by a signed URL: the proxy dials the pod's
        # IP (here 127.0.0.1) and the port asked for.
        url = sb.GetPortUrl(sp.GetPortUrlRequest(claim_id=claim, port=web.server_address[1]),
                            timeout=10).url
        with open(proxy_port_file) as f:
            self.assertIn(":%s/" % f.read().strip(), url)
        with urllib.request.urlopen(url.replace("/?", "/hello?"), timeout=10) as r:
            self.assertEqual(r.status, 200)
            self.assertEqual(r.read(), b"pod page at /hello")

    def test_08_members_that_never_become_ready_are_replaced(self):
        c = self.cluster()
        c.start_pools("--kube_ready_timeout_seconds", "1")
        # Pods take 8 s to become Ready: longer than the 1 s the pool waits for a member.
        code, _ = c.http("POST", "/emulator/kubelet", {"ready_delay_ms": 8000})
        self.assertEqual(code, 200)
        c.http("POST", "/emulator/stats/reset")
        c.apply(template(), pool("py", 3))
        c.wait_for(lambda: c.request_count("delete sandboxes") >= 3, 30,
                   "the members that did not become Ready to be deleted")
        self.assertEqual((c.swp("py").get("status") or {}).get("readyReplicas", 0), 0)
        c.http("POST", "/emulator/kubelet", {"ready_delay_ms": 50})
        c.wait_pool("py", 3)
        # The replacements did not leave extra members behind.
        time.sleep(1.5)
        self.assertEqual(len(c.members("py")), 3)

    def test_08b_unschedulable_members_wait_for_capacity(self):
        c = self.cluster()
        c.start_pools("--kube_ready_timeout_seconds", "1")
        c.http("POST", "/emulator/stats/reset")
        t = template()
        # No node carries this label: the scheduler leaves the pods Pending/Unschedulable.
        t["spec"]["podTemplate"]["spec"]["nodeSelector"] = {"sbx.dev/e2e-accelerator": "tpu"}
        c.apply(t, pool("py", 2))

        def unschedulable():
            members = c.members("py")
            return len(members) == 2 and all(
                any(cond.get("type") == "PodScheduled" and cond.get("status") == "False" and
                    cond.get("reason") == "Unschedulable"
                    for cond in (m.get("status") or {}).get("conditions") or [])
                for m in members)
        c.wait_for(unschedulable, 30, "both members to report PodScheduled=False/Unschedulable")
        # Several ready timeouts pass: an unschedulable member waits, it is not replaced.
        time.sleep(3.5)
        self.assertEqual(c.request_count("delete sandboxes"), 0, c.stats())
        self.assertEqual(c.request_count("create sandboxes"), 2, c.stats())
        self.assertEqual((c.swp("py").get("status") or {}).get("readyReplicas", 0), 0)
        # Capacity arrives (a node gets the label): the same two members become Ready.
        names = sorted(m["metadata"]["name"] for m in c.members("py"))
        c.kubectl("label", "node", "emu-node-1", "sbx.dev/e2e-accelerator=tpu")
        c.wait_pool("py", 2)
        self.assertEqual(sorted(m["metadata"]["name"] for m in c.members("py")), names)
        self.assertEqual(c.request_count("delete sandboxes"), 0, c.stats())

    def test_09_finished_sandbox_and_ttl_after_finished(self):
        c = self.cluster()
        c.start_pools()
        c.apply(template(), pool("py", 1))
        c.wait_pool("py", 1)
        c.apply(claim("done-1", "py", lifecycle={"ttlSecondsAfterFinished": 1}))
        c.wait_ready("done-1", 30)
        name = c.claim_obj("done-1")["status"]["sandbox"]["name"]
        code, out = c.http("POST", "/emulator/pods/fail",
                           {"namespace": NS, "name": name, "reason": "Error"})
        self.assertEqual(code, 200, out)
        # The claim mirrors Finished, then goes 1 s after it (and its Sandbox with it).
        c.wait_for(lambda: c.claim_obj("done-1") is None or
                   base.cond_is(c.claim_obj("done-1"), "Finished", "True"), 30,
                   "the claim to show Finished")
        c.wait_for(lambda: c.claim_obj("done-1") is None, 30,
                   "the claim to be deleted after ttlSecondsAfterFinished")
        c.wait_for(lambda: c.sandbox(name) is None, 30, "its Sandbox to go")
        c.wait_pool("py", 1)


    def test_10_restart_keeps_claims_whose_sandbox_exists(self):
        """kill -9, then a claimed member's pod stops being Ready (its Sandbox says so), so
        does a warm member's, and another claimed Sandbox is deleted while sbx-server is
        down. After the restart the first claim stays ACTIVE on the same sandbox; only the
        deleted one is LOST, logged and counted; the warm member is replaced. Failed at 0045959: the restart listed only Ready Sandboxes, so the
        claim on the not-Ready one became LOST too (issue 23)."""
        c = self.cluster()
        server = c.start_pools()
        c.apply(template(), pool("py", 4))
        c.wait_pool("py", 4)
        pb, stub = self.grpc_stubs(c, server)
        held = {}
        for cid in ("ready", "not-ready", "deleted"):
            held[cid] = stub.Claim(pb.ClaimRequest(pool="py", claim_id=cid), timeout=10).claim
        c.wait_pool("py", 4)  # refilled, the claimed ones bound (no longer members)
        server["proc"].send_signal(signal.SIGKILL)
        server["proc"].wait()

        def merge_patch(path, body):
            req = urllib.request.Request(c.url + path, data=json.dumps(body).encode(),
                                         method="PATCH",
                                         headers={"Content-Type": "application/merge-patch+json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                self.assertEqual(r.status, 200)
        def make_not_ready(name):
            """The pod's container no longer ready (as while it restarts), and the Sandbox's
            status as the controller writes it then."""
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            merge_patch("/api/v1/namespaces/%s/pods/%s/status" % (NS, name),
                        {"status": {"conditions": [
                            {"type": t, "status": "False", "reason": "ContainersNotReady",
                             "lastTransitionTime": now} for t in ("Ready", "ContainersReady")]}})
            sandbox = c.sandbox(name)
            conditions = [x for x in sandbox["status"]["conditions"] if x["type"] != "Ready"]
            conditions.append({"type": "Ready", "status": "False",
                               "reason": "DependenciesNotReady",
                               "message": "the pod is not Ready", "lastTransitionTime": now})
            merge_patch("%s/%s/status" % (base.SANDBOXES, name),
                        {"status": {"conditions": conditions}})
            self.assertFalse(base.is_ready(c.sandbox(name)))
        name = held["not-ready"].sandbox.id
        make_not_ready(name)
        # A warm member not Ready at the restart is replaced, not handed out.
        claimed = {h.sandbox.id for h in held.values()}
        warm = sorted(m["metadata"]["name"] for m in c.members("py")
                      if m["metadata"]["name"] not in claimed)[0]
        make_not_ready(warm)
        code, out = c.http("DELETE", "%s/%s" % (base.SANDBOXES, held["deleted"].sandbox.id))
        self.assertEqual(code, 200, out)
        c.wait_for(lambda: c.sandbox(held["deleted"].sandbox.id) is None, 20,
                   "the deleted Sandbox to go")

        server2 = c.start_pools()
        pb, stub = self.grpc_stubs(c, server2)
        from sbx.v1 import types_pb2
        state = {}
        for cid, was in held.items():
            got = stub.GetClaim(pb.GetClaimRequest(claim_id=cid), timeout=10).claim
            self.assertEqual(got.sandbox.id, was.sandbox.id, cid)
            state[cid] = types_pb2.ClaimState.Name(got.state)
        self.assertEqual(state, {"ready": "CLAIM_STATE_ACTIVE", "not-ready": "CLAIM_STATE_ACTIVE",
                                 "deleted": "CLAIM_STATE_LOST"}, c.logs_tail())
        self.assertFalse(base.is_ready(c.sandbox(name)))  # still not Ready, still held
        log = c.read_log(server2)
        self.assertIn('claim "deleted" of owner "anonymous" (pool "py") is LOST: its sandbox "%s"'
                      % held["deleted"].sandbox.id, log)
        self.assertNotIn('claim "not-ready"', log)
        self.assertIn('sbx_claims_lost_at_restart_total{reason="sandbox_missing"} 1',
                      c.metrics(server2))
        c.wait_for(lambda: c.sandbox(warm) is None, 30, "the warm member not Ready to go")
        c.wait_pool("py", 4)


    def test_11_grpc_suspend_and_resume(self):
        """Issue 20 item 8: a gRPC claim on a Kubernetes-backed pool is suspended as
        upstream suspends a Sandbox (operatingMode Suspended: the pod is deleted, the
        Sandbox and its claim stay) and resumed (a new pod; the claim's endpoint follows it
        to the new pod's IP). Answered UNIMPLEMENTED before 5a69e57."""
        from sbx.v1 import sandboxes_pb2, sandboxes_pb2_grpc
        c = self.cluster()
        server = c.start_pools()
        c.apply(template(), pool("py", 2))
        c.wait_pool("py", 2)
        pb, stub = self.grpc_stubs(c, server)
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(channel)
        held = stub.Claim(pb.ClaimRequest(pool="py", claim_id="sleeper"), timeout=10).claim
        name = held.sandbox.id
        old_ip = c.pod(name)["status"]["podIP"]
        self.assertIn(old_ip, held.sandbox.endpoint)

        r = sandboxes.Suspend(sandboxes_pb2.SuspendRequest(claim_id="sleeper"), timeout=30)
        self.assertTrue(r.sandbox.suspended)
        self.assertEqual(c.sandbox(name)["spec"]["operatingMode"], "Suspended")
        c.wait_for(lambda: c.pod(name) is None, 30, "the suspended Sandbox's pod to go")
        self.assertIsNotNone(c.sandbox(name), "the Sandbox of a suspended claim went")
        got = stub.GetClaim(pb.GetClaimRequest(claim_id="sleeper"), timeout=10).claim
        self.assertTrue(got.sandbox.suspended)
        self.assertEqual(got.sandbox.id, name)
        # Idempotent, as on the local runtime.
        sandboxes.Suspend(sandboxes_pb2.SuspendRequest(claim_id="sleeper"), timeout=30)

        r = sandboxes.Resume(sandboxes_pb2.ResumeRequest(claim_id="sleeper"), timeout=60)
        self.assertFalse(r.sandbox.suspended)
        self.assertEqual(r.sandbox.id, name)
        pod = c.pod(name)
        self.assertIsNotNone(pod, "answered resumed without a pod")
        new_ip = pod["status"]["podIP"]
        self.assertNotEqual(new_ip, old_ip)
        self.assertIn(new_ip, r.sandbox.endpoint)
        self.assertTrue(base.is_ready(c.sandbox(name)))
        got = stub.GetClaim(pb.GetClaimRequest(claim_id="sleeper"), timeout=10).claim
        self.assertFalse(got.sandbox.suspended)
        self.assertEqual(got.sandbox.endpoint, r.sandbox.endpoint)
        self.assertEqual(c.sandbox(name)["spec"]["operatingMode"], "Running")
        # The resumed sandbox is still the claim's: released, it goes; the pool refills.
        stub.Release(pb.ReleaseRequest(claim_id="sleeper"), timeout=10)
        c.wait_for(lambda: c.sandbox(name) is None, 30, "the released Sandbox to go")
        c.wait_pool("py", 2)

    def test_12_every_namespace_with_tenants_confined_to_theirs(self):
        """Issue 20, item 1. Without --kube_namespace, SandboxWarmPools and SandboxClaims of
        every namespace are served, each pool its own (one name in three namespaces is three
        pools); gRPC names a pool "<namespace>/<pool>" ("py" is the default namespace's), and
        a tenant of the tokens file confined to a namespace may claim only from its pools."""
        c = self.cluster()
        tokens = os.path.join(c.dir, "tokens")
        with open(tokens, "w") as f:
            f.write("tok-a alice namespaces=team-a\n")
            f.write("tok-ops ops admin\n")
        server = c.start_pools("--auth_tokens_file", tokens, namespace=None)

        def at(ns, obj):
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["namespace"] = ns
            return obj
        sizes = {"team-a": 2, "team-b": 1, NS: 1}
        c.apply(*({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                  for ns in ("team-a", "team-b")))
        for ns, replicas in sizes.items():
            c.apply(at(ns, template()), at(ns, pool("py", replicas)))

        def members(ns):
            path = "/apis/agents.x-k8s.io/v1beta1/namespaces/%s/sandboxes" % ns
            return [s for s in c.list(path)
                    if (s["metadata"].get("labels") or {}).get(WARM) == base.name_hash("py")
                    and not s["metadata"].get("deletionTimestamp")]

        def pool_ready(ns):
            path = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/%s/sandboxwarmpools/py"
            st = (c.get(path % ns) or {}).get("status") or {}
            return st.get("readyReplicas") == sizes[ns] and len(members(ns)) == sizes[ns]
        for ns in sizes:
            c.wait_for(lambda: pool_ready(ns), 60, "pool %s/py to be full" % ns)

        # A kubectl claim in team-b gets a member of team-b's pool.
        team_b = {m["metadata"]["name"] for m in members("team-b")}
        c.apply(at("team-b", claim("job", "py")))
        team_b_claim = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/team-b/sandboxclaims/job"
        c.wait_for(lambda: base.is_ready(c.get(team_b_claim)), 60, "team-b's claim to be Ready")
        self.assertIn(c.get(team_b_claim)["status"]["sandbox"]["name"], team_b)

        pb, stub = self.grpc_stubs(c, server)
        alice = [("authorization", "Bearer tok-a")]
        ops = [("authorization", "Bearer tok-ops")]
        team_a = {m["metadata"]["name"] for m in members("team-a")}
        got = stub.Claim(pb.ClaimRequest(pool="team-a/py", claim_id="a-1"), metadata=alice,
                         timeout=10).claim
        self.assertEqual(got.pool, "team-a/py")
        self.assertTrue(got.sandbox.id.startswith("team-a/"), got.sandbox.id)
        self.assertIn(got.sandbox.id.split("/", 1)[1], team_a)
        # Its SandboxClaim is in team-a, naming the Sandbox and the pool by their own names.
        path = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/team-a/sandboxclaims"

        def mirrored():
            objs = [o for o in c.list(path)
                    if (o["metadata"].get("annotations") or {}).get("sbx.dev/claim-id") == "a-1"]
            return objs and base.is_ready(objs[0]) and objs[0]
        c.wait_for(mirrored, 30, "the gRPC claim's SandboxClaim in team-a")
        obj = mirrored()
        self.assertEqual(obj["spec"]["warmPoolRef"]["name"], "py")
        self.assertEqual(obj["status"]["sandbox"]["name"], got.sandbox.id.split("/", 1)[1])

        # Outside its namespaces alice is refused, naming the namespace; nothing is taken.
        for other in ("team-b/py", "py", "default/py"):
            with self.assertRaises(grpc.RpcError) as e:
                stub.Claim(pb.ClaimRequest(pool=other, claim_id="a-x"), metadata=alice, timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED, other)
            self.assertIn("namespace", e.exception.details())
        # The admin's bare "py" is the default namespace's pool; spelled out, the same one.
        first = stub.Claim(pb.ClaimRequest(pool="py", claim_id="o-1"), metadata=ops,
                           timeout=10).claim
        self.assertEqual(first.pool, "py")
        self.assertNotIn("/", first.sandbox.id)
        again = stub.Claim(pb.ClaimRequest(pool="%s/py" % NS, claim_id="o-1"), metadata=ops,
                           timeout=10).claim
        self.assertEqual(again.sandbox.id, first.sandbox.id)
        # A malformed namespace is named in the error.
        with self.assertRaises(grpc.RpcError) as e:
            stub.Claim(pb.ClaimRequest(pool="Team_A/py", claim_id="o-2"), metadata=ops, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("namespace", e.exception.details())
        # Every pool refills from its own namespace.
        for ns in sizes:
            c.wait_for(lambda: pool_ready(ns), 60, "pool %s/py to refill" % ns)

    def test_12b_demand_sizing_by_annotation(self):
        """sbx.dev/sizing: demand grows a pool past spec.replicas (its floor) when claims come
        faster than members are made, up to sbx.dev/max-warm; spec.replicas and kubectl scale
        keep working; without the annotation the pool holds spec.replicas again."""
        from sbx.v1 import admin_pb2, admin_pb2_grpc, types_pb2
        c = self.cluster()
        server = c.start_pools()
        body = pool("py", 1)
        body["metadata"]["annotations"] = {"sbx.dev/sizing": "demand", "sbx.dev/max-warm": "25"}
        c.apply(template(), body)
        c.wait_pool("py", 1)
        pb, stub = self.grpc_stubs(c, server)
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        admin = admin_pb2_grpc.AdminServiceStub(channel)

        def status():
            return admin.GetPool(admin_pb2.GetPoolRequest(name="py"), timeout=10).pool

        got = status()
        self.assertEqual(got.sizing, admin_pb2.POOL_SIZING_DEMAND)
        self.assertEqual((got.min_warm, got.max_warm), (1, 25))
        # A surge: 30 claims within about a second, each waiting for a member if need be.
        for i in range(30):
            stub.Claim(pb.ClaimRequest(pool="py", claim_id="surge-%d" % i,
                                       empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT),
                       timeout=30)
        seen = {}

        def grown():
            st = status().status
            seen["last"] = (st.target, st.target_reason, st.arrival_rate, len(c.members("py")))
            return st.target > 1 and st.target_reason in ("demand", "ceiling") and \
                len(c.members("py")) > 1
        c.wait_for(grown, 30, "the demand-sized pool to grow past its floor")
        st = status().status
        self.assertLessEqual(st.target, 25)
        self.assertGreater(st.arrival_rate_long, 0)
        self.assertGreater(st.create_latency.seconds * 1e9 + st.create_latency.nanos, 0)
        metrics = c.metrics(server)
        self.assertIn('sbx_pool_arrival_rate{pool="py",window="short"}', metrics)
        self.assertRegex(metrics, r'sbx_pool_target_reason\{pool="py",reason="(demand|ceiling)"\} 1')
        for i in range(30):
            stub.Release(pb.ReleaseRequest(claim_id="surge-%d" % i), timeout=10)
        # kubectl scale still moves the floor of a demand-sized pool.
        c.kubectl("scale", "swp/py", "--replicas=3")
        c.wait_for(lambda: status().min_warm == 3, 30, "the floor to follow spec.replicas")
        # Without the annotation the pool is static again: spec.replicas members, the
        # surplus retired by the controller.
        c.kubectl("annotate", "swp/py", "sbx.dev/sizing-", "sbx.dev/max-warm-")
        c.wait_for(lambda: status().sizing == admin_pb2.POOL_SIZING_STATIC, 30,
                   "the pool to be sized static")
        c.wait_pool("py", 3)
        self.assertEqual(status().status.target, 3)

    def test_13_a_standby_relays_every_call_to_the_leader(self):
        """Issue 20, item 7 (replicas that serve). With --kube_leader_election every replica
        answers the sbx.v1 API: a standby relays each call to the leader with the client's
        metadata (its token) and deadline, unary and streaming, and hands back the leader's
        status, messages and trailing metadata. When the leader dies, the standby takes the
        Lease and serves on the same port."""
        c = self.cluster()
        tokens = os.path.join(c.dir, "tokens")
        with open(tokens, "w") as f:
            f.write("tok-a alice\n")
        lease_path = "/apis/coordination.k8s.io/v1/namespaces/%s/leases/sbx-controller" % NS
        flags = ["--kube_leader_election", "--kube_lease_namespace", NS,
                 "--sandbox_key_secret", "sbx-sandbox-key",
                 "--auth_tokens_file", tokens]
        a = c.start_pools(*flags, "--kube_identity", "replica-a", store="store-a")

        def holder():
            lease = c.get(lease_path)
            return lease and (lease.get("spec") or {}).get("holderIdentity")
        c.wait_for(lambda: holder() == "replica-a", 20, "replica-a to lead")
        b = c.start_pools(*flags, "--kube_identity", "replica-b", store="store-b")
        self.assertIn("a standby", c.read_log(b))
        c.apply(template(), pool("py", 2), pool("none", 0))
        c.wait_pool("py", 2)
        c.wait_for(lambda: ((c.swp("none") or {}).get("status") or {}).get("readyReplicas") == 0,
                   30, "pool none to have a status")
        from sbx.v1 import claims_pb2, claims_pb2_grpc, diagnostics_pb2, diagnostics_pb2_grpc, types_pb2
        alice = [("authorization", "Bearer tok-a")]

        def stub(server):
            channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
            self.addCleanup(channel.close)
            return claims_pb2_grpc.ClaimServiceStub(channel), \
                diagnostics_pb2_grpc.DiagnosticsServiceStub(channel)
        lead, _ = stub(a)
        standby, standby_ping = stub(b)
        # Ping is the standby's own; everything else is the leader's.
        standby_ping.Ping(diagnostics_pb2.PingRequest(), timeout=10)
        got = standby.Claim(claims_pb2.ClaimRequest(pool="py", claim_id="via-b"), metadata=alice,
                            timeout=10).claim
        self.assertEqual(got.owner, "alice")
        seen = lead.GetClaim(claims_pb2.GetClaimRequest(claim_id="via-b"), metadata=alice,
                             timeout=10).claim
        self.assertEqual(seen.sandbox.id, got.sandbox.id)
        # The token travels: without it the leader refuses, through the standby too.
        with self.assertRaises(grpc.RpcError) as e:
            standby.GetClaim(claims_pb2.GetClaimRequest(claim_id="via-b"), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        # The leader's trailing metadata travels: an empty pool's retry hint.
        standby.Claim(claims_pb2.ClaimRequest(pool="py", claim_id="via-b2"), metadata=alice,
                      timeout=10)
        with self.assertRaises(grpc.RpcError) as e:
            standby.Claim(claims_pb2.ClaimRequest(
                pool="none", claim_id="via-b3", empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_FAIL),
                metadata=alice, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        trailers = dict(e.exception.trailing_metadata() or ())
        self.assertIn("sbx-retry-after-ms", trailers)
        # The deadline travels: a WAIT claim on the pool that never fills ends at the client's
        # deadline.
        started = time.time()
        with self.assertRaises(grpc.RpcError) as e:
            standby.Claim(claims_pb2.ClaimRequest(
                pool="none", claim_id="via-b4", empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT),
                metadata=alice, timeout=1.5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        note("test_13: a WAIT claim relayed with a 1.5 s deadline ended after %.2f s",
             time.time() - started)
        # A stream: WatchClaims through the standby shows alice's claims, then a release.
        events = standby.WatchClaims(claims_pb2.WatchClaimsRequest(), metadata=alice, timeout=20)
        ids = set()
        for event in events:
            ids.add(event.claim.claim_id)
            if {"via-b", "via-b2"} <= ids:
                break
        self.assertLessEqual({"via-b", "via-b2"}, ids)
        events.cancel()

        # The leader dies; the standby takes the Lease once it expires and serves itself.
        base.proc_stop(a["proc"], sig=signal.SIGKILL)
        killed = time.time()
        c.wait_for(lambda: holder() == "replica-b", 25, "replica-b to take the expired lease")

        def serves():
            try:
                standby.Claim(claims_pb2.ClaimRequest(
                    pool="py", claim_id="after", empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT),
                    metadata=alice, timeout=5)
                return True
            except grpc.RpcError as err:
                # The standby's relays still in flight when it hands its port to the new
                # leader's server end CANCELLED after the shutdown grace.
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND,
                                  grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                    return False
                raise
        c.wait_for(serves, 40, "the new leader to serve claims on its port")
        note("test_13: claims served by replica-b %.1f s after the leader was killed",
             time.time() - killed)
        self.assertIn("this replica leads", c.read_log(b))

    # ------------------------------------------------------------------ replicated stores

    def replicated_pair(self, c):
        """replica-a leading and replica-b its standby, each with its own store, the standby
        in sync (the Lease names it sbx.dev/sync-replica); tenant alice (token tok-a); pool
        py of 30 warm members. Returns (a, b, flags)."""
        tokens = os.path.join(c.dir, "tokens")
        with open(tokens, "w") as f:
            f.write("tok-a alice\n")
        flags = ["--kube_leader_election", "--kube_lease_namespace", NS,
                 "--sandbox_key_secret", "sbx-sandbox-key",
                 "--auth_tokens_file", tokens]
        a = c.start_pools(*flags, "--kube_identity", "replica-a", store="store-a")
        c.wait_for(lambda: lease_holder(c) == "replica-a", 20, "replica-a to lead",
                   state=lambda: c.get(LEASE))
        b = c.start_pools(*flags, "--kube_identity", "replica-b", store="store-b")
        self.assertIn("a standby", c.read_log(b))
        c.apply(template(), pool("py", 30))
        c.wait_pool("py", 30)
        self.wait_lease_note(c, SYNC_REPLICA, "replica-b", 30)
        self.assertEqual(lease_note(c, TERM_LEADER), "replica-a", c.get(LEASE))
        self.assertRegex(c.metrics(a), SYNC_METRIC % 1)
        return a, b, flags

    def wait_lease_note(self, c, key, value, timeout):
        c.wait_for(lambda: lease_note(c, key) == value, timeout,
                   "the Lease's %s to be %r" % (key, value), state=lambda: c.get(LEASE))

    def failover_under_storm(self, c, a, b, flags, wipe):
        """A claim storm on both replicas' ports (gRPC) and SandboxClaims created through the
        API; the leader (a) is killed -9 two seconds in, the storm goes on until replica-b
        has answered claims for 2 s. With `wipe`, a's store is deleted and a restarted on
        the empty folder at once (while the Lease it held has not expired yet).
        Returns a dict: storm, kube (the SandboxClaim loop), killed (time), takeover (s
        from the kill to the first claim replica-b answered), a2 (the restarted a or None),
        watch (the Lease's samples since the start), dead_renew and dead_at (with `wipe`:
        the Lease's renewTime left by the killed leader, read at dead_at)."""
        alice = [("authorization", "Bearer tok-a")]
        storm = ClaimStorm([c.grpc_port(a), c.grpc_port(b)], "py", alice)
        self.addCleanup(storm.stop)
        kube = KubeClaimLoop(c, "py")
        self.addCleanup(kube.stop)
        watch = LeaseWatch(c)
        self.addCleanup(watch.stop)
        watch.start()
        started = time.time()
        storm.start()
        kube.start()
        c.wait_for(lambda: time.time() - started >= 2 and len(storm.acked) >= 10, 30,
                   "the storm to be under way (2 s, 10 claims acknowledged)", state=storm.summary)
        killed = time.time()
        base.proc_stop(a["proc"], sig=signal.SIGKILL)
        last = ([s for s in list(watch.samples) if s["t"] < killed] or [{}])[-1]
        note("%s: killed replica-a (the leader) with %d gRPC claims acknowledged, %d "
             "SandboxClaims created; the Lease then named %r in sync", self._testMethodName,
             len(storm.acked), len(kube.created),
             (last.get("annotations") or {}).get(SYNC_REPLICA))
        out = {"storm": storm, "kube": kube, "killed": killed, "watch": watch, "a2": None,
               "dead_renew": None}
        if wipe:
            import shutil
            store = os.path.join(c.dir, "store-a")
            shutil.rmtree(store)
            os.makedirs(store)
            out["dead_renew"] = (c.get(LEASE).get("spec") or {}).get("renewTime")
            out["dead_at"] = time.time()
            out["a2"] = c.start_pools(*flags, "--kube_identity", "replica-a", store="store-a")
            note("%s: replica-a restarted on an empty store %.1f s after the kill",
                 self._testMethodName, time.time() - killed)
        # Waited for longer than asserted, to report the time when it is too long.
        first = c.wait_for(lambda: storm.first_ok_sent_after(killed), LEASE_S + 2 + 20,
                           "a claim answered after the kill (by replica-b)",
                           state=storm.summary)
        out["takeover"] = first - killed
        note("%s: first claim answered by replica-b %.2f s after the kill",
             self._testMethodName, out["takeover"])
        c.wait_for(lambda: time.time() - first >= 2 or storm.finished(), 15,
                   "2 s of storm after the takeover")
        storm.stop()
        kube.stop()
        note("%s: storm over: %s; %d SandboxClaims created (%d before the kill)",
             self._testMethodName, json.dumps(storm.summary(), sort_keys=True),
             len(kube.created), len(kube.created_before(killed)))
        if wipe:
            self.assert_wiped_replica_never_led(out)
        self.assertEqual(storm.unexpected, [], "errors other than the failover's")
        self.assertEqual(kube.failures, [], "SandboxClaim creates that failed")
        self.assertEqual(lease_holder(c), "replica-b", c.get(LEASE))
        self.assertGreater(len(storm.acked_before(killed)), 0)
        self.assertGreater(len(storm.acked) - len(storm.acked_before(killed)), 0,
                           "no claim acknowledged after the kill")
        return out

    def assert_claims_kept(self, c, server, storm, kube, killed, bound=None):
        """Every acknowledged gRPC claim is ACTIVE on `server` (the leader) with its sandbox;
        no sandbox is held by two claims (gRPC claims, SandboxClaims, Sandboxes' labels);
        the SandboxClaims created before the kill (and after it) become Ready, each on its own
        sandbox. `bound`: the SandboxClaims' sandboxes seen before, which must not change.
        Returns {SandboxClaim name: sandbox}."""
        from sbx.v1 import claims_pb2, claims_pb2_grpc, types_pb2
        alice = [("authorization", "Bearer tok-a")]
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        stub = claims_pb2_grpc.ClaimServiceStub(channel)
        acked = storm.acked_copy()
        missing, moved = [], []
        for cid, got in sorted(acked.items()):
            try:
                now = stub.GetClaim(claims_pb2.GetClaimRequest(claim_id=cid), metadata=alice,
                                    timeout=10).claim
            except grpc.RpcError as e:
                missing.append("%s (acknowledged %+.2f s from the kill by port %d): %s %s" % (
                    cid, got["answered"] - killed, got["port"], e.code().name, e.details()))
                continue
            state = types_pb2.ClaimState.Name(now.state)
            if now.sandbox.id != got["sandbox"] or state != "CLAIM_STATE_ACTIVE":
                moved.append("%s: acknowledged on %s, now %s on %r" % (
                    cid, got["sandbox"], state, now.sandbox.id))
        if missing or moved:
            self.fail("%d of %d acknowledged claims missing on the leader, %d changed; the "
                      "first:\n%s\n%s" % (len(missing), len(acked), len(moved),
                                           "\n".join(missing[:5] + moved[:5]), info_logs(c)))
        # Every ACTIVE claim the leader has (the acknowledged ones and those whose answer the
        # kill cut off) holds a sandbox of its own.
        held, token = {}, ""
        for _ in range(100):
            page = stub.ListClaims(claims_pb2.ListClaimsRequest(page_size=1000, page_token=token),
                                   metadata=alice, timeout=10)
            for cl in page.claims:
                if types_pb2.ClaimState.Name(cl.state) == "CLAIM_STATE_ACTIVE":
                    held.setdefault(cl.sandbox.id, []).append(cl.claim_id)
            token = page.next_page_token
            if not token:
                break
        self.assertEqual({s: ids for s, ids in held.items() if len(ids) > 1}, {},
                         "sandboxes held by two gRPC claims")
        self.assertLessEqual(set(acked), {i for ids in held.values() for i in ids})

        names = list(kube.created)
        before = set(kube.created_before(killed))
        mirrors = {cid: got["sandbox"] for cid, got in acked.items()}

        def converged():
            objs = {o["metadata"]["name"]: o for o in c.claims()}
            pending = [n for n in names if not base.is_ready(objs.get(n))]
            shown = {}  # claim id -> sandbox of its Ready SandboxClaim
            for o in objs.values():
                cid = (o["metadata"].get("annotations") or {}).get("sbx.dev/claim-id")
                if cid and base.is_ready(o):
                    shown[cid] = ((o.get("status") or {}).get("sandbox") or {}).get("name")
            unmirrored = sorted(cid for cid, sandbox in mirrors.items()
                                if shown.get(cid) != sandbox)
            return {"pending SandboxClaims": pending,
                    "pending, created before the kill": sorted(set(pending) & before),
                    "gRPC claims without a Ready SandboxClaim on their sandbox":
                        unmirrored[:20], "count without": len(unmirrored)}
        last = {}

        def done():
            last.update(converged())
            return not last["pending SandboxClaims"] and not last["count without"]
        c.wait_for(done, 60, "every SandboxClaim Ready and every acknowledged gRPC claim's "
                   "SandboxClaim Ready on its sandbox", state=lambda: last)
        objs = {o["metadata"]["name"]: o for o in c.claims()
                if not o["metadata"].get("deletionTimestamp")}
        kube_bound = {n: objs[n]["status"]["sandbox"]["name"] for n in names}
        self.assertEqual(len(set(kube_bound.values())), len(kube_bound),
                         "two SandboxClaims bound to one sandbox: %s" % kube_bound)
        self.assertEqual(set(kube_bound.values()) & set(held), set(),
                         "sandboxes held by a gRPC claim and a SandboxClaim")
        if bound is not None:
            self.assertEqual({n: kube_bound[n] for n in bound}, bound,
                             "SandboxClaims moved to other sandboxes")
        # Every SandboxClaim's sandbox names it (label and owner), none names two.
        by_sandbox = {}
        for name, obj in objs.items():
            sandbox = ((obj.get("status") or {}).get("sandbox") or {}).get("name")
            if sandbox:
                by_sandbox.setdefault(sandbox, []).append(name)
        self.assertEqual({s: n for s, n in by_sandbox.items() if len(n) > 1}, {},
                         "sandboxes named by two SandboxClaims")
        wrong = []
        for sandbox in c.list(base.SANDBOXES):
            meta = sandbox["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            owners = [r for r in meta.get("ownerReferences") or []
                      if r.get("kind") == "SandboxClaim"]
            if len(owners) > 1:
                wrong.append("%s has %d SandboxClaim owners" % (meta["name"], len(owners)))
            named = by_sandbox.get(meta["name"])
            if named:
                uid = objs[named[0]]["metadata"]["uid"]
                label = (meta.get("labels") or {}).get(CLAIM_UID)
                if label != uid or [r["uid"] for r in owners] != [uid]:
                    wrong.append("%s is the sandbox of %s (uid %s) but labelled %s, owned by %s"
                                 % (meta["name"], named[0], uid, label, owners))
        self.assertEqual(wrong, [])
        self.assert_no_double_binding(c)
        note("%s: %d acknowledged gRPC claims kept (%d before the kill), %d ACTIVE, %d "
             "SandboxClaims Ready (%d created before the kill)", self._testMethodName,
             len(acked), len(storm.acked_before(killed)), sum(len(v) for v in held.values()),
             len(names), len(before))
        return kube_bound

    def assert_wiped_replica_never_led(self, run):
        """Since its store was deleted, replica-a has not renewed the Lease: every sample of
        the Lease naming it carries the dead leader's last renewTime."""
        took = [s for s in list(run["watch"].samples) if s["t"] >= run["dead_at"] and
                s["holder"] == "replica-a" and s["renew"] != run["dead_renew"]]
        self.assertEqual(took[:2], [], "replica-a took the Lease on an empty store (the "
                         "dead leader's last renewal was %s)" % run["dead_renew"])

    def test_14_leader_killed_under_a_claim_storm_loses_no_acknowledged_claim(self):
        """Replicated stores (issue 20, item 7): the leader streams every committed group
        to its standby and acknowledges a claim only once the standby has it. kill -9 of
        the leader during a storm of gRPC claims (on both replicas' ports) and SandboxClaims:
        replica-b takes the Lease within its duration (+2 s) and has every claim either
        replica acknowledged, on the same sandbox; no sandbox has two claims; the
        SandboxClaims become Ready. The killed replica, restarted on its store, is a
        standby again and back in sync."""
        c = self.cluster()
        a, b, flags = self.replicated_pair(c)
        run = self.failover_under_storm(c, a, b, flags, wipe=False)
        self.assertEqual(lease_note(c, TERM_LEADER), "replica-b", c.get(LEASE))
        bound = self.assert_claims_kept(c, b, run["storm"], run["kube"], run["killed"])

        a2 = c.start_pools(*flags, "--kube_identity", "replica-a", store="store-a")
        self.assertIn("a standby", c.read_log(a2))
        self.wait_lease_note(c, SYNC_REPLICA, "replica-a", 60)
        self.assertEqual(lease_holder(c), "replica-b")
        self.assertEqual(lease_note(c, TERM_LEADER), "replica-b", c.get(LEASE))
        self.assertNotIn("this replica leads", c.read_log(a2))
        self.assertRegex(c.metrics(b), SYNC_METRIC % 1)
        self.assertRegex(c.metrics(a2), FOLLOWING_METRIC % 1)
        # Nothing moved while it caught up.
        self.assert_claims_kept(c, b, run["storm"], run["kube"], run["killed"], bound=bound)

    def test_15_leader_killed_and_its_store_lost_under_a_claim_storm(self):
        """As test 14, and the killed leader's store is deleted: replica-a restarts at once on
        an empty folder, while the Lease still names it. It must not take the Lease (its
        store does not hold the acknowledged claims): replica-b does, serves every claim, and
        replica-a becomes its standby and resyncs. Then replica-b is killed -9 (its store
        kept): replica-a, holding the replicated copy, takes over and serves every
        acknowledged claim on the same sandbox."""
        c = self.cluster()
        a, b, flags = self.replicated_pair(c)
        run = self.failover_under_storm(c, a, b, flags, wipe=True)
        a2, watch = run["a2"], run["watch"]
        self.assertEqual(lease_note(c, TERM_LEADER), "replica-b", c.get(LEASE))
        bound = self.assert_claims_kept(c, b, run["storm"], run["kube"], run["killed"])

        self.assertIn("a standby", c.read_log(a2))
        self.wait_lease_note(c, SYNC_REPLICA, "replica-a", 60)
        watch.stop()
        self.assert_wiped_replica_never_led(run)
        self.assertEqual(lease_holder(c), "replica-b")
        self.assertNotIn("this replica leads", c.read_log(a2))
        # It said why it did not take the Lease it held before (docs/operations.md).
        self.assertIn("not taking the Lease", c.read_log(a2))
        self.assertRegex(c.metrics(a2), FOLLOWING_METRIC % 1)
        self.assertRegex(c.metrics(b), SYNC_METRIC % 1)

        # replica-b dies; replica-a, now a copy of it, takes over.
        base.proc_stop(b["proc"], sig=signal.SIGKILL)
        killed_b = time.time()
        c.wait_for(lambda: lease_holder(c) == "replica-a", LEASE_S + 10,
                   "replica-a to take the expired Lease", state=lambda: c.get(LEASE))
        from sbx.v1 import claims_pb2, claims_pb2_grpc, types_pb2
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(a2))
        self.addCleanup(channel.close)
        stub = claims_pb2_grpc.ClaimServiceStub(channel)
        alice = [("authorization", "Bearer tok-a")]

        def serves():
            try:
                stub.Claim(claims_pb2.ClaimRequest(
                    pool="py", claim_id="after-b",
                    empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT),
                    metadata=alice, timeout=5)
                return True
            except grpc.RpcError as err:
                if err.code() in RETRIED:
                    return False
                raise
        c.wait_for(serves, 40, "replica-a to serve claims on its port")
        note("test_15: replica-a served claims %.1f s after replica-b was killed",
             time.time() - killed_b)
        self.assertIn("this replica leads", c.read_log(a2))
        self.assertEqual(lease_note(c, TERM_LEADER), "replica-a", c.get(LEASE))
        self.assert_claims_kept(c, a2, run["storm"], run["kube"], run["killed"], bound=bound)


# ---------------------------------------------------------------------- replicated stores

LEASE = "/apis/coordination.k8s.io/v1/namespaces/%s/leases/sbx-controller" % NS
# Annotations of the Lease: the standby that holds every acknowledged claim ("" when
# none), and the leader whose store is the truth.
SYNC_REPLICA = "sbx.dev/sync-replica"
TERM_LEADER = "sbx.dev/term-leader"
# The leader's gauge: 1 while the Lease names a standby in sync (docs/metrics.md); a
# standby's: 1 while it follows the leader.
SYNC_METRIC = r"(?m)^sbx_replication_sync_standby(\{[^}]*\})? %d(\.0+)?$"
FOLLOWING_METRIC = r"(?m)^sbx_replication_following(\{[^}]*\})? %d(\.0+)?$"
# The Lease's duration with --kube_leader_election (docs/operations.md; no flag changes it):
# a standby takes a dead leader's Lease within it plus the 2 s retry period.
LEASE_S = 15
# What a claim may answer while the leader changes (the dead leader's port refuses, a
# standby has no leader to relay to, the new leader's port is being handed over, the pool
# is empty for a while); the same claim_id is retried. Not NOT_FOUND: the new leader
# recovers its pools from the replicated store before it serves.
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
           grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED,
           grpc.StatusCode.ABORTED)
# Reconnect at once to a port that came back (gRPC's default backoff starts at 1 s and
# would be counted in the takeover time).
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100),
                  ("grpc.min_reconnect_backoff_ms", 100),
                  ("grpc.max_reconnect_backoff_ms", 500)]


def info_logs(c, lines=30):
    """For a failover's diagnosis: of every server's log, the last `lines` warnings, errors
    and lines about the Lease, replication, recovery and reconciling."""
    import re
    words = ("lead", "Lease", "replication", "recovered", "reconciled", "LOST", "standby")
    out = []
    for i, server in enumerate(c.servers):
        args = list(server["proc"].args)
        name = args[args.index("--kube_identity") + 1] if "--kube_identity" in args else ""
        kept = [x for x in c.read_log(server).splitlines()
                if re.match(r"\S+ [WEC] ", x) or any(w in x for w in words)]
        out.append("--- sbx-server #%d %s:\n%s" % (i, name, "\n".join(kept[-lines:])))
    return "\n".join(out)


def lease_holder(c):
    lease = c.get(LEASE)
    return lease and (lease.get("spec") or {}).get("holderIdentity")


def lease_note(c, key):
    """The Lease's annotation `key` (None when the Lease or the annotation is missing)."""
    lease = c.get(LEASE) or {}
    return ((lease.get("metadata") or {}).get("annotations") or {}).get(key)


class ClaimStorm:
    """`clients` threads each claiming from `pool` (WAIT up to 2 s, ttl 10 min, a unique
    claim_id each) every `pace` s through the ports `ports`: client i starts on port
    i % len(ports) and, after an error of RETRIED, retries the same claim_id on the next
    port. Records every claim answered OK: claim id -> sandbox, port, sent (time of the
    answered attempt), answered. Bounded: `per_client` claims per client, `attempts` tries
    per claim, `deadline_s` in all; stop() ends it (a claim not answered by then is given
    up, unacknowledged)."""

    def __init__(self, ports, pool, metadata, clients=4, per_client=60, pace=0.1,
                 attempts=300, deadline_s=120):
        from sbx.v1 import claims_pb2, claims_pb2_grpc, types_pb2
        from google.protobuf import duration_pb2
        self.ports = list(ports)
        self.channels = [grpc.insecure_channel("127.0.0.1:%d" % p, options=FAST_RECONNECT)
                         for p in self.ports]
        self.stubs = [claims_pb2_grpc.ClaimServiceStub(ch) for ch in self.channels]
        self.request = lambda cid: claims_pb2.ClaimRequest(
            pool=pool, claim_id=cid, empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT,
            wait_timeout=duration_pb2.Duration(seconds=2),
            ttl=duration_pb2.Duration(seconds=600))
        self.metadata = metadata
        self.per_client, self.pace, self.attempts = per_client, pace, attempts
        self.deadline = time.time() + deadline_s
        self.lock = threading.Lock()
        self.acked = {}
        self.errors = {}        # (port, code name) -> count
        self.unexpected = []    # (claim id, port, code name, details)
        self.given_up = []      # claim ids never answered OK
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(clients)]
        self.stopped = False

    def start(self):
        for t in self.threads:
            t.start()

    def finished(self):
        return not any(t.is_alive() for t in self.threads)

    def stop(self):
        """Ends the storm (idempotent; joins the clients: each call has a 5 s deadline)."""
        self.stopping.set()
        for t in self.threads:
            if t.ident is not None:
                t.join(timeout=20)
        if not self.stopped:
            self.stopped = True
            for ch in self.channels:
                ch.close()

    def _over(self):
        return self.stopping.is_set() or time.time() > self.deadline

    def _client(self, index):
        at = index % len(self.ports)
        for n in range(self.per_client):
            if self._over():
                return
            cid = "storm-%d-%d" % (index, n)
            for _ in range(self.attempts):
                if self._over():
                    with self.lock:
                        self.given_up.append(cid)
                    return
                port = self.ports[at]
                sent = time.time()
                try:
                    r = self.stubs[at].Claim(self.request(cid), metadata=self.metadata,
                                             timeout=5)
                except grpc.RpcError as e:
                    code = e.code()
                    with self.lock:
                        key = (port, code.name)
                        self.errors[key] = self.errors.get(key, 0) + 1
                        if code not in RETRIED:
                            self.unexpected.append((cid, port, code.name, e.details()))
                    if code not in RETRIED:
                        break
                    at = (at + 1) % len(self.ports)
                    time.sleep(0.1)
                    continue
                with self.lock:
                    self.acked[cid] = {"sandbox": r.claim.sandbox.id, "port": port,
                                       "sent": sent, "answered": time.time()}
                break
            else:
                with self.lock:
                    self.given_up.append(cid)
            time.sleep(self.pace)

    def acked_copy(self):
        with self.lock:
            return dict(self.acked)

    def acked_before(self, t):
        return [cid for cid, a in self.acked_copy().items() if a["answered"] < t]

    def first_ok_sent_after(self, t):
        """When the first claim sent after `t` was answered OK (None: none yet)."""
        times = [a["answered"] for a in self.acked_copy().values() if a["sent"] >= t]
        return min(times) if times else None

    def summary(self):
        with self.lock:
            return {"acknowledged": len(self.acked), "given up": len(self.given_up),
                    "errors": {"%d %s" % k: v for k, v in sorted(self.errors.items())},
                    "unexpected": self.unexpected[:5]}


class Background:
    """A daemon thread running self._run until stop() or `deadline_s` (bounded)."""

    def __init__(self, deadline_s):
        self.deadline = time.time() + deadline_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping.set()
        if self.thread.ident is not None:
            self.thread.join(timeout=20)


class KubeClaimLoop(Background):
    """SandboxClaims on `pool` created through the API server (as kubectl would), one every
    `pace` s, at most `count`, until stop(). Records name -> time its create was answered."""

    def __init__(self, c, pool_name, count=40, pace=0.25, deadline_s=120):
        super().__init__(deadline_s)
        self.c, self.pool_name, self.count, self.pace = c, pool_name, count, pace
        self.created = {}
        self.failures = []

    def _run(self):
        for i in range(self.count):
            if self.stopping.is_set() or time.time() > self.deadline:
                return
            name = "kube-%d" % i
            code, out = self.c.http("POST", CLAIMS, claim(name, self.pool_name))
            if code == 201:
                self.created[name] = time.time()
            else:
                self.failures.append((name, code, str(out)[:200]))
            self.stopping.wait(self.pace)

    def created_before(self, t):
        return [n for n, at in dict(self.created).items() if at < t]


class LeaseWatch(Background):
    """The Lease sampled every 0.1 s (holder, renewTime, transitions, annotations) until
    stop() or `deadline_s`."""

    def __init__(self, c, deadline_s=180):
        super().__init__(deadline_s)
        self.c = c
        self.samples = []

    def _run(self):
        while not self.stopping.is_set() and time.time() < self.deadline:
            try:
                lease = self.c.get(LEASE) or {}
            except Exception:  # noqa: BLE001 (a sample missed; the next one counts)
                lease = None
            if lease:
                spec = lease.get("spec") or {}
                self.samples.append({
                    "t": time.time(), "holder": spec.get("holderIdentity"),
                    "renew": spec.get("renewTime"),
                    "transitions": spec.get("leaseTransitions"),
                    "annotations": (lease.get("metadata") or {}).get("annotations") or {}})
            self.stopping.wait(0.1)


if __name__ == "__main__":
    base.SBX_SERVER, base.KUBE_EMULATOR, base.SOURCE_DIR = sys.argv[1:4]
    sbx_e2e.generate_stubs(os.path.join(base.SOURCE_DIR, "proto"))
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
