#!/usr/bin/python3
"""Claim priority against a real sbx-server (instant runtime): one tenant's claims queued
in an empty pool are served interactive first, then normal (also when none is given),
then batch, whatever order they came in; sync claim() and asyncio claim()/claim_batch().

Deterministic, with no timing: each test makes its own pool with max_warm 0 (AdminService
PutPool), so claims queue and nothing serves them; it waits until the pool reports each
claim as waiting before sending the next (the queue's order is then the sending order),
then lifts max_warm to 1 (ScalePool). The refill then makes one sandbox at a time: it
counts a sandbox as being created until its hand-over to the first waiter has reserved
the claim's revision, so the next sandbox cannot start (let alone be handed over) before.
The claims' revisions, the server's single increasing sequence, therefore give the order
in which they were served."""

import asyncio
import os
import sys
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import grpc  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402

import sbx  # noqa: E402
from sbx.v1 import admin_pb2, admin_pb2_grpc, types_pb2  # noqa: E402

SRV = None
WAIT = 60.0  # each claim's wait: far beyond what the test needs, so none times out


def setUpModule():
    global SRV
    SRV = harness.Server(config=harness.instant_config(2), runtime="instant")


def tearDownModule():
    SRV.stop()


def empty_pool(name: str) -> admin_pb2.PutPoolRequest:
    pool = admin_pb2.Pool(name=name, template="default", min_warm=0, max_warm=0,
                          empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT)
    pool.default_wait.FromSeconds(int(WAIT))
    return admin_pb2.PutPoolRequest(pool=pool, create_only=True)


def scale_to_one(name: str) -> admin_pb2.ScalePoolRequest:
    return admin_pb2.ScalePoolRequest(name=name, max_warm=wrappers_pb2.Int32Value(value=1))


def waiting_message(pools, name, n):
    """None when pool `name` has n claims waiting, else what it has."""
    waiting = {p.name: p.waiting_claims for p in pools}.get(name)
    return None if waiting == n else f"pool {name!r} has {waiting} claims waiting, not {n}"


class SyncPriorityTest(unittest.TestCase):
    def setUp(self):
        self.client = sbx.Client(SRV.target)
        self.channel = grpc.insecure_channel(SRV.target)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def tearDown(self):
        self.channel.close()
        self.client.close()

    def wait_waiting(self, name, n, timeout=30.0):
        deadline = time.monotonic() + timeout
        while (why := waiting_message(self.client.pools(), name, n)) is not None:
            if time.monotonic() > deadline:
                self.fail(f"{why} after {timeout} s")
            time.sleep(0.02)

    def test_interactive_claim_is_served_before_an_earlier_normal_one(self):
        pool = "prio-sync"
        self.admin.PutPool(empty_pool(pool), timeout=10)
        with ThreadPoolExecutor(2) as ex:
            normal = ex.submit(self.client.claim, pool, wait=WAIT, priority="normal")
            self.wait_waiting(pool, 1)
            # Mixed case: the value is case-insensitive.
            interactive = ex.submit(self.client.claim, pool, wait=WAIT,
                                    priority="Interactive")
            self.wait_waiting(pool, 2)
            self.admin.ScalePool(scale_to_one(pool), timeout=10)
            with interactive.result(timeout=WAIT + 30) as i, \
                    normal.result(timeout=WAIT + 30) as n:
                self.assertLess(i.info.revision, n.info.revision,
                                f"normal claim {n.claim_id} was served before interactive "
                                f"claim {i.claim_id}, which came after it")
                self.assertEqual((i.info.launch_type, n.info.launch_type), ("WARM", "WARM"))


class AsyncPriorityTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.client = sbx.AsyncClient(SRV.target)
        self.channel = grpc.aio.insecure_channel(SRV.target)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    async def asyncTearDown(self):
        await self.channel.close()
        await self.client.close()

    async def wait_waiting(self, name, n, timeout=30.0):
        deadline = time.monotonic() + timeout
        while (why := waiting_message(await self.client.pools(), name, n)) is not None:
            if time.monotonic() > deadline:
                self.fail(f"{why} after {timeout} s")
            await asyncio.sleep(0.02)

    async def test_batch_then_default_then_interactive_batch_served_in_reverse(self):
        pool = "prio-aio"
        await self.admin.PutPool(empty_pool(pool), timeout=10)

        async def claim(pending):
            return await pending

        # Queued in the worst order: batch, then normal (by default), then an
        # interactive ClaimBatch of one.
        background = asyncio.ensure_future(claim(
            self.client.claim(pool, wait=WAIT, priority="BATCH")))
        await self.wait_waiting(pool, 1)
        default = asyncio.ensure_future(claim(self.client.claim(pool, wait=WAIT)))
        await self.wait_waiting(pool, 2)
        urgent = asyncio.ensure_future(claim(
            self.client.claim_batch(pool, 1, wait=WAIT, priority="interactive")))
        await self.wait_waiting(pool, 3)
        await self.admin.ScalePool(scale_to_one(pool), timeout=10)
        group, normal, batch = await asyncio.wait_for(
            asyncio.gather(urgent, default, background), WAIT + 30)
        try:
            served = sorted([("interactive batch", group[0].info.revision),
                             ("normal", normal.info.revision),
                             ("batch", batch.info.revision)], key=lambda x: x[1])
            self.assertEqual([name for name, _ in served],
                             ["interactive batch", "normal", "batch"], served)
        finally:
            await asyncio.gather(group.release(), normal.release(), batch.release())


if __name__ == "__main__":
    harness.main()
