"""Result and config types with upstream agent-sandbox's names (k8s_agent_sandbox.models)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Optional


@dataclasses.dataclass
class ExecutionResult:
    """The result of commands.run(): decoded stdout and stderr, and the exit code (128+N
    when signal N killed the command, as a shell reports it)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = -1


@dataclasses.dataclass
class FileEntry:
    """A directory entry of files.list(): `name` (the base name), `size` in bytes,
    `type` "file" or "directory" (symlinks and others are reported as "file"), `modified`
    (timezone-aware), `mode` as octal text such as "0644"."""

    name: str
    size: int
    type: str
    modified: datetime.datetime
    mode: Optional[str] = None


@dataclasses.dataclass
class SandboxDirectConnectionConfig:
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


@dataclasses.dataclass
class SandboxTracerConfig:
    """Accepted for compatibility; sbx.compat does no tracing."""

    enable_tracing: bool = False
    trace_service_name: str = "sandbox-client"
