#!/usr/bin/python3
"""Kubernetes-backed pools on a bad day (issue 23), bounded: kube-emulator with latency and
injected faults (429, 500, 503, 409 on writes, watch drops, a compaction forcing 410
relists), a template with a Service and a volumeClaimTemplate, a warm pool of 100 scaled
down and up during the faults, kubectl SandboxClaims and gRPC claims
(WAIT, 10 s deadline, retried with the same id), and sbx-server killed with -9 and
restarted in the middle. After the faults stop it checks: every acknowledged gRPC claim
ACTIVE with the same sandbox and a SandboxClaim naming it; no sandbox bound twice; the pool
at `replicas` with every member Ready; no orphaned pod, Service, PVC or Sandbox. During the
faults it records how long the allocator's warm count stayed 0 while the cluster held
Ready, unclaimed members, and prints it.

Usage: k8s_faults_test.py PATH_TO_SBX_SERVER PATH_TO_KUBE_EMULATOR SOURCE_DIR
"""

import os
import signal
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_pool_test as pools  # noqa: E402  (PoolCluster, template, pool, claim)
import k8s_sandbox_test as base  # noqa: E402
import sbx_e2e  # noqa: E402

FAULTS = {"errors": {"429": 0.05, "500": 0.05, "503": 0.02, "409": 0.05},
          "watch_drop_rate": 0.05, "latency_ms": 5}
NO_FAULTS = {"errors": {"429": 0, "500": 0, "503": 0, "409": 0}, "watch_drop_rate": 0,
             "latency_ms": 0}
# The defaults keep scripts/test bounded; the full scenario is
#   SBX_FAULTS_REPLICAS=300 SBX_FAULTS_SCALE=200,350 SBX_FAULTS_CLAIMS=150 \
#   SBX_FAULTS_CLIENTS=10 SBX_FAULTS_SECONDS=60 (SBX_FAULTS_RESTART=0: no kill).
REPLICAS = int(os.environ.get("SBX_FAULTS_REPLICAS", "100"))
SCALE = [int(n) for n in os.environ.get("SBX_FAULTS_SCALE", "%d,%d" % (
    REPLICAS - 30, REPLICAS)).split(",")]
FINAL = SCALE[-1]
KUBECTL_CLAIMS = int(os.environ.get("SBX_FAULTS_CLAIMS", "10"))
CLIENTS = int(os.environ.get("SBX_FAULTS_CLIENTS", "2"))
FAULT_SECONDS = float(os.environ.get("SBX_FAULTS_SECONDS", "30"))
RESTART = os.environ.get("SBX_FAULTS_RESTART", "1") != "0"


class FaultsTest(unittest.TestCase):
    def test_claims_survive_faults_and_a_restart(self):
        from sbx.v1 import admin_pb2, admin_pb2_grpc, types_pb2
        c = pools.PoolCluster(self, "--seed", "11")
        server = {"s": c.start_pools()}
        # As in the issue: a template with a Service and a volumeClaimTemplate per sandbox.
        t = pools.template()
        t["spec"]["service"] = True
        t["spec"]["volumeClaimTemplates"] = [
            {"metadata": {"name": "data"},
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "1Gi"}}}}]
        c.apply(t, pools.pool("py", REPLICAS))
        c.wait_pool("py", REPLICAS, timeout=180)
        self.assertGreaterEqual(len(c.list("/api/v1/namespaces/%s/services" % base.NS)), REPLICAS)
        self.assertGreaterEqual(
            len(c.list("/api/v1/namespaces/%s/persistentvolumeclaims" % base.NS)), REPLICAS)

        acked = {}       # claim id -> sandbox id
        given_up = []    # claim ids not acknowledged after 4 tries
        lock = threading.Lock()
        stop = threading.Event()
        stubs = {}

        def stub():
            with lock:
                s = server["s"]
                if id(s) not in stubs:
                    pb, st = self.grpc_stubs(c, s)
                    channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(s))
                    self.addCleanup(channel.close)
                    stubs[id(s)] = (pb, st, admin_pb2_grpc.AdminServiceStub(channel))
                return stubs[id(s)]

        def client(t):
            n = 0
            while not stop.is_set():
                cid = "f-%d-%d" % (t, n)
                n += 1
                for _attempt in range(4):  # the same id: every retry is idempotent
                    if stop.is_set():
                        break
                    try:
                        pb, st, _ = stub()
                        r = st.Claim(pb.ClaimRequest(pool="py", claim_id=cid,
                                                     empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT),
                                     timeout=10)
                        with lock:
                            acked[cid] = r.claim.sandbox.id
                        break
                    except (grpc.RpcError, AssertionError, OSError):
                        time.sleep(0.3)
                else:
                    with lock:
                        given_up.append(cid)
                time.sleep(0.4)

        samples = []  # (time, allocator warm, cluster Ready unclaimed members)

        def sampler():
            while not stop.is_set():
                try:
                    _, _, admin = stub()
                    warm = admin.GetPool(admin_pb2.GetPoolRequest(name="py"),
                                         timeout=2).pool.status.warm
                    ready = sum(1 for m in c.members("py") if base.is_ready(m))
                    samples.append((time.time(), warm, ready))
                except Exception:  # noqa: BLE001  (faults and the restart: sample again)
                    pass
                time.sleep(0.5)

        threads = [threading.Thread(target=client, args=(t,)) for t in range(CLIENTS)]
        threads.append(threading.Thread(target=sampler))
        c.faults(FAULTS)
        start = time.time()
        for th in threads:
            th.start()
        try:
            # A few at a time: under these faults, one apply of many objects always meets one.
            for i in range(0, KUBECTL_CLAIMS, 5):
                c.apply(*[pools.claim("k-%d" % j, "py")
                          for j in range(i, min(i + 5, KUBECTL_CLAIMS))])
            time.sleep(5)
            c.http("POST", "/emulator/compact")
            c.apply(pools.pool("py", SCALE[0]))
            time.sleep(5)
            killed_at = time.time()
            if RESTART:  # the kill, in the middle of the faulted phase
                old = server["s"]
                old["proc"].send_signal(signal.SIGKILL)
                old["proc"].wait()
                killed_at = time.time()
                with lock:
                    server["s"] = c.start_pools()
            for n in SCALE[1:]:
                c.apply(pools.pool("py", n))
            while time.time() - start < FAULT_SECONDS:
                time.sleep(0.5)
        finally:
            c.faults(NO_FAULTS)
            faults_off = time.time()
            stop.set()
            for th in threads:
                th.join()
        base.note("faults for %.0f s, %d gRPC claims acknowledged, %d given up after 4 tries",
                  time.time() - start, len(acked), len(given_up))

        # While faults lasted: the longest stretch with the allocator at 0 warm while the
        # cluster held at least 5 Ready members (printed; the bound below is generous).
        longest, since, longest_from = 0.0, None, None
        for t, warm, ready in samples:
            if warm == 0 and ready >= 5:
                since = since or t
                if t - since > longest:
                    longest, longest_from = t - since, since
            else:
                since = None
        base.note("longest stretch with 0 warm while the cluster had >= 5 Ready members: "
                  "%.1f s from %+.1f s after the kill (%d samples)", longest,
                  (longest_from or killed_at) - killed_at, len(samples))
        if os.environ.get("SBX_FAULTS_SAMPLES"):
            for t, warm, ready in samples:
                print("%+6.1f warm %3d ready %3d" % (t - killed_at, warm, ready))
        # The allocator follows the cluster's Ready members within a few seconds (a liveness
        # bound, not a speed target). Before the informer fix it held 0 warm while the
        # cluster had Ready members for 6-13 s (0045959, 5 runs, a pool of 60 without
        # Service or PVC) and 3.2 s (660dada, one run of this test as it is): this bound
        # does not always catch that regression; InformerTest.ResumesAtOnceAfterAStream...
        # and KubeRuntimeTest.MemberReadyWhileTheWatchBreaks... do. Since the fix: 0 s in
        # each of 7 runs.
        self.assertLessEqual(longest, 5.0, "the allocator held 0 warm for %.1f s while the "
                             "cluster had Ready members" % longest)

        pb, st, admin = stub()

        def converged():
            members = c.members("py")
            claims = c.claims()
            if os.environ.get("SBX_FAULTS_SAMPLES"):
                print("%+6.1f members %d ready %d claims not ready %d" % (
                    time.time() - faults_off, len(members),
                    sum(1 for m in members if base.is_ready(m)),
                    sum(1 for o in claims if not base.is_ready(o))))
            return (len(members) == FINAL and all(base.is_ready(m) for m in members) and
                    all(base.is_ready(o) for o in claims))
        c.wait_for(converged, 120, "a full, Ready pool and every claim Ready after the faults",
                   state=lambda: {"members": len(c.members("py")),
                                  "ready": sum(1 for m in c.members("py") if base.is_ready(m)),
                                  "claims not ready": [o["metadata"]["name"] for o in c.claims()
                                                       if not base.is_ready(o)]})
        base.note("converged %.1f s after the faults stopped: %d members Ready, %d claims "
                  "Ready", time.time() - faults_off, FINAL, len(c.claims()))
        lost = []
        for cid, sandbox in sorted(acked.items()):
            got = st.GetClaim(pb.GetClaimRequest(claim_id=cid), timeout=10).claim
            if (types_pb2.ClaimState.Name(got.state) != "CLAIM_STATE_ACTIVE" or
                    got.sandbox.id != sandbox):
                lost.append((cid, sandbox, types_pb2.ClaimState.Name(got.state), got.sandbox.id))
        self.assertEqual(lost, [], "acknowledged gRPC claims not ACTIVE on their sandbox")
        # Each gRPC claim is mirrored as a SandboxClaim asynchronously (retried through the
        # faults): wait for the last ones.

        def unnamed():
            named = {(o.get("status") or {}).get("sandbox", {}).get("name") for o in c.claims()}
            return [cid for cid, sandbox in acked.items() if sandbox not in named]
        c.wait_for(lambda: not unnamed(), 60, "a SandboxClaim naming every acknowledged claim",
                   state=lambda: {"without a SandboxClaim": unnamed()})
        self.assert_no_double_binding(c)

        def orphans():
            """Pods, Services and PVCs without their Sandbox; Sandboxes neither members nor
            claimed."""
            sandboxes = c.list(base.SANDBOXES)
            names = {s["metadata"]["name"] for s in sandboxes}
            claimed = {(o.get("status") or {}).get("sandbox", {}).get("name") for o in c.claims()}
            keep = claimed | {m["metadata"]["name"] for m in c.members("py")}
            services = c.list("/api/v1/namespaces/%s/services" % base.NS)
            pvcs = c.list("/api/v1/namespaces/%s/persistentvolumeclaims" % base.NS)
            return ([p["metadata"]["name"] for p in c.pods() if p["metadata"]["name"] not in names]
                    + ["service/" + v["metadata"]["name"] for v in services
                       if v["metadata"]["name"] not in names]
                    + ["pvc/" + v["metadata"]["name"] for v in pvcs
                       if v["metadata"]["name"][len("data-"):] not in names]
                    + [n for n in names if n not in keep])
        # Creates cut short by the kill are swept after the orphan grace period (30 s).
        c.wait_for(lambda: not orphans(), 90, "no orphaned pods, Services, PVCs or Sandboxes",
                   state=lambda: {"orphans": orphans()})

    grpc_stubs = pools.PoolTest.grpc_stubs
    assert_no_double_binding = pools.PoolTest.assert_no_double_binding


if __name__ == "__main__":
    base.SBX_SERVER, base.KUBE_EMULATOR, base.SOURCE_DIR = sys.argv[1:4]
    sbx_e2e.generate_stubs(os.path.join(base.SOURCE_DIR, "proto"))
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
