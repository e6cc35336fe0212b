"""The asyncio sbx client (grpc.aio): `sbx.AsyncClient` and its handles, mirroring
`sbx.Client` method for method (every call is awaited).

Create an AsyncClient inside a running event loop (grpc.aio binds its channel to it),
preferably as `async with sbx.AsyncClient() as client:`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import tarfile
import tempfile
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Generator, Generic, List,
                    Mapping, Optional, Sequence, TypeVar, Union, overload)

import grpc
import grpc.aio

from sbx import _common as c
from sbx._common import (ClaimEvent, ClaimInfo, ExecChunk, ExecResult, FileInfo, PingResult,
                         PoolInfo, RetryPolicy, Snapshot)
from sbx.client import _exists_from_error, _extract_plain, _upload_messages
from sbx import _process as _proc
from sbx._process import PortUrl
from sbx.aio_process import AsyncProcesses, AsyncPty
from sbx.aio_process import url as _process_url
from sbx.client import FileEvent
from sbx.errors import FailedPrecondition, NotFound, SbxError, from_rpc_error
from sbx.v1 import (admin_pb2, admin_pb2_grpc, claims_pb2, claims_pb2_grpc, diagnostics_pb2,
                    diagnostics_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc, snapshots_pb2,
                    snapshots_pb2_grpc)

log = logging.getLogger("sbx")
Content = Union[str, bytes]
T = TypeVar("T")


class AsyncClient:
    """A grpc.aio connection to sbx-server; arguments as for sbx.Client."""

    def __init__(self, server: Optional[str] = None, token: Optional[str] = None, *,
                 tls: bool = False, ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, server_name: Optional[str] = None,
                 timeout: float = c.DEFAULT_TIMEOUT, retry: RetryPolicy = RetryPolicy(),
                 channel: Optional[grpc.aio.Channel] = None) -> None:
        self._settings = c.ConnectionSettings.resolve(server, token, tls, ca, cert, key,
                                                      server_name)
        if channel is None:
            creds = self._settings.credentials()
            opts = self._settings.options()
            channel = (grpc.aio.secure_channel(self._settings.target, creds, opts) if creds
                       else grpc.aio.insecure_channel(self._settings.target, opts))
        self._channel = channel
        self._md = self._settings.metadata()
        self.timeout = timeout
        self.retry = retry
        self._claims = claims_pb2_grpc.ClaimServiceStub(channel)
        self._sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)
        self._diag = diagnostics_pb2_grpc.DiagnosticsServiceStub(channel)
        self._snapshots = snapshots_pb2_grpc.SnapshotsStub(channel)
        self.snapshots = AsyncSnapshots(self)
        """The tenant's snapshots: list(), get(), delete(), awaited."""

    @property
    def target(self) -> str:
        return self._settings.target

    def __repr__(self) -> str:
        tls = "tls" if self._settings.tls else "plaintext"
        auth = ", token=***" if self._settings.token else ""
        return f"sbx.AsyncClient({self._settings.target!r}, {tls}{auth})"

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method: Callable, request, *, timeout: Optional[float] = None,
                    retry: bool = True, claim_id: Optional[str] = None):
        total = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + total
        attempt = 0
        retried_for = None  # the error that made the last retry
        while True:
            attempt += 1
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                return await method(request, timeout=remaining, metadata=self._md)
            except grpc.RpcError as e:
                err = from_rpc_error(e)
                err.claim_id = claim_id
                if (retried_for is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                        and time.monotonic() >= deadline):
                    # The call's own deadline cut a retry short: what the caller needs to
                    # know is why it was retrying (the server unreachable, say), not that
                    # the last attempt ran out of time (which one does depended on timing).
                    raise retried_for from None
                if (not retry or e.code() not in c.RETRYABLE_CODES
                        or attempt >= self.retry.max_attempts):
                    raise err from None
                pause = self.retry.backoff(attempt)
                if time.monotonic() + pause >= deadline:
                    raise err from None
                retried_for = err
                log.debug("sbx: %s, retry %d in %.3f s", err, attempt, pause)
                await asyncio.sleep(pause)

    def _claim_deadline(self, wait: Optional[float], policy: Optional[str],
                        timeout: Optional[float], image: Optional[str] = None) -> float:
        """Claim and ClaimBatch: the wait they may get (`wait`; none with policy "fail";
        else the server's default 30 s, 5 minutes by image) plus the call timeout
        (`timeout`, else the client's)."""
        return c.claim_deadline(wait, policy, self.timeout if timeout is None else timeout,
                                image=bool(image))

    async def _release_quietly(self, claim_id: str) -> None:
        try:
            await self._claims.Release(claims_pb2.ReleaseRequest(claim_id=claim_id),
                                       timeout=min(c.RELEASE_AFTER_INTERRUPT, self.timeout),
                                       metadata=self._md)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                log.warning("sbx: releasing claim %s failed: %s", claim_id, from_rpc_error(e))

    async def ping(self, payload: bytes = b"") -> PingResult:
        """DiagnosticsService.Ping."""
        r = await self._call(self._diag.Ping, diagnostics_pb2.PingRequest(payload=payload))
        return PingResult(payload=r.payload, server_version=r.server_version,
                          server_commit=r.server_commit, server_time=c._ts(r.server_time))

    def claim(self, pool: Optional[str] = None, *, image: Optional[str] = None,
              ttl: Optional[float] = None,
              env: Optional[Mapping[str, str]] = None,
              files: Optional[Mapping[str, Content]] = None,
              labels: Optional[Mapping[str, str]] = None, wait: Optional[float] = None,
              policy: Optional[str] = None, priority: Optional[str] = None,
              node_preference: Optional[Mapping[str, str]] = None,
              claim_id: Optional[str] = None,
              timeout: Optional[float] = None) -> "_Pending[AsyncSandbox]":
        """Claims a sandbox of `pool` or running `image`, as sbx.Client.claim. Use
        `async with client.claim(...) as sb:` (released at the end, also on exceptions and
        cancellation) or `sb = await client.claim(...)` then `await sb.release()`."""
        c.pool_or_image(pool, image)
        claim_id = c.check_id(claim_id, "claim_id") if claim_id else c.new_claim_id()
        req = c.claim_request(claim_id, pool, ttl, env, files, labels, wait, policy,
                              priority, node_preference, image)

        async def run() -> AsyncSandbox:
            try:
                resp = await self._call(self._claims.Claim, req, claim_id=claim_id,
                                        timeout=self._claim_deadline(wait, policy, timeout,
                                                                     image))
            except SbxError:
                raise
            except BaseException:  # Cancelled (or Ctrl-C) while the claim was on its way.
                await asyncio.shield(self._release_quietly(claim_id))
                raise
            return AsyncSandbox(self, ClaimInfo.from_proto(resp.claim), replayed=resp.replayed)
        return _Pending(run)

    def claim_batch(self, pool: Optional[str] = None, n: Optional[int] = None, *,
                    image: Optional[str] = None, best_effort: bool = False,
                    batch_id: Optional[str] = None, ttl: Optional[float] = None,
                    env: Optional[Mapping[str, str]] = None,
                    files: Optional[Mapping[str, Content]] = None,
                    labels: Optional[Mapping[str, str]] = None, wait: Optional[float] = None,
                    policy: Optional[str] = None, priority: Optional[str] = None,
                    node_preference: Optional[Mapping[str, str]] = None,
                    timeout: Optional[float] = None) -> "_Pending[AsyncSandboxGroup]":
        """ClaimBatch, as sbx.Client.claim_batch (by pool or by image); `async with` or
        await."""
        c.pool_or_image(pool, image)
        if n is None:
            raise TypeError("claim_batch() needs n, the number of sandboxes")
        batch_id = c.check_id(batch_id, "batch_id") if batch_id else c.new_claim_id("pyb")
        req = c.batch_request(batch_id, pool, n, best_effort, ttl, env, files, labels, wait,
                              policy, priority, node_preference, image)

        async def run() -> AsyncSandboxGroup:
            try:
                resp = await self._call(self._claims.ClaimBatch, req, claim_id=batch_id,
                                        timeout=self._claim_deadline(wait, policy, timeout,
                                                                     image))
            except SbxError:
                raise
            except BaseException:
                await asyncio.shield(asyncio.gather(
                    *(self._release_quietly(f"{batch_id}#{i}") for i in range(n))))
                raise
            return AsyncSandboxGroup(
                self, resp.batch_id,
                [AsyncSandbox(self, ClaimInfo.from_proto(x), replayed=resp.replayed)
                 for x in resp.claims], replayed=resp.replayed)
        return _Pending(run)

    def fork(self, source: Union[Snapshot, str, "AsyncSandbox"], count: int, *,
             batch_id: Optional[str] = None, ttl: Optional[float] = None,
             labels: Optional[Mapping[str, str]] = None,
             env: Optional[Mapping[str, str]] = None,
             files: Optional[Mapping[str, Content]] = None, wait: Optional[float] = None,
             timeout: Optional[float] = None) -> "_Pending[AsyncSandboxGroup]":
        """Snapshots.Fork, as sbx.Client.fork (a Snapshot, a snapshot id or an
        AsyncSandbox as source; the batch id generated here when not given and reused by
        every retry); `async with` (released at the end) or await."""
        batch_id = c.check_id(batch_id, "batch_id") if batch_id else c.new_claim_id("pyf")
        req = c.fork_request(source, count, batch_id, ttl, labels, env, files, wait)

        async def run() -> AsyncSandboxGroup:
            try:
                resp = await self._call(
                    self._snapshots.Fork, req, claim_id=batch_id,
                    timeout=c.fork_deadline(wait, self.timeout if timeout is None else timeout))
            except SbxError:
                raise
            except BaseException:  # Cancelled while the forks were on their way.
                await asyncio.shield(asyncio.gather(
                    *(self._release_quietly(f"{batch_id}#{i}") for i in range(count))))
                raise
            return AsyncSandboxGroup(
                self, resp.batch_id,
                [AsyncSandbox(self, ClaimInfo.from_proto(x), replayed=resp.replayed)
                 for x in resp.claims], replayed=resp.replayed, snapshot_id=resp.snapshot_id)
        return _Pending(run)

    async def attach(self, claim_id: str) -> "AsyncSandbox":
        """A handle on an existing claim."""
        return AsyncSandbox(self, await self.get_claim(claim_id))

    async def get_claim(self, claim_id: str) -> ClaimInfo:
        r = await self._call(self._claims.GetClaim,
                             claims_pb2.GetClaimRequest(claim_id=claim_id))
        return ClaimInfo.from_proto(r.claim)

    async def release(self, claim_id: str) -> ClaimInfo:
        r = await self._call(self._claims.Release, claims_pb2.ReleaseRequest(claim_id=claim_id))
        return ClaimInfo.from_proto(r.claim)

    async def list_claims(self, *, pool: Optional[str] = None, selector: Optional[str] = None,
                          labels: Optional[Mapping[str, str]] = None,
                          states: Optional[Sequence[str]] = None,
                          owner: Optional[str] = None) -> List[ClaimInfo]:
        f = c.claim_filter(pool, selector, labels, states, owner)
        out: List[ClaimInfo] = []
        token = ""
        while True:
            r = await self._call(self._claims.ListClaims, claims_pb2.ListClaimsRequest(
                filter=f, page_size=1000, page_token=token))
            out.extend(ClaimInfo.from_proto(x) for x in r.claims)
            token = r.next_page_token
            if not token:
                return out

    async def pools(self, template: Optional[str] = None) -> List[PoolInfo]:
        out: List[PoolInfo] = []
        token = ""
        while True:
            r = await self._call(self._admin.ListPools, admin_pb2.ListPoolsRequest(
                page_size=1000, page_token=token, template=template or ""))
            out.extend(PoolInfo.from_proto(p) for p in r.pools)
            token = r.next_page_token
            if not token:
                return out

    def watch_claims(self, *, pool: Optional[str] = None, selector: Optional[str] = None,
                     labels: Optional[Mapping[str, str]] = None, start_revision: int = 0
                     ) -> "AsyncClaimWatch":
        """WatchClaims: `async for event in client.watch_claims(...)`; cancel() ends it."""
        req = claims_pb2.WatchClaimsRequest(
            filter=c.claim_filter(pool, selector, labels, None, None),
            start_revision=start_revision)
        return AsyncClaimWatch(self._claims.WatchClaims(req, metadata=self._md))


class _Pending(Generic[T]):
    """What AsyncClient.claim / claim_batch return: await it for the handle, or use it
    with `async with` to release at the end."""

    def __init__(self, run: Callable[[], Awaitable[T]]) -> None:
        self._run = run
        self._value: Optional[T] = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._run().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._run()
        return self._value

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._value.__aexit__(exc_type, exc, tb)  # type: ignore[union-attr]


class AsyncSandbox(c.SandboxView):
    """A claimed sandbox (asyncio). Every method of sbx.Sandbox, awaited."""

    def __init__(self, client: AsyncClient, info: ClaimInfo, replayed: bool = False) -> None:
        self._client = client
        self.info = info
        self.replayed = replayed
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self._released = False

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            await self.release()
            return
        try:
            await asyncio.shield(self.release())
        except BaseException as e:
            log.warning("sbx: releasing claim %s failed: %s", self.claim_id, e)

    async def release(self) -> ClaimInfo:
        self.info = await self._client.release(self.claim_id)
        self._released = True
        return self.info

    async def refresh(self) -> ClaimInfo:
        self.info = await self._client.get_claim(self.claim_id)
        return self.info

    async def snapshot(self, name: Optional[str] = None,
                       labels: Optional[Mapping[str, str]] = None, *,
                       timeout: Optional[float] = None) -> Snapshot:
        """CreateSnapshot, as sbx.Sandbox.snapshot (not retried automatically)."""
        cl = self._client
        r = await cl._call(cl._snapshots.CreateSnapshot,
                           c.create_snapshot_request(self.claim_id, name, labels),
                           retry=False, timeout=timeout)
        return Snapshot.from_proto(r.snapshot, r.dropped_entries)

    async def reset(self, snapshot: Union[Snapshot, str], *,
                    timeout: Optional[float] = None) -> None:
        """Reset to `snapshot`, as sbx.Sandbox.reset (not retried automatically)."""
        cl = self._client
        sid = c.snapshot_id_of(snapshot, "reset()")
        await cl._call(cl._snapshots.Reset,
                       snapshots_pb2.ResetRequest(claim_id=self.claim_id, snapshot_id=sid),
                       retry=False, timeout=timeout)
        self.info = dataclasses.replace(self.info, suspended=False)

    async def renew(self, ttl: Optional[float] = None) -> ClaimInfo:
        req = claims_pb2.RenewRequest(claim_id=self.claim_id)
        c.set_duration(req.ttl, ttl)
        r = await self._client._call(self._client._claims.Renew, req)
        self.info = ClaimInfo.from_proto(r.claim)
        return self.info

    async def suspend(self) -> None:
        await self._client._call(self._client._sandboxes.Suspend,
                                 sandboxes_pb2.SuspendRequest(claim_id=self.claim_id))
        self.info = dataclasses.replace(self.info, suspended=True)

    async def resume(self) -> None:
        await self._client._call(self._client._sandboxes.Resume,
                                 sandboxes_pb2.ResumeRequest(claim_id=self.claim_id))
        self.info = dataclasses.replace(self.info, suspended=False)

    async def exec(self, cmd: Union[str, Sequence[str]], *,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   stdin: Union[None, str, bytes] = None, timeout: Optional[float] = None,
                   max_output_bytes: Optional[int] = None) -> ExecResult:
        """As sbx.Sandbox.exec."""
        data = c.stdin_bytes(stdin)
        stream = await self.exec_stream(cmd, env=env, cwd=cwd, stdin=data is not None,
                                        timeout=timeout, max_output_bytes=max_output_bytes)
        try:
            if data is not None:
                await stream.write(data)
                await stream.close_stdin()
            return await stream.wait()
        except BaseException:
            stream.cancel()
            raise

    async def exec_stream(self, cmd: Union[str, Sequence[str]], *,
                          env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                          stdin: bool = False, timeout: Optional[float] = None,
                          max_output_bytes: Optional[int] = None) -> "AsyncExecStream":
        """As sbx.Sandbox.exec_stream: `async for chunk in stream`, await write(),
        send_signal(), wait()."""
        start = c.exec_start(self.claim_id, cmd, env, cwd, timeout, max_output_bytes, stdin)
        s = AsyncExecStream(self._client, c.exec_deadline(timeout, self._client.timeout))
        await s._start(start)
        return s

    async def pty(self, *, cols: int = 80, rows: int = 24, term: Optional[str] = None,
                  cmd: Union[None, str, Sequence[str]] = None, tag: Optional[str] = None,
                  env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  timeout: Optional[float] = None) -> AsyncPty:
        """As sbx.Sandbox.pty: `async for out in pty`, await send_input(), resize(),
        wait()."""
        size = {"cols": cols, "rows": rows, "term": term or ""}
        proc = await self.processes.start(_proc.DEFAULT_PTY_CMD if cmd is None else cmd,
                                          background=False, tag=tag, env=env, cwd=cwd,
                                          pty=size, timeout=timeout)
        assert isinstance(proc, AsyncPty)
        return proc

    async def url(self, port: int, *, ttl: Optional[float] = None) -> PortUrl:
        """As sbx.Sandbox.url: a signed URL through the server's port proxy."""
        return await _process_url(self, port, ttl)


class AsyncExecStream:
    """A running command (asyncio)."""

    def __init__(self, client: AsyncClient, deadline: float) -> None:
        self._call = client._sandboxes.Exec(timeout=deadline, metadata=client._md)
        self.pid = 0
        self.result: Optional[ExecResult] = None
        self._out = bytearray()
        self._err = bytearray()
        self._writing = True

    def __repr__(self) -> str:
        state = "running" if self.result is None else repr(self.result)
        return f"<sbx.AsyncExecStream pid={self.pid} {state}>"

    async def _start(self, start: sandboxes_pb2.ExecRequest) -> None:
        await self._write(start)
        first = await self._read()
        if first is not None and first.WhichOneof("kind") == "started":
            self.pid = first.started.pid

    async def _read(self):
        try:
            r = await self._call.read()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return None if r is grpc.aio.EOF else r

    async def _write(self, req) -> None:
        try:
            await self._call.write(req)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except asyncio.InvalidStateError:
            raise FailedPrecondition("the command has ended; its stream is closed") from None

    async def write(self, data: Union[str, bytes]) -> None:
        b = c.stdin_bytes(data) or b""
        for i in range(0, len(b), c.CHUNK):
            await self._write(sandboxes_pb2.ExecRequest(stdin_chunk=b[i:i + c.CHUNK]))

    async def close_stdin(self) -> None:
        await self._write(sandboxes_pb2.ExecRequest(close_stdin=sandboxes_pb2.ExecCloseStdin()))

    async def send_signal(self, sig: Union[int, str]) -> None:
        await self._write(sandboxes_pb2.ExecRequest(
            signal=sandboxes_pb2.ExecSignal(signal=c.signal_value(sig))))

    async def _done_writing(self) -> None:
        if self._writing:
            self._writing = False
            try:
                await self._call.done_writing()
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass

    def __aiter__(self) -> AsyncIterator[ExecChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[ExecChunk]:
        while self.result is None:
            r = await self._read()
            if r is None:
                raise SbxError("the Exec stream ended without an exit message")
            kind = r.WhichOneof("kind")
            if kind == "stdout_chunk":
                yield ExecChunk("stdout", r.stdout_chunk)
            elif kind == "stderr_chunk":
                yield ExecChunk("stderr", r.stderr_chunk)
            elif kind == "exit":
                self.result = c.exec_result(self.pid, b"", b"", r.exit)
                await self._done_writing()

    async def wait(self) -> ExecResult:
        """Waits for the end; the result holds the output not consumed by iterating."""
        async for chunk in self:
            (self._out if chunk.stream == "stdout" else self._err).extend(chunk.data)
        assert self.result is not None
        self.result = dataclasses.replace(self.result, stdout_raw=bytes(self._out),
                                          stderr_raw=bytes(self._err))
        return self.result

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self) -> "AsyncExecStream":
        return self

    async def __aexit__(self, *exc) -> None:
        if self.result is None:
            self.cancel()


class AsyncClaimWatch:
    """An open WatchClaims stream: `async for event in watch`."""

    def __init__(self, call) -> None:
        self._call = call
        self._cancelled = False

    def __aiter__(self) -> AsyncIterator[ClaimEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ClaimEvent]:
        try:
            async for e in self._call:
                yield ClaimEvent.from_proto(e)
        except asyncio.CancelledError:
            if self._cancelled:
                return
            raise
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> "AsyncClaimWatch":
        return self

    async def __aexit__(self, *exc) -> None:
        self.cancel()


class AsyncSandboxGroup(Sequence[AsyncSandbox]):
    """The sandboxes of one claim_batch() (asyncio); `await release()` ends them all."""

    def __init__(self, client: AsyncClient, batch_id: str, sandboxes: List[AsyncSandbox],
                 replayed: bool = False, snapshot_id: str = "") -> None:
        self._client = client
        self.batch_id = batch_id
        self.sandboxes = sandboxes
        self.replayed = replayed
        self.snapshot_id = snapshot_id

    @overload
    def __getitem__(self, i: int) -> AsyncSandbox: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[AsyncSandbox]: ...

    def __getitem__(self, i):
        return self.sandboxes[i]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __repr__(self) -> str:
        pool = self.sandboxes[0].pool if self.sandboxes else ""
        return f"<sbx.AsyncSandboxGroup batch_id={self.batch_id!r} pool={pool!r} n={len(self)}>"

    async def release(self, parallelism: int = 64) -> None:
        sem = asyncio.Semaphore(max(1, parallelism))

        async def one(sb: AsyncSandbox) -> None:
            async with sem:
                await sb.release()
        results = await asyncio.gather(*(one(sb) for sb in self.sandboxes),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def __aenter__(self) -> "AsyncSandboxGroup":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            await self.release()
            return
        try:
            await asyncio.shield(self.release())
        except BaseException as e:
            log.warning("sbx: releasing batch %s failed: %s", self.batch_id, e)


class AsyncSnapshots:
    """The tenant's snapshots (`client.snapshots`, asyncio); as sbx.Snapshots."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def __repr__(self) -> str:
        return f"<sbx.AsyncSnapshots of {self._client.target!r}>"

    async def list(self, labels: Optional[Mapping[str, str]] = None) -> List[Snapshot]:
        cl = self._client
        r = await cl._call(cl._snapshots.ListSnapshots,
                           snapshots_pb2.ListSnapshotsRequest(label_selector=dict(labels or {})))
        return [Snapshot.from_proto(s) for s in r.snapshots]

    async def usage(self) -> "tuple[int, int]":
        cl = self._client
        r = await cl._call(cl._snapshots.ListSnapshots, snapshots_pb2.ListSnapshotsRequest())
        return r.used_bytes, r.quota_bytes

    async def get(self, snapshot: Union[Snapshot, str]) -> Snapshot:
        cl = self._client
        r = await cl._call(cl._snapshots.GetSnapshot, snapshots_pb2.GetSnapshotRequest(
            snapshot_id=c.snapshot_id_of(snapshot, "snapshots.get()")))
        return Snapshot.from_proto(r.snapshot)

    async def delete(self, snapshot: Union[Snapshot, str]) -> None:
        cl = self._client
        await cl._call(cl._snapshots.DeleteSnapshot, snapshots_pb2.DeleteSnapshotRequest(
            snapshot_id=c.snapshot_id_of(snapshot, "snapshots.delete()")), retry=False)


class AsyncFiles:
    """File calls on one sandbox's workspace (asyncio); as sbx.Files."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    def __repr__(self) -> str:
        return f"<sbx.AsyncFiles of {self._sb.claim_id!r}>"

    async def write(self, path: str, data: Content, *, mode: Optional[int] = None,
                    append: bool = False, make_parents: bool = True) -> int:
        b = data.encode() if isinstance(data, str) else bytes(data)
        cl = self._sb._client
        size = 0
        for i, off in enumerate(range(0, max(len(b), 1), c.CHUNK)):
            app = append or i > 0
            req = sandboxes_pb2.WriteFileRequest(
                claim_id=self._sb.claim_id, path=path, content=b[off:off + c.CHUNK],
                mode=mode or 0, append=app, create_parents=make_parents)
            size = (await cl._call(cl._sandboxes.WriteFile, req, retry=not app)).size
        return size

    async def read(self, path: str) -> bytes:
        cl = self._sb._client
        out = bytearray()
        while True:
            r = await cl._call(cl._sandboxes.ReadFile, sandboxes_pb2.ReadFileRequest(
                claim_id=self._sb.claim_id, path=path, offset=len(out), limit=c.CHUNK))
            out += r.content
            if r.eof or not r.content:
                return bytes(out)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def list(self, path: str = "", *, recursive: bool = False) -> List[FileInfo]:
        cl = self._sb._client
        out: List[FileInfo] = []
        token = ""
        while True:
            r = await cl._call(cl._sandboxes.ListFiles, sandboxes_pb2.ListFilesRequest(
                claim_id=self._sb.claim_id, path=path, recursive=recursive, page_size=1000,
                page_token=token))
            out.extend(FileInfo.from_proto(f) for f in r.files)
            token = r.next_page_token
            if not token:
                return out

    async def exists(self, path: str) -> bool:
        cl = self._sb._client
        try:
            await cl._call(cl._sandboxes.ReadFile, sandboxes_pb2.ReadFileRequest(
                claim_id=self._sb.claim_id, path=path, offset=1 << 62, limit=1))
            return True
        except (NotFound, FailedPrecondition) as e:
            return _exists_from_error(e)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """As sbx.Files.remove (the Remove call)."""
        cl = self._sb._client
        await cl._call(cl._sandboxes.Remove, sandboxes_pb2.RemoveRequest(
            claim_id=self._sb.claim_id, path=path, recursive=recursive), retry=False)

    # ---- streamed files: as sbx.Files (any size, constant memory; absolute paths name
    # the sandbox's own root). Local file reads and writes are small blocking calls.

    async def _upload(self, method: Callable, start, f, timeout: Optional[float]):
        cl = self._sb._client
        try:
            return await method(_upload_messages(start, f),
                                timeout=3600.0 if timeout is None else timeout,
                                metadata=cl._md)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def _download(self, method: Callable, req, out, timeout: Optional[float]) -> int:
        cl = self._sb._client
        n = 0
        try:
            async for chunk in method(req, timeout=3600.0 if timeout is None else timeout,
                                      metadata=cl._md):
                out.write(chunk.data)
                n += len(chunk.data)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return n

    async def upload(self, path: str, source, *, mode: Optional[int] = None,
                     make_parents: bool = True, timeout: Optional[float] = None) -> int:
        """As sbx.Files.upload."""
        if isinstance(source, str):
            with open(source, "rb") as f:
                if mode is None:
                    mode = os.fstat(f.fileno()).st_mode & 0o7777
                return await self.upload(path, f, mode=mode, make_parents=make_parents,
                                         timeout=timeout)
        f = io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview)) \
            else source
        start = sandboxes_pb2.UploadStart(claim_id=self._sb.claim_id, path=path,
                                          mode=mode or 0, create_parents=make_parents)
        cl = self._sb._client
        return (await self._upload(cl._sandboxes.UploadFile, start, f, timeout)).bytes

    async def download(self, path: str, dest=None, *, timeout: Optional[float] = None):
        """As sbx.Files.download: the content, or the bytes written into `dest`."""
        cl = self._sb._client
        req = sandboxes_pb2.DownloadRequest(claim_id=self._sb.claim_id, path=path)
        if dest is None:
            buf = io.BytesIO()
            await self._download(cl._sandboxes.DownloadFile, req, buf, timeout)
            return buf.getvalue()
        if isinstance(dest, str):
            folder = os.path.dirname(os.path.abspath(dest))
            fd, temp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(dest) + ".sbx-")
            try:
                with os.fdopen(fd, "wb") as f:
                    n = await self._download(cl._sandboxes.DownloadFile, req, f, timeout)
                os.replace(temp, dest)
                return n
            except BaseException:
                os.unlink(temp)
                raise
        return await self._download(cl._sandboxes.DownloadFile, req, dest, timeout)

    async def upload_dir(self, local_dir: str, path: str = "", *,
                         timeout: Optional[float] = None) -> int:
        """As sbx.Files.upload_dir; returns the number of entries."""
        cl = self._sb._client
        with tempfile.TemporaryFile() as spool:
            with tarfile.open(fileobj=spool, mode="w") as t:
                for name in sorted(os.listdir(local_dir)):
                    t.add(os.path.join(local_dir, name), arcname=name)
            spool.seek(0)
            start = sandboxes_pb2.UploadStart(claim_id=self._sb.claim_id, path=path)
            return (await self._upload(cl._sandboxes.UploadTar, start, spool, timeout)).entries

    async def download_tar(self, path: str, dest, *, timeout: Optional[float] = None) -> int:
        """As sbx.Files.download_tar (`dest` a binary file object)."""
        cl = self._sb._client
        req = sandboxes_pb2.DownloadRequest(claim_id=self._sb.claim_id, path=path)
        return await self._download(cl._sandboxes.DownloadTar, req, dest, timeout)

    async def download_dir(self, path: str, local_dir: str, *,
                           timeout: Optional[float] = None) -> int:
        """As sbx.Files.download_dir (directories and regular files only, never a link)."""
        with tempfile.TemporaryFile() as spool:
            await self.download_tar(path, spool, timeout=timeout)
            spool.seek(0)
            return _extract_plain(spool, local_dir)

    async def stat(self, path: str) -> FileInfo:
        cl = self._sb._client
        return FileInfo.from_proto((await cl._call(cl._sandboxes.Stat, sandboxes_pb2.StatRequest(
            claim_id=self._sb.claim_id, path=path))).file)

    async def make_dir(self, path: str, *, parents: bool = True,
                       mode: Optional[int] = None) -> None:
        cl = self._sb._client
        await cl._call(cl._sandboxes.MakeDir, sandboxes_pb2.MakeDirRequest(
            claim_id=self._sb.claim_id, path=path, parents=parents, mode=mode or 0))

    async def move(self, src: str, dst: str, *, overwrite: bool = False,
                   make_parents: bool = False) -> None:
        cl = self._sb._client
        await cl._call(cl._sandboxes.Move, sandboxes_pb2.MoveRequest(
            claim_id=self._sb.claim_id, to=dst, overwrite=overwrite,
            create_parents=make_parents, **{"from": src}), retry=False)

    def watch(self, path: str = "", *, recursive: bool = False,
              timeout: Optional[float] = None) -> "_PendingWatch":
        """As sbx.Files.watch: `async with sb.files.watch("src") as w: async for ev in w`
        (or `w = await sb.files.watch(...)`). The watch is set up once the await (or the
        `async with`) returns; FileEvent(type, path, is_dir) as the sync one."""
        cl = self._sb._client

        async def run() -> "AsyncFileWatch":
            call = cl._sandboxes.WatchDir(sandboxes_pb2.WatchDirRequest(
                claim_id=self._sb.claim_id, path=path, recursive=recursive),
                timeout=timeout, metadata=cl._md)
            try:
                await call.read()  # `ready`, or the error
            except grpc.RpcError as e:
                raise from_rpc_error(e) from None
            return AsyncFileWatch(call)
        return _PendingWatch(run)


class AsyncFileWatch:
    """The stream of AsyncFiles.watch: `async for ev in watch` gives FileEvents."""

    def __init__(self, call) -> None:
        self._call = call

    def __aiter__(self) -> AsyncIterator[FileEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[FileEvent]:
        try:
            while True:
                e = await self._call.read()  # not `async for`: read() was used already
                if e is grpc.aio.EOF:
                    return
                if e.overflow:
                    yield FileEvent("overflow", "")
                elif not e.ready:
                    kind = sandboxes_pb2.FileEventType.Name(e.type)
                    yield FileEvent(kind.replace("FILE_EVENT_", "").lower(), e.path, e.is_dir)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self) -> "AsyncFileWatch":
        return self

    async def __aexit__(self, *exc) -> None:
        self.cancel()


class _PendingWatch(_Pending["AsyncFileWatch"]):
    """`await files.watch(...)` or `async with files.watch(...) as w`."""

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._value is not None:
            self._value.cancel()
