#!/usr/bin/python3
"""sbx.AsyncClient (grpc.aio) against a real sbx-server with local bubblewrap sandboxes:
the same surface as test_client.py, awaited; release on exceptions and cancellation."""

import asyncio
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import sbx  # noqa: E402

SRV = None


def setUpModule():
    global SRV
    SRV = harness.Server()
    SRV.wait_warm("default", 2)


def tearDownModule():
    SRV.stop()


async def eventually(fn, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        v = await fn()
        if v or time.monotonic() > deadline:
            return v
        await asyncio.sleep(0.05)


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.client = sbx.AsyncClient(SRV.target)

    async def asyncTearDown(self):
        await self.client.close()

    async def state(self, claim_id):
        return (await self.client.get_claim(claim_id)).state

    async def test_ping_and_pools(self):
        self.assertEqual((await self.client.ping(b"x")).payload, b"x")
        self.assertEqual({p.name for p in await self.client.pools()}, {"default", "empty"})

    async def test_claim_config_and_exec(self):
        async with self.client.claim("default", ttl=600, env={"SEED": "7"},
                                     files={"in/data.txt": "payload"},
                                     labels={"team": "rl"}) as sb:
            self.assertEqual(sb.info.labels, {"team": "rl"})
            r = await sb.exec("echo $SEED $EXTRA; cat data.txt; echo oops >&2; exit 3",
                              env={"EXTRA": "x"}, cwd="in")
            self.assertEqual((r.stdout, r.stderr, r.exit_code), ("7 x\npayload", "oops\n", 3))
            self.assertEqual((await sb.exec(["echo", "$SEED"])).stdout, "$SEED\n")
            self.assertEqual((await sb.exec(["cat"], stdin=b"in")).stdout, "in")
            r = await sb.exec("sleep 30", timeout=0.5)
            self.assertTrue(r.timed_out)
            r = await sb.exec("head -c 100000 /dev/zero", max_output_bytes=1000)
            self.assertTrue(r.truncated)
            with self.assertRaises(sbx.FailedPrecondition):
                await sb.exec(["/no/such/program"])
        self.assertEqual(await self.state(sb.claim_id), "RELEASED")
        # await instead of async with: released by hand.
        sb = await self.client.claim("default")
        self.assertEqual((await sb.release()).state, "RELEASED")

    async def test_exec_stream(self):
        async with self.client.claim("default") as sb:
            p = await sb.exec_stream("while read l; do echo got $l; done", stdin=True)
            self.assertGreater(p.pid, 0)
            await p.write("a\nb\n")
            await p.close_stdin()
            chunks = [c async for c in p]
            self.assertEqual(b"".join(c.data for c in chunks), b"got a\ngot b\n")
            self.assertEqual(p.result.exit_code, 0)
            p = await sb.exec_stream("sleep 300")
            await p.send_signal("KILL")
            self.assertEqual((await p.wait()).signal, 9)
            async with await sb.exec_stream("sleep 300") as p:
                pid = p.pid

            async def gone():
                return (await sb.exec(f"kill -0 {pid}")).exit_code != 0
            self.assertTrue(await eventually(gone), f"pid {pid} survived the cancel")

    async def test_streamed_files(self):
        async with self.client.claim("default") as sb:
            big = os.urandom(3 * 1024 * 1024 + 5)
            self.assertEqual(await sb.files.upload("/tmp/big.bin", big), len(big))
            self.assertEqual(await sb.files.download("/tmp/big.bin"), big)
            self.assertEqual((await sb.files.stat("/tmp/big.bin")).size, len(big))
            await sb.files.make_dir("/tmp/d/e")
            await sb.files.move("/tmp/big.bin", "/tmp/d/e/big.bin")  # same filesystem
            self.assertEqual((await sb.files.stat("/tmp/d/e/big.bin")).size, len(big))
            with self.assertRaises(sbx.FailedPrecondition):  # /tmp and the workspace differ
                await sb.files.move("/tmp/d/e/big.bin", "big.bin")
            with self.assertRaises(sbx.NotFound):
                await sb.files.download("/tmp/big.bin")

    async def test_files(self):
        async with self.client.claim("default") as sb:
            self.assertEqual(await sb.files.write("a/b.txt", "hello"), 5)
            big = os.urandom(2 * 1024 * 1024 + 7)
            await sb.files.write("big.bin", big)
            self.assertEqual(await sb.files.read("big.bin"), big)
            self.assertEqual(await sb.files.read_text("a/b.txt"), "hello")
            self.assertEqual([f.path for f in await sb.files.list(recursive=True)],
                             ["a", "a/b.txt", "big.bin"])
            self.assertTrue(await sb.files.exists("a"))
            self.assertFalse(await sb.files.exists("nope"))
            await sb.files.remove("a", recursive=True)
            self.assertFalse(await sb.files.exists("a/b.txt"))
            with self.assertRaises(sbx.NotFound):
                await sb.files.remove("a")

    async def test_renew_suspend_resume_attach(self):
        async with self.client.claim("default", ttl=60) as sb:
            before = sb.info.expires_at
            self.assertGreater((await sb.renew(3600)).expires_at, before)
            await sb.suspend()
            self.assertTrue((await sb.refresh()).suspended)
            with self.assertRaises(sbx.FailedPrecondition):
                await sb.exec("true")
            await sb.resume()
            self.assertEqual((await sb.exec("echo back")).stdout, "back\n")
            other = await self.client.attach(sb.claim_id)
            self.assertEqual(other.sandbox_id, sb.sandbox_id)
            ids = [c.claim_id for c in await self.client.list_claims(states=["active"])]
            self.assertIn(sb.claim_id, ids)

    async def test_release_on_exception_and_cancellation(self):
        holder = {}
        with self.assertRaises(ZeroDivisionError):
            async with self.client.claim("default") as sb:
                holder["a"] = sb.claim_id
                1 / 0
        self.assertEqual(await self.state(holder["a"]), "RELEASED")

        entered = asyncio.Event()

        async def hold():
            async with self.client.claim("default") as sb:
                holder["b"] = sb.claim_id
                entered.set()
                await asyncio.sleep(300)
        task = asyncio.create_task(hold())
        await asyncio.wait_for(entered.wait(), 30)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertEqual(await self.state(holder["b"]), "RELEASED")

    async def test_claim_batch(self):
        async with self.client.claim_batch("default", 2) as group:
            ids = [sb.claim_id for sb in group]
            outs = await asyncio.gather(*(sb.exec("echo hi") for sb in group))
            self.assertEqual([o.stdout for o in outs], ["hi\n"] * 2)
        self.assertEqual([await self.state(i) for i in ids], ["RELEASED"] * 2)

    async def test_watch_claims(self):
        watch = self.client.watch_claims(selector="awatch=1")
        seen = []

        async def read():
            async for e in watch:
                seen.append((e.type, e.claim.state))
                if e.claim.state == "RELEASED":
                    return
        reader = asyncio.create_task(read())
        async with self.client.claim("default", labels={"awatch": "1"}):
            pass
        await asyncio.wait_for(reader, 20)
        watch.cancel()
        self.assertEqual(seen[0], ("ADDED", "ACTIVE"))
        self.assertEqual(seen[-1], ("MODIFIED", "RELEASED"))

    async def test_errors(self):
        with self.assertRaises(sbx.NotFound):
            await self.client.claim("no-such-pool")
        with self.assertRaises(sbx.PoolExhausted) as ctx:
            await self.client.claim("empty")
        self.assertIsNotNone(ctx.exception.retry_after)
        with self.assertRaises(sbx.NotFound):
            await self.client.attach("nope")


if __name__ == "__main__":
    harness.main()
