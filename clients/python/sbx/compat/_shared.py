"""What the sync and async compat clients share: error and value mapping."""

from __future__ import annotations

import datetime
import ipaddress
import threading
import uuid
from typing import Dict, List, Optional, Tuple

import sbx
from sbx.compat import exceptions as ex
from sbx.compat.models import (DISCOVERY_CONFIGS, ExecutionResult, FileEntry,
                               SandboxDirectConnectionConfig)

# The claim label that records the namespace given to create_sandbox. sbx has tenants
# (from the token), not namespaces: a namespace is a label on the claim, which
# get_sandbox, delete_sandbox and list_all_sandboxes check.
NAMESPACE_LABEL = "k8s-agent-sandbox/namespace"
MAX_WAIT = 3600.0  # sbx's limit on a claim's wait


def new_claim_name() -> str:
    return f"sandbox-claim-{uuid.uuid4().hex[:16]}"


# Where upstream's sandbox images keep the user's files. On sbx that is the sandbox's
# workspace (its $HOME and working directory, /run/sbx/workspace inside the sandbox),
# which the file calls take paths relative to: both prefixes are taken off.
HOME_DIRS = ("/home/user", "/run/sbx/workspace")


def workspace_path(path: str) -> str:
    """Upstream's path as sbx's file calls take it: /home/user/x (or the workspace's own
    absolute path) becomes "x", /home/user itself and "." the workspace (""). Any other
    absolute path is left as it is, and the server refuses it (INVALID_ARGUMENT)."""
    if path in (".", "./"):
        return ""
    for home in HOME_DIRS:
        if path == home or path == home + "/":
            return ""
        if path.startswith(home + "/"):
            return path[len(home) + 1:]
    return path


def client_args(connection_config, kwargs: Dict) -> Dict:
    if connection_config is not None and not isinstance(connection_config, DISCOVERY_CONFIGS):
        if not isinstance(connection_config, SandboxDirectConnectionConfig):
            raise TypeError(
                f"sbx.compat: connection_config must be one of upstream's connection "
                f"configs (sbx.compat.models), not {type(connection_config).__name__}")
        target, tls = connection_config.target()
        kwargs.setdefault("server", target)
        if tls:
            kwargs.setdefault("tls", True)
    return kwargs


def pool_name(warmpool: Optional[str], template: Optional[str]) -> Tuple[str, bool]:
    """The name create_sandbox was given (upstream has had both `warmpool` and `template`
    as its first argument) and whether it came as `template`."""
    if warmpool and template and warmpool != template:
        raise TypeError(f"create_sandbox: give warmpool ({warmpool!r}) or template "
                        f"({template!r}), not both")
    name = warmpool or template
    if not name:
        raise TypeError("create_sandbox: missing the warmpool (or template) to claim from")
    return name, not warmpool


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


def pool_not_found(e: sbx.SbxError) -> bool:
    return isinstance(e, sbx.NotFound) and e.message.startswith("pool ")


def pools_of_template(pools: List[sbx.PoolInfo], template: str) -> List[str]:
    """Names of the pools made from `template`, the one with the most warm sandboxes
    first."""
    mine = [p for p in pools if p.template == template]
    return [p.name for p in sorted(mine, key=lambda p: -p.status.warm)]


def create_error(e: sbx.SbxError, warmpool: str, template: bool = False) -> ex.SandboxError:
    if isinstance(e, sbx.NotFound):
        if template:
            return ex.SandboxTemplateNotFoundError(
                f"no pool named {warmpool!r} or made from template {warmpool!r}: {e}")
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


def pod_ip(info: sbx.ClaimInfo) -> Optional[str]:
    """The sandbox's pod IP: the host of its endpoint on the Kubernetes runtime ("ip:port");
    None for local sandboxes (their daemon listens on a unix socket)."""
    host = info.endpoint.rsplit(":", 1)[0] if ":" in info.endpoint else ""
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"


def sandbox_object(info: sbx.ClaimInfo, namespace: str) -> Dict:
    """What upstream's k8s_helper.get_sandbox returns (the Sandbox object as a dict),
    made from the claim: name, namespace, the pod-name annotation, labels, and the pod
    IP in status.podIPs when there is one."""
    ip = pod_ip(info)
    return {
        "apiVersion": "agents.x-k8s.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": info.sandbox_id, "namespace": namespace,
                     "uid": info.sandbox_id,
                     "annotations": {POD_NAME_ANNOTATION: info.sandbox_id},
                     "labels": dict(info.labels)},
        "status": {"podIPs": [{"ip": ip}] if ip else [],
                   "conditions": [{"type": "Ready",
                                   "status": "True" if info.state == "ACTIVE"
                                   and not info.suspended else "False"}]},
    }


class Metrics:
    """The client-side numbers get_metrics() reports, in Prometheus' text format (as
    upstream's, which come from prometheus_client; sbx.compat needs no such package)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._creates: Dict[str, int] = {}
        self._create_seconds = 0.0
        self._runs = 0

    def created(self, outcome: str, seconds: float) -> None:
        with self._lock:
            self._creates[outcome] = self._creates.get(outcome, 0) + 1
            self._create_seconds += seconds

    def ran(self) -> None:
        with self._lock:
            self._runs += 1

    def text(self) -> str:
        with self._lock:
            creates = dict(self._creates)
            seconds, runs = self._create_seconds, self._runs
        lines = ["# HELP sbx_compat_sandbox_create_total create_sandbox calls by outcome.",
                 "# TYPE sbx_compat_sandbox_create_total counter"]
        for outcome in sorted(creates):
            lines.append(f'sbx_compat_sandbox_create_total{{outcome="{outcome}"}} '
                         f"{creates[outcome]}")
        lines += ["# HELP sbx_compat_sandbox_create_seconds Time spent in create_sandbox.",
                  "# TYPE sbx_compat_sandbox_create_seconds summary",
                  f"sbx_compat_sandbox_create_seconds_sum {seconds:.6f}",
                  f"sbx_compat_sandbox_create_seconds_count {sum(creates.values())}",
                  "# HELP sbx_compat_command_run_total commands.run calls.",
                  "# TYPE sbx_compat_command_run_total counter",
                  f"sbx_compat_command_run_total {runs}"]
        return "\n".join(lines) + "\n"


METRICS = Metrics()


def get_metrics() -> str:
    """This process's sbx.compat client metrics, in Prometheus' text format."""
    return METRICS.text()


def print_metrics() -> None:
    """Prints get_metrics()."""
    print(get_metrics())
