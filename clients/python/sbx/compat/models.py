"""Result and config types with upstream agent-sandbox's names (k8s_agent_sandbox.models).

Upstream's are pydantic models; these are dataclasses with the two pydantic methods code
uses to hand a result on (to an LLM, a log, an HTTP answer): `model_dump()` and
`model_dump_json()`, which give what pydantic 2 gives for the same fields (datetimes as
ISO 8601 with "Z" for UTC, compact JSON unless `indent`)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from typing import Any, Dict, Optional, Union

_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _json_value(v: Any) -> Any:
    if isinstance(v, datetime.datetime):
        s = v.isoformat()
        return s[:-6] + "Z" if s.endswith("+00:00") else s
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


class _Model:
    """model_dump / model_dump_json, as pydantic 2's BaseModel has them, and its str()
    (`stdout='hi\\n' stderr='' exit_code=0`), which upstream's examples print."""

    def __str__(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)!r}"
                        for f in dataclasses.fields(self))  # type: ignore[arg-type]

    def model_dump(self, *, mode: str = "python", include=None, exclude=None,
                   exclude_none: bool = False) -> Dict[str, Any]:
        """The fields as a dict (mode="json": only JSON types, datetimes as text)."""
        if mode not in ("python", "json"):
            raise ValueError(f"mode {mode!r} is not 'python' or 'json'")
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if include is not None and f.name not in include:
                continue
            if exclude is not None and f.name in exclude:
                continue
            v = getattr(self, f.name)
            if exclude_none and v is None:
                continue
            out[f.name] = _json_value(v) if mode == "json" else v
        return out

    def model_dump_json(self, *, indent: Optional[int] = None, include=None, exclude=None,
                        exclude_none: bool = False) -> str:
        """The fields as JSON text: compact, or indented by `indent` spaces; UTF-8 kept."""
        data = self.model_dump(mode="json", include=include, exclude=exclude,
                               exclude_none=exclude_none)
        if indent is None:
            return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return json.dumps(data, ensure_ascii=False, indent=indent)


@dataclasses.dataclass
class ExecutionResult(_Model):
    """The result of commands.run(): decoded stdout and stderr, and the exit code (128+N
    when signal N killed the command, as a shell reports it)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = -1


@dataclasses.dataclass
class FileEntry(_Model):
    """A directory entry of files.list(): `name` (the base name), `size` in bytes,
    `type` "file" or "directory" (symlinks and others are reported as "file"), `modified`
    (timezone-aware), `mode` as octal text such as "0644"."""

    name: str
    size: int
    type: str
    modified: datetime.datetime
    mode: Optional[str] = None


def _check_port(name: str, value: int) -> None:
    if not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"{name} {value!r} must be a port between 1 and 65535")


@dataclasses.dataclass
class SandboxDirectConnectionConfig(_Model):
    """Where sbx-server is: `api_url` "host:port", "http://host:port" (plaintext) or
    "https://host:port" (TLS with the system roots). `server_port` is accepted for
    compatibility and ignored (sbx reaches sandboxes through the server)."""

    api_url: str
    server_port: Optional[int] = None

    def target(self) -> "tuple[str, bool]":
        url = self.api_url
        tls = url.startswith("https://")
        for scheme in ("http://", "https://", "grpc://", "grpcs://"):
            if url.startswith(scheme):
                tls = tls or scheme == "grpcs://"
                url = url[len(scheme):]
        return url.rstrip("/"), tls


# The configs below make upstream's client find its router or its sandbox pods (a
# Gateway's address, a kubectl port-forward, pod IPs). sbx has nothing to find: every
# call goes to sbx-server's gRPC endpoint, which is where a client without a config
# connects ($SBX_SERVER, else 127.0.0.1:50051, or the server= keyword). So they are
# accepted, their fields checked as upstream checks them, and otherwise not used.


@dataclasses.dataclass
class SandboxGatewayConnectionConfig(_Model):
    """Upstream: reach the router through a Kubernetes Gateway. sbx.compat: accepted;
    the client connects to sbx-server ($SBX_SERVER / server=) instead."""

    gateway_name: str
    gateway_namespace: str = "default"
    gateway_ready_timeout: int = 180
    server_port: int = 8888

    def __post_init__(self) -> None:
        _check_port("server_port", self.server_port)


@dataclasses.dataclass
class SandboxLocalTunnelConnectionConfig(_Model):
    """Upstream's default: `kubectl port-forward` to the router. sbx.compat: accepted;
    no tunnel is opened, the client connects to sbx-server ($SBX_SERVER / server=)."""

    port_forward_ready_timeout: int = 30
    server_port: int = 8888
    router_namespace: str = "agent-sandbox-system"

    def __post_init__(self) -> None:
        _check_port("server_port", self.server_port)
        if not _NAMESPACE_RE.match(self.router_namespace):
            raise ValueError(f"router_namespace {self.router_namespace!r} is not a "
                             "Kubernetes namespace name")


@dataclasses.dataclass
class SandboxInClusterConnectionConfig(_Model):
    """Upstream: connect to the sandbox pod's IP from inside the cluster. sbx.compat:
    accepted; the client connects to sbx-server ($SBX_SERVER / server=, e.g. the sbx
    Service's cluster DNS name), which reaches the pod."""

    server_port: int = 8888

    def __post_init__(self) -> None:
        _check_port("server_port", self.server_port)


@dataclasses.dataclass
class SandboxdPodTunnelConnectionConfig(_Model):
    """Upstream: port-forward to the sandboxd runtime of the pod. sbx.compat: accepted;
    sbx-server talks to each sandbox's daemon itself, the client connects to sbx-server
    ($SBX_SERVER / server=)."""

    rest_port: int = 8080
    grpc_port: int = 9090
    port_forward_ready_timeout: int = 30

    def __post_init__(self) -> None:
        _check_port("rest_port", self.rest_port)
        _check_port("grpc_port", self.grpc_port)


SandboxConnectionConfig = Union[
    SandboxDirectConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
]

DISCOVERY_CONFIGS = (SandboxGatewayConnectionConfig, SandboxLocalTunnelConnectionConfig,
                     SandboxInClusterConnectionConfig, SandboxdPodTunnelConnectionConfig)


@dataclasses.dataclass
class SandboxTracerConfig(_Model):
    """Accepted for compatibility; sbx.compat does no tracing."""

    enable_tracing: bool = False
    trace_service_name: str = "sandbox-client"
