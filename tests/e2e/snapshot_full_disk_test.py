#!/usr/bin/python3
"""A snapshot that fills the data disk (issue 37): a real root sbx-server whose --data_dir is
a 48 MiB tmpfs, a busybox image sandbox that wrote 64 MiB. The snapshot fails with
RESOURCE_EXHAUSTED naming the full disk, leaves no .partial folder and no record, the
sandbox runs on (thawed), and once the sandbox's big file is gone a snapshot fits again
(the failed one's bytes were given back to the disk).

Needs root, to mount the tmpfs in a private mount namespace (the test re-runs itself under
`unshare --mount`, so the mount vanishes with it); skips (exit 0 with SKIP) otherwise.

Usage: snapshot_full_disk_test.py PATH_TO_SBX_SERVER PROTO_DIR
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import grpc

import sbx_e2e

SERVER = PROTO = None
WS = "/run/sbx/workspace"
CONFIG = sbx_e2e.pool_config(("img", {"image": "{ref}", "workspace_size_bytes": 134217728}, 1, 2))


class FullDisk(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sbx-snapfull-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.volume = os.path.join(self.dir, "vol")
        os.makedirs(self.volume)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", self.volume],
                       check=True)
        ref = sbx_e2e.busybox_image(os.path.join(self.dir, "images", "plain"))
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.replace("{ref}", ref))
        self.server = sbx_e2e.Server(
            SERVER, self.dir, config,
            extra=[f"--data_dir={self.volume}/data", "--data_min_free_bytes=1048576",
                   "--image_cache_bytes=1000000000", f"--image_cache_dir={self.dir}/cache",
                   f"--image_import_dir={self.dir}/images", "--snapshot_quota_bytes=0"])

    def tearDown(self):
        self.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(self.dir)
        subprocess.run(["umount", "-l", self.volume])
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_a_snapshot_that_fills_the_disk_leaves_nothing_and_the_sandbox_runs_on(self):
        from sbx.v1 import (claims_pb2, claims_pb2_grpc, sandboxes_pb2_grpc, snapshots_pb2,
                            snapshots_pb2_grpc)
        claims = claims_pb2_grpc.ClaimServiceStub(self.server.channel)
        sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(self.server.channel)
        snaps = snapshots_pb2_grpc.SnapshotsStub(self.server.channel)
        c = claims.Claim(claims_pb2.ClaimRequest(pool="img"), timeout=60).claim
        code, out = sbx_e2e.sh(sandboxes, c.claim_id,
                               f"dd if=/dev/urandom of={WS}/big bs=1M count=64 2>/dev/null "
                               f"&& echo small > {WS}/small && echo OK", timeout=60)
        self.assertEqual(code, 0, out)
        req = snapshots_pb2.CreateSnapshotRequest(claim_id=c.claim_id)
        with self.assertRaises(grpc.RpcError) as cm:
            snaps.CreateSnapshot(req, timeout=60)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         cm.exception.details())
        self.assertIn("No space left", cm.exception.details())
        snapdir = os.path.join(self.volume, "data", "snapshots")
        self.assertEqual(os.listdir(snapdir), [])
        listed = snaps.ListSnapshots(snapshots_pb2.ListSnapshotsRequest(), timeout=10)
        self.assertEqual((len(listed.snapshots), listed.used_bytes), (0, 0))
        code, out = sbx_e2e.sh(sandboxes, c.claim_id, f"rm {WS}/big && cat {WS}/small",
                               timeout=30)
        self.assertEqual((code, out), (0, "small\n"))  # thawed, its files intact
        s = snaps.CreateSnapshot(req, timeout=60).snapshot
        self.assertEqual(s.size_bytes, len("small\n"))
        self.assertEqual(os.listdir(snapdir), [s.id])
        claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id), timeout=30)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if os.geteuid() != 0:
        print("SKIP: needs root to mount a tmpfs")
        sys.exit(0)
    if os.environ.get("SBX_SNAPFULL_NS") != "1":
        if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
            print("SKIP: cannot make a mount namespace (unshare --mount)")
            sys.exit(0)
        env = dict(os.environ, SBX_SNAPFULL_NS="1")
        sys.exit(subprocess.run(["unshare", "--mount", "--propagation", "private",
                                 sys.executable, *sys.argv], env=env).returncode)
    SERVER, PROTO = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main(verbosity=2)
