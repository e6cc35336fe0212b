"""Typed errors of the sbx SDK, one class per gRPC status code that sbx gives a meaning.

Every error keeps the server's status code and message (`pool "py" not found`).
`PoolExhausted` also carries the server's retry hint (trailing metadata
`sbx-retry-after-ms`) as `retry_after` in seconds, or None when the server gave none.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

RETRY_AFTER_KEY = "sbx-retry-after-ms"


class SbxError(Exception):
    """Base of every error the SDK raises for a failed call.

    Attributes: `code` (grpc.StatusCode), `message` (the server's text), `retry_after`
    (seconds, for RESOURCE_EXHAUSTED answers that carry a hint; else None), `claim_id`
    (for a failed claim or batch: the id it was sent with, so that it can be retried or
    released; else None).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    claim_id: Optional[str] = None

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def __str__(self) -> str:
        text = f"{self.code.name}: {self.message}"
        if self.retry_after is not None:
            text += f" (retry after {self.retry_after * 1000:.0f} ms)"
        return text

    def __repr__(self) -> str:
        extra = f", retry_after={self.retry_after!r}" if self.retry_after is not None else ""
        return f"{type(self).__name__}({self.message!r}{extra})"


class Cancelled(SbxError):
    """The call was cancelled (CANCELLED)."""
    code = grpc.StatusCode.CANCELLED


class InvalidArgument(SbxError, ValueError):
    """The request itself is wrong (INVALID_ARGUMENT); retrying it fails again."""
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(SbxError, TimeoutError):
    """A WAIT/COLD claim got no sandbox within its wait, or the call's deadline passed
    (DEADLINE_EXCEEDED). Nothing is held: retrying with the same claim id is safe."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(SbxError, LookupError):
    """No such pool, claim (or another tenant's claim), file or directory (NOT_FOUND)."""
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(SbxError):
    """A claim or batch id reused with other parameters (ALREADY_EXISTS)."""
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(SbxError, PermissionError):
    """A valid token that may not do this, e.g. a tenant calling pools() (PERMISSION_DENIED)."""
    code = grpc.StatusCode.PERMISSION_DENIED


class PoolExhausted(SbxError):
    """RESOURCE_EXHAUSTED: no sandbox to give (policy FAIL on an empty pool, or a pool at
    its max_sandboxes); also a full workspace, too many concurrent Exec calls or an
    oversized request. `retry_after` is the server's hint in seconds (None: no estimate)."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


ResourceExhausted = PoolExhausted


class FailedPrecondition(SbxError):
    """The system is not in a state to do it: the claim has ended, the sandbox is
    suspended, an instant-runtime sandbox cannot run commands (FAILED_PRECONDITION)."""
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(SbxError):
    """A lost race (ABORTED): retry the whole operation."""
    code = grpc.StatusCode.ABORTED


class OutOfRange(SbxError):
    """A watch's start revision is no longer kept, or a listing is too large (OUT_OF_RANGE)."""
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(SbxError, NotImplementedError):
    """The server does not implement this method (UNIMPLEMENTED)."""
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(SbxError):
    """A server bug (INTERNAL)."""
    code = grpc.StatusCode.INTERNAL


class Unavailable(SbxError, ConnectionError):
    """Transient trouble: server starting or stopping, unreachable, or a sandbox daemon
    that cannot be reached (UNAVAILABLE)."""
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(SbxError):
    """Missing or invalid bearer token (UNAUTHENTICATED)."""
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[SbxError]] = {
    cls.code: cls for cls in (
        Cancelled, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, PoolExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, Unauthenticated)
}


def retry_hint(trailing_metadata) -> Optional[float]:
    """The `sbx-retry-after-ms` hint of trailing metadata, in seconds; None if absent."""
    for key, value in trailing_metadata or ():
        if key == RETRY_AFTER_KEY:
            try:
                return max(0.0, int(value) / 1000.0)
            except (TypeError, ValueError):
                return None
    return None


def from_rpc_error(e: grpc.RpcError) -> SbxError:
    """The typed error for a failed gRPC call (sync or grpc.aio)."""
    try:
        code = e.code()
        message = e.details() or ""
        trailing = e.trailing_metadata()
    except Exception:  # An RpcError that is not a Call (should not happen).
        return SbxError(str(e))
    cls = _BY_CODE.get(code, SbxError)
    hint = retry_hint(trailing) if code == grpc.StatusCode.RESOURCE_EXHAUSTED else None
    err = cls(message or code.name, code=code, retry_after=hint)
    return err
