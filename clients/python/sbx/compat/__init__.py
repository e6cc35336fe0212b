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

Mapping (docs/sdk-python.md): a warmpool (or template) is the sbx pool of that name, else
the pool made from the template of that name; namespace is a claim label
(`k8s-agent-sandbox/namespace`), since sbx separates tenants by token;
sandbox_ready_timeout is the claim's wait (at most 1 h); shutdown_after_seconds its TTL;
/home/user is the sandbox's workspace; files.delete runs `rm` in the sandbox (sbx has no
delete call); volume_claim_templates, pod_labels and pod_annotations raise
NotImplementedError. Every connection config of upstream is accepted: the direct one's
api_url is sbx-server's address, the others (gateway, local tunnel, in-cluster, sandboxd
pod tunnel) find upstream's router or pods, which sbx does not need, and connect where a
client without a config does. Anything else as connection_config is a TypeError.
"""

from sbx.compat._async import (AsyncCommandExecutor, AsyncFilesystem, AsyncK8sHelper,
                               AsyncSandbox, AsyncSandboxClient)
from sbx.compat._shared import get_metrics, print_metrics
from sbx.compat._sync import (CommandExecutor, Filesystem, K8sHelper, Sandbox,
                              SandboxClient)
from sbx.compat.exceptions import (SandboxClaimFailedError, SandboxError,
                                   SandboxMetadataError, SandboxNoServiceError,
                                   SandboxNotFoundError, SandboxNotReadyError,
                                   SandboxPortForwardError, SandboxRequestError,
                                   SandboxServiceUnavailableError,
                                   SandboxTemplateNotFoundError,
                                   SandboxWarmPoolMismatchError,
                                   SandboxWarmPoolNotFoundError, SnapshotNotFoundError)
from sbx.compat.models import (ExecutionResult, FileEntry, SandboxConnectionConfig,
                               SandboxDirectConnectionConfig, SandboxGatewayConnectionConfig,
                               SandboxInClusterConnectionConfig,
                               SandboxLocalTunnelConnectionConfig,
                               SandboxdPodTunnelConnectionConfig, SandboxTracerConfig)

__all__ = [
    "SandboxClient", "AsyncSandboxClient", "Sandbox", "AsyncSandbox", "CommandExecutor",
    "AsyncCommandExecutor", "Filesystem", "AsyncFilesystem", "K8sHelper", "AsyncK8sHelper",
    "ExecutionResult", "FileEntry", "SandboxConnectionConfig",
    "SandboxDirectConnectionConfig", "SandboxGatewayConnectionConfig",
    "SandboxLocalTunnelConnectionConfig", "SandboxInClusterConnectionConfig",
    "SandboxdPodTunnelConnectionConfig", "SandboxTracerConfig",
    "get_metrics", "print_metrics",
    "SandboxError", "SandboxNotReadyError", "SandboxNotFoundError",
    "SandboxTemplateNotFoundError", "SandboxWarmPoolNotFoundError",
    "SandboxWarmPoolMismatchError", "SandboxNoServiceError",
    "SandboxServiceUnavailableError", "SandboxPortForwardError", "SandboxMetadataError",
    "SandboxClaimFailedError", "SandboxRequestError", "SnapshotNotFoundError",
]
