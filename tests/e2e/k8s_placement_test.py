"""End-to-end test of the placement policies on Kubernetes (--runtime kubernetes).

A SandboxWarmPool chooses its selection policy with the annotation sbx.dev/selection-policy;
kube-emulator binds pods round robin to its nodes (--nodes 3: emu-node-1..3), labelled here
with zones. gRPC claims then land as the policy says: spread puts them on different nodes,
pack on one node, and a claim's node_preference picks a node by its labels (which sbx reads
from the Node objects). Every test starts its own emulator and server. Nothing here asserts
timing.

Usage: python3 k8s_placement_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR
"""
import collections
import os
import sys
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_pool_test as pools  # noqa: E402  (PoolCluster, template)
import k8s_sandbox_test as base  # noqa: E402
import sbx_e2e  # noqa: E402

NS = base.NS
NODES = ["emu-node-1", "emu-node-2", "emu-node-3"]
ZONE = "topology.kubernetes.io/zone"
POLICY = "sbx.dev/selection-policy"


def annotated_pool(name, replicas, policy):
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": name, "namespace": NS, "annotations": {POLICY: policy}},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "python"}}}


class PlacementTest(unittest.TestCase):
    def start(self, replicas, policy):
        c = pools.PoolCluster(self, "--nodes", str(len(NODES)))
        # Zones before sbx starts, so the Node informer's first list has them.
        for i, node in enumerate(NODES):
            c.kubectl("label", "node", node, "%s=zone-%d" % (ZONE, i + 1), "--overwrite")
        server = c.start_pools()
        c.apply(pools.template(), annotated_pool("py", replicas, policy))
        c.wait_pool("py", replicas)
        from sbx.v1 import admin_pb2, admin_pb2_grpc, claims_pb2, claims_pb2_grpc
        channel = grpc.insecure_channel("127.0.0.1:%d" % c.grpc_port(server))
        self.addCleanup(channel.close)
        self.pb = claims_pb2
        self.claims = claims_pb2_grpc.ClaimServiceStub(channel)
        self.admin_pb = admin_pb2
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)
        return c

    def pool(self):
        return self.admin.GetPool(self.admin_pb.GetPoolRequest(name="py"), timeout=10).pool

    def wait_warm(self, c, want):
        c.wait_for(lambda: self.pool().status.warm == want, 60,
                   "the allocator's pool to hold %d warm sandboxes" % want)

    def claim_node(self, c, claim_id, **preference):
        """Claims a sandbox of pool py and returns the node of its pod (the Sandbox's
        status.nodeName: the API's Sandbox.node is not filled in)."""
        req = self.pb.ClaimRequest(pool="py", claim_id=claim_id)
        for k, v in preference.items():
            req.node_preference[k] = v
        sandbox = self.claims.Claim(req, timeout=10).claim.sandbox.id
        return (c.sandbox(sandbox).get("status") or {}).get("nodeName", "")

    def warm_per_node(self, c):
        """Warm members of pool py per node (their pods' nodes)."""
        out = collections.Counter()
        for m in c.members("py"):
            out[(m.get("status") or {}).get("nodeName", "")] += 1
        return out

    def test_spread_then_pack_with_node_preference(self):
        c = self.start(9, "spread")
        self.wait_warm(c, 9)
        self.assertEqual(self.pool().selection_policy, "spread")
        # Two claims that prefer emu-node-1 get it (the preference wins over spread)...
        host = "kubernetes.io/hostname"
        for i in range(2):
            self.assertEqual(self.claim_node(c, "on-1-%d" % i, **{host: NODES[0]}), NODES[0])
        # ...then spread: each claim on the node with the fewest claims of the pool, so
        # never emu-node-1 (2 claims) while the others have fewer.
        spread = [self.claim_node(c, "spread-%d" % i) for i in range(3)]
        base.note("spread claims on %s" % spread)
        self.assertEqual(sorted(spread[:2]), NODES[1:])
        self.assertNotEqual(spread[2], NODES[0])
        claimed = collections.Counter([NODES[0]] * 2 + spread)

        # The annotation changes the live pool's policy; the claims held keep their counts.
        c.kubectl("annotate", "sandboxwarmpool", "py", "%s=pack" % POLICY, "--overwrite")
        c.wait_for(lambda: self.pool().selection_policy == "pack", 30,
                   "the pool's selection policy to become pack")
        c.wait_pool("py", 9)
        self.wait_warm(c, 9)
        warm = self.warm_per_node(c)
        base.note("warm members per node before pack claims: %s" % dict(warm))
        packed = [self.claim_node(c, "pack-%d" % i) for i in range(3)]
        base.note("pack claims on %s" % packed)
        # pack: every claim on a most-claimed node (2 claims each), while it has warm
        # members (the refill may already be adding more to it).
        first = packed[0]
        self.assertEqual(claimed[first], max(claimed.values()), dict(claimed))
        same = min(3, warm[first])
        self.assertGreaterEqual(same, 2, "emu nodes are bound round robin: %s" % dict(warm))
        self.assertEqual(packed[:same], [first] * same)

        # A zone preference: the zone of another node wins over pack's choice, and a zone
        # that no node has falls back to any sandbox.
        other = next(n for n in NODES if n != first)
        zone = "zone-%d" % (NODES.index(other) + 1)
        self.assertEqual(self.claim_node(c, "prefer-zone", **{ZONE: zone}), other)
        self.assertIn(self.claim_node(c, "prefer-none", **{ZONE: "zone-9"}), NODES)

    def test_an_unknown_policy_is_logged_and_the_pool_keeps_its_own(self):
        c = self.start(2, "zigzag")
        self.wait_warm(c, 2)
        self.assertEqual(self.pool().selection_policy, "fifo")
        c.wait_for(lambda: any("zigzag" in c.read_log(s) and "fifo, spread, pack" in
                               c.read_log(s) for s in c.servers), 30,
                   "a warning naming the value and the known policies")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: k8s_placement_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR")
    base.SBX_SERVER, base.KUBE_EMULATOR, base.SOURCE_DIR = (os.path.abspath(a)
                                                            for a in sys.argv[1:4])
    sbx_e2e.generate_stubs(os.path.join(base.SOURCE_DIR, "proto"))
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
