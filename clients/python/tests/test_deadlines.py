#!/usr/bin/python3
"""Which deadline each call of sbx.Client and sbx.AsyncClient sends (docs/sdk-python.md,
"Deadlines"). A gRPC server in this process records the time remaining that every call
arrives with (the grpc-timeout the SDK sent) and refuses it with FAILED_PRECONDITION,
which is never retried, so each call is recorded once. Then a claim with
Client(timeout=2) against a port where nothing listens and against a listener that never
answers: it ends with the client's timeout, not with a fixed 30 s."""

import asyncio
import os
import socket
import sys
import threading
import time
import unittest
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import grpc  # noqa: E402

import sbx  # noqa: E402
from sbx._common import ClaimInfo  # noqa: E402

TIMEOUT = 7.0  # the client's timeout in these tests: neither 30 s nor any other default
# The server sees a little less than what was sent (the call's way to it), or a little
# more: grpc-timeout goes as an integer of some unit, rounded up (7 s can arrive as 7.01,
# 607 s as 608).
SLACK = 1.0


def rounding(expected):
    return 0.25 if expected < 100 else 1.5
# What time_remaining() says of a call without a deadline (grpc's infinite future).
NO_DEADLINE = 1e9


class Recorder(grpc.GenericRpcHandler):
    """Answers every method of every service: records context.time_remaining() (None
    when the call has no deadline) and aborts with FAILED_PRECONDITION."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = []  # (method, time remaining)

    def take(self):
        with self.lock:
            seen, self.seen = self.seen, []
        return seen

    def _record(self, method, context):
        with self.lock:
            left = context.time_remaining()
            self.seen.append((method, None if left is None or left > NO_DEADLINE else left))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"recorded {method}")

    def service(self, details):
        method = details.method.rsplit("/", 1)[-1]

        def unary(request, context):
            self._record(method, context)

        def server_stream(request, context):
            self._record(method, context)
            yield b""

        def bidi(requests, context):
            self._record(method, context)
            yield b""

        if method == "Exec":
            return grpc.stream_stream_rpc_method_handler(bidi)
        if method.startswith("Watch"):
            return grpc.unary_stream_rpc_method_handler(server_stream)
        return grpc.unary_unary_rpc_method_handler(unary)


def info(claim_id="c1"):
    return ClaimInfo(claim_id=claim_id, pool="default", owner="", sandbox_id="sb-1",
                     state="ACTIVE", launch_type="WARM", labels={}, created_at=None,
                     expires_at=None, ended_at=None, batch_id="", revision=1,
                     suspended=False)


# (what is called, the deadline docs/sdk-python.md gives it, in seconds; None: none).
# `c` is the client, `sb` a Sandbox handle on it; every one is refused by the recorder.
CASES = [
    ("ping", lambda c, sb: c.ping(), TIMEOUT),
    ("claim", lambda c, sb: c.claim("default"), 30 + TIMEOUT),
    ("claim policy=fail", lambda c, sb: c.claim("default", policy="fail"), TIMEOUT),
    ("claim policy=FAIL", lambda c, sb: c.claim("default", policy="FAIL"), TIMEOUT),
    ("claim wait=3", lambda c, sb: c.claim("default", wait=3), 3 + TIMEOUT),
    ("claim wait=0", lambda c, sb: c.claim("default", wait=0), TIMEOUT),
    ("claim timeout=2", lambda c, sb: c.claim("default", policy="fail", timeout=2), 2),
    ("claim wait=4 timeout=2", lambda c, sb: c.claim("default", wait=4, timeout=2), 6),
    ("claim_batch", lambda c, sb: c.claim_batch("default", 2), 30 + TIMEOUT),
    ("claim_batch policy=fail", lambda c, sb: c.claim_batch("default", 2, policy="fail"),
     TIMEOUT),
    ("claim_batch wait=3 timeout=1",
     lambda c, sb: c.claim_batch("default", 2, wait=3, timeout=1), 4),
    ("attach", lambda c, sb: c.attach("c1"), TIMEOUT),
    ("get_claim", lambda c, sb: c.get_claim("c1"), TIMEOUT),
    ("release", lambda c, sb: c.release("c1"), TIMEOUT),
    ("list_claims", lambda c, sb: c.list_claims(), TIMEOUT),
    ("pools", lambda c, sb: c.pools(), TIMEOUT),
    ("sb.release", lambda c, sb: sb.release(), TIMEOUT),
    ("sb.refresh", lambda c, sb: sb.refresh(), TIMEOUT),
    ("sb.renew", lambda c, sb: sb.renew(60), TIMEOUT),
    ("sb.suspend", lambda c, sb: sb.suspend(), TIMEOUT),
    ("sb.resume", lambda c, sb: sb.resume(), TIMEOUT),
    ("sb.exec", lambda c, sb: sb.exec("true"), 600 + TIMEOUT),
    ("sb.exec timeout=5", lambda c, sb: sb.exec("true", timeout=5), 5 + TIMEOUT),
    ("sb.exec_stream", lambda c, sb: sb.exec_stream("true"), 600 + TIMEOUT),
    ("sb.exec_stream timeout=5", lambda c, sb: sb.exec_stream("true", timeout=5),
     5 + TIMEOUT),
    ("files.write", lambda c, sb: sb.files.write("f", "x"), TIMEOUT),
    ("files.read", lambda c, sb: sb.files.read("f"), TIMEOUT),
    ("files.read_text", lambda c, sb: sb.files.read_text("f"), TIMEOUT),
    ("files.list", lambda c, sb: sb.files.list(), TIMEOUT),
    ("files.exists", lambda c, sb: sb.files.exists("f"), TIMEOUT),
    ("files.remove", lambda c, sb: sb.files.remove("f"), TIMEOUT),
]

# Streams without a deadline: they live until cancelled.
WATCH = ("watch_claims", lambda c: c.watch_claims(), None)


def start_recorder():
    recorder = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((recorder,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, recorder, f"127.0.0.1:{port}"


class DeadlinesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server, cls.recorder, cls.target = start_recorder()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)

    def check(self, name, seen, expected):
        self.assertEqual(len(seen), 1, f"{name}: calls recorded {seen}")
        got = seen[0][1]
        if expected is None:
            self.assertIsNone(got, f"{name}: sent a deadline of {got} s; expected none")
            return
        self.assertIsNotNone(got, f"{name}: sent no deadline; expected {expected} s")
        self.assertTrue(expected - SLACK <= got <= expected + rounding(expected),
                        f"{name}: sent a deadline of {got:.2f} s; expected {expected} s")

    def test_sync_client(self):
        with sbx.Client(self.target, timeout=TIMEOUT) as c:
            sb = sbx.Sandbox(c, info())
            for name, call, expected in CASES:
                with self.subTest(name):
                    self.recorder.take()
                    with self.assertRaises(sbx.FailedPrecondition):
                        call(c, sb)
                    self.check(name, self.recorder.take(), expected)
            name, call, expected = WATCH
            with self.assertRaises(sbx.FailedPrecondition):
                list(call(c))
            self.check(name, self.recorder.take(), expected)

    def test_async_client(self):
        async def run():
            async with sbx.AsyncClient(self.target, timeout=TIMEOUT) as c:
                sb = sbx.AsyncSandbox(c, info())
                for name, call, expected in CASES:
                    with self.subTest(name):
                        self.recorder.take()
                        with self.assertRaises(sbx.FailedPrecondition):
                            await call(c, sb)
                        self.check(name, self.recorder.take(), expected)
                name, call, expected = WATCH
                with self.assertRaises(sbx.FailedPrecondition):
                    async for _ in call(c):
                        pass
                self.check(name, self.recorder.take(), expected)
        asyncio.run(run())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentListener:
    """A TCP port that accepts connections and never says a word (no HTTP/2)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.target = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.conns:
            conn.close()


# A bound far above a 2 s timeout and far below what a claim took before the client's
# timeout applied to it (21-23 s of retries with the server down, 35 s against a server
# that does not answer): not a speed test, a test of which deadline ended the call.
BOUND = 15.0


class NoServerTest(unittest.TestCase):
    """Client(timeout=2): a claim with policy "fail" ends in about 2 s, sync and async,
    Claim and ClaimBatch, whether nothing listens (UNAVAILABLE, retried until the
    deadline) or the server never answers (DEADLINE_EXCEEDED)."""

    def setUp(self):
        self.silent = SilentListener()
        self.addCleanup(self.silent.close)

    def cases(self):
        return [("nothing listens", f"127.0.0.1:{free_port()}",
                 (sbx.Unavailable, sbx.DeadlineExceeded)),
                # grpc may give up on the connection (no SETTINGS frame) before the deadline
                ("never answers", self.silent.target,
                 (sbx.DeadlineExceeded, sbx.Unavailable))]

    def test_sync(self):
        for what, target, errors in self.cases():
            for kind in ("claim", "claim_batch"):
                with self.subTest(what=what, kind=kind):
                    with sbx.Client(target, timeout=2) as c:
                        start = time.monotonic()
                        with self.assertRaises(errors):
                            if kind == "claim":
                                c.claim("default", policy="fail")
                            else:
                                c.claim_batch("default", 2, policy="fail")
                        took = time.monotonic() - start
                    self.assertLess(took, BOUND, f"{kind} took {took:.1f} s")

    def test_async(self):
        async def run(target, errors, kind):
            async with sbx.AsyncClient(target, timeout=2) as c:
                start = time.monotonic()
                with self.assertRaises(errors):
                    if kind == "claim":
                        await c.claim("default", policy="fail")
                    else:
                        await c.claim_batch("default", 2, policy="fail")
                return time.monotonic() - start
        for what, target, errors in self.cases():
            for kind in ("claim", "claim_batch"):
                with self.subTest(what=what, kind=kind):
                    took = asyncio.run(run(target, errors, kind))
                    self.assertLess(took, BOUND, f"{kind} took {took:.1f} s")


if __name__ == "__main__":
    harness.main()
