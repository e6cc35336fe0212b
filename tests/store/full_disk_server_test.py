"""sbx-server on a full data volume: a real server (instant runtime) whose --data_dir is on
a small tmpfs that a filler file fills up.

Checks that the server refuses writes with UNAVAILABLE naming the path and the free bytes,
keeps serving reads and stays up, reports sbx_store_writable 0 and the free bytes, takes
writes again by itself once the filler is gone, and that a restart on the full volume
comes up (read-only) and serves what it has instead of crash-looping.

Needs root, to mount the tmpfs in a private mount namespace (the test re-runs itself under
`unshare --mount`, so the mount vanishes with it); exits 77 (skipped) otherwise.

Checked against 660dada (before the store handled a full disk; run without
--data_min_free_bytes, which it lacks): with the volume full, claims went on into the
space RocksDB had preallocated for its log, then the shutdown aborted (assertion
`sync_without_flush_called_' in RocksDB's info log writer) and so did every restart on the
full volume, in DB::Open.

usage: full_disk_server_test.py SBX_SERVER PROTO_DIR
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "metrics"))
import harness  # noqa: E402  (stubs, wait_for, the scrape parser)

SKIP = 77
MIB = 1 << 20
RESERVE = 4 * MIB
SERVER = None


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path, filler, leave):
    """Appends to `filler` until at most `leave` bytes are free on path's file system."""
    chunk = b"f" * 65536
    with open(filler, "ab") as f:
        while free_bytes(path) > leave:
            try:
                f.write(chunk[:max(4096, min(len(chunk), free_bytes(path) - leave))])
                f.flush()
            except OSError:
                break


class Server:
    """sbx-server with the instant runtime, its store on the tmpfs, no --config (a start
    applies a config's pools through the store, which a full volume refuses)."""

    def __init__(self, workdir, data_dir):
        self.workdir = workdir
        self.port_file = os.path.join(workdir, "port")
        self.metrics_port_file = os.path.join(workdir, "metrics-port")
        for f in (self.port_file, self.metrics_port_file):
            if os.path.exists(f):
                os.remove(f)
        self.log_path = os.path.join(workdir, "server.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [SERVER, "--listen=127.0.0.1:0", f"--port_file={self.port_file}",
             "--metrics_listen=127.0.0.1:0", f"--metrics_port_file={self.metrics_port_file}",
             f"--data_dir={data_dir}", f"--data_min_free_bytes={RESERVE}", "--runtime=instant",
             "--refill_qps=100000", "--insecure_no_auth"],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        harness.wait_for(lambda: (os.path.exists(self.port_file)
                                  and os.path.exists(self.metrics_port_file))
                         or self.proc.poll() is not None, 30, "sbx-server to serve")
        if self.proc.poll() is not None:
            raise AssertionError("sbx-server exited with %s:\n%s" % (self.proc.returncode,
                                                                     self.log_text()))
        with open(self.port_file) as f:
            self.channel = grpc.insecure_channel("127.0.0.1:" + f.read().strip())
        with open(self.metrics_port_file) as f:
            self.metrics_port = int(f.read().strip())
        from sbx.v1 import admin_pb2_grpc, claims_pb2_grpc
        self.claims = claims_pb2_grpc.ClaimServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def log_text(self, whole=False):
        """The log's end (for failure messages), or all of it (to look for a line)."""
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        return text if whole else text[-6000:]

    def metric(self, name):
        import urllib.request
        url = "http://127.0.0.1:%d/metrics" % self.metrics_port
        with urllib.request.urlopen(url, timeout=10) as r:
            _, samples = harness.parse_metrics(r.read().decode())
        return harness.value(samples, name)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.channel.close()
        rc = harness.stop(self.proc)
        self.log.close()
        return rc


class FullDiskServerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sbx-full-disk-server-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.volume = os.path.join(self.dir, "volume")
        os.mkdir(self.volume)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", self.volume],
                       check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", self.volume])
        self.data = os.path.join(self.volume, "data")
        self.filler = os.path.join(self.volume, "filler")
        self.server = None
        self.addCleanup(lambda: self.server and self.server.stop())

    def start(self):
        self.server = Server(self.dir, self.data)
        return self.server

    def claim(self, claim_id):
        from sbx.v1 import claims_pb2
        return self.server.claims.Claim(
            claims_pb2.ClaimRequest(pool="py", claim_id=claim_id), timeout=10).claim

    def get_claim(self, claim_id):
        from sbx.v1 import claims_pb2
        return self.server.claims.GetClaim(claims_pb2.GetClaimRequest(claim_id=claim_id),
                                           timeout=10).claim

    def assert_unavailable(self, call, what):
        with self.assertRaises(grpc.RpcError, msg=what) as cm:
            call()
        err = cm.exception
        self.assertEqual(err.code(), grpc.StatusCode.UNAVAILABLE, "%s: %s" % (what, err.details()))
        self.assertIn(self.data, err.details(), what)
        self.assertIn("bytes free", err.details(), what)

    def test_refuses_writes_serves_reads_and_recovers_by_itself(self):
        from sbx.v1 import admin_pb2, claims_pb2, types_pb2
        self.start()
        self.server.admin.PutTemplate(admin_pb2.PutTemplateRequest(template=admin_pb2.Template(
            name="t", runtime="local", local=admin_pb2.LocalSpec())), timeout=10)
        self.server.admin.PutPool(admin_pb2.PutPoolRequest(pool=admin_pb2.Pool(
            name="py", template="t", min_warm=4, max_warm=4,
            empty_pool_policy=types_pb2.EMPTY_POOL_POLICY_FAIL)), timeout=10)
        harness.wait_for(lambda: self.server.admin.GetPool(
            admin_pb2.GetPoolRequest(name="py"), timeout=10).pool.status.warm == 4, 30,
            "the pool to fill")
        acked = [self.claim("c%d" % i).claim_id for i in range(2)]
        self.assertEqual(self.server.metric("sbx_store_writable"), 1.0)
        self.assertEqual(self.server.metric("sbx_store_min_free_bytes"), float(RESERVE))

        # Below the reserve: writes refused, reads served, the process stays up.
        fill(self.volume, self.filler, leave=MIB)
        harness.wait_for(lambda: self.server.metric("sbx_store_writable") == 0.0, 15,
                         "sbx_store_writable to drop to 0")
        self.assertLess(self.server.metric("sbx_store_free_bytes"), RESERVE)
        self.assert_unavailable(lambda: self.claim("low"), "Claim below the reserve")
        self.assert_unavailable(lambda: self.server.claims.Release(
            claims_pb2.ReleaseRequest(claim_id=acked[0]), timeout=10), "Release below the reserve")
        for claim_id in acked:
            self.assertEqual(self.get_claim(claim_id).claim_id, claim_id)
        listed = self.server.claims.ListClaims(claims_pb2.ListClaimsRequest(), timeout=10)
        self.assertEqual(sorted(c.claim_id for c in listed.claims), sorted(acked))

        # Completely full.
        fill(self.volume, self.filler, leave=0)
        self.assert_unavailable(lambda: self.claim("full"), "Claim on a full volume")
        self.assertTrue(self.server.alive(), self.server.log_text())

        # Room again: writes resume without a restart.
        os.remove(self.filler)
        harness.wait_for(lambda: self.server.metric("sbx_store_writable") == 1.0, 15,
                         "sbx_store_writable to come back to 1")
        acked.append(self.claim("after").claim_id)

        # A restart on the full volume comes up read-only and serves what it has. (Filled
        # after the stop: closing the store gives back the log's preallocated space.)
        self.assertEqual(self.server.stop(), 0, self.server.log_text())
        fill(self.volume, self.filler, leave=0)
        self.start()
        self.assertIn("opened READ-ONLY", self.server.log_text(whole=True))
        for claim_id in acked:
            self.assertEqual(self.get_claim(claim_id).claim_id, claim_id)
        self.assertEqual(self.server.metric("sbx_store_writable"), 0.0)
        self.assert_unavailable(lambda: self.claim("restarted-full"), "Claim after a full restart")

        # And takes writes once there is room again, without another restart.
        os.remove(self.filler)
        harness.wait_for(lambda: self.server.metric("sbx_store_writable") == 1.0, 15,
                         "the read-only store to reopen for writing")
        harness.wait_for(lambda: self.server.admin.GetPool(
            admin_pb2.GetPoolRequest(name="py"), timeout=10).pool.status.warm > 0, 30,
            "the pool to refill")
        acked.append(self.claim("after-restart").claim_id)
        self.assertEqual(self.server.stop(), 0, self.server.log_text())

        # Nothing acknowledged was lost, nothing refused was applied.
        self.start()
        listed = self.server.claims.ListClaims(claims_pb2.ListClaimsRequest(), timeout=10)
        self.assertEqual(sorted(c.claim_id for c in listed.claims), sorted(acked))


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: full_disk_server_test.py SBX_SERVER PROTO_DIR")
    if os.geteuid() != 0:
        print("SKIP: needs root to mount a tmpfs (running as uid %d)" % os.geteuid())
        sys.exit(SKIP)
    if not os.environ.get("SBX_FULL_DISK_UNSHARED"):
        # A mount namespace of our own: the tmpfs goes away with the process, whatever
        # happens to it.
        env = dict(os.environ, SBX_FULL_DISK_UNSHARED="1")
        try:
            if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
                print("SKIP: cannot make a mount namespace (unshare --mount)")
                sys.exit(SKIP)
            rc = subprocess.run(["unshare", "--mount", "--propagation", "private",
                                 sys.executable, *sys.argv], env=env).returncode
        except OSError as e:
            print("SKIP: cannot run unshare: %s" % e)
            sys.exit(SKIP)
        sys.exit(rc)
    probe = tempfile.mkdtemp(prefix="sbx-mount-probe-")
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe],
                          capture_output=True).returncode != 0:
            print("SKIP: cannot mount a tmpfs here")
            sys.exit(SKIP)
        subprocess.run(["umount", probe])
    finally:
        os.rmdir(probe)
    global SERVER
    SERVER = sys.argv[1]
    harness.generate_stubs(sys.argv[2])
    unittest.main(argv=sys.argv[:1], verbosity=2)


if __name__ == "__main__":
    main()
