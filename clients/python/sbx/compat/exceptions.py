"""The exception names of upstream agent-sandbox's Python SDK (k8s-agent-sandbox).

Each error raised by sbx.compat is one of these; its __cause__ is the sbx.SbxError with the
server's status code and message."""

from __future__ import annotations

from typing import Any, Optional


class SandboxError(RuntimeError):
    """Base of every sbx.compat error."""


class SandboxNotReadyError(SandboxError):
    """No sandbox was ready within sandbox_ready_timeout (sbx: DEADLINE_EXCEEDED), or
    the pool had none to give (RESOURCE_EXHAUSTED)."""


class SandboxNotFoundError(SandboxError):
    """The claim does not exist, has ended, or belongs to another namespace."""


class SandboxTemplateNotFoundError(SandboxError):
    """Kept for compatibility; sbx reports a missing template through the pool."""


class SandboxWarmPoolNotFoundError(SandboxError):
    """The warm pool (the sbx pool of that name) does not exist."""


class SandboxPortForwardError(SandboxError):
    """Kept for compatibility; sbx.compat never port-forwards."""


class SandboxMetadataError(SandboxError):
    """Kept for compatibility."""


class SnapshotNotFoundError(SandboxError):
    """Kept for compatibility: sbx has no pod snapshots, so nothing raises it."""


class SandboxWarmPoolMismatchError(SandboxError):
    """Kept for compatibility: sbx claims from the pool named, so nothing raises it."""


class SandboxNoServiceError(SandboxError):
    """Kept for compatibility: sbx reaches sandboxes through sbx-server, not a Service."""


class SandboxServiceUnavailableError(SandboxError):
    """Kept for compatibility: sbx-server being unreachable is an sbx.Unavailable, mapped
    to SandboxNotReadyError (create_sandbox) or SandboxRequestError (other calls)."""


class SandboxClaimFailedError(SandboxError):
    """The claim was refused for good (sbx: INVALID_ARGUMENT, ALREADY_EXISTS,
    FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED)."""


class SandboxRequestError(SandboxError):
    """A call on a sandbox failed. `status_code` is the gRPC status code's name here
    (e.g. "NOT_FOUND"), where upstream has an HTTP status; `response` is the sbx.SbxError."""

    def __init__(self, message: str, status_code: Optional[Any] = None,
                 response: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.response = response
