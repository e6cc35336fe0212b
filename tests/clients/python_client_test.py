#!/usr/bin/python3
"""Independent Python (grpcio) client test for sbx-server.

Generates Python stubs from proto/sbx/v1/*.proto with grpc_tools.protoc into a temp
dir, starts the server binary on 127.0.0.1:0, checks a few calls through the public API
and the standard health service, then stops the server with SIGTERM.

Run it with Debian's interpreter, which has python3-grpcio and python3-grpc-tools:

    /usr/bin/python3 python_client_test.py <path/to/sbx-server> <proto dir> [unittest args]

or set SBX_SERVER and SBX_PROTO_DIR instead of the two positional arguments.
SBX_SERVER_FLAGS (space-separated) adds flags to the server's command line. The server
is killed on any failure; nothing is left running.
"""

import atexit
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import grpc
    from grpc_tools import protoc
except ImportError as e:  # Fail loudly: a missing grpc must never look like a pass.
    sys.exit(f"FAIL: {e}; run this test with /usr/bin/python3 (Debian's python3-grpcio and "
             "python3-grpc-tools), not a python3 without grpc")

PORT_FILE_TIMEOUT_S = 20.0
SHUTDOWN_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 10.0
MIB = 1024 * 1024

EXPECTED_METHODS = {
    "claims": {"ClaimService": ["Claim", "ClaimBatch", "Release", "Renew", "GetClaim",
                                "ListClaims", "WatchClaims"]},
    "sandboxes": {"SandboxService": ["Exec", "WriteFile", "ReadFile", "ListFiles",
                                     "Suspend", "Resume"]},
    "admin": {"AdminService": ["PutTemplate", "GetTemplate", "ListTemplates",
                               "DeleteTemplate", "PutPool", "GetPool", "ListPools",
                               "DeletePool", "ScalePool", "WatchPools"]},
    "diagnostics": {"DiagnosticsService": ["Ping"]},
}

# (service, method) -> the multi-callable type a stub must expose for it.
STREAMING_SHAPES = {
    ("SandboxService", "Exec"): grpc.StreamStreamMultiCallable,
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


def _kill_live_servers():
    for server in list(_LIVE_SERVERS):
        server.kill()


def _on_signal(signum, frame):
    _kill_live_servers()
    print(f"interrupted by signal {signum}; killed the server", file=sys.stderr)
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
        self.args = [os.path.abspath(binary), "--listen=127.0.0.1:0", f"--port_file={self.port_file}",
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
        cls.tmp = tempfile.mkdtemp(prefix="sbx-py-client-")
        cls.server = None
        cls.channel = None
        try:
            cls.diag_pb2 = importlib.import_module("sbx.v1.diagnostics_pb2")
            cls.diag_grpc = importlib.import_module("sbx.v1.diagnostics_pb2_grpc")
            cls.sandboxes_pb2 = importlib.import_module("sbx.v1.sandboxes_pb2")
            cls.sandboxes_grpc = importlib.import_module("sbx.v1.sandboxes_pb2_grpc")
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
        shutil.rmtree(cls.tmp, ignore_errors=True)

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

    def test_4_read_file_unimplemented(self):
        stub = self.sandboxes_grpc.SandboxServiceStub(self.channel)
        request = self.sandboxes_pb2.ReadFileRequest(claim_id="python-client-test-1",
                                                     path="main.py")
        with self.assertRaises(grpc.RpcError) as ctx:
            stub.ReadFile(request, timeout=CALL_TIMEOUT_S)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNIMPLEMENTED,
                         ctx.exception.details())
        self.assertTrue((ctx.exception.details() or "").strip(), "status message is empty")

    def test_9_sigterm_exits_zero(self):
        proc = self.server.proc
        self.assertIsNone(proc.poll(), "server exited before SIGTERM")
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.fail(f"server still running {SHUTDOWN_TIMEOUT_S} s after SIGTERM")
        self.assertEqual(rc, 0, f"server exit status {rc} after SIGTERM (negative: signal)")


def main():
    global SERVER, PROTO_DIR, STUB_DIR, EXTRA_SERVER_FLAGS
    args = sys.argv[1:]
    positional = []
    while args and not args[0].startswith("-") and len(positional) < 2:
        positional.append(args.pop(0))
    SERVER = positional[0] if len(positional) > 0 else os.environ.get("SBX_SERVER")
    PROTO_DIR = positional[1] if len(positional) > 1 else os.environ.get("SBX_PROTO_DIR")
    if not SERVER or not PROTO_DIR:
        sys.exit("usage: /usr/bin/python3 python_client_test.py <sbx-server> <proto dir> "
                 "[unittest args]")
    if not os.access(SERVER, os.X_OK):
        sys.exit(f"FAIL: server binary {SERVER!r} does not exist or is not executable")
    if not os.path.isdir(os.path.join(PROTO_DIR, "sbx", "v1")):
        sys.exit(f"FAIL: proto dir {PROTO_DIR!r} has no sbx/v1 subdirectory")
    EXTRA_SERVER_FLAGS = os.environ.get("SBX_SERVER_FLAGS", "").split()

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
