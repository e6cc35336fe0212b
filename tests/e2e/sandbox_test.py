#!/usr/bin/python3
"""End to end through the real sbx-server binary with the local runtime and real
bubblewrap, called from Python's grpcio: exec (output, exit code, stdin, timeout, signals,
cancel, output flood, concurrency limit), files (round trip, pages, traversal and symlink
escapes), late-bound env and files, suspend/resume, release, TTL expiry, empty-pool
policies, auth between tenants, bad input, and a restart with claims intact.

Usage: sandbox_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML
"""

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest

import grpc

import sbx_e2e

SERVER = PROTO = CONFIG = None
TENANT_A = (("authorization", "Bearer tok-a"),)
TENANT_B = (("authorization", "Bearer tok-b"),)
ADMIN = (("authorization", "Bearer tok-admin"),)


def stubs(channel):
    from sbx.v1 import (admin_pb2_grpc, claims_pb2_grpc, diagnostics_pb2_grpc,
                        sandboxes_pb2_grpc)
    return (claims_pb2_grpc.ClaimServiceStub(channel),
            sandboxes_pb2_grpc.SandboxServiceStub(channel),
            admin_pb2_grpc.AdminServiceStub(channel),
            diagnostics_pb2_grpc.DiagnosticsServiceStub(channel))


class Base(unittest.TestCase):
    extra_flags = ("--max_concurrent_execs=3",)

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-e2e-", dir="/tmp")
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write("tok-a tenant-a\ntok-b tenant-b\ntok-admin ops admin\n")
        cls.server = sbx_e2e.Server(SERVER, cls.dir, CONFIG, cls.extra_flags,
                                    auth_tokens=cls.tokens)
        cls.claims, cls.sandboxes, cls.admin, cls.diag = stubs(cls.server.channel)
        cls.seq = 0

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def claim(self, md=TENANT_A, **kw):
        from sbx.v1 import claims_pb2
        type(self).seq += 1
        kw.setdefault("pool", "default")
        kw.setdefault("claim_id", f"{self.id().split('.')[-1]}-{self.seq}")
        return self.claims.Claim(claims_pb2.ClaimRequest(**kw), metadata=md, timeout=60).claim

    def release(self, claim_id, md=TENANT_A):
        from sbx.v1 import claims_pb2
        return self.claims.Release(claims_pb2.ReleaseRequest(claim_id=claim_id), metadata=md,
                                   timeout=30).claim

    def exec(self, claim_id, argv, md=TENANT_A, stdin=None, timeout_s=0, max_output=0,
             env=None, signal_after=None, rpc_timeout=60):
        """Runs argv; returns (stdout, stderr, exit message)."""
        from sbx.v1 import sandboxes_pb2
        from google.protobuf import duration_pb2
        start = sandboxes_pb2.ExecStart(claim_id=claim_id, argv=argv,
                                        attach_stdin=stdin is not None,
                                        max_output_bytes=max_output, env=env or {})
        if timeout_s:
            start.timeout.CopyFrom(duration_pb2.Duration(seconds=int(timeout_s),
                                                         nanos=int(timeout_s % 1 * 1e9)))

        def requests():
            yield sandboxes_pb2.ExecRequest(start=start)
            if stdin is not None:
                for chunk in stdin:
                    yield sandboxes_pb2.ExecRequest(stdin_chunk=chunk)
                yield sandboxes_pb2.ExecRequest(close_stdin=sandboxes_pb2.ExecCloseStdin())
            if signal_after is not None:
                delay, sig = signal_after
                time.sleep(delay)
                yield sandboxes_pb2.ExecRequest(signal=sandboxes_pb2.ExecSignal(signal=sig))

        out, err, exit_msg, started = b"", b"", None, None
        for r in self.sandboxes.Exec(requests(), metadata=md, timeout=rpc_timeout):
            kind = r.WhichOneof("kind")
            if kind == "started":
                started = r.started
            elif kind == "stdout_chunk":
                out += r.stdout_chunk
            elif kind == "stderr_chunk":
                err += r.stderr_chunk
            elif kind == "exit":
                exit_msg = r.exit
        self.assertIsNotNone(started, "no `started` message")
        self.assertIsNotNone(exit_msg, "no `exit` message")
        return out, err, exit_msg

    def sh(self, claim_id, script, **kw):
        return self.exec(claim_id, ["/bin/sh", "-c", script], **kw)

    def assert_code(self, code, fn, *args, contains=None):
        with self.assertRaises(grpc.RpcError) as e:
            fn(*args)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        if contains is not None:
            self.assertIn(contains, e.exception.details())
        return e.exception


class ExecTest(Base):
    def test_output_exit_code_and_template_env(self):
        c = self.claim()
        out, err, x = self.sh(c.claim_id, "echo out; echo err >&2; echo $FROM_TEMPLATE; exit 3")
        self.assertEqual(out, b"out\nyes\n")
        self.assertEqual(err, b"err\n")
        self.assertEqual(x.exit_code, 3)
        self.assertFalse(x.timed_out)
        self.assertEqual(x.stdout_bytes, 8)
        self.release(c.claim_id)

    def test_stdin(self):
        c = self.claim()
        out, _, x = self.exec(c.claim_id, ["cat"], stdin=[b"hello ", b"world\n"])
        self.assertEqual(out, b"hello world\n")
        self.assertEqual(x.exit_code, 0)
        self.release(c.claim_id)

    def test_timeout_kills(self):
        c = self.claim()
        t0 = time.time()
        _, _, x = self.exec(c.claim_id, ["sleep", "30"], timeout_s=0.5)
        self.assertTrue(x.timed_out)
        self.assertEqual(x.signal, 9)
        self.assertLess(time.time() - t0, 20)
        self.release(c.claim_id)

    def test_signal_to_process_group(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        _, _, x = self.sh(c.claim_id, "sleep 30 & sleep 30; echo never",
                          signal_after=(0.5, sandboxes_pb2.SIGNAL_TERM))
        self.assertEqual(x.signal, 15)
        # The whole group got it: no sleep is left in the sandbox.
        out, _, _ = self.sh(c.claim_id, "ps -eo comm 2>/dev/null | grep -c '^sleep$' || true")
        self.assertEqual(out.strip(), b"0")
        self.release(c.claim_id)

    def test_cancel_kills_the_command(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        start = sandboxes_pb2.ExecStart(claim_id=c.claim_id, argv=[
            "/bin/sh", "-c", "echo $$ > pid; echo ready; exec sleep 60"])
        call = self.sandboxes.Exec(iter([sandboxes_pb2.ExecRequest(start=start)]),
                                   metadata=TENANT_A, timeout=60)
        for r in call:
            if r.WhichOneof("kind") == "stdout_chunk":
                break
        call.cancel()
        sbx_e2e.wait_for(
            lambda: self.sh(c.claim_id, "kill -0 $(cat pid) 2>/dev/null && echo alive || echo gone")[0]
            == b"gone\n", 10, "the cancelled command to die")
        self.release(c.claim_id)

    def test_output_flood_is_truncated(self):
        c = self.claim()
        out, _, x = self.exec(c.claim_id, ["head", "-c", "20000000", "/dev/zero"],
                              max_output=1 << 20)
        self.assertTrue(x.truncated)
        self.assertEqual(x.stdout_bytes, 20000000)
        self.assertEqual(len(out), 1 << 20)
        self.assertEqual(x.exit_code, 0)
        self.release(c.claim_id)

    def test_concurrent_exec_limit(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        calls = []
        for _ in range(3):  # the server runs with --max_concurrent_execs=3
            start = sandboxes_pb2.ExecStart(claim_id=c.claim_id,
                                            argv=["/bin/sh", "-c", "echo up; sleep 30"])
            call = self.sandboxes.Exec(iter([sandboxes_pb2.ExecRequest(start=start)]),
                                       metadata=TENANT_A, timeout=60)
            next(call)  # started
            calls.append(call)
        err = self.assert_code(grpc.StatusCode.RESOURCE_EXHAUSTED, self.sh, c.claim_id, "true",
                               contains="max_concurrent_execs")
        self.assertIsNotNone(err)
        for call in calls:
            call.cancel()
        # Slots come back once the calls end.
        sbx_e2e.wait_for(lambda: self._try_true(c.claim_id), 10, "an exec slot")
        self.release(c.claim_id)

    def _try_true(self, claim_id):
        try:
            return self.sh(claim_id, "true")[2].exit_code == 0
        except grpc.RpcError:
            return False

    def test_bad_exec_requests(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, self.exec, c.claim_id, [],
                         contains="argv is empty")
        self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.exec, c.claim_id,
                         ["/no/such/program"])
        # stdin without attach_stdin
        def bad_stdin():
            start = sandboxes_pb2.ExecStart(claim_id=c.claim_id, argv=["sleep", "5"])
            reqs = iter([sandboxes_pb2.ExecRequest(start=start),
                         sandboxes_pb2.ExecRequest(stdin_chunk=b"x")])
            list(self.sandboxes.Exec(reqs, metadata=TENANT_A, timeout=30))
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, bad_stdin, contains="attach_stdin")
        # first message not start
        def no_start():
            reqs = iter([sandboxes_pb2.ExecRequest(stdin_chunk=b"x")])
            list(self.sandboxes.Exec(reqs, metadata=TENANT_A, timeout=30))
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, no_start, contains="start")
        self.assert_code(grpc.StatusCode.NOT_FOUND, self.exec, "no-such-claim", ["true"])
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, self.exec, c.claim_id, ["env"],
                         TENANT_A, None, 0, 0, {"BAD-NAME": "x"}, contains="BAD-NAME")
        self.release(c.claim_id)


class FilesTest(Base):
    def test_write_read_list_append(self):
        from sbx.v1 import sandboxes_pb2 as s
        c = self.claim()
        w = self.sandboxes.WriteFile(s.WriteFileRequest(claim_id=c.claim_id, path="d/a.txt",
                                                        content=b"hello", create_parents=True,
                                                        mode=0o600),
                                     metadata=TENANT_A, timeout=10)
        self.assertEqual(w.size, 5)
        w = self.sandboxes.WriteFile(s.WriteFileRequest(claim_id=c.claim_id, path="d/a.txt",
                                                        content=b" world", append=True),
                                     metadata=TENANT_A, timeout=10)
        self.assertEqual(w.size, 11)
        r = self.sandboxes.ReadFile(s.ReadFileRequest(claim_id=c.claim_id, path="d/a.txt"),
                                    metadata=TENANT_A, timeout=10)
        self.assertEqual(r.content, b"hello world")
        self.assertTrue(r.eof)
        self.assertEqual(r.mode, 0o600)
        r = self.sandboxes.ReadFile(s.ReadFileRequest(claim_id=c.claim_id, path="d/a.txt",
                                                      offset=6, limit=3),
                                    metadata=TENANT_A, timeout=10)
        self.assertEqual(r.content, b"wor")
        self.assertFalse(r.eof)
        # The command sees the file, and the file service sees what commands write.
        out, _, _ = self.sh(c.claim_id, "cat d/a.txt; for i in 1 2 3 4 5; do echo $i > d/f$i; done")
        self.assertEqual(out, b"hello world")
        paths, token = [], ""
        while True:
            page = self.sandboxes.ListFiles(
                s.ListFilesRequest(claim_id=c.claim_id, path="d", page_size=2, page_token=token),
                metadata=TENANT_A, timeout=10)
            self.assertLessEqual(len(page.files), 2)
            paths += [f.path for f in page.files]
            token = page.next_page_token
            if not token:
                break
        self.assertEqual(paths, ["d/a.txt", "d/f1", "d/f2", "d/f3", "d/f4", "d/f5"])
        listing = self.sandboxes.ListFiles(s.ListFilesRequest(claim_id=c.claim_id,
                                                              recursive=True),
                                           metadata=TENANT_A, timeout=10)
        kinds = {f.path: f.type for f in listing.files}
        self.assertEqual(kinds["d"], s.FILE_TYPE_DIRECTORY)
        self.assertEqual(kinds["d/f1"], s.FILE_TYPE_REGULAR)
        self.release(c.claim_id)

    def test_large_file_in_chunks(self):
        from sbx.v1 import sandboxes_pb2 as s
        c = self.claim()
        data = os.urandom(3 * (1 << 20) + 123)
        for i in range(0, len(data), 1 << 20):
            self.sandboxes.WriteFile(s.WriteFileRequest(claim_id=c.claim_id, path="big",
                                                        content=data[i:i + (1 << 20)],
                                                        append=i > 0),
                                     metadata=TENANT_A, timeout=30)
        got, off = b"", 0
        while True:
            r = self.sandboxes.ReadFile(s.ReadFileRequest(claim_id=c.claim_id, path="big",
                                                          offset=off),
                                        metadata=TENANT_A, timeout=30)
            got += r.content
            off += len(r.content)
            if r.eof:
                break
        self.assertEqual(got, data)
        out, _, _ = self.sh(c.claim_id, "wc -c < big")
        self.assertEqual(int(out), len(data))
        self.release(c.claim_id)

    def test_escapes_are_refused(self):
        from sbx.v1 import sandboxes_pb2 as s
        c = self.claim()
        read = lambda p: self.sandboxes.ReadFile(s.ReadFileRequest(claim_id=c.claim_id, path=p),
                                                 metadata=TENANT_A, timeout=10)
        write = lambda p: self.sandboxes.WriteFile(
            s.WriteFileRequest(claim_id=c.claim_id, path=p, content=b"x", create_parents=True),
            metadata=TENANT_A, timeout=10)
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, read, "../etc/passwd", contains="..")
        # An absolute path names the sandbox's own file, as its processes see it (issue 35):
        # the same bytes `cat` reads inside; never the host's beyond the sandbox's root.
        inside, _, _ = self.sh(c.claim_id, "cat /etc/passwd")
        self.assertEqual(read("/etc/passwd").content, inside)
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, read, "/../etc/passwd", contains="..")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, read, "/proc/cpuinfo",
                         contains="outside")  # /proc and /sys are no file API's business
        self.assert_code(grpc.StatusCode.PERMISSION_DENIED, write, "/etc/sbx-evil")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, write, "a/../../x")
        # Links made inside the sandbox cannot lead the file service out of the workspace.
        self.sh(c.claim_id, "ln -s /etc etc-link; ln -s ../.. up-link; ln -s /etc/passwd pw")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, read, "etc-link/passwd")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, read, "pw")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, write, "up-link/x")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, write, "etc-link/evil")
        self.assert_code(grpc.StatusCode.NOT_FOUND, read, "missing")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: self.sandboxes.WriteFile(
            s.WriteFileRequest(claim_id=c.claim_id, path="big", content=b"x" * ((1 << 20) + 1)),
            metadata=TENANT_A, timeout=10), contains="1 MiB")
        self.release(c.claim_id)


class LifecycleTest(Base):
    def test_late_bound_env_and_files(self):
        from sbx.v1 import types_pb2
        config = types_pb2.SandboxConfig(
            env={"TASK": "t-42", "LANG": "C"},
            files=[types_pb2.FileSpec(path="input/task.json", content=b'{"n": 1}'),
                   types_pb2.FileSpec(path="run.sh", content=b"echo ran $TASK", mode=0o755)])
        c = self.claim(config=config)
        out, _, x = self.sh(c.claim_id, "echo $TASK $LANG; cat input/task.json; ./run.sh")
        self.assertEqual(out, b't-42 C\n{"n": 1}ran t-42\n')
        # Exec's own env wins over the claim's.
        out, _, _ = self.sh(c.claim_id, "echo $TASK", env={"TASK": "mine"})
        self.assertEqual(out, b"mine\n")
        self.release(c.claim_id)

    def test_bad_late_bound_config(self):
        from sbx.v1 import types_pb2
        with self.assertRaises(grpc.RpcError) as e:
            self.claim(config=types_pb2.SandboxConfig(env={"1BAD": "x"}))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("1BAD", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.claim(config=types_pb2.SandboxConfig(
                files=[types_pb2.FileSpec(path="../escape", content=b"x")]))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("released", e.exception.details())

    def test_suspend_and_resume(self):
        from sbx.v1 import sandboxes_pb2 as s
        c = self.claim()
        self.sh(c.claim_id, "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > count; "
                            "sleep 0.01; done' >/dev/null 2>&1 &")
        read = lambda: int(self.sandboxes.ReadFile(
            s.ReadFileRequest(claim_id=c.claim_id, path="count"), metadata=TENANT_A,
            timeout=10).content or b"0")

        def running():
            try:
                return read() > 5
            except grpc.RpcError as e:  # not written yet
                self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)
                return False
        sbx_e2e.wait_for(running, 10, "the counter to run")
        r = self.sandboxes.Suspend(s.SuspendRequest(claim_id=c.claim_id), metadata=TENANT_A,
                                   timeout=30)
        self.assertTrue(r.sandbox.suspended)
        self.sandboxes.Suspend(s.SuspendRequest(claim_id=c.claim_id), metadata=TENANT_A,
                               timeout=30)  # idempotent
        self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.sh, c.claim_id, "true",
                         contains="suspended")
        self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, read, contains="suspended")
        from sbx.v1 import claims_pb2
        got = self.claims.GetClaim(claims_pb2.GetClaimRequest(claim_id=c.claim_id),
                                   metadata=TENANT_A, timeout=5).claim
        self.assertTrue(got.sandbox.suspended)
        r = self.sandboxes.Resume(s.ResumeRequest(claim_id=c.claim_id), metadata=TENANT_A,
                                  timeout=30)
        self.assertFalse(r.sandbox.suspended)
        before = read()
        # Frozen means no progress: compare across a suspension window.
        self.sandboxes.Suspend(s.SuspendRequest(claim_id=c.claim_id), metadata=TENANT_A,
                               timeout=30)
        time.sleep(0.1)
        self.sandboxes.Resume(s.ResumeRequest(claim_id=c.claim_id), metadata=TENANT_A, timeout=30)
        frozen_at = read()
        self.sandboxes.Suspend(s.SuspendRequest(claim_id=c.claim_id), metadata=TENANT_A,
                               timeout=30)
        time.sleep(0.5)
        self.sandboxes.Resume(s.ResumeRequest(claim_id=c.claim_id), metadata=TENANT_A, timeout=30)
        after_pause = read()
        # 0.5 s frozen: at most a few increments happened around the boundaries (the loop
        # makes about 100 per second when running).
        self.assertLess(after_pause - frozen_at, 20, (before, frozen_at, after_pause))
        sbx_e2e.wait_for(lambda: read() > after_pause + 10, 10, "the counter to run again")
        self.release(c.claim_id)

    def test_release_kills_everything_and_removes_workspace(self):
        c = self.claim()
        self.sh(c.claim_id, "nohup sleep 300 >/dev/null 2>&1 & echo data > f")
        self.assertTrue(sbx_e2e.processes_with(c.sandbox.id))
        self.release(c.claim_id)
        sbx_e2e.wait_for(lambda: not sbx_e2e.processes_with(c.sandbox.id), 20,
                         "the sandbox's processes to end")
        sbx_e2e.wait_for(lambda: not os.path.exists(os.path.join(self.dir, "sb", c.sandbox.id)),
                         20, "the sandbox folder to go")
        self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.sh, c.claim_id, "true",
                         contains="RELEASED")

    def test_ttl_expiry(self):
        from google.protobuf import duration_pb2
        from sbx.v1 import claims_pb2, types_pb2
        c = self.claim(ttl=duration_pb2.Duration(seconds=1))
        sbx_e2e.wait_for(lambda: self.claims.GetClaim(
            claims_pb2.GetClaimRequest(claim_id=c.claim_id), metadata=TENANT_A,
            timeout=5).claim.state == types_pb2.CLAIM_STATE_EXPIRED, 15, "expiry")
        self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.sh, c.claim_id, "true",
                         contains="EXPIRED")

    def test_empty_pool_policies(self):
        from google.protobuf import duration_pb2
        from sbx.v1 import types_pb2
        with self.assertRaises(grpc.RpcError) as e:
            self.claim(pool="empty")
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("sbx-retry-after-ms", dict(e.exception.trailing_metadata()))
        with self.assertRaises(grpc.RpcError) as e:
            self.claim(pool="empty", empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_WAIT,
                       wait_timeout=duration_pb2.Duration(nanos=300_000_000))
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        c = self.claim(pool="empty", empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_COLD,
                       wait_timeout=duration_pb2.Duration(seconds=30))
        self.assertEqual(c.launch_type, types_pb2.LAUNCH_TYPE_COLD)
        out, _, _ = self.sh(c.claim_id, "echo cold")
        self.assertEqual(out, b"cold\n")
        self.release(c.claim_id)


class AuthAndBadInputTest(Base):
    def test_tenants_are_isolated(self):
        from sbx.v1 import claims_pb2, sandboxes_pb2 as s
        c = self.claim(md=TENANT_A)
        for fn in (lambda: self.sh(c.claim_id, "true", md=TENANT_B),
                   lambda: self.sandboxes.ReadFile(s.ReadFileRequest(claim_id=c.claim_id,
                                                                     path="x"),
                                                   metadata=TENANT_B, timeout=10),
                   lambda: self.sandboxes.Suspend(s.SuspendRequest(claim_id=c.claim_id),
                                                  metadata=TENANT_B, timeout=10),
                   lambda: self.claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id),
                                               metadata=TENANT_B, timeout=10)):
            self.assert_code(grpc.StatusCode.NOT_FOUND, fn)
        for md in ((("authorization", "Bearer wrong"),), ()):
            self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                             lambda: self.sh(c.claim_id, "true", md=md))
            self.assert_code(grpc.StatusCode.UNAUTHENTICATED, lambda: self.claim(md=md))
        self.assertEqual(self.sh(c.claim_id, "echo mine")[0], b"mine\n")
        self.release(c.claim_id)

    def test_bad_input_then_still_serving(self):
        from google.protobuf import duration_pb2
        from sbx.v1 import claims_pb2, diagnostics_pb2, sandboxes_pb2 as s
        c = self.claim()
        big = s.WriteFileRequest(claim_id=c.claim_id, path="x", content=b"x" * (5 << 20))
        self.assert_code(grpc.StatusCode.RESOURCE_EXHAUSTED, self.sandboxes.WriteFile, big)
        cases = [
            (grpc.StatusCode.INVALID_ARGUMENT, dict(pool="Bad_Pool"), "Bad_Pool"),
            (grpc.StatusCode.NOT_FOUND, dict(pool="no-such-pool"), "no-such-pool"),
            (grpc.StatusCode.INVALID_ARGUMENT, dict(ttl=duration_pb2.Duration(seconds=-5)),
             "ttl"),
            (grpc.StatusCode.INVALID_ARGUMENT, dict(claim_id="bad/id"), "bad/id"),
        ]
        for code, kw, text in cases:
            with self.assertRaises(grpc.RpcError) as e:
                self.claim(**kw)
            self.assertEqual(e.exception.code(), code, kw)
            self.assertIn(text, e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.claims.ClaimBatch(claims_pb2.ClaimBatchRequest(pool="default", count=100000),
                                   metadata=TENANT_A, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("count", e.exception.details())
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, self.exec, c.claim_id, ["true"],
                         TENANT_A, None, 0, -1, contains="max_output_bytes")
        ping = self.diag.Ping(diagnostics_pb2.PingRequest(), timeout=5)
        self.assertIsNotNone(ping)
        self.assertEqual(self.sh(c.claim_id, "echo alive")[0], b"alive\n")
        self.release(c.claim_id)


class RestartTest(unittest.TestCase):
    def test_restart_keeps_claims_and_sandboxes(self):
        from sbx.v1 import claims_pb2, types_pb2
        d = tempfile.mkdtemp(prefix="sbx-e2e-", dir="/tmp")
        server = sbx_e2e.Server(SERVER, d, CONFIG)
        try:
            claims, sandboxes, _, _ = stubs(server.channel)
            claim = claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id="keep"),
                                 timeout=60).claim
            helper = Base("run")
            helper.sandboxes = sandboxes
            helper.sh("keep", "echo before > state; nohup sleep 300 >/dev/null 2>&1 &",
                      md=())
            server.stop(signal.SIGKILL)
            server = sbx_e2e.Server(SERVER, d, CONFIG)
            claims, sandboxes, _, _ = stubs(server.channel)
            helper.sandboxes = sandboxes
            got = claims.GetClaim(claims_pb2.GetClaimRequest(claim_id="keep"), timeout=5).claim
            self.assertEqual(got.state, types_pb2.CLAIM_STATE_ACTIVE, server.logtext())
            self.assertEqual(got.sandbox.id, claim.sandbox.id)
            out, _, _ = helper.sh("keep", "cat state; pgrep -c sleep || ps -e | grep -c sleep",
                                  md=())
            self.assertEqual(out.split(b"\n")[0], b"before")
            claims.Release(claims_pb2.ReleaseRequest(claim_id="keep"), timeout=30)
            sbx_e2e.wait_for(lambda: not sbx_e2e.processes_with(claim.sandbox.id), 20,
                             "the released sandbox to end")
            # A graceful stop that deletes the sandboxes leaves nothing behind.
            self.assertEqual(server.stop(signal.SIGTERM), 0)
            server = sbx_e2e.Server(SERVER, d, CONFIG, ("--delete_sandboxes_on_exit",))
            self.assertEqual(server.stop(signal.SIGTERM), 0)
            self.assertEqual(sbx_e2e.processes_with(d), [])
        finally:
            server.stop(signal.SIGKILL)
            sbx_e2e.kill_all_with(d)
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    SERVER, PROTO, CONFIG = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main()
