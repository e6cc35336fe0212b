#!/usr/bin/python3
"""Snapshots, reset and fork (issue 37) through the SDK, sync and asyncio, against a real
sbx-server (root) with local bubblewrap sandboxes of a busybox image built here offline:
snapshot -> write -> reset brings the files back; forks of a snapshot each start at its
files and write only their own; a fork of a live sandbox; list/get/delete; another
tenant's snapshot is NotFound for get, reset, fork and delete; a Fork whose answer is
lost is retried with the same batch id (the same forks, no new snapshot); bad input is
refused before any call or by the server with the field named."""

import asyncio
import os
import sys
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import sbx  # noqa: E402

SRV = None
WS = "/run/sbx/workspace"


def setUpModule():
    global SRV
    SRV = harness.image_pool_server(min_warm=2, max_warm=4)


def tearDownModule():
    SRV.stop()


class _LostAnswer(grpc.RpcError):
    """What a client sees when the server did the call but its answer was lost."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection reset (the test lost the answer)"

    def trailing_metadata(self):
        return ()


class _LoseFirstForkAnswer(grpc.UnaryUnaryClientInterceptor):
    """Lets the first Fork reach the server, then drops its answer (UNAVAILABLE)."""

    def __init__(self):
        self.forks = []  # the batch id of every Fork sent

    def intercept_unary_unary(self, continuation, details, request):
        result = continuation(details, request)
        if details.method.endswith("/Fork"):
            self.forks.append(request.batch_id)
            if len(self.forks) == 1:
                result.result()  # the server answered...
                raise _LostAnswer()  # ... and the answer never arrived
        return result


class SyncSnapshotTest(unittest.TestCase):
    def setUp(self):
        self.client = sbx.Client(SRV.target, token=harness.TENANT_TOKEN, timeout=60)
        self.other = sbx.Client(SRV.target, token=harness.OTHER_TENANT_TOKEN, timeout=60)

    def tearDown(self):
        self.client.close()
        self.other.close()

    def prepared(self, sb):
        r = sb.exec(f"echo prepared > {WS}/state && mkdir -p /opt/app && echo app > /opt/app/f")
        self.assertEqual(r.exit_code, 0, r.stderr)

    def test_snapshot_write_reset_brings_the_files_back(self):
        with self.client.claim("img") as sb:
            self.prepared(sb)
            snap = sb.snapshot(name="prepared", labels={"env": "cartpole"})
            self.assertIsInstance(snap, sbx.Snapshot)
            self.assertRegex(snap.id, r"^sn-[a-z0-9]{16}$")
            self.assertEqual((snap.name, snap.labels), ("prepared", {"env": "cartpole"}))
            self.assertEqual(snap.source_claim_id, sb.claim_id)
            self.assertTrue(snap.parent_image_digest.startswith("sha256:"),
                            snap.parent_image_digest)
            self.assertGreater(snap.size_bytes, 0)
            self.assertIsNotNone(snap.created)
            sb.files.write("state", "dirty\n")
            sb.files.write("junk", "x")
            self.assertEqual(sb.exec("rm /opt/app/f && echo new > /new").exit_code, 0)
            sb.reset(snap)
            self.assertEqual(sb.files.read_text("state"), "prepared\n")
            self.assertFalse(sb.files.exists("junk"))
            r = sb.exec("cat /opt/app/f; test -e /new || echo no-new")
            self.assertEqual((r.exit_code, r.stdout), (0, "app\nno-new\n"))
            # By id too, and twice in a row.
            sb.files.write("state", "dirty again\n")
            sb.reset(snap.id)
            self.assertEqual(sb.files.read_text("state"), "prepared\n")
            self.assertEqual(sb.info.state, "ACTIVE")
        self.client.snapshots.delete(snap)

    def test_forks_of_a_snapshot_start_at_its_files_and_write_only_their_own(self):
        with self.client.claim("img") as sb:
            self.prepared(sb)
            snap = sb.snapshot()
            with self.client.fork(snap, 4, labels={"episode": "1"}, env={"LATE": "yes"},
                                  ttl=600) as forks:
                self.assertEqual(len(forks), 4)
                self.assertEqual(forks.snapshot_id, snap.id)
                self.assertFalse(forks.replayed)
                self.assertEqual(len({f.sandbox_id for f in forks} | {sb.sandbox_id}), 5)
                for i, f in enumerate(forks):
                    self.assertIsInstance(f, sbx.Sandbox)
                    self.assertEqual(f.claim_id, f"{forks.batch_id}#{i}")
                    self.assertEqual(f.info.labels, {"episode": "1"})
                    r = f.exec("cat state /opt/app/f; echo LATE=$LATE", cwd=WS)
                    self.assertEqual((r.exit_code, r.stdout), (0, "prepared\napp\nLATE=yes\n"))
                    f.files.write("state", f"fork {i}\n")
                    self.assertEqual(f.exec(f"echo {i} > /opt/app/f").exit_code, 0)
                for i, f in enumerate(forks):
                    self.assertEqual(f.files.read_text("state"), f"fork {i}\n")
                    self.assertEqual(f.exec("cat /opt/app/f").stdout, f"{i}\n")
                self.assertEqual(sb.files.read_text("state"), "prepared\n")
                ids = [f.claim_id for f in forks]
            for claim_id in ids:  # The group released them all.
                self.assertEqual(self.client.get_claim(claim_id).state, "RELEASED")
        self.client.snapshots.delete(snap.id)

    def test_a_fork_of_a_live_sandbox_snapshots_it_first(self):
        with self.client.claim("img") as sb:
            sb.files.write("state", "live\n")
            before = {s.id for s in self.client.snapshots.list()}
            with self.client.fork(sb, 2) as forks:
                made = {s.id for s in self.client.snapshots.list()} - before
                self.assertEqual(made, {forks.snapshot_id})
                self.assertEqual(self.client.snapshots.get(forks.snapshot_id).source_claim_id,
                                 sb.claim_id)
                for f in forks:
                    self.assertEqual(f.files.read_text("state"), "live\n")
                self.assertEqual(sb.files.read_text("state"), "live\n")  # runs on
        self.client.snapshots.delete(forks.snapshot_id)

    def test_a_fork_whose_answer_was_lost_is_retried_with_the_same_batch_id(self):
        lose = _LoseFirstForkAnswer()
        channel = grpc.intercept_channel(grpc.insecure_channel(SRV.target), lose)
        with sbx.Client(SRV.target, token=harness.TENANT_TOKEN, channel=channel,
                        timeout=60) as client, client.claim("img") as sb:
            sb.files.write("state", "retried\n")
            before = {s.id for s in client.snapshots.list()}
            with client.fork(sb, 2) as forks:
                self.assertEqual(len(lose.forks), 2)
                self.assertTrue(lose.forks[0])  # generated here, not left to the server
                self.assertEqual(lose.forks[0], lose.forks[1])
                self.assertEqual(forks.batch_id, lose.forks[0])
                self.assertTrue(forks.replayed)
                # One snapshot and two forks, not two of each.
                made = {s.id for s in client.snapshots.list()} - before
                self.assertEqual(made, {forks.snapshot_id})
                mine = client.list_claims(states=["active"])
                self.assertEqual(sorted(c.claim_id for c in mine if c.batch_id),
                                 [f"{forks.batch_id}#0", f"{forks.batch_id}#1"])
                self.assertEqual(forks[1].files.read_text("state"), "retried\n")
        self.client.snapshots.delete(forks.snapshot_id)

    def test_list_get_delete(self):
        with self.client.claim("img") as sb:
            a = sb.snapshot(name="a", labels={"run": "list-test", "k": "a"})
            b = sb.snapshot(name="b", labels={"run": "list-test", "k": "b"})
        listed = self.client.snapshots.list(labels={"run": "list-test"})
        self.assertEqual([s.id for s in listed], [a.id, b.id])  # oldest first
        self.assertEqual([s.id for s in self.client.snapshots.list(labels={"k": "b"})], [b.id])
        got = self.client.snapshots.get(a.id)
        self.assertEqual((got.id, got.name, got.labels, got.size_bytes),
                         (a.id, "a", a.labels, a.size_bytes))
        self.assertEqual(got.owner, "bob")
        used, quota = self.client.snapshots.usage()
        self.assertGreaterEqual(used, a.size_bytes + b.size_bytes)
        self.client.snapshots.delete(a)
        with self.assertRaises(sbx.NotFound) as e:
            self.client.snapshots.get(a)
        self.assertIn(a.id, e.exception.message)
        with self.assertRaises(sbx.NotFound):
            self.client.snapshots.delete(a.id)
        self.assertEqual([s.id for s in self.client.snapshots.list(labels={"run": "list-test"})],
                         [b.id])
        self.client.snapshots.delete(b)

    def test_another_tenants_snapshot_is_not_found(self):
        with self.client.claim("img") as sb:
            sb.files.write("state", "tenant A\n")
            snap = sb.snapshot(name="secret")
            with self.other.claim("img") as theirs:
                theirs.files.write("state", "tenant B\n")
                with self.assertRaises(sbx.NotFound):
                    self.other.snapshots.get(snap.id)
                with self.assertRaises(sbx.NotFound):
                    theirs.reset(snap.id)
                self.assertEqual(theirs.files.read_text("state"), "tenant B\n")
                with self.assertRaises(sbx.NotFound):
                    self.other.fork(snap.id, 1)
                with self.assertRaises(sbx.NotFound):
                    self.other.fork(sb, 1)  # A's live sandbox as a source
                with self.assertRaises(sbx.NotFound):
                    self.other.snapshots.delete(snap.id)
                self.assertNotIn(snap.id, [s.id for s in self.other.snapshots.list()])
                self.assertEqual(self.other.list_claims(states=["active"])[0].claim_id,
                                 theirs.claim_id)
                self.assertEqual(len(self.other.list_claims(states=["active"])), 1)
            self.assertEqual(self.client.snapshots.get(snap.id).name, "secret")
        self.client.snapshots.delete(snap)

    def test_bad_input(self):
        with self.assertRaises(TypeError):
            self.client.fork(42, 1)
        with self.assertRaises(ValueError):
            self.client.snapshots.get("")
        with self.assertRaises(ValueError) as e:
            self.client.fork("sn-x", 1, batch_id="bad id with spaces")
        self.assertIn("batch_id", str(e.exception))
        with self.client.claim("img") as sb:
            snap = sb.snapshot()
            with self.assertRaises(sbx.InvalidArgument) as e:
                self.client.fork(snap, 0)
            self.assertIn("count", e.exception.message)
            with self.assertRaises(sbx.InvalidArgument) as e:
                sb.snapshot(name="n" * 129)
            self.assertIn("name", e.exception.message)
            with self.assertRaises(sbx.NotFound):
                sb.reset("sn-0000000000000000")
        self.client.snapshots.delete(snap)


class AsyncSnapshotTest(unittest.TestCase):
    def test_snapshot_reset_fork_and_tenants(self):
        asyncio.run(self._run())

    async def _run(self):
        async with sbx.AsyncClient(SRV.target, token=harness.TENANT_TOKEN, timeout=60) as cl, \
                sbx.AsyncClient(SRV.target, token=harness.OTHER_TENANT_TOKEN,
                                timeout=60) as other:
            async with cl.claim("img") as sb:
                await sb.files.write("state", "prepared\n")
                snap = await sb.snapshot(name="aio", labels={"via": "aio"})
                self.assertIsInstance(snap, sbx.Snapshot)
                await sb.files.write("state", "dirty\n")
                await sb.reset(snap)
                self.assertEqual(await sb.files.read_text("state"), "prepared\n")

                async with cl.fork(snap, 2) as forks:
                    self.assertEqual(forks.snapshot_id, snap.id)
                    self.assertEqual(len(forks), 2)
                    for i, f in enumerate(forks):
                        self.assertIsInstance(f, sbx.AsyncSandbox)
                        self.assertEqual(await f.files.read_text("state"), "prepared\n")
                        await f.files.write("state", f"fork {i}\n")
                    self.assertEqual(await forks[0].files.read_text("state"), "fork 0\n")
                    self.assertEqual(await forks[1].files.read_text("state"), "fork 1\n")
                forks = await cl.fork(sb, 1)  # a live source; awaited, then released
                self.assertNotEqual(forks.snapshot_id, snap.id)
                self.assertEqual(await forks[0].files.read_text("state"), "prepared\n")
                await forks.release()
                await cl.snapshots.delete(forks.snapshot_id)

                self.assertEqual([s.id for s in await cl.snapshots.list(labels={"via": "aio"})],
                                 [snap.id])
                self.assertEqual((await cl.snapshots.get(snap.id)).name, "aio")
                for call in (lambda: other.snapshots.get(snap.id),
                             lambda: other.fork(snap.id, 1),
                             lambda: other.snapshots.delete(snap.id)):
                    with self.assertRaises(sbx.NotFound):
                        await call()
                async with other.claim("img") as theirs:
                    with self.assertRaises(sbx.NotFound):
                        await theirs.reset(snap)
            await cl.snapshots.delete(snap)
            with self.assertRaises(sbx.NotFound):
                await cl.snapshots.get(snap.id)


if __name__ == "__main__":
    harness.main()
