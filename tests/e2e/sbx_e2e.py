"""Shared helpers of the end-to-end tests: generated sbx.v1 stubs, a real sbx-server
process on loopback with the local runtime, and process checks.

Every server runs in a temporary folder of its own, which the test removes; processes a
test starts are killed by it.
"""

import atexit
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc

from sandbox_procs import processes_with  # noqa: F401  (used by the tests)
from grpc_tools import protoc

STUBS = tempfile.mkdtemp(prefix="sbx-e2e-stubs-")
atexit.register(shutil.rmtree, STUBS, True)


def generate_stubs(proto_dir):
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = [os.path.relpath(f, proto_dir) for f in
             glob.glob(os.path.join(proto_dir, "sbx", "v1", "*.proto")) +
             glob.glob(os.path.join(proto_dir, "sbx", "sandboxd", "v1", "*.proto"))]
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"-I{wkt}", f"--python_out={STUBS}",
                      f"--grpc_python_out={STUBS}"] + files)
    if rc != 0:
        sys.exit("cannot generate stubs")
    sys.path.insert(0, STUBS)


class Server:
    """sbx-server on 127.0.0.1 with an ephemeral port, its data and sandboxes in `workdir`."""

    def __init__(self, binary, workdir, config, extra=(), auth_tokens=None, prefix=()):
        self.workdir = workdir
        self.port_file = os.path.join(workdir, "port")
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.log = open(os.path.join(workdir, "server.log"), "a")
        auth = [f"--auth_tokens_file={auth_tokens}"] if auth_tokens else ["--insecure_no_auth"]
        self.proc = subprocess.Popen(
            [*prefix, binary, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", f"--port_file={self.port_file}",
             f"--data_dir={workdir}/data", f"--sandbox_root={workdir}/sb", f"--config={config}",
             *auth, *extra],
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
            return f.read()[-4000:]

    def stop(self, sig=signal.SIGTERM):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)
        self.log.close()
        return self.proc.returncode


def kill_all_with(text):
    for pid in processes_with(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_for(predicate, timeout, what, interval=0.05):
    """Calls `predicate` every `interval` s until it returns something true (returned);
    fails after `timeout` s."""
    deadline = time.time() + timeout
    value = None
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {value!r})")


def sh(sandboxes, claim_id, script, metadata=None, timeout=60):
    """Runs `script` with /bin/sh in the claim's sandbox through SandboxService.Exec;
    returns (exit code or None, stdout and stderr as one text)."""
    from sbx.v1 import sandboxes_pb2
    start = sandboxes_pb2.ExecStart(claim_id=claim_id, argv=["/bin/sh", "-c", script])
    out, code = b"", None
    for r in sandboxes.Exec(iter([sandboxes_pb2.ExecRequest(start=start)]), metadata=metadata,
                            timeout=timeout):
        kind = r.WhichOneof("kind")
        if kind in ("stdout_chunk", "stderr_chunk"):
            out += getattr(r, kind)
        elif kind == "exit":
            code = r.exit.exit_code
    return code, out.decode(errors="replace")


def setpriv_prefix(user):
    """The command prefix that runs a program as `user`, without groups or capabilities
    (None: as this process)."""
    if user is None:
        return ()
    pw = pwd.getpwnam(user)
    return ("setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all")


def chown_tree(path, user, skip=()):
    """Gives `path` and everything below it (links themselves, not followed) to `user`,
    except the paths in `skip`."""
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            if os.path.join(root, name) not in skip:
                os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid, follow_symlinks=False)
