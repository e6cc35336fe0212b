#!/usr/bin/python3
"""Processes of sandboxes (issue 35) end to end: a real sbx-server with the local runtime and
real bubblewrap, two tenants, called from Python's grpcio. A background process outlives the
call that started it and is re-attached from another client; tenant B gets NOT_FOUND for
tenant A's processes in every call; release kills background processes (and suspend freezes
them); the limits are refused naming the flag; a process flooding its output keeps the
server's and the daemon's memory bounded.

Usage: process_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML
"""

import os
import signal
import threading
import time

import grpc

import sbx_e2e

SERVER = PROTO = CONFIG = None
TENANT_A = (("authorization", "Bearer tok-a"),)
TENANT_B = (("authorization", "Bearer tok-b"),)
# Per sandbox: 4 processes, 1 PTY, 4 MiB of replay buffers.
LIMITS = ("--max_processes=4", "--max_ptys=1", "--max_replay_bytes=4194304")


def cmdline(pid):
    """The command line of `pid` (NUL-separated), or b"" once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def resident_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Processes(sbx_e2e.ServerTestCase):
    TOKENS = "tok-a tenant-a\ntok-b tenant-b\n"
    MD = TENANT_A

    @classmethod
    def setUpClass(cls):
        cls.make_workdir("sbx-procs-")
        cls.start_server(CONFIG, LIMITS)

    @staticmethod
    def stubs(channel):
        from sbx.v1 import claims_pb2_grpc, sandboxes_pb2_grpc
        return (claims_pb2_grpc.ClaimServiceStub(channel),
                sandboxes_pb2_grpc.SandboxServiceStub(channel))

    def claim(self, md=TENANT_A):
        return self.claim_released_at_cleanup("default", md)

    def release(self, claim, md=TENANT_A):
        super().release(claim, md, quiet=True)  # released by the test already

    def start(self, claim_id, argv, md=TENANT_A, detach=True, sandboxes=None, **kw):
        """StartProcess; returns (started, events after it) of a detached start."""
        from sbx.v1 import sandboxes_pb2
        req = sandboxes_pb2.StartProcessRequest(claim_id=claim_id, argv=argv, detach=detach,
                                                **kw)
        events = list((sandboxes or self.sandboxes).StartProcess(req, metadata=md, timeout=60))
        self.assertEqual(events[0].WhichOneof("kind"), "started", events)
        return events[0].started, events[1:]

    def sel(self, pid=None, tag=None):
        from sbx.v1 import sandboxes_pb2
        if tag is not None:
            return sandboxes_pb2.ProcessSelector(tag=tag)
        return sandboxes_pb2.ProcessSelector(pid=pid)

    def listing(self, claim_id, md=TENANT_A):
        from sbx.v1 import sandboxes_pb2
        return list(self.sandboxes.ListProcesses(
            sandboxes_pb2.ListProcessesRequest(claim_id=claim_id), metadata=md,
            timeout=30).processes)

    def read_until(self, stream, predicate, what):
        """Reads events from `stream` until predicate(collected) is true; returns them."""
        got = {"out": b"", "pty": b"", "dropped": 0, "exit": None, "started": None}
        for e in stream:
            kind = e.WhichOneof("kind")
            if kind in ("stdout", "stderr"):
                got["out"] += getattr(e, kind)
            elif kind == "pty":
                got["pty"] += e.pty
            elif kind == "dropped":
                got["dropped"] += e.dropped.bytes
            elif kind == "exit":
                got["exit"] = e.exit
            elif kind == "started":
                got["started"] = e.started
            if predicate(got):
                return got
        self.fail(f"the stream ended before {what}: {got}")

    def test_a_background_process_outlives_its_start_and_is_reattached_elsewhere(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        started, rest = self.start(
            c.claim_id, ["/bin/sh", "-c", "echo hello; while read l; do echo \"got $l\"; done"],
            tag="worker", stdin=True)
        self.assertEqual(rest, [], "a detached start ends right after `started`")
        self.assertGreater(started.pid, 0)
        self.assertEqual(started.tag, "worker")
        # The starting call is over; the process runs on.
        procs = self.listing(c.claim_id)
        self.assertEqual([(p.pid, p.tag, p.HasField("exit")) for p in procs],
                         [(started.pid, "worker", False)])
        # Another client (its own channel) re-attaches by tag: replay, then live output.
        other = grpc.insecure_channel(self.server.target)
        self.addCleanup(other.close)
        _, sandboxes2 = self.stubs(other)
        stream = sandboxes2.ConnectProcess(
            sandboxes_pb2.ConnectProcessRequest(claim_id=c.claim_id, process=self.sel(tag="worker")),
            metadata=TENANT_A, timeout=60)
        got = self.read_until(stream, lambda g: g["out"] == b"hello\n", "the replay")
        self.assertEqual(got["started"].pid, started.pid)
        self.sandboxes.SendProcessInput(sandboxes_pb2.SendProcessInputRequest(
            claim_id=c.claim_id, process=self.sel(pid=started.pid), data=b"ping\n"),
            metadata=TENANT_A, timeout=30)
        self.read_until(stream, lambda g: g["out"] == b"got ping\n", "the live output")
        # A third client waits for the end while the second still follows.
        third = grpc.insecure_channel(self.server.target)
        self.addCleanup(third.close)
        _, sandboxes3 = self.stubs(third)
        waited = {}
        waiter = threading.Thread(target=lambda: waited.update(r=sandboxes3.WaitProcess(
            sandboxes_pb2.WaitProcessRequest(claim_id=c.claim_id, process=self.sel(tag="worker")),
            metadata=TENANT_A, timeout=60)))
        waiter.start()
        self.sandboxes.CloseProcessInput(sandboxes_pb2.CloseProcessInputRequest(
            claim_id=c.claim_id, process=self.sel(tag="worker")), metadata=TENANT_A, timeout=30)
        got = self.read_until(stream, lambda g: g["exit"] is not None, "the exit")
        self.assertEqual(got["exit"].exit_code, 0)
        waiter.join(60)
        self.assertEqual(waited["r"].exit.exit_code, 0)
        self.assertEqual(waited["r"].process.pid, started.pid)

    def test_an_attached_start_follows_the_process_and_cancelling_detaches(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        req = sandboxes_pb2.StartProcessRequest(
            claim_id=c.claim_id, argv=["/bin/sh", "-c", "echo ready; sleep 1000"])
        stream = self.sandboxes.StartProcess(req, metadata=TENANT_A, timeout=60)
        got = self.read_until(stream, lambda g: g["out"] == b"ready\n", "ready")
        stream.cancel()
        time.sleep(0.5)
        [p] = self.listing(c.claim_id)
        self.assertEqual(p.pid, got["started"].pid)
        self.assertFalse(p.HasField("exit"), "cancelling the attached start killed the process")
        self.sandboxes.SignalProcess(sandboxes_pb2.SignalProcessRequest(
            claim_id=c.claim_id, process=self.sel(pid=p.pid), signal=sandboxes_pb2.SIGNAL_TERM),
            metadata=TENANT_A, timeout=30)
        r = self.sandboxes.WaitProcess(sandboxes_pb2.WaitProcessRequest(
            claim_id=c.claim_id, process=self.sel(pid=p.pid)), metadata=TENANT_A, timeout=30)
        self.assertEqual(r.exit.signal, signal.SIGTERM)

    # Attack: tenant B drives tenant A's process. Every process call checks that the claim
    # belongs to the caller, as Exec does; seen failing without the check (tenant B, passing
    # A's claim id, listed A's processes and read the replay of A's process).
    def test_tenant_b_gets_not_found_for_tenant_as_processes_in_every_call(self):
        from sbx.v1 import sandboxes_pb2
        a = self.claim(TENANT_A)
        b = self.claim(TENANT_B)
        started, _ = self.start(a.claim_id, ["/bin/sh", "-c", "echo secret-of-a; sleep 1000"],
                                tag="a-secret", stdin=True,
                                pty=sandboxes_pb2.PtyOptions(size=sandboxes_pb2.PtySize(
                                    cols=80, rows=24)))
        for who, claim_id in (("A's claim", a.claim_id), ("B's own claim", b.claim_id)):
            for sel in (self.sel(pid=started.pid), self.sel(tag="a-secret")):
                calls = {
                    "ConnectProcess": lambda: list(self.sandboxes.ConnectProcess(
                        sandboxes_pb2.ConnectProcessRequest(claim_id=claim_id, process=sel),
                        metadata=TENANT_B, timeout=10)),
                    "SendProcessInput": lambda: self.sandboxes.SendProcessInput(
                        sandboxes_pb2.SendProcessInputRequest(claim_id=claim_id, process=sel,
                                                              data=b"exit\n"),
                        metadata=TENANT_B, timeout=10),
                    "CloseProcessInput": lambda: self.sandboxes.CloseProcessInput(
                        sandboxes_pb2.CloseProcessInputRequest(claim_id=claim_id, process=sel),
                        metadata=TENANT_B, timeout=10),
                    "SignalProcess": lambda: self.sandboxes.SignalProcess(
                        sandboxes_pb2.SignalProcessRequest(claim_id=claim_id, process=sel,
                                                           signal=sandboxes_pb2.SIGNAL_KILL),
                        metadata=TENANT_B, timeout=10),
                    "ResizeProcess": lambda: self.sandboxes.ResizeProcess(
                        sandboxes_pb2.ResizeProcessRequest(
                            claim_id=claim_id, process=sel,
                            size=sandboxes_pb2.PtySize(cols=10, rows=10)),
                        metadata=TENANT_B, timeout=10),
                    "WaitProcess": lambda: self.sandboxes.WaitProcess(
                        sandboxes_pb2.WaitProcessRequest(claim_id=claim_id, process=sel),
                        metadata=TENANT_B, timeout=10),
                }
                if who == "A's claim":
                    calls["ListProcesses"] = lambda: self.sandboxes.ListProcesses(
                        sandboxes_pb2.ListProcessesRequest(claim_id=claim_id),
                        metadata=TENANT_B, timeout=10)
                    calls["StartProcess"] = lambda: list(self.sandboxes.StartProcess(
                        sandboxes_pb2.StartProcessRequest(claim_id=claim_id, argv=["true"]),
                        metadata=TENANT_B, timeout=10))
                for name, call in calls.items():
                    with self.subTest(who=who, call=name, selector=str(sel).strip()):
                        if who == "B's own claim" and sel.HasField("pid"):
                            # B's sandbox has its own pid namespace: the number may name
                            # one of B's processes, never A's.
                            try:
                                call()
                            except grpc.RpcError as e:
                                self.assertIn(e.code(), (grpc.StatusCode.NOT_FOUND,
                                                         grpc.StatusCode.FAILED_PRECONDITION))
                            continue
                        with self.assertRaises(grpc.RpcError) as e:
                            call()
                        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND,
                                         e.exception.details())
        # B's own listing shows nothing of A's.
        self.assertEqual([p.tag for p in self.listing(b.claim_id, TENANT_B)], [])
        # And A's process is untouched: running, its output unread, its size unchanged.
        [p] = self.listing(a.claim_id)
        self.assertFalse(p.HasField("exit"))
        self.assertEqual((p.pty.cols, p.pty.rows), (80, 24))
        stream = self.sandboxes.ConnectProcess(sandboxes_pb2.ConnectProcessRequest(
            claim_id=a.claim_id, process=self.sel(tag="a-secret")), metadata=TENANT_A, timeout=30)
        got = self.read_until(stream, lambda g: b"secret-of-a" in g["pty"], "A's output")
        self.assertNotIn(b"exit", got["pty"], "B's input reached A's terminal")
        stream.cancel()

    def test_release_kills_background_processes(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        marker = str(900000 + os.getpid() % 90000)
        self.start(c.claim_id, ["sleep", marker], tag="bg")
        self.start(c.claim_id, ["/bin/sh", "-c", f"sleep {marker}"],
                   pty=sandboxes_pb2.PtyOptions(size=sandboxes_pb2.PtySize(cols=80, rows=24)))
        sleepers = lambda: [p for p in sbx_e2e.processes_with(c.sandbox.id)
                            if marker.encode() in cmdline(p)]
        sbx_e2e.wait_for(lambda: len(sleepers()) >= 2, 20, "the sleepers to run")
        self.release(c.claim_id)
        sbx_e2e.wait_for(lambda: not sleepers(), 30, "release to kill the background processes")
        with self.assertRaises(grpc.RpcError) as e:
            self.listing(c.claim_id)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_suspend_freezes_processes_and_resume_thaws_them(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        started, _ = self.start(c.claim_id, ["/bin/sh", "-c",
                                             "i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done"])
        self.sandboxes.Suspend(sandboxes_pb2.SuspendRequest(claim_id=c.claim_id),
                               metadata=TENANT_A, timeout=30)
        with self.assertRaises(grpc.RpcError) as e:
            self.listing(c.claim_id)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.sandboxes.Resume(sandboxes_pb2.ResumeRequest(claim_id=c.claim_id),
                              metadata=TENANT_A, timeout=30)
        [p] = self.listing(c.claim_id)
        self.assertEqual(p.pid, started.pid)
        self.assertFalse(p.HasField("exit"))
        before = p.output_bytes
        sbx_e2e.wait_for(lambda: self.listing(c.claim_id)[0].output_bytes > before, 10,
                         "the thawed process to write again")

    def test_limits_are_refused_naming_the_flag(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()

        def refused(limit, **kw):
            with self.assertRaises(grpc.RpcError) as e:
                self.start(c.claim_id, ["sleep", "1000"], **kw)
            self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                             e.exception.details())
            self.assertIn(limit, e.exception.details())

        pty = sandboxes_pb2.PtyOptions(size=sandboxes_pb2.PtySize(cols=80, rows=24))
        self.start(c.claim_id, ["sleep", "1000"], pty=pty, replay_bytes=65536)
        refused("max_ptys", pty=pty, replay_bytes=65536)
        refused("max_replay_bytes", replay_bytes=8 << 20)
        for _ in range(3):
            self.start(c.claim_id, ["sleep", "1000"], replay_bytes=65536)
        refused("max_processes", replay_bytes=65536)

    # Attack: a process writing output as fast as it can while a client reads slowly (and
    # while nobody reads). The server relays one message at a time and the daemon's replay
    # buffer drops the oldest output, so neither grows; the drops are counted.
    def test_a_flood_keeps_server_and_daemon_memory_bounded(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        daemon = [p for p in sbx_e2e.processes_with(c.sandbox.id)
                  if b"sbx-sandboxd" in cmdline(p).split(b"\0")[0]]
        self.assertEqual(len(daemon), 1, "cannot find the sandbox's daemon")
        server_before = resident_bytes(self.server.proc.pid)
        daemon_before = resident_bytes(daemon[0])
        started, _ = self.start(c.claim_id, ["cat", "/dev/zero"], tag="flood",
                                replay_bytes=1 << 20)
        stream = self.sandboxes.ConnectProcess(sandboxes_pb2.ConnectProcessRequest(
            claim_id=c.claim_id, process=self.sel(tag="flood")), metadata=TENANT_A, timeout=120)
        got = {"dropped": 0, "bytes": 0}
        # At least 4 s of slow reading, and on until the first drop is told (at most 60 s):
        # what HTTP/2's flow-control windows on both hops already hold (several MiB once
        # gRPC has grown them) reaches the reader before any drop can, and at 20 messages a
        # second on a busy machine 4 s did not always get through it (2 runs in about 8).
        start = time.time()
        for e in stream:
            kind = e.WhichOneof("kind")
            if kind == "dropped":
                got["dropped"] += e.dropped.bytes
            elif kind == "stdout":
                got["bytes"] += len(e.stdout)
                time.sleep(0.05)  # a slow reader
            elapsed = time.time() - start
            if (elapsed > 4 and got["dropped"] > 0) or elapsed > 60:
                break
        stream.cancel()
        time.sleep(1)  # nobody reads now
        [p] = self.listing(c.claim_id)
        self.assertGreater(p.output_bytes, 100 << 20, "the process was slowed down")
        self.assertGreater(p.dropped_bytes, 0)
        self.assertGreater(got["dropped"], 0, "the slow reader was not told what it missed")
        self.assertLessEqual(p.buffered_bytes, 1 << 20)
        server_after = resident_bytes(self.server.proc.pid)
        daemon_after = resident_bytes(daemon[0])
        self.assertLess(server_after - server_before, 64 << 20,
                        f"sbx-server grew from {server_before} to {server_after} bytes")
        self.assertLess(daemon_after - daemon_before, 64 << 20,
                        f"sbx-sandboxd grew from {daemon_before} to {daemon_after} bytes")
        self.sandboxes.SignalProcess(sandboxes_pb2.SignalProcessRequest(
            claim_id=c.claim_id, process=self.sel(pid=started.pid),
            signal=sandboxes_pb2.SIGNAL_KILL), metadata=TENANT_A, timeout=30)
        r = self.sandboxes.WaitProcess(sandboxes_pb2.WaitProcessRequest(
            claim_id=c.claim_id, process=self.sel(pid=started.pid)), metadata=TENANT_A, timeout=30)
        self.assertEqual(r.exit.signal, signal.SIGKILL)
        self.assertGreater(r.exit.dropped_bytes, 0)

    def test_bad_requests(self):
        from sbx.v1 import sandboxes_pb2
        c = self.claim()
        for kw, code, text in (
                (dict(argv=[]), grpc.StatusCode.INVALID_ARGUMENT, "argv"),
                (dict(argv=["true"], tag="bad tag"), grpc.StatusCode.INVALID_ARGUMENT, "tag"),
                (dict(argv=["true"], pty=sandboxes_pb2.PtyOptions()),
                 grpc.StatusCode.INVALID_ARGUMENT, "pty.size"),
                (dict(argv=["no-such-program-sbx"]), grpc.StatusCode.FAILED_PRECONDITION,
                 "no-such-program-sbx")):
            with self.subTest(kw=kw):
                with self.assertRaises(grpc.RpcError) as e:
                    self.start(c.claim_id, **kw)
                self.assertEqual(e.exception.code(), code, e.exception.details())
                self.assertIn(text, e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.sandboxes.WaitProcess(sandboxes_pb2.WaitProcessRequest(claim_id=c.claim_id),
                                       metadata=TENANT_A, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(grpc.RpcError) as e:
            self.sandboxes.WaitProcess(sandboxes_pb2.WaitProcessRequest(
                claim_id=c.claim_id, process=self.sel(pid=4242)), metadata=TENANT_A, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("4242", e.exception.details())


if __name__ == "__main__":
    sbx_e2e.run(Processes, __doc__, ("SERVER", "PROTO", "CONFIG"), verbosity=1)
