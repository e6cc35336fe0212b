#include "src/cmd/wiring.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "sbx/v1/admin.pb.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/server/convert.h"

namespace sbx::cmd {
namespace {

runtime::LocalSpec FromApi(const sbx::v1::LocalSpec& api) {
  runtime::LocalSpec spec;
  spec.image = api.image();
  for (const auto& [k, v] : api.env()) spec.env[k] = v;
  for (const auto& m : api.mounts()) spec.mounts.push_back({m.source(), m.target(), m.read_only()});
  spec.network = api.network();
  spec.memory_limit_bytes = api.memory_limit_bytes();
  spec.pids_limit = api.pids_limit();
  spec.workspace_size_bytes = api.workspace_size_bytes();
  spec.layer_size_bytes = api.layer_size_bytes();
  spec.snapshot = api.snapshot();
  return spec;
}

class LocalSpecTranslator final : public runtime::Runtime {
 public:
  explicit LocalSpecTranslator(runtime::Runtime* local) : local_(local) {}

  void Create(runtime::CreateRequest request, runtime::CreateCallback done) override {
    sbx::v1::LocalSpec api;
    if (!request.template_spec.empty() && !api.ParseFromString(request.template_spec)) {
      return std::move(done)(absl::InvalidArgumentError(
          absl::StrCat("template \"", request.template_name, "\": its local spec does not parse")));
    }
    request.template_spec = runtime::EncodeLocalSpec(FromApi(api));
    local_->Create(std::move(request), std::move(done));
  }

  void Delete(std::string id, runtime::DeleteCallback done) override {
    local_->Delete(std::move(id), std::move(done));
  }
  void Suspend(std::string id, runtime::DoneCallback done) override {
    local_->Suspend(std::move(id), std::move(done));
  }
  void Resume(std::string id, runtime::ResumeCallback done) override {
    local_->Resume(std::move(id), std::move(done));
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override { return local_->List(); }
  void Snapshot(std::string sandbox_id, std::string snapshot_id, runtime::SnapshotCharge charge,
                runtime::SnapshotCallback done) override {
    local_->Snapshot(std::move(sandbox_id), std::move(snapshot_id), std::move(charge),
                     std::move(done));
  }
  absl::Status DeleteSnapshot(const std::string& snapshot_id) override {
    return local_->DeleteSnapshot(snapshot_id);
  }
  absl::StatusOr<std::vector<std::string>> ListSnapshots() override {
    return local_->ListSnapshots();
  }
  void Reset(std::string sandbox_id, std::string snapshot_id, std::string image_digest,
             runtime::DoneCallback done) override {
    local_->Reset(std::move(sandbox_id), std::move(snapshot_id), std::move(image_digest),
                  std::move(done));
  }

 private:
  runtime::Runtime* const local_;
};

}  // namespace

std::unique_ptr<runtime::Runtime> NewLocalSpecTranslator(runtime::Runtime* local) {
  return std::make_unique<LocalSpecTranslator>(local);
}

server::TemplateCheck NewTemplateCheck(const runtime::BubblewrapRuntime* local, bool has_cluster) {
  return [local, has_cluster](const sbx::v1::Template& t) -> absl::Status {
    const std::string where = absl::StrCat("template \"", t.name(), "\": ");
    if (t.runtime() == "kubernetes") {
      RETURN_IF_ERROR(
          CheckPodTemplateShape(where + "kubernetes.pod_template", t.kubernetes().pod_template()));
      if (!has_cluster) {
        return absl::FailedPreconditionError(absl::StrCat(
            where,
            "runtime \"kubernetes\" needs a Kubernetes cluster, and this server has none (start "
            "it in a cluster or with --kubeconfig)"));
      }
    } else if (t.runtime() == "local" && local != nullptr) {
      if (absl::Status s = local->CheckSpec(FromApi(t.local())); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(where, s.message()));
      }
    }
    return absl::OkStatus();
  };
}

server::TemplateImages NewKubernetesTemplateImages(const k8s::KubeRuntime* kube) {
  return [kube](const store::TemplateRecord& t) -> std::vector<std::string> {
    sbx::v1::KubernetesSpec spec;
    if (spec.ParseFromString(t.spec) && !spec.pod_template().empty()) {
      return PodTemplateImages(spec.pod_template());
    }
    // The warm-pool controller's template: its spec is the SandboxTemplate's name.
    if (kube == nullptr) return {};
    return kube->SandboxTemplateImages(t.name, t.spec);
  };
}

absl::StatusOr<std::string> CheckImageClaimTemplate(const allocator::Allocator& allocator,
                                                    const std::string& name) {
  ASSIGN_OR_RETURN(std::string canonical, CanonicalQualifiedName("--image_claim_template", name,
                                                                 allocator.default_namespace()));
  absl::StatusOr<store::TemplateRecord> t = allocator.GetTemplate(canonical);
  if (!t.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--image_claim_template \"", name,
        "\": no such template (declare it in --config, or through AdminService.PutTemplate "
        "before a start with the flag)"));
  }
  if (t->runtime != "local") {
    return absl::FailedPreconditionError(
        absl::StrCat("--image_claim_template \"", name, "\": its runtime is \"", t->runtime,
                     "\"; the base of on-demand image pools is a local template"));
  }
  return canonical;
}

absl::Status ApplyConfig(const ServerConfig& config, allocator::Allocator& allocator) {
  for (const sbx::v1::Template& t : config.templates) {
    absl::StatusOr<store::TemplateRecord> record =
        server::TemplateFromProto(t, allocator.default_namespace());
    if (!record.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: template \"", t.name(), "\": ", record.status().message()));
    }
    absl::Status s = allocator::Wait(
        [&](allocator::StatusCallback cb) { allocator.PutTemplate(*record, std::move(cb)); });
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("config: ", s.message()));
  }
  for (const sbx::v1::Pool& p : config.pools) {
    absl::StatusOr<store::PoolRecord> record =
        server::PoolFromProto(p, allocator.default_namespace());
    if (!record.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: pool \"", p.name(), "\": ", record.status().message()));
    }
    absl::Status s = allocator::Wait(
        [&](allocator::StatusCallback cb) { allocator.PutPool(*record, std::move(cb)); });
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("config: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace sbx::cmd
