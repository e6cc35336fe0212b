#!/usr/bin/python3
"""End to end on one machine: sbx-server with the local runtime and the example config,
called from Python's grpcio as a user would. Claims a warm bubblewrap sandbox, runs a
command in it through its sbx-sandboxd, releases it, and checks restart behaviour.

Usage: local_claim_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML
"""

import atexit
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
from grpc_tools import protoc

SERVER = PROTO = CONFIG = None
STUBS = tempfile.mkdtemp(prefix="sbx-e2e-stubs-")
atexit.register(shutil.rmtree, STUBS, True)


def generate_stubs():
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = [os.path.relpath(f, PROTO) for f in
             glob.glob(os.path.join(PROTO, "sbx", "v1", "*.proto")) +
             glob.glob(os.path.join(PROTO, "sbx", "sandboxd", "v1", "*.proto"))]
    rc = protoc.main(["protoc", f"-I{PROTO}", f"-I{wkt}", f"--python_out={STUBS}",
                      f"--grpc_python_out={STUBS}"] + files)
    if rc != 0:
        sys.exit("cannot generate stubs")
    sys.path.insert(0, STUBS)


class Server:
    def __init__(self, workdir, extra=()):
        self.workdir = workdir
        self.port_file = os.path.join(workdir, "port")
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.log = open(os.path.join(workdir, "server.log"), "a")
        self.proc = subprocess.Popen(
            [SERVER, "--listen=127.0.0.1:0", f"--port_file={self.port_file}",
             f"--data_dir={workdir}/data", f"--sandbox_root={workdir}/sb", f"--config={CONFIG}",
             "--insecure_no_auth", *extra],
            cwd=workdir, stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError("server did not start: " + self.logtext())
            time.sleep(0.05)
        with open(self.port_file) as f:
            self.target = "127.0.0.1:" + f.read().strip()
        self.channel = grpc.insecure_channel(self.target)

    def logtext(self):
        self.log.flush()
        with open(os.path.join(self.workdir, "server.log")) as f:
            return f.read()[-3000:]

    def stop(self, sig=signal.SIGTERM):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.log.close()
        return self.proc.returncode


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

    def run_in(self, endpoint, argv):
        from sbx.sandboxd.v1 import sandboxd_pb2, sandboxd_pb2_grpc
        with grpc.insecure_channel(endpoint) as ch:
            stub = sandboxd_pb2_grpc.SandboxdStub(ch)
            out, code = b"", None
            start = sandboxd_pb2.ExecRequest(start=sandboxd_pb2.ExecStart(argv=argv))
            for r in stub.Exec(iter([start]), timeout=20):
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
        out, code = self.run_in(claim.sandbox.endpoint, ["/bin/sh", "-c", "echo hi; hostname"])
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

    def test_restart_marks_claims_lost_and_refills(self):
        from sbx.v1 import claims_pb2, types_pb2
        self.wait_warm(2)
        claim = self.claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id="keep"),
                                  timeout=10).claim
        # kill -9: the local sandboxes die with the server, none is left running.
        self.server.stop(signal.SIGKILL)
        deadline = time.time() + 15
        while sandbox_processes(claim.sandbox.id) and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(sandbox_processes(claim.sandbox.id), [],
                         "sandbox processes outlived the killed server")
        self.server = Server(self.dir)
        self.claims = claims_pb2_grpc_stub(self.server.channel)
        from sbx.v1 import admin_pb2_grpc
        self.admin = admin_pb2_grpc.AdminServiceStub(self.server.channel)
        got = self.claims.GetClaim(claims_pb2.GetClaimRequest(claim_id="keep"), timeout=5).claim
        self.assertEqual(got.sandbox.id, claim.sandbox.id)
        self.assertEqual(got.state, types_pb2.CLAIM_STATE_LOST)
        self.wait_warm(2)
        self.assertEqual(self.server.stop(signal.SIGTERM), 0)


def sandbox_processes(sandbox_id):
    """Pids of processes whose command line contains `sandbox_id` (a sandbox id, which is
    bwrap's --hostname, or a folder its sockets live under)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if sandbox_id.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


def claims_pb2_grpc_stub(channel):
    from sbx.v1 import claims_pb2_grpc
    return claims_pb2_grpc.ClaimServiceStub(channel)


if __name__ == "__main__":
    SERVER, PROTO, CONFIG = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    generate_stubs()
    unittest.main()
