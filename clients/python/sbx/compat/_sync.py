"""sbx.compat.SandboxClient and its Sandbox handle (blocking)."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Dict, List, Optional, Tuple

import sbx
from sbx.compat import _shared as s
from sbx.compat import exceptions as ex
from sbx.compat.models import ExecutionResult, FileEntry

log = logging.getLogger("sbx.compat")


class CommandExecutor:
    """sandbox.commands: run shell commands."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def run(self, command: str, timeout: int = 60) -> ExecutionResult:
        """Runs `command` with /bin/sh -c and waits at most `timeout` seconds
        (SandboxRequestError when it had to be killed)."""
        s.METRICS.ran()
        try:
            r = self._sandbox._sb.exec(["/bin/sh", "-c", command], timeout=timeout)
        except sbx.SbxError as e:
            raise s.request_error(e) from e
        return s.execution_result(r, timeout)


class Filesystem:
    """sandbox.files: the sandbox's workspace. Paths are relative to it; upstream's
    /home/user (and the workspace's own /run/sbx/workspace) is the workspace, so
    "/home/user/a.txt" is "a.txt". Other absolute paths are refused by the server
    (SandboxRequestError, INVALID_ARGUMENT). `timeout` is accepted and not used: the
    client's timeout applies."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._files = sandbox._sb.files

    def _do(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except sbx.SbxError as e:
            raise s.request_error(e) from e

    def write(self, path: str, content, timeout: int = 60) -> None:
        """Writes bytes or str (UTF-8) to a file, creating missing directories."""
        self._do(self._files.write, s.workspace_path(path), content)

    def read(self, path: str, timeout: int = 60) -> bytes:
        return self._do(self._files.read, s.workspace_path(path))

    def list(self, path: str, timeout: int = 60) -> List[FileEntry]:
        """Entries of a directory ("." , "" or "/home/user" is the workspace)."""
        return s.file_entries(self._do(self._files.list, s.workspace_path(path)))

    def exists(self, path: str, timeout: int = 60) -> bool:
        return self._do(self._files.exists, s.workspace_path(path))

    def delete(self, path: str, recursive: bool = False, timeout: int = 60) -> None:
        """Removes a file or directory (sbx has no delete call: `rm` runs in the sandbox)."""
        self._do(self._files.remove, s.workspace_path(path), recursive=recursive)


class K8sHelper:
    """sandbox.k8s_helper: what upstream's examples read from it. get_sandbox(name,
    namespace) returns the Sandbox object as a dict made from the claim (name, the
    pod-name annotation, status.podIPs when the sandbox has a pod IP), or None for a
    name that is not this sandbox's."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def get_sandbox(self, name: str, namespace: str = "default") -> Optional[dict]:
        if name != self._sandbox.sandbox_id:
            return None
        try:
            info = self._sandbox._sb.refresh()
        except sbx.NotFound:
            return None
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e
        return s.sandbox_object(info, namespace)


class Sandbox:
    """A claimed sandbox, as upstream's handle: claim_name, sandbox_id, namespace,
    commands, files, status(), terminate()."""

    def __init__(self, client: "SandboxClient", sb: sbx.Sandbox, namespace: str) -> None:
        self._client = client
        self._sb = sb
        self.claim_name: Optional[str] = sb.claim_id
        self.sandbox_id = sb.sandbox_id
        self.namespace = namespace
        self._commands: Optional[CommandExecutor] = CommandExecutor(self)
        self._files: Optional[Filesystem] = Filesystem(self)
        self.k8s_helper = K8sHelper(self)

    def get_pod_name(self) -> str:
        """The sandbox's name, which is its pod's (sbx's sandbox id)."""
        return self.sandbox_id

    def get_pod_ip(self) -> Optional[str]:
        """The pod IP, read again from the server each time (Kubernetes runtime); None
        for local sandboxes, which have none."""
        try:
            return s.pod_ip(self._sb.refresh())
        except sbx.SbxError as e:
            raise s.request_error(e) from e

    def get_sandbox_name_hash(self) -> Optional[str]:
        """None: sbx's sandboxes carry no name-hash selector label."""
        return None

    def __repr__(self) -> str:
        return (f"<sbx.compat.Sandbox claim_name={self.claim_name!r} "
                f"namespace={self.namespace!r} sandbox_id={self.sandbox_id!r}>")

    @property
    def commands(self) -> Optional[CommandExecutor]:
        return self._commands

    @property
    def files(self) -> Optional[Filesystem]:
        return self._files

    @property
    def is_active(self) -> bool:
        return self._commands is not None

    def status(self) -> Tuple[str, str]:
        """("SandboxReady" | "SandboxNotReady" | "SandboxNotFound", message)."""
        try:
            return s.status_of(self._sb.refresh())
        except sbx.NotFound:
            return s.status_of(None)

    def close_connection(self) -> None:
        """Disables this handle; the sandbox keeps running (get_sandbox re-attaches)."""
        self._commands = None
        self._files = None

    def terminate(self) -> None:
        """Releases the claim (destroys the sandbox). Idempotent."""
        self.close_connection()
        if not self.claim_name:
            return
        self._client.delete_sandbox(self.claim_name, self.namespace)
        self.claim_name = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.terminate()


class SandboxClient:
    """Upstream's SandboxClient over sbx's gRPC API. A warmpool is an sbx pool of the same
    name; namespace is recorded as the claim label `k8s-agent-sandbox/namespace` (sbx
    separates tenants by token). Connection: `connection_config=
    SandboxDirectConnectionConfig(api_url="host:port")`, or the sbx.Client keywords
    (server, token, tls, ca, cert, key, server_name, timeout), or $SBX_SERVER /
    $SBX_TOKEN. Upstream's other connection configs (gateway, local tunnel, in-cluster,
    sandboxd pod tunnel) are accepted and connect as without a config: sbx-server is
    the one endpoint."""

    def __init__(self, connection_config=None, tracer_config=None, cleanup: bool = False,
                 **client_kwargs) -> None:
        self._client = sbx.Client(**s.client_args(connection_config, client_kwargs))
        self._lock = threading.Lock()
        self._active: Dict[Tuple[str, str], Sandbox] = {}
        if cleanup:
            atexit.register(self.delete_all)

    def __repr__(self) -> str:
        return f"<sbx.compat.SandboxClient {self._client.target!r} tracking {len(self._active)}>"

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.delete_all()
        finally:
            self._client.close()

    def create_sandbox(self, warmpool: Optional[str] = None, namespace: str = "default",
                       sandbox_ready_timeout: int = 180, labels: Optional[Dict[str, str]] = None,
                       *, template: Optional[str] = None,
                       shutdown_after_seconds: Optional[int] = None,
                       volume_claim_templates=None, pod_labels=None,
                       pod_annotations=None) -> Sandbox:
        """Claims a sandbox of pool `warmpool` (or `template`: a pool of that name, else
        the pool made from the template of that name with the most warm sandboxes),
        waiting up to sandbox_ready_timeout seconds (at most 1 h); shutdown_after_seconds
        becomes the claim's TTL."""
        name, by_template = s.pool_name(warmpool, template)
        s.unsupported(volume_claim_templates, pod_labels, pod_annotations)
        start = time.monotonic()
        try:
            sb = self._claim(name, namespace, sandbox_ready_timeout, labels,
                             shutdown_after_seconds)
        except sbx.SbxError as e:
            s.METRICS.created("error", time.monotonic() - start)
            raise s.create_error(e, name, by_template) from e
        s.METRICS.created("ok", time.monotonic() - start)
        handle = Sandbox(self, sb, namespace)
        with self._lock:
            self._active[(namespace, sb.claim_id)] = handle
        return handle

    def _claim(self, name: str, namespace: str, ready_timeout: float,
               labels: Optional[Dict[str, str]], ttl: Optional[int]) -> sbx.Sandbox:
        def claim(pool: str) -> sbx.Sandbox:
            return self._client.claim(pool, claim_id=s.new_claim_name(),
                                      wait=s.wait_of(ready_timeout), ttl=s.ttl_of(ttl),
                                      labels=s.claim_labels(labels, namespace))
        try:
            return claim(name)
        except sbx.SbxError as e:
            if not s.pool_not_found(e):
                raise
            try:
                pools = s.pools_of_template(self._client.pools(), name)
            except sbx.SbxError:
                raise e from None  # e.g. no admin token to list pools: the pool's error
            if not pools:
                raise
        return claim(pools[0])

    def get_sandbox(self, claim_name: str, namespace: str = "default",
                    resolve_timeout: int = 30) -> Sandbox:
        """A handle on an existing active claim (tracked, or looked up on the server)."""
        with self._lock:
            handle = self._active.get((namespace, claim_name))
        if handle is not None and handle.is_active:
            return handle
        try:
            info = self._client.get_claim(claim_name)
        except sbx.NotFound as e:
            raise ex.SandboxNotFoundError(f"sandbox claim {claim_name!r} not found") from e
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e
        s.check_namespace(info, claim_name, namespace)
        handle = Sandbox(self, sbx.Sandbox(self._client, info), namespace)
        with self._lock:
            self._active[(namespace, claim_name)] = handle
        return handle

    def list_active_sandboxes(self) -> List[Tuple[str, str]]:
        """(namespace, claim_name) of the sandboxes this client created or attached to
        and has not deleted."""
        with self._lock:
            return [k for k, h in self._active.items() if h.claim_name]

    def list_all_sandboxes(self, namespace: str = "default",
                           label_selector: Optional[str] = None) -> List[str]:
        """Names of every active claim of this tenant in `namespace`."""
        try:
            claims = self._client.list_claims(
                selector=s.namespace_selector(namespace, label_selector), states=["active"])
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e
        return [c.claim_id for c in claims]

    def delete_sandbox(self, claim_name: str, namespace: str = "default") -> None:
        """Releases the claim; a claim that is already gone is not an error."""
        with self._lock:
            handle = self._active.pop((namespace, claim_name), None)
        if handle is not None:
            handle.close_connection()
            handle.claim_name = None
        try:
            self._client.release(claim_name)
        except sbx.NotFound:
            pass
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e

    def delete_all(self) -> None:
        """Deletes every sandbox this client tracks."""
        for namespace, name in self.list_active_sandboxes():
            try:
                self.delete_sandbox(name, namespace)
            except ex.SandboxError as e:
                log.error("sbx.compat: deleting %s/%s failed: %s", namespace, name, e)

    def get_sandbox_claim_warmpool_name(self, claim_name: str, namespace: str) -> str:
        try:
            info = self._client.get_claim(claim_name)
        except sbx.NotFound as e:
            raise ex.SandboxNotFoundError(f"sandbox claim {claim_name!r} not found") from e
        s.check_namespace(info, claim_name, namespace)
        return info.pool
