"""Shared helpers of the end-to-end tests: generated sbx.v1 stubs, a real sbx-server
process on loopback with the local runtime, process checks, and ServerTestCase (a test class
around one server: its folder, tokens, stubs, the calls of claims and snapshots, teardown).

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
import unittest

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


# --- The shared prelude of the tests of one server per test class (issue 39) ---


def bearer(token):
    """The call metadata of a bearer token."""
    return [("authorization", f"Bearer {token}")]


def claim_id_of(claim):
    """The id of a claim given as its id or as a Claim message."""
    return claim if isinstance(claim, str) else claim.claim_id


def pool_config(*pools, wait="30s"):
    """The YAML of --config with, for each (name, local, min_warm, max_warm), a local
    template of that name with the `local` options (a dict: str values are written quoted,
    others as they are) and a pool of it that waits up to `wait` for a sandbox when empty."""
    lines = ["templates:"]
    for name, local, _, _ in pools:
        lines += [f"  - name: {name}", "    runtime: local", "    local:"]
        for key, value in local.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, str):
                value = f'"{value}"'
            lines.append(f"      {key}: {value}")
    lines.append("pools:")
    for name, _, min_warm, max_warm in pools:
        lines += [f"  - name: {name}", f"    template: {name}", f"    min_warm: {min_warm}",
                  f"    max_warm: {max_warm}", "    empty_pool_policy: wait",
                  f"    default_wait: {wait}"]
    return "\n".join(lines) + "\n"


# The pools of the snapshot, reset and fork tests: sandboxes of a busybox image (its
# reference replaces {plain}), with 256 MiB for the workspace and for the layer, and
# sandboxes of the host's root without network.
IMG_POOL = ("img", {"image": "{plain}", "workspace_size_bytes": 268435456,
                    "layer_size_bytes": 268435456}, 2, 4)
HOST_POOL = ("host", {"network": False}, 1, 2)
# Two tenants' tokens (ServerTestCase.TOKENS) and their call metadata.
TWO_TENANTS = "token-a tenant-a\ntoken-b tenant-b\n"
A = bearer("token-a")
B = bearer("token-b")
# The workspace folder inside a local sandbox.
WS = "/run/sbx/workspace"


def busybox_image(out_dir, env=("PATH=/bin",)):
    """tests/images' busybox image (built here, offline) in `out_dir`; its reference."""
    images = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "images")
    if images not in sys.path:
        sys.path.insert(0, images)
    import test_images
    return test_images.busybox_image(out_dir, config={"Env": list(env)})


def stop_and_clean(server, workdir):
    """Stops `server` (saying so when it had exited by itself), kills every process left
    with `workdir` on its command line (sandboxes it ran) and removes `workdir`."""
    if server is not None:
        if server.proc.poll() is not None:
            print("sbx-server exited:", server.proc.returncode, server.logtext(),
                  file=sys.stderr)
        server.stop(signal.SIGTERM)
    kill_all_with(workdir)
    shutil.rmtree(workdir, ignore_errors=True)


def main_args(doc, count, root_reason=None):
    """The test program's `count` leading arguments (paths, made absolute: the server
    first, the proto folder second), removed from sys.argv for unittest, with the stubs generated. Exits with `doc`
    when they are missing, and with SKIP (status 0) unless root when `root_reason` says why
    root is needed."""
    if len(sys.argv) < count + 1:
        sys.exit(doc)
    args = [os.path.abspath(a) for a in sys.argv[1:count + 1]]
    del sys.argv[1:count + 1]
    if root_reason is not None and os.geteuid() != 0:
        print(f"SKIP: {root_reason}")
        sys.exit(0)
    generate_stubs(args[1])
    return args


def run(case, doc, names, root_reason=None, verbosity=2):
    """A test program's main: main_args, whose values become the module globals `names`
    (and `case`.SERVER the first), then unittest.main."""
    values = main_args(doc, len(names), root_reason)
    module = sys.modules[case.__module__]
    for name, value in zip(names, values):
        setattr(module, name, value)
    case.SERVER = values[0]
    unittest.main(module=module, verbosity=verbosity)


class ServerTestCase(unittest.TestCase):
    """A test class around one sbx-server in a folder of its own: the stubs of its services
    (claims, sandboxes, snaps, admin) and the calls the tests make through them. A subclass
    sets SERVER (main_args) and, in its setUpClass, calls make_workdir, then start_server;
    tearDownClass stops the server, kills the sandboxes and removes the folder."""

    SERVER = None  # the sbx-server binary
    TOKENS = None  # the text of --auth_tokens_file; None: --insecure_no_auth
    MD = None  # the metadata the helpers send when not given any
    server = None
    dir = None
    seq = 0

    @classmethod
    def make_workdir(cls, prefix, mode=None):
        cls.dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        if mode is not None:
            os.chmod(cls.dir, mode)
        cls.tokens = cls.write_file("tokens", cls.TOKENS) if cls.TOKENS is not None else None
        return cls.dir

    @classmethod
    def write_file(cls, name, text):
        path = os.path.join(cls.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    @classmethod
    def start_server(cls, config, extra=(), **kwargs):
        """Starts the server (again, after a stop, with the same arguments when none are
        given) and makes the stubs on its channel."""
        if config is None:
            config, extra, kwargs = cls._server_args
        cls._server_args = (config, extra, kwargs)
        cls.server = Server(cls.SERVER, cls.dir, config, extra, auth_tokens=cls.tokens, **kwargs)
        from sbx.v1 import admin_pb2_grpc, claims_pb2_grpc, sandboxes_pb2_grpc, snapshots_pb2_grpc
        ch = cls.server.channel
        cls.claims = claims_pb2_grpc.ClaimServiceStub(ch)
        cls.sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(ch)
        cls.snaps = snapshots_pb2_grpc.SnapshotsStub(ch)
        cls.admin = admin_pb2_grpc.AdminServiceStub(ch)

    @classmethod
    def restart_server(cls, sig=signal.SIGKILL):
        """Stops the server with `sig` and starts it again on the same folder."""
        cls.server.stop(sig)
        cls.start_server(None)

    @classmethod
    def tearDownClass(cls):
        stop_and_clean(cls.server, cls.dir)

    def md(self, md):
        return self.MD if md is None else md

    # --- claims ---

    def claim(self, pool="img", md=None, env=None, claim_id=""):
        from sbx.v1 import claims_pb2, types_pb2
        req = claims_pb2.ClaimRequest(pool=pool, claim_id=claim_id)
        if env:
            req.config.CopyFrom(types_pb2.SandboxConfig(env=env))
        return self.claims.Claim(req, metadata=self.md(md), timeout=60).claim

    def claim_released_at_cleanup(self, pool, md=None):
        """A claim whose id names the test, released (if still held) when the test ends."""
        type(self).seq += 1
        c = ServerTestCase.claim(self, pool, md,
                                 claim_id=f"{self.id().split('.')[-1]}-{self.seq}")
        self.addCleanup(ServerTestCase.release, self, c.claim_id, md, True)
        return c

    def get_claim(self, claim, md=None):
        from sbx.v1 import claims_pb2
        return self.claims.GetClaim(claims_pb2.GetClaimRequest(claim_id=claim_id_of(claim)),
                                    metadata=self.md(md), timeout=10).claim

    def release(self, claim, md=None, quiet=False):
        """Releases the claim; with `quiet`, an error (released already) is ignored."""
        from sbx.v1 import claims_pb2
        try:
            self.claims.Release(claims_pb2.ReleaseRequest(claim_id=claim_id_of(claim)),
                                metadata=self.md(md), timeout=30)
        except grpc.RpcError:
            if not quiet:
                raise

    def sh(self, claim, script, md=None, timeout=60):
        return sh(self.sandboxes, claim_id_of(claim), script, metadata=self.md(md),
                  timeout=timeout)

    # --- snapshots ---

    def create_snapshot(self, claim, name="", labels=None, md=None, timeout=120):
        from sbx.v1 import snapshots_pb2
        return self.snaps.CreateSnapshot(snapshots_pb2.CreateSnapshotRequest(
            claim_id=claim_id_of(claim), name=name, labels=labels or {}),
            metadata=self.md(md), timeout=timeout)

    def snapshot(self, claim, name="", labels=None, md=None, timeout=120):
        return self.create_snapshot(claim, name, labels, md, timeout).snapshot

    def get_snapshot(self, snap_id, md=None):
        from sbx.v1 import snapshots_pb2
        return self.snaps.GetSnapshot(snapshots_pb2.GetSnapshotRequest(snapshot_id=snap_id),
                                      metadata=self.md(md), timeout=10).snapshot

    def list_snapshots(self, md=None, **labels):
        from sbx.v1 import snapshots_pb2
        return self.snaps.ListSnapshots(snapshots_pb2.ListSnapshotsRequest(label_selector=labels),
                                        metadata=self.md(md), timeout=10)

    def delete_snapshot(self, snap_id, md=None):
        from sbx.v1 import snapshots_pb2
        self.snaps.DeleteSnapshot(snapshots_pb2.DeleteSnapshotRequest(snapshot_id=snap_id),
                                  metadata=self.md(md), timeout=30)

    def reset(self, claim, snap_id, md=None, timeout=60):
        from sbx.v1 import snapshots_pb2
        self.snaps.Reset(snapshots_pb2.ResetRequest(claim_id=claim_id_of(claim),
                                                    snapshot_id=snap_id),
                         metadata=self.md(md), timeout=timeout)

    # --- checks ---

    def assert_code(self, code, fn, *args, **kwargs):
        """Calls fn(*args, **kwargs), which must fail with gRPC status `code`; its details."""
        with self.assertRaises(grpc.RpcError) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        return cm.exception.details()
