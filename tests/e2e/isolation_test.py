#!/usr/bin/python3
"""The attack suite of the local runtime: a real sbx-server (as root, and as an unprivileged
user where the machine allows it) with real bubblewrap, two tenants with a claim each, and
from inside tenant B's sandbox every attack class that once worked (issue 17). Each attack
must fail; each test says on which commit it was seen to succeed (the attack) before the
defence went in.

Usage: isolation_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML
"""

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

import sbx_e2e

SERVER = PROTO = CONFIG = None
TENANT_A = (("authorization", "Bearer tok-a"),)
TENANT_B = (("authorization", "Bearer tok-b"),)
# The unprivileged user the non-root run uses.
NOBODY = "nobody"


def stubs(channel):
    from sbx.v1 import claims_pb2_grpc, sandboxes_pb2_grpc
    return claims_pb2_grpc.ClaimServiceStub(channel), sandboxes_pb2_grpc.SandboxServiceStub(channel)


class Attacks:
    """The attacks, run against a server that setUpClass starts (see the subclasses)."""

    run_as = None  # None: as this process's user (root in CI); else a user name

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-iso-", dir="/tmp")
        os.chmod(cls.dir, 0o755)
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write("tok-a tenant-a\ntok-b tenant-b\ntok-admin ops admin\n")
        os.chmod(cls.tokens, 0o600)
        # A host file no sandbox may touch, and a file of the server's owner.
        cls.canary = os.path.join(cls.dir, "canary")
        with open(cls.canary, "w") as f:
            f.write("host data\n")
        if cls.run_as is not None:
            pw = pwd.getpwnam(cls.run_as)
            for root, dirs, files in os.walk(cls.dir):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)
            os.chown(cls.dir, pw.pw_uid, pw.pw_gid)
        cls.start_server()

    @classmethod
    def start_server(cls):
        cls.start_server_again()
        cls.a = cls.claim_for(TENANT_A, "a")
        cls.b_id = "b"
        cls.b = cls.claim_for(TENANT_B, cls.b_id)

    @classmethod
    def claim_for(cls, md, claim_id):
        from sbx.v1 import claims_pb2
        return cls.claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id=claim_id),
                                metadata=md, timeout=60).claim

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def sh(self, script, claim_id=None, md=TENANT_B, timeout=60):
        """Runs `script` with /bin/sh in a sandbox (tenant B's by default); returns (exit
        code, stdout+stderr)."""
        from sbx.v1 import sandboxes_pb2
        claim_id = claim_id or self.b_id
        start = sandboxes_pb2.ExecStart(claim_id=claim_id, argv=["/bin/sh", "-c", script])
        out, code = b"", None
        for r in self.sandboxes.Exec(iter([sandboxes_pb2.ExecRequest(start=start)]), metadata=md,
                                     timeout=timeout):
            kind = r.WhichOneof("kind")
            if kind in ("stdout_chunk", "stderr_chunk"):
                out += getattr(r, kind)
            elif kind == "exit":
                code = r.exit.exit_code
        return code, out.decode(errors="replace")

    def sandbox_dir(self, claim):
        return os.path.join(self.dir, "sb", claim.sandbox.id)

    # 1. Host root. Seen at 660dada: as root, uid 0 with CapEff 000001fffeffffff, `mount -t
    # tmpfs` worked and a bind remount made a host folder writable.
    def test_no_host_uid_0_and_no_capabilities(self):
        marker = "31.4159"
        code, out = self.sh(f"sleep {marker} & cat /proc/self/status")
        self.assertEqual(code, 0, out)
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            self.assertEqual(int(fields[cap].strip(), 16), 0, f"{cap} in the sandbox: {out}")
        self.assertEqual(fields["NoNewPrivs"].strip(), "1", out)
        self.assertEqual(fields["Seccomp"].strip(), "2", out)
        # As the host sees the sandbox's process: no uid or gid 0, no capability.
        pids = sbx_e2e.processes_with(marker)
        self.assertTrue(pids, "the sandbox's sleep is not visible from the host")
        try:
            for pid in pids:
                with open(f"/proc/{pid}/status") as f:
                    host = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
                for field in ("Uid", "Gid"):
                    ids = [int(x) for x in host[field].split()]
                    self.assertNotIn(0, ids, f"{field} on the host: {host[field]}")
                self.assertEqual(int(host["CapEff"].strip(), 16), 0)
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def test_mount_and_remount_fail(self):
        host_dir = os.path.dirname(os.path.abspath(SERVER))
        code, out = self.sh(
            "mount -t tmpfs none /mnt 2>&1 && echo MOUNTED; "
            f"mount -o remount,bind,rw /usr 2>&1 && echo REMOUNTED; "
            "touch /usr/sbx-pwned 2>&1 && echo WROTE_USR; "
            "unshare -U -r -m true 2>&1 && echo USERNS; "
            f"ls {host_dir} 2>&1 >/dev/null && echo SEES_BUILD; true")
        for marker in ("MOUNTED", "REMOUNTED", "WROTE_USR", "USERNS", "SEES_BUILD"):
            self.assertNotIn(marker, out)
        self.assertFalse(os.path.exists("/usr/sbx-pwned"))

    # Seen at 660dada: /etc/shadow, the tokens file (admin line included) and the store's
    # files were readable.
    def test_secrets_and_server_files_are_out_of_reach(self):
        data = os.path.join(self.dir, "data")
        for path in ("/etc/shadow", "/etc/gshadow", self.tokens, data, self.dir, "/root",
                     "/home", "/var/lib", "/srv", os.path.join(self.dir, "sb")):
            code, out = self.sh(f"cat {path} 2>&1 | head -c 200; ls -a {path} 2>&1 | head -5")
            self.assertNotIn("tok-admin", out, path)
            self.assertIsNone(re.search(r"(^|\n)root:[^ \n]*:", out), f"{path}: {out}")
            self.assertTrue("No such file" in out or "Permission denied" in out or
                            out.strip() == "", f"{path} is visible in the sandbox: {out}")

    # 2. Neighbours. Seen at 660dada: the sandbox root (with every sandbox's sandboxd.sock)
    # was visible, and the daemons took calls without authentication.
    def test_neighbour_control_socket_is_out_of_reach(self):
        socket_a = os.path.join(self.sandbox_dir(self.a), "sandboxd.sock")
        code, out = self.sh(
            f"test -e {socket_a} && echo SEES_A; "
            "find / -xdev -name 'sandboxd.sock' 2>/dev/null; "
            "find /run /tmp -name '*.sock' 2>/dev/null; "
            "grep -c sbx /proc/self/mountinfo; true")
        self.assertNotIn("SEES_A", out)
        self.assertNotIn("sandboxd.sock", out)
        self.assertNotIn(os.path.join(self.dir, "sb"), out, "mountinfo names the sandbox root")

    def test_sandboxd_refuses_calls_without_the_secret(self):
        # As the host's root would call it: the socket path, no secret.
        from sbx.sandboxd.v1 import sandboxd_pb2, sandboxd_pb2_grpc
        socket_a = os.path.join(self.sandbox_dir(self.a), "sandboxd.sock")
        channel = grpc.insecure_channel("unix:" + socket_a)
        stub = sandboxd_pb2_grpc.SandboxdStub(channel)
        try:
            for md in ((), (("sbx-sandbox-secret", "0" * 64),)):
                with self.assertRaises(grpc.RpcError) as e:
                    stub.WriteFile(sandboxd_pb2.WriteFileRequest(path="pwned", content=b"x"),
                                   metadata=md, timeout=10)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED,
                                 e.exception.details())
                with self.assertRaises(grpc.RpcError) as e:
                    list(stub.Exec(iter([sandboxd_pb2.ExecRequest(
                        start=sandboxd_pb2.ExecStart(argv=["/bin/true"]))]), metadata=md,
                        timeout=10))
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED,
                                 e.exception.details())
        finally:
            channel.close()
        code, out = self.sh("ls pwned 2>&1", claim_id="a", md=TENANT_A)
        self.assertNotEqual(code, 0, out)

    # The daemon's secret stays out of the workload's reach: it is not in the daemon's
    # environment or command line, and the daemon's memory and descriptors are closed to
    # processes of the sandbox.
    def test_workload_cannot_read_the_daemons_memory(self):
        code, out = self.sh(
            "for p in /proc/[0-9]*; do "
            "  head -c 26 $p/cmdline 2>/dev/null | grep -q '^/run/sbx/bin/sbx-sandboxd' || continue; "
            "  echo PID $p; tr '\\0' ' ' < $p/cmdline; echo; "
            "  cat $p/environ 2>/dev/null | tr '\\0' '\\n' | grep -i secret && echo ENV_SECRET; "
            "  ls $p/fd 2>/dev/null && echo FDS_OPEN; "
            "  head -c 1 $p/mem 2>/dev/null && echo MEM_OPEN; "
            "done; true")
        self.assertIn("PID", out)
        for marker in ("ENV_SECRET", "FDS_OPEN", "MEM_OPEN", "--secret="):
            self.assertNotIn(marker, out)

    # 7. ptrace, keyrings, bpf, perf, userfaultfd, open_by_handle_at. Seen at 660dada: as
    # root in the sandbox, keyctl, perf_event_open, userfaultfd and ptrace of the daemon
    # worked.
    def test_dangerous_syscalls_are_refused(self):
        script = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno())
daemon = [int(p) for p in os.listdir('/proc') if p.isdigit() and
          b'sbx-sandboxd' in open('/proc/%s/cmdline' % p, 'rb').read()][0]
call('ptrace', 101, 16, daemon, 0, 0)                   # PTRACE_ATTACH
call('keyctl', 250, 1, 0)                               # KEYCTL_JOIN_SESSION_KEYRING
call('add_key', 248, b'user', b'k', b'v', 1, -2)
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)  # PERF_TYPE_SOFTWARE, size
call('perf_event_open', 298, attr, 0, -1, -1, 0)
call('bpf', 321, 0, ctypes.create_string_buffer(64), 64)
call('userfaultfd', 323, 0)
call('open_by_handle_at', 304, -100, ctypes.create_string_buffer(64), 0)
call('kexec_load', 246, 0, 0, 0, 0)
call('init_module', 175, 0, 0, b'')
call('mount', 165, b'none', b'/mnt', b'tmpfs', 0, 0)
call('unshare_user', 272, 0x10000000)                   # CLONE_NEWUSER
"""
        code, out = self.sh(f"python3 -c \"{script}\"")
        self.assertEqual(code, 0, out)
        results = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3:
                results[parts[0]] = (int(parts[1]), int(parts[2]))
        self.assertEqual(len(results), 11, out)
        for name, (ret, err) in results.items():
            self.assertEqual(ret, -1, f"{name} succeeded in the sandbox: {out}")
            self.assertIn(err, (1, 13, 38), f"{name}: errno {err}")  # EPERM, EACCES, ENOSYS

    # 3. The server wrote through the sandbox's symlinks. Seen at 660dada: `ln -sf <host
    # file> /run/sbx/sock/state.json.tmp`, then Suspend + Resume overwrote the host file.
    def test_server_does_not_write_through_sandbox_symlinks(self):
        from sbx.v1 import sandboxes_pb2
        self.sh(f"ln -sf {self.canary} /run/sbx/sock/state.json.tmp 2>&1; "
                f"ln -sf {self.canary} /run/sbx/sock/state.json 2>&1; true")
        self.sandboxes.Suspend(sandboxes_pb2.SuspendRequest(claim_id=self.b_id), metadata=TENANT_B,
                               timeout=30)
        self.sandboxes.Resume(sandboxes_pb2.ResumeRequest(claim_id=self.b_id), metadata=TENANT_B,
                              timeout=30)
        with open(self.canary) as f:
            self.assertEqual(f.read(), "host data\n")
        self.assertEqual(self.sh("echo alive")[1].strip(), "alive")

    # 4. The server trusted what the sandbox wrote. Seen at 660dada: a cgroup path written
    # into state.json by the sandbox was adopted after a restart, and releasing the claim
    # SIGKILLed every process in that (host) cgroup.
    def test_forged_state_is_not_trusted_across_a_restart(self):
        victim = subprocess.Popen(["sleep", "300"])
        victim_cgroup = None
        try:
            base = "/sys/fs/cgroup/pids"
            if os.access(base, os.W_OK) and self.run_as is None:
                victim_cgroup = os.path.join(base, f"sbx-victim-{os.getpid()}")
                os.makedirs(victim_cgroup, exist_ok=True)
                with open(os.path.join(victim_cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(victim.pid))
            forged = victim_cgroup or "/sys/fs/cgroup/pids"
            self.sh("python3 -c \"import json; p='/run/sbx/sock/state.json'; "
                    "s=json.load(open(p)); s['cgroups'].append('%s'); "
                    "json.dump(s, open(p, 'w'))\" 2>&1; true" % forged)
            type(self).server.stop(signal.SIGKILL)
            type(self).start_server_again()
            from sbx.v1 import claims_pb2
            try:
                self.claims.Release(claims_pb2.ReleaseRequest(claim_id=self.b_id), metadata=TENANT_B,
                                    timeout=30)
            except grpc.RpcError:
                pass  # the claim may have been marked lost; what matters is the victim
            time.sleep(0.5)
            self.assertIsNone(victim.poll(), "the server killed a host process it was told of")
            if victim_cgroup:
                self.assertTrue(os.path.isdir(victim_cgroup))
        finally:
            victim.kill()
            victim.wait()
            if victim_cgroup:
                for _ in range(100):
                    try:
                        os.rmdir(victim_cgroup)
                        break
                    except OSError:
                        time.sleep(0.05)
            type(self).b_id = "b2"
            type(self).b = type(self).claim_for(TENANT_B, "b2")

    @classmethod
    def start_server_again(cls):
        """A server on the class's folder (as `run_as` when set), and stubs on it."""
        prefix = ()
        if cls.run_as is not None:
            pw = pwd.getpwnam(cls.run_as)
            prefix = ("setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                      "--clear-groups", "--inh-caps=-all", "--bounding-set=-all")
        cls.server = sbx_e2e.Server(SERVER, cls.dir, CONFIG, auth_tokens=cls.tokens,
                                    prefix=prefix)
        cls.claims, cls.sandboxes = stubs(cls.server.channel)

    # Escaping the workspace through the file RPCs (symlinks made by the workload): reads
    # through them are refused; a write either is refused or replaces the link itself.
    # Held at 660dada already (openat2 RESOLVE_BENEATH); kept here as the attack class.
    def test_file_rpcs_stay_in_the_workspace(self):
        from sbx.v1 import sandboxes_pb2
        self.sh(f"ln -sf {self.canary} out; ln -sfn / root; ln -sfn /etc etc; true")
        for path in ("out", "root/etc/passwd", "etc/passwd", "../../etc/passwd",
                     "/etc/passwd"):
            with self.assertRaises(grpc.RpcError) as e:
                self.sandboxes.ReadFile(sandboxes_pb2.ReadFileRequest(claim_id=self.b_id, path=path),
                                        metadata=TENANT_B, timeout=10)
            self.assertIn(e.exception.code(), (grpc.StatusCode.INVALID_ARGUMENT,
                                               grpc.StatusCode.NOT_FOUND), path)
            try:
                self.sandboxes.WriteFile(sandboxes_pb2.WriteFileRequest(
                    claim_id=self.b_id, path=path, content=b"pwned"), metadata=TENANT_B,
                    timeout=10)
            except grpc.RpcError:
                pass
        with open(self.canary) as f:
            self.assertEqual(f.read(), "host data\n")
        with open("/etc/passwd") as f:
            self.assertNotIn("pwned", f.read())


class AsRoot(Attacks, unittest.TestCase):
    pass


def can_run_as_nobody():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv to start the server as another user"
    try:
        pwd.getpwnam(NOBODY)
    except KeyError:
        return f"no user {NOBODY}"
    # The binaries must be reachable by that user (a build under a private home is not).
    probe = subprocess.run(["setpriv", "--reuid=" + NOBODY, "--regid=nogroup", "--clear-groups",
                            SERVER, "--version"], capture_output=True)
    if probe.returncode != 0:
        return f"{SERVER} cannot run as {NOBODY}: {probe.stderr.decode()[-200:]}"
    probe = subprocess.run(["setpriv", "--reuid=" + NOBODY, "--regid=nogroup", "--clear-groups",
                            "bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        return f"bwrap cannot make user namespaces as {NOBODY}: {probe.stderr.decode()}"
    return None


class AsNonRoot(Attacks, unittest.TestCase):
    run_as = NOBODY

    @classmethod
    def setUpClass(cls):
        why = can_run_as_nobody()
        if why is not None:
            raise unittest.SkipTest(why)
        super().setUpClass()


class FailClosedTest(unittest.TestCase):
    # 5. Fail-open. Seen at 660dada: without bubblewrap the server started and ran
    # sandboxes as plain processes.
    def test_refuses_to_start_without_bubblewrap(self):
        d = tempfile.mkdtemp(prefix="sbx-iso-", dir="/tmp")
        try:
            proc = subprocess.run(
                [SERVER, "--listen=127.0.0.1:0", "--metrics_listen=off", f"--data_dir={d}/data",
                 f"--sandbox_root={d}/sb", f"--config={CONFIG}", "--insecure_no_auth",
                 "--bwrap=/nonexistent/bwrap"], capture_output=True, timeout=60)
            self.assertNotEqual(proc.returncode, 0)
            err = proc.stderr.decode()
            self.assertIn("bubblewrap", err)
            self.assertIn("--insecure_local_no_isolation", err)
        finally:
            sbx_e2e.kill_all_with(d)
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    SERVER, PROTO, CONFIG = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main(verbosity=2)
