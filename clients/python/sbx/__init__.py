"""Python SDK of sbx, the warm-pool sandbox server.

    import sbx

    with sbx.Client() as client, client.claim("default", ttl=600) as sb:
        print(sb.exec("echo hello from $(hostname)").stdout)

`sbx.Client` (blocking) and `sbx.AsyncClient` (asyncio) speak the sbx.v1 gRPC API
(docs/api.md); `sbx.compat` offers the interface of upstream agent-sandbox's Python SDK.
See docs/sdk-python.md.
"""

from sbx._common import (ClaimEvent, ClaimInfo, ExecChunk, ExecResult, FileInfo, PingResult,
                         PoolInfo, PoolStatus, RetryPolicy, Snapshot, new_claim_id)
from sbx._process import PortUrl, ProcessExit, ProcessInfo, ProcessOutput
from sbx.aio import (AsyncClaimWatch, AsyncFileWatch, AsyncClient, AsyncExecStream, AsyncFiles, AsyncSandbox,
                     AsyncSandboxGroup, AsyncSnapshots)
from sbx.client import (ClaimWatch, Client, ExecStream, FileEvent, Files, FileWatch, Sandbox,
                        SandboxGroup, Snapshots)
from sbx.aio_process import AsyncProcess, AsyncProcesses, AsyncPty
from sbx.process import Process, Processes, Pty
from sbx.errors import (Aborted, AlreadyExists, Cancelled, DeadlineExceeded, FailedPrecondition,
                        Internal, InvalidArgument, NotFound, OutOfRange, PermissionDenied,
                        PoolExhausted, ResourceExhausted, SbxError, Unauthenticated,
                        Unavailable, Unimplemented)

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "SandboxGroup", "Files", "FileWatch", "FileEvent", "ExecStream",
    "ClaimWatch", "Snapshots", "Snapshot",
    "AsyncClient", "AsyncSandbox", "AsyncSandboxGroup", "AsyncFiles", "AsyncExecStream",
    "AsyncClaimWatch", "AsyncFileWatch", "AsyncSnapshots",
    "Processes", "Process", "Pty", "AsyncProcesses", "AsyncProcess", "AsyncPty",
    "ProcessInfo", "ProcessExit", "ProcessOutput", "PortUrl",
    "ExecResult", "ExecChunk", "FileInfo", "ClaimInfo", "ClaimEvent", "PoolInfo", "PoolStatus",
    "PingResult",
    "RetryPolicy", "new_claim_id",
    "SbxError", "Aborted", "AlreadyExists", "Cancelled", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "PoolExhausted", "ResourceExhausted", "Unauthenticated",
    "Unavailable", "Unimplemented",
]
