#!/usr/bin/python3
"""Sandboxes of OCI images on the local runtime (issue 34), with a real sbx-server (as root,
and as an unprivileged user where the machine allows it), real bubblewrap and images built
here offline (busybox-static). What a claim of an image pool sees, what the image's config
does, and the image as hostile input: links at the runtime's mount points, a link on the
way to a template mount, uid 0 in the image against the host. (The whole attack suite of
isolation_test.py also runs on image sandboxes: AsRootInImage, AsNonRootInImage.)

Usage: image_sandbox_test.py PATH_TO_SBX_SERVER PROTO_DIR PATH_TO_SBX_CLI
"""

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

import sbx_e2e

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "images"))
import test_images  # noqa: E402

SERVER = PROTO = CLI = None
NOBODY = "nobody"

CONFIG = """
templates:
  - name: img
    runtime: local
    local:
      image: "{plain}"
      env:
        FROM_TEMPLATE: "yes"
  - name: named
    runtime: local
    local:
      image: "{named}"
  - name: small
    runtime: local
    local:
      image: "{plain}"
      layer_size_bytes: 4194304
  - name: hostile
    runtime: local
    local:
      image: "{hostile}"
  - name: badmount
    runtime: local
    local:
      image: "{badmount}"
      mounts:
        - source: "{shared_ro}"
          target: /data/x
  - name: hostmounts
    runtime: local
    local:
      image: "{plain}"
      mounts:
        - source: "{shared_ro}"
          target: /mnt/ro
        - source: "{shared_rw}"
          target: /mnt/rw
          read_only: false
pools:
{pools}
"""
POOL = """  - name: {name}
    template: {name}
    min_warm: {warm}
    max_warm: 4
    empty_pool_policy: wait
    default_wait: 30s
    default_ttl: 1h
    max_ttl: 24h
"""


def stubs(channel):
    from sbx.v1 import (admin_pb2_grpc, claims_pb2_grpc, images_pb2_grpc,
                        sandboxes_pb2_grpc)
    return (claims_pb2_grpc.ClaimServiceStub(channel),
            sandboxes_pb2_grpc.SandboxServiceStub(channel),
            admin_pb2_grpc.AdminServiceStub(channel), images_pb2_grpc.ImageServiceStub(channel))


def can_run_as(user):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv to start the server as another user"
    probe = subprocess.run(["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups",
                            "bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        return f"bwrap cannot make user namespaces as {user}: {probe.stderr.decode()}"
    return None


class ImageSandboxes:
    run_as = None

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-img-", dir="/tmp")
        os.chmod(cls.dir, 0o755)
        images = os.path.join(cls.dir, "images")
        cls.shared_ro = os.path.join(cls.dir, "shared-ro")
        cls.shared_rw = os.path.join(cls.dir, "shared-rw")
        for d in (cls.shared_ro, cls.shared_rw):
            os.makedirs(d)
        with open(os.path.join(cls.shared_ro, "canary"), "w") as f:
            f.write("host data\n")
        # Root-owned and closed to others: neither a host uid of a sandbox nor nobody
        # may write it, whatever uid the image names.
        os.chmod(cls.shared_rw, 0o755)
        cls.plain_ref = test_images.busybox_image(
            os.path.join(images, "plain"),
            config={"Env": ["PATH=/bin", "GREETING=from-image"], "WorkingDir": "/app"})
        cls.named_ref = test_images.busybox_image(
            os.path.join(images, "named"), config={"User": "user", "WorkingDir": "/home/user"},
            extra=[{"name": "home", "type": "dir"},
                   {"name": "home/user", "type": "dir", "mode": 0o700}])
        # Links where the runtime mounts: bwrap must not follow them out of the root.
        cls.hostile_ref = test_images.busybox_image(
            os.path.join(images, "hostile"),
            extra=[{"name": "proc", "type": "symlink", "link": "/etc"},
                   {"name": "dev", "type": "symlink", "link": "../../../../../../tmp"},
                   {"name": "run", "type": "symlink", "link": "../" * 8 + cls.dir.lstrip("/")},
                   {"name": "tmp", "type": "symlink", "link": "/"}])
        cls.badmount_ref = test_images.busybox_image(
            os.path.join(images, "badmount"),
            extra=[{"name": "data", "type": "symlink", "link": "../" * 8 + "etc"}])
        pools = "".join(POOL.format(name=n, warm=w) for n, w in
                        (("img", 2), ("named", 1), ("small", 1), ("hostile", 1), ("badmount", 1),
                         ("hostmounts", 1)))
        cls.config = os.path.join(cls.dir, "config.yaml")
        with open(cls.config, "w") as f:
            f.write(CONFIG.format(plain=cls.plain_ref, named=cls.named_ref,
                                  hostile=cls.hostile_ref, badmount=cls.badmount_ref,
                                  shared_ro=cls.shared_ro, shared_rw=cls.shared_rw, pools=pools))
        if cls.run_as is not None:
            sbx_e2e.chown_tree(cls.dir, cls.run_as, skip=(cls.shared_rw,))
        cls.start()

    @classmethod
    def start(cls):
        cls.server = sbx_e2e.Server(
            SERVER, cls.dir, cls.config, prefix=sbx_e2e.setpriv_prefix(cls.run_as),
            extra=["--image_cache_bytes=1000000000", f"--image_import_dir={cls.dir}/images"])
        cls.claims, cls.sandboxes, cls.admin, cls.images = stubs(cls.server.channel)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def claim(self, pool):
        from sbx.v1 import claims_pb2
        return self.claims.Claim(claims_pb2.ClaimRequest(pool=pool), timeout=60).claim

    def release(self, claim):
        from sbx.v1 import claims_pb2
        self.claims.Release(claims_pb2.ReleaseRequest(claim_id=claim.claim_id), timeout=30)

    def sh(self, claim, script, timeout=60):
        return sbx_e2e.sh(self.sandboxes, claim.claim_id, script, timeout=timeout)

    def pool_status(self, name):
        from sbx.v1 import admin_pb2
        return self.admin.GetPool(admin_pb2.GetPoolRequest(name=name), timeout=10).pool.status

    def test_a_claim_runs_in_its_image_with_the_images_config(self):
        c = self.claim("img")
        try:
            code, out = self.sh(c, "cat /etc/os-release; id -u; echo g=$GREETING t=$FROM_TEMPLATE "
                                   "h=$HOME; echo cwd=$(pwd); test -e /usr/bin/python3 "
                                   "|| echo NO_HOST_USR")
            self.assertEqual(code, 0, out)
            self.assertIn("ID=sbx-test", out)
            self.assertIn("\n0\n", out)  # the image names no User: uid 0 in the sandbox
            self.assertIn("g=from-image t=yes h=/root", out)
            self.assertIn("cwd=/app", out)  # commands start in its WorkingDir (made)
            self.assertIn("NO_HOST_USR", out)  # the host's /usr is not there
        finally:
            self.release(c)

    def test_writes_land_in_the_sandboxs_own_layer(self):
        a, b = self.claim("img"), self.claim("img")
        try:
            code, out = self.sh(a, "echo mine > /etc/os-release && echo new > /bin/new && "
                                   "rm /bin/ls && cat /etc/os-release && echo DONE")
            self.assertEqual(code, 0, out)
            self.assertIn("mine", out)
            code, out = self.sh(b, "cat /etc/os-release; test -e /bin/new || echo NO_NEW; "
                                   "test -e /bin/ls && echo HAS_LS")
            self.assertIn("ID=sbx-test", out)
            self.assertIn("NO_NEW", out)
            self.assertIn("HAS_LS", out)
            # The cache's copy is untouched, and so is the host.
            from sbx.v1 import images_pb2
            listed = self.images.ListImages(images_pb2.ListImagesRequest(), timeout=10)
            roots = [os.path.join(self.dir, "data", "images", "images",
                                  i.digest.split(":")[1], "rootfs") for i in listed.images]
            self.assertTrue(roots)
            for root in roots:
                with open(os.path.join(root, "etc", "os-release")) as f:
                    self.assertIn("ID=sbx-test", f.read())
            with open("/etc/os-release") as f:
                self.assertNotIn("mine", f.read())
        finally:
            self.release(a)
            self.release(b)

    def test_the_layer_is_bounded_and_not_on_the_data_disk(self):
        c = self.claim("small")
        try:
            # 1 MiB fits the template's 4 MiB layer; 8 MiB more does not (ENOSPC, in the
            # sandbox only); what was written is in memory, nowhere under the data dir.
            code, out = self.sh(c, "dd if=/dev/zero of=/etc/sbx-layer-marker bs=1024 count=1024 "
                                   "2>&1 && echo FIT; dd if=/dev/zero of=/etc/sbx-big bs=1024 "
                                   "count=8192 2>&1; echo rc=$?")
            self.assertIn("FIT", out)
            self.assertIn("No space left on device", out)
            self.assertNotIn("rc=0", out)
            found = [os.path.join(d, f) for d, _, files in os.walk(self.dir)
                     for f in files if f in ("sbx-layer-marker", "sbx-big")]
            self.assertEqual(found, [])
        finally:
            self.release(c)

    def test_the_images_user_by_name(self):
        c = self.claim("named")
        try:
            code, out = self.sh(c, "id -u; id -g; echo h=$HOME; echo cwd=$(pwd); "
                                   "touch /etc/by-user && echo WROTE")
            self.assertEqual(code, 0, out)
            self.assertEqual(out.split()[:2], ["1000", "1000"], out)
            self.assertIn("h=/home/user", out)
            self.assertIn("cwd=/home/user", out)
            # Every file of the image belongs to its User: it may change its own root.
            self.assertIn("WROTE", out)
        finally:
            self.release(c)

    def test_links_at_the_runtimes_mount_points_are_not_followed(self):
        c = self.claim("hostile")
        try:
            code, out = self.sh(c, "grep -c ^Pid: /proc/self/status; ls /dev/null && echo DEV; "
                                   "ls -d /run/sbx/workspace && echo RUN; touch /tmp/t && "
                                   "echo TMP; ls /run")
            self.assertEqual(code, 0, out)
            for marker in ("DEV", "RUN", "TMP"):
                self.assertIn(marker, out)
            self.assertTrue(out.startswith("1\n"), f"/proc is not a procfs: {out}")
            # Nothing was mounted on or made in the host folders the links pointed at.
            self.assertFalse(os.path.exists(os.path.join(self.dir, "sbx")))
            with open("/proc/self/mountinfo") as f:
                self.assertNotIn(self.dir + "/", "".join(
                    line for line in f if " /tmp " in line or self.dir in line.split()[4]))
        finally:
            self.release(c)

    def test_a_link_on_the_way_to_a_mount_target_refuses_the_start(self):
        deadline = time.time() + 30
        status = self.pool_status("badmount")
        while not status.last_error and time.time() < deadline:
            time.sleep(0.2)
            status = self.pool_status("badmount")
        self.assertIn("symbolic link", status.last_error)
        self.assertIn("/data", status.last_error)
        self.assertEqual(status.warm, 0)
        with open(os.path.join(self.shared_ro, "canary")) as f:
            self.assertEqual(f.read(), "host data\n")
        self.assertFalse(os.path.exists("/etc/x"))

    def test_uid_0_of_the_image_is_no_host_privilege(self):
        c = self.claim("hostmounts")
        try:
            code, out = self.sh(c, "id -u; echo x > /mnt/ro/canary && echo WROTE_RO; "
                                   "echo x > /mnt/rw/new && echo WROTE_RW; "
                                   "chown 0 /mnt/rw && echo CHOWNED; true")
            self.assertTrue(out.startswith("0\n"), out)
            for marker in ("WROTE_RO", "WROTE_RW", "CHOWNED"):
                self.assertNotIn(marker, out)
            with open(os.path.join(self.shared_ro, "canary")) as f:
                self.assertEqual(f.read(), "host data\n")
            self.assertEqual(os.listdir(self.shared_rw), [])
        finally:
            self.release(c)

    def test_a_restart_keeps_image_sandboxes_and_their_images_held(self):
        from sbx.v1 import images_pb2
        c = self.claim("img")
        self.sh(c, "echo kept > /etc/mark")
        type(self).server.stop(signal.SIGTERM)
        type(self).start()
        code, out = self.sh(c, "cat /etc/mark")
        self.assertEqual((code, out.strip()), (0, "kept"))
        listed = self.images.ListImages(images_pb2.ListImagesRequest(), timeout=10)
        plain = [i for i in listed.images if i.ref == self.plain_ref]
        self.assertEqual(len(plain), 1)
        with self.assertRaises(grpc.RpcError) as e:
            self.images.RemoveImage(images_pb2.RemoveImageRequest(digest=plain[0].digest),
                                    timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        folder = os.path.join(self.dir, "sb", c.sandbox.id)
        self.assertTrue(os.path.isdir(folder))
        self.release(c)
        deadline = time.time() + 20
        while os.path.exists(folder) and time.time() < deadline:
            time.sleep(0.1)
        self.assertFalse(os.path.exists(folder), "the sandbox's host folder stayed")


    def test_a_pool_shows_its_image_being_pulled_then_cached(self):
        from sbx.v1 import admin_pb2
        # A large image (64 MiB that do not compress), so that its pull lasts long enough to
        # be seen; observed, not timed.
        blob = os.path.join(self.dir, "blob")
        with open(blob, "wb") as f:
            f.write(os.urandom(64 << 20))
        ref = test_images.busybox_image(
            os.path.join(self.dir, "images", "large"),
            extra=[{"name": "data", "type": "dir"},
                   {"name": "data/blob", "type": "file", "from": blob}])
        os.remove(blob)
        if self.run_as is not None:
            pw = pwd.getpwnam(self.run_as)
            for root, dirs, files in os.walk(os.path.join(self.dir, "images", "large")):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)
        self.admin.PutTemplate(admin_pb2.PutTemplateRequest(template=admin_pb2.Template(
            name="large", runtime="local", local=admin_pb2.LocalSpec(image=ref))), timeout=30)
        self.admin.PutPool(admin_pb2.PutPoolRequest(pool=admin_pb2.Pool(
            name="large", template="large", min_warm=1, max_warm=1)), timeout=30)
        seen = []
        deadline = time.time() + 120
        status = self.pool_status("large")
        while (status.warm < 1 or status.image_state != "cached") and time.time() < deadline:
            if not seen or seen[-1] != status.image_state:
                seen.append(status.image_state)
            time.sleep(0.02)
            status = self.pool_status("large")
        seen.append(status.image_state)
        self.assertEqual(status.image, ref)
        self.assertIn("pulling", seen)
        self.assertEqual(seen[-1], "cached", seen)
        self.assertEqual(status.warm, 1)
        out = subprocess.run([CLI, "--server", self.server.target, "pools", "get", "large"],
                             capture_output=True, text=True, timeout=30)
        self.assertIn("image_state", out.stdout, out.stderr)
        self.assertIn("cached", out.stdout)

class AsRoot(ImageSandboxes, unittest.TestCase):
    pass


class AsNonRoot(ImageSandboxes, unittest.TestCase):
    run_as = NOBODY

    @classmethod
    def setUpClass(cls):
        why = can_run_as(NOBODY)
        if why is not None:
            raise unittest.SkipTest(why)
        super().setUpClass()


if __name__ == "__main__":
    SERVER, PROTO, CLI = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main(verbosity=2)
