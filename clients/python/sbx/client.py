"""The synchronous sbx client: `sbx.Client`, `Sandbox`, `SandboxGroup`, `Files`,
`ExecStream`, `ClaimWatch`.

Thread-safety: a Client (one gRPC channel) may be shared by any number of threads; a
Sandbox handle too, except that one ExecStream belongs to one thread at a time.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import queue
import shutil
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import (BinaryIO, Callable, Iterator, List, Mapping, Optional, Sequence, Union,
                    overload)

import grpc

from sbx import _common as c
from sbx._common import (ClaimEvent, ClaimInfo, ExecChunk, ExecResult, FileInfo, PingResult,
                         PoolInfo, RetryPolicy, Snapshot)
from sbx import _process as _proc
from sbx._process import PortUrl
from sbx.errors import (FailedPrecondition, InvalidArgument, NotFound, SbxError,
                        from_rpc_error)
from sbx.process import Processes, Pty
from sbx.process import url as _process_url
from sbx.v1 import (admin_pb2, admin_pb2_grpc, claims_pb2, claims_pb2_grpc, diagnostics_pb2,
                    diagnostics_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc, snapshots_pb2,
                    snapshots_pb2_grpc)

log = logging.getLogger("sbx")
Content = Union[str, bytes]


class Client:
    """A connection to sbx-server.

    Connection settings follow the `sbx` CLI: `server` defaults to $SBX_SERVER, else
    127.0.0.1:50051; `token` to $SBX_TOKEN (sent as `authorization: Bearer TOKEN`).
    `tls=True` uses the system roots; `ca` (a PEM file) verifies the server with those
    roots; `cert`/`key` (PEM files) add a client certificate (mutual TLS); any of them
    implies TLS. `server_name` is the name expected in the server's certificate when it
    differs from the host in `server`.

    `timeout` is the default deadline of each call in seconds (claims add their wait,
    exec its timeout). `retry` governs automatic retries of calls that are safe to
    repeat (see RetryPolicy). `channel` replaces the channel the client would make
    (then the TLS arguments are ignored; `token` still applies).

    Use it as a context manager, or call close().
    """

    def __init__(self, server: Optional[str] = None, token: Optional[str] = None, *,
                 tls: bool = False, ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, server_name: Optional[str] = None,
                 timeout: float = c.DEFAULT_TIMEOUT, retry: RetryPolicy = RetryPolicy(),
                 channel: Optional[grpc.Channel] = None) -> None:
        self._settings = c.ConnectionSettings.resolve(server, token, tls, ca, cert, key,
                                                      server_name)
        if channel is None:
            creds = self._settings.credentials()
            opts = self._settings.options()
            channel = (grpc.secure_channel(self._settings.target, creds, opts) if creds
                       else grpc.insecure_channel(self._settings.target, opts))
        self._channel = channel
        self._md = self._settings.metadata()
        self.timeout = timeout
        self.retry = retry
        self._claims = claims_pb2_grpc.ClaimServiceStub(channel)
        self._sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)
        self._diag = diagnostics_pb2_grpc.DiagnosticsServiceStub(channel)
        self._snapshots = snapshots_pb2_grpc.SnapshotsStub(channel)
        self.snapshots = Snapshots(self)
        """The tenant's snapshots: list(), get(), delete() (see Snapshots)."""

    @property
    def target(self) -> str:
        return self._settings.target

    def __repr__(self) -> str:
        tls = "tls" if self._settings.tls else "plaintext"
        auth = ", token=***" if self._settings.token else ""
        return f"sbx.Client({self._settings.target!r}, {tls}{auth})"

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ calling helpers

    def _call(self, method: Callable, request, *, timeout: Optional[float] = None,
              retry: bool = True, claim_id: Optional[str] = None):
        """One unary call with retries (UNAVAILABLE, ABORTED) while safe and within the
        deadline; failures become typed SbxErrors."""
        total = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + total
        attempt = 0
        retried_for = None  # the error that made the last retry
        while True:
            attempt += 1
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                return method(request, timeout=remaining, metadata=self._md)
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
                time.sleep(pause)

    def _call_stream(self, method: Callable, messages, timeout: Optional[float]):
        """A client-streamed call (uploads), without retries: its messages are consumed
        once. `timeout` None: an hour (a transfer of any size may take long)."""
        try:
            return method(messages, timeout=3600.0 if timeout is None else timeout,
                          metadata=self._md)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _read_stream(self, method: Callable, request, out, timeout: Optional[float]) -> int:
        """A server-streamed download into the binary file `out`; returns the bytes."""
        n = 0
        try:
            for chunk in method(request, timeout=3600.0 if timeout is None else timeout,
                                metadata=self._md):
                out.write(chunk.data)
                n += len(chunk.data)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return n

    def _claim_deadline(self, wait: Optional[float], policy: Optional[str],
                        timeout: Optional[float], image: Optional[str] = None) -> float:
        """Claim and ClaimBatch: the wait they may get (`wait`; none with policy "fail";
        else the server's default 30 s, 5 minutes by image) plus the call timeout
        (`timeout`, else the client's)."""
        return c.claim_deadline(wait, policy, self.timeout if timeout is None else timeout,
                                image=bool(image))

    def _release_quietly(self, claim_id: str) -> None:
        try:
            self._claims.Release(claims_pb2.ReleaseRequest(claim_id=claim_id),
                                 timeout=min(c.RELEASE_AFTER_INTERRUPT, self.timeout),
                                 metadata=self._md)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                log.warning("sbx: releasing claim %s failed: %s", claim_id, from_rpc_error(e))

    # ------------------------------------------------------------------------ the API

    def ping(self, payload: bytes = b"") -> PingResult:
        """DiagnosticsService.Ping: checks the connection; returns the server's version."""
        r = self._call(self._diag.Ping, diagnostics_pb2.PingRequest(payload=payload))
        return PingResult(payload=r.payload, server_version=r.server_version,
                          server_commit=r.server_commit, server_time=c._ts(r.server_time))

    def claim(self, pool: Optional[str] = None, *, image: Optional[str] = None,
              ttl: Optional[float] = None,
              env: Optional[Mapping[str, str]] = None,
              files: Optional[Mapping[str, Content]] = None,
              labels: Optional[Mapping[str, str]] = None, wait: Optional[float] = None,
              policy: Optional[str] = None, priority: Optional[str] = None,
              node_preference: Optional[Mapping[str, str]] = None,
              claim_id: Optional[str] = None, timeout: Optional[float] = None) -> "Sandbox":
        """Claims a warm sandbox of `pool`, or one running `image` (exactly one of them);
        use the result in a `with` block to release it at the end (also on exceptions and
        Ctrl-C), or call its release().

        image: an image reference instead of a pool ("oci:DIR:TAG", "docker://NAME:TAG" on
        a local server; "python:3.12" on Kubernetes): the server serves it from a pool
        whose template runs it (the one with warm sandboxes first), else, on a local server
        with an image cache, from the image's on-demand pool, made and pulled on first use
        (policy "cold" unless given; waits up to 5 minutes by default, which the call's
        deadline allows for). The Sandbox's `pool` says which pool served it. NotFound
        when no pool runs it and the server makes none (Kubernetes), FailedPrecondition
        on a local server without an image cache, InvalidArgument for a reference the
        server does not take, PoolExhausted for the tenant's image limits
        (image_claim_rate, image_cache_bytes).

        ttl: seconds the claim lives without renew() (None: the pool's default_ttl).
        env: variables for every command run in it. files: path -> content placed in
        the workspace before the claim returns (1 MiB in total). labels: for selectors.
        wait: seconds to wait when the pool is empty (None: the pool's default_wait).
        policy: "wait", "cold" or "fail" (None: the pool's). priority: "interactive",
        "normal" or "batch" (None: normal), the claim's place among this tenant's own
        claims waiting for the empty pool: every waiting interactive one is served before
        any normal one, every normal before any batch; it never overtakes another
        tenant's claims, and does nothing when a warm sandbox is there. node_preference:
        node labels, e.g. {"topology.kubernetes.io/zone": "europe-west1-b"}: a soft
        preference for a warm sandbox whose node has all of them, any warm sandbox when
        none has (never an error for lack of a match); only pools whose selection_policy
        is "spread" or "pack" honour it, and the local runtime reports no node labels.
        Same syntax and limits as labels, checked by the server (InvalidArgument naming
        the bad key or value). claim_id: the idempotency key (default: a fresh one
        generated here, reused by every automatic retry). timeout: the call timeout in
        seconds (default: the client's); the call's deadline, retries included, is the
        wait (`wait`; none with policy "fail"; else the server's default 30 s) plus it.

        Raises NotFound (no such pool), PoolExhausted (policy "fail"; see retry_after),
        DeadlineExceeded (no sandbox within `wait`), InvalidArgument, ... An error
        raised after the server may have granted the claim carries `claim_id`. A policy
        or priority not among the above is a ValueError naming it, before any call.
        """
        c.pool_or_image(pool, image)
        claim_id = c.check_id(claim_id, "claim_id") if claim_id else c.new_claim_id()
        req = c.claim_request(claim_id, pool, ttl, env, files, labels, wait, policy,
                              priority, node_preference, image)
        try:
            resp = self._call(self._claims.Claim, req, claim_id=claim_id,
                              timeout=self._claim_deadline(wait, policy, timeout, image))
        except SbxError:
            raise
        except BaseException:
            # Ctrl-C (or another exception) while the claim was on its way: the server may
            # have granted it. The id is ours, so release it rather than leak a sandbox.
            self._release_quietly(claim_id)
            raise
        return Sandbox(self, ClaimInfo.from_proto(resp.claim), replayed=resp.replayed)

    def claim_batch(self, pool: Optional[str] = None, n: Optional[int] = None, *,
                    image: Optional[str] = None, best_effort: bool = False,
                    batch_id: Optional[str] = None, ttl: Optional[float] = None,
                    env: Optional[Mapping[str, str]] = None,
                    files: Optional[Mapping[str, Content]] = None,
                    labels: Optional[Mapping[str, str]] = None, wait: Optional[float] = None,
                    policy: Optional[str] = None, priority: Optional[str] = None,
                    node_preference: Optional[Mapping[str, str]] = None,
                    timeout: Optional[float] = None) -> "SandboxGroup":
        """Claims `n` sandboxes (1-1000) in one ClaimBatch call: all or nothing, or with
        best_effort between 1 and n. The claims are `<batch_id>#<i>`. Returns a
        SandboxGroup (a sequence of Sandbox) that releases them all at the end of a
        `with` block or on release(). The sandboxes the batch waits for all wait at its
        `priority`; `node_preference` applies to each of its sandboxes. By image:
        `claim_batch(n=8, image=REF)`, all from one pool of the image. Other arguments as
        for claim()."""
        c.pool_or_image(pool, image)
        if n is None:
            raise TypeError("claim_batch() needs n, the number of sandboxes")
        batch_id = c.check_id(batch_id, "batch_id") if batch_id else c.new_claim_id("pyb")
        req = c.batch_request(batch_id, pool, n, best_effort, ttl, env, files, labels, wait,
                              policy, priority, node_preference, image)
        try:
            resp = self._call(self._claims.ClaimBatch, req, claim_id=batch_id,
                              timeout=self._claim_deadline(wait, policy, timeout, image))
        except SbxError:
            raise
        except BaseException:
            self._release_quietly_batch(batch_id, n)
            raise
        return SandboxGroup(self, resp.batch_id,
                            [Sandbox(self, ClaimInfo.from_proto(x), replayed=resp.replayed)
                             for x in resp.claims], replayed=resp.replayed)

    def fork(self, source: Union[Snapshot, str, "Sandbox"], count: int, *,
             batch_id: Optional[str] = None, ttl: Optional[float] = None,
             labels: Optional[Mapping[str, str]] = None,
             env: Optional[Mapping[str, str]] = None,
             files: Optional[Mapping[str, Content]] = None, wait: Optional[float] = None,
             timeout: Optional[float] = None) -> "SandboxGroup":
        """Snapshots.Fork: `count` new sandboxes (1 to the server's max batch, 1000 by
        default) whose root layer and workspace start as copies of `source`'s, each then
        writing only its own. `source` is a Snapshot or a snapshot id, or a Sandbox (an
        active claim of this tenant), whose live state the server snapshots first (that
        snapshot is kept and counted against the quota; its id is the result's
        `snapshot_id`).

        Returns a SandboxGroup (a sequence of Sandbox, in fork order) that releases them
        all at the end of a `with` block or on release(); `snapshot_id` names the snapshot
        they start from, `replayed` says the server answered an earlier Fork of the same
        batch_id. All or nothing: nothing is held when it fails.

        batch_id: the idempotency key (1-120 characters of [A-Za-z0-9._:-]; the claims are
        `<batch_id>#<i>`); default a fresh one generated here, reused by every automatic
        retry (UNAVAILABLE, ABORTED), so a retry answers the same forks and makes no new
        snapshot. ttl, labels, env, files: as for claim_batch(), for every fork. wait:
        seconds the server may take to bring every fork up (None: its default 5 minutes;
        the call's deadline allows for it plus `timeout`).

        Raises NotFound (the snapshot or the sandbox is not this tenant's),
        FailedPrecondition (the source claim has ended, a snapshot that cannot be
        forked), PoolExhausted (a tenant limit, the snapshot quota, or the wait ran out),
        InvalidArgument (count, batch_id, ttl, labels), Unimplemented (Kubernetes). An
        error carries `claim_id` = the batch id."""
        batch_id = c.check_id(batch_id, "batch_id") if batch_id else c.new_claim_id("pyf")
        req = c.fork_request(source, count, batch_id, ttl, labels, env, files, wait)
        try:
            resp = self._call(self._snapshots.Fork, req, claim_id=batch_id,
                              timeout=c.fork_deadline(wait, self.timeout if timeout is None
                                                      else timeout))
        except SbxError:
            raise
        except BaseException:
            # Ctrl-C while the forks were on their way: the server may have made them.
            self._release_quietly_batch(batch_id, count)
            raise
        return SandboxGroup(self, resp.batch_id,
                            [Sandbox(self, ClaimInfo.from_proto(x), replayed=resp.replayed)
                             for x in resp.claims], replayed=resp.replayed,
                            snapshot_id=resp.snapshot_id)

    def _release_quietly_batch(self, batch_id: str, n: int) -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._release_quietly, [f"{batch_id}#{i}" for i in range(n)]))

    def attach(self, claim_id: str) -> "Sandbox":
        """A handle on an existing claim (GetClaim), e.g. one made by another process."""
        return Sandbox(self, self.get_claim(claim_id))

    def get_claim(self, claim_id: str) -> ClaimInfo:
        """The claim in any state (NotFound once it left the retention window)."""
        r = self._call(self._claims.GetClaim, claims_pb2.GetClaimRequest(claim_id=claim_id))
        return ClaimInfo.from_proto(r.claim)

    def release(self, claim_id: str) -> ClaimInfo:
        """Ends a claim by id and destroys its sandbox; idempotent."""
        r = self._call(self._claims.Release, claims_pb2.ReleaseRequest(claim_id=claim_id))
        return ClaimInfo.from_proto(r.claim)

    def list_claims(self, *, pool: Optional[str] = None, selector: Optional[str] = None,
                    labels: Optional[Mapping[str, str]] = None,
                    states: Optional[Sequence[str]] = None, owner: Optional[str] = None
                    ) -> List[ClaimInfo]:
        """Every claim matching the filter (all pages). states: e.g. ["active"]."""
        f = c.claim_filter(pool, selector, labels, states, owner)
        out: List[ClaimInfo] = []
        token = ""
        while True:
            r = self._call(self._claims.ListClaims, claims_pb2.ListClaimsRequest(
                filter=f, page_size=1000, page_token=token))
            out.extend(ClaimInfo.from_proto(x) for x in r.claims)
            token = r.next_page_token
            if not token:
                return out

    def pools(self, template: Optional[str] = None) -> List[PoolInfo]:
        """Every pool with its status (AdminService.ListPools; needs an admin token when
        the server has authentication)."""
        out: List[PoolInfo] = []
        token = ""
        while True:
            r = self._call(self._admin.ListPools, admin_pb2.ListPoolsRequest(
                page_size=1000, page_token=token, template=template or ""))
            out.extend(PoolInfo.from_proto(p) for p in r.pools)
            token = r.next_page_token
            if not token:
                return out

    def watch_claims(self, *, pool: Optional[str] = None, selector: Optional[str] = None,
                     labels: Optional[Mapping[str, str]] = None, start_revision: int = 0
                     ) -> "ClaimWatch":
        """Streams ClaimEvents: first ADDED for every matching claim (start_revision 0),
        then changes. Iterate it; cancel() or leaving its `with` block ends it."""
        req = claims_pb2.WatchClaimsRequest(
            filter=c.claim_filter(pool, selector, labels, None, None),
            start_revision=start_revision)
        return ClaimWatch(self._claims.WatchClaims(req, metadata=self._md))


class Sandbox(c.SandboxView):
    """A claimed sandbox. Release it with a `with` block or release()."""

    def __init__(self, client: Client, info: ClaimInfo, replayed: bool = False) -> None:
        self._client = client
        self.info = info
        self.replayed = replayed
        self.files = Files(self)
        self.processes = Processes(self)
        self._released = False

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except BaseException as e:  # Keep the original exception, which says more.
            log.warning("sbx: releasing claim %s failed: %s", self.claim_id, e)

    def release(self) -> ClaimInfo:
        """Ends the claim and destroys the sandbox. Idempotent."""
        self.info = self._client.release(self.claim_id)
        self._released = True
        return self.info

    def refresh(self) -> ClaimInfo:
        """Reads the claim again (state, expiry, suspended)."""
        self.info = self._client.get_claim(self.claim_id)
        return self.info

    def renew(self, ttl: Optional[float] = None) -> ClaimInfo:
        """Sets the expiry to now + ttl seconds (None: the pool's default_ttl)."""
        req = claims_pb2.RenewRequest(claim_id=self.claim_id)
        c.set_duration(req.ttl, ttl)
        self.info = ClaimInfo.from_proto(self._client._call(self._client._claims.Renew, req).claim)
        return self.info

    def suspend(self) -> None:
        """Freezes every process of the sandbox (the TTL keeps running)."""
        self._client._call(self._client._sandboxes.Suspend,
                           sandboxes_pb2.SuspendRequest(claim_id=self.claim_id))
        self.info = _with_suspended(self.info, True)

    def resume(self) -> None:
        """Thaws a suspended sandbox."""
        self._client._call(self._client._sandboxes.Resume,
                           sandboxes_pb2.ResumeRequest(claim_id=self.claim_id))
        self.info = _with_suspended(self.info, False)

    def snapshot(self, name: Optional[str] = None,
                 labels: Optional[Mapping[str, str]] = None, *,
                 timeout: Optional[float] = None) -> Snapshot:
        """Snapshots.CreateSnapshot: captures the sandbox's file system (its root's own
        layer for a sandbox of an image, and its workspace) as a new snapshot of this
        tenant, durable when this returns. The sandbox is frozen meanwhile and then runs
        on (a suspended one stays suspended). `name` (at most 128 bytes, not unique) and
        `labels` are the caller's. Use the result with reset() and Client.fork().

        Raises FailedPrecondition (the claim has ended; the server has no snapshots
        folder; folders nested deeper than 128), PoolExhausted (the tenant's snapshot
        quota, naming it; a full disk; more than 1,000,000 entries), NotFound,
        Unimplemented (Kubernetes). Not retried automatically: a retry after a lost
        answer would make a second snapshot."""
        cl = self._client
        r = cl._call(cl._snapshots.CreateSnapshot,
                     c.create_snapshot_request(self.claim_id, name, labels), retry=False,
                     timeout=timeout)
        return Snapshot.from_proto(r.snapshot, r.dropped_entries)

    def reset(self, snapshot: Union[Snapshot, str], *, timeout: Optional[float] = None) -> None:
        """Snapshots.Reset: rewinds this sandbox to `snapshot` (a Snapshot or its id, of
        this tenant, taken on the sandbox's image). Every process is killed and the
        sandbox starts again with the same claim, sandbox id and endpoint, its root layer
        and workspace replaced by the snapshot's; execs and processes in flight end. A
        suspended sandbox runs afterwards. Returns once it serves again.

        Raises NotFound (the claim or the snapshot is not this tenant's),
        FailedPrecondition (the claim has ended; a snapshot of another image, naming
        both; a sandbox adopted from an earlier run of the server), Unavailable /
        DeadlineExceeded / Internal (the new start failed after the old processes were
        killed: the claim is then LOST). Not retried automatically."""
        cl = self._client
        sid = c.snapshot_id_of(snapshot, "reset()")
        cl._call(cl._snapshots.Reset,
                 snapshots_pb2.ResetRequest(claim_id=self.claim_id, snapshot_id=sid),
                 retry=False, timeout=timeout)
        self.info = _with_suspended(self.info, False)

    def exec(self, cmd: Union[str, Sequence[str]], *, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[str] = None, stdin: Union[None, str, bytes] = None,
             timeout: Optional[float] = None,
             max_output_bytes: Optional[int] = None) -> ExecResult:
        """Runs a command and waits for it. A string runs through `sh -c`; a list is the
        argv (no shell). `stdin` (str or bytes) is fed to it; without it stdin is
        /dev/null. `timeout` (seconds, default 10 min) kills it (result.timed_out).
        A command that fails is a result with exit_code != 0, not an exception; errors
        are for commands that could not run (FailedPrecondition, NotFound...).
        Never retried automatically: the command may have run."""
        data = c.stdin_bytes(stdin)
        reqs = [c.exec_start(self.claim_id, cmd, env, cwd, timeout, max_output_bytes,
                             data is not None)]
        if data is not None:
            reqs += [sandboxes_pb2.ExecRequest(stdin_chunk=data[i:i + c.CHUNK])
                     for i in range(0, len(data), c.CHUNK)]
            reqs.append(sandboxes_pb2.ExecRequest(close_stdin=sandboxes_pb2.ExecCloseStdin()))
        call = self._client._sandboxes.Exec(
            iter(reqs), timeout=c.exec_deadline(timeout, self._client.timeout),
            metadata=self._client._md)
        out, err, pid, exit_msg = bytearray(), bytearray(), 0, None
        try:
            for r in call:
                kind = r.WhichOneof("kind")
                if kind == "stdout_chunk":
                    out += r.stdout_chunk
                elif kind == "stderr_chunk":
                    err += r.stderr_chunk
                elif kind == "started":
                    pid = r.started.pid
                elif kind == "exit":
                    exit_msg = r.exit
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()  # Ctrl-C: cancelling the call kills the command.
            raise
        if exit_msg is None:
            raise SbxError("the Exec stream ended without an exit message")
        return c.exec_result(pid, bytes(out), bytes(err), exit_msg)

    def exec_stream(self, cmd: Union[str, Sequence[str]], *,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    stdin: bool = False, timeout: Optional[float] = None,
                    max_output_bytes: Optional[int] = None) -> "ExecStream":
        """Starts a command and returns an ExecStream: iterate it for ExecChunks as they
        come, write() to its stdin (with stdin=True), send_signal(), wait() for the
        result. Leaving its `with` block before the command ended cancels it (kills it)."""
        start = c.exec_start(self.claim_id, cmd, env, cwd, timeout, max_output_bytes, stdin)
        return ExecStream(self._client, start, c.exec_deadline(timeout, self._client.timeout))

    def pty(self, *, cols: int = 80, rows: int = 24, term: Optional[str] = None,
            cmd: Union[None, str, Sequence[str]] = None, tag: Optional[str] = None,
            env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
            timeout: Optional[float] = None) -> Pty:
        """Starts `cmd` (default: the sandbox's login shell, as `sbx shell`) on a new
        pseudo-terminal of `cols` x `rows` (1..1000) with TERM `term` (default "xterm")
        and returns its Pty, attached to its output from the first byte: iterate it,
        send_input() keystrokes, resize(), wait(). PoolExhausted naming --max_ptys when
        the sandbox has its most terminals open."""
        size = {"cols": cols, "rows": rows, "term": term or ""}
        proc = self.processes.start(_proc.DEFAULT_PTY_CMD if cmd is None else cmd,
                                    background=False, tag=tag, env=env, cwd=cwd, pty=size,
                                    timeout=timeout)
        assert isinstance(proc, Pty)
        return proc

    def url(self, port: int, *, ttl: Optional[float] = None) -> PortUrl:
        """A signed URL through sbx-server's port proxy at which `port` inside this
        sandbox answers, for anyone holding it until it expires (`ttl` seconds, default
        1 hour, at most 7 days): a PortUrl (str() is the URL; `.host_url` the host-name
        form, `.token` the token alone). FailedPrecondition when the server runs no port
        proxy (--proxy_listen); InvalidArgument for a port outside 1..65535."""
        return _process_url(self, port, ttl)


def _with_suspended(info: ClaimInfo, suspended: bool) -> ClaimInfo:
    return dataclasses.replace(info, suspended=suspended)


class ExecStream:
    """A running command (SandboxService.Exec). Not thread-safe: one reader."""

    def __init__(self, client: Client, start: sandboxes_pb2.ExecRequest, deadline: float):
        self._q: "queue.Queue[Optional[sandboxes_pb2.ExecRequest]]" = queue.Queue()
        self._q.put(start)
        self._call = client._sandboxes.Exec(self._requests(), timeout=deadline,
                                            metadata=client._md)
        self.pid = 0
        self.result: Optional[ExecResult] = None
        self._out = bytearray()
        self._err = bytearray()
        self._closed = False
        first = self._next()  # started, or an error saying why it could not start
        if first is not None and first.WhichOneof("kind") == "started":
            self.pid = first.started.pid

    def __repr__(self) -> str:
        state = "running" if self.result is None else repr(self.result)
        return f"<sbx.ExecStream pid={self.pid} {state}>"

    def _requests(self) -> Iterator[sandboxes_pb2.ExecRequest]:
        while True:
            item = self._q.get()
            if item is None:
                return
            yield item

    def _next(self):
        try:
            return next(self._call)
        except StopIteration:
            return None
        except grpc.RpcError as e:
            self._finish()
            raise from_rpc_error(e) from None

    def _finish(self) -> None:
        if not self._closed:
            self._closed = True
            self._q.put(None)

    def write(self, data: Union[str, bytes]) -> None:
        """Sends bytes to the command's stdin (needs exec_stream(..., stdin=True))."""
        b = c.stdin_bytes(data) or b""
        for i in range(0, len(b), c.CHUNK):
            self._q.put(sandboxes_pb2.ExecRequest(stdin_chunk=b[i:i + c.CHUNK]))

    def close_stdin(self) -> None:
        """End of input for the command."""
        self._q.put(sandboxes_pb2.ExecRequest(close_stdin=sandboxes_pb2.ExecCloseStdin()))

    def send_signal(self, sig: Union[int, str]) -> None:
        """Signals the command's process group: "INT", "TERM", "KILL", 15, ..."""
        self._q.put(sandboxes_pb2.ExecRequest(
            signal=sandboxes_pb2.ExecSignal(signal=c.signal_value(sig))))

    def __iter__(self) -> Iterator[ExecChunk]:
        while self.result is None:
            r = self._next()
            if r is None:
                self._finish()
                if self.result is None:
                    raise SbxError("the Exec stream ended without an exit message")
                return
            kind = r.WhichOneof("kind")
            if kind == "stdout_chunk":
                yield ExecChunk("stdout", r.stdout_chunk)
            elif kind == "stderr_chunk":
                yield ExecChunk("stderr", r.stderr_chunk)
            elif kind == "exit":
                self.result = c.exec_result(self.pid, bytes(self._out), bytes(self._err),
                                            r.exit)
                self._finish()

    def wait(self) -> ExecResult:
        """Waits for the command to end; the result holds the output not already
        consumed by iterating."""
        for chunk in self:
            (self._out if chunk.stream == "stdout" else self._err).extend(chunk.data)
        if self.result is not None and (self._out or self._err):
            self.result = dataclasses.replace(self.result, stdout_raw=bytes(self._out),
                                              stderr_raw=bytes(self._err))
        assert self.result is not None
        return self.result

    def cancel(self) -> None:
        """Cancels the call, which kills the command."""
        self._finish()
        self._call.cancel()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc) -> None:
        if self.result is None:
            self.cancel()


class ClaimWatch:
    """An open WatchClaims stream: iterate it for ClaimEvents."""

    def __init__(self, call) -> None:
        self._call = call
        self._cancelled = False

    def __iter__(self) -> Iterator[ClaimEvent]:
        try:
            for e in self._call:
                yield ClaimEvent.from_proto(e)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> "ClaimWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class SandboxGroup(Sequence[Sandbox]):
    """The sandboxes of one claim_batch(), in index order; releases them all at the end of
    a `with` block or on release()."""

    def __init__(self, client: Client, batch_id: str, sandboxes: List[Sandbox],
                 replayed: bool = False, snapshot_id: str = "") -> None:
        self._client = client
        self.batch_id = batch_id
        self.sandboxes = sandboxes
        self.replayed = replayed
        self.snapshot_id = snapshot_id
        """For Client.fork(): the snapshot the sandboxes start from; else ""."""

    @overload
    def __getitem__(self, i: int) -> Sandbox: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Sandbox]: ...

    def __getitem__(self, i):
        return self.sandboxes[i]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __repr__(self) -> str:
        return f"<sbx.SandboxGroup batch_id={self.batch_id!r} pool={self._pool()!r} n={len(self)}>"

    def _pool(self) -> str:
        return self.sandboxes[0].pool if self.sandboxes else ""

    def release(self, parallelism: int = 16) -> None:
        """Releases every sandbox (several calls at once); raises the first failure
        after trying them all."""
        errors: List[BaseException] = []

        def one(sb: Sandbox) -> None:
            try:
                sb.release()
            except SbxError as e:
                errors.append(e)
        with ThreadPoolExecutor(max(1, parallelism)) as pool:
            list(pool.map(one, self.sandboxes))
        if errors:
            raise errors[0]

    def __enter__(self) -> "SandboxGroup":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.release()
            return
        try:
            self.release()
        except BaseException as e:
            log.warning("sbx: releasing batch %s failed: %s", self.batch_id, e)


class Snapshots:
    """The tenant's snapshots (`client.snapshots`). Make one with Sandbox.snapshot();
    another tenant's snapshot is NotFound, as an unknown id."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __repr__(self) -> str:
        return f"<sbx.Snapshots of {self._client.target!r}>"

    def list(self, labels: Optional[Mapping[str, str]] = None) -> List[Snapshot]:
        """The tenant's snapshots, oldest first; `labels`: only those carrying all of
        them."""
        cl = self._client
        r = cl._call(cl._snapshots.ListSnapshots,
                     snapshots_pb2.ListSnapshotsRequest(label_selector=dict(labels or {})))
        return [Snapshot.from_proto(s) for s in r.snapshots]

    def usage(self) -> "tuple[int, int]":
        """(bytes of all the tenant's snapshots, its quota in bytes or 0 for none)."""
        cl = self._client
        r = cl._call(cl._snapshots.ListSnapshots, snapshots_pb2.ListSnapshotsRequest())
        return r.used_bytes, r.quota_bytes

    def get(self, snapshot: Union[Snapshot, str]) -> Snapshot:
        """One snapshot of the tenant (NotFound for an unknown id or another tenant's)."""
        cl = self._client
        r = cl._call(cl._snapshots.GetSnapshot, snapshots_pb2.GetSnapshotRequest(
            snapshot_id=c.snapshot_id_of(snapshot, "snapshots.get()")))
        return Snapshot.from_proto(r.snapshot)

    def delete(self, snapshot: Union[Snapshot, str]) -> None:
        """Deletes a snapshot (record, then files). NotFound for an unknown id or another
        tenant's; FailedPrecondition naming the user while a template, a pool of such a
        template, a claimed fork or a live sandbox started from it still uses it. Not
        retried automatically (a retry after a lost answer would say NotFound)."""
        cl = self._client
        cl._call(cl._snapshots.DeleteSnapshot, snapshots_pb2.DeleteSnapshotRequest(
            snapshot_id=c.snapshot_id_of(snapshot, "snapshots.delete()")), retry=False)


class Files:
    """File calls on one sandbox's workspace. Paths are relative to the workspace."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def __repr__(self) -> str:
        return f"<sbx.Files of {self._sb.claim_id!r}>"

    def write(self, path: str, data: Content, *, mode: Optional[int] = None,
              append: bool = False, make_parents: bool = True) -> int:
        """Writes (replaces atomically, or appends to) a file; str is written as UTF-8.
        Content above 1 MiB goes in 1 MiB calls (replace, then appends). `mode` e.g.
        0o755 (default: 0644 for a new file). Returns the file's size afterwards."""
        b = data.encode() if isinstance(data, str) else bytes(data)
        cl = self._sb._client
        size = 0
        for i, off in enumerate(range(0, max(len(b), 1), c.CHUNK)):
            app = append or i > 0
            req = sandboxes_pb2.WriteFileRequest(
                claim_id=self._sb.claim_id, path=path, content=b[off:off + c.CHUNK],
                mode=mode or 0, append=app, create_parents=make_parents)
            size = cl._call(cl._sandboxes.WriteFile, req, retry=not app).size
        return size

    def read(self, path: str) -> bytes:
        """The whole file (read in 1 MiB ranges)."""
        cl = self._sb._client
        out = bytearray()
        while True:
            r = cl._call(cl._sandboxes.ReadFile, sandboxes_pb2.ReadFileRequest(
                claim_id=self._sb.claim_id, path=path, offset=len(out), limit=c.CHUNK))
            out += r.content
            if r.eof or not r.content:
                return bytes(out)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def list(self, path: str = "", *, recursive: bool = False) -> List[FileInfo]:
        """Entries of a directory (all pages), ordered by path."""
        cl = self._sb._client
        out: List[FileInfo] = []
        token = ""
        while True:
            r = cl._call(cl._sandboxes.ListFiles, sandboxes_pb2.ListFilesRequest(
                claim_id=self._sb.claim_id, path=path, recursive=recursive, page_size=1000,
                page_token=token))
            out.extend(FileInfo.from_proto(f) for f in r.files)
            token = r.next_page_token
            if not token:
                return out

    def exists(self, path: str) -> bool:
        """Whether a file or directory exists. sbx has no stat call: this is a ReadFile
        of zero bytes past the end (a directory answers "is a directory")."""
        cl = self._sb._client
        try:
            cl._call(cl._sandboxes.ReadFile, sandboxes_pb2.ReadFileRequest(
                claim_id=self._sb.claim_id, path=path, offset=1 << 62, limit=1))
            return True
        except (NotFound, FailedPrecondition) as e:
            return _exists_from_error(e)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, a symbolic link (never followed) or an empty directory
        (recursive=True: a directory with its contents) with the Remove call.
        NotFound when nothing is there; FailedPrecondition for a non-empty directory
        without recursive; InvalidArgument for the workspace itself or a path that leaves
        it. Not retried (a retry after a lost answer would say NotFound)."""
        cl = self._sb._client
        cl._call(cl._sandboxes.Remove, sandboxes_pb2.RemoveRequest(
            claim_id=self._sb.claim_id, path=path, recursive=recursive), retry=False)

    # ---- streamed files (UploadFile, DownloadFile, UploadTar, DownloadTar): any size,
    # constant memory. Paths may be absolute ("/home/user/x": the sandbox's own root).

    def upload(self, path: str, source: Union[str, bytes, BinaryIO], *,
               mode: Optional[int] = None, make_parents: bool = True,
               timeout: Optional[float] = None) -> int:
        """Streams `source` (a local file name, bytes, or a binary file object) to `path`
        in 1 MiB chunks; the sandbox renames it into place only when the whole stream
        arrived (a failed upload leaves nothing). Returns the bytes written."""
        cl = self._sb._client
        if isinstance(source, str):
            with open(source, "rb") as f:
                if mode is None:
                    mode = os.fstat(f.fileno()).st_mode & 0o7777
                return self.upload(path, f, mode=mode, make_parents=make_parents,
                                   timeout=timeout)
        f = io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview)) \
            else source
        start = sandboxes_pb2.UploadStart(claim_id=self._sb.claim_id, path=path,
                                          mode=mode or 0, create_parents=make_parents)
        return cl._call_stream(cl._sandboxes.UploadFile, _upload_messages(start, f),
                               timeout).bytes

    def download(self, path: str, dest: Union[str, BinaryIO, None] = None, *,
                 timeout: Optional[float] = None) -> Union[bytes, int]:
        """Streams a file out of the sandbox: into `dest` (a local file name, written
        beside and renamed at the end, or a binary file object), returning the bytes
        written; without `dest`, returns the content."""
        cl = self._sb._client
        req = sandboxes_pb2.DownloadRequest(claim_id=self._sb.claim_id, path=path)
        if dest is None:
            buf = io.BytesIO()
            cl._read_stream(cl._sandboxes.DownloadFile, req, buf, timeout)
            return buf.getvalue()
        if isinstance(dest, str):
            return _download_to_name(lambda f: cl._read_stream(
                cl._sandboxes.DownloadFile, req, f, timeout), dest)
        return cl._read_stream(cl._sandboxes.DownloadFile, req, dest, timeout)

    def upload_dir(self, local_dir: str, path: str = "", *,
                   timeout: Optional[float] = None) -> int:
        """Sends the local directory `local_dir` as a tar stream and extracts it into
        `path` (created when missing; "" the workspace). The tar is spooled to a
        temporary file first (constant memory). Returns the number of entries."""
        cl = self._sb._client
        with tempfile.TemporaryFile() as spool:
            with tarfile.open(fileobj=spool, mode="w") as t:
                for name in sorted(os.listdir(local_dir)):
                    t.add(os.path.join(local_dir, name), arcname=name)
            spool.seek(0)
            start = sandboxes_pb2.UploadStart(claim_id=self._sb.claim_id, path=path)
            return cl._call_stream(cl._sandboxes.UploadTar, _upload_messages(start, spool),
                                   timeout).entries

    def download_tar(self, path: str, dest: Union[str, BinaryIO], *,
                     timeout: Optional[float] = None) -> int:
        """Streams the sandbox's directory `path` as a tar archive into `dest` (a file
        name or a binary file object); returns its size."""
        cl = self._sb._client
        req = sandboxes_pb2.DownloadRequest(claim_id=self._sb.claim_id, path=path)
        if isinstance(dest, str):
            return _download_to_name(lambda f: cl._read_stream(
                cl._sandboxes.DownloadTar, req, f, timeout), dest)
        return cl._read_stream(cl._sandboxes.DownloadTar, req, dest, timeout)

    def download_dir(self, path: str, local_dir: str, *,
                     timeout: Optional[float] = None) -> int:
        """Downloads the sandbox's directory `path` into `local_dir` (created). The archive
        comes from the sandbox and is treated as hostile: only directories and regular
        files are extracted (links, devices and FIFOs are skipped), names that are
        absolute or contain ".." are refused (InvalidArgument), and modes keep only their
        permission bits. Returns the number of files and directories written."""
        with tempfile.TemporaryFile() as spool:
            self.download_tar(path, spool, timeout=timeout)
            spool.seek(0)
            return _extract_plain(spool, local_dir)

    def stat(self, path: str) -> FileInfo:
        """Describes `path` (a symbolic link is described, not followed). NotFound."""
        cl = self._sb._client
        return FileInfo.from_proto(cl._call(cl._sandboxes.Stat, sandboxes_pb2.StatRequest(
            claim_id=self._sb.claim_id, path=path)).file)

    def make_dir(self, path: str, *, parents: bool = True, mode: Optional[int] = None) -> None:
        """Creates a directory (parents=True: mkdir -p)."""
        cl = self._sb._client
        cl._call(cl._sandboxes.MakeDir, sandboxes_pb2.MakeDirRequest(
            claim_id=self._sb.claim_id, path=path, parents=parents, mode=mode or 0))

    def watch(self, path: str = "", *, recursive: bool = False,
              timeout: Optional[float] = None) -> "FileWatch":
        """Streams changes below the directory `path` (WatchDir): iterate the returned
        FileWatch for FileEvent(type, path, is_dir), type one of "create", "write",
        "remove", "rename" (the old name) and "chmod" ("overflow" when events were lost).
        The watch is set up when this returns. Cancel it (or leave its `with` block) to
        stop; it ends by itself when the directory is removed."""
        cl = self._sb._client
        call = cl._sandboxes.WatchDir(sandboxes_pb2.WatchDirRequest(
            claim_id=self._sb.claim_id, path=path, recursive=recursive),
            timeout=timeout, metadata=cl._md)
        try:
            first = next(call)  # `ready`
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except StopIteration:
            pass
        return FileWatch(call)

    def move(self, src: str, dst: str, *, overwrite: bool = False,
             make_parents: bool = False) -> None:
        """Renames `src` to `dst` inside the sandbox (AlreadyExists unless overwrite)."""
        cl = self._sb._client
        cl._call(cl._sandboxes.Move, sandboxes_pb2.MoveRequest(
            claim_id=self._sb.claim_id, to=dst, overwrite=overwrite,
            create_parents=make_parents, **{"from": src}), retry=False)


def _exists_from_error(e: SbxError) -> bool:
    if not c.is_file_level_error(e.message):
        raise e
    if isinstance(e, NotFound) or "a component is not a directory" in e.message:
        return False
    return True  # "is a directory", "is not a regular file"


def _upload_messages(start, f) -> Iterator[sandboxes_pb2.UploadRequest]:
    yield sandboxes_pb2.UploadRequest(start=start)
    while True:
        data = f.read(c.CHUNK)
        if not data:
            break
        yield sandboxes_pb2.UploadRequest(chunk=data)
    # The explicit end: without it the sandbox keeps nothing (a cut stream never commits).
    yield sandboxes_pb2.UploadRequest(finish=True)


def _download_to_name(fill: Callable, dest: str) -> int:
    """Writes through `fill(file)` into a temporary file beside `dest`, renamed at the end."""
    folder = os.path.dirname(os.path.abspath(dest))
    fd, temp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(dest) + ".sbx-")
    try:
        with os.fdopen(fd, "wb") as f:
            n = fill(f)
        os.replace(temp, dest)
        return n
    except BaseException:
        os.unlink(temp)
        raise


def _extract_plain(f, local_dir: str) -> int:
    """Extracts directories and regular files of the tar `f` under `local_dir`; never
    creates a link, so nothing the archive holds can redirect a later entry."""
    os.makedirs(local_dir, exist_ok=True)
    written = 0
    with tarfile.open(fileobj=f, mode="r|") as t:
        for m in t:
            parts = m.name.split("/")
            if m.name.startswith("/") or ".." in parts:
                raise InvalidArgument(f"tar entry {m.name!r} leaves the directory")
            parts = [p for p in parts if p not in ("", ".")]
            if not parts:
                continue
            target = os.path.join(local_dir, *parts)
            if m.isdir():
                os.makedirs(target, exist_ok=True)
            elif m.isreg():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = t.extractfile(m)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                             0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(src, out, c.CHUNK)
                os.chmod(target, m.mode & 0o777)
            else:
                continue
            written += 1
    return written


@dataclasses.dataclass(frozen=True)
class FileEvent:
    """One change WatchDir reported."""
    type: str  # "create", "write", "remove", "rename", "chmod" or "overflow"
    path: str
    is_dir: bool = False


class FileWatch:
    """The stream of sbx.Files.watch; iterate it for FileEvents."""

    def __init__(self, call) -> None:
        self._call = call

    def __iter__(self) -> Iterator[FileEvent]:
        try:
            for e in self._call:
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

    def __enter__(self) -> "FileWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()
