"""The surface of upstream agent-sandbox's Python SDK (`k8s-agent-sandbox`), backed by
sbx's gRPC API, so that code written for it runs against sbx-server by changing its
import:

    from sbx.compat import SandboxClient      # was: from k8s_agent_sandbox import ...

    client = SandboxClient()                  # $SBX_SERVER, $SBX_TOKEN, or server=...
    sandbox = client.create_sandbox(warmpool="default", namespace="default")
    try:
        print(sandbox.commands.run("echo 'Hello'").stdout)
    finally:
        sandbox.terminate()

Mapping (docs/sdk-python.md): a warmpool is the sbx pool of that name; namespace is a
claim label (`k8s-agent-sandbox/namespace`), since sbx separates tenants by token;
sandbox_ready_timeout is the claim's wait (at most 1 h); shutdown_after_seconds its TTL;
files.delete runs `rm` in the sandbox (sbx has no delete call); volume_claim_templates,
pod_labels and pod_annotations raise NotImplementedError; connection configs other than
SandboxDirectConnectionConfig raise TypeError.
"""

from sbx.compat._async import (AsyncCommandExecutor, AsyncFilesystem, AsyncSandbox,
                               AsyncSandboxClient)
from sbx.compat._sync import CommandExecutor, Filesystem, Sandbox, SandboxClient
from sbx.compat.exceptions import (SandboxClaimFailedError, SandboxError,
                                   SandboxMetadataError, SandboxNotFoundError,
                                   SandboxNotReadyError, SandboxPortForwardError,
                                   SandboxRequestError, SandboxTemplateNotFoundError,
                                   SandboxWarmPoolNotFoundError)
from sbx.compat.models import (ExecutionResult, FileEntry, SandboxDirectConnectionConfig,
                               SandboxTracerConfig)

__all__ = [
    "SandboxClient", "AsyncSandboxClient", "Sandbox", "AsyncSandbox", "CommandExecutor",
    "AsyncCommandExecutor", "Filesystem", "AsyncFilesystem", "ExecutionResult", "FileEntry",
    "SandboxDirectConnectionConfig", "SandboxTracerConfig", "SandboxError",
    "SandboxNotReadyError", "SandboxNotFoundError", "SandboxTemplateNotFoundError",
    "SandboxWarmPoolNotFoundError", "SandboxPortForwardError", "SandboxMetadataError",
    "SandboxClaimFailedError", "SandboxRequestError",
]
