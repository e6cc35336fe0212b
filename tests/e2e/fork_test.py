#!/usr/bin/python3
"""Fork (issue 37, slice 3) and templates of a snapshot (slice 4) on the local runtime, with
a real sbx-server as root, real bubblewrap, a real RocksDB and an image built here offline
(busybox-static): forks of a snapshot and of a live claim start at its files and write only
their own; a retry answers the same forks without a new snapshot; tenants (another tenant
cannot fork, claim the fork pool by name or delete); a hostile tree (a link to a host path,
a FIFO) forked and then read through the file RPCs; deleting a snapshot with claimed forks;
an admin's template of a snapshot and its checks; forks after a kill -9 of the server.

Usage: fork_test.py PATH_TO_SBX_SERVER PROTO_DIR PATH_TO_SBX_CLI
"""

import os
import re
import signal
import subprocess
import time
import urllib.request

import grpc

import sbx_e2e
from sbx_e2e import A, B, WS

SERVER = PROTO = CLI = None

CONFIG = sbx_e2e.pool_config(sbx_e2e.IMG_POOL, sbx_e2e.HOST_POOL)

ADMIN = sbx_e2e.bearer("token-admin")


class Fork(sbx_e2e.ServerTestCase):
    TOKENS = "token-a tenant-a\ntoken-b tenant-b\ntoken-admin ops admin\n"
    MD = A

    @classmethod
    def setUpClass(cls):
        cls.make_workdir("sbx-fork-", 0o755)
        cls.plain_ref = sbx_e2e.busybox_image(os.path.join(cls.dir, "images", "plain"))
        cls.config = cls.write_file("config.yaml", CONFIG.replace("{plain}", cls.plain_ref))
        cls.host_dir = os.path.join(cls.dir, "host-dir")
        os.makedirs(cls.host_dir)
        cls.write_file("host-dir/canary", "CANARY\n")
        cls.start_server(cls.config, [
            "--image_cache_bytes=1000000000", f"--image_import_dir={cls.dir}/images"])

    # --- helpers ---

    def fork(self, count, snapshot_id="", claim_id="", md=A, batch_id="", env=None,
             labels=None):
        from sbx.v1 import snapshots_pb2, types_pb2
        req = snapshots_pb2.ForkRequest(snapshot_id=snapshot_id, claim_id=claim_id, count=count,
                                        batch_id=batch_id, labels=labels or {})
        if env:
            req.config.CopyFrom(types_pb2.SandboxConfig(env=env))
        return self.snaps.Fork(req, metadata=md, timeout=180)

    def download(self, claim_id, path, md=A):
        from sbx.v1 import sandboxes_pb2
        return b"".join(c.data for c in self.sandboxes.DownloadFile(
            sandboxes_pb2.DownloadRequest(claim_id=claim_id, path=path), metadata=md,
            timeout=30))

    def metric(self, name, **labels):
        """The value of series `name` with exactly `labels` (0 when absent)."""
        self.server.log.flush()
        with open(os.path.join(self.dir, "server.log")) as f:
            port = re.findall(r"metrics: serving /metrics on port (\d+)", f.read())[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
            if m and m.group(1) == name and \
                    dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")) == labels:
                return float(m.group(3))
        return 0.0

    def prepared(self, pool="img"):
        """A claim with files in its workspace and its root, and a snapshot of it."""
        c = self.claim(pool)
        root = "/opt/app" if pool == "img" else f"{WS}/app"
        extra = " && rm /bin/vi" if pool == "img" else ""
        code, out = self.sh(c.claim_id, f"echo prepared > {WS}/state && mkdir -p {root} && "
                                        f"echo app > {root}/f{extra} && echo OK")
        self.assertEqual((code, out), (0, "OK\n"))
        return c, self.snapshot(c.claim_id)

    # --- tests ---

    def test_forks_start_at_the_snapshot_and_write_only_their_own(self):
        c, snap = self.prepared()
        forks, children = [], []
        try:
            calls, claims = (self.metric("sbx_snapshot_forks_total", result="ok"),
                             self.metric("sbx_snapshot_forked_claims_total"))
            resp = self.fork(3, snapshot_id=snap.id, env={"LATE": "bound"},
                             labels={"episode": "7"})
            self.assertEqual(self.metric("sbx_snapshot_forks_total", result="ok"), calls + 1)
            self.assertEqual(self.metric("sbx_snapshot_forked_claims_total"), claims + 3)
            forks = [f.claim_id for f in resp.claims]
            self.assertEqual(resp.snapshot_id, snap.id)
            self.assertEqual(len(forks), 3)
            self.assertEqual(len({f.sandbox.id for f in resp.claims} | {c.sandbox.id}), 4)
            for f in resp.claims:
                self.assertTrue(f.pool.endswith("fork-" + snap.id[3:]), f.pool)
                self.assertEqual(dict(f.labels), {"episode": "7"})
                code, out = self.sh(f.claim_id, f"cat {WS}/state /opt/app/f; "
                                                f"test -e /bin/vi || echo no-vi; echo LATE=$LATE")
                self.assertEqual((code, out), (0, "prepared\napp\nno-vi\nLATE=bound\n"))
            # Each writes only its own: nothing crosses to the other forks or the source.
            code, out = self.sh(forks[0], f"echo mine > {WS}/state && echo x > /opt/app/f && "
                                          f"echo new > /new && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            for other in (forks[1], c.claim_id):
                code, out = self.sh(other, f"cat {WS}/state /opt/app/f; "
                                           f"test -e /new || echo no-new")
                self.assertEqual((code, out), (0, "prepared\napp\nno-new\n"))
            # A snapshot of a fork names the snapshot the fork started from.
            child = self.snapshot(forks[0])
            children.append(child.id)
            self.assertEqual(child.parent_snapshot_id, snap.id)
            grandchild = self.fork(1, snapshot_id=child.id).claims[0].claim_id
            forks.append(grandchild)
            self.assertEqual(self.sh(grandchild, f"cat {WS}/state /opt/app/f; "
                                                 f"test -e /new && echo new"),
                             (0, "mine\nx\nnew\n"))
            self.assertEqual(snap.parent_snapshot_id, "")
            # The forks' files are their own user's.
            code, out = self.sh(forks[1], f"test $(stat -c %u {WS}/state) = $(id -u) && "
                                          f"test $(stat -c %u /opt/app/f) = $(id -u) && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
        finally:
            for f in forks:
                self.release(f)
            self.release(c.claim_id)
        for child in children:
            self.delete_snapshot(child)
        self.delete_snapshot(snap.id)

    def used_kib(self, claim_id, path):
        """What `df` shows used on the file system at `path` in the sandbox: for an overlay,
        its upper layer (the sandbox's own)."""
        code, out = self.sh(claim_id, f"df -k {path} | tail -n 1")
        self.assertEqual(code, 0, out)
        return int(out.split()[2])

    def snapshot_folder(self, snap_id):
        return os.path.join(self.dir, "data", "snapshots", snap_id)

    def test_forks_share_the_snapshots_files_and_snapshots_of_forks_stand_alone(self):
        # 8 MiB in the root's layer and 8 MiB in the workspace, snapshotted and forked: each
        # fork's own layers hold none of it (before, every fork copied all 16 MiB into its
        # own tmpfs); what a fork writes is its own (copied up), a sibling still reads the
        # snapshot's bytes.
        c = self.claim()
        forks, snaps = [], []
        try:
            code, out = self.sh(c.claim_id, f"mkdir -p /opt/data && "
                                            f"dd if=/dev/urandom of=/opt/data/big bs=1M count=8 2>/dev/null && "
                                            f"dd if=/dev/urandom of={WS}/big bs=1M count=8 2>/dev/null && "
                                            f"echo keep > /opt/data/keep && echo gone > /opt/data/gone && "
                                            f"rm -r /etc && md5sum /opt/data/big {WS}/big", timeout=120)
            self.assertEqual(code, 0, out)
            sums = out
            snap = self.snapshot(c.claim_id)
            snaps.append(snap.id)
            self.assertGreaterEqual(snap.size_bytes, 16 << 20)
            resp = self.fork(2, snapshot_id=snap.id)
            forks = [f.claim_id for f in resp.claims]
            for f in forks:
                self.assertEqual(self.sh(f, f"md5sum /opt/data/big {WS}/big"), (0, sums))
                self.assertLess(self.used_kib(f, "/"), 2048)
                self.assertLess(self.used_kib(f, WS), 2048)
            code, out = self.sh(forks[0], f"echo changed >> /opt/data/big && echo small > {WS}/small && "
                                          f"rm /opt/data/gone && mkdir /etc && echo mine > /etc/mine && "
                                          f"echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            self.assertGreaterEqual(self.used_kib(forks[0], "/"), 8192)  # copied up: its own
            self.assertEqual(self.sh(forks[1], f"md5sum /opt/data/big {WS}/big"), (0, sums))
            # A snapshot of a fork: only the fork's own writes are new bytes (the rest is
            # the parent's files, shared on disk), and it stands alone: the parent deleted,
            # a fork of it shows everything, with no trace of what was deleted.
            child = self.snapshot(forks[0])
            snaps.append(child.id)
            self.assertEqual(child.parent_snapshot_id, snap.id)
            self.assertLess(child.size_bytes, 9 << 20)  # the copied-up 8 MiB file, and little more
            for f in forks:
                self.release(f)
            forks = []
            self.delete_snapshot(snap.id)
            snaps.remove(snap.id)
            g = self.fork(1, snapshot_id=child.id).claims[0].claim_id
            forks.append(g)
            code, out = self.sh(g, f"ls -a /opt/data /etc; cat /etc/mine /opt/data/keep {WS}/small; "
                                   f"tail -c 8 /opt/data/big; md5sum {WS}/big; "
                                   f"test -e /opt/data/gone || echo no-gone")
            self.assertEqual(code, 0, out)
            self.assertEqual(out, "/etc:\n.\n..\nmine\n\n/opt/data:\n.\n..\nbig\nkeep\n"
                                  "mine\nkeep\nsmall\nchanged\n" + sums.splitlines()[1] +
                                  "\nno-gone\n")
            # Deleting a snapshot that a running sandbox shares (the source, reset to it)
            # keeps its files until that sandbox ends.
            self.release(g)
            forks = []
            code, out = self.sh(c.claim_id, "echo after > /opt/data/keep && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            self.reset(c.claim_id, child.id)
            self.delete_snapshot(child.id)
            snaps.remove(child.id)
            self.assertTrue(os.path.isdir(self.snapshot_folder(child.id)))
            self.assertEqual(self.sh(c.claim_id, "cat /opt/data/keep /etc/mine"),
                             (0, "keep\nmine\n"))
        finally:
            for f in forks:
                self.release(f)
            self.release(c.claim_id)
            for s in snaps:
                self.delete_snapshot(s)
        # Its last sandbox gone, the deleted snapshot's files go too.
        deadline = time.monotonic() + 30
        while os.path.isdir(self.snapshot_folder(child.id)) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertFalse(os.path.isdir(self.snapshot_folder(child.id)))

    def test_a_fork_of_a_live_claim_snapshots_it_and_a_retry_answers_the_same_forks(self):
        c = self.claim()
        forks = []
        try:
            code, out = self.sh(c.claim_id, f"echo live > {WS}/state && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            before = {s.id for s in self.list_snapshots().snapshots}
            resp = self.fork(2, claim_id=c.claim_id, batch_id="episode-1")
            forks = [f.claim_id for f in resp.claims]
            self.assertEqual(forks, ["episode-1#0", "episode-1#1"])
            self.assertFalse(resp.replayed)
            made = {s.id for s in self.list_snapshots().snapshots} - before
            self.assertEqual(made, {resp.snapshot_id})
            for f in forks:
                self.assertEqual(self.sh(f, f"cat {WS}/state"), (0, "live\n"))
            # The source runs on, untouched.
            self.assertEqual(self.sh(c.claim_id, f"cat {WS}/state"), (0, "live\n"))
            again = self.fork(2, claim_id=c.claim_id, batch_id="episode-1")
            self.assertTrue(again.replayed)
            self.assertEqual([f.claim_id for f in again.claims], forks)
            self.assertEqual(again.snapshot_id, resp.snapshot_id)
            self.assertEqual({s.id for s in self.list_snapshots().snapshots} - before, made)
            # A batch id of ordinary claims is not taken for forks.
            from sbx.v1 import claims_pb2
            self.claims.ClaimBatch(claims_pb2.ClaimBatchRequest(pool="img", count=1,
                                                                batch_id="plain-1"),
                                   metadata=A, timeout=60)
            self.assert_code(grpc.StatusCode.ALREADY_EXISTS, self.fork, 1,
                             snapshot_id=resp.snapshot_id, batch_id="plain-1")
            self.release("plain-1#0")
        finally:
            for f in forks:
                self.release(f)
            self.release(c.claim_id)
        self.delete_snapshot(resp.snapshot_id)

    def test_a_host_root_sandbox_forks_its_workspace(self):
        c, snap = self.prepared(pool="host")
        resp = self.fork(1, snapshot_id=snap.id)
        f = resp.claims[0].claim_id
        try:
            self.assertEqual(self.sh(f, f"cat {WS}/state {WS}/app/f"), (0, "prepared\napp\n"))
        finally:
            self.release(f)
            self.release(c.claim_id)
        self.delete_snapshot(snap.id)

    # Attack: tenant B reaches A's snapshot through Fork, through the fork pool's name (the
    # pool sits in the namespace both may claim from), or by deleting it.
    def test_another_tenant_cannot_fork_claim_the_fork_pool_or_delete(self):
        c, snap = self.prepared()
        resp = self.fork(1, snapshot_id=snap.id)
        mine = resp.claims[0]
        try:
            pool = mine.pool
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.fork, 1, snapshot_id=snap.id, md=B)
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.fork, 1, claim_id=c.claim_id, md=B)
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.delete_snapshot, snap.id, md=B)
            from sbx.v1 import claims_pb2
            for md in (B, A):
                self.assert_code(grpc.StatusCode.NOT_FOUND, self.claims.Claim,
                                 claims_pb2.ClaimRequest(pool=pool,
                                                         empty_pool_policy=2),
                                 metadata=md, timeout=60)
                self.assert_code(grpc.StatusCode.NOT_FOUND, self.claims.ClaimBatch,
                                 claims_pb2.ClaimBatchRequest(pool=pool, count=1,
                                                              empty_pool_policy=2),
                                 metadata=md, timeout=60)
            # B's retry of A's batch id is B's own (nothing of A's is answered).
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.fork, 1, snapshot_id=snap.id,
                             batch_id=mine.batch_id, md=B)
            # Still A's to fork after all that.
            again = self.fork(1, snapshot_id=snap.id)
            self.release(again.claims[0].claim_id)
        finally:
            self.release(mine.claim_id)
            self.release(c.claim_id)
        self.delete_snapshot(snap.id)

    # Attack: a sandbox plants a link to a host path and a FIFO, is snapshotted and forked;
    # the fork's files are then read through the file RPCs, which must neither follow the
    # link out of the sandbox's root nor hang on the FIFO.
    def test_a_hostile_tree_forked_then_read_through_the_file_rpcs(self):
        c = self.claim()
        forks = []
        try:
            canary = os.path.join(self.host_dir, "canary")
            code, out = self.sh(c.claim_id, f"ln -s {canary} {WS}/link && "
                                            f"ln -s {canary} /etc/link && "
                                            f"mkfifo {WS}/fifo && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            snap = self.snapshot(c.claim_id)
            resp = self.fork(1, snapshot_id=snap.id)
            forks = [f.claim_id for f in resp.claims]
            f = forks[0]
            code, out = self.sh(f, f"readlink {WS}/link; test -p {WS}/fifo && echo fifo")
            self.assertEqual((code, out), (0, f"{canary}\nfifo\n"))
            for path in (f"{WS}/link", "link", "/etc/link"):
                try:
                    data = self.download(f, path)
                except grpc.RpcError as e:
                    self.assertIn(e.code(), (grpc.StatusCode.NOT_FOUND,
                                             grpc.StatusCode.FAILED_PRECONDITION,
                                             grpc.StatusCode.INVALID_ARGUMENT), e.details())
                    continue
                self.assertNotIn(b"CANARY", data, path)
            try:
                data = self.download(f, f"{WS}/fifo")
                self.assertEqual(data, b"")
            except grpc.RpcError as e:
                self.assertNotEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED, e.details())
            with open(canary) as fh:
                self.assertEqual(fh.read(), "CANARY\n")
        finally:
            for f in forks:
                self.release(f)
            self.release(c.claim_id)
        self.delete_snapshot(snap.id)

    def test_a_snapshot_with_claimed_forks_is_kept_until_they_are_released(self):
        c, snap = self.prepared()
        self.release(c.claim_id)
        resp = self.fork(2, snapshot_id=snap.id)
        detail = self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.delete_snapshot, snap.id)
        self.assertIn("release its forks", detail)
        self.assertEqual(self.sh(resp.claims[0].claim_id, f"cat {WS}/state"), (0, "prepared\n"))
        for f in resp.claims:
            self.release(f.claim_id)
        self.delete_snapshot(snap.id)
        self.assert_code(grpc.StatusCode.NOT_FOUND, self.fork, 1, snapshot_id=snap.id)
        from sbx.v1 import admin_pb2
        pools = [p.name for p in self.admin.ListPools(admin_pb2.ListPoolsRequest(),
                                                      metadata=ADMIN, timeout=10).pools]
        self.assertNotIn(resp.claims[0].pool, pools)

    def test_an_admin_template_of_a_snapshot_is_checked_and_keeps_it(self):
        from sbx.v1 import admin_pb2
        c, snap = self.prepared()
        self.release(c.claim_id)

        def put(name, image, snapshot):
            t = admin_pb2.Template(name=name, runtime="local",
                                   local=admin_pb2.LocalSpec(image=image, snapshot=snapshot))
            return self.admin.PutTemplate(admin_pb2.PutTemplateRequest(template=t),
                                          metadata=ADMIN, timeout=30)

        self.assert_code(grpc.StatusCode.NOT_FOUND, put, "golden-x", self.plain_ref,
                         "sn-0000000000000000")
        detail = self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, put, "golden-x", "",
                                  snap.id)
        self.assertIn("own image", detail)
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, put, "golden-x", self.plain_ref,
                         "../../etc")
        put("golden", self.plain_ref, snap.id)
        self.admin.PutPool(admin_pb2.PutPoolRequest(pool=admin_pb2.Pool(
            name="golden", template="golden", min_warm=1, max_warm=2,
            empty_pool_policy=1)), metadata=ADMIN, timeout=30)
        g = self.claim("golden")
        g2 = None
        try:
            self.assertEqual(self.sh(g.claim_id, f"cat {WS}/state /opt/app/f"),
                             (0, "prepared\napp\n"))
            # The pool refills at the snapshot's state: the next warm member starts there too.
            sbx_e2e.wait_for(lambda: self.admin.GetPool(admin_pb2.GetPoolRequest(name="golden"),
                                                        metadata=ADMIN,
                                                        timeout=10).pool.status.warm >= 1,
                             60, "the golden pool to refill")
            # Its status names the snapshot its sandboxes start at.
            self.assertEqual(self.admin.GetPool(admin_pb2.GetPoolRequest(name="golden"),
                                                metadata=ADMIN, timeout=10).pool.status.snapshot,
                             snap.id)
            g2 = self.claim("golden")
            self.assertEqual(g2.launch_type, 1)  # WARM
            self.assertEqual(self.sh(g2.claim_id, f"cat {WS}/state"), (0, "prepared\n"))
            detail = self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.delete_snapshot, snap.id)
            self.assertIn('template "golden"', detail)
        finally:
            self.release(g.claim_id)
            if g2 is not None:
                self.release(g2.claim_id)
        self.admin.DeletePool(admin_pb2.DeletePoolRequest(name="golden"), metadata=ADMIN,
                              timeout=30)
        self.admin.DeleteTemplate(admin_pb2.DeleteTemplateRequest(name="golden"), metadata=ADMIN,
                                  timeout=30)
        self.delete_snapshot(snap.id)

    def test_cli_fork(self):
        c, snap = self.prepared()
        env = dict(os.environ, SBX_TOKEN="token-a")
        try:
            r = subprocess.run([CLI, f"--server={self.server.target}", "fork", snap.id, "-n", "2"],
                               capture_output=True, text=True, timeout=120, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            ids = [line.split()[0] for line in r.stdout.splitlines() if "#" in line]
            self.assertEqual(len(ids), 2, r.stdout)
            for f in ids:
                self.assertEqual(self.sh(f, f"cat {WS}/state"), (0, "prepared\n"))
                self.release(f)
            r = subprocess.run([CLI, f"--server={self.server.target}", "fork", "sn-nope"],
                               capture_output=True, text=True, timeout=60, env=env)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("sn-nope", r.stderr)
        finally:
            self.release(c.claim_id)
        self.delete_snapshot(snap.id)

    # Forks are claims like any other: durable before the answer, adopted with their
    # sandboxes after a kill -9, and a retry of the Fork still answers them.
    def test_zz_forks_survive_a_kill_9_of_the_server(self):
        c, snap = self.prepared()
        self.release(c.claim_id)
        resp = self.fork(2, snapshot_id=snap.id, batch_id="durable")
        self.server.stop(signal.SIGKILL)
        type(self).start_server(None)
        for f in resp.claims:
            got = self.get_claim(f.claim_id)
            self.assertEqual(got.sandbox.id, f.sandbox.id)
            self.assertEqual(self.sh(f.claim_id, f"cat {WS}/state"), (0, "prepared\n"))
        again = self.fork(2, snapshot_id=snap.id, batch_id="durable")
        self.assertTrue(again.replayed)
        for f in resp.claims:
            self.release(f.claim_id)
        self.delete_snapshot(snap.id)


if __name__ == "__main__":
    sbx_e2e.run(Fork, __doc__, ("SERVER", "PROTO", "CLI"),
                root_reason="forks of image sandboxes need a root server (idmapped layers)")
