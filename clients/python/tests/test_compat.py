#!/usr/bin/python3
"""sbx.compat, the surface of upstream agent-sandbox's Python SDK, against a real
sbx-server with local sandboxes: scripts written the way upstream's README and quickstart
show them (only the import changed), run as programs; then each method and error."""

import asyncio
import os
import subprocess
import sys
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import sbx  # noqa: E402
from sbx.compat import (AsyncSandboxClient, SandboxClient,  # noqa: E402
                        SandboxDirectConnectionConfig, SandboxNotFoundError,
                        SandboxNotReadyError, SandboxRequestError,
                        SandboxWarmPoolNotFoundError)
from sbx.compat.models import ExecutionResult, FileEntry  # noqa: E402

SRV = None

# As upstream's python-sdk-quickstart shows it, with warmpool "default" (scripts/run's).
UPSTREAM_SYNC = """
from sbx.compat import SandboxClient

client = SandboxClient()

sandbox = client.create_sandbox(
    warmpool="default",
    namespace="default",
)
try:
    result = sandbox.commands.run("echo 'Hello from Agent Sandbox!'")
    print(result.stdout)
    sandbox.files.write(
        "hello.py",
        'print("Hello, World! Greetings from inside the sandbox.")\\n',
    )
    result = sandbox.commands.run("python3 hello.py")
    print(result.stdout)
    print(result.exit_code)
    print(sandbox.files.read("hello.py").decode().strip())
    print(sandbox.files.exists("hello.py"))
    print([entry.name for entry in sandbox.files.list(".")])
    print(client.list_active_sandboxes() == [("default", sandbox.claim_name)])
finally:
    sandbox.terminate()
print(client.list_active_sandboxes())
"""

# As upstream's README shows the async client.
UPSTREAM_ASYNC = """
import asyncio
from sbx.compat import AsyncSandboxClient
from sbx.compat.models import SandboxDirectConnectionConfig
import os

async def main():
    config = SandboxDirectConnectionConfig(api_url="http://" + os.environ["SBX_SERVER"])

    async with AsyncSandboxClient(connection_config=config) as client:
        sandbox = await client.create_sandbox(
            warmpool="default",
            namespace="default",
        )
        result = await sandbox.commands.run("echo 'Hello from async!'")
        print(result.stdout)

asyncio.run(main())
"""


# harness.LOCAL_CONFIG plus the pools and templates upstream's snippets name, so that
# they run with their names unchanged: "python-sandbox-warmpool" (the README), the
# template "python-sandbox-template" (the filesystem guide's template=, whose pool here
# has another name) and "simple-sandbox-template" (the lifecycle guide's first argument).
CONFIG = harness.LOCAL_CONFIG.replace("pools:\n", """  - name: python-sandbox-template
    runtime: local
    local: {network: false, env: {LANG: C.UTF-8}, pids_limit: 256}
  - name: simple-sandbox-template
    runtime: local
    local: {network: false, env: {LANG: C.UTF-8}, pids_limit: 256}
pools:
  - name: python-sandbox-warmpool
    template: python-sandbox-template
    min_warm: 2
    max_warm: 4
    default_wait: 30s
  - name: simple
    template: simple-sandbox-template
    min_warm: 1
    max_warm: 2
    default_wait: 30s
""", 1)


def setUpModule():
    global SRV
    SRV = harness.Server(config=CONFIG)
    SRV.wait_warm("default", 2)
    SRV.wait_warm("python-sandbox-warmpool", 2)
    SRV.wait_warm("simple", 1)


def tearDownModule():
    SRV.stop()


def run_script(source):
    env = dict(os.environ, SBX_SERVER=SRV.target,
               PYTHONPATH=os.path.join(harness.ROOT, "clients", "python"))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=env,
                          capture_output=True, text=True, timeout=60)


# Upstream's documented snippets as its documentation shows them, with its own import
# (k8s_agent_sandbox) and router address; upstream() changes those and nothing else.
# Sources: the README of clients/python/agentic-sandbox-client ("Usage Examples" 1-4 and
# 6), the site's "Filesystem" and "Agent Sandbox Shutdown Time" (lifecycle) pages; the
# errors and pod-tunnel snippets are written the same way with upstream's documented names.
ROUTER_URL = "http://sandbox-router-svc.agent-sandbox-system.svc.cluster.local:8080"

README_GATEWAY = """
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxGatewayConnectionConfig

# Connect via the GKE Gateway
client = SandboxClient(
    connection_config=SandboxGatewayConnectionConfig(
        gateway_name="external-http-gateway",  # Name of the Gateway resource
    )
)

sandbox = client.create_sandbox(warmpool="python-sandbox-warmpool", namespace="default")
try:
    print(sandbox.commands.run("echo 'Hello from Cloud!'").stdout)
finally:
    sandbox.terminate()
"""

README_LOCAL_TUNNEL = """
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxLocalTunnelConnectionConfig

# Router deployed in the default agent-sandbox-system namespace:
client = SandboxClient(
    connection_config=SandboxLocalTunnelConnectionConfig()
)

# If the router is deployed in a different namespace (e.g. "default"):
other = SandboxClient(
    connection_config=SandboxLocalTunnelConnectionConfig(router_namespace="default")
)

sandbox = client.create_sandbox(warmpool="python-sandbox-warmpool", namespace="default")
try:
    print(sandbox.commands.run("echo 'Hello from Local!'").stdout)
finally:
    sandbox.terminate()
"""

README_IN_CLUSTER = """
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxInClusterConnectionConfig

connection_config = SandboxInClusterConnectionConfig()

client = SandboxClient(connection_config=connection_config)

sandbox = client.create_sandbox(warmpool="python-sandbox-warmpool", namespace="default")
try:
    print(sandbox.commands.run("echo 'Hello from in-cluster!'").stdout)
finally:
    sandbox.terminate()
"""

README_DIRECT = """
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig

client = SandboxClient(
    connection_config=SandboxDirectConnectionConfig(
       api_url="http://sandbox-router-svc.agent-sandbox-system.svc.cluster.local:8080"
    )
)

sandbox = client.create_sandbox(warmpool="python-sandbox-warmpool", namespace="default")
try:
    sandbox.commands.run("ls -la")
finally:
    sandbox.terminate()
print("done")
"""

README_ASYNC_DIRECT = """
import asyncio
from k8s_agent_sandbox import AsyncSandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig

async def main():
    config = SandboxDirectConnectionConfig(
        api_url="http://sandbox-router-svc.agent-sandbox-system.svc.cluster.local:8080"
    )

    async with AsyncSandboxClient(connection_config=config) as client:
        sandbox = await client.create_sandbox(
            warmpool="python-sandbox-warmpool",
            namespace="default",
        )
        result = await sandbox.commands.run("echo 'Hello from async!'")
        print(result.stdout)

asyncio.run(main())
"""

README_ASYNC_IN_CLUSTER = """
import asyncio
from k8s_agent_sandbox import AsyncSandboxClient
from k8s_agent_sandbox.models import SandboxInClusterConnectionConfig

async def main():
    config = SandboxInClusterConnectionConfig()  # default: cluster DNS

    async with AsyncSandboxClient(connection_config=config) as client:
        sandbox = await client.create_sandbox(
            warmpool="python-sandbox-warmpool",
            namespace="default",
        )
        result = await sandbox.commands.run("echo 'Hello from async!'")
        print(result.stdout)

asyncio.run(main())
"""

POD_TUNNEL = """
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxdPodTunnelConnectionConfig

client = SandboxClient(connection_config=SandboxdPodTunnelConnectionConfig())
sandbox = client.create_sandbox(warmpool="python-sandbox-warmpool", namespace="default")
try:
    print(sandbox.commands.run("echo 'Hello from sandboxd!'").stdout)
finally:
    sandbox.terminate()
"""

FILESYSTEM_GUIDE = """
from k8s_agent_sandbox import SandboxClient

client = SandboxClient()
sandbox = client.create_sandbox(template="python-sandbox-template", namespace="default")

sandbox.files.write("/home/user/hello.txt", "Hello from the SDK!")

content = sandbox.files.read("/home/user/hello.txt")
print(content.decode())  # 'Hello from the SDK!'

entries = sandbox.files.list("/home/user")
for entry in entries:
    print(f"{entry.name} ({entry.type}, {entry.size} bytes)")

if sandbox.files.exists("/home/user/hello.txt"):
    print("File exists!")

sandbox.terminate()
"""

LIFECYCLE_GUIDE = """
import time
from k8s_agent_sandbox import SandboxClient

def verify_sandbox_lifecycle():
    client = SandboxClient()
    ttl_seconds = 5

    print(f"Creating sandbox with a {ttl_seconds}-second TTL...")

    # 1. Verify creation and sandbox_ready_timeout
    # If the sandbox doesn't become ready within 15 seconds, this will raise an error.
    sandbox = client.create_sandbox(
        "simple-sandbox-template",
        sandbox_ready_timeout=15,
        shutdown_after_seconds=ttl_seconds
    )

    print("Sandbox created successfully! Running initial command...")
    response = sandbox.commands.run("echo 'Sandbox is alive!'")
    print(f"Output: {response}\\n")

    # 2. Verify shutdown_after_seconds (Auto-deletion)
    wait_time = ttl_seconds + 3  # Add a small buffer for the Kubernetes controller sync
    print(f"Waiting {wait_time} seconds for the cluster to auto-delete the sandbox...")
    time.sleep(wait_time)

    print("Attempting to run a command on the expired sandbox...")
    try:
        # This should fail because the shutdownPolicy: "Delete" was triggered by the cluster
        sandbox.commands.run("echo 'Is anyone there?'")
        print("FAILED: Sandbox is still alive! The shutdown policy did not trigger.")
    except Exception as e:
        print(f"SUCCESS: Sandbox is no longer accessible! The cluster cleaned it up.")
        print(f"   Error received: {e}")

if __name__ == "__main__":
    verify_sandbox_lifecycle()
"""

ERRORS = """
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.exceptions import (SandboxNotFoundError, SandboxNotReadyError,
                                          SandboxRequestError, SandboxWarmPoolNotFoundError)

client = SandboxClient()
try:
    client.create_sandbox(warmpool="no-such-warmpool", namespace="default")
except SandboxWarmPoolNotFoundError as e:
    print("warmpool not found")
try:
    client.create_sandbox(warmpool="empty", namespace="default", sandbox_ready_timeout=1)
except SandboxNotReadyError as e:
    print("not ready")
try:
    client.get_sandbox("sandbox-claim-0000000000000000", namespace="default")
except SandboxNotFoundError as e:
    print("claim not found")
sandbox = client.create_sandbox(warmpool="python-sandbox-warmpool", namespace="default")
try:
    sandbox.files.read("/home/user/missing.txt")
except SandboxRequestError as e:
    print("read failed:", e.status_code)
result = sandbox.commands.run("echo out; exit 3")
print(result.model_dump())
print(result.model_dump_json())
sandbox.terminate()
"""

SNIPPETS = {
    "readme_gateway": README_GATEWAY,
    "readme_local_tunnel": README_LOCAL_TUNNEL,
    "readme_in_cluster": README_IN_CLUSTER,
    "readme_direct": README_DIRECT,
    "readme_async_direct": README_ASYNC_DIRECT,
    "readme_async_in_cluster": README_ASYNC_IN_CLUSTER,
    "pod_tunnel": POD_TUNNEL,
    "filesystem_guide": FILESYSTEM_GUIDE,
    "lifecycle_guide": LIFECYCLE_GUIDE,
    "errors": ERRORS,
}


def upstream(source):
    """The snippet with upstream's import made sbx.compat's and its router address made
    the test server's: the only changes."""
    out = source.replace("k8s_agent_sandbox", "sbx.compat")
    return out.replace(ROUTER_URL, "http://" + SRV.target)


class UpstreamSnippetsTest(unittest.TestCase):
    """Each documented snippet of upstream, changed only by upstream(), as a program."""

    def setUp(self):
        # A snippet that failed may have left its sandbox: not the next one's failure.
        with sbx.Client(SRV.target) as c:
            for claim in c.list_claims(states=["active"]):
                c.release(claim.claim_id)

    def run_snippet(self, name, timeout=60):
        source = SNIPPETS[name]
        changed = [(a, b) for a, b in zip(source.splitlines(), upstream(source).splitlines())
                   if a != b]
        for before, _ in changed:
            self.assertTrue("k8s_agent_sandbox" in before or ROUTER_URL in before, before)
        r = run_script(upstream(source))
        self.assertEqual(r.returncode, 0, f"{name} failed:\n{r.stderr}")
        with sbx.Client(SRV.target) as c:
            self.assertEqual(c.list_claims(states=["active"]), [],
                             f"{name} left its sandbox behind")
        return r.stdout

    def test_readme_gateway(self):
        self.assertEqual(self.run_snippet("readme_gateway"), "Hello from Cloud!\n\n")

    def test_readme_local_tunnel(self):
        self.assertEqual(self.run_snippet("readme_local_tunnel"), "Hello from Local!\n\n")

    def test_readme_in_cluster(self):
        self.assertEqual(self.run_snippet("readme_in_cluster"),
                         "Hello from in-cluster!\n\n")

    def test_readme_direct(self):
        self.assertEqual(self.run_snippet("readme_direct"), "done\n")

    def test_readme_async_direct(self):
        self.assertEqual(self.run_snippet("readme_async_direct"), "Hello from async!\n\n")

    def test_readme_async_in_cluster(self):
        self.assertEqual(self.run_snippet("readme_async_in_cluster"),
                         "Hello from async!\n\n")

    def test_pod_tunnel(self):
        self.assertEqual(self.run_snippet("pod_tunnel"), "Hello from sandboxd!\n\n")

    def test_filesystem_guide(self):
        self.assertEqual(self.run_snippet("filesystem_guide").splitlines(), [
            "Hello from the SDK!", "hello.txt (file, 19 bytes)", "File exists!"])

    def test_lifecycle_guide(self):
        out = self.run_snippet("lifecycle_guide").splitlines()
        self.assertEqual(out[:2], ["Creating sandbox with a 5-second TTL...",
                                   "Sandbox created successfully! Running initial command..."])
        self.assertIn("Output: stdout='Sandbox is alive!\\n' stderr='' exit_code=0", out[2])
        self.assertIn("SUCCESS: Sandbox is no longer accessible! The cluster cleaned it up.",
                      out, "\n".join(out))

    def test_errors(self):
        self.assertEqual(self.run_snippet("errors").splitlines(), [
            "warmpool not found", "not ready", "claim not found", "read failed: NOT_FOUND",
            "{'stdout': 'out\\n', 'stderr': '', 'exit_code': 3}",
            '{"stdout":"out\\n","stderr":"","exit_code":3}'])


# Upstream's public names, as its documentation lists them (the README, the SDK
# reference and the guides of its site), not as its code has them: module, then names.
UPSTREAM_SURFACE = {
    "": ["SandboxClient", "AsyncSandboxClient", "get_metrics", "print_metrics",
         "SandboxError", "SandboxNotFoundError", "SandboxTemplateNotFoundError",
         "SandboxWarmPoolNotFoundError", "SandboxNotReadyError", "SandboxClaimFailedError",
         "SandboxPortForwardError", "SandboxRequestError", "SnapshotNotFoundError"],
    "models": ["ExecutionResult", "FileEntry", "SandboxDirectConnectionConfig",
               "SandboxGatewayConnectionConfig", "SandboxLocalTunnelConnectionConfig",
               "SandboxInClusterConnectionConfig", "SandboxdPodTunnelConnectionConfig",
               "SandboxConnectionConfig", "SandboxTracerConfig"],
    "exceptions": ["SandboxError", "SandboxNotFoundError", "SandboxNotReadyError",
                   "SandboxRequestError", "SandboxWarmPoolNotFoundError",
                   "SandboxTemplateNotFoundError", "SandboxClaimFailedError",
                   "SnapshotNotFoundError"],
}
CLIENT_METHODS = ["create_sandbox", "get_sandbox", "list_active_sandboxes",
                  "list_all_sandboxes", "delete_sandbox", "delete_all"]
SANDBOX_METHODS = ["terminate", "get_pod_name", "get_pod_ip", "get_sandbox_name_hash",
                   "status", "close_connection"]
SANDBOX_ATTRIBUTES = ["commands", "files", "k8s_helper", "claim_name", "sandbox_id",
                      "namespace", "is_active"]
RESULT_METHODS = ["model_dump", "model_dump_json"]


class SurfaceTest(unittest.TestCase):
    def test_upstream_names(self):
        import importlib
        missing = []
        for module, names in UPSTREAM_SURFACE.items():
            m = importlib.import_module("sbx.compat" + ("." + module if module else ""))
            missing += [f"{m.__name__}.{n}" for n in names if not hasattr(m, n)]
        for cls in (SandboxClient, AsyncSandboxClient):
            missing += [f"{cls.__name__}.{n}" for n in CLIENT_METHODS if not hasattr(cls, n)]
        from sbx.compat import AsyncSandbox, Sandbox
        for cls in (Sandbox, AsyncSandbox):
            missing += [f"{cls.__name__}.{n}" for n in SANDBOX_METHODS if not hasattr(cls, n)]
        missing += [f"ExecutionResult.{n}" for n in RESULT_METHODS
                    if not hasattr(ExecutionResult, n)]
        missing += [f"FileEntry.{n}" for n in RESULT_METHODS if not hasattr(FileEntry, n)]
        self.assertEqual(missing, [])
        with SandboxClient(server=SRV.target) as client:
            sb = client.create_sandbox("default")
            missing = [n for n in SANDBOX_ATTRIBUTES if not hasattr(sb, n)]
        self.assertEqual(missing, [])

    def test_model_dump_as_pydantic(self):
        import datetime
        e = FileEntry(name="a", size=1, type="file",
                      modified=datetime.datetime(2026, 1, 2, 3, 4, 5,
                                                 tzinfo=datetime.timezone.utc), mode="0644")
        self.assertEqual(e.model_dump_json(), '{"name":"a","size":1,"type":"file",'
                         '"modified":"2026-01-02T03:04:05Z","mode":"0644"}')
        self.assertEqual(e.model_dump()["modified"].year, 2026)
        self.assertEqual(e.model_dump(mode="json")["modified"], "2026-01-02T03:04:05Z")
        self.assertEqual(e.model_dump(include={"name"}), {"name": "a"})
        r = ExecutionResult(stdout="é\n", exit_code=0)
        self.assertEqual(r.model_dump_json(), '{"stdout":"é\\n","stderr":"","exit_code":0}')
        self.assertEqual(r.model_dump_json(indent=2),
                         '{\n  "stdout": "é\\n",\n  "stderr": "",\n  "exit_code": 0\n}')
        self.assertEqual(str(r), "stdout='é\\n' stderr='' exit_code=0")

    def test_connection_configs(self):
        from sbx.compat import (SandboxGatewayConnectionConfig,
                                SandboxInClusterConnectionConfig,
                                SandboxLocalTunnelConnectionConfig,
                                SandboxdPodTunnelConnectionConfig)
        for config in (SandboxGatewayConnectionConfig(gateway_name="g"),
                       SandboxLocalTunnelConnectionConfig(),
                       SandboxInClusterConnectionConfig(),
                       SandboxdPodTunnelConnectionConfig()):
            with self.subTest(type(config).__name__):
                # Where a client without a config connects: server=, else $SBX_SERVER.
                client = SandboxClient(connection_config=config, server=SRV.target)
                sb = client.create_sandbox("default")
                self.assertEqual(sb.commands.run("echo ok").stdout, "ok\n")
                sb.terminate()
        with self.assertRaises(ValueError):
            SandboxLocalTunnelConnectionConfig(router_namespace="Not_A_Namespace")
        with self.assertRaises(ValueError):
            SandboxdPodTunnelConnectionConfig(grpc_port=0)
        with self.assertRaises(TypeError):
            SandboxClient(connection_config="127.0.0.1:1")

    def test_pod_helpers_and_metrics(self):
        from sbx.compat import get_metrics
        with SandboxClient(server=SRV.target) as client:
            sb = client.create_sandbox("default")
            self.assertEqual(sb.get_pod_name(), sb.sandbox_id)
            self.assertIsNone(sb.get_pod_ip())  # a local sandbox: no pod, no IP
            self.assertIsNone(sb.get_sandbox_name_hash())
            obj = sb.k8s_helper.get_sandbox(sb.sandbox_id, sb.namespace)
            self.assertEqual(obj["metadata"]["name"], sb.sandbox_id)
            self.assertEqual(obj["metadata"]["annotations"]["agents.x-k8s.io/pod-name"],
                             sb.sandbox_id)
            self.assertEqual(obj["status"]["podIPs"], [])
            self.assertIsNone(sb.k8s_helper.get_sandbox("another", sb.namespace))
            sb.commands.run("true")
        text = get_metrics()
        self.assertRegex(text, r'sbx_compat_sandbox_create_total\{outcome="ok"\} [1-9]')
        self.assertRegex(text, r"sbx_compat_command_run_total [1-9]")

        async def run():
            async with AsyncSandboxClient(server=SRV.target) as client:
                sb = await client.create_sandbox("default")
                self.assertEqual(await sb.get_pod_name(), sb.sandbox_id)
                self.assertIsNone(await sb.get_pod_ip())
                self.assertIsNone(await sb.get_sandbox_name_hash())
                obj = await sb.k8s_helper.get_sandbox(sb.sandbox_id, sb.namespace)
                self.assertEqual(obj["metadata"]["name"], sb.sandbox_id)
        asyncio.run(run())

    def test_pod_ip_of_a_kubernetes_endpoint(self):
        from sbx.compat import _shared
        info = sbx.ClaimInfo(claim_id="c", pool="p", owner="", sandbox_id="s", state="ACTIVE",
                             launch_type="WARM", labels={}, created_at=None, expires_at=None,
                             ended_at=None, batch_id="", revision=1, suspended=False,
                             endpoint="10.1.2.3:8080")
        self.assertEqual(_shared.pod_ip(info), "10.1.2.3")
        for endpoint, ip in (("[fd00::1]:8080", "fd00::1"), ("unix:/run/x.sock", None),
                             ("instant:sb-1", None), ("", None)):
            import dataclasses
            self.assertEqual(_shared.pod_ip(dataclasses.replace(info, endpoint=endpoint)), ip)

    def test_home_user_is_the_workspace(self):
        from sbx.compat._shared import workspace_path
        for upstream_path, ours in (("/home/user/a.txt", "a.txt"), ("/home/user", ""),
                                    ("/home/user/", ""), ("/home/user/d/b", "d/b"),
                                    ("/run/sbx/workspace/c", "c"), (".", ""), ("x/y", "x/y"),
                                    ("/home/username/x", "/home/username/x"),
                                    ("/tmp/hello.txt", "/tmp/hello.txt")):
            self.assertEqual(workspace_path(upstream_path), ours, upstream_path)
        with SandboxClient(server=SRV.target) as client:
            sb = client.create_sandbox("default")
            sb.files.write("/home/user/d/x.txt", "x")
            self.assertEqual(sb.commands.run("cat d/x.txt; cat $HOME/d/x.txt").stdout, "xx")
            self.assertEqual([e.name for e in sb.files.list("/home/user/d")], ["x.txt"])
            sb.files.delete("/home/user/d", recursive=True)
            self.assertFalse(sb.files.exists("/home/user/d"))
            # Other absolute paths are the sandbox's own, as upstream's clients expect;
            # /proc and /sys stay refused.
            sb.files.write("/tmp/hello.txt", "x")
            self.assertEqual(sb.commands.run("cat /tmp/hello.txt").stdout, "x")
            with self.assertRaises(SandboxRequestError) as ctx:
                sb.files.write("/proc/self/comm", "x")
            self.assertEqual(ctx.exception.status_code, "INVALID_ARGUMENT")


class UpstreamScriptsTest(unittest.TestCase):
    def active(self):
        with sbx.Client(SRV.target) as c:
            return c.list_claims(states=["active"])

    def test_sync_script(self):
        r = run_script(UPSTREAM_SYNC)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), [
            "Hello from Agent Sandbox!", "",
            "Hello, World! Greetings from inside the sandbox.", "", "0",
            'print("Hello, World! Greetings from inside the sandbox.")', "True",
            "['hello.py']", "True", "[]"])
        self.assertEqual(self.active(), [])

    def test_async_script(self):
        r = run_script(UPSTREAM_ASYNC)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "Hello from async!\n\n")
        self.assertEqual(self.active(), [], "async with did not delete the sandbox")


class CompatMethodsTest(unittest.TestCase):
    def setUp(self):
        self.client = SandboxClient(server=SRV.target)

    def tearDown(self):
        self.client.delete_all()

    def test_lifecycle_and_namespaces(self):
        sb = self.client.create_sandbox("default", namespace="team-a", labels={"app": "x"},
                                        shutdown_after_seconds=600)
        self.assertTrue(sb.claim_name.startswith("sandbox-claim-"))
        self.assertEqual(sb.namespace, "team-a")
        self.assertEqual(sb.status(), ("SandboxReady", ""))
        self.assertEqual(self.client.list_all_sandboxes("team-a"), [sb.claim_name])
        self.assertEqual(self.client.list_all_sandboxes("team-a", label_selector="app=x"),
                         [sb.claim_name])
        self.assertEqual(self.client.list_all_sandboxes("team-a", label_selector="app=y"), [])
        self.assertEqual(self.client.list_all_sandboxes("default"), [])
        self.assertEqual(self.client.get_sandbox_claim_warmpool_name(sb.claim_name, "team-a"),
                         "default")
        # Another client attaches by name; the wrong namespace does not find it.
        other = SandboxClient(connection_config=SandboxDirectConnectionConfig(
            api_url=f"http://{SRV.target}"))
        again = other.get_sandbox(sb.claim_name, namespace="team-a")
        self.assertEqual(again.sandbox_id, sb.sandbox_id)
        self.assertEqual(again.commands.run("echo hi").stdout, "hi\n")
        with self.assertRaises(SandboxNotFoundError):
            other.get_sandbox(sb.claim_name, namespace="team-b")
        name = sb.claim_name
        sb.terminate()
        sb.terminate()  # idempotent
        self.assertIsNone(sb.claim_name)
        self.assertFalse(sb.is_active)
        self.assertEqual(again.status()[0], "SandboxNotFound")
        with self.assertRaises(SandboxNotFoundError):  # ended: a new client does not attach
            SandboxClient(server=SRV.target).get_sandbox(name, namespace="team-a")
        other.delete_sandbox(name, namespace="team-a")  # already gone: no error

    def test_commands_and_files(self):
        sb = self.client.create_sandbox("default")
        r = sb.commands.run("echo out; echo err >&2; exit 4")
        self.assertIsInstance(r, ExecutionResult)
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 4))
        self.assertEqual(sb.commands.run("kill -9 $$").exit_code, 137)
        with self.assertRaises(SandboxRequestError):
            sb.commands.run("sleep 30", timeout=1)
        sb.files.write("d/f.bin", b"\x00\x01")
        self.assertEqual(sb.files.read("d/f.bin"), b"\x00\x01")
        [entry] = sb.files.list("d")
        self.assertIsInstance(entry, FileEntry)
        self.assertEqual((entry.name, entry.size, entry.type, entry.mode),
                         ("f.bin", 2, "file", "0644"))
        self.assertIsNotNone(entry.modified.tzinfo)
        self.assertEqual([e.type for e in sb.files.list(".")], ["directory"])
        self.assertTrue(sb.files.exists("d/f.bin"))
        with self.assertRaises(SandboxRequestError):
            sb.files.delete("d")  # not empty
        sb.files.delete("d", recursive=True)
        self.assertFalse(sb.files.exists("d"))
        with self.assertRaises(SandboxRequestError) as ctx:
            sb.files.read("d/f.bin")
        self.assertEqual(ctx.exception.status_code, "NOT_FOUND")
        self.client.delete_sandbox(sb.claim_name)
        self.assertEqual(self.client.list_active_sandboxes(), [])

    def test_errors(self):
        with self.assertRaises(SandboxWarmPoolNotFoundError):
            self.client.create_sandbox("no-such-pool")
        with self.assertRaises(SandboxNotReadyError):
            self.client.create_sandbox("empty", sandbox_ready_timeout=1)
        with self.assertRaises(SandboxNotFoundError):
            self.client.get_sandbox("sandbox-claim-nope")
        with self.assertRaises(NotImplementedError):
            self.client.create_sandbox("default", pod_labels={"a": "b"})
        with self.assertRaises(ValueError):
            self.client.create_sandbox("default", shutdown_after_seconds=0)
        with self.assertRaises(TypeError):
            SandboxClient(connection_config=object())

    def test_async_methods(self):
        async def run():
            async with AsyncSandboxClient(server=SRV.target) as client:
                sb = await client.create_sandbox("default", namespace="ns1")
                self.assertEqual((await sb.commands.run("echo a")).stdout, "a\n")
                await sb.files.write("x.txt", "x")
                self.assertEqual(await sb.files.read("x.txt"), b"x")
                self.assertTrue(await sb.files.exists("x.txt"))
                self.assertEqual([e.name for e in await sb.files.list("")], ["x.txt"])
                await sb.files.delete("x.txt")
                self.assertFalse(await sb.files.exists("x.txt"))
                self.assertEqual(await client.list_all_sandboxes("ns1"), [sb.claim_name])
                self.assertEqual(await client.list_active_sandboxes(), [("ns1", sb.claim_name)])
                self.assertEqual((await client.get_sandbox(sb.claim_name, "ns1")).sandbox_id,
                                 sb.sandbox_id)
                self.assertEqual(await sb.status(), ("SandboxReady", ""))
                with self.assertRaises(SandboxWarmPoolNotFoundError):
                    await client.create_sandbox("no-such-pool")
                await sb.terminate()
                self.assertEqual(await client.list_active_sandboxes(), [])
        asyncio.run(run())


if __name__ == "__main__":
    harness.main()
