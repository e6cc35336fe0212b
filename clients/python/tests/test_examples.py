#!/usr/bin/python3
"""The examples in clients/python/examples run against a real sbx-server (local
sandboxes, pool "default" as in scripts/run); and the package installs offline with
Debian's pip and setuptools, stubs generated at build time, and works from there."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PKG = os.path.join(harness.ROOT, "clients", "python")
SRV = None


def setUpModule():
    global SRV
    # With a port proxy, for background_server.py's URL.
    SRV = harness.Server(extra=["--proxy_listen=127.0.0.1:0"])
    SRV.wait_warm("default", 2)


def tearDownModule():
    SRV.stop()


def run(path, pythonpath, extra_env=None):
    env = dict(os.environ, SBX_SERVER=SRV.target, PYTHONPATH=pythonpath, **(extra_env or {}))
    env.pop("SBX_TOKEN", None)
    return subprocess.run([sys.executable, path], env=env, capture_output=True, text=True,
                          timeout=90, cwd=tempfile.gettempdir())


class ExamplesTest(unittest.TestCase):
    def example(self, name):
        r = run(os.path.join(PKG, "examples", name), PKG)
        self.assertEqual(r.returncode, 0, f"{name} failed:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def test_every_example_is_tested(self):
        self.assertEqual(sorted(os.path.basename(p) for p in
                                glob.glob(os.path.join(PKG, "examples", "*.py"))),
                         ["async_fanout.py", "background_server.py", "files_and_streams.py",
                          "quickstart.py", "rl_fork.py", "upstream_compat.py"])
        # rl_fork.py needs an image pool (root): tests/test_rl_fork_example.py runs it.

    def test_quickstart(self):
        with open(os.path.join(PKG, "examples", "quickstart.py")) as f:
            self.assertLessEqual(len([l for l in f if l.strip()]), 5)
        out = self.example("quickstart.py").splitlines()
        self.assertRegex(out[0], r"^hello from \S+$")
        self.assertEqual(out[1], "Linux x86_64")

    def test_files_and_streams(self):
        out = self.example("files_and_streams.py")
        self.assertIn("seed=7\n42\n", out)
        self.assertIn("['job/input.txt', 'job/main.sh']", out)
        self.assertIn("got a\n", out)
        self.assertIn("exit 0\nkilled by signal 15\n", out)

    def test_async_fanout(self):
        out = self.example("async_fanout.py").splitlines()
        self.assertEqual(sorted(l.split()[0] for l in out[:4]), ["0", "1", "2", "3"])
        self.assertRegex(out[4], r"^batch \S+: [1-8] of 8 sandboxes$")

    def test_background_server(self):
        out = self.example("background_server.py")
        self.assertEqual(out, "[('web', True)]\n"
                              "200 <h1>hello from a sandbox</h1>\n"
                              "web server stopped: -15\n")

    def test_upstream_compat(self):
        out = self.example("upstream_compat.py")
        self.assertEqual(out, "Hello, World! Greetings from inside the sandbox.\n"
                              "True ['hello.py']\n")


class InstallTest(unittest.TestCase):
    def test_pip_install_offline_then_run_from_the_install(self):
        tmp = tempfile.mkdtemp(prefix="sbxpy-pip-")
        try:
            # A copy, so that the build leaves nothing in the source tree; SBX_PROTO_DIR
            # tells setup.py where the protos are.
            src = os.path.join(tmp, "src")
            shutil.copytree(PKG, src, ignore=shutil.ignore_patterns(
                "__pycache__", "build", "*.egg-info", "tests"))
            site = os.path.join(tmp, "site")
            env = dict(os.environ, SBX_PROTO_DIR=os.path.join(harness.ROOT, "proto"),
                       PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                                "--target", site, src], env=env, capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for name in ("claims_pb2.py", "sandboxes_pb2_grpc.py", "types_pb2.py"):
                self.assertTrue(os.path.exists(os.path.join(site, "sbx", "v1", name)), name)
            self.assertTrue(os.path.exists(os.path.join(site, "sbx", "py.typed")))
            # Run the quickstart with only the installed package on the path (no proto/,
            # no grpc_tools needed: SBX_PROTO_DIR points nowhere).
            r = run(os.path.join(PKG, "examples", "quickstart.py"), site,
                    {"SBX_PROTO_DIR": "/nonexistent", "SBX_PROTO_GEN_DIR": "/nonexistent"})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith("hello from "), r.stdout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    harness.main()
