#!/usr/bin/python3
"""Reset (issue 37, slice 2) on the local runtime, with a real sbx-server as root, real
bubblewrap, a real RocksDB and an image built here offline (busybox-static): a claimed
sandbox rewound to a snapshot keeps its claim id, sandbox id, endpoint and late-bound env,
gets the snapshot's layer and workspace back, and loses every process it had; twice in a
row; tenants; a snapshot of another image; an exec racing the reset; a sandbox that plants
links to host paths before the reset; the snapshot held while a reset runs; the CLI.

Usage: reset_test.py PATH_TO_SBX_SERVER PROTO_DIR PATH_TO_SBX_CLI
"""

import os
import signal
import subprocess
import sys
import threading
import time

import grpc

import sbx_e2e
from sbx_e2e import A, B, WS

SERVER = PROTO = CLI = None

CONFIG = sbx_e2e.pool_config(
    sbx_e2e.IMG_POOL,
    ("other", {"image": "{other}"}, 1, 2),
    sbx_e2e.HOST_POOL)

# Starts `sleep 1000` in the background and answers once ps shows it as such: a forked child
# shows its parent's command line until it has exec'd, which on a busy machine can outlast
# the next few calls (a count right after the start then saw 0).
START_SLEEP = ("(sleep 1000 > /dev/null 2>&1 &); i=0; "
               "until ps -o args | grep -q '^sleep 1000'; do i=$((i+1)); "
               "[ $i -gt 100000 ] && break; done; echo OK")


class Reset(sbx_e2e.ServerTestCase):
    TOKENS = sbx_e2e.TWO_TENANTS
    MD = A

    @classmethod
    def setUpClass(cls):
        cls.make_workdir("sbx-reset-", 0o755)
        cls.plain_ref = sbx_e2e.busybox_image(os.path.join(cls.dir, "images", "plain"))
        cls.other_ref = sbx_e2e.busybox_image(os.path.join(cls.dir, "images", "other"),
                                              env=["PATH=/bin", "OTHER=1"])
        cls.config = cls.write_file("config.yaml", CONFIG.replace("{plain}", cls.plain_ref)
                                    .replace("{other}", cls.other_ref))
        # A host folder the sandbox links to: nothing may be written into it or removed.
        cls.host_dir = os.path.join(cls.dir, "host-dir")
        os.makedirs(cls.host_dir)
        os.chmod(cls.host_dir, 0o777)
        cls.write_file("host-dir/canary", "CANARY\n")
        cls.start_server(cls.config, [
            "--image_cache_bytes=1000000000", f"--image_import_dir={cls.dir}/images"])

    # --- helpers ---

    def host_dir_untouched(self):
        self.assertEqual(sorted(os.listdir(self.host_dir)), ["canary"])
        with open(os.path.join(self.host_dir, "canary")) as f:
            self.assertEqual(f.read(), "CANARY\n")

    # --- tests ---

    def test_reset_brings_back_the_files_kills_the_processes_keeps_claim_endpoint_env(self):
        c = self.claim(env={"LATE": "bound"})
        try:
            code, out = self.sh(c, f"echo one > {WS}/keep && mkdir -p /opt/app && "
                                   f"echo app > /opt/app/f && rm /bin/vi && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            snap = self.snapshot(c)
            code, out = self.sh(c, f"echo two > {WS}/keep && echo new > {WS}/new && "
                                   f"rm -r /opt/app && echo root > /new-root && "
                                   f"echo back > /bin/vi && "
                                   f"{START_SLEEP}")
            self.assertEqual((code, out), (0, "OK\n"))
            code, out = self.sh(c, "ps -o args | grep -c '^sleep 1000'")
            self.assertEqual(out.strip(), "1", out)
            before = self.get_claim(c.claim_id)
            self.reset(c.claim_id, snap.id)
            after = self.get_claim(c.claim_id)
            self.assertEqual(after.claim_id, c.claim_id)
            self.assertEqual(after.sandbox.id, before.sandbox.id)
            self.assertEqual(after.sandbox.endpoint, before.sandbox.endpoint)
            code, out = self.sh(c, f"cat {WS}/keep /opt/app/f; test -e {WS}/new || echo no-new; "
                                   f"test -e /new-root || echo no-root; "
                                   f"test -e /bin/vi || echo no-vi; echo LATE=$LATE; "
                                   f"ps -o args | grep -c '^sleep 1000'")
            self.assertEqual(code, 1, out)  # grep -c counting 0 exits 1
            self.assertEqual(out, "one\napp\nno-new\nno-root\nno-vi\nLATE=bound\n0\n")
            # The files are the sandbox user's again: it can change them.
            code, out = self.sh(c, f"echo three > {WS}/keep && echo x > /opt/app/f && "
                                   f"test $(stat -c %u {WS}/keep) = $(id -u) && "
                                   f"test $(stat -c %u /opt/app/f) = $(id -u) && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            # Twice in a row, the second right after the first.
            self.reset(c.claim_id, snap.id)
            self.reset(c.claim_id, snap.id)
            code, out = self.sh(c, f"cat {WS}/keep /opt/app/f")
            self.assertEqual((code, out), (0, "one\napp\n"))
            self.assertEqual(self.get_claim(c.claim_id).sandbox.endpoint,
                             before.sandbox.endpoint)
            self.delete_snapshot(snap.id)
        finally:
            self.release(c)

    def test_a_sandbox_of_the_hosts_root_gets_its_workspace_back(self):
        c = self.claim("host")
        try:
            code, out = self.sh(c, "echo hello > note && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            snap = self.snapshot(c)
            code, out = self.sh(c, "rm note && echo other > other && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            self.reset(c.claim_id, snap.id)
            code, out = self.sh(c, "cat note; ls")
            self.assertEqual((code, out), (0, "hello\nnote\n"))
            self.delete_snapshot(snap.id)
        finally:
            self.release(c)

    # Tenant B can neither reset A's claim (to B's own snapshot) nor reset its own claim to
    # A's snapshot: NOT_FOUND both, as if they did not exist; A's sandbox is untouched.
    def test_another_tenants_claim_or_snapshot_is_not_found(self):
        a = self.claim()
        b = self.claim(md=B)
        try:
            code, out = self.sh(a, f"echo a > {WS}/mine && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            code, out = self.sh(b, f"echo b > {WS}/theirs && echo OK", md=B)
            self.assertEqual((code, out), (0, "OK\n"))
            snap_a = self.snapshot(a)
            snap_b = self.snapshot(b, md=B)
            code, out = self.sh(a, START_SLEEP)
            self.assertEqual((code, out), (0, "OK\n"))
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.reset, a.claim_id, snap_b.id, B)
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.reset, b.claim_id, snap_a.id, B)
            self.assert_code(grpc.StatusCode.NOT_FOUND, self.reset, a.claim_id, snap_b.id, A)
            code, out = self.sh(a, f"cat {WS}/mine; ps -o args | grep -c '^sleep 1000'")
            self.assertEqual((code, out), (0, "a\n1\n"))
            code, out = self.sh(b, f"cat {WS}/theirs; test -e {WS}/mine || echo no", md=B)
            self.assertEqual((code, out), (0, "b\nno\n"))
            self.delete_snapshot(snap_a.id)
            self.delete_snapshot(snap_b.id, B)
        finally:
            self.release(a)
            self.release(b, B)

    def test_a_snapshot_of_another_image_is_refused_naming_both(self):
        a = self.claim()
        o = self.claim("other")
        try:
            snap = self.snapshot(o)
            msg = self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.reset, a.claim_id,
                                   snap.id)
            self.assertIn(snap.parent_image_digest, msg)
            mine = self.get_claim(a.claim_id)
            self.assertIn("sha256:", msg)
            self.assertIn(snap.id, msg)
            code, out = self.sh(a, "echo alive")
            self.assertEqual((code, out), (0, "alive\n"))
            self.assertEqual(self.get_claim(a.claim_id).sandbox.endpoint, mine.sandbox.endpoint)
            self.delete_snapshot(snap.id)
        finally:
            self.release(a)
            self.release(o)

    # An exec running when the reset starts ends with ABORTED naming the snapshot, and the
    # same holds for a process stream (StartProcess).
    def test_an_exec_in_flight_ends_with_aborted_naming_the_snapshot(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        try:
            snap = self.snapshot(c)
            results = {}

            def run():
                try:
                    results["exec"] = self.sh(c, f"touch {WS}/running; sleep 60; echo done",
                                              timeout=90)
                except grpc.RpcError as e:
                    results["error"] = e

            t = threading.Thread(target=run)
            t.start()
            sbx_e2e.wait_for(lambda: self.sh(c, f"test -e {WS}/running && echo y")[1] == "y\n",
                             30, "the exec to run")
            stream = self.sandboxes.StartProcess(
                sandboxes_pb2.StartProcessRequest(claim_id=c.claim_id,
                                                  argv=["/bin/sh", "-c", "sleep 60"]),
                metadata=A, timeout=90)
            first = next(stream)  # the process started
            self.assertIsNotNone(first)
            self.reset(c.claim_id, snap.id)
            t.join(60)
            self.assertFalse(t.is_alive())
            self.assertIn("error", results, results)
            e = results["error"]
            self.assertEqual(e.code(), grpc.StatusCode.ABORTED, e.details())
            self.assertIn(f"reset to snapshot {snap.id}", e.details())
            with self.assertRaises(grpc.RpcError) as cm:
                for _ in stream:
                    pass
            self.assertEqual(cm.exception.code(), grpc.StatusCode.ABORTED,
                             cm.exception.details())
            self.assertIn(snap.id, cm.exception.details())
            # A call made after the reset is not reported as aborted.
            code, out = self.sh(c, f"test -e {WS}/running || echo clean")
            self.assertEqual((code, out), (0, "clean\n"))
            self.delete_snapshot(snap.id)
        finally:
            self.release(c)

    # The sandbox leaves links to a host folder in its workspace and layer, and tries to
    # swap its workspace itself for one, before the snapshot and again before the reset.
    # The reset copies links as links (never following one) into a new sandbox: the host
    # folder keeps exactly its canary, and the links resolve inside the sandbox only. Seen
    # failing with sbx-rootfs's seed made to follow links (fstatat without
    # AT_SYMLINK_NOFOLLOW, opens without O_NOFOLLOW): /opt/hostlink came back as a copy of
    # the host folder, the host's canary readable in the sandbox.
    def test_links_to_host_paths_are_never_followed(self):
        c = self.claim()
        h = self.host_dir
        try:
            code, out = self.sh(c, f"ln -s {h} {WS}/hostlink && ln -s {h}/canary {WS}/canary && "
                                   f"mkdir -p /opt && ln -s {h} /opt/hostlink && "
                                   f"ln -s {h}/canary /opt/canary && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            snap = self.snapshot(c)
            # Whatever the sandbox manages of a swap of its workspace for a link.
            self.sh(c, f"cd /run/sbx && (mv workspace ws-old || rm -rf workspace/*); "
                       f"ln -s {h} /run/sbx/workspace 2>/dev/null; "
                       f"ln -sfn {h} {WS}/hostlink2; echo done")
            self.reset(c.claim_id, snap.id)
            self.host_dir_untouched()
            code, out = self.sh(c, f"readlink {WS}/hostlink; readlink /opt/hostlink; "
                                   f"readlink {WS}/canary; "
                                   f"test -e {WS}/hostlink2 || echo no2; "
                                   f"cat {WS}/canary 2>/dev/null || echo unreadable; "
                                   f"cat /opt/canary 2>/dev/null || echo unreadable; "
                                   f"(echo x > {WS}/canary) 2>/dev/null; "
                                   f"(echo y > /opt/canary) 2>/dev/null; echo OK")
            self.assertEqual(out, f"{h}\n{h}\n{h}/canary\nno2\nunreadable\nunreadable\nOK\n")
            self.host_dir_untouched()
            self.delete_snapshot(snap.id)
        finally:
            self.release(c)

    # While a reset runs the snapshot is held: a DeleteSnapshot racing it is either refused
    # (FAILED_PRECONDITION naming the reset) or comes after it; the reset never fails for
    # lack of its files.
    def test_the_snapshot_is_held_while_a_reset_runs(self):
        c = self.claim()
        try:
            code, out = self.sh(c, f"dd if=/dev/zero of={WS}/big bs=1M count=64 2>/dev/null "
                                   f"&& echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            snap = self.snapshot(c)
            from sbx.v1 import snapshots_pb2
            future = self.snaps.Reset.future(
                snapshots_pb2.ResetRequest(claim_id=c.claim_id, snapshot_id=snap.id),
                metadata=A, timeout=60)
            refused = None
            while not future.done():
                try:
                    self.delete_snapshot(snap.id)
                    break
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION, e.details())
                    self.assertIn("reset of claim", e.details())
                    refused = e
                    time.sleep(0.001)
            try:
                future.result()
            except grpc.RpcError as e:
                # Only possible when the deletion came first: the reset then finds no
                # snapshot, and the sandbox is untouched.
                self.assertIsNone(refused)
                self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND, e.details())
                return
            code, out = self.sh(c, f"wc -c < {WS}/big")
            self.assertEqual((code, out.strip()), (0, str(64 << 20)))
            try:
                self.delete_snapshot(snap.id)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)  # deleted after it
            print(f"deletion refused during the reset: {refused is not None}", file=sys.stderr)
        finally:
            self.release(c)

    # A release racing a reset: the release waits for the reset (or the reset finds the
    # claim ended); either way no process of the sandbox is left behind and its host
    # folder goes.
    def test_a_release_racing_a_reset_leaves_nothing_behind(self):
        from sbx.v1 import claims_pb2, snapshots_pb2
        for _ in range(3):
            c = self.claim()
            snap = self.snapshot(c)
            future = self.snaps.Reset.future(
                snapshots_pb2.ResetRequest(claim_id=c.claim_id, snapshot_id=snap.id),
                metadata=A, timeout=60)
            self.claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id), metadata=A,
                                timeout=60)
            try:
                future.result()
            except grpc.RpcError as e:
                self.assertIn(e.code(), (grpc.StatusCode.FAILED_PRECONDITION,
                                         grpc.StatusCode.NOT_FOUND), e.details())
            sb = os.path.join(self.dir, "sb", c.sandbox.id)
            sbx_e2e.wait_for(lambda: not os.path.exists(sb) and
                             not sbx_e2e.processes_with(sb), 30,
                             f"sandbox {c.sandbox.id} to be gone")
            self.delete_snapshot(snap.id)

    def test_bad_requests_and_an_ended_claim(self):
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, self.reset, "", "sn-x")
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, self.reset, "c", "")
        self.assert_code(grpc.StatusCode.NOT_FOUND, self.reset, "nope", "sn-nope")
        c = self.claim()
        snap = self.snapshot(c)
        self.assert_code(grpc.StatusCode.NOT_FOUND, self.reset, c.claim_id, "sn-nope")
        self.release(c)
        self.assert_code(grpc.StatusCode.FAILED_PRECONDITION, self.reset, c.claim_id, snap.id)
        self.delete_snapshot(snap.id)

    def test_the_cli(self):
        c = self.claim()
        try:
            code, out = self.sh(c, f"echo cli > {WS}/f && echo OK")
            self.assertEqual((code, out), (0, "OK\n"))
            snap = self.snapshot(c)
            self.sh(c, f"rm {WS}/f")
            env = dict(os.environ, SBX_TOKEN="token-a")
            r = subprocess.run([CLI, f"--server={self.server.target}", "reset", c.claim_id,
                                snap.id], capture_output=True, text=True, timeout=60, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"reset to snapshot {snap.id}", r.stdout)
            code, out = self.sh(c, f"cat {WS}/f")
            self.assertEqual((code, out), (0, "cli\n"))
            r = subprocess.run([CLI, f"--server={self.server.target}", "reset", c.claim_id,
                                "sn-nope"], capture_output=True, text=True, timeout=60, env=env)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("sn-nope", r.stderr)
            self.delete_snapshot(snap.id)
        finally:
            self.release(c)

    # The late-bound env is recorded with the claim and the template in the sandbox's state
    # file, so a sandbox the server adopted after a kill -9 is reset like any other, env and
    # all (before, the env lived in the server's memory and an adopted sandbox was refused).
    def test_zz_a_sandbox_adopted_after_a_kill_9_is_reset_with_its_env(self):
        cls = type(self)
        c = self.claim(env={"LATE": "kept"})
        h = self.claim(pool="host", env={"LATE": "host"})
        code, out = self.sh(c, f"echo one > {WS}/keep && echo app > /opt-f && echo OK")
        self.assertEqual((code, out), (0, "OK\n"))
        self.assertEqual(self.sh(h, f"echo h1 > {WS}/keep && echo OK"), (0, "OK\n"))
        snap, hsnap = self.snapshot(c), self.snapshot(h)
        self.assertEqual(self.sh(c, f"echo two > {WS}/keep && rm /opt-f && echo OK"),
                         (0, "OK\n"))
        self.assertEqual(self.sh(h, f"echo h2 > {WS}/keep && echo OK"), (0, "OK\n"))
        cls.restart_server(signal.SIGKILL)
        self.assertEqual(self.get_claim(c.claim_id).sandbox.id, c.sandbox.id)
        self.reset(c.claim_id, snap.id)
        self.assertEqual(self.sh(c, f"cat {WS}/keep /opt-f; echo LATE=$LATE"),
                         (0, "one\napp\nLATE=kept\n"))
        self.reset(h.claim_id, hsnap.id)
        self.assertEqual(self.sh(h, f"cat {WS}/keep; echo LATE=$LATE"), (0, "h1\nLATE=host\n"))
        self.release(c)
        self.release(h)
        self.delete_snapshot(snap.id)
        self.delete_snapshot(hsnap.id)


if __name__ == "__main__":
    sbx_e2e.run(Reset, __doc__, ("SERVER", "PROTO", "CLI"),
                root_reason="resets of image sandboxes need a root server (idmapped layers)")
