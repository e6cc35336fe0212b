"""Fenced replicas (issue 32), end to end against kube-emulator.

Two or three sbx-server replicas with --kube_leader_election and replicated stores serve a
pool while a storm of gRPC claims and kubectl-style SandboxClaims runs; the leader is
paused past its Lease, cut off from the API server, killed, or the Lease is deleted. The
emulator's request log is the witness: every request carries its replica's name in the
User-Agent ("sbx/0.1 (replica-a)"), with the time the emulator acted on it and its
answer, so a write by a deposed replica after its successor's acquireTime is seen. Every
acknowledged claim must survive on its sandbox, no sandbox may be bound twice. Timings
(takeover) are printed, never asserted.

Usage: python3 k8s_fencing_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR
"""
import calendar
import os
import signal
import sys
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_pool_test as pools  # noqa: E402  (PoolCluster, storm, helpers)
import k8s_sandbox_test as base  # noqa: E402
import sbx_e2e  # noqa: E402

note = base.note
LEASE = pools.LEASE
WRITES = ("create", "update", "patch", "delete", "deletecollection")


def parse_time(text):
    """RFC 3339 (MicroTime) as Unix seconds."""
    if not text:
        return None
    whole, _, frac = text.rstrip("Z").partition(".")
    t = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return t + (float("0." + frac) if frac else 0.0)


def agent(identity):
    return "sbx/0.1 (%s)" % identity


class FencingTest(pools.PoolTest):
    def requests_of(self, c, identity):
        """The emulator's log of `identity`'s requests (oldest first)."""
        code, out = c.http("GET", "/emulator/requests?user_agent=%s" %
                           urllib_quote(agent(identity)))
        self.assertEqual(code, 200, out)
        return out

    def late_writes(self, c, identity, after):
        """`identity`'s writes the emulator applied (2xx) after `after` (Unix s), Leases
        aside (the election's own)."""
        late = []
        log = self.requests_of(c, identity)
        # The witness works only if the replica's requests are told apart.
        self.assertTrue(any(r.get("verb") in WRITES for r in log),
                        "no write of %s in the emulator's log (User-Agent %r)" % (
                            identity, agent(identity)))
        for r in log:
            if r.get("verb") not in WRITES or r.get("resource") == "leases":
                continue
            self.assertIn("time", r, "the emulator's request log has no time: %s" % r)
            if r["time"] > after and 200 <= int(r.get("code") or 0) < 300:
                late.append("%+.2f s %s %s %s/%s -> %s" % (
                    r["time"] - after, r["verb"], r.get("resource"), r.get("subresource") or "",
                    r.get("name"), r.get("code")))
        return late

    def acquire_time(self, c, holder):
        lease = c.get(LEASE) or {}
        spec = lease.get("spec") or {}
        self.assertEqual(spec.get("holderIdentity"), holder, lease)
        return parse_time(spec.get("acquireTime"))

    def wait_serving(self, c, server):
        """Until `server` answers the sbx.v1 API itself (a new leader activates after it takes
        the Lease; meanwhile its port relays, and may answer UNAVAILABLE)."""
        from sbx.v1 import claims_pb2, claims_pb2_grpc
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        stub = claims_pb2_grpc.ClaimServiceStub(channel)
        alice = [("authorization", "Bearer tok-a")]

        def serves():
            try:
                stub.ListClaims(claims_pb2.ListClaimsRequest(page_size=1), metadata=alice,
                                timeout=5)
                return True
            except grpc.RpcError as err:
                if err.code() in pools.RETRIED:
                    return False
                raise
        c.wait_for(serves, 40, "the new leader to serve on its port")

    def assert_deposed_wrote_nothing(self, c, a, b, storm, kube, acquired, since):
        """Ends the storm; replica-a (deposed) stepped down and no write of it was applied
        after replica-b's acquireTime; replica-b serves every acknowledged claim."""
        storm.stop()
        kube.stop()
        self.assertEqual(self.late_writes(c, "replica-a", acquired), [],
                         "writes of the deposed leader applied after replica-b's acquireTime")
        self.assertIn("stepping down", c.read_log(a))
        self.assertEqual(storm.unexpected, [])
        self.assertEqual(kube.failures, [])
        self.wait_serving(c, b)
        self.assert_claims_kept(c, b, storm, kube, since)

    def storm(self, c, servers):
        alice = [("authorization", "Bearer tok-a")]
        storm = pools.ClaimStorm([c.grpc_port(s) for s in servers], "py", alice)
        self.addCleanup(storm.stop)
        kube = pools.KubeClaimLoop(c, "py")
        self.addCleanup(kube.stop)
        storm.start()
        kube.start()
        c.wait_for(lambda: len(storm.acked) >= 10, 30, "the storm to be under way",
                   state=storm.summary)
        return storm, kube

    def test_01_a_paused_leader_writes_nothing_after_its_successor_takes_over(self):
        """SIGSTOP of the leader for longer than its Lease during a claim storm: the standby
        takes the Lease (the paused leader's stream does not break, so after the Lease's
        duration); on SIGCONT the old leader finds its write window closed and writes
        nothing: no write of replica-a is applied after replica-b's acquireTime. No
        acknowledged claim is lost, no sandbox bound twice, every SandboxClaim Ready."""
        c = self.cluster()
        a, b, flags = self.replicated_pair(c)
        storm, kube = self.storm(c, [a, b])
        paused = time.time()
        os.kill(a["proc"].pid, signal.SIGSTOP)
        self.addCleanup(lambda: a["proc"].poll() is None and os.kill(a["proc"].pid, signal.SIGCONT))
        c.wait_for(lambda: pools.lease_holder(c) == "replica-b", pools.LEASE_S + 20,
                   "replica-b to take the paused leader's Lease", state=lambda: c.get(LEASE))
        acquired = self.acquire_time(c, "replica-b")
        note("test_01: replica-b took the Lease %.1f s after the pause", acquired - paused)
        # Paused past the successor's start, while it creates and binds.
        c.wait_for(lambda: time.time() - acquired >= 8, 20, "8 s of replica-b leading")
        os.kill(a["proc"].pid, signal.SIGCONT)
        resumed = time.time()
        # It notices, stops and exits (so that it restarts as a standby).
        c.wait_for(lambda: a["proc"].poll() is not None, 40,
                   "the deposed leader to exit after it resumed")
        c.wait_for(lambda: time.time() - resumed >= 3, 10, "3 s of storm after the resume")
        self.assert_deposed_wrote_nothing(c, a, b, storm, kube, acquired, paused)

    def test_02_a_leader_whose_requests_hang_steps_down_by_its_renew_deadline(self):
        """A one-sided partition: every API request of replica-a hangs (the emulator holds
        them) while replica-b's go through. replica-a's write window closes 3 s after its
        last renewal began; it steps down, and the requests it had on the wire are
        abandoned by then. After the heal none of them is applied: no write of replica-a
        lands after replica-b's acquireTime. replica-b (whose stream broke when replica-a
        stopped) serves every acknowledged claim."""
        c = self.cluster()
        a, b, flags = self.replicated_pair(c)
        storm, kube = self.storm(c, [a, b])
        cut = time.time()
        c.faults({"hold_user_agents": [agent("replica-a")]})
        c.wait_for(lambda: a["proc"].poll() is not None, 40,
                   "replica-a to step down and exit while cut off")
        note("test_02: replica-a exited %.1f s after the cut", time.time() - cut)
        c.wait_for(lambda: pools.lease_holder(c) == "replica-b", pools.LEASE_S + 20,
                   "replica-b to take the Lease", state=lambda: c.get(LEASE))
        acquired = self.acquire_time(c, "replica-b")
        note("test_02: replica-b took the Lease %.1f s after the cut", acquired - cut)
        c.wait_for(lambda: time.time() - acquired >= 3, 10, "3 s of replica-b leading")
        c.faults({"hold_user_agents": []})
        healed = time.time()
        c.wait_for(lambda: time.time() - healed >= 2, 10, "2 s after the heal")
        self.assert_deposed_wrote_nothing(c, a, b, storm, kube, acquired, cut)

    def test_03_the_lease_deleted_with_an_empty_replica_and_a_complete_one(self):
        """The documented way out used to be "delete the Lease". The leader dies and the
        Lease is deleted at once; the in-sync standby (complete) and a new replica with an
        empty store both find no Lease: neither makes one (nothing says which store is the
        truth, and the empty one would erase the cluster's claimed Sandboxes), and no
        Sandbox is deleted. The operator then names the complete one (sbx.dev/promote): it
        leads, every acknowledged claim is there on its sandbox, and the annotation is
        gone."""
        c = self.cluster()
        a, b, flags = self.replicated_pair(c)
        storm, kube = self.storm(c, [a, b])
        c.wait_for(lambda: len(kube.created) >= 4, 30, "SandboxClaims made")
        killed = time.time()
        base.proc_stop(a["proc"], sig=signal.SIGKILL)
        code, out = c.http("DELETE", LEASE)
        self.assertIn(code, (200, 202), out)
        storm.stop()
        kube.stop()
        before = sorted(s["metadata"]["name"] for s in c.list(base.SANDBOXES)
                        if not s["metadata"].get("deletionTimestamp"))
        empty = c.start_pools(*flags, "--kube_identity", "replica-c", store="store-c")
        c.wait_for(lambda: "the Lease is missing" in c.read_log(b) and
                   "the Lease is missing" in c.read_log(empty), 30,
                   "both replicas to say why they do not make the Lease")
        time.sleep(5)  # several election rounds (1 s each): still nobody
        self.assertIsNone(c.get(LEASE), "a replica made the missing Lease")
        after = sorted(s["metadata"]["name"] for s in c.list(base.SANDBOXES)
                       if not s["metadata"].get("deletionTimestamp"))
        self.assertEqual(after, before, "Sandboxes deleted while nobody led")
        self.assertIn("store is empty and the cluster has", c.read_log(empty))

        # The operator's word: replica-b leads.
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": "sbx-controller", "namespace": pools.NS,
                              "annotations": {"sbx.dev/promote": "replica-b"}},
                 "spec": {"holderIdentity": ""}}
        c.apply(lease)
        c.wait_for(lambda: pools.lease_holder(c) == "replica-b", 30, "replica-b to lead",
                   state=lambda: c.get(LEASE))
        self.assertIsNone(pools.lease_note(c, "sbx.dev/promote"))
        self.assertNotIn("this replica leads", c.read_log(empty))
        self.wait_serving(c, b)
        self.assert_claims_kept(c, b, storm, kube, killed)

    def test_04_three_replicas_the_in_sync_standby_killed_first(self):
        """replica-a leads, replica-b is its in-sync standby, replica-c a third (it relays,
        and cannot attach while b is attached). Under a storm, b is killed -9 first: the
        leader drops it, acknowledges alone or with c once c is in sync. Then the leader is
        killed: whoever the Lease names in sync takes over (c), and every acknowledged
        claim is there on its sandbox."""
        c = self.cluster()
        a, b, flags = self.replicated_pair(c)
        third = c.start_pools(*flags, "--kube_identity", "replica-c", store="store-c")
        storm, kube = self.storm(c, [a, b, third])
        base.proc_stop(b["proc"], sig=signal.SIGKILL)
        self.wait_lease_note(c, pools.SYNC_REPLICA, "replica-c", 60)
        c.wait_for(lambda: len(storm.acked) >= 40, 60, "claims acknowledged with c in sync",
                   state=storm.summary)
        killed = time.time()
        base.proc_stop(a["proc"], sig=signal.SIGKILL)
        c.wait_for(lambda: pools.lease_holder(c) == "replica-c", pools.LEASE_S + 20,
                   "replica-c to take over", state=lambda: c.get(LEASE))
        first = c.wait_for(lambda: storm.first_ok_sent_after(killed), pools.LEASE_S + 30,
                           "a claim answered by replica-c", state=storm.summary)
        note("test_04: first claim answered by replica-c %.2f s after the kill", first - killed)
        storm.stop()
        kube.stop()
        self.assertEqual(storm.unexpected, [])
        self.wait_serving(c, third)
        self.assert_claims_kept(c, third, storm, kube, killed)

    def test_05_kill_9_of_the_leader_takeover_time(self):
        """kill -9 of the leader under a storm: the standby sees its stream break and takes
        over once the Lease's last renewal is renew_deadline + 0.5 s old, not the Lease's
        duration. The time from the kill to the first claim it answers is printed (not
        asserted); every acknowledged claim is kept."""
        c = self.cluster()
        a, b, flags = self.replicated_pair(c)
        run = self.failover_under_storm(c, a, b, flags, wipe=False)
        note("test_05: takeover %.2f s (kill -9 to the first claim served by replica-b)",
             run["takeover"])
        self.assertIn("cannot reach leader", c.read_log(b))
        self.assert_claims_kept(c, b, run["storm"], run["kube"], run["killed"])


def urllib_quote(text):
    import urllib.parse
    return urllib.parse.quote(text, safe="")


if __name__ == "__main__":
    base.SBX_SERVER, base.KUBE_EMULATOR, base.SOURCE_DIR = sys.argv[1:4]
    sbx_e2e.generate_stubs(os.path.join(base.SOURCE_DIR, "proto"))
    # Only this file's tests (PoolTest's are run by k8s_pool_test.py).
    names = [n for n in unittest.TestLoader().getTestCaseNames(FencingTest)
             if n in FencingTest.__dict__ and
             (not sys.argv[4:] or any(arg in n for arg in sys.argv[4:]))]
    suite = unittest.TestSuite(FencingTest(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)
