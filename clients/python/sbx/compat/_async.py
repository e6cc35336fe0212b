"""sbx.compat.AsyncSandboxClient and its AsyncSandbox handle (asyncio)."""

from __future__ import annotations

import asyncio
import logging
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
        try:
            r = await self._sandbox._sb.exec(["/bin/sh", "-c", command], timeout=timeout)
        except sbx.SbxError as e:
            raise s.request_error(e) from e
        return s.execution_result(r, timeout)


class AsyncFilesystem:
    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._files = sandbox._sb.files

    async def _do(self, coro):
        try:
            return await coro
        except sbx.SbxError as e:
            raise s.request_error(e) from e

    async def write(self, path: str, content, timeout: int = 60) -> None:
        await self._do(self._files.write(path, content))

    async def read(self, path: str, timeout: int = 60) -> bytes:
        return await self._do(self._files.read(path))

    async def list(self, path: str, timeout: int = 60) -> List[FileEntry]:
        return s.file_entries(await self._do(
            self._files.list("" if path in (".", "./") else path)))

    async def exists(self, path: str, timeout: int = 60) -> bool:
        return await self._do(self._files.exists(path))

    async def delete(self, path: str, recursive: bool = False, timeout: int = 60) -> None:
        await self._do(self._files.remove(path, recursive=recursive))


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

    async def create_sandbox(self, warmpool: str, namespace: str = "default",
                             sandbox_ready_timeout: int = 180,
                             labels: Optional[Dict[str, str]] = None, *,
                             shutdown_after_seconds: Optional[int] = None,
                             volume_claim_templates=None, pod_labels=None,
                             pod_annotations=None) -> AsyncSandbox:
        s.unsupported(volume_claim_templates, pod_labels, pod_annotations)
        try:
            sb = await self._client.claim(warmpool, claim_id=s.new_claim_name(),
                                          wait=s.wait_of(sandbox_ready_timeout),
                                          ttl=s.ttl_of(shutdown_after_seconds),
                                          labels=s.claim_labels(labels, namespace))
        except sbx.SbxError as e:
            raise s.create_error(e, warmpool) from e
        handle = AsyncSandbox(self, sb, namespace)
        async with self._lock:
            self._active[(namespace, sb.claim_id)] = handle
        return handle

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
