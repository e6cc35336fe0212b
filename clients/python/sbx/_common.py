"""What the sync and the asyncio client share: connection settings, retry policy,
result types and conversions from the sbx.v1 messages. Private: use the names exported
by `sbx`."""

from __future__ import annotations

import dataclasses
import datetime
import os
import random
import re
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import grpc

from sbx.v1 import admin_pb2, claims_pb2, sandboxes_pb2, snapshots_pb2, types_pb2

DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_TIMEOUT = 30.0  # seconds per call, like the CLI's --timeout
# A claim without `wait` waits for the pool's default_wait; the client cannot know it, so
# its deadline counts the server's default (30 s), as the CLI and the TypeScript SDK do.
DEFAULT_WAIT = 30.0
# The wait of a claim by image that gives none, in the deadline: the image's on-demand pool
# waits 5 minutes by default (its first sandbox pulls the image).
IMAGE_DEFAULT_WAIT = 300.0
EXEC_DEFAULT_TIMEOUT = 600.0  # the server's default for ExecStart.timeout
# The most a release after an interrupted claim (Ctrl-C, a cancelled task) may take.
RELEASE_AFTER_INTERRUPT = 5.0
CHUNK = 1024 * 1024  # WriteFile / ReadFile / stdin chunk limit
_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

Metadata = Tuple[Tuple[str, str], ...]


# --------------------------------------------------------------------------- connection

@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    """Where and how to connect, resolved the way the `sbx` CLI does it."""

    target: str
    token: Optional[str]
    tls: bool
    root_certificates: Optional[bytes]
    private_key: Optional[bytes]
    certificate_chain: Optional[bytes]
    server_name: Optional[str]

    @staticmethod
    def resolve(server: Optional[str], token: Optional[str], tls: Optional[bool],
                ca: Optional[str], cert: Optional[str], key: Optional[str],
                server_name: Optional[str]) -> "ConnectionSettings":
        target = server or os.environ.get("SBX_SERVER") or DEFAULT_SERVER
        if token is None:
            token = os.environ.get("SBX_TOKEN") or None
        if (cert is None) != (key is None):
            raise ValueError("cert and key go together (mutual TLS needs both)")

        def read(path: Optional[str]) -> Optional[bytes]:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        use_tls = bool(tls) or any(x is not None for x in (ca, cert, key))
        return ConnectionSettings(target=target, token=token, tls=use_tls,
                                  root_certificates=read(ca), private_key=read(key),
                                  certificate_chain=read(cert), server_name=server_name)

    def metadata(self) -> Metadata:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def options(self) -> List[Tuple[str, Any]]:
        opts: List[Tuple[str, Any]] = [
            # Our own retries (idempotent ids, backoff bounded by the deadline) replace
            # grpc's transparent ones, which know nothing of claim ids.
            ("grpc.enable_retries", 0),
            ("grpc.keepalive_time_ms", 30000),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            # Reconnect soon after a server restart (grpc's default starts at 1 s and
            # grows to 2 min), so that retries find the server back.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        return opts

    def credentials(self) -> Optional[grpc.ChannelCredentials]:
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates,
                                            private_key=self.private_key,
                                            certificate_chain=self.certificate_chain)


# ------------------------------------------------------------------------------- retries

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Automatic retries of calls that are safe to repeat (claims with their client-side
    id, release, renew, reads, suspend/resume, non-append writes) after UNAVAILABLE or
    ABORTED. Exponential backoff with full jitter; never beyond the call's deadline.
    Exec and appends are never retried. `RetryPolicy(max_attempts=1)` turns retries off.
    """

    max_attempts: int = 20
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def backoff(self, attempt: int) -> float:
        """Sleep before retry number `attempt` (1 = the first retry): uniform in
        [cap/2, cap] with cap = min(max_backoff, initial_backoff * multiplier**(attempt-1))
        ("equal jitter": growing, and spread so that many clients do not retry together)."""
        cap = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return random.uniform(cap / 2, cap)


NO_RETRY = RetryPolicy(max_attempts=1)


def new_claim_id(prefix: str = "py") -> str:
    """A fresh idempotency key for one logical claim (reused by all of its retries)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def check_id(value: str, what: str) -> str:
    if not _ID_RE.match(value):
        raise ValueError(f"{what} {value!r} must be 1-128 characters of [A-Za-z0-9._:-]")
    return value


# -------------------------------------------------------------------------------- values

def _ts(ts) -> Optional[datetime.datetime]:
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToDatetime().replace(tzinfo=datetime.timezone.utc)


def _enum(enum_type, value: int, prefix: str) -> str:
    try:
        name = enum_type.Name(value)
    except ValueError:
        return str(value)
    return name[len(prefix):] if name.startswith(prefix) else name


def set_duration(field, seconds: Optional[float]) -> None:
    if seconds is None:
        return
    if seconds < 0:
        raise ValueError(f"duration {seconds} s is negative")
    field.FromNanoseconds(int(round(seconds * 1e9)))


POLICIES = {
    None: types_pb2.EMPTY_POOL_POLICY_UNSPECIFIED,
    "wait": types_pb2.EMPTY_POOL_POLICY_WAIT,
    "cold": types_pb2.EMPTY_POOL_POLICY_COLD,
    "fail": types_pb2.EMPTY_POOL_POLICY_FAIL,
}

# How urgent a claim is among its own tenant's claims waiting for an empty pool.
PRIORITIES = {
    None: types_pb2.CLAIM_PRIORITY_UNSPECIFIED,
    "interactive": types_pb2.CLAIM_PRIORITY_INTERACTIVE,
    "normal": types_pb2.CLAIM_PRIORITY_NORMAL,
    "batch": types_pb2.CLAIM_PRIORITY_BATCH,
}

SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15,
           "CONT": 18, "STOP": 19}


def policy_value(policy: Optional[str]) -> int:
    key = policy.lower() if isinstance(policy, str) else policy
    if key not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of 'wait', 'cold', 'fail'")
    return POLICIES[key]


def priority_value(priority: Optional[str]) -> int:
    key = priority.lower() if isinstance(priority, str) else priority
    if key not in PRIORITIES:
        raise ValueError(f"priority {priority!r} is not one of 'interactive', 'normal', "
                         f"'batch'")
    return PRIORITIES[key]


def signal_value(sig: Union[int, str]) -> int:
    if isinstance(sig, int):
        if sig not in SIGNALS.values():
            raise ValueError(f"signal {sig} is not one of {sorted(SIGNALS.values())}")
        return sig
    name = sig.upper()
    name = name[3:] if name.startswith("SIG") else name
    if name not in SIGNALS:
        raise ValueError(f"signal {sig!r} is not one of {sorted(SIGNALS)}")
    return SIGNALS[name]


@dataclasses.dataclass(frozen=True)
class ClaimInfo:
    """A claim as the server last reported it. `state` is ACTIVE, RELEASED, EXPIRED or
    LOST; `launch_type` WARM or COLD; times are timezone-aware (UTC) or None."""

    claim_id: str
    pool: str
    owner: str
    sandbox_id: str
    state: str
    launch_type: str
    labels: Dict[str, str]
    created_at: Optional[datetime.datetime]
    expires_at: Optional[datetime.datetime]
    ended_at: Optional[datetime.datetime]
    batch_id: str
    revision: int
    suspended: bool
    endpoint: str = dataclasses.field(repr=False, default="")

    @staticmethod
    def from_proto(c: claims_pb2.Claim) -> "ClaimInfo":
        return ClaimInfo(
            claim_id=c.claim_id, pool=c.pool, owner=c.owner, sandbox_id=c.sandbox.id,
            state=_enum(types_pb2.ClaimState, c.state, "CLAIM_STATE_"),
            launch_type=_enum(types_pb2.LaunchType, c.launch_type, "LAUNCH_TYPE_"),
            labels=dict(c.labels), created_at=_ts(c.created_at),
            expires_at=_ts(c.expires_at) if c.HasField("expires_at") else None,
            ended_at=_ts(c.ended_at) if c.HasField("ended_at") else None,
            batch_id=c.batch_id, revision=c.revision, suspended=c.sandbox.suspended,
            endpoint=c.sandbox.endpoint)


@dataclasses.dataclass(frozen=True)
class ClaimEvent:
    """One WatchClaims event: `type` ADDED, MODIFIED or DELETED."""

    type: str
    claim: ClaimInfo
    revision: int
    initial: bool

    @staticmethod
    def from_proto(e: claims_pb2.ClaimEvent) -> "ClaimEvent":
        return ClaimEvent(type=_enum(types_pb2.WatchEventType, e.type, "WATCH_EVENT_TYPE_"),
                          claim=ClaimInfo.from_proto(e.claim), revision=e.revision,
                          initial=e.initial)


@dataclasses.dataclass(frozen=True)
class PoolStatus:
    """What a pool has now (`PoolInfo.status`), the same fields as the TypeScript SDK's
    `pool.status`: `warm` sandboxes ready to be claimed, `starting` ones being made,
    `claimed` ones held by claims, `target` the number of warm ones the scheduler aims at,
    `waiting_claims` claims waiting for a sandbox, `stale` warm ones of an older template
    generation (replaced as they go), `last_error` the last failure to make one ("" when
    none), `updated_at` when this was computed."""

    warm: int = 0
    starting: int = 0
    claimed: int = 0
    target: int = 0
    waiting_claims: int = 0
    stale: int = 0
    last_error: str = ""
    updated_at: Optional[datetime.datetime] = None


def _seconds(d) -> float:
    return d.ToNanoseconds() / 1e9


@dataclasses.dataclass(frozen=True)
class PoolInfo:
    """A pool's spec and status (AdminService.ListPools); the same shape as the TypeScript
    SDK's `Pool` (snake_case, durations in seconds where it has milliseconds):
    `name`, `template`, `min_warm`, `max_warm`, `empty_pool_policy` ("WAIT", "COLD",
    "FAIL" or "UNSPECIFIED"), `default_wait`, `default_ttl`, `max_ttl` (seconds; 0: the
    server's default, no expiry, no bound), `selection_policy`, `max_sandboxes`,
    `generation`, `created_at`, and `status` (a PoolStatus: `pool.status.warm`).
    `pool.warm`, `starting`, `claimed`, `target`, `waiting_claims` and `last_error` are
    kept as shorthands of the same fields of `status`."""

    name: str
    template: str
    min_warm: int
    max_warm: int
    empty_pool_policy: str
    default_wait: float
    default_ttl: float
    max_ttl: float
    selection_policy: str
    max_sandboxes: int
    generation: int
    created_at: Optional[datetime.datetime]
    status: PoolStatus

    @property
    def warm(self) -> int:
        return self.status.warm

    @property
    def starting(self) -> int:
        return self.status.starting

    @property
    def claimed(self) -> int:
        return self.status.claimed

    @property
    def target(self) -> int:
        return self.status.target

    @property
    def waiting_claims(self) -> int:
        return self.status.waiting_claims

    @property
    def last_error(self) -> str:
        return self.status.last_error

    @staticmethod
    def from_proto(p: admin_pb2.Pool) -> "PoolInfo":
        s = p.status
        return PoolInfo(
            name=p.name, template=p.template, min_warm=p.min_warm, max_warm=p.max_warm,
            empty_pool_policy=_enum(types_pb2.EmptyPoolPolicy, p.empty_pool_policy,
                                    "EMPTY_POOL_POLICY_"),
            default_wait=_seconds(p.default_wait), default_ttl=_seconds(p.default_ttl),
            max_ttl=_seconds(p.max_ttl), selection_policy=p.selection_policy,
            max_sandboxes=p.max_sandboxes, generation=p.generation,
            created_at=_ts(p.created_at),
            status=PoolStatus(warm=s.warm, starting=s.starting, claimed=s.claimed,
                              target=s.target, waiting_claims=s.waiting_claims,
                              stale=s.stale, last_error=s.last_error,
                              updated_at=_ts(s.updated_at)))


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """A workspace entry: `path` relative to the workspace; `type` "file", "directory",
    "symlink" or "other"."""

    path: str
    type: str
    size: int
    mode: int
    modified_at: Optional[datetime.datetime]

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    def __repr__(self) -> str:
        return f"FileInfo({self.path!r}, {self.type}, size={self.size}, mode=0o{self.mode:o})"

    @staticmethod
    def from_proto(f: sandboxes_pb2.FileInfo) -> "FileInfo":
        kind = {sandboxes_pb2.FILE_TYPE_REGULAR: "file",
                sandboxes_pb2.FILE_TYPE_DIRECTORY: "directory",
                sandboxes_pb2.FILE_TYPE_SYMLINK: "symlink"}.get(f.type, "other")
        return FileInfo(path=f.path, type=kind, size=f.size, mode=f.mode,
                        modified_at=_ts(f.modified_at))


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A snapshot (Snapshots service): the file system of a claimed sandbox captured as a
    read-only layer, owned by the tenant that made it. `id` is "sn-" and 16 characters;
    `parent_image_digest` is empty for a sandbox of the host's root (its snapshot holds
    only the workspace); `size_bytes` is what the tenant's quota counts; `created` is
    timezone-aware (UTC). `dropped_entries` (sockets and device nodes left out) is known
    only on the result of Sandbox.snapshot(), else 0."""

    id: str
    name: str
    labels: Dict[str, str]
    owner: str
    source_claim_id: str
    parent_image_digest: str
    parent_snapshot_id: str
    size_bytes: int
    created: Optional[datetime.datetime]
    dropped_entries: int = 0

    def __str__(self) -> str:
        return self.id

    @staticmethod
    def from_proto(s: snapshots_pb2.Snapshot, dropped_entries: int = 0) -> "Snapshot":
        return Snapshot(id=s.id, name=s.name, labels=dict(s.labels), owner=s.owner,
                        source_claim_id=s.source_claim_id,
                        parent_image_digest=s.parent_image_digest,
                        parent_snapshot_id=s.parent_snapshot_id, size_bytes=s.size_bytes,
                        created=_ts(s.create_time) if s.HasField("create_time") else None,
                        dropped_entries=dropped_entries)


FORK_DEFAULT_WAIT = 300.0  # the server's default ForkRequest.wait_timeout


def snapshot_id_of(snapshot: Any, what: str = "snapshot") -> str:
    """The id of a Snapshot or a snapshot id string; a TypeError or ValueError naming
    `what` otherwise, before any call."""
    if isinstance(snapshot, Snapshot):
        return snapshot.id
    if isinstance(snapshot, str):
        if not snapshot:
            raise ValueError(f"{what}: an empty snapshot id")
        return snapshot
    raise TypeError(f"{what}: a Snapshot or a snapshot id (str), not {type(snapshot).__name__}")


def create_snapshot_request(claim_id: str, name: Optional[str],
                            labels: Optional[Mapping[str, str]]
                            ) -> snapshots_pb2.CreateSnapshotRequest:
    return snapshots_pb2.CreateSnapshotRequest(claim_id=claim_id, name=name or "",
                                               labels=dict(labels or {}))


def fork_request(source: Any, count: int, batch_id: str, ttl, labels, env, files,
                 wait) -> snapshots_pb2.ForkRequest:
    """ForkRequest of a Snapshot, a snapshot id or a sandbox (anything with a claim_id:
    its live state is snapshotted first by the server). `count` is checked by the server
    (1 to its max batch); here only its type."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"fork() count: an int, not {type(count).__name__}")
    req = snapshots_pb2.ForkRequest(count=count, batch_id=batch_id, labels=dict(labels or {}),
                                    config=sandbox_config(env, files))
    if isinstance(source, SandboxView):
        req.claim_id = source.claim_id
    else:
        req.snapshot_id = snapshot_id_of(source, "fork() source")
    set_duration(req.ttl, ttl)
    set_duration(req.wait_timeout, wait)
    return req


def fork_deadline(wait: Optional[float], call_timeout: float) -> float:
    """The gRPC deadline of a Fork, retries included: the server's wait for every fork to
    be up (`wait`, else its default 5 minutes) plus the call timeout; a claim as source
    is snapshotted first, within the same allowance."""
    return (FORK_DEFAULT_WAIT if wait is None else float(wait)) + call_timeout


@dataclasses.dataclass(frozen=True)
class PingResult:
    payload: bytes
    server_version: str
    server_commit: str
    server_time: Optional[datetime.datetime]


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """How a command ended. `stdout`/`stderr` are decoded as UTF-8 (invalid bytes
    replaced); `stdout_raw`/`stderr_raw` are the bytes. `exit_code` is None when a signal
    killed the process (`signal` says which; 9 after `timed_out`). `truncated`: output
    beyond max_output_bytes was dropped."""

    stdout_raw: bytes
    stderr_raw: bytes
    exit_code: Optional[int]
    signal: Optional[int] = None
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    pid: int = 0

    @property
    def stdout(self) -> str:
        return self.stdout_raw.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_raw.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def returncode(self) -> int:
        """subprocess-style: the exit code, or -N when signal N killed the process."""
        return self.exit_code if self.exit_code is not None else -(self.signal or 0)

    def __repr__(self) -> str:
        how = (f"exit_code={self.exit_code}" if self.exit_code is not None
               else f"signal={self.signal}")
        flags = "".join(f", {n}=True" for n in ("timed_out", "truncated") if getattr(self, n))

        def clip(b: bytes) -> str:
            s = b.decode("utf-8", "replace")
            return repr(s if len(s) <= 60 else s[:57] + "...")
        return (f"ExecResult({how}, stdout={clip(self.stdout_raw)}, "
                f"stderr={clip(self.stderr_raw)}{flags})")


@dataclasses.dataclass(frozen=True)
class ExecChunk:
    """Output of a running command as it arrives: `stream` is "stdout" or "stderr"."""

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def exec_result(pid: int, out: bytes, err: bytes, exit_msg) -> ExecResult:
    which = exit_msg.WhichOneof("status")
    return ExecResult(
        stdout_raw=out, stderr_raw=err,
        exit_code=exit_msg.exit_code if which == "exit_code" else None,
        signal=exit_msg.signal if which == "signal" else None,
        timed_out=exit_msg.timed_out, truncated=exit_msg.truncated,
        duration=exit_msg.duration.ToNanoseconds() / 1e9, pid=pid)


def argv_of(cmd: Union[str, Sequence[str]]) -> List[str]:
    """A string runs through `sh -c`; a list is the argv itself (no shell)."""
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("cmd must be a string or a non-empty list of strings")
    return argv


def exec_start(claim_id: str, cmd, env: Optional[Mapping[str, str]], cwd: Optional[str],
               timeout: Optional[float], max_output_bytes: Optional[int],
               attach_stdin: bool) -> sandboxes_pb2.ExecRequest:
    start = sandboxes_pb2.ExecStart(claim_id=claim_id, argv=argv_of(cmd),
                                    env=dict(env or {}), cwd=cwd or "",
                                    max_output_bytes=max_output_bytes or 0,
                                    attach_stdin=attach_stdin)
    set_duration(start.timeout, timeout)
    return sandboxes_pb2.ExecRequest(start=start)


def exec_deadline(timeout: Optional[float], call_timeout: float) -> float:
    """The gRPC deadline of an Exec: the command's timeout (the server's 10 min when not
    given) plus the client's call timeout, so that the server's timed_out result, which
    says more, arrives before the deadline."""
    return (timeout if timeout else EXEC_DEFAULT_TIMEOUT) + call_timeout


def stdin_bytes(stdin: Union[None, str, bytes]) -> Optional[bytes]:
    if stdin is None:
        return None
    return stdin.encode() if isinstance(stdin, str) else bytes(stdin)


def pool_or_image(pool: Optional[str], image: Optional[str]) -> None:
    """A claim names a pool or an image, never both (ValueError naming them, before any
    call)."""
    if pool and image:
        raise ValueError(f"give a pool ({pool!r}) or an image ({image!r}), not both")
    if not pool and not image:
        raise ValueError("give a pool, or an image (image=...)")


def claim_request(claim_id: str, pool: Optional[str], ttl, env, files, labels, wait, policy,
                  priority=None, node_preference=None,
                  image: Optional[str] = None) -> claims_pb2.ClaimRequest:
    req = claims_pb2.ClaimRequest(claim_id=claim_id, pool=pool or "", image=image or "",
                                  empty_pool_policy=policy_value(policy),
                                  priority=priority_value(priority),
                                  labels=dict(labels or {}),
                                  node_preference=dict(node_preference or {}),
                                  config=sandbox_config(env, files))
    set_duration(req.wait_timeout, wait)
    set_duration(req.ttl, ttl)
    return req


def batch_request(batch_id: str, pool: Optional[str], count: int, best_effort: bool, ttl, env,
                  files, labels, wait, policy, priority=None, node_preference=None,
                  image: Optional[str] = None) -> claims_pb2.ClaimBatchRequest:
    req = claims_pb2.ClaimBatchRequest(
        batch_id=batch_id, pool=pool or "", image=image or "", count=count,
        mode=claims_pb2.BATCH_MODE_BEST_EFFORT if best_effort
        else claims_pb2.BATCH_MODE_ALL_OR_NOTHING,
        empty_pool_policy=policy_value(policy), priority=priority_value(priority),
        labels=dict(labels or {}), node_preference=dict(node_preference or {}),
        config=sandbox_config(env, files))
    set_duration(req.wait_timeout, wait)
    set_duration(req.ttl, ttl)
    return req


def sandbox_config(env: Optional[Mapping[str, str]],
                   files: Optional[Mapping[str, Union[str, bytes]]]) -> types_pb2.SandboxConfig:
    """Late-bound config: env for every later exec, files (path -> content) placed in the
    workspace before the claim returns (1 MiB in total)."""
    cfg = types_pb2.SandboxConfig(env=dict(env or {}))
    for path, content in (files or {}).items():
        data = content.encode() if isinstance(content, str) else bytes(content)
        cfg.files.add(path=path, content=data)
    return cfg


def claim_deadline(wait: Optional[float], policy: Optional[str],
                   call_timeout: float, image: bool = False) -> float:
    """The gRPC deadline of a Claim or ClaimBatch, retries included: the time the server
    may make it wait (`wait`; none with policy "fail"; else the server's default 30 s, or
    5 minutes for a claim by image, whose on-demand pool may first pull it) plus the call
    timeout (the claim's `timeout=`, else the client's). The same rule as the TypeScript
    SDK's."""
    if wait is not None:
        waiting = float(wait)
    elif isinstance(policy, str) and policy.lower() == "fail":
        waiting = 0.0
    else:
        waiting = IMAGE_DEFAULT_WAIT if image else DEFAULT_WAIT
    return waiting + call_timeout


def claim_filter(pool: Optional[str], selector: Optional[str],
                 labels: Optional[Mapping[str, str]], states: Optional[Sequence[str]],
                 owner: Optional[str]) -> claims_pb2.ClaimFilter:
    f = claims_pb2.ClaimFilter(pool=pool or "", label_selector=selector or "",
                               match_labels=dict(labels or {}), owner=owner or "")
    for s in states or ():
        f.states.append(types_pb2.ClaimState.Value("CLAIM_STATE_" + s.upper()))
    return f


def is_file_level_error(message: str) -> bool:
    """True when a NOT_FOUND / FAILED_PRECONDITION of a file call is about the path (the
    server's messages start with `path "..."` or `parent directory of path`) rather than
    about the claim (`claim "..."`)."""
    return message.startswith("path ") or message.startswith("parent directory of path")


def shell_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


class SandboxView:
    """What sbx.Sandbox and sbx.aio.AsyncSandbox show of their claim (`info`, a ClaimInfo,
    and `_released` are set by them)."""

    info: ClaimInfo
    _released: bool

    @property
    def claim_id(self) -> str:
        """The claim's id (the idempotency key)."""
        return self.info.claim_id

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id."""
        return self.info.sandbox_id

    @property
    def pool(self) -> str:
        """The pool the sandbox came from."""
        return self.info.pool

    def __repr__(self) -> str:
        state = "RELEASED" if self._released else self.info.state
        return (f"<sbx.{type(self).__name__} claim_id={self.claim_id!r} pool={self.pool!r} "
                f"sandbox_id={self.sandbox_id!r} state={state}>")
