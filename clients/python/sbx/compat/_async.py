"""sbx.compat.AsyncSandboxClient and its AsyncSandbox handle (asyncio)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Dict, List, Optional, Tuple

import sbx
from sbx.compat import _shared as s
from sbx.compat import exceptions as ex
from sbx.compat.models import ExecutionResult, FileEntry

log = logging.getLogger("sbx.compat")


class AsyncCommandExecutor:
    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def run(self, command: str, timeout: int = 60) -> ExecutionResult:
        s.METRICS.ran()
        try:
            r = await self._sandbox._sb.exec(["/bin/sh", "-c", command], timeout=timeout)
        except sbx.SbxError as e:
            raise s.request_error(e) from e
        return s.execution_result(r, timeout)


class AsyncFilesystem:
    """As sbx.compat.Filesystem (upstream's /home/user is the workspace), awaited."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._files = sandbox._sb.files

    async def _do(self, coro):
        try:
            return await coro
        except sbx.SbxError as e:
            raise s.request_error(e) from e

    async def write(self, path: str, content, timeout: int = 60) -> None:
        await self._do(self._files.write(s.workspace_path(path), content))

    async def read(self, path: str, timeout: int = 60) -> bytes:
        return await self._do(self._files.read(s.workspace_path(path)))

    async def list(self, path: str, timeout: int = 60) -> List[FileEntry]:
        return s.file_entries(await self._do(self._files.list(s.workspace_path(path))))

    async def exists(self, path: str, timeout: int = 60) -> bool:
        return await self._do(self._files.exists(s.workspace_path(path)))

    async def delete(self, path: str, recursive: bool = False, timeout: int = 60) -> None:
        await self._do(self._files.remove(s.workspace_path(path), recursive=recursive))


class AsyncK8sHelper:
    """As sbx.compat.K8sHelper; get_sandbox is awaited."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def get_sandbox(self, name: str, namespace: str = "default") -> Optional[dict]:
        if name != self._sandbox.sandbox_id:
            return None
        try:
            info = await self._sandbox._sb.refresh()
        except sbx.NotFound:
            return None
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e
        return s.sandbox_object(info, namespace)


class AsyncSandbox:
    """As sbx.compat.Sandbox, with awaited methods."""

    def __init__(self, client: "AsyncSandboxClient", sb: sbx.AsyncSandbox,
                 namespace: str) -> None:
        self._client = client
        self._sb = sb
        self.claim_name: Optional[str] = sb.claim_id
        self.sandbox_id = sb.sandbox_id
        self.namespace = namespace
        self._commands: Optional[AsyncCommandExecutor] = AsyncCommandExecutor(self)
        self._files: Optional[AsyncFilesystem] = AsyncFilesystem(self)
        self.k8s_helper = AsyncK8sHelper(self)

    async def get_pod_name(self) -> str:
        return self.sandbox_id

    async def get_pod_ip(self) -> Optional[str]:
        try:
            return s.pod_ip(await self._sb.refresh())
        except sbx.SbxError as e:
            raise s.request_error(e) from e

    async def get_sandbox_name_hash(self) -> Optional[str]:
        return None

    def __repr__(self) -> str:
        return (f"<sbx.compat.AsyncSandbox claim_name={self.claim_name!r} "
                f"namespace={self.namespace!r} sandbox_id={self.sandbox_id!r}>")

    @property
    def commands(self) -> Optional[AsyncCommandExecutor]:
        return self._commands

    @property
    def files(self) -> Optional[AsyncFilesystem]:
        return self._files

    @property
    def is_active(self) -> bool:
        return self._commands is not None

    async def status(self) -> Tuple[str, str]:
        try:
            return s.status_of(await self._sb.refresh())
        except sbx.NotFound:
            return s.status_of(None)

    async def close_connection(self) -> None:
        self._commands = None
        self._files = None

    async def terminate(self) -> None:
        await self.close_connection()
        if not self.claim_name:
            return
        await self._client.delete_sandbox(self.claim_name, self.namespace)
        self.claim_name = None


class AsyncSandboxClient:
    """As sbx.compat.SandboxClient, with awaited methods; `async with` deletes the
    tracked sandboxes and closes the connection at the end. Create it inside a running
    event loop."""

    def __init__(self, connection_config=None, tracer_config=None, cleanup: bool = False,
                 **client_kwargs) -> None:
        self._client = sbx.AsyncClient(**s.client_args(connection_config, client_kwargs))
        self._lock = asyncio.Lock()
        self._active: Dict[Tuple[str, str], AsyncSandbox] = {}

    def __repr__(self) -> str:
        return (f"<sbx.compat.AsyncSandboxClient {self._client.target!r} "
                f"tracking {len(self._active)}>")

    async def __aenter__(self) -> "AsyncSandboxClient":
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.delete_all()
        finally:
            await self.close()

    async def close(self) -> None:
        async with self._lock:
            for h in self._active.values():
                await h.close_connection()
            self._active.clear()
        await self._client.close()

    async def create_sandbox(self, warmpool: Optional[str] = None, namespace: str = "default",
                             sandbox_ready_timeout: int = 180,
                             labels: Optional[Dict[str, str]] = None, *,
                             template: Optional[str] = None,
                             shutdown_after_seconds: Optional[int] = None,
                             volume_claim_templates=None, pod_labels=None,
                             pod_annotations=None) -> AsyncSandbox:
        name, by_template = s.pool_name(warmpool, template)
        s.unsupported(volume_claim_templates, pod_labels, pod_annotations)
        start = time.monotonic()
        try:
            sb = await self._claim(name, namespace, sandbox_ready_timeout, labels,
                                   shutdown_after_seconds)
        except sbx.SbxError as e:
            s.METRICS.created("error", time.monotonic() - start)
            raise s.create_error(e, name, by_template) from e
        s.METRICS.created("ok", time.monotonic() - start)
        handle = AsyncSandbox(self, sb, namespace)
        async with self._lock:
            self._active[(namespace, sb.claim_id)] = handle
        return handle

    async def _claim(self, name: str, namespace: str, ready_timeout: float,
                     labels: Optional[Dict[str, str]], ttl: Optional[int]) -> sbx.AsyncSandbox:
        async def claim(pool: str) -> sbx.AsyncSandbox:
            return await self._client.claim(pool, claim_id=s.new_claim_name(),
                                            wait=s.wait_of(ready_timeout), ttl=s.ttl_of(ttl),
                                            labels=s.claim_labels(labels, namespace))
        try:
            return await claim(name)
        except sbx.SbxError as e:
            if not s.pool_not_found(e):
                raise
            try:
                pools = s.pools_of_template(await self._client.pools(), name)
            except sbx.SbxError:
                raise e from None
            if not pools:
                raise
        return await claim(pools[0])

    async def get_sandbox(self, claim_name: str, namespace: str = "default",
                          resolve_timeout: int = 30) -> AsyncSandbox:
        async with self._lock:
            handle = self._active.get((namespace, claim_name))
        if handle is not None and handle.is_active:
            return handle
        try:
            info = await self._client.get_claim(claim_name)
        except sbx.NotFound as e:
            raise ex.SandboxNotFoundError(f"sandbox claim {claim_name!r} not found") from e
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e
        s.check_namespace(info, claim_name, namespace)
        handle = AsyncSandbox(self, sbx.AsyncSandbox(self._client, info), namespace)
        async with self._lock:
            self._active[(namespace, claim_name)] = handle
        return handle

    async def list_active_sandboxes(self) -> List[Tuple[str, str]]:
        async with self._lock:
            return [k for k, h in self._active.items() if h.claim_name]

    async def list_all_sandboxes(self, namespace: str = "default",
                                 label_selector: Optional[str] = None) -> List[str]:
        try:
            claims = await self._client.list_claims(
                selector=s.namespace_selector(namespace, label_selector), states=["active"])
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e
        return [c.claim_id for c in claims]

    async def delete_sandbox(self, claim_name: str, namespace: str = "default") -> None:
        async with self._lock:
            handle = self._active.pop((namespace, claim_name), None)
        if handle is not None:
            await handle.close_connection()
            handle.claim_name = None
        try:
            await self._client.release(claim_name)
        except sbx.NotFound:
            pass
        except sbx.SbxError as e:
            raise ex.SandboxError(str(e)) from e

    async def delete_all(self) -> None:
        for namespace, name in await self.list_active_sandboxes():
            try:
                await self.delete_sandbox(name, namespace)
            except ex.SandboxError as e:
                log.error("sbx.compat: deleting %s/%s failed: %s", namespace, name, e)
