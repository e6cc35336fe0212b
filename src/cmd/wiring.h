#pragma once
// Glue that only src/cmd may hold, because it joins components that do not know each
// other: the API's template specs and the local runtime, the config file and the
// allocator.

#include <memory>

#include "absl/status/status.h"
#include "src/allocator/allocator.h"
#include "src/cmd/config.h"
#include "src/k8s/kube_runtime.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/runtime/runtime.h"
#include "src/server/admin_service.h"
#include "src/server/image_pools.h"

namespace sbx::cmd {

// Wraps the local runtime: the server stores a local template's spec as serialized
// sbx.v1.LocalSpec; the local runtime reads its own JSON (runtime::EncodeLocalSpec).
// Creates with a spec that does not parse fail with INVALID_ARGUMENT naming the template.
std::unique_ptr<runtime::Runtime> NewLocalSpecTranslator(runtime::Runtime* local);

// The checks of PutTemplate that need this server's runtimes (ServerOptions::
// check_template): a Kubernetes template's pod template must have a pod template's shape
// (INVALID_ARGUMENT naming kubernetes.pod_template) and the server a cluster
// (FAILED_PRECONDITION, `has_cluster`); a local template's mounts must not show the
// server's own files (INVALID_ARGUMENT naming the file; `local` may be null when the
// local runtime does not run here). `local` must outlive the check.
server::TemplateCheck NewTemplateCheck(const runtime::BubblewrapRuntime* local, bool has_cluster);

// The images a kubernetes template runs, for claims by image (server::ImageClaimOptions::
// kubernetes_images): a template stored through the API has them in its KubernetesSpec's
// pod_template (JSON or YAML, PodTemplateImages); one a SandboxWarmPool made names its
// SandboxTemplate, whose pod template `kube` has in its cache (none when `kube` is null:
// pools are not served here). `kube` must outlive the function.
server::TemplateImages NewKubernetesTemplateImages(const k8s::KubeRuntime* kube);

// The canonical name of --image_claim_template `name` if it names a local template of
// `allocator` (the base of on-demand image pools): INVALID_ARGUMENT for a bad name,
// FAILED_PRECONDITION when it does not exist or is not local, naming the flag.
[[nodiscard]] absl::StatusOr<std::string> CheckImageClaimTemplate(
    const allocator::Allocator& allocator, const std::string& name);

// Declares the config file's templates and pools through the allocator (creating or
// replacing them), waiting for each to be durable. Errors name the entry.
[[nodiscard]] absl::Status ApplyConfig(const ServerConfig& config, allocator::Allocator& allocator);

}  // namespace sbx::cmd
