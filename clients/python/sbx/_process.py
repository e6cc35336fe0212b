"""What the sync and the asyncio process handles share: result types, request builders
and the conversion of ProcessEvent messages. Private: use the names exported by `sbx`."""

from __future__ import annotations

import dataclasses
import datetime
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from sbx import _common as c
from sbx.v1 import sandboxes_pb2

# A process is named by its pid (int) or its tag (str), as the server's ProcessSelector.
ProcessRef = Union[int, str]

# WaitProcess lasts until the process ends or the call's deadline passes: without a
# timeout the SDK waits in calls of this length, one after the other.
WAIT_SLICE = 60.0
# sb.pty() without a command: the sandbox's login shell, as `sbx shell` runs it.
DEFAULT_PTY_CMD = ("/bin/sh", "-c",
                   's="${SHELL:-/bin/sh}"; [ -x "$s" ] || s=/bin/sh; exec "$s" -l')


@dataclasses.dataclass(frozen=True)
class ProcessExit:
    """How a process ended: `exit_code` (0-255) when it exited by itself, else None and
    `signal` the number of the signal that killed it. `output_bytes` it wrote in all,
    `dropped_bytes` dropped from its replay buffer before every reader had them."""

    exit_code: Optional[int]
    signal: Optional[int]
    ended_at: Optional[datetime.datetime]
    duration: float
    output_bytes: int
    dropped_bytes: int

    @property
    def returncode(self) -> int:
        """subprocess-style: the exit code, or -N when signal N killed the process."""
        return self.exit_code if self.exit_code is not None else -(self.signal or 0)

    @staticmethod
    def from_proto(e: sandboxes_pb2.ProcessExit) -> "ProcessExit":
        which = e.WhichOneof("status")
        return ProcessExit(exit_code=e.exit_code if which == "exit_code" else None,
                           signal=e.signal if which == "signal" else None,
                           ended_at=c._ts(e.ended_at) if e.HasField("ended_at") else None,
                           duration=e.duration.ToNanoseconds() / 1e9,
                           output_bytes=e.output_bytes, dropped_bytes=e.dropped_bytes)


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """One process of a sandbox (ListProcesses): running, or ended and still kept
    (`exit` set). `pty` is (cols, rows) for a PTY process, else None."""

    pid: int
    tag: str
    argv: List[str]
    cwd: str
    pty: Optional[Tuple[int, int]]
    stdin_open: bool
    started_at: Optional[datetime.datetime]
    exit: Optional[ProcessExit]
    readers: int
    output_bytes: int
    dropped_bytes: int
    buffered_bytes: int
    replay_bytes: int

    @property
    def running(self) -> bool:
        return self.exit is None

    @staticmethod
    def from_proto(p: sandboxes_pb2.ProcessInfo) -> "ProcessInfo":
        return ProcessInfo(
            pid=p.pid, tag=p.tag, argv=list(p.argv), cwd=p.cwd,
            pty=(p.pty.cols, p.pty.rows) if p.HasField("pty") else None,
            stdin_open=p.stdin_open, started_at=c._ts(p.started_at),
            exit=ProcessExit.from_proto(p.exit) if p.HasField("exit") else None,
            readers=p.readers, output_bytes=p.output_bytes, dropped_bytes=p.dropped_bytes,
            buffered_bytes=p.buffered_bytes, replay_bytes=p.replay_bytes)


@dataclasses.dataclass(frozen=True)
class ProcessOutput:
    """Output of a process as it arrives: `stream` is "stdout", "stderr", "pty" (a PTY
    process's terminal) or "dropped" (then `data` is empty and `dropped` says how many
    bytes are missing here: the process wrote more than its replay buffer holds while
    this reader was behind)."""

    stream: str
    data: bytes
    dropped: int = 0

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True)
class PortUrl:
    """A URL at which a port inside the sandbox is reached through sbx-server's port
    proxy, without the tenant's token, until `expires_at`. `url` is the path form,
    `host_url` the host-name form (empty when the server has no --proxy_domain), `token`
    the signed token alone (query parameter sbx_token or header X-Sbx-Token).
    str(port_url) is `url`."""

    url: str
    host_url: str
    token: str = dataclasses.field(repr=False)
    expires_at: Optional[datetime.datetime]

    def __str__(self) -> str:
        return self.url


def selector(ref: ProcessRef) -> sandboxes_pb2.ProcessSelector:
    """A pid (int >= 1) or a tag (str); anything else is a ValueError before any call."""
    if isinstance(ref, bool) or not isinstance(ref, (int, str)):
        raise ValueError(f"a process is named by its pid (int) or tag (str), not {ref!r}")
    if isinstance(ref, int):
        if ref < 1:
            raise ValueError(f"pid {ref} must be 1 or more")
        return sandboxes_pb2.ProcessSelector(pid=ref)
    if not ref:
        raise ValueError("the process tag is empty")
    return sandboxes_pb2.ProcessSelector(tag=ref)


def start_request(claim_id: str, cmd: Union[str, Sequence[str]], *, detach: bool,
                  tag: Optional[str], env: Optional[Mapping[str, str]], cwd: Optional[str],
                  stdin: bool, pty: Optional[Mapping[str, object]],
                  replay_bytes: Optional[int]) -> sandboxes_pb2.StartProcessRequest:
    req = sandboxes_pb2.StartProcessRequest(
        claim_id=claim_id, argv=c.argv_of(cmd), env=dict(env or {}), cwd=cwd or "",
        tag=tag or "", stdin=stdin, detach=detach, replay_bytes=replay_bytes or 0)
    if pty is not None:
        req.pty.size.cols = int(pty.get("cols", 80))  # type: ignore[arg-type]
        req.pty.size.rows = int(pty.get("rows", 24))  # type: ignore[arg-type]
        req.pty.term = str(pty.get("term") or "")
    return req


def pty_options(pty: Union[None, bool, Mapping[str, object]]) -> Optional[Mapping[str, object]]:
    """start(pty=...): None/False none, True 80x24, or {"cols", "rows", "term"}."""
    if pty is None or pty is False:
        return None
    if pty is True:
        return {"cols": 80, "rows": 24}
    return pty


def output_of(ev: sandboxes_pb2.ProcessEvent) -> Optional[ProcessOutput]:
    kind = ev.WhichOneof("kind")
    if kind in ("stdout", "stderr", "pty"):
        return ProcessOutput(kind, getattr(ev, kind))
    if kind == "dropped":
        return ProcessOutput("dropped", b"", ev.dropped.bytes)
    return None


def input_bytes(data: Union[str, bytes]) -> bytes:
    b = data.encode() if isinstance(data, str) else bytes(data)
    return b


def chunks(b: bytes) -> List[bytes]:
    """SendProcessInput takes at most 1 MiB a call; empty data is one empty call."""
    return [b[i:i + c.CHUNK] for i in range(0, len(b), c.CHUNK)] or [b""]


def url_request(claim_id: str, port: int, ttl: Optional[float]) -> sandboxes_pb2.GetPortUrlRequest:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r} must be an int in 1..65535")
    req = sandboxes_pb2.GetPortUrlRequest(claim_id=claim_id, port=port)
    c.set_duration(req.ttl, ttl)
    return req


def port_url(r: sandboxes_pb2.GetPortUrlResponse) -> PortUrl:
    return PortUrl(url=r.url, host_url=r.host_url, token=r.token,
                   expires_at=c._ts(r.expires_at))
