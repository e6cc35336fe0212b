#!/usr/bin/python3
"""End to end on one machine: sbx-server with the local runtime and the example config,
called from Python's grpcio as a user would. Claims a warm bubblewrap sandbox, runs a
command in it through its sbx-sandboxd, releases it, and checks that a claim whose sandbox
died while the server was down is LOST after a restart (tests/e2e/sandbox_test.py checks
that claims whose sandboxes survived are intact).

Usage: local_claim_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML
"""

import hashlib
import hmac
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest

import grpc

import sbx_e2e

SERVER = PROTO = CONFIG = None


def Server(workdir):
    return sbx_e2e.Server(SERVER, workdir, CONFIG)


class LocalClaimTest(unittest.TestCase):
    def setUp(self):
        from sbx.v1 import admin_pb2_grpc, claims_pb2_grpc
        self.dir = tempfile.mkdtemp(prefix="sbx-e2e-")
        self.server = Server(self.dir)
        self.claims = claims_pb2_grpc.ClaimServiceStub(self.server.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.server.channel)

    def tearDown(self):
        self.server.stop(signal.SIGKILL)
        # A sandbox whose bwrap was still starting at the kill can outlive the server (the
        # next runtime on this folder kills it at start); this folder is not reused, so
        # clean up here.
        for pid in sandbox_processes(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait_warm(self, n, timeout=30):
        from sbx.v1 import admin_pb2
        deadline = time.time() + timeout
        while time.time() < deadline:
            pool = self.admin.GetPool(admin_pb2.GetPoolRequest(name="default"), timeout=5).pool
            if pool.status.warm >= n:
                return pool
            time.sleep(0.05)
        self.fail(f"pool never reached {n} warm: {pool}\n{self.server.logtext()}")

    def run_in(self, claim, argv):
        """Runs argv through the sandbox's daemon directly, as the server does: with the
        sandbox's secret, HMAC-SHA256 of its id under the key beside the store."""
        from sbx.sandboxd.v1 import sandboxd_pb2, sandboxd_pb2_grpc
        with open(os.path.join(self.dir, "data", "sandbox.key"), "rb") as f:
            secret = hmac.new(f.read(), claim.sandbox.id.encode(), hashlib.sha256).hexdigest()
        with grpc.insecure_channel(claim.sandbox.endpoint) as ch:
            stub = sandboxd_pb2_grpc.SandboxdStub(ch)
            out, code = b"", None
            start = sandboxd_pb2.ExecRequest(start=sandboxd_pb2.ExecStart(argv=argv))
            for r in stub.Exec(iter([start]), timeout=20,
                               metadata=(("sbx-sandbox-secret", secret),)):
                if r.HasField("stdout_chunk"):
                    out += r.stdout_chunk
                if r.HasField("exit"):
                    code = r.exit.exit_code
            return out.decode(), code

    def test_claim_exec_release(self):
        from sbx.v1 import claims_pb2
        pool = self.wait_warm(2)
        self.assertEqual(pool.min_warm, 2)
        resp = self.claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id="e2e-1"),
                                 timeout=10)
        claim = resp.claim
        self.assertEqual(claim.claim_id, "e2e-1")
        self.assertTrue(claim.sandbox.endpoint.startswith("unix:"), claim)
        out, code = self.run_in(claim, ["/bin/sh", "-c", "echo hi; hostname"])
        self.assertEqual(code, 0)
        self.assertEqual(out, f"hi\n{claim.sandbox.id}\n")
        # The same id again: the same sandbox.
        again = self.claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id="e2e-1"),
                                  timeout=10)
        self.assertTrue(again.replayed)
        self.assertEqual(again.claim.sandbox.id, claim.sandbox.id)
        # The pool refills behind the claim.
        self.wait_warm(2)
        self.claims.Release(claims_pb2.ReleaseRequest(claim_id="e2e-1"), timeout=10)
        sock = claim.sandbox.endpoint[len("unix:"):]
        deadline = time.time() + 20
        while os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.05)
        self.assertFalse(os.path.exists(sock), "released sandbox still running")
        got = self.claims.GetClaim(claims_pb2.GetClaimRequest(claim_id="e2e-1"), timeout=5)
        from sbx.v1 import types_pb2
        self.assertEqual(got.claim.state, types_pb2.CLAIM_STATE_RELEASED)

    def test_unknown_pool_and_bad_id(self):
        from sbx.v1 import claims_pb2
        with self.assertRaises(grpc.RpcError) as e:
            self.claims.Claim(claims_pb2.ClaimRequest(pool="nope"), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn('"nope"', e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id="bad/id"),
                              timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_sandbox_gone_while_down_is_lost_after_restart(self):
        from sbx.v1 import claims_pb2, types_pb2
        self.wait_warm(2)
        claim = self.claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id="keep"),
                                  timeout=10).claim
        # kill -9: local sandboxes outlive the server (a restart adopts them) ...
        self.server.stop(signal.SIGKILL)
        self.assertTrue(sandbox_processes(claim.sandbox.id), "the sandbox died with the server")
        # ... but this one dies while no server runs.
        for pid in sandbox_processes(claim.sandbox.id):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.server = Server(self.dir)
        self.claims = claims_pb2_grpc_stub(self.server.channel)
        from sbx.v1 import admin_pb2_grpc
        self.admin = admin_pb2_grpc.AdminServiceStub(self.server.channel)
        got = self.claims.GetClaim(claims_pb2.GetClaimRequest(claim_id="keep"), timeout=5).claim
        self.assertEqual(got.sandbox.id, claim.sandbox.id)
        self.assertEqual(got.state, types_pb2.CLAIM_STATE_LOST)
        self.wait_warm(2)
        self.assertEqual(self.server.stop(signal.SIGTERM), 0)


sandbox_processes = sbx_e2e.processes_with


def claims_pb2_grpc_stub(channel):
    from sbx.v1 import claims_pb2_grpc
    return claims_pb2_grpc.ClaimServiceStub(channel)


if __name__ == "__main__":
    SERVER, PROTO, CONFIG = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main()
