#!/usr/bin/python3
"""node_preference against a real sbx-server (instant runtime): a soft preference.

The local runtime reports no node labels, so a preference matches no sandbox; the claim
must still get a warm one, in pools whose selection_policy ("spread", "pack") honours
preferences. The pools use empty_pool_policy "fail" so that a preference wrongly treated
as a requirement shows at once as PoolExhausted rather than as a wait. A key or value
that is not label syntax is refused by the server, naming it and the field, which also
shows the map reached the server as node_preference (not, say, as labels): sync and
asyncio, Claim and ClaimBatch."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import grpc  # noqa: E402

import sbx  # noqa: E402
from sbx.v1 import admin_pb2, admin_pb2_grpc  # noqa: E402

SRV = None

CONFIG = """
templates:
  - name: default
    runtime: local
    local: {network: false}
pools:
  - name: spread
    template: default
    min_warm: 2
    max_warm: 2
    empty_pool_policy: fail
    selection_policy: spread
  - name: pack
    template: default
    min_warm: 2
    max_warm: 2
    empty_pool_policy: fail
    selection_policy: pack
"""

# Labels no node has (the local runtime reports none at all).
NOWHERE = {"topology.kubernetes.io/zone": "nowhere-1", "kubernetes.io/hostname": "node-404"}
BAD_KEY = {"-zone": "a"}  # label keys start and end with a letter or digit
BAD_VALUE = {"zone": "a b"}  # label values have no spaces


def setUpModule():
    global SRV
    SRV = harness.Server(config=CONFIG, runtime="instant")
    # The premise of the tests: the pools do select with these policies.
    with grpc.insecure_channel(SRV.target) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        for name in ("spread", "pack"):
            got = admin.GetPool(admin_pb2.GetPoolRequest(name=name), timeout=10)
            if got.pool.selection_policy != name:
                raise RuntimeError(f"pool {name!r} has selection_policy "
                                   f"{got.pool.selection_policy!r}, not {name!r}")


def tearDownModule():
    SRV.stop()


def refusal_message(name):
    """What the server says of BAD_KEY or BAD_VALUE (src/server/convert.cc)."""
    return {"key": 'node_preference: label key "-zone"',
            "value": 'node_preference: value "a b" of label "zone"'}[name]


class SyncNodePreferenceTest(unittest.TestCase):
    def setUp(self):
        self.client = sbx.Client(SRV.target)

    def tearDown(self):
        self.client.close()

    def test_claim_with_a_preference_no_node_has_gets_a_warm_sandbox(self):
        for pool in ("spread", "pack"):
            with self.subTest(pool=pool):
                SRV.wait_warm(pool, 2)
                with self.client.claim(pool, node_preference=NOWHERE, policy="fail") as sb:
                    self.assertEqual((sb.info.pool, sb.info.state, sb.info.launch_type),
                                     (pool, "ACTIVE", "WARM"))

    def test_claim_batch_with_a_preference_no_node_has_gets_every_sandbox(self):
        for pool in ("spread", "pack"):
            with self.subTest(pool=pool):
                SRV.wait_warm(pool, 2)
                # All or nothing: both sandboxes, though neither node matches.
                with self.client.claim_batch(pool, 2, node_preference=NOWHERE,
                                             policy="fail") as group:
                    self.assertEqual([(s.info.state, s.info.launch_type) for s in group],
                                     [("ACTIVE", "WARM")] * 2)

    def test_bad_key_or_value_is_refused_naming_it(self):
        SRV.wait_warm("spread", 2)
        for name, pref in (("key", BAD_KEY), ("value", BAD_VALUE)):
            for method, call in (
                    ("claim", lambda: self.client.claim("spread", node_preference=pref)),
                    ("claim_batch",
                     lambda: self.client.claim_batch("spread", 1, node_preference=pref))):
                with self.subTest(bad=name, method=method):
                    with self.assertRaises(sbx.InvalidArgument) as ctx:
                        call()
                    self.assertIn(refusal_message(name), str(ctx.exception))
        self.assertEqual(self.client.list_claims(pool="spread", states=["active"]), [])


class AsyncNodePreferenceTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.client = sbx.AsyncClient(SRV.target)

    async def asyncTearDown(self):
        await self.client.close()

    async def test_claim_and_claim_batch_with_a_preference_no_node_has(self):
        SRV.wait_warm("spread", 2)
        async with self.client.claim("spread", node_preference=NOWHERE,
                                     policy="fail") as sb:
            self.assertEqual((sb.info.state, sb.info.launch_type), ("ACTIVE", "WARM"))
        SRV.wait_warm("spread", 2)
        async with self.client.claim_batch("spread", 2, node_preference=NOWHERE,
                                           policy="fail") as group:
            self.assertEqual([(s.info.state, s.info.launch_type) for s in group],
                             [("ACTIVE", "WARM")] * 2)

    async def test_bad_key_is_refused_naming_it(self):
        for call in (lambda: self.client.claim("spread", node_preference=BAD_KEY),
                     lambda: self.client.claim_batch("spread", 1, node_preference=BAD_KEY)):
            with self.assertRaises(sbx.InvalidArgument) as ctx:
                await call()
            self.assertIn(refusal_message("key"), str(ctx.exception))


if __name__ == "__main__":
    harness.main()
