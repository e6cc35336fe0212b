"""Processes that outlive a call (synchronous): `sb.processes` (`Processes`), the
`Process` handle, and `Pty`, a process on a pseudo-terminal (`sb.pty(...)`).

A Process handle names a process of the sandbox by pid; any number of handles (in this
or other clients) may name the same process. Dropping or closing a handle only detaches
from its output: the process keeps running until it ends, is killed, or the claim ends.
"""

from __future__ import annotations

import threading
import time
from typing import (TYPE_CHECKING, Callable, Iterator, List, Mapping, Optional, Sequence,
                    Union)

import grpc

from sbx import _common as c
from sbx import _process as p
from sbx._process import PortUrl, ProcessExit, ProcessInfo, ProcessOutput, ProcessRef
from sbx.errors import DeadlineExceeded, SbxError, from_rpc_error
from sbx.v1 import sandboxes_pb2

if TYPE_CHECKING:  # pragma: no cover
    from sbx.client import Sandbox

OutputCallback = Callable[[bytes], None]


class Processes:
    """The processes of one sandbox (`sb.processes`)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def __repr__(self) -> str:
        return f"<sbx.Processes of {self._sb.claim_id!r}>"

    def start(self, cmd: Union[str, Sequence[str]], *, background: bool = True,
              tag: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
              cwd: Optional[str] = None, stdin: bool = False,
              pty: Union[None, bool, Mapping[str, object]] = None,
              replay_bytes: Optional[int] = None,
              on_stdout: Optional[OutputCallback] = None,
              on_stderr: Optional[OutputCallback] = None,
              timeout: Optional[float] = None) -> "Process":
        """Starts `cmd` (a string runs through `sh -c`, a list is the argv) and returns
        its Process once it runs.

        background=True (the default): the call that started it ends at once and the
        output waits in the process's replay buffer (`replay_bytes`, default 1 MiB)
        until something reads it (iterating the handle, or callbacks); the process lives
        on after this client goes away. background=False: the handle stays attached to
        the start call's stream (nothing is missed from the first byte).

        tag: a name to find it again (`connect("web")`), 1-64 of [A-Za-z0-9._-]; no two
        running processes of a sandbox share one (AlreadyExists). stdin=True: its stdin
        is a pipe fed by `send_stdin` until `close_stdin` (else /dev/null). pty: run on a
        terminal, True (80x24) or {"cols": C, "rows": R, "term": "xterm-256color"}; see
        also `Sandbox.pty`. on_stdout/on_stderr: called from a reader thread with each
        chunk of output (then do not iterate the handle yourself).

        Errors are the server's: InvalidArgument (argv, env, tag, sizes),
        FailedPrecondition (program not found, cwd missing), PoolExhausted naming the
        limit (--max_processes, --max_ptys, --max_replay_bytes), AlreadyExists (tag)."""
        req = p.start_request(self._sb.claim_id, cmd, detach=background, tag=tag, env=env,
                              cwd=cwd, stdin=stdin, pty=p.pty_options(pty),
                              replay_bytes=replay_bytes)
        cls = Pty if req.HasField("pty") else Process
        return cls._open(self._sb, self._sb._client._sandboxes.StartProcess, req, timeout,
                         on_stdout, on_stderr, keep_stream=not background)

    def connect(self, ref: ProcessRef, *, on_stdout: Optional[OutputCallback] = None,
                on_stderr: Optional[OutputCallback] = None,
                timeout: Optional[float] = None) -> "Process":
        """Attaches to a process by pid or tag (ConnectProcess): iterating the handle
        gives what it wrote since its last reader (the replay), then its live output,
        until it ends. A process that has ended gives what is left of its output.
        NotFound: no such process (or another tenant's claim)."""
        req = sandboxes_pb2.ConnectProcessRequest(claim_id=self._sb.claim_id,
                                                  process=p.selector(ref))
        return Process._open(self._sb, self._sb._client._sandboxes.ConnectProcess, req,
                             timeout, on_stdout, on_stderr, keep_stream=True)

    def list(self) -> List[ProcessInfo]:
        """The sandbox's processes, running and kept ended ones, oldest first."""
        cl = self._sb._client
        r = cl._call(cl._sandboxes.ListProcesses,
                     sandboxes_pb2.ListProcessesRequest(claim_id=self._sb.claim_id))
        return [ProcessInfo.from_proto(x) for x in r.processes]

    def kill(self, ref: ProcessRef, signal: Union[int, str] = "KILL") -> None:
        """Sends `signal` ("KILL", "TERM", "INT", 15, ...) to the process group of the
        process `ref` (pid or tag). FailedPrecondition once it has ended."""
        _signal(self._sb, p.selector(ref), signal)

    def wait(self, ref: ProcessRef, timeout: Optional[float] = None) -> ProcessExit:
        """Waits for the process `ref` (pid or tag) to end (WaitProcess) and says how.
        timeout: seconds (None: as long as it takes); DeadlineExceeded after it (the
        process is not affected)."""
        return _wait(self._sb, p.selector(ref), timeout)

    def send_stdin(self, ref: ProcessRef, data: Union[str, bytes]) -> None:
        """Writes to the stdin (or terminal) of the process `ref`; see Process.send_stdin."""
        _send(self._sb, p.selector(ref), data)


def _signal(sb: "Sandbox", sel: sandboxes_pb2.ProcessSelector, sig: Union[int, str]) -> None:
    cl = sb._client
    cl._call(cl._sandboxes.SignalProcess, sandboxes_pb2.SignalProcessRequest(
        claim_id=sb.claim_id, process=sel, signal=c.signal_value(sig)), retry=False)


def _send(sb: "Sandbox", sel: sandboxes_pb2.ProcessSelector, data: Union[str, bytes]) -> None:
    cl = sb._client
    for chunk in p.chunks(p.input_bytes(data)):
        cl._call(cl._sandboxes.SendProcessInput, sandboxes_pb2.SendProcessInputRequest(
            claim_id=sb.claim_id, process=sel, data=chunk), retry=False)


def _wait(sb: "Sandbox", sel: sandboxes_pb2.ProcessSelector,
          timeout: Optional[float]) -> ProcessExit:
    cl = sb._client
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        slice_ = p.WAIT_SLICE if end is None else min(p.WAIT_SLICE, end - time.monotonic())
        if slice_ <= 0:
            raise DeadlineExceeded(f"process did not end within {timeout} s")
        try:
            r = cl._call(cl._sandboxes.WaitProcess, sandboxes_pb2.WaitProcessRequest(
                claim_id=sb.claim_id, process=sel), timeout=slice_)
            return ProcessExit.from_proto(r.exit)
        except DeadlineExceeded:
            if end is not None and time.monotonic() >= end:
                raise


class Process:
    """A process of a sandbox. `pid`, `tag`, `started_at`; `exit` (a ProcessExit) once
    this handle saw it end.

    Output: iterate the handle for ProcessOutput chunks (`for out in proc: ...`), or
    `proc.stdout` / `proc.stderr` for the bytes of one stream, or pass on_stdout /
    on_stderr callbacks. Only one of them reads a handle's stream; `Processes.connect`
    gives another. Iteration ends when the process ends.

    Breaking out of a loop over the handle keeps its stream: the next loop continues
    where it stopped. Not thread-safe for reading: one reader at a time. The control calls (send_stdin,
    kill, wait, ...) may come from any thread. `with` detaches at the end of the block
    (the process keeps running: kill() it if it should not)."""

    def __init__(self, sandbox: "Sandbox", started: sandboxes_pb2.ProcessStarted,
                 call=None) -> None:
        self._sb = sandbox
        self.pid: int = started.pid
        self.tag: str = started.tag
        self.started_at = c._ts(started.started_at)
        self.exit: Optional[ProcessExit] = None
        self._call = call
        self._reader: Optional[threading.Thread] = None
        self._reader_error: Optional[BaseException] = None

    @classmethod
    def _open(cls, sb: "Sandbox", method, req, timeout: Optional[float],
              on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback],
              keep_stream: bool) -> "Process":
        cl = sb._client
        # A stream that stays open has no deadline (a process may run for days); the
        # first message (`started`) must come within the call timeout.
        call = method(req, timeout=None if keep_stream else
                      (cl.timeout if timeout is None else timeout), metadata=cl._md)
        first = _first_event(call, cl.timeout if timeout is None else timeout)
        proc = cls(sb, first.started, call if keep_stream else None)
        if not keep_stream:
            _drain_quietly(call)
        if on_stdout is not None or on_stderr is not None:
            proc._start_reader(on_stdout, on_stderr)
        return proc

    def __repr__(self) -> str:
        state = "running" if self.exit is None else f"exit={self.exit.returncode}"
        tag = f" tag={self.tag!r}" if self.tag else ""
        return f"<sbx.{type(self).__name__} pid={self.pid}{tag} {state}>"

    @property
    def _sel(self) -> sandboxes_pb2.ProcessSelector:
        return sandboxes_pb2.ProcessSelector(pid=self.pid)

    # ---- output

    def _stream(self):
        if self._call is None:
            cl = self._sb._client
            self._call = cl._sandboxes.ConnectProcess(sandboxes_pb2.ConnectProcessRequest(
                claim_id=self._sb.claim_id, process=self._sel), metadata=cl._md)
        return self._call

    def __iter__(self) -> Iterator[ProcessOutput]:
        if self._reader is not None:
            raise RuntimeError("this Process is read by its callbacks; connect() again to "
                               "read it another way")
        return self._events()

    def _events(self) -> Iterator[ProcessOutput]:
        if self.exit is not None and self._call is None:
            return
        call = self._stream()
        # Breaking out of the caller's loop leaves the stream open: the next iteration
        # continues where this one stopped (a reader that detached and came back would
        # miss what was written in between). It is dropped only once it ended.
        try:
            for ev in call:
                out = p.output_of(ev)
                if out is not None:
                    yield out
                elif ev.WhichOneof("kind") == "exit":
                    self.exit = ProcessExit.from_proto(ev.exit)
        except grpc.RpcError as e:
            if self._call is call:
                self._call = None
            if e.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(e) from None
            return
        if self._call is call:
            self._call = None

    @property
    def stdout(self) -> Iterator[bytes]:
        """The process's stdout (or terminal output) as it comes, until it ends; its
        stderr is skipped."""
        return (o.data for o in self if o.stream in ("stdout", "pty"))

    @property
    def stderr(self) -> Iterator[bytes]:
        """The process's stderr as it comes, until it ends; its stdout is skipped."""
        return (o.data for o in self if o.stream == "stderr")

    def _start_reader(self, on_stdout: Optional[OutputCallback],
                      on_stderr: Optional[OutputCallback]) -> None:
        def run() -> None:
            try:
                for out in self._events():
                    fn = on_stderr if out.stream == "stderr" else on_stdout
                    if fn is not None and out.data:
                        fn(out.data)
            except BaseException as e:  # Kept for wait(), which raises it.
                self._reader_error = e
        self._reader = threading.Thread(target=run, name=f"sbx-process-{self.pid}",
                                        daemon=True)
        self._reader.start()

    # ---- control

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes to the process's stdin pipe (start(..., stdin=True)) or its terminal;
        returns once the process has taken the bytes (so calls keep their order).
        FailedPrecondition: no stdin, closed, or ended; PoolExhausted: more than 4 MiB
        waiting for it to read."""
        _send(self._sb, self._sel, data)

    def close_stdin(self) -> None:
        """End of input (after what was sent). Idempotent. FailedPrecondition for a PTY
        (send Ctrl-D, "\\x04", instead)."""
        cl = self._sb._client
        cl._call(cl._sandboxes.CloseProcessInput, sandboxes_pb2.CloseProcessInputRequest(
            claim_id=self._sb.claim_id, process=self._sel))

    def kill(self, signal: Union[int, str] = "KILL") -> None:
        """Sends `signal` (default SIGKILL) to the process's process group.
        FailedPrecondition once it has ended."""
        _signal(self._sb, self._sel, signal)

    send_signal = kill

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the process to end; returns its exit code, or -N when signal N
        killed it (as subprocess's returncode). `exit` then says more. With callbacks,
        also waits until they had all of the output. DeadlineExceeded after `timeout`
        seconds (the process is not affected)."""
        if self.exit is None:
            self.exit = _wait(self._sb, self._sel, timeout)
        if self._reader is not None:
            self._reader.join(timeout)
            if self._reader_error is not None:
                err, self._reader_error = self._reader_error, None
                raise err
        return self.exit.returncode

    def info(self) -> ProcessInfo:
        """The process as ListProcesses reports it now (NotFound once no longer kept)."""
        for x in Processes(self._sb).list():
            if x.pid == self.pid:
                return x
        from sbx.errors import NotFound
        raise NotFound(f"process {self.pid} is no longer listed")

    def detach(self) -> None:
        """Stops reading this handle's output stream (the process keeps running)."""
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    close = detach

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


class Pty(Process):
    """A process on a pseudo-terminal (`sb.pty(...)`). Iterate it for ProcessOutput
    chunks of stream "pty" (the terminal's bytes, "\\r\\n" line endings), or
    `for data in pty.stdout`. send_input() sends keystrokes ("\\x03" is Ctrl-C,
    "\\x04" Ctrl-D); resize() changes the window size (the program gets SIGWINCH)."""

    def send_input(self, data: Union[str, bytes]) -> None:
        """Keystrokes for the terminal; returns once the terminal took them."""
        self.send_stdin(data)

    def resize(self, cols: int, rows: int) -> None:
        """Sets the window size (1..1000 each; InvalidArgument outside). Takes effect
        before any input sent after this returns."""
        cl = self._sb._client
        cl._call(cl._sandboxes.ResizeProcess, sandboxes_pb2.ResizeProcessRequest(
            claim_id=self._sb.claim_id, process=self._sel,
            size=sandboxes_pb2.PtySize(cols=cols, rows=rows)))


def _first_event(call, timeout: float) -> sandboxes_pb2.ProcessEvent:
    """The `started` event of a StartProcess / ConnectProcess stream, within `timeout`
    seconds (else the call is cancelled: DeadlineExceeded)."""
    timer = threading.Timer(timeout, call.cancel)
    timer.daemon = True
    timer.start()
    try:
        ev = next(call)
    except StopIteration:
        raise SbxError("the process stream ended before `started`") from None
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED and not timer.is_alive():
            raise DeadlineExceeded(f"no answer from the sandbox within {timeout} s") from None
        raise from_rpc_error(e) from None
    finally:
        timer.cancel()
    if ev.WhichOneof("kind") != "started":
        call.cancel()
        raise SbxError(f"the process stream began with {ev.WhichOneof('kind')}, not started")
    return ev


def _drain_quietly(call) -> None:
    """A detached start's stream ends right after `started`: read its status."""
    try:
        for _ in call:
            pass
    except grpc.RpcError:
        pass


def url(sb: "Sandbox", port: int, ttl: Optional[float]) -> PortUrl:
    cl = sb._client
    return p.port_url(cl._call(cl._sandboxes.GetPortUrl, p.url_request(sb.claim_id, port, ttl)))
