#!/usr/bin/python3
"""sbx-server's structured logs and request ids.

With --log_format json every line sbx-server writes to stderr is one JSON object with ts,
level and msg; a claim's request id (the client's x-request-id, or a generated one) comes
back as x-request-id initial metadata and is the request_id field of the log line about
the call. With --log_format text the id follows the message as request_id=....

Usage: log_test.py SBX_SERVER PROTO_DIR
"""

import json
import sys
import unittest

import grpc

import harness

SERVER = None


def request_id_of(call):
    for key, value in call.initial_metadata():
        if key == "x-request-id":
            return value
    return None


class LogTest(unittest.TestCase):
    def start(self, fmt):
        server = harness.SbxServer(SERVER, pool="logs", warm=3,
                                   extra=["--log_format=%s" % fmt, "--log_level=debug"])
        self.addCleanup(server.cleanup)
        channel = grpc.insecure_channel(server.target)
        self.addCleanup(channel.close)
        from sbx.v1 import claims_pb2_grpc
        harness.wait_for(lambda: "runtime" in server.stderr_text(), 30, "start-up logs")
        return server, claims_pb2_grpc.ClaimServiceStub(channel)

    def claim_and_release(self, claims):
        """A claim with a client request id, one without, a failing one, releases."""
        from sbx.v1 import claims_pb2
        given = "test-req-42"
        resp, call = claims.Claim.with_call(
            claims_pb2.ClaimRequest(pool="logs", claim_id="logged-1"), timeout=30,
            metadata=[("x-request-id", given)])
        self.assertEqual(request_id_of(call), given)
        resp2, call2 = claims.Claim.with_call(claims_pb2.ClaimRequest(pool="logs"), timeout=30)
        generated = request_id_of(call2)
        self.assertTrue(generated)
        self.assertNotEqual(generated, given)
        with self.assertRaises(grpc.RpcError) as err:
            claims.Claim(claims_pb2.ClaimRequest(pool="no-such-pool"), timeout=30,
                         metadata=[("x-request-id", "test-req-missing")])
        self.assertEqual(err.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(request_id_of(err.exception), "test-req-missing")
        _, call3 = claims.Release.with_call(
            claims_pb2.ReleaseRequest(claim_id=resp.claim.claim_id), timeout=30,
            metadata=[("x-request-id", "test-req-release")])
        self.assertEqual(request_id_of(call3), "test-req-release")
        claims.Release(claims_pb2.ReleaseRequest(claim_id=resp2.claim.claim_id), timeout=30)
        # A request id that is not sane (a space) is replaced by a generated one.
        _, call4 = claims.Release.with_call(
            claims_pb2.ReleaseRequest(claim_id=resp2.claim.claim_id), timeout=30,
            metadata=[("x-request-id", "has space")])
        self.assertNotEqual(request_id_of(call4), "has space")
        return given, generated

    def test_json_lines_and_request_ids(self):
        server, claims = self.start("json")
        given, generated = self.claim_and_release(claims)
        self.assertEqual(server.stop(), 0)
        lines = server.stderr_text().splitlines()
        self.assertGreater(len(lines), 3)
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                self.fail("stderr line is not JSON: %r" % line)
            self.assertIsInstance(record, dict, line)
            for key in ("ts", "level", "msg"):
                self.assertIn(key, record, line)
            self.assertRegex(record["ts"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
            records.append(record)
        by_id = {}
        for r in records:
            if "request_id" in r:
                by_id.setdefault(r["request_id"], []).append(r)
        self.assertIn(given, by_id, "no log line with the client's request id")
        self.assertIn('pool "logs" claim "logged-1"', by_id[given][0]["msg"])
        self.assertIn("OK", by_id[given][0]["msg"])
        self.assertIn(generated, by_id, "no log line with the generated request id")
        self.assertIn("test-req-release", by_id)
        self.assertIn("Release", by_id["test-req-release"][0]["msg"])
        self.assertIn("test-req-missing", by_id)
        self.assertIn("NOT_FOUND", by_id["test-req-missing"][0]["msg"])
        # Messages with quotes survive intact (they were the weak spot of a pattern).
        self.assertTrue(any('"' in r["msg"] for r in records))
        self.assertTrue(any(r["msg"] == "sbx-server stopped" for r in records))

    def test_text_lines_carry_request_id(self):
        server, claims = self.start("text")
        given, _ = self.claim_and_release(claims)
        self.assertEqual(server.stop(), 0)
        text = server.stderr_text()
        self.assertIn("request_id=" + given, text)
        self.assertFalse(text.lstrip().startswith("{"))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: log_test.py SBX_SERVER PROTO_DIR")
    SERVER = sys.argv[1]
    harness.generate_stubs(sys.argv[2])
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:])
