#include "src/k8s/grpc_claim_mirror.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/common/hash.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/k8s/claim_objects.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {

using json_fields::Field;
using json_fields::Str;

namespace {

// The offset basis GrpcClaimName has always used: one digit short of FNV-1a's
// (14695981039346656037). SandboxClaims already in clusters are named with it, so it
// stays.
constexpr uint64_t kGrpcClaimNameOffset = 1469598103934665603ULL;

allocator::WatchRequest AllOwnersWatch(uint64_t start_revision) {
  allocator::WatchRequest request;
  request.all_owners = true;
  request.include_ended = false;
  request.start_revision = start_revision;
  return request;
}

}  // namespace

std::string GrpcClaimName(const std::string& owner, const std::string& id) {
  char hex[17];
  std::snprintf(
      hex, sizeof(hex), "%016llx",
      static_cast<unsigned long long>(Fnv1a64(absl::StrCat(owner, "/", id), kGrpcClaimNameOffset)));
  return absl::StrCat("grpc-", hex);
}

GrpcClaimMirror::GrpcClaimMirror(ClaimWriter* writer, const Informer* claims,
                                 const Informer* sandboxes, Namespaces namespaces,
                                 const Clock* clock, Enqueue enqueue)
    : writer_(writer),
      claims_(claims),
      sandboxes_(sandboxes),
      namespaces_(std::move(namespaces)),
      clock_(clock),
      enqueue_(std::move(enqueue)) {}

GrpcClaimMirror::~GrpcClaimMirror() { Stop(); }

void GrpcClaimMirror::WakeWatcher() {
  absl::MutexLock lock(&mu_);
  watch_ready_ = true;
}

absl::Status GrpcClaimMirror::Start(allocator::Allocator* allocator) {
  ASSIGN_OR_RETURN(watch_, allocator->Watch(AllOwnersWatch(0), [this] { WakeWatcher(); }));
  allocator_.store(allocator, std::memory_order_release);
  watcher_ = BackgroundThread("sbx-k8s-mirror", [this] { WatchLoop(); });
  return absl::OkStatus();
}

void GrpcClaimMirror::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  WakeWatcher();
  if (watcher_.joinable()) watcher_.join();
  if (watch_ != nullptr) watch_->Cancel();
}

void GrpcClaimMirror::WatchLoop() {
  allocator::Allocator* allocator = allocator_.load(std::memory_order_acquire);
  std::vector<allocator::ClaimEventPtr> events;
  uint64_t last = 0;
  while (!stopping_.load(std::memory_order_acquire)) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&watch_ready_), absl::Seconds(1));
      watch_ready_ = false;
    }
    events.clear();
    absl::Status s = watch_->Poll(&events, 4096);
    for (const allocator::ClaimEventPtr& e : events) {
      last = std::max(last, e->revision);
      const store::ClaimRecord& c = e->claim;
      if (IsKubeClaimOwner(c.owner)) continue;  // kubectl claims have their objects
      absl::StatusOr<store::TemplateRecord> t = allocator->GetTemplate(c.pool);
      if (!t.ok() || t->runtime != "kubernetes") continue;
      const std::string ns = namespaces_.Split(c.pool).ns;
      if (namespaces_.Serves(ns)) enqueue_(ns, c.owner, c.id);
    }
    if (s.ok() || stopping_.load(std::memory_order_acquire)) continue;
    // Too slow (ABORTED) or the history is gone: resume, or start over from the state.
    auto ready = [this] { WakeWatcher(); };
    absl::StatusOr<std::unique_ptr<allocator::ClaimWatch>> again =
        allocator->Watch(AllOwnersWatch(last), ready);
    if (!again.ok()) again = allocator->Watch(AllOwnersWatch(0), ready);
    if (again.ok()) {
      watch_ = *std::move(again);
    } else {
      spdlog::warn("gRPC claim mirror: allocator watch failed: {}", again.status().ToString());
      absl::SleepFor(absl::Seconds(1));
    }
  }
}

absl::Status GrpcClaimMirror::Reconcile(const std::string& ns, const std::string& owner,
                                        const std::string& id) {
  allocator::Allocator* allocator = allocator_.load(std::memory_order_acquire);
  const std::string name = GrpcClaimName(owner, id);
  absl::StatusOr<store::ClaimRecord> c = allocator->GetClaim(owner, id);
  if (!c.ok() || c->state != store::ClaimState::kActive) {
    ObjectPtr shown = claims_->Get(ns, name);
    if (shown == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(const types::SandboxClaim typed, types::DecodeSandboxClaim(*shown));
    return writer_->DeleteClaim(typed, "Background");
  }
  const NamespacedName pool = namespaces_.Split(c->pool);
  const NamespacedName sandbox_name = namespaces_.Split(c->sandbox_id);
  // Work from a SandboxClaim of another namespace that carries this claim's annotations
  // (anyone may write them): not the claim's mirror, nothing to do for it.
  if (pool.ns != ns) return absl::OkStatus();
  if (sandbox_name.ns != ns) {
    return absl::InternalError(absl::StrCat("gRPC claim \"", owner, "/", id, "\" of pool \"",
                                            c->pool, "\" and sandbox \"", c->sandbox_id,
                                            "\" is not of namespace \"", ns, "\""));
  }
  ASSIGN_OR_RETURN(const types::SandboxClaim claim, ShownClaim(*c, name, pool, sandbox_name.name));
  // The object names the sandbox the allocator chose; it never changes.
  const std::string& recorded = claim.metadata.Annotation(kSandboxNameAnnotation);
  if (recorded != sandbox_name.name) {
    return absl::InternalError(absl::StrCat("SandboxClaim \"", ns, "/", name, "\" names sandbox \"",
                                            recorded, "\", the allocator \"", c->sandbox_id,
                                            "\": not rebinding"));
  }
  RETURN_IF_ERROR(writer_->Bind(claim, sandbox_name.name, "warm"));
  ObjectPtr sandbox = sandboxes_->Get(ns, sandbox_name.name);
  return writer_->WriteStatus(claim, GrpcClaimStatus(sandbox_name.name, sandbox.get(),
                                                     writer_->LastStatus(claim), clock_->Now()));
}

absl::StatusOr<types::SandboxClaim> GrpcClaimMirror::ShownClaim(const store::ClaimRecord& c,
                                                                const std::string& name,
                                                                const NamespacedName& pool,
                                                                const std::string& sandbox) {
  if (ObjectPtr cached = claims_->Get(pool.ns, name)) return types::DecodeSandboxClaim(*cached);
  return writer_->CreateClaim(GrpcSandboxClaim(c, name, pool, sandbox));
}

}  // namespace sbx::k8s
