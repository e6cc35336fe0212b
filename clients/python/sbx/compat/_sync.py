"""sbx.compat.SandboxClient and its Sandbox handle (blocking)."""

from __future__ import annotations

import atexit
import logging
import threading
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
        try:
            r = self._sandbox._sb.exec(["/bin/sh", "-c", command], timeout=timeout)
        except sbx.SbxError as e:
            raise s.request_error(e) from e
        return s.execution_result(r, timeout)


class Filesystem:
    """sandbox.files: the sandbox's workspace (paths are relative to it)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._files = sandbox._sb.files

    def _do(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except sbx.SbxError as e:
            raise s.request_error(e) from e

    def write(self, path: str, content, timeout: int = 60) -> None:
        """Writes bytes or str (UTF-8) to a file, creating missing directories."""
        self._do(self._files.write, path, content)

    def read(self, path: str, timeout: int = 60) -> bytes:
        return self._do(self._files.read, path)

    def list(self, path: str, timeout: int = 60) -> List[FileEntry]:
        """Entries of a directory ("." or "" is the workspace)."""
        return s.file_entries(self._do(self._files.list, "" if path in (".", "./") else path))

    def exists(self, path: str, timeout: int = 60) -> bool:
        return self._do(self._files.exists, path)

    def delete(self, path: str, recursive: bool = False, timeout: int = 60) -> None:
        """Removes a file or directory (sbx has no delete call: `rm` runs in the sandbox)."""
        self._do(self._files.remove, path, recursive=recursive)


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
    (server, token, tls, ca, cert, key, server_name), or $SBX_SERVER / $SBX_TOKEN."""

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

    def create_sandbox(self, warmpool: str, namespace: str = "default",
                       sandbox_ready_timeout: int = 180, labels: Optional[Dict[str, str]] = None,
                       *, shutdown_after_seconds: Optional[int] = None,
                       volume_claim_templates=None, pod_labels=None,
                       pod_annotations=None) -> Sandbox:
        """Claims a sandbox of pool `warmpool`, waiting up to sandbox_ready_timeout
        seconds (at most 1 h); shutdown_after_seconds becomes the claim's TTL."""
        s.unsupported(volume_claim_templates, pod_labels, pod_annotations)
        try:
            sb = self._client.claim(warmpool, claim_id=s.new_claim_name(),
                                    wait=s.wait_of(sandbox_ready_timeout),
                                    ttl=s.ttl_of(shutdown_after_seconds),
                                    labels=s.claim_labels(labels, namespace))
        except sbx.SbxError as e:
            raise s.create_error(e, warmpool) from e
        handle = Sandbox(self, sb, namespace)
        with self._lock:
            self._active[(namespace, sb.claim_id)] = handle
        return handle

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
