#!/usr/bin/python3
"""Independent Python (grpcio) client test for sbx-server.

Generates Python stubs from proto/sbx/v1/*.proto with grpc_tools.protoc into a temp
dir, starts the server binary on 127.0.0.1:0 (cwd: a temp dir), checks a few calls
through the public API and the standard health service, then the user flow through a
real sandbox: claim one from the pool "default" with a late-bound config, Exec in it
(output, stderr, exit code, stdin), WriteFile / ReadFile / ListFiles, bad input,
Release, and finally stops the server with SIGTERM.

Run it with Debian's interpreter, which has python3-grpcio and python3-grpc-tools:

    /usr/bin/python3 python_client_test.py <path/to/sbx-server> <proto dir> [unittest args]
        [-- server flags...]

or set SBX_SERVER and SBX_PROTO_DIR instead of the two positional arguments. Everything
after "--" is added to the server's command line (tests/clients/CMakeLists.txt passes
--config=scripts/example-config.yaml, which declares the pool "default", and relative
--data_dir / --sandbox_root, which land in the temp dir); SBX_SERVER_FLAGS
(space-separated) is used when there is no "--". The server and every process whose
command line names the temp dir (local sandboxes, which run in their own sessions) are
killed at the end and on any failure; nothing is left running.
"""

import atexit
import importlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import sandbox_procs  # noqa: E402

try:
    import grpc
    from grpc_tools import protoc
except ImportError as e:  # Fail loudly: a missing grpc must never look like a pass.
    sys.exit(f"FAIL: {e}; run this test with /usr/bin/python3 (Debian's python3-grpcio and "
             "python3-grpc-tools), not a python3 without grpc")

PORT_FILE_TIMEOUT_S = 20.0
SHUTDOWN_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 10.0
# A first sandbox of a fresh pool: bubblewrap + sbx-sandboxd start, on a busy machine.
WARM_TIMEOUT_S = 60.0
CLAIM_WAIT_S = 30
EXEC_TIMEOUT_S = 30.0
MIB = 1024 * 1024
KIB = 1024
POOL = "default"  # declared by scripts/example-config.yaml

EXPECTED_METHODS = {
    "claims": {"ClaimService": ["Claim", "ClaimBatch", "Release", "Renew", "GetClaim",
                                "ListClaims", "WatchClaims"]},
    "sandboxes": {"SandboxService": ["Exec", "WriteFile", "ReadFile", "ListFiles",
                                     "Suspend", "Resume", "StartProcess", "ConnectProcess",
                                     "ListProcesses", "SendProcessInput", "CloseProcessInput",
                                     "SignalProcess", "ResizeProcess", "WaitProcess",
                                     "UploadFile", "DownloadFile", "UploadTar", "DownloadTar",
                                     "Stat", "MakeDir", "Move", "Remove", "WatchDir",
                                     "GetPortUrl"]},
    "admin": {"AdminService": ["PutTemplate", "GetTemplate", "ListTemplates",
                               "DeleteTemplate", "PutPool", "GetPool", "ListPools",
                               "DeletePool", "ScalePool", "WatchPools"]},
    "diagnostics": {"DiagnosticsService": ["Ping"]},
}

# (service, method) -> the multi-callable type a stub must expose for it.
STREAMING_SHAPES = {
    ("SandboxService", "Exec"): grpc.StreamStreamMultiCallable,
    ("SandboxService", "StartProcess"): grpc.UnaryStreamMultiCallable,
    ("SandboxService", "ConnectProcess"): grpc.UnaryStreamMultiCallable,
    ("SandboxService", "WaitProcess"): grpc.UnaryUnaryMultiCallable,
    ("SandboxService", "UploadFile"): grpc.StreamUnaryMultiCallable,
    ("SandboxService", "DownloadFile"): grpc.UnaryStreamMultiCallable,
    ("SandboxService", "UploadTar"): grpc.StreamUnaryMultiCallable,
    ("SandboxService", "DownloadTar"): grpc.UnaryStreamMultiCallable,
    ("SandboxService", "WatchDir"): grpc.UnaryStreamMultiCallable,
    ("ClaimService", "WatchClaims"): grpc.UnaryStreamMultiCallable,
    ("AdminService", "WatchPools"): grpc.UnaryStreamMultiCallable,
    ("ClaimService", "Claim"): grpc.UnaryUnaryMultiCallable,
    ("DiagnosticsService", "Ping"): grpc.UnaryUnaryMultiCallable,
}

SERVER = None  # path of sbx-server, set in main
PROTO_DIR = None  # proto root (holds sbx/v1), set in main
STUB_DIR = None  # where main generated the stubs (on sys.path)
EXTRA_SERVER_FLAGS = []


def generate_stubs(proto_dir, out_dir):
    """Runs grpc_tools.protoc on every sbx/v1 proto; returns the list of proto files."""
    files = sorted(
        os.path.join("sbx", "v1", f)
        for f in os.listdir(os.path.join(proto_dir, "sbx", "v1"))
        if f.endswith(".proto"))
    if not files:
        raise RuntimeError(f"no .proto files under {proto_dir}/sbx/v1")
    includes = [f"-I{proto_dir}"]
    # Well-known types (google/protobuf/*.proto): grpc_tools ships them; /usr/include
    # has them on Debian. The first directory that has a file wins, so both are safe.
    wkt_dirs = [os.path.join(os.path.dirname(protoc.__file__), "_proto"), "/usr/include"]
    includes += [f"-I{d}" for d in wkt_dirs
                 if os.path.exists(os.path.join(d, "google", "protobuf", "timestamp.proto"))]
    args = ["grpc_tools.protoc", *includes, f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", *files]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed with {rc}: {' '.join(args)}")
    return files


# Servers to kill if this script is interrupted or exits early.
_LIVE_SERVERS = set()


def processes_naming(path):
    """Pids of live processes (not this one) that name a path below the directory `path` on
    their command line or work in such a folder, and the processes below them (a local
    sandbox's bwrap works in its host folder)."""
    return sandbox_procs.processes_with(os.path.join(path, ""))


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"{pid}: " + f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return f"{pid}: (gone)"


def kill_processes_naming(path):
    """SIGKILLs every process whose command line names `path` (local sandboxes run in
    their own sessions, so killing the server's process group does not reach them)."""
    for _ in range(10):  # A process may fork while we kill; look again.
        pids = processes_naming(path)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


# Temp dirs to clean up (kill what names them, remove them) if this script exits early.
_LIVE_TMP_DIRS = set()


def _kill_live_servers():
    for server in list(_LIVE_SERVERS):
        server.kill()
    for tmp in list(_LIVE_TMP_DIRS):
        kill_processes_naming(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        _LIVE_TMP_DIRS.discard(tmp)


def _on_signal(signum, frame):
    _kill_live_servers()
    print(f"interrupted by signal {signum}; killed the server and its sandboxes",
          file=sys.stderr)
    os._exit(1)


atexit.register(_kill_live_servers)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGHUP, _on_signal)


class ServerProcess:
    """sbx-server started on 127.0.0.1:0; knows its port once it serves."""

    def __init__(self, binary, extra_flags, work_dir):
        self.port_file = os.path.join(work_dir, "port")
        self.log_path = os.path.join(work_dir, "server.log")
        # Absolute, because the server runs in work_dir.
        self.args = [os.path.abspath(binary), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                     f"--port_file={self.port_file}",
                     *extra_flags]
        self._log = open(self.log_path, "wb")
        # cwd is the temp dir so that anything the server writes by default stays there.
        # The server leads its own session (and process group) so that kill() can end
        # everything it started, e.g. local sandboxes.
        self.proc = subprocess.Popen(self.args, cwd=work_dir, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.port = None
        _LIVE_SERVERS.add(self)

    def wait_serving(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise RuntimeError(f"server exited with {rc} before serving; its output:\n"
                                   f"{self.log_tail()}")
            try:
                with open(self.port_file, encoding="utf-8") as f:
                    text = f.read()
            except FileNotFoundError:
                text = None
            if text is not None:
                m = re.fullmatch(r"\s*(\d+)\s*", text)
                if m:  # Otherwise possibly half-written: read again.
                    port = int(m.group(1))
                    if not 0 < port < 65536:
                        raise RuntimeError(f"port file holds an invalid port: {text!r}")
                    self.port = port
                    return port
            time.sleep(0.05)
        raise RuntimeError(f"server did not write {self.port_file} within {timeout_s} s; "
                           f"its output:\n{self.log_tail()}")

    def kill(self):
        """Kills the server's process group, running or not, and reaps the server."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # The group is already empty.
        self.proc.wait()
        self._log.close()
        _LIVE_SERVERS.discard(self)

    def log_tail(self, limit=8192):
        self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace")


class GeneratedStubsTest(unittest.TestCase):
    """The protos compile for Python and define the API's services and methods."""

    def test_services_and_methods(self):
        for module, services in EXPECTED_METHODS.items():
            pb2 = importlib.import_module(f"sbx.v1.{module}_pb2")
            for service, methods in services.items():
                self.assertIn(service, pb2.DESCRIPTOR.services_by_name,
                              f"sbx.v1.{service} missing from {module}.proto")
                have = sorted(pb2.DESCRIPTOR.services_by_name[service].methods_by_name)
                self.assertEqual(have, sorted(methods), f"methods of sbx.v1.{service}")

    def test_streaming_shapes(self):
        channel = grpc.insecure_channel("127.0.0.1:1")  # never connects: no call is made
        try:
            for (service, method), kind in STREAMING_SHAPES.items():
                module = next(m for m, s in EXPECTED_METHODS.items() if service in s)
                grpc_mod = importlib.import_module(f"sbx.v1.{module}_pb2_grpc")
                stub = getattr(grpc_mod, f"{service}Stub")(channel)
                self.assertIsInstance(getattr(stub, method), kind, f"{service}.{method}")
        finally:
            channel.close()

    def test_enum_zero_values_are_unspecified(self):
        for module in ["types", "claims", "sandboxes", "admin"]:
            pb2 = importlib.import_module(f"sbx.v1.{module}_pb2")
            for name, enum in pb2.DESCRIPTOR.enum_types_by_name.items():
                zero = enum.values_by_number[0].name
                self.assertTrue(zero.endswith("_UNSPECIFIED"),
                                f"{name} zero value is {zero}, want *_UNSPECIFIED")


class ServerTest(unittest.TestCase):
    """A real sbx-server process, talked to with generated stubs and raw calls.

    Test methods run in name order; test_9_sigterm stops the server and must stay last.
    """

    @classmethod
    def setUpClass(cls):
        # Under /tmp and short: the sandboxes' unix sockets live below it (< 107 bytes).
        # Real path, as the server makes its folders absolute from its cwd; the clean-up
        # finds the sandboxes by this path in their command lines.
        cls.tmp = os.path.realpath(tempfile.mkdtemp(prefix="sbx-py-client-"))
        _LIVE_TMP_DIRS.add(cls.tmp)
        cls.server = None
        cls.channel = None
        cls.claim_id = None  # the claim of the sandbox flow, once test_4a made it
        try:
            cls.diag_pb2 = importlib.import_module("sbx.v1.diagnostics_pb2")
            cls.diag_grpc = importlib.import_module("sbx.v1.diagnostics_pb2_grpc")
            cls.sandboxes_pb2 = importlib.import_module("sbx.v1.sandboxes_pb2")
            cls.sandboxes_grpc = importlib.import_module("sbx.v1.sandboxes_pb2_grpc")
            cls.claims_pb2 = importlib.import_module("sbx.v1.claims_pb2")
            cls.claims_grpc = importlib.import_module("sbx.v1.claims_pb2_grpc")
            cls.admin_pb2 = importlib.import_module("sbx.v1.admin_pb2")
            cls.admin_grpc = importlib.import_module("sbx.v1.admin_pb2_grpc")
            cls.types_pb2 = importlib.import_module("sbx.v1.types_pb2")
            work = os.path.join(cls.tmp, "server")
            os.mkdir(work)
            cls.server = ServerProcess(SERVER, EXTRA_SERVER_FLAGS, work)
            port = cls.server.wait_serving(PORT_FILE_TIMEOUT_S)
            print(f"\nserver pid {cls.server.proc.pid} serving on 127.0.0.1:{port}",
                  file=sys.stderr)
            cls.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        except BaseException:
            cls._clean_up()
            raise

    @classmethod
    def _clean_up(cls):
        if cls.channel is not None:
            cls.channel.close()
            cls.channel = None
        if cls.server is not None:
            cls.server.kill()
        # Local sandboxes run in their own sessions: the server's process group does not
        # hold them. Their command lines name their folder, which is in cls.tmp.
        kill_processes_naming(cls.tmp)
        shutil.rmtree(cls.tmp, ignore_errors=True)
        _LIVE_TMP_DIRS.discard(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls._clean_up()

    def run(self, result=None):
        # On a failure, show what the server said.
        failures_before = len(result.failures) + len(result.errors) if result else 0
        out = super().run(result)
        if (result and self.server is not None
                and len(result.failures) + len(result.errors) > failures_before):
            print(f"\n---- sbx-server output (tail) ----\n{self.server.log_tail()}"
                  "\n---- end of sbx-server output ----", file=sys.stderr)
        return out

    def test_1_health_serving(self):
        # grpc.health.v1.Health/Check with hand-encoded protobuf: HealthCheckRequest
        # {service: ""} is empty; HealthCheckResponse {status: SERVING (1)} is field 1,
        # varint 1.
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        response = check(b"", timeout=CALL_TIMEOUT_S)
        self.assertEqual(response, b"\x08\x01")

    def test_2_ping_echoes(self):
        stub = self.diag_grpc.DiagnosticsServiceStub(self.channel)
        payload = bytes(range(256)) * 3
        response = stub.Ping(self.diag_pb2.PingRequest(payload=payload), timeout=CALL_TIMEOUT_S)
        self.assertEqual(response.payload, payload)
        self.assertTrue(response.server_version, "server_version is empty")
        self.assertTrue(response.HasField("server_time"), "server_time is unset")
        self.assertGreater(response.server_time.seconds, 0)

    def test_3_ping_oversized_payload_rejected(self):
        stub = self.diag_grpc.DiagnosticsServiceStub(self.channel)
        with self.assertRaises(grpc.RpcError) as ctx:
            stub.Ping(self.diag_pb2.PingRequest(payload=b"x" * (MIB + 1)), timeout=30)
        self.assertIn(ctx.exception.code(),
                      (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED),
                      ctx.exception.details())
        # And the server keeps serving.
        response = stub.Ping(self.diag_pb2.PingRequest(payload=b"still here"),
                             timeout=CALL_TIMEOUT_S)
        self.assertEqual(response.payload, b"still here")

    # ---- The user flow in a real sandbox (pool "default" of scripts/example-config.yaml).
    # test_4a claims; test_4b..test_4e use the claim; test_4f releases it.

    ENV_NAME = "SBX_PY_CLIENT_GREETING"
    ENV_VALUE = "hello from python, caf\u00e9 $HOME 'quoted'"
    CONFIG_PATH = "sbx-py/config.txt"
    CONFIG_CONTENT = b"late-bound file\nsecond line \xe2\x9c\x93\n"

    def require_claim(self):
        if not type(self).claim_id:
            self.fail("no claim: test_4a_claim_with_late_bound_config failed")
        return type(self).claim_id

    def run_exec(self, start, stdin_chunks=(), close_stdin=False, timeout=EXEC_TIMEOUT_S):
        """Runs one Exec call: sends `start`, then the stdin chunks and close_stdin, and
        keeps the client side open until the server's `exit` arrived (so that the
        process's stdin is closed by close_stdin, not by a half-close). Returns the list
        of responses; raises grpc.RpcError for a non-OK status."""
        pb2 = self.sandboxes_pb2
        got_exit = threading.Event()

        def requests():
            yield pb2.ExecRequest(start=start)
            for chunk in stdin_chunks:
                yield pb2.ExecRequest(stdin_chunk=chunk)
            if close_stdin:
                yield pb2.ExecRequest(close_stdin=pb2.ExecCloseStdin())
            # The call ends after `exit` (or on an error, which cancels the iterator).
            got_exit.wait(timeout)

        stub = self.sandboxes_grpc.SandboxServiceStub(self.channel)
        call = stub.Exec(requests(), timeout=timeout)
        responses = []
        try:
            for response in call:
                responses.append(response)
                if response.WhichOneof("kind") == "exit":
                    got_exit.set()
        finally:
            got_exit.set()
        return responses

    def split_exec(self, responses):
        """Checks the message order (started first, exit last and once) and chunk sizes;
        returns (started, stdout bytes, stderr bytes, exit)."""
        kinds = [r.WhichOneof("kind") for r in responses]
        self.assertTrue(kinds, "Exec ended OK without any message")
        self.assertEqual(kinds[0], "started", f"first Exec message is {kinds[0]}: {kinds}")
        self.assertEqual(kinds[-1], "exit", f"last Exec message is {kinds[-1]}")
        self.assertEqual(kinds.count("started"), 1, f"messages: {kinds}")
        self.assertEqual(kinds.count("exit"), 1, f"messages: {kinds}")
        stdout, stderr = bytearray(), bytearray()
        for r in responses[1:-1]:
            kind = r.WhichOneof("kind")
            self.assertIn(kind, ("stdout_chunk", "stderr_chunk"), f"unexpected {kind}")
            chunk = getattr(r, kind)
            self.assertLessEqual(len(chunk), 64 * KIB, f"{kind} of {len(chunk)} bytes")
            (stdout if kind == "stdout_chunk" else stderr).extend(chunk)
        return responses[0].started, bytes(stdout), bytes(stderr), responses[-1].exit

    def test_4a_claim_with_late_bound_config(self):
        admin = self.admin_grpc.AdminServiceStub(self.channel)
        # The pool fills in the background; wait (bounded) for a warm sandbox so that a
        # runtime failure is reported with the pool's last_error, not as a claim timeout.
        deadline = time.monotonic() + WARM_TIMEOUT_S
        status = None
        while True:
            pool = admin.GetPool(self.admin_pb2.GetPoolRequest(name=POOL),
                                 timeout=CALL_TIMEOUT_S).pool
            status = pool.status
            if status.warm >= 1:
                break
            if time.monotonic() > deadline:
                self.fail(f"pool {POOL!r} has no warm sandbox after {WARM_TIMEOUT_S} s: "
                          f"status {status}")
            time.sleep(0.2)

        claims = self.claims_grpc.ClaimServiceStub(self.channel)
        types = self.types_pb2
        claim_id = f"py-client-{os.getpid()}-{int(time.time())}"
        request = self.claims_pb2.ClaimRequest(
            claim_id=claim_id, pool=POOL,
            empty_pool_policy=types.EMPTY_POOL_POLICY_WAIT,
            labels={"client": "python"},
            config=types.SandboxConfig(
                env={self.ENV_NAME: self.ENV_VALUE},
                files=[types.FileSpec(path=self.CONFIG_PATH, content=self.CONFIG_CONTENT,
                                      mode=0o640)]))
        request.wait_timeout.seconds = CLAIM_WAIT_S
        response = claims.Claim(request, timeout=CLAIM_WAIT_S + 5)
        claim = response.claim
        self.assertFalse(response.replayed)
        self.assertEqual(claim.claim_id, claim_id)
        self.assertEqual(claim.pool, POOL)
        self.assertEqual(claim.state, types.CLAIM_STATE_ACTIVE)
        self.assertTrue(claim.sandbox.id, "claim.sandbox.id is empty")
        self.assertEqual(claim.labels["client"], "python")
        type(self).claim_id = claim_id
        print(f"\nclaimed {claim_id}: sandbox {claim.sandbox.id} ({claim.sandbox.endpoint}), "
              f"{types.LaunchType.Name(claim.launch_type)}", file=sys.stderr)

    def test_4b_exec_output_stderr_exit_code(self):
        claim_id = self.require_claim()
        script = (f'printf "%s\\n" "${self.ENV_NAME}"; cat {self.CONFIG_PATH}; '
                  'echo "to stderr" >&2; exit 7')
        start = self.sandboxes_pb2.ExecStart(claim_id=claim_id, argv=["sh", "-c", script])
        started, stdout, stderr, exit_ = self.split_exec(self.run_exec(start))
        self.assertGreater(started.pid, 0)
        self.assertEqual(stdout, self.ENV_VALUE.encode() + b"\n" + self.CONFIG_CONTENT)
        self.assertEqual(stderr, b"to stderr\n")
        self.assertEqual(exit_.WhichOneof("status"), "exit_code", str(exit_))
        self.assertEqual(exit_.exit_code, 7)
        self.assertFalse(exit_.timed_out)
        self.assertFalse(exit_.truncated)
        self.assertEqual(exit_.stdout_bytes, len(stdout))
        self.assertEqual(exit_.stderr_bytes, len(stderr))

    def test_4c_exec_with_stdin(self):
        claim_id = self.require_claim()
        chunks = [b"first line\n", bytes(range(256)), b"z" * (200 * KIB), b"\nlast\n"]
        start = self.sandboxes_pb2.ExecStart(claim_id=claim_id, argv=["cat"],
                                             attach_stdin=True)
        started, stdout, stderr, exit_ = self.split_exec(
            self.run_exec(start, stdin_chunks=chunks, close_stdin=True))
        want = b"".join(chunks)
        self.assertEqual(len(stdout), len(want))
        self.assertEqual(stdout, want)
        self.assertEqual(stderr, b"")
        self.assertEqual(exit_.WhichOneof("status"), "exit_code", str(exit_))
        self.assertEqual(exit_.exit_code, 0)
        self.assertEqual(exit_.stdout_bytes, len(want))

    def test_4d_write_read_list_files(self):
        claim_id = self.require_claim()
        pb2 = self.sandboxes_pb2
        stub = self.sandboxes_grpc.SandboxServiceStub(self.channel)
        content = bytes(range(256)) * 12 + b"end"
        wrote = stub.WriteFile(pb2.WriteFileRequest(claim_id=claim_id, path="out/data.bin",
                                                    content=content, mode=0o600,
                                                    create_parents=True),
                               timeout=CALL_TIMEOUT_S)
        self.assertEqual(wrote.size, len(content))

        read = stub.ReadFile(pb2.ReadFileRequest(claim_id=claim_id, path="out/data.bin"),
                             timeout=CALL_TIMEOUT_S)
        self.assertEqual(read.content, content)
        self.assertEqual(read.size, len(content))
        self.assertTrue(read.eof)
        self.assertEqual(read.mode & 0o7777, 0o600, oct(read.mode))

        part = stub.ReadFile(pb2.ReadFileRequest(claim_id=claim_id, path="out/data.bin",
                                                 offset=10, limit=20), timeout=CALL_TIMEOUT_S)
        self.assertEqual(part.content, content[10:30])
        self.assertEqual(part.size, len(content))
        self.assertFalse(part.eof)

        # The late-bound file is there too, with its mode.
        config = stub.ReadFile(pb2.ReadFileRequest(claim_id=claim_id, path=self.CONFIG_PATH),
                               timeout=CALL_TIMEOUT_S)
        self.assertEqual(config.content, self.CONFIG_CONTENT)
        self.assertEqual(config.mode & 0o7777, 0o640, oct(config.mode))

        # A command sees what WriteFile wrote.
        start = pb2.ExecStart(claim_id=claim_id, argv=["sh", "-c", "wc -c < out/data.bin"])
        _, stdout, _, exit_ = self.split_exec(self.run_exec(start))
        self.assertEqual(exit_.exit_code, 0)
        self.assertEqual(stdout.strip(), str(len(content)).encode())

        listed = stub.ListFiles(pb2.ListFilesRequest(claim_id=claim_id, path="out"),
                                timeout=CALL_TIMEOUT_S)
        self.assertEqual([f.path for f in listed.files], ["out/data.bin"], str(listed))
        entry = listed.files[0]
        self.assertEqual(entry.type, pb2.FILE_TYPE_REGULAR)
        self.assertEqual(entry.size, len(content))
        self.assertEqual(entry.mode & 0o7777, 0o600)
        self.assertEqual(listed.next_page_token, "")

        paths, types_by_path, token = [], {}, ""
        for _ in range(100):  # bounded paging
            page = stub.ListFiles(pb2.ListFilesRequest(claim_id=claim_id, recursive=True,
                                                       page_token=token),
                                  timeout=CALL_TIMEOUT_S)
            for f in page.files:
                paths.append(f.path)
                types_by_path[f.path] = f.type
            token = page.next_page_token
            if not token:
                break
        self.assertEqual(paths, sorted(paths), "ListFiles is not ordered by path")
        for path, kind in [("out", pb2.FILE_TYPE_DIRECTORY),
                           ("out/data.bin", pb2.FILE_TYPE_REGULAR),
                           ("sbx-py", pb2.FILE_TYPE_DIRECTORY),
                           (self.CONFIG_PATH, pb2.FILE_TYPE_REGULAR)]:
            self.assertIn(path, types_by_path, f"recursive listing: {paths}")
            self.assertEqual(types_by_path[path], kind, path)

    def test_4e_bad_input_is_invalid_argument(self):
        claim_id = self.require_claim()
        pb2 = self.sandboxes_pb2
        with self.assertRaises(grpc.RpcError) as ctx:
            self.run_exec(pb2.ExecStart(claim_id=claim_id, argv=[]))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         ctx.exception.details())
        self.assertIn("argv", ctx.exception.details() or "")

        stub = self.sandboxes_grpc.SandboxServiceStub(self.channel)
        for path in ["../etc/passwd", "out/../out/data.bin"]:
            with self.subTest(path=path):
                with self.assertRaises(grpc.RpcError) as ctx:
                    stub.ReadFile(pb2.ReadFileRequest(claim_id=claim_id, path=path),
                                  timeout=CALL_TIMEOUT_S)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                                 ctx.exception.details())
                self.assertTrue((ctx.exception.details() or "").strip(),
                                "status message is empty")

    def test_4f_release_then_exec_is_failed_precondition(self):
        claim_id = self.require_claim()
        claims = self.claims_grpc.ClaimServiceStub(self.channel)
        released = claims.Release(self.claims_pb2.ReleaseRequest(claim_id=claim_id),
                                  timeout=CALL_TIMEOUT_S)
        self.assertEqual(released.claim.state, self.types_pb2.CLAIM_STATE_RELEASED)

        pb2 = self.sandboxes_pb2
        with self.assertRaises(grpc.RpcError) as ctx:
            self.run_exec(pb2.ExecStart(claim_id=claim_id, argv=["true"]))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION,
                         ctx.exception.details())
        self.assertTrue((ctx.exception.details() or "").strip(), "status message is empty")

        stub = self.sandboxes_grpc.SandboxServiceStub(self.channel)
        with self.assertRaises(grpc.RpcError) as ctx:
            stub.ReadFile(pb2.ReadFileRequest(claim_id=claim_id, path=self.CONFIG_PATH),
                          timeout=CALL_TIMEOUT_S)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION,
                         ctx.exception.details())

    def test_9_sigterm_exits_zero(self):
        proc = self.server.proc
        self.assertIsNone(proc.poll(), "server exited before SIGTERM")
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.fail(f"server still running {SHUTDOWN_TIMEOUT_S} s after SIGTERM")
        self.assertEqual(rc, 0, f"server exit status {rc} after SIGTERM (negative: signal)")
        if "--delete_sandboxes_on_exit" in EXTRA_SERVER_FLAGS:
            # The server killed its sandboxes before exiting (no process names the temp
            # dir any more); a moment's grace for the kernel to finish them.
            deadline = time.monotonic() + 5
            while processes_naming(self.tmp) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = processes_naming(self.tmp)
            self.assertEqual(left, [], "processes left running after the server exited with "
                             "--delete_sandboxes_on_exit: " + "; ".join(
                                 _cmdline(pid) for pid in left))


def main():
    global SERVER, PROTO_DIR, STUB_DIR, EXTRA_SERVER_FLAGS
    args = sys.argv[1:]
    server_flags = None
    if "--" in args:
        server_flags = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    positional = []
    while args and not args[0].startswith("-") and len(positional) < 2:
        positional.append(args.pop(0))
    SERVER = positional[0] if len(positional) > 0 else os.environ.get("SBX_SERVER")
    PROTO_DIR = positional[1] if len(positional) > 1 else os.environ.get("SBX_PROTO_DIR")
    if not SERVER or not PROTO_DIR:
        sys.exit("usage: /usr/bin/python3 python_client_test.py <sbx-server> <proto dir> "
                 "[unittest args] [-- server flags...]")
    if not os.access(SERVER, os.X_OK):
        sys.exit(f"FAIL: server binary {SERVER!r} does not exist or is not executable")
    if not os.path.isdir(os.path.join(PROTO_DIR, "sbx", "v1")):
        sys.exit(f"FAIL: proto dir {PROTO_DIR!r} has no sbx/v1 subdirectory")
    EXTRA_SERVER_FLAGS = (server_flags if server_flags is not None
                          else os.environ.get("SBX_SERVER_FLAGS", "").split())

    STUB_DIR = tempfile.mkdtemp(prefix="sbx-py-stubs-")
    try:
        try:
            generate_stubs(PROTO_DIR, STUB_DIR)
        except Exception as e:  # A proto that does not compile is a failure, not a skip.
            print(f"FAIL: generating Python stubs: {e}", file=sys.stderr)
            return 1
        sys.path.insert(0, STUB_DIR)
        program = unittest.main(argv=[sys.argv[0], "-v", *args], exit=False)
        return 0 if program.result.wasSuccessful() else 1
    finally:
        shutil.rmtree(STUB_DIR, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
