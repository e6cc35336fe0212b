#!/usr/bin/python3
"""sbx.Client (blocking) against a real sbx-server with local bubblewrap sandboxes: every
method, context-manager release on exceptions and KeyboardInterrupt, and the errors of
sandbox calls."""

import os
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (puts clients/python on sys.path)

import sbx  # noqa: E402

SRV = None


def setUpModule():
    global SRV
    SRV = harness.Server()
    SRV.wait_warm("default", 2)


def tearDownModule():
    SRV.stop()


def eventually(fn, timeout=10.0):
    """fn() until it is truthy, for at most `timeout` s; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.client = sbx.Client(SRV.target)

    def tearDown(self):
        self.client.close()

    def state(self, claim_id):
        return self.client.get_claim(claim_id).state

    def test_ping_and_pools(self):
        pong = self.client.ping(b"hi")
        self.assertEqual(pong.payload, b"hi")
        self.assertTrue(pong.server_version)
        pools = {p.name: p for p in self.client.pools()}
        self.assertEqual(set(pools), {"default", "empty"})
        self.assertEqual((pools["default"].min_warm, pools["default"].max_warm), (2, 8))
        # The TypeScript SDK's Pool shape: spec fields, then status with the numbers.
        d = pools["default"]
        self.assertEqual((d.template, d.empty_pool_policy, d.default_wait, d.default_ttl,
                          d.max_ttl), ("default", "WAIT", 30.0, 3600.0, 86400.0))
        self.assertEqual(pools["empty"].empty_pool_policy, "FAIL")
        self.assertIsInstance(d.status, sbx.PoolStatus)
        self.assertGreaterEqual(d.status.warm + d.status.starting, 1)
        self.assertEqual((d.warm, d.starting, d.claimed, d.waiting_claims),
                         (d.status.warm, d.status.starting, d.status.claimed,
                          d.status.waiting_claims))
        self.assertEqual(d.status.last_error, "")
        self.assertIsNotNone(d.status.updated_at)
        self.assertIn("127.0.0.1", repr(self.client))

    def test_claim_config_and_exec(self):
        with self.client.claim("default", ttl=600, env={"SEED": "7"},
                               files={"in/data.txt": "payload"}, labels={"team": "rl"},
                               wait=30) as sb:
            self.assertEqual(sb.info.state, "ACTIVE")
            self.assertEqual(sb.info.labels, {"team": "rl"})
            self.assertTrue(sb.claim_id.startswith("py-"))
            self.assertIsNotNone(sb.info.expires_at)
            self.assertIn(sb.claim_id, repr(sb))
            # A string runs through sh -c; env (late-bound and per exec), cwd, stdin.
            r = sb.exec("echo $SEED $EXTRA; cat data.txt; echo oops >&2; exit 3",
                        env={"EXTRA": "x"}, cwd="in")
            self.assertEqual((r.stdout, r.stderr, r.exit_code), ("7 x\npayload", "oops\n", 3))
            self.assertFalse(r.ok)
            # A list is the argv itself: no shell expands $SEED.
            r = sb.exec(["echo", "$SEED"])
            self.assertEqual(r.stdout, "$SEED\n")
            self.assertEqual(sb.exec(["cat"], stdin="from stdin").stdout, "from stdin")
            big = os.urandom(3 * 1024 * 1024 // 2)  # 1.5 MiB of stdin: two chunks
            r = sb.exec("wc -c", stdin=big)
            self.assertEqual(r.stdout.strip(), str(len(big)))
            r = sb.exec("sleep 30", timeout=0.5)
            self.assertTrue(r.timed_out)
            self.assertIsNone(r.exit_code)
            self.assertEqual(r.signal, 9)
            r = sb.exec("head -c 100000 /dev/zero", max_output_bytes=1000)
            self.assertTrue(r.truncated)
            self.assertEqual(len(r.stdout_raw), 1000)
            with self.assertRaises(sbx.FailedPrecondition) as ctx:
                sb.exec(["/no/such/program"])
            self.assertIn("/no/such/program", str(ctx.exception))
        self.assertEqual(self.state(sb.claim_id), "RELEASED")

    def test_exec_stream(self):
        with self.client.claim("default") as sb:
            with sb.exec_stream("while read l; do echo got $l; echo err $l >&2; done",
                                stdin=True) as p:
                self.assertGreater(p.pid, 0)
                p.write("a\n")
                first = next(iter(p))
                self.assertIn(first.stream, ("stdout", "stderr"))
                p.write(b"b\n")
                p.close_stdin()
                chunks = [first] + list(p)
            out = b"".join(c.data for c in chunks if c.stream == "stdout")
            err = b"".join(c.data for c in chunks if c.stream == "stderr")
            self.assertEqual((out, err), (b"got a\ngot b\n", b"err a\nerr b\n"))
            self.assertEqual(p.result.exit_code, 0)
            # A signal reaches the process group.
            with sb.exec_stream("trap 'echo term; exit 7' TERM; while :; do sleep 0.1; done"
                                ) as p:
                time.sleep(0.3)  # let sh install its trap (the test does not depend on it)
                p.send_signal("TERM")
                r = p.wait()
            self.assertTrue(r.exit_code == 7 or r.signal == 15, r)
            # Leaving the block early cancels the call, which kills the command.
            with sb.exec_stream("sleep 300") as p:
                pid = p.pid
            gone = eventually(lambda: sb.exec(f"kill -0 {pid}").exit_code != 0)
            self.assertTrue(gone, f"pid {pid} still runs after the stream was cancelled")

    def test_streamed_files(self):
        with self.client.claim("default") as sb, tempfile.TemporaryDirectory() as tmp:
            big = os.urandom(5 * 1024 * 1024 + 7)  # more than one message may carry
            self.assertEqual(sb.files.upload("/tmp/big.bin", big, mode=0o640), len(big))
            self.assertEqual(sb.files.download("/tmp/big.bin"), big)
            self.assertEqual(sb.files.stat("/tmp/big.bin").mode & 0o777, 0o640)
            local = os.path.join(tmp, "back.bin")
            self.assertEqual(sb.files.download("/tmp/big.bin", local), len(big))
            with open(local, "rb") as f:
                self.assertEqual(f.read(), big)
            src = os.path.join(tmp, "src")
            os.makedirs(os.path.join(src, "sub"))
            with open(os.path.join(src, "sub", "x.txt"), "w") as f:
                f.write("x")
            self.assertEqual(sb.files.upload_dir(src, "proj"), 2)
            self.assertEqual(sb.files.read("proj/sub/x.txt"), b"x")
            sb.files.make_dir("proj/empty")
            sb.files.move("proj/sub/x.txt", "proj/y.txt")
            out = os.path.join(tmp, "out")
            self.assertEqual(sb.files.download_dir("proj", out), 3)  # empty/, sub/, y.txt
            with open(os.path.join(out, "y.txt")) as f:
                self.assertEqual(f.read(), "x")
            with self.assertRaises(sbx.NotFound):
                sb.files.download("nope")
            with sb.files.watch("proj", recursive=True) as w:
                sb.files.upload("proj/new.txt", b"n")
                sb.files.remove("proj/new.txt")
                seen = []
                for e in w:
                    seen.append((e.type, e.path))
                    if (e.type, e.path) == ("remove", "proj/new.txt"):
                        break
            self.assertIn(("create", "proj/new.txt"), seen)

    def test_files(self):
        with self.client.claim("default") as sb:
            self.assertEqual(sb.files.write("a/b/c.txt", "hello"), 5)
            self.assertEqual(sb.files.read("a/b/c.txt"), b"hello")
            self.assertEqual(sb.files.read_text("a/b/c.txt"), "hello")
            self.assertEqual(sb.files.write("a/b/c.txt", " world", append=True), 11)
            big = os.urandom(2 * 1024 * 1024 + 123)  # three WriteFile / ReadFile calls
            self.assertEqual(sb.files.write("big.bin", big, mode=0o600), len(big))
            self.assertEqual(sb.files.read("big.bin"), big)
            listing = {f.path: f for f in sb.files.list(recursive=True)}
            self.assertEqual(listing["a/b/c.txt"].size, 11)
            self.assertEqual(listing["a"].type, "directory")
            self.assertEqual(listing["big.bin"].mode & 0o777, 0o600)
            self.assertEqual([f.name for f in sb.files.list("a/b")], ["c.txt"])
            self.assertTrue(sb.files.exists("a/b/c.txt"))
            self.assertTrue(sb.files.exists("a"))
            self.assertFalse(sb.files.exists("nope"))
            self.assertFalse(sb.files.exists("a/b/c.txt/under-a-file"))
            with self.assertRaises(sbx.NotFound):
                sb.files.read("nope")
            with self.assertRaises(sbx.InvalidArgument):
                sb.files.read("../etc/passwd")
            sb.files.remove("big.bin")
            self.assertFalse(sb.files.exists("big.bin"))
            with self.assertRaises(sbx.FailedPrecondition):
                sb.files.remove("a")  # not empty
            sb.files.remove("a", recursive=True)
            self.assertFalse(sb.files.exists("a"))
            with self.assertRaises(sbx.NotFound):
                sb.files.remove("a")
            with self.assertRaises(sbx.InvalidArgument):
                sb.files.remove("../x")

    def test_renew_suspend_resume_attach(self):
        with self.client.claim("default", ttl=60) as sb:
            before = sb.info.expires_at
            info = sb.renew(3600)
            self.assertGreater(info.expires_at, before)
            sb.suspend()
            self.assertTrue(sb.refresh().suspended)
            with self.assertRaises(sbx.FailedPrecondition) as ctx:
                sb.exec("true")
            self.assertIn("suspended", str(ctx.exception))
            sb.resume()
            self.assertFalse(sb.refresh().suspended)
            self.assertEqual(sb.exec("echo back").stdout, "back\n")
            other = self.client.attach(sb.claim_id)
            self.assertEqual(other.sandbox_id, sb.sandbox_id)
            self.assertIn(sb.claim_id, [c.claim_id for c in self.client.list_claims(
                pool="default", selector="!nothing", states=["active"])])
        with self.assertRaises(sbx.FailedPrecondition):  # the claim has ended
            sb.exec("true")
        self.assertEqual(sb.release().state, "RELEASED")  # idempotent

    def test_release_on_exception_and_keyboard_interrupt(self):
        for exc in (ZeroDivisionError, KeyboardInterrupt):
            with self.subTest(exc=exc.__name__):
                holder = {}
                with self.assertRaises(exc):
                    with self.client.claim("default") as sb:
                        holder["id"] = sb.claim_id
                        raise exc()
                self.assertEqual(self.state(holder["id"]), "RELEASED")

    def test_claim_id_is_the_idempotency_key(self):
        cid = sbx.new_claim_id("test")
        with self.client.claim("default", claim_id=cid) as sb:
            again = self.client.claim("default", claim_id=cid)
            self.assertTrue(again.replayed)
            self.assertFalse(sb.replayed)
            self.assertEqual(again.sandbox_id, sb.sandbox_id)
        with self.assertRaises(sbx.FailedPrecondition):  # spent once ended
            self.client.claim("default", claim_id=cid)
        with self.assertRaises(ValueError):
            self.client.claim("default", claim_id="bad id")

    def test_claim_batch(self):
        with self.client.claim_batch("default", 2, ttl=600, labels={"b": "1"}) as group:
            self.assertEqual(len(group), 2)
            ids = [sb.claim_id for sb in group]
            self.assertEqual(ids, [f"{group.batch_id}#0", f"{group.batch_id}#1"])
            self.assertEqual(len({sb.sandbox_id for sb in group}), 2)
            self.assertEqual([sb.exec("echo hi").stdout for sb in group], ["hi\n"] * 2)
            self.assertIn(group.batch_id, repr(group))
        self.assertEqual([self.state(i) for i in ids], ["RELEASED"] * 2)

    def test_watch_claims(self):
        events = []
        watch = self.client.watch_claims(pool="default", selector="watched=yes")

        def read():
            try:
                for e in watch:
                    events.append(e)
            except sbx.SbxError as e:
                events.append(e)
        t = threading.Thread(target=read, daemon=True)
        t.start()
        with self.client.claim("default", labels={"watched": "yes"}) as sb:
            pass
        ok = eventually(lambda: [e for e in events
                                 if isinstance(e, sbx.ClaimEvent) and e.claim.state == "RELEASED"])
        watch.cancel()
        t.join(10)
        self.assertFalse(t.is_alive(), "the watch did not end after cancel()")
        self.assertTrue(ok, f"events: {events}")
        kinds = [(e.type, e.claim.state) for e in events if isinstance(e, sbx.ClaimEvent)]
        self.assertIn(("ADDED", "ACTIVE"), kinds)
        self.assertTrue(all(e.claim.claim_id == sb.claim_id for e in events
                            if isinstance(e, sbx.ClaimEvent)))
        self.assertFalse([e for e in events if isinstance(e, Exception)], events)

    def test_errors_of_sandbox_calls(self):
        with self.assertRaises(sbx.NotFound):
            self.client.attach("no-such-claim")
        with self.assertRaises(sbx.NotFound) as ctx:
            self.client.claim("no-such-pool")
        self.assertEqual(ctx.exception.message, 'pool "no-such-pool" not found')
        with self.assertRaises(sbx.PoolExhausted) as ctx:
            self.client.claim("empty")
        self.assertIsNotNone(ctx.exception.retry_after)


if __name__ == "__main__":
    harness.main()
