#!/usr/bin/python3
"""`sbx shell` used as a person would (issue 35): a real sbx-server with the local runtime,
and the sbx CLI run by a shell in a tmux terminal that the test types into (send-keys) and
reads (capture-pane). Arithmetic comes back, a resized window is what `stty size` says
inside, Ctrl-C interrupts a program inside without ending sbx, `exit 3` gives the outer
shell 3, Ctrl-] detaches and `sbx attach` returns, and every way out leaves the terminal as
it was (canonical mode, echo).

Usage: shell_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML PATH_TO_SBX_CLI
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import json
import time
import unittest

import sbx_e2e

SERVER = PROTO = CONFIG = CLI = None
TOKEN = "tok-a"
TENANT = (("authorization", f"Bearer {TOKEN}"),)


class Terminal:
    """A tmux session (on a server of its own) running /bin/sh with the prompt 'outer$ '."""

    count = 0

    def __init__(self, env, cols=100, rows=30):
        Terminal.count += 1
        self.socket = f"sbx-shell-test-{os.getpid()}-{Terminal.count}"
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(cols), "-y",
                  str(rows), "env", *[f"{k}={v}" for k, v in env.items()], "PS1=outer$ ",
                  "/bin/sh")
        self.wait_for(lambda s: "outer$" in s, "the outer prompt")

    def tmux(self, *args):
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              timeout=20, check=True).stdout

    def type(self, text, enter=True):
        self.tmux("send-keys", "-t", "t", "-l", text)
        if enter:
            self.tmux("send-keys", "-t", "t", "Enter")

    def key(self, name):
        self.tmux("send-keys", "-t", "t", name)

    def screen(self):
        return self.tmux("capture-pane", "-p", "-J", "-t", "t", "-S", "-")

    def wait_for(self, predicate, what, timeout=20):
        deadline = time.time() + timeout
        screen = ""
        while time.time() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; the screen:\n"
                             f"{screen}")

    def wait_text(self, pattern, what, timeout=20):
        return self.wait_for(lambda s: re.search(pattern, s, re.M), what, timeout)

    def last_line(self, screen):
        lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def wait_prompt(self, outer, what="the prompt", timeout=20):
        """Waits until the screen ends with an empty prompt: the outer shell's, or the
        sandbox shell's ('$' or '#'), so that what is typed next goes to it."""
        if outer:
            return self.wait_for(lambda s: self.last_line(s) == "outer$", what, timeout)
        return self.wait_for(lambda s: self.last_line(s) in ("$", "#"), what, timeout)

    def run(self, command, expect, what, outer=False, timeout=20):
        """Types `command` at the (outer or inner) prompt and waits for `expect` (a regex,
        one line) in what follows it."""
        self.wait_prompt(outer, f"a prompt for {command!r}")
        self.type(command)
        return self.wait_for(lambda s: re.search(
            expect, s[s.rfind(command):], re.M), what, timeout)

    def shell_pid(self):
        return int(self.tmux("list-panes", "-t", "t", "-F", "#{pane_pid}").strip())

    def close(self):
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


class Shell(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-shell-", dir="/tmp")
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write(f"{TOKEN} tenant-a\n")
        cls.server = sbx_e2e.Server(SERVER, cls.dir, CONFIG, auth_tokens=cls.tokens)
        from sbx.v1 import claims_pb2_grpc, sandboxes_pb2_grpc
        cls.claims = claims_pb2_grpc.ClaimServiceStub(cls.server.channel)
        cls.sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(cls.server.channel)
        cls.seq = 0

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        from sbx.v1 import claims_pb2
        type(self).seq += 1
        self.claim_id = self.claims.Claim(claims_pb2.ClaimRequest(
            pool="default", claim_id=f"shell-{self.seq}"), metadata=TENANT, timeout=60).claim.claim_id
        self.term = Terminal({"SBX_SERVER": self.server.target, "SBX_TOKEN": TOKEN,
                              "TERM": "xterm-256color", "PATH": os.environ.get("PATH", "/bin")})
        self.addCleanup(self.term.close)

    def tearDown(self):
        from sbx.v1 import claims_pb2
        self.claims.Release(claims_pb2.ReleaseRequest(claim_id=self.claim_id), metadata=TENANT,
                            timeout=30)

    def processes(self):
        from sbx.v1 import sandboxes_pb2
        return list(self.sandboxes.ListProcesses(sandboxes_pb2.ListProcessesRequest(
            claim_id=self.claim_id), metadata=TENANT, timeout=30).processes)

    def assert_terminal_restored(self):
        """The outer shell's terminal is back in canonical mode with echo."""
        self.term.run("stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo "
                      "-e -echo | tr '\\n' , ; echo", r"^icanon,echo,$", "the terminal's modes",
                      outer=True)

    def start_shell(self, *flags):
        self.term.wait_prompt(outer=True)
        self.term.type(" ".join([CLI, "shell", *flags, self.claim_id]))
        # Ready when the shell inside shows its prompt (the sandbox's own, '$' or '#').
        self.term.wait_prompt(outer=False, what="the shell in the sandbox")

    def test_a_person_uses_sbx_shell(self):
        self.start_shell()
        self.term.run("echo $((6*7))", r"^42$", "6*7 from the sandbox")
        [shell] = self.processes()
        self.assertEqual((shell.pty.cols, shell.pty.rows), (100, 30))

        # The window changes size: the terminal inside follows.
        self.term.tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
        sbx_e2e.wait_for(lambda: (self.processes()[0].pty.cols,
                                  self.processes()[0].pty.rows) == (120, 40), 20,
                         "the resize to reach the sandbox")
        self.term.run("stty size", r"^40 120$", "the new size inside")

        # Ctrl-C interrupts the program inside; sbx and the shell go on.
        self.term.wait_prompt(outer=False)
        self.term.type("sleep 100")
        time.sleep(1)
        started = time.time()
        self.term.key("C-c")
        self.term.run("echo still-$((2+3))", r"^still-5$", "the shell after Ctrl-C")
        self.assertLess(time.time() - started, 60, "Ctrl-C did not interrupt sleep 100")
        [after] = self.processes()
        self.assertEqual(after.pid, shell.pid)
        self.assertFalse(after.HasField("exit"))

        # The shell's exit code is sbx's.
        self.term.wait_prompt(outer=False)
        self.term.type("exit 3")
        self.term.run("echo rc=$?", r"^rc=3$", "exit code 3 in the outer shell", outer=True)
        self.assertEqual(self.processes()[0].exit.exit_code, 3)
        self.assert_terminal_restored()

    def test_detach_and_attach_again(self):
        self.start_shell("--tag", "work")
        self.term.run("x=kept-$((1+1)); echo set", r"^set$", "the variable set")
        self.term.wait_prompt(outer=False)
        self.term.key("C-]")
        self.term.wait_text(r"detached; process \d+ keeps running", "the detach note")
        self.term.run("echo rc=$?", r"^rc=0$", "exit code 0 after detaching", outer=True)
        self.assert_terminal_restored()
        self.term.run(f"{CLI} ps {self.claim_id}", r"^\d+\s+work\s+running\s+100x30",
                      "the shell in `sbx ps`", outer=True)

        self.term.wait_prompt(outer=True)
        self.term.type(f"{CLI} attach {self.claim_id} work")
        # The replay shows what the shell wrote since the detach (nothing), so no prompt is
        # drawn again: type at once.
        time.sleep(1)
        self.term.type("echo $x")
        self.term.wait_text(r"^kept-2$", "the same shell, its variable kept")
        self.term.wait_prompt(outer=False)
        self.term.type("exit 4")
        self.term.run("echo rc=$?", r"^rc=4$", "attach's exit code", outer=True)
        self.assert_terminal_restored()

    def test_sigterm_to_sbx_restores_the_terminal_and_hangs_up_the_shell(self):
        self.start_shell()
        outer = self.term.shell_pid()
        sbx = sbx_e2e.wait_for(lambda: subprocess.run(
            ["pgrep", "-P", str(outer)], capture_output=True, text=True).stdout.split(), 10,
            "sbx under the outer shell")
        os.kill(int(sbx[0]), signal.SIGTERM)
        self.term.run("echo rc=$?", r"^rc=143$", "128+SIGTERM", outer=True)
        self.assert_terminal_restored()
        sbx_e2e.wait_for(lambda: self.processes()[0].HasField("exit"), 10,
                         "the shell to end of the hang-up")
        self.assertEqual(self.processes()[0].exit.signal, signal.SIGHUP)

    def test_exec_detached_then_ps_attach_and_kill_without_a_terminal(self):
        env = {**os.environ, "SBX_SERVER": self.server.target, "SBX_TOKEN": TOKEN}

        def sbx(*args, **kw):
            return subprocess.run([CLI, *args], capture_output=True, text=True, env=env,
                                  timeout=60, stdin=subprocess.DEVNULL, **kw)

        r = sbx("exec", "-d", "--tag", "srv", self.claim_id, "--", "/bin/sh", "-c",
                "echo serving; while :; do sleep 0.1; echo tick; done")
        self.assertEqual(r.returncode, 0, r.stderr)
        pid = int(r.stdout.strip())
        r = sbx("-o", "json", "ps", self.claim_id)
        self.assertEqual(r.returncode, 0, r.stderr)
        [p] = json.loads(r.stdout)
        self.assertEqual((p["pid"], p["tag"]), (pid, "srv"))
        self.assertNotIn("exit", p)
        self.assertEqual(sbx("exec", "--tag", "x", self.claim_id, "--", "true").returncode, 2)

        # attach (stdout a pipe): the replay, then it follows until the process ends.
        attach = subprocess.Popen([CLI, "attach", self.claim_id, "srv"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                  env=env)
        self.assertEqual(attach.stdout.readline(), "serving\n")
        # Nobody reads any more (as `sbx attach ... | head -1`): sbx leaves, 128+SIGPIPE, and
        # the process runs on.
        early = subprocess.Popen([CLI, "attach", self.claim_id, "srv"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
        early.stdout.readline()
        early.stdout.close()
        self.assertEqual(early.wait(timeout=30), 128 + signal.SIGPIPE)
        [p] = json.loads(sbx("-o", "json", "ps", self.claim_id).stdout)
        self.assertNotIn("exit", p)
        r = sbx("kill", "-s", "KILL", self.claim_id, "srv")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(attach.wait(timeout=30), 128 + signal.SIGKILL, attach.stderr.read())
        attach.stdout.close()
        attach.stderr.close()
        r = sbx("kill", self.claim_id, "srv")
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAILED_PRECONDITION", r.stderr)
        r = sbx("kill", "-s", "BOGUS", self.claim_id, "srv")
        self.assertEqual(r.returncode, 2, r.stderr)
        r = sbx("attach", self.claim_id, "nobody")
        self.assertEqual(r.returncode, 1)
        self.assertIn("NOT_FOUND", r.stderr)


if __name__ == "__main__":
    if shutil.which("tmux") is None:
        sys.exit("shell_test.py needs tmux (scripts/install-deps installs it)")
    SERVER, PROTO, CONFIG, CLI = (os.path.abspath(a) for a in sys.argv[1:5])
    del sys.argv[1:5]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main()
