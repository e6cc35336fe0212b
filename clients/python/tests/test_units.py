#!/usr/bin/python3
"""The SDK's pieces that need no server: error mapping for every status code, the retry
policy's backoff, connection settings from the CLI's environment, value conversions; and
that no generated code sits in the source tree."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import grpc  # noqa: E402

import sbx  # noqa: E402
from sbx import _common as c  # noqa: E402
from sbx.errors import from_rpc_error  # noqa: E402


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing=()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


class ErrorMappingTest(unittest.TestCase):
    def test_every_code_has_its_class_and_keeps_the_message(self):
        S = grpc.StatusCode
        want = {S.INVALID_ARGUMENT: sbx.InvalidArgument, S.NOT_FOUND: sbx.NotFound,
                S.ALREADY_EXISTS: sbx.AlreadyExists, S.PERMISSION_DENIED: sbx.PermissionDenied,
                S.UNAUTHENTICATED: sbx.Unauthenticated, S.RESOURCE_EXHAUSTED: sbx.PoolExhausted,
                S.FAILED_PRECONDITION: sbx.FailedPrecondition, S.ABORTED: sbx.Aborted,
                S.OUT_OF_RANGE: sbx.OutOfRange, S.UNAVAILABLE: sbx.Unavailable,
                S.DEADLINE_EXCEEDED: sbx.DeadlineExceeded, S.UNIMPLEMENTED: sbx.Unimplemented,
                S.INTERNAL: sbx.Internal, S.CANCELLED: sbx.Cancelled}
        for code, cls in want.items():
            with self.subTest(code=code):
                e = from_rpc_error(FakeRpcError(code, f'pool "py" {code.name}'))
                self.assertIs(type(e), cls)
                self.assertIsInstance(e, sbx.SbxError)
                self.assertEqual(e.code, code)
                self.assertEqual(e.message, f'pool "py" {code.name}')
                self.assertEqual(str(e), f'{code.name}: pool "py" {code.name}')
        self.assertIs(type(from_rpc_error(FakeRpcError(S.DATA_LOSS, "x"))), sbx.SbxError)

    def test_retry_hint(self):
        e = from_rpc_error(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "empty",
                                        (("sbx-retry-after-ms", "1500"),)))
        self.assertEqual(e.retry_after, 1.5)
        self.assertIn("retry after 1500 ms", str(e))
        self.assertIn("retry_after=1.5", repr(e))
        self.assertIsNone(from_rpc_error(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                      "x")).retry_after)
        self.assertIsNone(from_rpc_error(FakeRpcError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "x", (("sbx-retry-after-ms", "junk"),))
        ).retry_after)


class RetryPolicyTest(unittest.TestCase):
    def test_backoff_grows_with_jitter_and_is_capped(self):
        p = sbx.RetryPolicy(initial_backoff=0.1, max_backoff=1.0, multiplier=2.0)
        for attempt, cap in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (20, 1.0)):
            samples = [p.backoff(attempt) for _ in range(200)]
            self.assertTrue(all(cap / 2 <= s <= cap for s in samples), (attempt, samples[:5]))
            self.assertGreater(len(set(samples)), 100, "no jitter")

    def test_retryable_codes(self):
        self.assertEqual(c.RETRYABLE_CODES,
                         {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})


class SettingsTest(unittest.TestCase):
    def tearDown(self):
        harness.clean_env()

    def test_cli_defaults_and_env(self):
        s = c.ConnectionSettings.resolve(None, None, False, None, None, None, None)
        self.assertEqual((s.target, s.token, s.tls), ("127.0.0.1:50051", None, False))
        self.assertEqual(s.metadata(), ())
        os.environ["SBX_SERVER"], os.environ["SBX_TOKEN"] = "h:1", "tok"
        s = c.ConnectionSettings.resolve(None, None, False, None, None, None, "name")
        self.assertEqual((s.target, s.token), ("h:1", "tok"))
        self.assertEqual(s.metadata(), (("authorization", "Bearer tok"),))
        self.assertIn(("grpc.ssl_target_name_override", "name"), s.options())
        s = c.ConnectionSettings.resolve("x:2", "arg", True, None, None, None, None)
        self.assertEqual((s.target, s.token, s.tls), ("x:2", "arg", True))
        self.assertNotIn("arg", repr(sbx.Client("x:2", token="arg")))
        with self.assertRaises(ValueError):
            c.ConnectionSettings.resolve(None, None, False, None, __file__, None, None)


class ValuesTest(unittest.TestCase):
    def test_argv_signal_policy(self):
        self.assertEqual(c.argv_of("echo $X"), ["sh", "-c", "echo $X"])
        self.assertEqual(c.argv_of(["a", "b"]), ["a", "b"])
        for bad in ([], [1]):
            with self.assertRaises(ValueError):
                c.argv_of(bad)
        self.assertEqual([c.signal_value(x) for x in ("TERM", "sigint", 9)], [15, 2, 9])
        with self.assertRaises(ValueError):
            c.signal_value("NOPE")
        self.assertEqual(c.policy_value("FAIL"), 3)
        with self.assertRaises(ValueError):
            c.policy_value("sometimes")

    def test_priority(self):
        self.assertEqual([c.priority_value(x) for x in (None, "interactive", "Normal", "BATCH")],
                         [0, 3, 2, 1])
        for bad in ("urgent", "", "high"):
            with self.subTest(bad=bad), self.assertRaises(ValueError) as ctx:
                c.priority_value(bad)
            self.assertIn(repr(bad), str(ctx.exception))
            self.assertIn("'interactive', 'normal', 'batch'", str(ctx.exception))
        # Refused before any call: nothing listens on this port.
        with sbx.Client("127.0.0.1:1") as client:
            for call in (lambda: client.claim("py", priority="urgent"),
                         lambda: client.claim_batch("py", 2, priority="urgent")):
                with self.assertRaisesRegex(ValueError, "priority 'urgent' is not one of"):
                    call()

    def test_exec_result(self):
        r = sbx.ExecResult(stdout_raw=b"\xffok", stderr_raw=b"", exit_code=None, signal=9,
                           timed_out=True)
        self.assertEqual(r.stdout, "\ufffdok")
        self.assertEqual(r.returncode, -9)
        self.assertFalse(r.ok)
        self.assertIn("signal=9", repr(r))
        self.assertIn("timed_out=True", repr(r))

    def test_claim_request(self):
        req = c.claim_request("id-1", "py", 600, {"A": "1"}, {"f.txt": "x"}, {"l": "v"}, 2.5,
                              "cold")
        self.assertEqual((req.ttl.seconds, req.wait_timeout.ToMilliseconds()), (600, 2500))
        self.assertEqual(req.config.files[0].content, b"x")
        self.assertEqual(req.empty_pool_policy, 2)
        self.assertEqual(req.priority, 0)  # None: the server's default (normal)
        self.assertEqual(c.claim_request("id-1", "py", None, None, None, None, None, None,
                                         "batch").priority, 1)
        breq = c.batch_request("b-1", "py", 3, True, None, None, None, None, None, "wait",
                               "interactive")
        self.assertEqual((breq.count, breq.empty_pool_policy, breq.priority), (3, 1, 3))
        with self.assertRaises(ValueError):
            c.claim_request("id", "py", -1, None, None, None, None, None)

    def test_node_preference_in_the_requests(self):
        zone = {"topology.kubernetes.io/zone": "europe-west1-b", "disk": "ssd"}
        req = c.claim_request("id-1", "py", None, None, None, {"l": "v"}, None, None, None,
                              zone)
        self.assertEqual((dict(req.node_preference), dict(req.labels)), (zone, {"l": "v"}))
        breq = c.batch_request("b-1", "py", 2, False, None, None, None, {"l": "v"}, None,
                               None, None, zone)
        self.assertEqual((dict(breq.node_preference), dict(breq.labels)), (zone, {"l": "v"}))
        # None (the default) sends none: any node.
        self.assertEqual(len(c.claim_request("id-1", "py", None, None, None, None, None,
                                             None).node_preference), 0)
        self.assertEqual(len(c.batch_request("b-1", "py", 2, False, None, None, None, None,
                                             None, None).node_preference), 0)
        # What goes on the wire: decoded again, the map is there.
        wire = type(req).FromString(req.SerializeToString())
        self.assertEqual(dict(wire.node_preference), zone)


class ImageClaimTest(unittest.TestCase):
    """Claims by image (issue 34): the requests, the deadline, and the one-of check."""

    def test_the_requests_carry_the_image_and_no_pool(self):
        req = c.claim_request("id-1", None, None, None, None, None, None, None,
                              image="oci:/images/a:v1")
        self.assertEqual((req.pool, req.image), ("", "oci:/images/a:v1"))
        wire = type(req).FromString(req.SerializeToString())
        self.assertEqual(wire.image, "oci:/images/a:v1")
        breq = c.batch_request("b-1", None, 2, False, None, None, None, None, None, None,
                               image="python:3.12")
        self.assertEqual((breq.pool, breq.image, breq.count), ("", "python:3.12", 2))
        self.assertEqual(c.claim_request("id-1", "py", None, None, None, None, None,
                                         None).image, "")

    def test_the_deadline_allows_for_a_first_pull(self):
        self.assertEqual(c.claim_deadline(None, None, 10, image=True), 310)
        self.assertEqual(c.claim_deadline(None, None, 10), 40)
        self.assertEqual(c.claim_deadline(5, None, 10, image=True), 15)
        self.assertEqual(c.claim_deadline(None, "fail", 10, image=True), 10)

    def test_pool_or_image_before_any_call(self):
        # Nothing listens on this port: each refusal comes before a call.
        with sbx.Client("127.0.0.1:1") as client:
            with self.assertRaisesRegex(ValueError, r"give a pool \('py'\) or an image "
                                                    r"\('oci:/x:1'\), not both"):
                client.claim("py", image="oci:/x:1")
            with self.assertRaisesRegex(ValueError, "give a pool, or an image"):
                client.claim()
            with self.assertRaisesRegex(ValueError, "not both"):
                client.claim_batch("py", 2, image="oci:/x:1")
            with self.assertRaisesRegex(TypeError, "needs n"):
                client.claim_batch(image="oci:/x:1")


class TreeTest(unittest.TestCase):
    def test_no_generated_code_in_the_source_tree(self):
        pkg = os.path.join(harness.ROOT, "clients", "python", "sbx")
        found = [os.path.join(d, f) for d, _, fs in os.walk(pkg) for f in fs
                 if f.endswith(("_pb2.py", "_pb2_grpc.py"))]
        self.assertEqual(found, [])


if __name__ == "__main__":
    harness.main()
