#!/usr/bin/python3
"""sb.processes, sb.pty, sb.url and the streamed files of the Python SDK (sync and
asyncio) against a real sbx-server with local bubblewrap sandboxes and its port proxy
(--proxy_listen on 127.0.0.1:0), with authentication (two tenants).

What each test proves:
- a background process found again by tag from a second client: replay, then live
  output, stdin, a signal from that client, its exit seen by the first;
- a PTY whose `stty size` shows the effect of resize();
- 64 MiB up and down streamed, content checked by sha256 on both sides, and the SDK's
  Python allocations while doing it stay far below the file's size (no whole buffering);
- url() then an HTTP fetch through the port proxy, without the tenant's token;
- tenant B's SDK, holding A's claim id and pid, cannot connect to, signal, wait for,
  write to or get a URL of A's process/port: NotFound, and A's process is unaffected.
"""

import asyncio
import hashlib
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import sbx  # noqa: E402

SRV = None
PROXY_PORT = 0
HTTP_PORT = 8765


def setUpModule():
    global SRV, PROXY_PORT
    SRV = harness.Server(auth=True, extra=["--proxy_listen=127.0.0.1:0",
                                           "--proxy_port_file=proxy_port"])
    SRV.wait_warm("default", 2)
    with open(os.path.join(SRV.dir, "proxy_port")) as f:
        PROXY_PORT = int(f.read())


def tearDownModule():
    SRV.stop()


def read_until(proc, pattern, timeout=20.0):
    """Reads a process's output until `pattern` (bytes regex) matches what came so far;
    returns it. Bounded: the reading stops (detaches) after `timeout`."""
    import threading
    seen = bytearray()
    timer = threading.Timer(timeout, proc.detach)
    timer.start()
    try:
        for out in proc:
            seen += out.data
            if re.search(pattern, bytes(seen)):
                return bytes(seen)
    finally:
        timer.cancel()
    raise AssertionError(f"{pattern!r} not seen within {timeout} s in {bytes(seen)!r}")


class Processes(unittest.TestCase):
    def setUp(self):
        self.client = sbx.Client(SRV.target, token=harness.TENANT_TOKEN)
        self.sb = self.client.claim("default", ttl=600)

    def tearDown(self):
        self.sb.release()
        self.client.close()

    def test_background_process_from_a_second_client(self):
        proc = self.sb.processes.start(
            "echo ready; while read l; do echo \"got $l\"; done", tag="echoer", stdin=True)
        self.assertGreater(proc.pid, 0)
        self.assertEqual(proc.tag, "echoer")
        listed = {p.tag: p for p in self.sb.processes.list()}
        self.assertIn("echoer", listed)
        self.assertTrue(listed["echoer"].running)
        self.assertTrue(listed["echoer"].stdin_open)
        self.assertEqual(listed["echoer"].pid, proc.pid)

        # A second client (another channel) finds it by tag: the replay first...
        with sbx.Client(SRV.target, token=harness.TENANT_TOKEN) as other:
            sb2 = other.attach(self.sb.claim_id)
            p2 = sb2.processes.connect("echoer")
            self.assertEqual(p2.pid, proc.pid)
            read_until(p2, rb"ready\n")
            # ... then live output, for input sent from the first client.
            proc.send_stdin("hello\n")
            read_until(p2, rb"got hello\n")
            p2.kill("TERM")
            # The first client sees the exit, and so does the second.
            self.assertEqual(proc.wait(timeout=30), -15)
            self.assertEqual(proc.exit.signal, 15)
            self.assertEqual(p2.wait(timeout=30), -15)
            p2.detach()
        ended = [p for p in self.sb.processes.list() if p.pid == proc.pid]
        self.assertTrue(ended and ended[0].exit is not None)
        # Signalling an ended process: FailedPrecondition, with the server's message.
        with self.assertRaises(sbx.FailedPrecondition):
            proc.kill()

    def test_stdin_close_callbacks_and_exit_code(self):
        got = []
        proc = self.sb.processes.start(["sh", "-c", "cat; echo err >&2; exit 7"], stdin=True,
                                       on_stdout=got.append, on_stderr=got.append)
        proc.send_stdin(b"abc")
        proc.send_stdin("def\n")
        proc.close_stdin()
        self.assertEqual(proc.wait(timeout=30), 7)
        self.assertEqual(b"".join(got).replace(b"err\n", b""), b"abcdef\n")
        self.assertIn(b"err\n", got)

    def test_foreground_start_iterates_to_the_end(self):
        proc = self.sb.processes.start("echo one; echo two >&2", background=False)
        outs = list(proc)
        self.assertEqual(b"".join(o.data for o in outs if o.stream == "stdout"), b"one\n")
        self.assertEqual(b"".join(o.data for o in outs if o.stream == "stderr"), b"two\n")
        self.assertEqual(proc.exit.exit_code, 0)
        self.assertEqual(proc.wait(), 0)

    def test_server_errors_keep_their_class_and_message(self):
        self.sb.processes.start("sleep 60", tag="dup")
        with self.assertRaises(sbx.AlreadyExists) as e:
            self.sb.processes.start("sleep 60", tag="dup")
        self.assertIn("dup", e.exception.message)
        with self.assertRaises(sbx.NotFound):
            self.sb.processes.connect("nosuch")
        with self.assertRaises(sbx.FailedPrecondition):
            self.sb.processes.send_stdin("dup", "x")  # started without stdin
        with self.assertRaises(sbx.InvalidArgument):
            self.sb.processes.start("true", tag="bad tag")
        with self.assertRaises(ValueError):
            self.sb.processes.kill(0)
        self.sb.processes.kill("dup")
        self.assertEqual(self.sb.processes.wait("dup", timeout=30).signal, 9)

    def test_pty_resize_shows_in_stty_size(self):
        pty = self.sb.pty(cols=80, rows=24, cmd=["sh"])
        try:
            pty.send_input("stty size\n")
            read_until(pty, rb"\b24 80\r?\n")
            pty.resize(100, 40)
            pty.send_input("stty size\n")
            read_until(pty, rb"\b40 100\r?\n")
            pty.send_input("exit 3\n")
            self.assertEqual(pty.wait(timeout=30), 3)
            info = [p for p in self.sb.processes.list() if p.pid == pty.pid][0]
            self.assertEqual(info.pty, (100, 40))
        finally:
            pty.detach()

    def test_default_pty_is_a_login_shell_and_stdout_reads_it(self):
        pty = self.sb.pty(rows=30, cols=90, term="xterm-256color")
        try:
            pty.send_input("echo \"term=$TERM size=$(stty size)\"; exit 5\n")
            seen = b""
            timer = threading.Timer(20, pty.detach)  # bounded: the loop ends at its exit
            timer.start()
            try:
                for data in pty.stdout:
                    seen += data
            finally:
                timer.cancel()
            self.assertIn(b"term=xterm-256color size=30 90", seen)
            self.assertEqual(pty.wait(timeout=30), 5)
        finally:
            pty.detach()

    def test_streamed_64mib_up_and_down(self):
        size = 64 << 20
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            src = os.path.join(d, "src.bin")
            h = hashlib.sha256()
            with open(src, "wb") as f:
                for _ in range(size >> 20):
                    block = os.urandom(1 << 20)
                    h.update(block)
                    f.write(block)
            want = h.hexdigest()
            tracemalloc.start()
            try:
                self.assertEqual(self.sb.files.upload("big/blob.bin", src), size)
                _, up_peak = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                dst = os.path.join(d, "dst.bin")
                self.assertEqual(self.sb.files.download("big/blob.bin", dst), size)
                _, down_peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            # The SDK holds a few 1 MiB chunks at a time, never the file.
            self.assertLess(up_peak, 16 << 20, "upload buffered the file")
            self.assertLess(down_peak, 16 << 20, "download buffered the file")
            inside = self.sb.exec(["sha256sum", "big/blob.bin"]).stdout.split()[0]
            self.assertEqual(inside, want)
            with open(dst, "rb") as f:
                got = hashlib.sha256()
                for block in iter(lambda: f.read(1 << 20), b""):
                    got.update(block)
            self.assertEqual(got.hexdigest(), want)

    def test_url_then_fetch_through_the_port_proxy(self):
        self.sb.files.write("site/hello.txt", "hello through the proxy\n")
        web = self.sb.processes.start(
            ["python3", "-m", "http.server", str(HTTP_PORT), "--bind", "127.0.0.1"],
            cwd="site", tag="web")
        wait_port(self.sb, HTTP_PORT)
        u = self.sb.url(HTTP_PORT, ttl=120)
        self.assertIn(f"/_sbx/{self.sb.claim_id}/{HTTP_PORT}/", u.url)
        self.assertIn(f":{PROXY_PORT}/", u.url)
        self.assertTrue(u.token)
        self.assertGreater(u.expires_at.timestamp(), time.time())
        base, query = u.url.split("?", 1)
        # No bearer token: the signed URL alone lets the request in.
        with urllib.request.urlopen(base + "hello.txt?" + query, timeout=20) as r:
            self.assertEqual(r.read(), b"hello through the proxy\n")
        with self.assertRaises(sbx.InvalidArgument):
            self.sb.url(HTTP_PORT, ttl=30 * 86400)
        with self.assertRaises(ValueError):
            self.sb.url(0)
        web.kill()
        web.wait(timeout=30)

    def test_tenant_b_cannot_reach_a_process_or_port(self):
        proc = self.sb.processes.start("sleep 300", tag="secret", stdin=True)
        with sbx.Client(SRV.target, token=harness.OTHER_TENANT_TOKEN) as b:
            # B knows A's claim id and pid (it guessed, or they leaked): a handle made
            # from them, as the SDK's attach() would make had GetClaim not refused.
            with self.assertRaises(sbx.NotFound):
                b.attach(self.sb.claim_id)
            sb_b = sbx.Sandbox(b, self.sb.info)
            for attempt in (lambda: sb_b.processes.connect("secret"),
                            lambda: sb_b.processes.connect(proc.pid),
                            lambda: sb_b.processes.kill(proc.pid),
                            lambda: sb_b.processes.kill("secret", "TERM"),
                            lambda: sb_b.processes.wait("secret", timeout=5),
                            lambda: sb_b.processes.send_stdin(proc.pid, "rm -rf /\n"),
                            lambda: sb_b.processes.list(),
                            lambda: sb_b.pty(cmd=["sh"]),
                            lambda: sb_b.url(HTTP_PORT)):
                with self.assertRaises(sbx.NotFound) as e:
                    attempt()
                self.assertIn(self.sb.claim_id, e.exception.message)
        # A's process is untouched.
        info = [p for p in self.sb.processes.list() if p.pid == proc.pid][0]
        self.assertTrue(info.running)
        self.assertEqual(info.readers, 0)
        proc.kill()


def wait_port(sb, port, timeout=20):
    probe = ("import socket,time,sys\nfor i in range(%d):\n"
             "  try: socket.create_connection(('127.0.0.1',%d)).close(); sys.exit(0)\n"
             "  except OSError: time.sleep(0.05)\nsys.exit(1)\n" % (timeout * 20, port))
    r = sb.exec(["python3", "-c", probe], timeout=timeout + 10)
    if r.exit_code != 0:
        raise AssertionError(f"port {port} did not listen: {r}")


class AsyncProcesses(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.client = sbx.AsyncClient(SRV.target, token=harness.TENANT_TOKEN)
        self.sb = await self.client.claim("default", ttl=600)

    async def asyncTearDown(self):
        await self.sb.release()
        await self.client.close()

    async def read_until(self, proc, pattern, timeout=20.0):
        seen = bytearray()

        async def go():
            async for out in proc:
                seen.extend(out.data)
                if re.search(pattern, bytes(seen)):
                    return bytes(seen)
            raise AssertionError(f"ended before {pattern!r}: {bytes(seen)!r}")
        try:
            return await asyncio.wait_for(go(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"{pattern!r} not seen in {bytes(seen)!r}") from None

    async def test_background_connect_stdin_signal_wait(self):
        proc = await self.sb.processes.start(
            "echo ready; while read l; do echo \"got $l\"; done", tag="a-echo", stdin=True)
        tags = [p.tag for p in await self.sb.processes.list()]
        self.assertIn("a-echo", tags)
        p2 = await self.sb.processes.connect("a-echo")
        await self.read_until(p2, rb"ready\n")
        await proc.send_stdin("hi\n")
        await self.read_until(p2, rb"got hi\n")
        await self.sb.processes.kill("a-echo", "INT")
        self.assertEqual(await proc.wait(timeout=30), -2)
        p2.detach()

    async def test_callbacks_and_exit(self):
        got = []

        async def on_out(b):
            got.append(b)
        proc = await self.sb.processes.start(["sh", "-c", "cat; exit 4"], stdin=True,
                                             on_stdout=on_out)
        await proc.send_stdin("x" * 100000)
        await proc.close_stdin()
        self.assertEqual(await proc.wait(timeout=30), 4)
        self.assertEqual(b"".join(got), b"x" * 100000)

    async def test_pty_resize(self):
        pty = await self.sb.pty(cols=80, rows=24, cmd=["sh"])
        try:
            await pty.send_input("stty size\n")
            await self.read_until(pty, rb"\b24 80\r?\n")
            await pty.resize(132, 50)
            await pty.send_input("stty size\n")
            await self.read_until(pty, rb"\b50 132\r?\n")
            await pty.send_input("\x04")  # Ctrl-D: end of the shell's input
            self.assertEqual(await pty.wait(timeout=30), 0)
        finally:
            pty.detach()

    async def test_watch_and_url(self):
        async with self.sb.files.watch("") as w:
            await self.sb.files.write("new.txt", "x")
            kinds = []

            async def first():
                async for ev in w:
                    kinds.append((ev.type, ev.path))
                    if ev.path.endswith("new.txt"):
                        return
            await asyncio.wait_for(first(), 20)
        self.assertTrue(any(p.endswith("new.txt") for _, p in kinds), kinds)
        u = await self.sb.url(HTTP_PORT)
        self.assertIn(f"/_sbx/{self.sb.claim_id}/{HTTP_PORT}/", str(u))

    async def test_tenant_b_gets_not_found(self):
        proc = await self.sb.processes.start("sleep 300", tag="hidden")
        async with sbx.AsyncClient(SRV.target, token=harness.OTHER_TENANT_TOKEN) as b:
            sb_b = sbx.AsyncSandbox(b, self.sb.info)
            with self.assertRaises(sbx.NotFound):
                await sb_b.processes.connect("hidden")
            with self.assertRaises(sbx.NotFound):
                await sb_b.processes.kill(proc.pid)
            with self.assertRaises(sbx.NotFound):
                await sb_b.url(HTTP_PORT)
        self.assertTrue((await proc.info()).running)
        await proc.kill()


if __name__ == "__main__":
    harness.main()
