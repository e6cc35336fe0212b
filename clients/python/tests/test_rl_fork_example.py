#!/usr/bin/python3
"""clients/python/examples/rl_fork.py against a real sbx-server (root; a busybox image
pool): a small run (3 environments, 3 episodes of 2 steps) prints its episodes per second
and leaves nothing claimed and no snapshot; reset between episodes gives every episode
the prepared files back; a SIGINT mid-run exits 130 and leaves no claim of the tenant
ACTIVE."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import sbx  # noqa: E402

PKG = os.path.join(harness.ROOT, "clients", "python")
EXAMPLE = os.path.join(PKG, "examples", "rl_fork.py")
SRV = None

# Each step appends to a file the snapshot holds with one line; a step that sees more
# lines than its step number plus one saw an earlier episode's writes (no reset).
PREPARE = "mkdir -p /opt && echo prepared > /opt/state"
STEP = ('echo "$ENV_INDEX $EPISODE $STEP" >> /opt/state; '
        'test "$(wc -l < /opt/state)" -eq $((STEP + 2))')


def setUpModule():
    global SRV
    SRV = harness.image_pool_server(min_warm=1, max_warm=2)


def tearDownModule():
    SRV.stop()


def start(args):
    env = dict(os.environ, SBX_SERVER=SRV.target, SBX_TOKEN=harness.TENANT_TOKEN,
               PYTHONPATH=PKG)
    return subprocess.Popen([sys.executable, EXAMPLE, *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tempfile.gettempdir())


class RlForkExampleTest(unittest.TestCase):
    def setUp(self):
        self.client = sbx.Client(SRV.target, token=harness.TENANT_TOKEN)

    def tearDown(self):
        self.client.close()

    def assert_nothing_left(self):
        self.assertEqual(self.client.list_claims(states=["active"]), [])
        self.assertEqual(self.client.snapshots.list(), [])

    def test_a_small_run(self):
        p = start(["img", "--prepare", PREPARE, "--step", STEP, "--envs", "3",
                   "--episodes", "3", "--steps", "2"])
        out, err = p.communicate(timeout=240)
        self.assertEqual(p.returncode, 0, f"{out}\n{err}")
        self.assertRegex(out, r"snapshot sn-[a-z0-9]{16} ")
        self.assertIn("forked 3 environments", out)
        m = re.search(r"^(\d+) episodes in [\d.]+ s: ([\d.]+) episodes/s$", out, re.M)
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(1), "9")
        self.assertGreater(float(m.group(2)), 0)
        self.assertTrue(out.endswith("released\n"), out)
        self.assert_nothing_left()

    def test_sigint_mid_run_releases_everything(self):
        p = start(["img", "--prepare", PREPARE, "--step", f"{STEP}; sleep 0.2",
                   "--envs", "3", "--episodes", "100000", "--steps", "2"])
        try:
            lines = []
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if line == "running episodes\n":
                    break
            self.assertEqual(lines[-1:], ["running episodes\n"], "".join(lines))
            # Let episodes run (and resets happen) before the interrupt.
            active = [c for c in self.client.list_claims(states=["active"])]
            self.assertEqual(len(active), 3, active)
            time.sleep(2)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        self.assertEqual(p.returncode, 130, f"{out}\n{err}")
        self.assertIn("interrupted: releasing everything", err)
        self.assert_nothing_left()


if __name__ == "__main__":
    harness.main()
