#!/usr/bin/python3
"""Snapshots on the local runtime (issue 37), with a real sbx-server as root, real bubblewrap,
a real RocksDB and an image built here offline (busybox-static): CreateSnapshot, Get, List,
Delete; the sandbox as hostile input to the server's copy (links to host files, a FIFO,
device nodes and a socket planted in its layer); a snapshot taken while a process writes as
fast as it can; tenants; the byte quota; and a kill -9 of the server in the middle of a
snapshot.

Usage: snapshot_test.py PATH_TO_SBX_SERVER PROTO_DIR
"""

import os
import shutil
import signal
import socket
import stat

import grpc

import sbx_e2e
from sbx_e2e import A, B, WS

SERVER = PROTO = None

CONFIG = sbx_e2e.pool_config(sbx_e2e.IMG_POOL, sbx_e2e.HOST_POOL)



class Snapshots(sbx_e2e.ServerTestCase):
    TOKENS = sbx_e2e.TWO_TENANTS
    MD = A
    quota = 64 << 20

    @classmethod
    def setUpClass(cls):
        cls.make_workdir("sbx-snap-", 0o755)
        cls.plain_ref = sbx_e2e.busybox_image(os.path.join(cls.dir, "images", "plain"))
        cls.config = cls.write_file("config.yaml", CONFIG.replace("{plain}", cls.plain_ref))
        # A host file no sandbox may ever see, and whose content must never reach a snapshot.
        cls.secret = cls.write_file("host-secret", "HOST-SECRET-CONTENT\n")
        cls.start_server(cls.config, [
            "--image_cache_bytes=1000000000", f"--image_import_dir={cls.dir}/images",
            f"--snapshot_quota_bytes={cls.quota}"])

    # --- helpers ---

    def files(self, snap_id):
        return os.path.join(self.dir, "data", "snapshots", snap_id)

    def sandbox_layer(self, claim):
        """The host path of the claim's sandbox's upper layer (through sbx-rootfs's mount
        namespace, which the sandbox's top process has), to plant what an unprivileged
        sandbox cannot make itself (device nodes)."""
        sb = os.path.join(self.dir, "sb", claim.sandbox.id)
        for pid in sbx_e2e.processes_with(sb):
            try:
                if os.readlink(f"/proc/{pid}/cwd") == sb:
                    path = f"/proc/{pid}/root{sb}/layer/upper"
                    if os.path.isdir(path):
                        return path
            except OSError:
                continue
        self.fail(f"no process of sandbox {claim.sandbox.id} has its layer")

    # --- tests ---

    def test_a_snapshot_holds_the_layer_and_the_workspace_and_the_source_runs_on(self):
        c = self.claim()
        try:
            code, out = self.sh(c, f"echo changed > /etc/os-release && rm /bin/ls && "
                                   f"mkdir -p /opt/app && echo app > /opt/app/f && "
                                   f"echo ws > {WS}/note && "
                                   f"dd if=/dev/zero of={WS}/blob bs=1024 count=2048 2>/dev/null "
                                   f"&& echo OK")
            self.assertEqual(code, 0, out)
            resp = self.create_snapshot(c, name="first", labels={"stage": "prepared"})
            s = resp.snapshot
            self.assertTrue(s.id.startswith("sn-"), s.id)
            self.assertEqual(s.name, "first")
            self.assertEqual(s.owner, "tenant-a")
            self.assertEqual(s.source_claim_id, c.claim_id)
            self.assertTrue(s.parent_image_digest.startswith("sha256:"), s.parent_image_digest)
            self.assertGreaterEqual(s.size_bytes, 2048 * 1024)
            self.assertLess(s.size_bytes, 2048 * 1024 + 1024 * 1024)
            root = os.path.join(self.files(s.id), "root")
            with open(os.path.join(root, "etc", "os-release")) as f:
                self.assertEqual(f.read(), "changed\n")
            with open(os.path.join(root, "opt", "app", "f")) as f:
                self.assertEqual(f.read(), "app\n")
            # The deletion of /bin/ls is a whiteout (a character device 0:0): kept.
            st = os.lstat(os.path.join(root, "bin", "ls"))
            self.assertTrue(stat.S_ISCHR(st.st_mode))
            self.assertEqual(st.st_rdev, 0)
            ws = os.path.join(self.files(s.id), "workspace")
            with open(os.path.join(ws, "note")) as f:
                self.assertEqual(f.read(), "ws\n")
            self.assertEqual(os.path.getsize(os.path.join(ws, "blob")), 2048 * 1024)
            # Nothing half-made beside it.
            self.assertEqual([n for n in os.listdir(os.path.dirname(self.files(s.id)))
                              if n.endswith(".partial")], [])
            # The source was thawed and kept everything.
            code, out = self.sh(c, f"cat /etc/os-release {WS}/note")
            self.assertEqual((code, out), (0, "changed\nws\n"))
            self.assertEqual(self.get_snapshot(s.id), s)
            listed = self.list_snapshots(stage="prepared")
            self.assertIn(s.id, [x.id for x in listed.snapshots])
            self.assertGreaterEqual(listed.used_bytes, s.size_bytes)
            self.assertEqual(listed.quota_bytes, self.quota)
            self.assertNotIn(s.id, [x.id for x in self.list_snapshots(stage="other").snapshots])
            self.delete_snapshot(s.id)
            self.assertFalse(os.path.exists(self.files(s.id)))
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.get_snapshot, s.id)
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.delete_snapshot, s.id)
        finally:
            self.release(c)

    def test_a_sandbox_of_the_hosts_root_gets_its_workspace_only(self):
        c = self.claim("host")
        try:
            code, out = self.sh(c, "echo hello > note && pwd")
            self.assertEqual(code, 0, out)
            s = self.snapshot(c)
            self.assertEqual(s.parent_image_digest, "")
            self.assertFalse(os.path.exists(os.path.join(self.files(s.id), "root")))
            with open(os.path.join(self.files(s.id), "workspace", "note")) as f:
                self.assertEqual(f.read(), "hello\n")
            self.delete_snapshot(s.id)
        finally:
            self.release(c, A)

    # The sandbox turns files into links to host paths, a FIFO, and (planted from the host,
    # as an unprivileged sandbox cannot mknod) device nodes and a socket. The copy must
    # neither follow the links (the host file's content would land in the snapshot), nor
    # open the FIFO (it would hang), nor carry a device. Seen failing with AT_SYMLINK_NOFOLLOW
    # and O_NOFOLLOW taken out of the copy: it followed d/etc-link -> /etc into the host's
    # /etc (a link resolves against the server's root, not the sandbox's) and copied the
    # host's files until one of them changed under it.
    def test_hostile_entries_are_copied_as_what_they_are(self):
        c = self.claim()
        try:
            code, out = self.sh(c, f"ln -sf /etc/shadow /etc/os-release && "
                                   f"ln -s {self.secret} {WS}/secret-link && "
                                   f"ln -s ../../../../../../../../{self.secret.lstrip('/')} "
                                   f"{WS}/relative-link && "
                                   f"mkfifo {WS}/fifo && mkfifo /etc/fifo && "
                                   f"mkdir {WS}/d && ln -s /etc {WS}/d/etc-link && echo OK")
            self.assertEqual(code, 0, out)
            layer = self.sandbox_layer(c)
            os.mknod(os.path.join(layer, "etc", "null-dev"), 0o666 | stat.S_IFCHR,
                     os.makedev(1, 3))
            os.mknod(os.path.join(layer, "etc", "disk-dev"), 0o666 | stat.S_IFBLK,
                     os.makedev(7, 0))
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(os.path.join(layer, "etc", "sock"))
            sock.close()
            resp = self.create_snapshot(c, timeout=60)
            s = resp.snapshot
            self.assertEqual(resp.dropped_entries, 3)
            root = os.path.join(self.files(s.id), "root")
            ws = os.path.join(self.files(s.id), "workspace")
            self.assertEqual(os.readlink(os.path.join(root, "etc", "os-release")), "/etc/shadow")
            self.assertEqual(os.readlink(os.path.join(ws, "secret-link")), self.secret)
            self.assertTrue(os.readlink(os.path.join(ws, "relative-link")).endswith("host-secret"))
            self.assertEqual(os.readlink(os.path.join(ws, "d", "etc-link")), "/etc")
            self.assertTrue(stat.S_ISFIFO(os.lstat(os.path.join(ws, "fifo")).st_mode))
            self.assertTrue(stat.S_ISFIFO(os.lstat(os.path.join(root, "etc", "fifo")).st_mode))
            for gone in ("null-dev", "disk-dev", "sock"):
                self.assertFalse(os.path.lexists(os.path.join(root, "etc", gone)), gone)
            with open("/etc/shadow", "rb") as f:
                shadow = f.read()
            for top, _, names in os.walk(self.files(s.id)):
                for n in names:
                    p = os.path.join(top, n)
                    st = os.lstat(p)
                    self.assertEqual(st.st_mode & (stat.S_ISUID | stat.S_ISGID), 0, p)
                    if stat.S_ISREG(st.st_mode):
                        with open(p, "rb") as f:
                            data = f.read()
                        self.assertNotIn(b"HOST-SECRET-CONTENT", data, p)
                        if shadow:
                            self.assertNotEqual(data, shadow, p)
                    self.assertFalse(stat.S_ISBLK(st.st_mode), p)
                    if stat.S_ISCHR(st.st_mode):
                        self.assertEqual(st.st_rdev, 0, p)  # whiteouts only
            # Owned by root (the server), not by the sandbox's host uid.
            self.assertEqual(os.lstat(os.path.join(ws, "secret-link")).st_uid, 0)
            self.delete_snapshot(s.id)
        finally:
            self.release(c)

    # A process appends to two logs in turn as fast as it can; the snapshot is one point in
    # time (the freezer holds every process for the whole copy), so the logs are whole lines
    # 1..n and 1..m with n - m in {0, 1}, though a 24 MiB file is copied between them.
    # Seen failing with the freeze taken out of Capture: n - m was in the thousands.
    def test_a_snapshot_is_a_consistent_point_while_a_process_writes(self):
        c = self.claim()
        snap = None
        try:
            # Made in this order, which is the order a tmpfs lists them in (and so the copy's):
            # the filler lies between the two logs.
            code, out = self.sh(c, f"touch {WS}/a.log && dd if=/dev/zero of={WS}/m-filler "
                                   f"bs=1M count=24 2>/dev/null && touch {WS}/z.log && "
                                   f"(i=0; while true; do i=$((i+1)); "
                                   f"echo $i >> {WS}/a.log; echo $i >> {WS}/z.log; "
                                   f"done) >/dev/null 2>&1 & sleep 0.5; echo started")
            self.assertEqual(code, 0, out)
            snap = self.snapshot(c)
            ws = os.path.join(self.files(snap.id), "workspace")

            def lines(name):
                with open(os.path.join(ws, name)) as f:
                    text = f.read()
                self.assertTrue(text.endswith("\n"), f"{name} ends with a whole line")
                got = [int(x) for x in text.split("\n")[:-1]]
                self.assertEqual(got, list(range(1, len(got) + 1)), name)
                return len(got)

            a, z = lines("a.log"), lines("z.log")
            self.assertGreater(a, 0)
            self.assertIn(a - z, (0, 1), (a, z))
            # The writer runs on after the snapshot.
            code, out = self.sh(c, f"x=$(wc -l < {WS}/a.log); sleep 0.3; "
                                   f"y=$(wc -l < {WS}/a.log); test $y -gt $x && echo RUNS")
            self.assertIn("RUNS", out)
        finally:
            if snap is not None:
                self.delete_snapshot(snap.id)
            self.release(c)

    # Tenant B never sees, uses or deletes A's snapshot, nor snapshots A's claim. Seen
    # failing with the owner check removed from Snapshots::Get/Delete (B got A's record and
    # deleted it).
    def test_another_tenants_snapshot_is_not_found(self):
        c = self.claim()
        try:
            s = self.snapshot(c)
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.get_snapshot, s.id, B)
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.delete_snapshot, s.id, B)
            self.assertNotIn(s.id, [x.id for x in self.list_snapshots(B).snapshots])
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.snapshot, c, md=B)
            self.assertEqual(self.get_snapshot(s.id).id, s.id)  # still A's, untouched
            self.assertTrue(os.path.isdir(self.files(s.id)))
            self.delete_snapshot(s.id)
        finally:
            self.release(c)

    # A sandbox that fills its layer cannot make a snapshot past the tenant's quota: the copy
    # stops at the quota (nothing of it stays), the message names the quota's flag, and a
    # smaller snapshot still fits afterwards.
    def test_the_byte_quota_stops_a_snapshot_that_would_pass_it(self):
        c = self.claim()
        try:
            code, out = self.sh(c, f"dd if=/dev/urandom of=/big bs=1M count=80 2>/dev/null && "
                                   f"echo OK")
            self.assertEqual(code, 0, out)
            before = self.list_snapshots().used_bytes
            msg = self.assert_code(grpc.StatusCode.RESOURCE_EXHAUSTED, self.snapshot, c)
            self.assertIn("--snapshot_quota_bytes", msg)
            self.assertIn("tenant-a", msg)
            snapdir = os.path.join(self.dir, "data", "snapshots")
            self.assertEqual([n for n in os.listdir(snapdir) if n.endswith(".partial")], [])
            self.assertEqual(self.list_snapshots().used_bytes, before)
            code, out = self.sh(c, "rm /big && echo OK")
            self.assertEqual(code, 0, out)
            s = self.snapshot(c)
            self.delete_snapshot(s.id)
        finally:
            self.release(c)

    def test_bad_requests(self):
        from sbx.v1 import snapshots_pb2
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, self.snaps.CreateSnapshot,
                         snapshots_pb2.CreateSnapshotRequest(), metadata=A, timeout=10)
        self.assert_code(grpc.StatusCode.NOT_FOUND, self.snaps.CreateSnapshot,
                         snapshots_pb2.CreateSnapshotRequest(claim_id="nope"), metadata=A,
                         timeout=10)
        self.assert_code(grpc.StatusCode.UNAUTHENTICATED, self.snaps.ListSnapshots,
                         snapshots_pb2.ListSnapshotsRequest(), timeout=10)
        c = self.claim()
        self.release(c)
        self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.snapshot, c)

    # A kill -9 of the server in the middle of a snapshot leaves no .partial folder and no
    # record after the restart, and the sandbox (frozen for the copy) runs again; files
    # without a record are removed and a record without files is dropped at the start; a
    # whole snapshot survives the restart.
    def test_zz_kill_9_mid_snapshot_leaves_a_whole_snapshot_or_none(self):
        cls = type(self)
        kept_claim = self.claim()
        c = self.claim()
        kept = self.snapshot(kept_claim, name="kept")
        gone = self.snapshot(kept_claim, name="files-lost")
        code, out = self.sh(c, f"dd if=/dev/zero of={WS}/big bs=1M count=48 2>/dev/null && "
                               f"echo OK")
        self.assertEqual(code, 0, out)
        snapdir = os.path.join(self.dir, "data", "snapshots")
        from sbx.v1 import snapshots_pb2
        future = self.snaps.CreateSnapshot.future(
            snapshots_pb2.CreateSnapshotRequest(claim_id=c.claim_id), metadata=A, timeout=60)
        sbx_e2e.wait_for(lambda: any(n.endswith(".partial") for n in os.listdir(snapdir)), 30,
                         "a snapshot in progress", interval=0.001)
        cls.server.stop(signal.SIGKILL)
        try:
            future.result()
        except grpc.RpcError:
            pass
        partial = [n for n in os.listdir(snapdir) if n.endswith(".partial")]
        # A folder without a record (as if the server died after the rename), and a record
        # whose files are gone.
        os.makedirs(os.path.join(snapdir, "sn-norecord0000000", "workspace"))
        shutil.rmtree(os.path.join(snapdir, gone.id))
        cls.start_server(None)
        names = sorted(os.listdir(snapdir))
        self.assertEqual([n for n in names if n.endswith(".partial")], [], (partial, names))
        self.assertNotIn("sn-norecord0000000", names)
        self.assertNotIn(gone.id, names)
        self.assertIn(kept.id, names)
        listed = [x.id for x in self.list_snapshots().snapshots]
        self.assertIn(kept.id, listed)
        self.assertNotIn(gone.id, listed)
        self.assertEqual(sorted(listed), names)  # every record has its files, and back
        self.assertEqual(self.get_snapshot(kept.id).size_bytes, kept.size_bytes)
        # The sandbox frozen for the interrupted copy runs again, with its claim.
        code, out = self.sh(c, "echo alive", timeout=30)
        self.assertEqual((code, out), (0, "alive\n"))
        self.delete_snapshot(kept.id)
        self.release(c)
        self.release(kept_claim)


if __name__ == "__main__":
    sbx_e2e.run(Snapshots, __doc__, ("SERVER", "PROTO"),
                root_reason="snapshots of image sandboxes need a root server (idmapped layers)")
