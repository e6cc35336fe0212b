#!/usr/bin/python3
"""sbx-server's command line: bad flags and bad stores are refused with a clear message.

Usage: server_cli_test.py PATH_TO_SBX_SERVER
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SERVER = None


def run(args, cwd, timeout=20):
    return subprocess.run([SERVER] + args, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def start(args, cwd):
    port_file = os.path.join(cwd, "port")
    if os.path.exists(port_file):
        os.remove(port_file)
    p = subprocess.Popen([SERVER, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                          f"--port_file={port_file}"] + args,
                         cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while time.time() < deadline and not os.path.exists(port_file):
        if p.poll() is not None:
            break
        time.sleep(0.05)
    return p


class ServerCliTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sbx-cli-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_unknown_flag_is_refused(self):
        r = run(["--no_such_flag"], self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--no_such_flag", r.stderr + r.stdout)

    def test_bad_listen_address(self):
        r = run(["--listen=nonsense"], self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn('listen address "nonsense"', r.stderr)

    def test_a_repeated_flag_takes_its_last_value(self):
        data = os.path.join(self.dir, "data")
        p = start([f"--data_dir={data}", "--durability=sync", "--durability=buffered"],
                  self.dir)
        self.assertIsNone(p.poll())
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("durability buffered", err)

    def test_bad_durability(self):
        r = run(["--durability=sometimes"], self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn('"sometimes"', r.stderr)

    def test_sandbox_key_secret_needs_a_cluster_and_excludes_the_key_file(self):
        data = os.path.join(self.dir, "data")
        r = run([f"--data_dir={data}", "--sandbox_key_secret=sbx-key"], self.dir)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn('--sandbox_key_secret "sbx-key" needs a cluster', r.stderr)
        r = run([f"--data_dir={data}", "--sandbox_key_secret=sbx-key",
                 "--kubeconfig=/nonexistent", f"--sandbox_key_file={self.dir}/k"], self.dir)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--sandbox_key_secret and --sandbox_key_file", r.stderr)

    def test_refuses_a_directory_that_is_not_a_store(self):
        data = os.path.join(self.dir, "data")
        os.makedirs(data)
        with open(os.path.join(data, "notes.txt"), "w") as f:
            f.write("not a database")
        r = run([f"--data_dir={data}", "--listen=127.0.0.1:0"], self.dir)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(data, r.stderr)
        # Nothing was created or removed in it.
        self.assertEqual(os.listdir(data), ["notes.txt"])

    def test_refuses_a_corrupt_store_and_never_starts_empty(self):
        data = os.path.join(self.dir, "data")
        p = start([f"--data_dir={data}"], self.dir)
        self.assertIsNone(p.poll(), p.stderr.read() if p.poll() is not None else "")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("durability sync", err)
        # Corrupt the MANIFEST named by CURRENT.
        with open(os.path.join(data, "CURRENT")) as f:
            manifest = os.path.join(data, f.read().strip())
        with open(manifest, "r+b") as f:
            f.seek(0)
            f.write(b"\xff" * 64)
        r = run([f"--data_dir={data}", "--listen=127.0.0.1:0"], self.dir)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(data, r.stderr)
        self.assertNotIn("serving on port", r.stderr)

    def test_sigterm_stops_cleanly_and_restart_reuses_the_store(self):
        data = os.path.join(self.dir, "data")
        for _ in range(2):
            p = start([f"--data_dir={data}", "--durability=buffered"], self.dir)
            self.assertIsNone(p.poll())
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=20)
            self.assertEqual(p.returncode, 0, err)
            self.assertIn("durability buffered", err)
            self.assertIn("sbx-server stopped", err)


if __name__ == "__main__":
    SERVER = os.path.abspath(sys.argv.pop(1))
    unittest.main()
