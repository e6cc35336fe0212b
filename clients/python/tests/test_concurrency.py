#!/usr/bin/python3
"""200 concurrent asyncio claims on one AsyncClient against an instant-runtime pool sized
for them: every claim gets its own sandbox, every one is released; and the same through
threads sharing one sbx.Client."""

import asyncio
import os
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import sbx  # noqa: E402

N = 200
SRV = None


def setUpModule():
    global SRV
    SRV = harness.Server(config=harness.instant_config(N + 20), runtime="instant")
    SRV.wait_warm("default", N + 20)


def tearDownModule():
    SRV.stop()


class ConcurrencyTest(unittest.TestCase):
    def setUp(self):
        SRV.wait_warm("default", N + 20)  # refilled after the previous test

    def active(self):
        with sbx.Client(SRV.target) as c:
            return c.list_claims(states=["active"])

    def test_200_concurrent_asyncio_claims(self):
        async def run():
            async with sbx.AsyncClient(SRV.target) as client:
                inside = []
                gate = asyncio.Event()

                async def one(i):
                    async with client.claim("default", labels={"i": str(i)}) as sb:
                        inside.append(sb)
                        if len(inside) == N:
                            gate.set()
                        await asyncio.wait_for(gate.wait(), 60)  # all held at once
                        return sb.claim_id, sb.sandbox_id
                return await asyncio.gather(*(one(i) for i in range(N)))
        results = asyncio.run(run())
        self.assertEqual(len(results), N)
        self.assertEqual(len({cid for cid, _ in results}), N)
        self.assertEqual(len({sid for _, sid in results}), N, "two claims got one sandbox")
        self.assertEqual(self.active(), [])

    def test_threads_share_one_client(self):
        with sbx.Client(SRV.target) as client:
            def one(i):
                with client.claim("default") as sb:
                    return sb.sandbox_id
            with ThreadPoolExecutor(16) as pool:
                ids = list(pool.map(one, range(64)))
        self.assertEqual(len(set(ids)), 64)
        self.assertEqual(self.active(), [])

    def test_batch_of_200(self):
        async def run():
            async with sbx.AsyncClient(SRV.target) as client:
                async with client.claim_batch("default", N) as group:
                    return [sb.sandbox_id for sb in group]
        ids = asyncio.run(run())
        self.assertEqual(len(set(ids)), N)
        self.assertEqual(self.active(), [])


if __name__ == "__main__":
    harness.main()
