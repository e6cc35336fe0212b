#!/usr/bin/python3
"""The attack suite of the local runtime: a real sbx-server (as root, and as an unprivileged
user where the machine allows it) with real bubblewrap, two tenants with a claim each, and
from inside tenant B's sandbox every attack class that once worked (issue 17). Each attack
must fail; each test says on which commit it was seen to succeed (the attack) before the
defence went in.

Usage: isolation_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML PATH_TO_SBX_CLI
"""

import json
import os
import pty
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
import urllib.request

import grpc

import sbx_e2e

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "images"))
import test_images  # noqa: E402

SERVER = PROTO = CONFIG = CLI = None
TENANT_A = (("authorization", "Bearer tok-a"),)
TENANT_B = (("authorization", "Bearer tok-b"),)
ADMIN = (("authorization", "Bearer tok-admin"),)
TOKENS = "tok-a tenant-a\ntok-b tenant-b\ntok-admin ops admin\n"
# A file name (and output) that drives a terminal: sets the window title, clears the screen.
TERMINAL_ATTACK = "\x1b]0;pwned\x07\x1b[2J"
# The unprivileged user the non-root run uses.
NOBODY = "nobody"


def stubs(channel):
    from sbx.v1 import claims_pb2_grpc, sandboxes_pb2_grpc
    return claims_pb2_grpc.ClaimServiceStub(channel), sandboxes_pb2_grpc.SandboxServiceStub(channel)


def admin_stub(channel):
    from sbx.v1 import admin_pb2_grpc
    return admin_pb2_grpc.AdminServiceStub(channel)


setpriv_prefix = sbx_e2e.setpriv_prefix
chown_tree = sbx_e2e.chown_tree


def run_on_tty(argv, umask=None):
    """Runs `argv` with stdout and stderr on a new pseudo-terminal (as an operator's
    shell would); returns (exit code, everything the terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    return proc.wait(timeout=60), out


def local_template(name, mounts=()):
    from sbx.v1 import admin_pb2
    return admin_pb2.Template(name=name, runtime="local", local=admin_pb2.LocalSpec(
        mounts=[admin_pb2.BindMount(source=src, target=dst, read_only=True)
                for src, dst in mounts]))


def metric_lines(server, name):
    with open(os.path.join(server.workdir, "metrics-port")) as f:
        port = f.read().strip()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [line for line in text.splitlines() if line.startswith(name)]


def metric_sum(server, name, must=""):
    total = 0.0
    for line in metric_lines(server, name):
        if must in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


_IMAGE_BUILT = None


def attack_image(dest):
    """Copies the attack suite's image (busybox and python3, built once per run) to `dest`;
    returns its reference there."""
    global _IMAGE_BUILT
    if _IMAGE_BUILT is None:
        _IMAGE_BUILT = tempfile.mkdtemp(prefix="sbx-iso-image-", dir="/tmp")
        test_images.python_image(os.path.join(_IMAGE_BUILT, "python"))
    shutil.copytree(os.path.join(_IMAGE_BUILT, "python"), dest)
    return f"oci:{dest}:python"


def tearDownModule():
    if _IMAGE_BUILT is not None:
        shutil.rmtree(_IMAGE_BUILT, ignore_errors=True)


class Attacks:
    """The attacks, run against a server that setUpClass starts (see the subclasses)."""

    run_as = None  # None: as this process's user (root in CI); else a user name
    # True: the sandboxes are of an OCI image (busybox and python3) instead of the host's
    # root; every attack must fail there too (issue 34).
    image = False
    config = None  # the server's config (None: CONFIG)

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-iso-", dir="/tmp")
        os.chmod(cls.dir, 0o755)
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write(TOKENS)
        os.chmod(cls.tokens, 0o600)
        # A host file no sandbox may touch, and a file of the server's owner.
        cls.canary = os.path.join(cls.dir, "canary")
        with open(cls.canary, "w") as f:
            f.write("host data\n")
        if cls.image:
            ref = attack_image(os.path.join(cls.dir, "images", "python"))
            with open(CONFIG) as f:
                text = f.read()
            marker = "    local:\n"
            assert marker in text, "the e2e config's default template has no local spec"
            cls.config = os.path.join(cls.dir, "config.yaml")
            with open(cls.config, "w") as f:
                f.write(text.replace(marker, f"{marker}      image: \"{ref}\"\n", 1))
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
        return sbx_e2e.sh(self.sandboxes, claim_id or self.b_id, script, md, timeout)

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
        # In an image, /usr is the sandbox's own (its layer): writing there is no escape.
        for marker in ("MOUNTED", "REMOUNTED", "USERNS", "SEES_BUILD") + (
                () if self.image else ("WROTE_USR",)):
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
            # The daemon (in an image: run by /run/sbx/lib/ld.so).
            "  tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
            "    grep -qE '^(/run/sbx/lib/ld.so .*)?/run/sbx/bin/sbx-sandboxd ' || continue; "
            "  echo PID $p; tr '\\0' ' ' < $p/cmdline; echo; "
            "  cat $p/environ 2>/dev/null | tr '\\0' '\\n' | grep -i secret && echo ENV_SECRET; "
            "  ls $p/fd 2>/dev/null && echo FDS_OPEN; "
            "  for f in $p/fd/*; do readlink $f >/dev/null 2>&1 && echo FD_LINK; "
            "    ( : < $f ) 2>/dev/null && echo FD_OPENED; done; "
            "  head -c 1 $p/mem 2>/dev/null && echo MEM_OPEN; "
            "done; true")
        self.assertIn("PID", out)
        # In an image whose User is 0, the workload is the user namespace's uid 0, which
        # owns the /proc entries of the (non-dumpable) daemon: it may list the daemon's
        # descriptor numbers, never read a link or open one (that takes CAP_SYS_PTRACE).
        for marker in ("ENV_SECRET", "FD_LINK", "FD_OPENED", "MEM_OPEN", "--secret=") + (
                () if self.image else ("FDS_OPEN",)):
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
        extra = [f"--metrics_port_file={cls.dir}/metrics-port"]
        if cls.image:
            extra += ["--image_cache_bytes=2000000000", f"--image_import_dir={cls.dir}/images"]
        cls.server = sbx_e2e.Server(
            SERVER, cls.dir, cls.config or CONFIG, auth_tokens=cls.tokens, prefix=prefix,
            extra=extra)
        cls.claims, cls.sandboxes = stubs(cls.server.channel)
        cls.admin = admin_stub(cls.server.channel)

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

    # ---- Issue 33: what a sandbox reaches through sbx's own tools and operators' mounts.

    def cli(self, *args, umask=0o022, tty=False):
        """Runs the sbx CLI (as this process's user, as an operator would) for tenant B;
        returns (exit code, stdout, stderr), or (exit code, terminal bytes, b"") with tty."""
        argv = [CLI, "--server", self.server.target, "--token", "tok-b", *args]
        old = os.umask(umask)
        try:
            if tty:
                code, out = run_on_tty(argv)
                return code, out, b""
            p = subprocess.run(argv, capture_output=True, timeout=60)
            return p.returncode, p.stdout, p.stderr
        finally:
            os.umask(old)

    # 1. Seen at 6dad6b0: `sbx cp` out of a sandbox made a set-uid/set-gid file on the host
    # with the mode the sandbox chose (06755, owned by root when the CLI runs as root).
    def test_cp_out_writes_plain_files_only(self):
        code, out = self.sh(
            "printf x > suid && chmod 6755 suid && printf y > plain && chmod 0640 plain && "
            "printf z > sticky && chmod 1777 sticky && rm -f fifo && mkfifo fifo && "
            "ln -sfn suid link && ln -sfn /etc/passwd abs && echo READY")
        self.assertIn("READY", out)
        host = tempfile.mkdtemp(prefix="sbx-iso-cp-", dir="/tmp")
        try:
            expect = {("suid", 0o022): 0o755, ("suid", 0o077): 0o700, ("plain", 0o022): 0o640,
                      ("sticky", 0o022): 0o755, ("link", 0o022): 0o755}
            for (name, umask), mode in expect.items():
                dest = os.path.join(host, f"{name}-{umask:o}")
                code, _, err = self.cli("cp", f"{self.b_id}:{name}", dest, umask=umask)
                self.assertEqual(code, 0, err)
                st = os.lstat(dest)
                self.assertTrue(stat.S_ISREG(st.st_mode), f"{name} is not a regular file")
                self.assertEqual(stat.S_IMODE(st.st_mode), mode,
                                 f"{name} with umask {umask:o}: mode {stat.S_IMODE(st.st_mode):o}")
                self.assertEqual(st.st_uid, os.geteuid(), name)
                self.assertEqual(st.st_gid, os.getegid(), name)
            # Devices, FIFOs and sockets are refused; so is a link leaving the workspace.
            for name in ("fifo", "abs"):
                dest = os.path.join(host, name)
                code, _, err = self.cli("cp", f"{self.b_id}:{name}", dest)
                self.assertNotEqual(code, 0, f"cp of {name} succeeded")
                self.assertFalse(os.path.lexists(dest), name)
            # A link on the host at the destination is replaced, never written through.
            victim = os.path.join(host, "victim")
            os.symlink(self.canary, victim)
            code, _, err = self.cli("cp", f"{self.b_id}:plain", victim)
            self.assertEqual(code, 0, err)
            self.assertFalse(os.path.islink(victim))
            with open(self.canary) as f:
                self.assertEqual(f.read(), "host data\n")
            self.assertEqual([n for n in os.listdir(host) if ".sbx-" in n], [])
        finally:
            shutil.rmtree(host, ignore_errors=True)

    # 2. Seen at 6dad6b0: `sbx ls` printed a file name the sandbox made with its raw
    # control characters (the terminal's title changed and the screen was cleared); exec
    # output reached the terminal raw as well.
    def test_cli_escapes_what_a_sandbox_chose(self):
        from sbx.v1 import sandboxes_pb2
        self.sandboxes.WriteFile(sandboxes_pb2.WriteFileRequest(
            claim_id=self.b_id, path=TERMINAL_ATTACK, content=TERMINAL_ATTACK.encode()),
            metadata=TENANT_B, timeout=10)
        for args in (("ls", self.b_id),
                     ("exec", self.b_id, "--", "printf", "%s\\n", TERMINAL_ATTACK),
                     ("exec", self.b_id, "--", "sh", "-c", "printf '%s' \"$1\" >&2", "sh",
                      TERMINAL_ATTACK),
                     ("cp", f"{self.b_id}:{TERMINAL_ATTACK}", "-"),
                     ("cp", f"{self.b_id}:{TERMINAL_ATTACK}-missing", "/tmp/sbx-iso-never")):
            code, out, _ = self.cli(*args, tty=True)
            self.assertNotIn(b"\x1b", out, f"sbx {' '.join(args)} on a terminal: {out!r}")
            self.assertNotIn(b"\x07", out, f"sbx {' '.join(args)} on a terminal: {out!r}")
            if args[0] != "cp" or args[2] == "-":
                self.assertIn(b"\\033]0;pwned", out, f"sbx {' '.join(args)}: {out!r}")
        # Errors quoting a name are escaped wherever they go.
        code, out, err = self.cli("cp", f"{self.b_id}:{TERMINAL_ATTACK}-missing",
                                  "/tmp/sbx-iso-never")
        self.assertNotEqual(code, 0)
        self.assertNotIn(b"\x1b", err)
        self.assertIn(b"\\033", err)
        # To a pipe, exec output stays exact; -o json stays exact.
        code, out, err = self.cli("exec", self.b_id, "--", "printf", "%s", TERMINAL_ATTACK)
        self.assertEqual((code, out), (0, TERMINAL_ATTACK.encode()), err)
        code, out, err = self.cli("-o", "json", "ls", self.b_id)
        self.assertEqual(code, 0, err)
        self.assertIn(TERMINAL_ATTACK, [f["path"] for f in json.loads(out)])

    # 3. Seen at 6dad6b0: bubblewrap's init held the daemon's log (a host file) open as
    # its stdout and stderr; `head -c 4M /dev/zero >> /proc/1/fd/2` grew it by 4 MiB, with
    # no limit.
    def test_sandbox_output_to_the_host_is_bounded(self):
        before = metric_sum(self.server, "sbx_sandbox_output_dropped_bytes_total")
        code, out = self.sh("for fd in 1 2; do head -c 8388608 /dev/zero >> /proc/1/fd/$fd; "
                            "echo wrote=$?; done; true", timeout=120)
        self.assertEqual(code, 0, out)
        folder = self.sandbox_dir(self.b)
        total = 0
        for root, dirs, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
        self.assertLess(total, 3 << 20, f"the sandbox's host folder holds {total} bytes: {out}")
        if "wrote=0" in out:
            # What was written and not kept is counted.
            after = metric_sum(self.server, "sbx_sandbox_output_dropped_bytes_total")
            self.assertGreater(after, before, out)
        self.assertEqual(self.sh("echo alive")[1].strip(), "alive")

    # 4. Seen at 6dad6b0: a template mounting / put the masks of the server's files beside
    # the mount (/host + etc/... = /hostetc/...), so a sandbox read them under /host.
    def test_template_mount_holding_server_files_is_refused(self):
        from sbx.v1 import admin_pb2
        hidden = [os.path.join(self.dir, "data"), self.tokens, os.path.join(self.dir, "sb")]
        for source in ("/", self.dir, os.path.join(self.dir, "data"),
                       os.path.join(self.dir, "sb")):
            with self.assertRaises(grpc.RpcError, msg=f"a mount of {source} was accepted") as e:
                self.admin.PutTemplate(admin_pb2.PutTemplateRequest(
                    template=local_template("iso-mount", [(source, "/host")])), metadata=ADMIN,
                    timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                             e.exception.details())
            self.assertTrue(any(h in e.exception.details() for h in hidden),
                            f"{source}: the refusal names no server file: "
                            f"{e.exception.details()}")
        # A folder holding none of them is fine.
        shared = os.path.join(self.dir, "shared")
        os.makedirs(shared, exist_ok=True)
        self.admin.PutTemplate(admin_pb2.PutTemplateRequest(
            template=local_template("iso-mount", [(shared, "/host")])), metadata=ADMIN,
            timeout=30)
        self.admin.DeleteTemplate(admin_pb2.DeleteTemplateRequest(name="iso-mount"),
                                  metadata=ADMIN, timeout=30)

    # 7. Seen at 6dad6b0: a Kubernetes template was accepted by a server without a cluster,
    # and so was a pod template that is not one.
    def test_kubernetes_template_is_checked_at_the_door(self):
        from sbx.v1 import admin_pb2

        def put(pod_template):
            with self.assertRaises(grpc.RpcError, msg=pod_template) as e:
                self.admin.PutTemplate(admin_pb2.PutTemplateRequest(template=admin_pb2.Template(
                    name="iso-kube", runtime="kubernetes",
                    kubernetes=admin_pb2.KubernetesSpec(pod_template=pod_template))),
                    metadata=ADMIN, timeout=30)
            return e.exception
        for bad in ("hello: world", "[1, 2]", '{"spec": {"containers": []}}',
                    '{"spec": {"containers": [{"name": "c"}]}}', "{not json or yaml"):
            err = put(bad)
            self.assertEqual(err.code(), grpc.StatusCode.INVALID_ARGUMENT, f"{bad}: {err.details()}")
            self.assertIn("pod_template", err.details(), bad)
        err = put('{"spec": {"containers": [{"name": "c", "image": "busybox"}]}}')
        self.assertEqual(err.code(), grpc.StatusCode.FAILED_PRECONDITION, err.details())
        self.assertIn("kubernetes", err.details())


class AsRoot(Attacks, unittest.TestCase):
    pass


class AsRootInImage(Attacks, unittest.TestCase):
    image = True


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


class AsNonRootInImage(AsNonRoot):
    image = True


class ServerFiles:
    """The server's own files (data dir with the daemons' key inside, tokens file) in
    folders every sandbox sees (/etc), as an operator may put them; and templates whose
    mounts come to hold them. Run as root and as `nobody` (then the sandboxes share the
    server's host uid, and only the masks stand between them and the files)."""

    run_as = None

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-iso-files-", dir="/tmp")
        os.chmod(cls.dir, 0o755)
        # Under /etc, which every sandbox sees (read-only).
        cls.etc = tempfile.mkdtemp(prefix="sbx-iso-", dir="/etc")
        os.chmod(cls.etc, 0o755)
        cls.servers = []

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers:
            server.stop(signal.SIGKILL)
        sbx_e2e.kill_all_with(cls.dir)
        sbx_e2e.kill_all_with(cls.etc)
        shutil.rmtree(cls.dir, ignore_errors=True)
        shutil.rmtree(cls.etc, ignore_errors=True)

    def folder(self, name, mode=0o755):
        path = os.path.join(self.dir, name)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, mode)
        return path

    def start(self, workdir, tokens, *flags, expect_start=True):
        """A server in `workdir` as `run_as` with `tokens` as its tokens file; returns it,
        or (when expect_start is False) the stderr of its refused start."""
        if self.run_as is not None:
            chown_tree(workdir, self.run_as)
            chown_tree(self.etc, self.run_as)
        if not expect_start:
            p = subprocess.Popen(
                [*setpriv_prefix(self.run_as), SERVER, "--listen=127.0.0.1:0",
                 "--metrics_listen=off", f"--data_dir={workdir}/data",
                 f"--sandbox_root={workdir}/sb", f"--config={CONFIG}",
                 f"--auth_tokens_file={tokens}", *flags],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=workdir)
            try:
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                self.fail("the server started (and kept running)")
            self.assertNotEqual(p.returncode, 0, "the server started")
            return err.decode()
        server = sbx_e2e.Server(SERVER, workdir, CONFIG, auth_tokens=tokens,
                                prefix=setpriv_prefix(self.run_as),
                                extra=[f"--metrics_port_file={workdir}/metrics-port", *flags])
        type(self).servers.append(server)
        return server

    def claim(self, server, claim_id, md=ADMIN):
        from sbx.v1 import claims_pb2
        claims, _ = stubs(server.channel)
        return claims.Claim(claims_pb2.ClaimRequest(pool="default", claim_id=claim_id),
                            metadata=md, timeout=60).claim

    def sh(self, server, claim_id, script, md=ADMIN):
        _, sandboxes = stubs(server.channel)
        return sbx_e2e.sh(sandboxes, claim_id, script, md)

    def assert_hidden(self, server, claim_id, paths, secret):
        """None of `paths` can be read or listed in the sandbox (a masked folder lists
        empty), and `secret` shows nowhere."""
        for path in paths:
            code, out = self.sh(server, claim_id,
                                f"if cat {path} >/dev/null 2>&1; then echo READABLE; fi; "
                                f"cat {path} 2>/dev/null | head -c 300; ls -A {path} 2>/dev/null")
            self.assertNotIn("READABLE", out, f"{path} in the sandbox: {out}")
            self.assertNotIn(secret, out, f"{path} in the sandbox: {out}")
            for name in ("sandbox.key", "tokens", "CURRENT"):  # CURRENT: RocksDB's
                self.assertNotIn(name, out, f"{path} in the sandbox: {out}")

    # 5. Seen at 6dad6b0: a file mask vanished when the tokens file was replaced by rename
    # (the documented reload), and a sandbox read the new file, admin token included.
    def test_files_under_etc_stay_hidden_across_a_rename(self):
        work = self.folder("etc-run")
        auth = os.path.join(self.etc, "auth")
        os.makedirs(auth, exist_ok=True)
        tokens = os.path.join(auth, "tokens")
        with open(tokens, "w") as f:
            f.write(TOKENS)
        os.chmod(tokens, 0o644)  # readable by anyone: only the mask keeps it from sandboxes
        server = self.start(work, tokens)
        self.claim(server, "old")
        self.assert_hidden(server, "old", [tokens, auth], "tok-admin")
        # The reload: a new file renamed over the old one, then SIGHUP.
        with open(tokens + ".new", "w") as f:
            f.write(TOKENS + "tok-new-admin ops2 admin\n")
        os.chmod(tokens + ".new", 0o644)
        if self.run_as is not None:
            chown_tree(self.etc, self.run_as)
        os.rename(tokens + ".new", tokens)
        server.proc.send_signal(signal.SIGHUP)
        sbx_e2e.wait_for(lambda: self._token_works(server, "tok-new-admin"), 30,
                         "the reloaded tokens file")
        self.assert_hidden(server, "old", [tokens, auth], "tok-new-admin")

    def _token_works(self, server, token):
        from sbx.v1 import admin_pb2
        try:
            admin_stub(server.channel).ListPools(admin_pb2.ListPoolsRequest(),
                                                 metadata=(("authorization", f"Bearer {token}"),),
                                                 timeout=10)
            return True
        except grpc.RpcError:
            return False

    # 6. Seen at 6dad6b0: a data dir under /etc (the key inside it) and a tokens file in a
    # 0700 folder under /etc each stopped the server with the advice to install bubblewrap;
    # a file right in /etc (no folder of its own to mask) must be refused with the true
    # reason.
    def test_nested_and_private_files_work_and_bare_files_are_refused_truly(self):
        work = self.folder("private-run")
        data = os.path.join(self.etc, "data")
        private = os.path.join(self.etc, "private")
        os.makedirs(private, exist_ok=True)
        tokens = os.path.join(private, "tokens")
        with open(tokens, "w") as f:
            f.write(TOKENS)
        os.chmod(tokens, 0o600)
        if self.run_as is not None:
            chown_tree(self.etc, self.run_as)
        os.chmod(private, 0o700)
        server = self.start(work, tokens, f"--data_dir={data}")
        self.claim(server, "p")
        self.assert_hidden(server, "p", [tokens, private, data, os.path.join(data, "sandbox.key")],
                           "tok-admin")
        server.stop()
        type(self).servers.remove(server)

        bare = self.etc + "-tokens"
        try:
            with open(bare, "w") as f:
                f.write(TOKENS)
            os.chmod(bare, 0o600)
            if self.run_as is not None:
                chown_tree(bare, self.run_as)
            work = self.folder("bare-run")
            err = self.start(work, bare, expect_start=False)
            self.assertIn(bare, err)
            self.assertIn("/etc", err)
            self.assertNotIn("apt-get install bubblewrap", err)
        finally:
            os.unlink(bare)

    # 6. Seen at 6dad6b0: a template refused because its mount came to hold a server file
    # left PoolStatus.last_error empty; the reason was only in the server's log.
    def test_refused_template_shows_where_the_operator_looks(self):
        from sbx.v1 import admin_pb2
        work = self.folder("refused-run")
        shared = os.path.join(work, "shared")
        os.makedirs(shared, exist_ok=True)
        tokens = os.path.join(work, "tokens")
        with open(tokens, "w") as f:
            f.write(TOKENS)
        os.chmod(tokens, 0o600)
        server = self.start(work, tokens)
        admin = admin_stub(server.channel)
        admin.PutTemplate(admin_pb2.PutTemplateRequest(
            template=local_template("shared", [(shared, "/shared")])), metadata=ADMIN,
            timeout=30)
        admin.PutPool(admin_pb2.PutPoolRequest(pool=admin_pb2.Pool(
            name="shared", template="shared", min_warm=0, max_warm=2)), metadata=ADMIN,
            timeout=30)
        server.stop()
        type(self).servers.remove(server)
        # The operator moves the daemons' key into the mounted folder.
        key = os.path.join(shared, "sandbox.key")
        server = self.start(work, tokens, f"--sandbox_key_file={key}")
        admin = admin_stub(server.channel)
        admin.PutPool(admin_pb2.PutPoolRequest(pool=admin_pb2.Pool(
            name="shared", template="shared", min_warm=1, max_warm=2)), metadata=ADMIN,
            timeout=30)

        def last_error():
            pool = admin.GetPool(admin_pb2.GetPoolRequest(name="shared"), metadata=ADMIN,
                                 timeout=10).pool
            return pool.status.last_error
        err = sbx_e2e.wait_for(last_error, 30, "PoolStatus.last_error")
        self.assertIn(key, err)
        self.assertEqual(admin.GetPool(admin_pb2.GetPoolRequest(name="shared"), metadata=ADMIN,
                                       timeout=10).pool.status.warm, 0)
        p = subprocess.run([CLI, "--server", server.target, "--token", "tok-admin", "pools"],
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(key, p.stdout.decode())
        self.assertGreater(metric_sum(server, "sbx_pool_create_failures_total",
                                      'pool="shared"'), 0)


class ServerFilesAsRoot(ServerFiles, unittest.TestCase):
    pass


class ServerFilesAsNonRoot(ServerFiles, unittest.TestCase):
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
    SERVER, PROTO, CONFIG, CLI = (os.path.abspath(a) for a in sys.argv[1:5])
    del sys.argv[1:5]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main(verbosity=2)
