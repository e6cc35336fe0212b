"""Processes that outlive a call (asyncio): `sb.processes` of an AsyncSandbox
(`AsyncProcesses`), `AsyncProcess` and `AsyncPty`, mirroring sbx.process method for
method (every call is awaited, output is `async for`)."""

from __future__ import annotations

import asyncio
import time
from typing import (TYPE_CHECKING, AsyncIterator, Awaitable, Callable, List, Mapping,
                    Optional, Sequence, Union)

import grpc
import grpc.aio

from sbx import _common as c
from sbx import _process as p
from sbx._process import PortUrl, ProcessExit, ProcessInfo, ProcessOutput, ProcessRef
from sbx.errors import DeadlineExceeded, NotFound, SbxError, from_rpc_error
from sbx.v1 import sandboxes_pb2

if TYPE_CHECKING:  # pragma: no cover
    from sbx.aio import AsyncSandbox

# A callback may be a plain function or a coroutine function.
AsyncOutputCallback = Callable[[bytes], Union[None, Awaitable[None]]]


class AsyncProcesses:
    """The processes of one sandbox (asyncio); as sbx.Processes."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    def __repr__(self) -> str:
        return f"<sbx.AsyncProcesses of {self._sb.claim_id!r}>"

    async def start(self, cmd: Union[str, Sequence[str]], *, background: bool = True,
                    tag: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None, stdin: bool = False,
                    pty: Union[None, bool, Mapping[str, object]] = None,
                    replay_bytes: Optional[int] = None,
                    on_stdout: Optional[AsyncOutputCallback] = None,
                    on_stderr: Optional[AsyncOutputCallback] = None,
                    timeout: Optional[float] = None) -> "AsyncProcess":
        """As sbx.Processes.start; callbacks run in a task of the running loop."""
        req = p.start_request(self._sb.claim_id, cmd, detach=background, tag=tag, env=env,
                              cwd=cwd, stdin=stdin, pty=p.pty_options(pty),
                              replay_bytes=replay_bytes)
        cls = AsyncPty if req.HasField("pty") else AsyncProcess
        return await cls._open(self._sb, self._sb._client._sandboxes.StartProcess, req,
                               timeout, on_stdout, on_stderr, keep_stream=not background)

    async def connect(self, ref: ProcessRef, *, on_stdout: Optional[AsyncOutputCallback] = None,
                      on_stderr: Optional[AsyncOutputCallback] = None,
                      timeout: Optional[float] = None) -> "AsyncProcess":
        """As sbx.Processes.connect: the replay, then live output, until it ends."""
        req = sandboxes_pb2.ConnectProcessRequest(claim_id=self._sb.claim_id,
                                                  process=p.selector(ref))
        return await AsyncProcess._open(self._sb, self._sb._client._sandboxes.ConnectProcess,
                                        req, timeout, on_stdout, on_stderr, keep_stream=True)

    async def list(self) -> List[ProcessInfo]:
        """The sandbox's processes, running and kept ended ones, oldest first."""
        cl = self._sb._client
        r = await cl._call(cl._sandboxes.ListProcesses,
                           sandboxes_pb2.ListProcessesRequest(claim_id=self._sb.claim_id))
        return [ProcessInfo.from_proto(x) for x in r.processes]

    async def kill(self, ref: ProcessRef, signal: Union[int, str] = "KILL") -> None:
        """As sbx.Processes.kill."""
        await _signal(self._sb, p.selector(ref), signal)

    async def wait(self, ref: ProcessRef, timeout: Optional[float] = None) -> ProcessExit:
        """As sbx.Processes.wait."""
        return await _wait(self._sb, p.selector(ref), timeout)

    async def send_stdin(self, ref: ProcessRef, data: Union[str, bytes]) -> None:
        """As sbx.Processes.send_stdin."""
        await _send(self._sb, p.selector(ref), data)


async def _signal(sb: "AsyncSandbox", sel, sig: Union[int, str]) -> None:
    cl = sb._client
    await cl._call(cl._sandboxes.SignalProcess, sandboxes_pb2.SignalProcessRequest(
        claim_id=sb.claim_id, process=sel, signal=c.signal_value(sig)), retry=False)


async def _send(sb: "AsyncSandbox", sel, data: Union[str, bytes]) -> None:
    cl = sb._client
    for chunk in p.chunks(p.input_bytes(data)):
        await cl._call(cl._sandboxes.SendProcessInput, sandboxes_pb2.SendProcessInputRequest(
            claim_id=sb.claim_id, process=sel, data=chunk), retry=False)


async def _wait(sb: "AsyncSandbox", sel, timeout: Optional[float]) -> ProcessExit:
    cl = sb._client
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        slice_ = p.WAIT_SLICE if end is None else min(p.WAIT_SLICE, end - time.monotonic())
        if slice_ <= 0:
            raise DeadlineExceeded(f"process did not end within {timeout} s")
        try:
            r = await cl._call(cl._sandboxes.WaitProcess, sandboxes_pb2.WaitProcessRequest(
                claim_id=sb.claim_id, process=sel), timeout=slice_)
            return ProcessExit.from_proto(r.exit)
        except DeadlineExceeded:
            if end is not None and time.monotonic() >= end:
                raise


class AsyncProcess:
    """A process of a sandbox (asyncio); as sbx.Process: `async for out in proc`,
    `proc.stdout` / `proc.stderr` (async iterators of bytes), callbacks, and awaited
    send_stdin / close_stdin / kill / wait / info. `async with` detaches at the end."""

    def __init__(self, sandbox: "AsyncSandbox", started: sandboxes_pb2.ProcessStarted,
                 call=None) -> None:
        self._sb = sandbox
        self.pid: int = started.pid
        self.tag: str = started.tag
        self.started_at = c._ts(started.started_at)
        self.exit: Optional[ProcessExit] = None
        self._call = call
        self._reader: Optional[asyncio.Task] = None

    @classmethod
    async def _open(cls, sb: "AsyncSandbox", method, req, timeout: Optional[float],
                    on_stdout: Optional[AsyncOutputCallback],
                    on_stderr: Optional[AsyncOutputCallback], keep_stream: bool
                    ) -> "AsyncProcess":
        cl = sb._client
        limit = cl.timeout if timeout is None else timeout
        call = method(req, timeout=None if keep_stream else limit, metadata=cl._md)
        try:
            ev = await asyncio.wait_for(call.read(), limit)
        except asyncio.TimeoutError:
            call.cancel()
            raise DeadlineExceeded(f"no answer from the sandbox within {limit} s") from None
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()
            raise
        if ev is grpc.aio.EOF:
            raise SbxError("the process stream ended before `started`")
        if ev.WhichOneof("kind") != "started":
            call.cancel()
            raise SbxError(f"the process stream began with {ev.WhichOneof('kind')}, "
                           "not started")
        proc = cls(sb, ev.started, call if keep_stream else None)
        if not keep_stream:
            await call.code()  # a detached start's call ends right after `started`
        if on_stdout is not None or on_stderr is not None:
            proc._reader = asyncio.ensure_future(proc._feed(on_stdout, on_stderr))
        return proc

    def __repr__(self) -> str:
        state = "running" if self.exit is None else f"exit={self.exit.returncode}"
        tag = f" tag={self.tag!r}" if self.tag else ""
        return f"<sbx.{type(self).__name__} pid={self.pid}{tag} {state}>"

    @property
    def _sel(self) -> sandboxes_pb2.ProcessSelector:
        return sandboxes_pb2.ProcessSelector(pid=self.pid)

    def __aiter__(self) -> AsyncIterator[ProcessOutput]:
        if self._reader is not None:
            raise RuntimeError("this AsyncProcess is read by its callbacks; connect() "
                               "again to read it another way")
        return self._events()

    async def _events(self) -> AsyncIterator[ProcessOutput]:
        if self.exit is not None and self._call is None:
            return
        if self._call is None:
            cl = self._sb._client
            self._call = cl._sandboxes.ConnectProcess(sandboxes_pb2.ConnectProcessRequest(
                claim_id=self._sb.claim_id, process=self._sel), metadata=cl._md)
        call = self._call
        # Leaving the caller's loop (break) keeps the stream for the next one; it is
        # dropped once it ended, or cancelled with the task.
        try:
            while True:
                # read(), not `async for`: grpc.aio refuses both on one call, and the
                # first message was read() already.
                ev = await call.read()
                if ev is grpc.aio.EOF:
                    break
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
        except asyncio.CancelledError:
            if self._call is call:
                self._call = None
            call.cancel()
            raise
        if self._call is call:
            self._call = None

    @property
    def stdout(self) -> AsyncIterator[bytes]:
        """stdout (or terminal output) chunks until the process ends; stderr skipped."""
        return self._only(("stdout", "pty"))

    @property
    def stderr(self) -> AsyncIterator[bytes]:
        """stderr chunks until the process ends; stdout skipped."""
        return self._only(("stderr",))

    async def _only(self, streams) -> AsyncIterator[bytes]:
        async for out in self:
            if out.stream in streams:
                yield out.data

    async def _feed(self, on_stdout, on_stderr) -> None:
        async for out in self._events():
            fn = on_stderr if out.stream == "stderr" else on_stdout
            if fn is not None and out.data:
                r = fn(out.data)
                if asyncio.iscoroutine(r):
                    await r

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        """As sbx.Process.send_stdin."""
        await _send(self._sb, self._sel, data)

    async def close_stdin(self) -> None:
        """As sbx.Process.close_stdin."""
        cl = self._sb._client
        await cl._call(cl._sandboxes.CloseProcessInput, sandboxes_pb2.CloseProcessInputRequest(
            claim_id=self._sb.claim_id, process=self._sel))

    async def kill(self, signal: Union[int, str] = "KILL") -> None:
        """As sbx.Process.kill."""
        await _signal(self._sb, self._sel, signal)

    send_signal = kill

    async def wait(self, timeout: Optional[float] = None) -> int:
        """As sbx.Process.wait: the exit code, or -N for signal N."""
        if self.exit is None:
            self.exit = await _wait(self._sb, self._sel, timeout)
        if self._reader is not None:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        return self.exit.returncode

    async def info(self) -> ProcessInfo:
        for x in await AsyncProcesses(self._sb).list():
            if x.pid == self.pid:
                return x
        raise NotFound(f"process {self.pid} is no longer listed")

    def detach(self) -> None:
        """Stops reading this handle's output (the process keeps running)."""
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()

    close = detach

    async def __aenter__(self) -> "AsyncProcess":
        return self

    async def __aexit__(self, *exc) -> None:
        self.detach()


class AsyncPty(AsyncProcess):
    """A process on a pseudo-terminal (asyncio); as sbx.Pty."""

    async def send_input(self, data: Union[str, bytes]) -> None:
        await self.send_stdin(data)

    async def resize(self, cols: int, rows: int) -> None:
        cl = self._sb._client
        await cl._call(cl._sandboxes.ResizeProcess, sandboxes_pb2.ResizeProcessRequest(
            claim_id=self._sb.claim_id, process=self._sel,
            size=sandboxes_pb2.PtySize(cols=cols, rows=rows)))


async def url(sb: "AsyncSandbox", port: int, ttl: Optional[float]) -> PortUrl:
    cl = sb._client
    return p.port_url(await cl._call(cl._sandboxes.GetPortUrl,
                                     p.url_request(sb.claim_id, port, ttl)))
