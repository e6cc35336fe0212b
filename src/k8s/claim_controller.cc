#include "src/k8s/claim_controller.h"
#include "src/common/dropped.h"

#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/k8s/controller_metrics.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {

using json_fields::Field;
using json_fields::Str;

class ClaimControllerMetrics {
 public:
  explicit ClaimControllerMetrics(std::shared_ptr<prometheus::Registry> registry)
      : registry_(registry ? std::move(registry) : std::make_shared<prometheus::Registry>()),
        startup_(prometheus::BuildHistogram()
                     .Name("agent_sandbox_claim_startup_latency_ms")
                     .Help("SandboxClaim creation to Ready, ms")
                     .Register(*registry_)),
        controller_startup_(prometheus::BuildHistogram()
                                .Name("agent_sandbox_claim_controller_startup_latency_ms")
                                .Help("Controller first seeing a SandboxClaim to Ready, ms")
                                .Register(*registry_)),
        client_startup_(prometheus::BuildHistogram()
                            .Name("agent_sandbox_client_claim_startup_latency_ms")
                            .Help("The client's first request (its client-first-requested-at "
                                  "annotation) to the SandboxClaim's Ready, ms")
                            .Register(*registry_)),
        created_(prometheus::BuildCounter()
                     .Name("agent_sandbox_claim_creation_total")
                     .Help("SandboxClaims given a Sandbox (a warm member adopted, or a cold "
                           "one made), by namespace, template, launch type, warm pool, the "
                           "Sandbox's readiness then and the claim's created-by label")
                     .Register(*registry_)),
        reconciles_(prometheus::BuildCounter()
                        .Name("sbx_k8s_claim_reconciles_total")
                        .Help("Reconciles of one claim done, failed ones included, by kind: "
                              "kubectl (SandboxClaims made by users) or grpc (gRPC claims "
                              "shown as SandboxClaims)")
                        .Register(*registry_)),
        kubectl_reconciles_(&reconciles_.Add({{"kind", "kubectl"}})),
        grpc_reconciles_(&reconciles_.Add({{"kind", "grpc"}})),
        runtime_(*registry_, kClaimControllerName) {}

  // controller-runtime's names (upstream's dashboards read them).
  ReconcileMetrics& runtime() { return runtime_; }

  void KubectlReconciled() { kubectl_reconciles_->Increment(); }
  void GrpcReconciled() { grpc_reconciles_->Increment(); }

  // A claim became Ready: `startup_ms` after it was made, `controller_ms` after this
  // controller first saw it and, when its client said when it asked, `client_ms` after.
  void Ready(const std::string& launch_type, const std::string& sandbox_template, double startup_ms,
             double controller_ms, std::optional<double> client_ms) {
    Latencies& series = LatenciesOf(launch_type, sandbox_template);
    if (startup_ms >= 0) series.startup->Observe(startup_ms);
    if (controller_ms >= 0) series.controller_startup->Observe(controller_ms);
    if (client_ms && *client_ms >= 0) series.client_startup->Observe(*client_ms);
  }
  // A claim was given a Sandbox (upstream counts it then, not at Ready).
  void Created(const std::string& ns, const std::string& sandbox_template,
               const std::string& launch_type, const std::string& pool, bool sandbox_ready,
               const std::string& created_by) ABSL_LOCKS_EXCLUDED(mu_) {
    const std::string condition = sandbox_ready ? "ready" : "not_ready";
    const std::string key = absl::StrCat(ns, "/", sandbox_template, "/", launch_type, "/", pool,
                                         "/", condition, "/", created_by);
    prometheus::Counter* counter;
    {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = created_series_.try_emplace(key, nullptr);
      if (inserted) {
        it->second = &created_.Add({{"namespace", ns},
                                    {"sandbox_template", sandbox_template},
                                    {"launch_type", launch_type},
                                    {"warmpool_name", pool},
                                    {"pod_condition", condition},
                                    {"created_by", created_by}});
      }
      counter = it->second;
    }
    counter->Increment();
  }

 private:
  // The series of one launch type and template, made on first use (Family::Add builds
  // label maps and bucket vectors and locks the family: not once per claim).
  struct Latencies {
    prometheus::Histogram* startup;
    prometheus::Histogram* controller_startup;
    prometheus::Histogram* client_startup;
  };

  Latencies& LatenciesOf(const std::string& launch_type, const std::string& sandbox_template)
      ABSL_LOCKS_EXCLUDED(mu_) {
    const std::string key = absl::StrCat(launch_type, "/", sandbox_template);
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = latencies_.try_emplace(key);
    if (inserted) {
      static const prometheus::Histogram::BucketBoundaries kBuckets{
          10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000};
      const prometheus::Labels labels{{"launch_type", launch_type},
                                      {"sandbox_template", sandbox_template}};
      it->second =
          Latencies{&startup_.Add(labels, kBuckets), &controller_startup_.Add(labels, kBuckets),
                    &client_startup_.Add(labels, kBuckets)};
    }
    return it->second;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& startup_;
  prometheus::Family<prometheus::Histogram>& controller_startup_;
  prometheus::Family<prometheus::Histogram>& client_startup_;
  prometheus::Family<prometheus::Counter>& created_;
  prometheus::Family<prometheus::Counter>& reconciles_;
  // Resolved once: every reconcile counts, and Family::Add locks the family.
  prometheus::Counter* const kubectl_reconciles_;
  prometheus::Counter* const grpc_reconciles_;
  ReconcileMetrics runtime_;
  absl::Mutex mu_;
  // Node map: a series stays where it is while others are added.
  absl::node_hash_map<std::string, Latencies> latencies_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> created_series_ ABSL_GUARDED_BY(mu_);
};

namespace {

// Blocks until the allocator's callback runs (workers may wait; no claim RPC waits here).
absl::StatusOr<allocator::ClaimResult> WaitClaim(
    const std::function<void(allocator::ClaimCallback)>& call) {
  absl::Notification done;
  absl::StatusOr<allocator::ClaimResult> result;
  call([&](absl::StatusOr<allocator::ClaimResult> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

// Whether an update left the object's spec as it was (the same object, the same
// generation): true of status-only and metadata-only updates.
bool SameSpec(const Json& before, const Json& after) {
  const Json& b = Field(before, "metadata");
  const Json& a = Field(after, "metadata");
  return Field(b, "uid") == Field(a, "uid") && Field(b, "generation") == Field(a, "generation");
}

std::string GrpcOwner(const Json& claim) {
  return Str(Field(Field(claim, "metadata"), "annotations"), kSbxOwnerAnnotation);
}

// Whether SandboxClaim `object`, annotated as gRPC claim (owner, id), is that claim's
// mirror: named GrpcClaimName(owner, id) in the namespace of the claim's pool.
bool IsMirrorOf(const Json& object, const std::string& owner, const std::string& id,
                const allocator::Allocator& allocator, const Namespaces& namespaces) {
  const Json& meta = Field(object, "metadata");
  if (Str(meta, "name") != GrpcClaimName(owner, id)) return false;
  absl::StatusOr<store::ClaimRecord> c = allocator.GetClaim(owner, id);
  return c.ok() && namespaces.Split(c->pool).ns == Str(meta, "namespace");
}

// The work key of kubectl claim `claim`: "c/<namespace>/<name>".
std::string KubectlKey(const Json& claim) {
  const Json& meta = Field(claim, "metadata");
  return absl::StrCat("c/", Str(meta, "namespace"), "/", Str(meta, "name"));
}

std::string PoolOf(const Json& claim) {
  return Str(Field(Field(claim, "spec"), "warmPoolRef"), "name");
}

WorkQueueOptions QueueOptions(const Clock* clock) {
  WorkQueueOptions options;
  options.clock = clock;
  return options;
}

}  // namespace

absl::Status ClaimControllerOptions::Validate() const {
  RETURN_IF_ERROR(namespaces.Validate("claim controller"));
  if (workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim controller workers ", workers, " must be at least 1"));
  }
  return absl::OkStatus();
}

ClaimController::ClaimController(Client* client, WriteScheduler* writes, Informer* sandboxes,
                                 Informer* pools, Informer* templates,
                                 ClaimControllerOptions options)
    : sandboxes_(sandboxes),
      pools_(pools),
      templates_(templates),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      metrics_(std::make_unique<ClaimControllerMetrics>(options_.registry)),
      queue_(QueueOptions(clock_)),
      claims_(client, NamespaceInformer(kSandboxClaims, options_.namespaces.watch)),
      typed_claims_(&claims_, &types::DecodeSandboxClaim),
      writer_(client, writes, sandboxes),
      mirror_(&writer_, &claims_, sandboxes, options_.namespaces, clock_,
              [this](const std::string& ns, const std::string& owner, const std::string& id) {
                Enqueue(absl::StrCat("g/", ns, "/", owner, "/", id));
              }) {
  WatchClaims();
  WatchSandboxes();
  WatchPoolsAndTemplates(pools, templates);
}

void ClaimController::WatchClaims() {
  auto on_claim = [this](const ObjectPtr& o) {
    const Json& meta = Field(*o, "metadata");
    const std::string ns = Str(meta, "namespace");
    if (const std::string owner = GrpcOwner(*o); !owner.empty()) {
      Enqueue(absl::StrCat("g/", ns, "/", owner, "/",
                           Str(Field(meta, "annotations"), kSbxClaimIdAnnotation)));
    } else {
      Enqueue(absl::StrCat("c/", ns, "/", Str(meta, "name")));
    }
  };
  InformerHandler claim_handler;
  claim_handler.on_add = [this, on_claim](const ObjectPtr& o) {
    {
      absl::MutexLock lock(&mu_);
      first_seen_.try_emplace(Str(Field(*o, "metadata"), "uid"), clock_->Now());
    }
    on_claim(o);
  };
  claim_handler.on_update = [on_claim](const ObjectPtr& old, const ObjectPtr& o) {
    if (ClaimChangeNeedsReconcile(*old, *o)) on_claim(o);
  };
  claim_handler.on_delete = [this](const ObjectPtr& o) {
    const std::string uid = Str(Field(*o, "metadata"), "uid");
    {
      absl::MutexLock lock(&mu_);
      first_seen_.erase(uid);
    }
    writer_.ForgetClaim(uid);
    allocator::Allocator* a = allocator_.load(std::memory_order_acquire);
    if (a == nullptr) return;  // Start looks for claims that went while it was away
    const Json& meta = Field(*o, "metadata");
    const std::string ns = Str(meta, "namespace");
    std::string owner = GrpcOwner(*o);
    std::string id = Str(Field(meta, "annotations"), kSbxClaimIdAnnotation);
    if (owner.empty()) {
      owner = KubeClaimOwner(ns);
      id = uid;
    } else if (!IsMirrorOf(*o, owner, id, *a, options_.namespaces)) {
      // Annotations anyone who may write SandboxClaims can copy: only the mirror's own
      // object (its name, in its pool's namespace) speaks for a gRPC claim.
      return;
    }
    // Ending an ended claim answers FAILED_PRECONDITION, which is fine: this is the
    // deletion of the claim object that the end of a gRPC claim asked for.
    a->Release(owner, id,
               DropTo{"k8s.mirror_deleted_release", absl::StatusCode::kFailedPrecondition,
                      absl::StatusCode::kNotFound});
  };
  claims_.AddHandler(std::move(claim_handler));
}

void ClaimController::WatchSandboxes() {
  // A Sandbox change concerns the claim that owns it.
  auto on_sandbox = [this](const ObjectPtr& o) {
    const Json& meta = Field(*o, "metadata");
    const std::string ns = Str(meta, "namespace");
    if (!options_.namespaces.Serves(ns)) return;
    const Json& refs = Field(meta, "ownerReferences");
    if (!refs.is_array()) return;
    for (const Json& ref : refs) {
      if (Str(ref, "kind") != "SandboxClaim") continue;
      ObjectPtr claim = claims_.Get(ns, Str(ref, "name"));
      if (claim == nullptr) continue;
      if (!GrpcOwner(*claim).empty()) continue;  // gRPC: its own status
      Enqueue(absl::StrCat("c/", ns, "/", Str(ref, "name")));
    }
  };
  InformerHandler sandbox_handler;
  sandbox_handler.on_add = on_sandbox;
  sandbox_handler.on_update = [on_sandbox](const ObjectPtr& old, const ObjectPtr& o) {
    if (SandboxChangeConcernsClaim(*old, *o)) on_sandbox(o);
  };
  sandbox_handler.on_delete = on_sandbox;
  sandboxes_->AddHandler(std::move(sandbox_handler));
}

void ClaimController::WatchPoolsAndTemplates(Informer* pools, Informer* templates) {
  // A pool or template that is added, or whose spec changes, may be what a waiting claim
  // (WarmPoolNotFound, TemplateNotFound, a template policy that refused it) needs: its
  // claims go on now, not at the next resync. As upstream does, status-only updates are
  // ignored (a pool's status changes with every member; no waiting claim reads it) and so
  // is a template's deletion. Each informer fills its cache before its handlers run, so
  // whichever of the claim and the pool a handler sees last, that one's reconcile finds
  // the other in its cache.
  InformerHandler pool_handler;
  pool_handler.on_add = [this](const ObjectPtr& o) {
    const Json& meta = Field(*o, "metadata");
    EnqueueWaitingClaims(Str(meta, "namespace"), {Str(meta, "name")});
  };
  pool_handler.on_update = [this](const ObjectPtr& old, const ObjectPtr& o) {
    if (SameSpec(*old, *o)) return;
    const Json& meta = Field(*o, "metadata");
    EnqueueWaitingClaims(Str(meta, "namespace"), {Str(meta, "name")});
  };
  pool_handler.on_delete = pool_handler.on_add;  // their status says WarmPoolNotFound
  pools->AddHandler(std::move(pool_handler));

  auto template_changed = [this](const ObjectPtr& o) {
    const std::string ns = Str(Field(*o, "metadata"), "namespace");
    const std::string name = Str(Field(*o, "metadata"), "name");
    absl::flat_hash_set<std::string> using_it;
    for (const ObjectPtr& pool : pools_->List()) {
      if (Str(Field(*pool, "metadata"), "namespace") == ns &&
          Str(Field(Field(*pool, "spec"), "sandboxTemplateRef"), "name") == name) {
        using_it.insert(Str(Field(*pool, "metadata"), "name"));
      }
    }
    EnqueueWaitingClaims(ns, using_it);
  };
  InformerHandler template_handler;
  template_handler.on_add = template_changed;
  template_handler.on_update = [template_changed](const ObjectPtr& old, const ObjectPtr& o) {
    if (!SameSpec(*old, *o)) template_changed(o);
  };
  templates->AddHandler(std::move(template_handler));
}

void ClaimController::EnqueueWaitingClaims(const std::string& ns,
                                           const absl::flat_hash_set<std::string>& pools) {
  if (pools.empty()) return;
  // A scan of the claim cache, not an index by pool: it runs only when a pool or template
  // is added or its spec changes (rare) and costs a copy of the cached claims' pointers
  // and a few field reads each, while an index would have to be kept up on every claim
  // event, the frequent ones, and across relists.
  for (const ObjectPtr& claim : claims_.List()) {
    if (json_fields::BeingDeleted(*claim)) continue;
    if (Str(Field(*claim, "metadata"), "namespace") != ns) continue;
    // gRPC claims are bound when they are made; bound claims never switch sandboxes.
    if (!GrpcOwner(*claim).empty()) continue;
    if (!Str(Field(Field(*claim, "status"), "sandbox"), "name").empty()) continue;
    if (!pools.contains(PoolOf(*claim))) continue;
    Enqueue(KubectlKey(*claim));
  }
}

ClaimController::~ClaimController() { Stop(); }

void ClaimController::Enqueue(const std::string& key, absl::Duration delay) {
  if (delay > absl::ZeroDuration()) {
    queue_.AddAfter(key, delay);
  } else {
    queue_.Add(key);
  }
}

void ClaimController::LookAgainAt(const types::SandboxClaim& claim, absl::Time at, absl::Time now) {
  if (at == absl::InfiniteFuture()) return;
  Enqueue(absl::StrCat("c/", claim.metadata.Namespace(), "/", claim.metadata.Name()), at - now);
}

absl::Status ClaimController::StartInformers(absl::Duration sync_timeout) {
  RETURN_IF_ERROR(options_.Validate());
  claims_.Start();
  if (!claims_.WaitForSync(sync_timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("claim controller: SandboxClaims did not sync within ",
                     absl::FormatDuration(sync_timeout)));
  }
  return absl::OkStatus();
}

absl::Status ClaimController::Start(allocator::Allocator* allocator) {
  RETURN_IF_ERROR(mirror_.Start(allocator));
  allocator_.store(allocator, std::memory_order_release);
  // Claims that ended or whose objects went while sbx was away: the kubectl claims
  // (owners "k8s-<namespace>") of the namespaces served.
  allocator::ClaimFilter all;
  all.all_owners = true;
  all.limit = 0;
  absl::flat_hash_set<std::string> present;
  for (const ObjectPtr& claim : claims_.List())
    present.insert(Str(Field(*claim, "metadata"), "uid"));
  for (const store::ClaimRecord& c : allocator->ListClaims(all)) {
    if (!IsKubeClaimOwner(c.owner) || present.contains(c.id)) continue;
    const std::string ns = c.owner.substr(kKubeClaimOwnerPrefix.size());
    if (options_.namespaces.Serves(ns))
      allocator->Release(c.owner, c.id,
                         DropTo{"k8s.claim_gone_release", absl::StatusCode::kFailedPrecondition,
                                absl::StatusCode::kNotFound});
  }
  auto enqueue_kubectl_claims = [this] {
    for (const ObjectPtr& claim : claims_.List()) {
      if (GrpcOwner(*claim).empty()) Enqueue(KubectlKey(*claim));
    }
  };
  enqueue_kubectl_claims();
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(BackgroundThread("sbx-k8s-claims", [this] { Worker(); }));
  }
  resync_ = std::make_unique<PeriodicPass>("sbx-k8s-clmsync", options_.resync, *clock_,
                                           enqueue_kubectl_claims);
  return absl::OkStatus();
}

void ClaimController::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  mirror_.Stop();
  queue_.ShutDown();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
  if (resync_ != nullptr) resync_->Stop();
  claims_.Stop();
}

void ClaimController::Worker() {
  std::string key;
  while (queue_.Get(&key)) {
    metrics_->runtime().SetDepth(queue_.Depth());
    absl::Status s = Reconcile(key);
    metrics_->runtime().Reconciled(s.ok() ? ReconcileMetrics::Result::kSuccess
                                          : ReconcileMetrics::Result::kError);
    if (s.ok()) {
      queue_.Forget(key);
    } else {
      spdlog::warn("SandboxClaim work \"{}\": {}", key, s.ToString());
      queue_.AddRateLimited(key);
    }
    queue_.Done(key);
  }
}

absl::Status ClaimController::Reconcile(const std::string& key) {
  if (options_.is_leader && !options_.is_leader()) return absl::OkStatus();
  if (key.rfind("c/", 0) == 0) {
    std::vector<std::string> parts = absl::StrSplit(key, absl::MaxSplits('/', 2));
    if (parts.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("bad work key \"", key, "\""));
    }
    absl::Status s = ReconcileKube(parts[1], parts[2]);
    metrics_->KubectlReconciled();
    return s;
  }
  std::vector<std::string> parts = absl::StrSplit(key, absl::MaxSplits('/', 3));
  if (parts.size() != 4 || parts[0] != "g") {
    return absl::InvalidArgumentError(absl::StrCat("bad work key \"", key, "\""));
  }
  absl::Status s = mirror_.Reconcile(parts[1], parts[2], parts[3]);
  metrics_->GrpcReconciled();
  return s;
}

// Each step below decides one thing from the caches and the allocator (what to decide
// from the claim and its objects alone is in claim_objects.h) and returns the claim's
// reconcile status when it ends the reconcile.
absl::Status ClaimController::ReconcileKube(const std::string& ns, const std::string& name) {
  if (!options_.namespaces.Serves(ns)) return absl::OkStatus();
  // The informer's copy, typed (decoded once per version). The API server validates claims
  // against the CRD's schema, so a claim that does not decode can only come from a store
  // that skips it; it waits for its next change.
  absl::StatusOr<TypedCache<types::SandboxClaim>::Ptr> found = typed_claims_.Get(ns, name);
  if (!found.ok()) {
    spdlog::warn("SandboxClaim {}/{} not reconciled: {}", ns, name, found.status().ToString());
    return absl::OkStatus();
  }
  if (*found == nullptr || (*found)->metadata.BeingDeleted()) {
    return absl::OkStatus();  // on_delete releases
  }
  const types::SandboxClaim& seen = **found;
  const Json status = writer_.LastStatus(seen);
  const absl::Time now = clock_->Now();
  // Lifecycle first: an expired claim is not (re)bound.
  const LifecycleVerdict shutdown = ShutdownVerdict(seen, now);
  if (shutdown.end != ClaimEnd::kNone) return EndClaim(seen, status, shutdown.end);
  LookAgainAt(seen, shutdown.look_again, now);

  Placement placement = PlacedBefore(seen, status);
  if (placement.sandbox.empty() && !placement.refusal) {
    ASSIGN_OR_RETURN(placement, PlaceNew(seen));
  }
  // The annotations' write gives the claim a new version: the rest goes on with the
  // claim as that write answered, so that the status written below is remembered against
  // it and its echo is not taken for a change (which wrote the status a second time).
  std::optional<types::SandboxClaim> annotated;
  if (options_.claim_annotations) RETURN_IF_ERROR(Annotate(seen, placement, &annotated));
  const types::SandboxClaim& claim = annotated.has_value() ? *annotated : seen;
  if (placement.refusal) return Refuse(claim, status, *placement.refusal);
  if (!placement.cold) {
    RETURN_IF_ERROR(writer_.Bind(claim, placement.sandbox, "warm"));
    const types::LabelsAndAnnotations& pod_metadata = claim.spec.additional_pod_metadata;
    RETURN_IF_ERROR(writer_.PatchPodMetadata(
        ns, placement.sandbox, pod_metadata.present ? types::Encode(pod_metadata) : Json()));
  }
  return FollowSandbox(claim, status, placement, now);
}

absl::Status ClaimController::Annotate(const types::SandboxClaim& claim, const Placement& placement,
                                       std::optional<types::SandboxClaim>* patched) {
  Json annotations = Json::object();
  // When this controller first saw the claim; one written before (by an earlier run or
  // another controller) stays.
  if (claim.metadata.Annotation(kControllerFirstObservedAnnotation).empty()) {
    absl::Time seen = clock_->Now();
    {
      absl::MutexLock lock(&mu_);
      if (auto it = first_seen_.find(claim.metadata.Uid()); it != first_seen_.end()) {
        seen = it->second;
      }
    }
    annotations[kControllerFirstObservedAnnotation] =
        absl::FormatTime("%Y-%m-%dT%H:%M:%E*SZ", seen, absl::UTCTimeZone());
  }
  if (!placement.sandbox.empty()) annotations[kSandboxNameAnnotation] = placement.sandbox;
  return writer_.Annotate(claim, annotations, patched);
}

absl::Status ClaimController::EndClaim(const types::SandboxClaim& claim, const Json& status,
                                       ClaimEnd end) {
  switch (end) {
    case ClaimEnd::kNone:
      return absl::OkStatus();
    case ClaimEnd::kDelete:
      return writer_.DeleteClaim(claim, "");
    case ClaimEnd::kDeleteBackground:
      return writer_.DeleteClaim(claim, "Background");
    case ClaimEnd::kDeleteForeground:
      return writer_.DeleteClaim(claim, "Foreground");
    case ClaimEnd::kRetain:
      break;
  }
  // Retain: the claim stays, its sandbox goes.
  allocator::Allocator* allocator = allocator_.load(std::memory_order_acquire);
  const std::string& ns = claim.metadata.Namespace();
  allocator->Release(KubeClaimOwner(ns), claim.metadata.Uid(),
                     DropTo{"k8s.retained_claim_release", absl::StatusCode::kFailedPrecondition,
                            absl::StatusCode::kNotFound});
  if (const std::string sandbox = Str(Field(status, "sandbox"), "name"); !sandbox.empty()) {
    RETURN_IF_ERROR(writer_.DeleteSandbox(ns, sandbox));
  }
  return Refuse(claim, status, {"ClaimExpired", "the claim's shutdownTime has passed"});
}

ClaimController::Placement ClaimController::PlacedBefore(const types::SandboxClaim& claim,
                                                         const Json& status) {
  allocator::Allocator* allocator = allocator_.load(std::memory_order_acquire);
  const std::string& ns = claim.metadata.Namespace();
  const std::string& name = claim.metadata.Name();
  const std::string& uid = claim.metadata.Uid();
  auto gone = [](const std::string& sandbox) {
    return Placement{.refusal = ClaimRefusal{"SandboxMissing",
                                             absl::StrCat("sandbox \"", sandbox, "\" is gone")}};
  };
  absl::StatusOr<store::ClaimRecord> have = allocator->GetClaim(KubeClaimOwner(ns), uid);
  if (have.ok()) {
    // The allocator's sandbox id; a claim's sandbox is of the claim's namespace.
    const std::string sandbox = options_.namespaces.Split(have->sandbox_id).name;
    // An ended allocator claim (its sandbox died or finished) still shows what its Sandbox
    // says while that exists (Finished, and ttlSecondsAfterFinished runs from it).
    if (have->state != store::ClaimState::kActive && sandboxes_->Get(ns, sandbox) == nullptr) {
      return gone(sandbox);
    }
    return Placement{.sandbox = sandbox};
  }
  if (ObjectPtr cold = sandboxes_->Get(ns, name); cold != nullptr && ControllerUid(*cold) == uid) {
    return Placement{.sandbox = name, .cold = true};
  }
  if (const std::string before = Str(Field(status, "sandbox"), "name"); !before.empty()) {
    // Bound before, and the allocator does not know the claim (its store was lost, or the
    // binding was made by another leader): a Sandbox that still carries this claim's uid
    // is the claim's, kept as the API server records it.
    if (ObjectPtr bound = sandboxes_->Get(ns, before);
        bound != nullptr && !json_fields::BeingDeleted(*bound) &&
        Str(Field(Field(*bound, "metadata"), "labels"), kClaimUidLabel) == uid) {
      return Placement{.sandbox = before, .cold = true};
    }
    // Neither the allocator nor the cluster has it any more.
    return gone(before);
  }
  return Placement{};
}

absl::StatusOr<ClaimController::Placement> ClaimController::PlaceNew(
    const types::SandboxClaim& claim) {
  const std::string& ns = claim.metadata.Namespace();
  const std::string pool_name = claim.spec.warm_pool_ref.name.value_or("");
  ObjectPtr pool = pools_->Get(ns, pool_name);
  if (pool == nullptr) {
    return Placement{
        .refusal = ClaimRefusal{"WarmPoolNotFound",
                                absl::StrCat("SandboxWarmPool \"", pool_name, "\" not found")}};
  }
  const std::string template_name = Str(Field(Field(*pool, "spec"), "sandboxTemplateRef"), "name");
  ObjectPtr sandbox_template = templates_->Get(ns, template_name);
  if (sandbox_template == nullptr) {
    return Placement{
        .refusal = ClaimRefusal{"TemplateNotFound",
                                absl::StrCat("SandboxTemplate \"", template_name, "\" not found")}};
  }
  if (std::optional<ClaimRefusal> refused = CheckClaimAgainstTemplate(claim, *sandbox_template)) {
    return Placement{.refusal = std::move(refused)};
  }
  // Warm members run already: env or volumes of the claim's own need a new sandbox.
  if (!NeedsOwnSandbox(claim)) {
    ASSIGN_OR_RETURN(std::string warm,
                     ClaimWarm(claim, options_.namespaces.Qualify(ns, pool_name)));
    if (!warm.empty()) {
      ObjectPtr member = sandboxes_->Get(ns, warm);
      metrics_->Created(ns, template_name, "warm", pool_name,
                        member != nullptr && IsReady(Field(*member, "status")),
                        CreatedBy(claim.metadata));
      return Placement{.sandbox = std::move(warm)};
    }
  }
  ASSIGN_OR_RETURN(const bool made,
                   writer_.CreateSandbox(ColdSandbox(claim, *sandbox_template, ns)));
  if (made) {
    metrics_->Created(ns, template_name, "cold", pool_name, false, CreatedBy(claim.metadata));
  }
  return Placement{.sandbox = claim.metadata.Name(), .cold = true};
}

absl::StatusOr<std::string> ClaimController::ClaimWarm(const types::SandboxClaim& claim,
                                                       const std::string& pool) {
  allocator::Allocator* allocator = allocator_.load(std::memory_order_acquire);
  allocator::ClaimRequest request;
  request.owner = KubeClaimOwner(claim.metadata.Namespace());
  request.claim_id = claim.metadata.Uid();
  request.pool = pool;
  request.policy = store::EmptyPoolPolicy::kFail;
  absl::StatusOr<allocator::ClaimResult> got =
      WaitClaim([&](allocator::ClaimCallback cb) { allocator->Claim(request, std::move(cb)); });
  if (got.ok()) return options_.namespaces.Split(got->claim.sandbox_id).name;
  // None warm, or no allocator pool (yet): the claim goes cold.
  if (absl::IsResourceExhausted(got.status()) || absl::IsNotFound(got.status())) {
    return std::string();
  }
  return got.status();
}

absl::Status ClaimController::FollowSandbox(const types::SandboxClaim& claim, const Json& status,
                                            const Placement& placement, absl::Time now) {
  const std::string& ns = claim.metadata.Namespace();
  ObjectPtr sandbox = sandboxes_->Get(ns, placement.sandbox);
  Json next = BoundClaimStatus(status, placement.sandbox, placement.cold, sandbox.get(), now);
  if (sandbox != nullptr) {
    const LifecycleVerdict ttl = TtlVerdict(claim, Field(*sandbox, "status"), now);
    if (ttl.end != ClaimEnd::kNone) return EndClaim(claim, status, ttl.end);
    LookAgainAt(claim, ttl.look_again, now);
    if (IsReady(next) && !IsReady(status)) RecordReady(claim, placement, now);
  }
  return writer_.WriteStatus(claim, std::move(next));
}

absl::Status ClaimController::Refuse(const types::SandboxClaim& claim, const Json& status,
                                     const ClaimRefusal& refusal) {
  // Judged from this replica's caches and allocator: guarded by the claim's version, so a
  // refusal that lands late (a deposed leader's) cannot overwrite what changed since.
  return writer_.WriteStatus(claim, RefusedStatus(status, refusal, clock_->Now()),
                             /*guarded=*/true);
}

void ClaimController::RecordReady(const types::SandboxClaim& claim, const Placement& placement,
                                  absl::Time now) {
  absl::Time seen = now;
  {
    absl::MutexLock lock(&mu_);
    auto it = first_seen_.find(claim.metadata.Uid());
    if (it != first_seen_.end()) seen = it->second;
  }
  std::optional<double> client_ms;
  if (std::optional<absl::Time> asked = ClientRequestedAt(claim)) {
    client_ms = absl::ToDoubleMilliseconds(now - *asked);
  }
  ObjectPtr pool =
      pools_->Get(claim.metadata.Namespace(), claim.spec.warm_pool_ref.name.value_or(""));
  const std::string template_name =
      pool ? Str(Field(Field(*pool, "spec"), "sandboxTemplateRef"), "name") : "";
  metrics_->Ready(placement.cold ? "cold" : "warm", template_name,
                  absl::ToDoubleMilliseconds(now - ClaimCreatedAt(claim, seen)),
                  absl::ToDoubleMilliseconds(now - seen), client_ms);
}

}  // namespace sbx::k8s
