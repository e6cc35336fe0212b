"""What the sync and async compat clients share: error and value mapping."""

from __future__ import annotations

import datetime
import uuid
from typing import Dict, List, Optional, Tuple

import sbx
from sbx.compat import exceptions as ex
from sbx.compat.models import ExecutionResult, FileEntry, SandboxDirectConnectionConfig

# The claim label that records the namespace given to create_sandbox. sbx has tenants
# (from the token), not namespaces: a namespace is a label on the claim, which
# get_sandbox, delete_sandbox and list_all_sandboxes check.
NAMESPACE_LABEL = "k8s-agent-sandbox/namespace"
MAX_WAIT = 3600.0  # sbx's limit on a claim's wait


def new_claim_name() -> str:
    return f"sandbox-claim-{uuid.uuid4().hex[:16]}"


def client_args(connection_config, kwargs: Dict) -> Dict:
    if connection_config is not None:
        if not isinstance(connection_config, SandboxDirectConnectionConfig):
            raise TypeError(
                f"sbx.compat supports SandboxDirectConnectionConfig only (got "
                f"{type(connection_config).__name__}): sbx-server is reached directly")
        target, tls = connection_config.target()
        kwargs.setdefault("server", target)
        if tls:
            kwargs.setdefault("tls", True)
    return kwargs


def unsupported(volume_claim_templates, pod_labels, pod_annotations) -> None:
    for name, value in (("volume_claim_templates", volume_claim_templates),
                        ("pod_labels", pod_labels), ("pod_annotations", pod_annotations)):
        if value:
            raise NotImplementedError(f"sbx.compat: {name} has no equivalent in sbx (claims "
                                      "take warm sandboxes as their template made them)")


def claim_labels(labels: Optional[Dict[str, str]], namespace: str) -> Dict[str, str]:
    out = dict(labels or {})
    out[NAMESPACE_LABEL] = namespace
    return out


def wait_of(sandbox_ready_timeout: float) -> float:
    return min(float(sandbox_ready_timeout), MAX_WAIT)


def ttl_of(shutdown_after_seconds: Optional[int]) -> Optional[float]:
    if shutdown_after_seconds is None:
        return None
    if int(shutdown_after_seconds) <= 0:
        raise ValueError(f"shutdown_after_seconds must be a positive integer, got "
                         f"{shutdown_after_seconds!r}")
    return float(shutdown_after_seconds)


def create_error(e: sbx.SbxError, warmpool: str) -> ex.SandboxError:
    if isinstance(e, sbx.NotFound):
        return ex.SandboxWarmPoolNotFoundError(f"warm pool {warmpool!r} not found: {e}")
    if isinstance(e, (sbx.DeadlineExceeded, sbx.PoolExhausted, sbx.Unavailable)):
        return ex.SandboxNotReadyError(f"no sandbox of warm pool {warmpool!r} ready: {e}")
    if isinstance(e, (sbx.InvalidArgument, sbx.AlreadyExists, sbx.FailedPrecondition,
                      sbx.PermissionDenied, sbx.Unauthenticated)):
        return ex.SandboxClaimFailedError(str(e))
    return ex.SandboxError(str(e))


def request_error(e: sbx.SbxError) -> ex.SandboxError:
    if isinstance(e, sbx.NotFound) and not e.message.startswith(("path ", "parent directory")):
        return ex.SandboxNotFoundError(str(e))
    return ex.SandboxRequestError(str(e), status_code=e.code.name, response=e)


def check_namespace(info: sbx.ClaimInfo, claim_name: str, namespace: str) -> None:
    ns = info.labels.get(NAMESPACE_LABEL)
    if ns is not None and ns != namespace:
        raise ex.SandboxNotFoundError(
            f"sandbox claim {claim_name!r} not found in namespace {namespace!r}")
    if info.state != "ACTIVE":
        raise ex.SandboxNotFoundError(f"sandbox claim {claim_name!r} is {info.state}")


def namespace_selector(namespace: str, label_selector: Optional[str]) -> str:
    sel = f"{NAMESPACE_LABEL}={namespace}"
    return f"{sel},{label_selector}" if label_selector else sel


def execution_result(r: sbx.ExecResult, timeout: float) -> ExecutionResult:
    if r.timed_out:
        raise ex.SandboxRequestError(f"command timed out after {timeout} s",
                                     status_code="DEADLINE_EXCEEDED")
    code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
    return ExecutionResult(stdout=r.stdout, stderr=r.stderr, exit_code=code)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def file_entries(files: List[sbx.FileInfo]) -> List[FileEntry]:
    return [FileEntry(name=f.name, size=f.size,
                      type="directory" if f.is_dir else "file",
                      modified=f.modified_at or _EPOCH, mode=f"{f.mode:04o}") for f in files]


def status_of(info: Optional[sbx.ClaimInfo]) -> Tuple[str, str]:
    if info is None:
        return "SandboxNotFound", "the claim does not exist"
    if info.state != "ACTIVE":
        return "SandboxNotFound", f"the claim is {info.state}"
    if info.suspended:
        return "SandboxNotReady", "the sandbox is suspended"
    return "SandboxReady", ""
