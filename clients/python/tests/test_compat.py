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


def setUpModule():
    global SRV
    SRV = harness.Server()
    SRV.wait_warm("default", 2)


def tearDownModule():
    SRV.stop()


def run_script(source):
    env = dict(os.environ, SBX_SERVER=SRV.target,
               PYTHONPATH=os.path.join(harness.ROOT, "clients", "python"))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=env,
                          capture_output=True, text=True, timeout=60)


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
