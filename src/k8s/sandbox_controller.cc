#include "src/k8s/sandbox_controller.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "src/common/status_macros.h"
#include "src/k8s/controller_metrics.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {

class SandboxControllerMetrics {
 public:
  explicit SandboxControllerMetrics(std::shared_ptr<prometheus::Registry> registry)
      : registry_(registry ? std::move(registry) : std::make_shared<prometheus::Registry>()),
        duration_(prometheus::BuildHistogram()
                      .Name("sbx_k8s_reconcile_duration_seconds")
                      .Help("Time to reconcile one object, by controller")
                      .Register(*registry_)
                      .Add({{"controller", "sandbox"}},
                           prometheus::Histogram::BucketBoundaries{0.0001, 0.0005, 0.001, 0.005,
                                                                   0.01, 0.05, 0.1, 0.5, 1, 5})),
        errors_(prometheus::BuildCounter()
                    .Name("sbx_k8s_reconcile_errors_total")
                    .Help("Reconciles that failed (and were retried with backoff)")
                    .Register(*registry_)
                    .Add({{"controller", "sandbox"}})),
        depth_(prometheus::BuildGauge()
                   .Name("sbx_k8s_workqueue_depth")
                   .Help("Keys waiting in the controller's work queue")
                   .Register(*registry_)
                   .Add({{"controller", "sandbox"}})),
        creation_(prometheus::BuildHistogram()
                      .Name("agent_sandbox_creation_latency_ms")
                      .Help("From a Sandbox's creationTimestamp until the controller first saw "
                            "it Ready, in milliseconds")
                      .Register(*registry_)),
        sandboxes_(prometheus::BuildGauge()
                       .Name("agent_sandboxes")
                       .Help("Sandbox objects by Ready condition, launch type and template")
                       .Register(*registry_)),
        reconciles_(*registry_, kSandboxControllerName) {}

  // controller-runtime's names for the same (upstream's dashboards read them).
  ReconcileMetrics& reconciles() { return reconciles_; }

  prometheus::Histogram& duration() { return duration_; }
  // Counts `sandbox` in (+1) or out (-1) of agent_sandboxes, with upstream's labels.
  void CountSandbox(const Json& sandbox, double delta) {
    using json_fields::Field;
    using json_fields::Str;
    const Json& meta = Field(sandbox, "metadata");
    const Json* ready = json_fields::FindCondition(Field(sandbox, "status"), "Ready");
    const bool is_ready = ready != nullptr && Str(*ready, "status") == "True";
    const bool expired = ready != nullptr && Str(*ready, "reason") == "SandboxExpired";
    sandboxes_
        .Add({{"namespace", Str(meta, "namespace")},
              {"ready_condition", is_ready ? "true" : "false"},
              {"expired", expired ? "true" : "false"},
              {"launch_type",
               Str(Field(meta, "labels"), kLaunchTypeLabel) == "warm" ? "warm" : "cold"},
              {"sandbox_template", TemplateOf(sandbox)},
              {"owned_by", ExtensionsControllerKind(sandbox)},
              {"created_by", CreatedBy(sandbox)}})
        .Increment(delta);
  }
  prometheus::Counter& errors() { return errors_; }
  prometheus::Gauge& depth() { return depth_; }
  void Created(const Json& sandbox, double ms) {
    using json_fields::Field;
    using json_fields::Str;
    const Json& meta = Field(sandbox, "metadata");
    const std::string launch = Str(Field(meta, "labels"), kLaunchTypeLabel);
    creation_
        .Add({{"namespace", Str(meta, "namespace")},
              {"launch_type", launch.empty() ? "none" : launch},
              {"sandbox_template", TemplateOf(sandbox)}},
             prometheus::Histogram::BucketBoundaries{10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
                                                     10000, 30000, 60000})
        .Observe(ms);
  }

 private:
  // The template a Sandbox was made from (upstream's sandbox-template-ref annotation), or
  // "unknown" for one made by hand.
  static std::string TemplateOf(const Json& sandbox) {
    const std::string name =
        json_fields::Str(json_fields::Field(json_fields::Field(sandbox, "metadata"), "annotations"),
                         kTemplateRefAnnotation);
    return name.empty() ? "unknown" : name;
  }
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram& duration_;
  prometheus::Counter& errors_;
  prometheus::Gauge& depth_;
  prometheus::Family<prometheus::Histogram>& creation_;
  prometheus::Family<prometheus::Gauge>& sandboxes_;
  ReconcileMetrics reconciles_;
};

namespace {

// How often a Sandbox blocked by someone else's object is looked at again.
constexpr absl::Duration kConflictRecheck = absl::Seconds(2);
// How long a created object may stay unseen by the informers before it is looked for.
constexpr absl::Duration kExpectationTimeout = absl::Seconds(10);

std::string ObjectId(const Resource& resource, const std::string& ns, const std::string& name) {
  return absl::StrCat(resource.resource, "/", ns, "/", name);
}

using json_fields::Field;
using json_fields::Str;

InformerOptions InformerFor(const Resource& resource, const std::string& ns,
                            const std::string& label_selector, const Clock* clock) {
  InformerOptions options;
  options.resource = resource;
  options.ns = ns;
  options.label_selector = label_selector;
  options.clock = clock;
  return options;
}

WorkQueueOptions QueueOptions(WorkQueueOptions queue, const Clock* clock) {
  if (queue.clock == nullptr) queue.clock = clock;
  return queue;
}

// The merge patch turning `old_status` into `status`: fields that are gone become null.
Json StatusPatch(const Json& old_status, const Json& status) {
  Json patch = status;
  if (old_status.is_object()) {
    for (const auto& [key, value] : old_status.items()) {
      if (!status.contains(key)) patch[key] = nullptr;
    }
  }
  return Json{{"status", patch}};
}

// True when `status` may be held back (options.first_status_hold): no status was written yet, and
// it only says that the pod is on its way. An error, an unschedulable pod, a suspension or an
// expiry is written at once (the runtime keeps unschedulable members by this condition).
bool MayHoldFirstStatus(const Json& old_status, const Json& status) {
  if (Field(old_status, "conditions").is_array()) return false;
  for (const Json& c : status["conditions"]) {
    const std::string type = Str(c, "type");
    if (type == "Ready" && Str(c, "reason") == "DependenciesNotReady") continue;
    if (type == "Suspended" && Str(c, "reason") == "NotSuspended") continue;
    if (type == "PodScheduled" && Str(c, "status") == "True") continue;
    return false;
  }
  return true;
}

}  // namespace

absl::Status SandboxControllerOptions::Validate() const {
  if (workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sandbox controller workers ", workers, " must be at least 1"));
  }
  if (first_status_hold < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("sandbox controller first_status_hold ",
                                                   absl::FormatDuration(first_status_hold),
                                                   " must not be negative"));
  }
  if (leader_election) RETURN_IF_ERROR(election.Validate());
  return absl::OkStatus();
}

SandboxController::SandboxController(Client* client, SandboxControllerOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      metrics_(std::make_unique<SandboxControllerMetrics>(options_.registry)),
      queue_(QueueOptions(options_.queue, clock_)),
      sandboxes_(client, InformerFor(kSandboxes, options_.ns, "", clock_)),
      pods_(client, InformerFor(kPods, options_.ns, kNameHashLabel, clock_)),
      services_(client, InformerFor(kServices, options_.ns, kNameHashLabel, clock_)),
      pvcs_(client, InformerFor(kPersistentVolumeClaims, options_.ns, kNameHashLabel, clock_)) {
  InformerHandler sandbox_handler;
  sandbox_handler.on_add = [this](const ObjectPtr& o) {
    metrics_->CountSandbox(*o, 1);
    queue_.Add(KeyOf(*o));
  };
  sandbox_handler.on_update = [this](const ObjectPtr& old, const ObjectPtr& o) {
    metrics_->CountSandbox(*old, -1);
    metrics_->CountSandbox(*o, 1);
    queue_.Add(KeyOf(*o));
  };
  sandbox_handler.on_delete = [this](const ObjectPtr& o) {
    metrics_->CountSandbox(*o, -1);
    absl::MutexLock lock(&seen_mu_);
    counted_ready_.erase(Str(Field(*o, "metadata"), "uid"));
  };
  sandboxes_.AddHandler(std::move(sandbox_handler));
  for (auto [informer, resource] : {std::pair{&pods_, &kPods}, std::pair{&services_, &kServices},
                                    std::pair{&pvcs_, &kPersistentVolumeClaims}}) {
    InformerHandler owned;
    owned.on_add = [this, resource = resource](const ObjectPtr& o) {
      EndExpectation(*resource, *o);
      EnqueueOwner(o);
    };
    owned.on_update = [this, resource = resource](const ObjectPtr&, const ObjectPtr& o) {
      EndExpectation(*resource, *o);
      EnqueueOwner(o);
    };
    owned.on_delete = [this, resource = resource](const ObjectPtr& o) {
      EndExpectation(*resource, *o);
      EnqueueOwner(o);
    };
    informer->AddHandler(std::move(owned));
  }
}

namespace {

// The fence left on the client once the controller is gone: nothing more is written.
class ClosedFence final : public WriteFence {
 public:
  absl::StatusOr<absl::Duration> WriteWindow() const override {
    return absl::FailedPreconditionError("the Kubernetes controllers of this replica have stopped");
  }
};

}  // namespace

SandboxController::~SandboxController() {
  Stop();
  if (elector_ != nullptr) {
    static const ClosedFence* closed = new ClosedFence();
    client_->SetWriteFence(closed);
  }
}

void SandboxController::EnqueueOwner(const ObjectPtr& object) {
  const Json& meta = Field(*object, "metadata");
  // One without a controller (left by `kubectl delete --cascade=orphan`) goes to the Sandbox
  // of its name, which may adopt it: that Sandbox may have looked while this informer still
  // showed the old controller, and nothing else would bring it back.
  if (ControllerUid(*object).empty()) {
    queue_.Add(absl::StrCat(Str(meta, "namespace"), "/", Str(meta, "name")));
    return;
  }
  const Json& refs = Field(meta, "ownerReferences");
  if (!refs.is_array()) return;
  for (const Json& ref : refs) {
    if (Str(ref, "kind") == "Sandbox" && Field(ref, "controller").is_boolean() &&
        ref["controller"].get<bool>()) {
      queue_.Add(absl::StrCat(Str(meta, "namespace"), "/", Str(ref, "name")));
    }
  }
}

absl::Status SandboxController::Start(absl::Duration sync_timeout) {
  RETURN_IF_ERROR(options_.Validate());
  for (Informer* informer : {&sandboxes_, &pods_, &services_, &pvcs_}) informer->Start();
  // A wait for the API server (I/O), not a timer: real time, whatever the clock.
  const absl::Time deadline = absl::Now() + sync_timeout;
  for (Informer* informer : {&sandboxes_, &pods_, &services_, &pvcs_}) {
    if (!informer->WaitForSync(deadline - absl::Now())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "sandbox controller: caches did not sync within ", absl::FormatDuration(sync_timeout),
          " (is the API server reachable, and are the agents.x-k8s.io CRDs installed?)"));
    }
  }
  if (options_.leader_election) {
    LeaderElectionOptions election = options_.election;
    if (election.clock == nullptr) election.clock = clock_;
    elector_ = std::make_unique<LeaderElector>(
        options_.election_client != nullptr ? options_.election_client : client_, election,
        [this] {
          // A new leader looks at everything once: the previous one may have left work.
          for (const ObjectPtr& sandbox : sandboxes_.List()) queue_.Add(KeyOf(*sandbox));
        },
        options_.on_stopped_leading);
    // Before the elector can lead: no write of this client goes out unfenced from here.
    client_->SetWriteFence(elector_.get());
    elector_->Start();
  }
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(BackgroundThread("sbx-k8s-sandbox", [this] { Worker(); }));
  }
  return absl::OkStatus();
}

void SandboxController::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  queue_.ShutDown();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
  if (elector_ != nullptr) elector_->Stop();
  for (Informer* informer : {&sandboxes_, &pods_, &services_, &pvcs_}) informer->Stop();
}

bool SandboxController::IsLeader() const {
  return !options_.leader_election || (elector_ != nullptr && elector_->IsLeader());
}

void SandboxController::Worker() {
  std::string key;
  while (queue_.Get(&key)) {
    metrics_->depth().Set(static_cast<double>(queue_.Depth()));
    metrics_->reconciles().SetDepth(queue_.Depth());
    if (!IsLeader()) {
      // The leader reconciles; a new leader requeues every Sandbox when it starts.
      queue_.Forget(key);
      queue_.Done(key);
      continue;
    }
    // The metric measures the work itself: real time, whatever clock drives the timers.
    const absl::Time start = absl::Now();
    absl::Status status = Reconcile(key);
    metrics_->duration().Observe(absl::ToDoubleSeconds(absl::Now() - start));
    metrics_->reconciles().Reconciled(status.ok() ? ReconcileMetrics::Result::kSuccess
                                                  : ReconcileMetrics::Result::kError);
    if (status.ok()) {
      queue_.Forget(key);
    } else {
      metrics_->errors().Increment();
      spdlog::debug("sandbox {}: reconcile failed (retry {}): {}", key, queue_.Failures(key) + 1,
                    status.ToString());
      queue_.AddRateLimited(key);
    }
    queue_.Done(key);
  }
}

absl::Status SandboxController::Reconcile(const std::string& key) {
  std::vector<std::string> parts = absl::StrSplit(key, absl::MaxSplits('/', 1));
  if (parts.size() != 2) return absl::InvalidArgumentError(absl::StrCat("bad key \"", key, "\""));
  ObjectPtr sandbox = sandboxes_.Get(parts[0], parts[1]);
  if (sandbox == nullptr || json_fields::BeingDeleted(*sandbox))
    return absl::OkStatus();  // owner GC cleans up
  return ReconcileSandbox(*sandbox);
}

ObjectPtr SandboxController::Expected(const std::string& id, const std::string& owner_uid) {
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it == expected_.end()) return nullptr;
  if (clock_->Now() - it->second.created > kExpectationTimeout ||
      ControllerUid(*it->second.object) != owner_uid) {
    expected_.erase(it);
    return nullptr;
  }
  return it->second.object;
}

void SandboxController::Expect(const Informer& informer, const std::string& id, ObjectPtr object) {
  const Json& meta = Field(*object, "metadata");
  {
    absl::MutexLock lock(&expect_mu_);
    expected_[id] = Expectation{clock_->Now(), object};
  }
  ObjectPtr cached = informer.Get(Str(meta, "namespace"), Str(meta, "name"));
  if (cached == nullptr || ControllerUid(*cached) != ControllerUid(*object)) return;
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it != expected_.end() && it->second.object == object) expected_.erase(it);
}

void SandboxController::EndExpectation(const Resource& resource, const Json& object) {
  const Json& meta = Field(object, "metadata");
  const std::string id = ObjectId(resource, Str(meta, "namespace"), Str(meta, "name"));
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it != expected_.end() && ControllerUid(*it->second.object) == ControllerUid(object)) {
    expected_.erase(it);
  }
}

absl::Status SandboxController::EnsurePvcs(const Json& sandbox, Observed* observed) {
  const std::string uid = Str(sandbox["metadata"], "uid");
  absl::Status problem = absl::OkStatus();
  // Notes the first reason a PVC is not there for the pod, and the first API error.
  auto missing = [observed, &problem](std::string why, absl::Status status) {
    if (observed->pvcs_missing.empty()) observed->pvcs_missing = std::move(why);
    if (problem.ok()) problem = std::move(status);
  };
  // Notes what an existing PVC of the name means for the pod.
  auto judge = [&](const Json& pvc) {
    std::string why;
    const PvcFit fit = FitOfPvc(pvc, sandbox, &why);
    if (fit == PvcFit::kUsable) return;
    missing(why, absl::OkStatus());
    if (fit == PvcFit::kRefused && observed->error.empty()) observed->error = why;
  };
  for (Json& pvc : DesiredPvcs(sandbox)) {
    const std::string name = Str(pvc["metadata"], "name");
    const std::string ns = Str(pvc["metadata"], "namespace");
    const std::string id = ObjectId(kPersistentVolumeClaims, ns, name);
    // Created for this Sandbox (the API's answer says it exists), not in the informer yet.
    if (Expected(id, uid) != nullptr) continue;
    ObjectPtr cached = pvcs_.Get(ns, name);
    if (cached != nullptr) {
      if (FitOfPvc(*cached, sandbox, nullptr) == PvcFit::kUsable) continue;
      // An earlier Sandbox's, or being deleted, says the cache, which may lag: the API
      // decides.
      absl::StatusOr<Json> live = client_->Get(kPersistentVolumeClaims, ns, name);
      if (live.ok()) {
        judge(*live);
        continue;
      }
      if (!absl::IsNotFound(live.status())) {
        missing(absl::StrCat("PVC \"", name, "\" could not be read"), live.status());
        continue;
      }
    }
    pvc["metadata"]["labels"][kNameHashLabel] = NameHash(Str(sandbox["metadata"], "name"));
    absl::StatusOr<Json> created = client_->Create(kPersistentVolumeClaims, ns, pvc);
    if (created.ok()) {
      Expect(pvcs_, id, std::make_shared<const Json>(*std::move(created)));
      continue;
    }
    if (!absl::IsAlreadyExists(created.status())) {
      missing(absl::StrCat("PVC \"", name, "\" could not be created"), created.status());
      continue;
    }
    // Not in our cache: either the cache lags, or the PVC is someone else's (a PVC without
    // our label is not watched).
    absl::StatusOr<Json> live = client_->Get(kPersistentVolumeClaims, ns, name);
    if (live.ok()) {
      judge(*live);
    } else {
      missing(absl::StrCat("PVC \"", name, "\" does not exist (yet)"),
              absl::IsNotFound(live.status())
                  ? absl::UnavailableError(absl::StrCat(
                        "PVC \"", name, "\" existed at create and was gone at get; retrying"))
                  : live.status());
    }
  }
  return problem;
}

absl::Status SandboxController::StillAdopts(const Json& sandbox) {
  // The object was orphaned by the deletion of a Sandbox of this name, and the informers
  // are separate watches: the pod's "owner removed" event can arrive while the Sandbox
  // cache still holds the deleted Sandbox, which would then adopt the pod for a uid that
  // no longer exists (and its successor finds it "not controlled by this Sandbox" until
  // garbage collection). So, as Kubernetes' ControllerRefManager rechecks the owner with
  // an uncached read before it adopts, adoption asks the API server itself.
  const Json& meta = sandbox["metadata"];
  const std::string ns = Str(meta, "namespace");
  const std::string name = Str(meta, "name");
  absl::StatusOr<Json> live = client_->Get(kSandboxes, ns, name);
  if (absl::IsNotFound(live.status())) {
    return absl::AbortedError(
        absl::StrCat("Sandbox ", ns, "/", name, " is gone: its orphaned objects are not adopted"));
  }
  if (!live.ok()) return live.status();
  if (Str(Field(*live, "metadata"), "uid") != Str(meta, "uid") ||
      json_fields::BeingDeleted(*live)) {
    return absl::AbortedError(absl::StrCat("Sandbox ", ns, "/", name, " uid ", Str(meta, "uid"),
                                           " was replaced or is being deleted: not adopting"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Json>> SandboxController::EnsureService(const Json& sandbox,
                                                                     bool wanted) {
  const Json& meta = sandbox["metadata"];
  const std::string ns = Str(meta, "namespace");
  const std::string name = Str(meta, "name");
  const std::string uid = Str(meta, "uid");
  ObjectPtr existing = services_.Get(ns, name);
  const bool ours = existing != nullptr && ControllerUid(*existing) == uid;
  if (wanted) {
    if (ours) return std::optional<Json>(*existing);
    if (existing != nullptr && MayAdopt(sandbox, *existing, Adoptee::kService)) {
      // As upstream: one left by `kubectl delete --cascade=orphan` of an earlier Sandbox
      // of this name (it carries the tracking label) is taken over, not refused.
      RETURN_IF_ERROR(StillAdopts(sandbox));
      absl::StatusOr<Json> adopted =
          client_->Patch(kServices, ns, name, PatchType::kMerge,
                         AdoptionPatch(sandbox, *existing, Adoptee::kService));
      if (!adopted.ok()) return adopted.status();
      spdlog::info("Sandbox {}/{}: adopted its Service", ns, name);
      return std::optional<Json>(*std::move(adopted));
    }
    if (existing != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("service \"", name, "\" exists and is not controlled by this Sandbox"));
    }
    const std::string id = ObjectId(kServices, ns, name);
    if (ObjectPtr expected = Expected(id, uid)) return std::optional<Json>(*expected);
    absl::StatusOr<Json> created = client_->Create(kServices, ns, DesiredService(sandbox));
    if (created.ok()) {
      Expect(services_, id, std::make_shared<const Json>(*created));
      return std::optional<Json>(*std::move(created));
    }
    if (!absl::IsAlreadyExists(created.status())) return created.status();
    return std::optional<Json>();  // the informer will show it
  }
  if (ours) {
    DeleteOptions options;
    options.precondition_uid = Str(Field(*existing, "metadata"), "uid");
    absl::Status deleted = client_->Delete(kServices, ns, name, options);
    if (!deleted.ok() && !absl::IsNotFound(deleted)) return deleted;
  }
  return std::optional<Json>();
}

absl::Status SandboxController::ReconcileSandbox(const Json& sandbox) {
  const Json& meta = sandbox["metadata"];
  const Json& spec = Field(sandbox, "spec");
  const std::string ns = Str(meta, "namespace");
  const std::string name = Str(meta, "name");
  const std::string uid = Str(meta, "uid");
  const std::string key = absl::StrCat(ns, "/", name);
  const absl::Time now = clock_->Now();

  Observed observed;
  // Expiry at shutdownTime: a timer (the queue's delayed add), not polling.
  const std::string shutdown = Str(spec, "shutdownTime");
  if (!shutdown.empty()) {
    const absl::Time at = ParseTime(shutdown);
    if (at <= now) {
      observed.expired = true;
      if (Str(spec, "shutdownPolicy") == "Delete") {
        DeleteOptions options;
        options.propagation_policy = "Background";
        options.precondition_uid = uid;
        absl::Status deleted = client_->Delete(kSandboxes, ns, name, options);
        return deleted.ok() || absl::IsNotFound(deleted) ? absl::OkStatus() : deleted;
      }
    } else {
      queue_.AddAfter(key, at - now);
    }
  }
  observed.suspended = Str(spec, "operatingMode") == "Suspended";

  // The PVCs first: the pod is made only once each of them exists and is the Sandbox's.
  absl::Status problem = EnsurePvcs(sandbox, &observed);

  // The Service: true creates it, false deletes it, unset leaves it; expiry deletes it.
  const Json& service_field = Field(spec, "service");
  if (observed.expired || (service_field.is_boolean() && !service_field.get<bool>())) {
    absl::StatusOr<std::optional<Json>> service = EnsureService(sandbox, /*wanted=*/false);
    if (!service.ok() && problem.ok()) problem = service.status();
  } else if (service_field.is_boolean() && service_field.get<bool>()) {
    observed.service_wanted = true;
    absl::StatusOr<std::optional<Json>> service = EnsureService(sandbox, /*wanted=*/true);
    if (service.ok()) {
      observed.service = *service;
    } else if (problem.ok()) {
      problem = service.status();
    }
  } else {
    ObjectPtr existing = services_.Get(ns, name);
    if (existing != nullptr && ControllerUid(*existing) == uid) observed.service = *existing;
  }

  // The pod.
  for (const ObjectPtr& pod : pods_.ByOwner(uid)) {
    if (ControllerUid(*pod) == uid) observed.pods.push_back(pod);
  }
  ObjectPtr named = pods_.Get(ns, name);
  if (named != nullptr && MayAdopt(sandbox, *named, Adoptee::kPod)) {
    // As upstream: a pod left by `kubectl delete --cascade=orphan` of an earlier Sandbox
    // of this name (it carries the tracking label) runs on under this one.
    absl::Status still = StillAdopts(sandbox);
    absl::StatusOr<Json> adopted =
        still.ok() ? client_->Patch(kPods, ns, name, PatchType::kMerge,
                                    AdoptionPatch(sandbox, *named, Adoptee::kPod))
                   : absl::StatusOr<Json>(still);
    if (adopted.ok()) {
      spdlog::info("Sandbox {}/{}: adopted its pod", ns, name);
      named = std::make_shared<const Json>(*std::move(adopted));
      observed.pods.push_back(named);
    } else if (problem.ok()) {
      problem = adopted.status();
    }
  }
  if (named != nullptr && ControllerUid(*named) != uid) {
    observed.error =
        absl::StrCat("pod \"", name, "\" exists and is not controlled by this Sandbox");
  } else if (observed.suspended || observed.expired) {
    for (const ObjectPtr& pod : observed.pods) {
      if (json_fields::BeingDeleted(*pod)) continue;
      DeleteOptions options;
      options.precondition_uid = Str((*pod)["metadata"], "uid");
      absl::Status deleted = client_->Delete(kPods, ns, Str((*pod)["metadata"], "name"), options);
      if (!deleted.ok() && !absl::IsNotFound(deleted) && problem.ok()) problem = deleted;
    }
  } else if (observed.pods.empty() && !observed.pvcs_missing.empty()) {
    // No pod before its PVCs: it would mount a claim that is not (or no longer) its own.
  } else if (observed.pods.empty()) {
    const std::string id = ObjectId(kPods, ns, name);
    ObjectPtr expected = Expected(id, uid);
    absl::Status created = absl::OkStatus();
    if (expected == nullptr) {
      // Until the informer has it, the pod as sent stands for it (no phase: Pending); the
      // stored object in the answer is not needed, so it is not parsed.
      Json desired = DesiredPod(sandbox);
      if (options_.sandboxd_secret) {
        SetSandboxdSecret(&desired, kSandboxdPortName, options_.sandboxd_secret(ns, name));
      }
      auto pod = std::make_shared<const Json>(std::move(desired));
      created = client_->CreateNoResult(kPods, ns, *pod);
      if (created.ok()) {
        Expect(pods_, id, pod);
        expected = std::move(pod);
      }
    }
    if (created.ok()) {
      observed.pods.push_back(std::move(expected));
    } else if (absl::IsAlreadyExists(created)) {
      // Not in our cache: either the cache lags, or the pod is someone else's.
      absl::StatusOr<Json> pod = client_->Get(kPods, ns, name);
      if (pod.ok() && ControllerUid(*pod) != uid) {
        observed.error =
            absl::StrCat("pod \"", name, "\" exists and is not controlled by this Sandbox");
      } else if (pod.ok()) {
        observed.pods.push_back(std::make_shared<const Json>(*std::move(pod)));
      }
    } else if (problem.ok()) {
      problem = created;
    }
  }
  if (!problem.ok() && observed.error.empty()) observed.error = std::string(problem.message());
  const bool pod_waits_for_pvcs = observed.pods.empty() && !observed.pvcs_missing.empty() &&
                                  !observed.suspended && !observed.expired;
  if ((!observed.error.empty() || pod_waits_for_pvcs) && problem.ok()) {
    // A conflict with someone else's object (a pod or PVC of our name), or a PVC being
    // deleted before the pod could be made, ends when it is gone, which no watch of ours
    // sees when it lacks our label: look again every while.
    queue_.AddAfter(key, kConflictRecheck);
  }

  const Json& old_status = Field(sandbox, "status");
  Json status = ComputeStatus(sandbox, observed, old_status, now);
  const absl::Time created_at = ParseTime(Str(meta, "creationTimestamp"));
  if (status != old_status) {
    if (MayHoldFirstStatus(old_status, status) && created_at != absl::InfinitePast() &&
        now < created_at + options_.first_status_hold) {
      queue_.AddAfter(key, created_at + options_.first_status_hold - now);
    } else {
      RETURN_IF_ERROR(WriteStatus(sandbox, status));
    }
  }
  if (IsReady(status)) {
    bool first = false;
    {
      absl::MutexLock lock(&seen_mu_);
      first = counted_ready_.insert(uid).second;
    }
    if (first && !IsReady(old_status)) {
      if (created_at != absl::InfinitePast()) {
        metrics_->Created(sandbox, absl::ToDoubleMilliseconds(now - created_at));
      }
    }
  }
  // A problem is retried with backoff (after the status says what it is).
  return problem;
}

absl::Status SandboxController::WriteStatus(const Json& sandbox, const Json& status) {
  const Json& meta = sandbox["metadata"];
  absl::Status written = client_->PatchNoResult(
      kSandboxes, Str(meta, "namespace"), Str(meta, "name"), PatchType::kMerge,
      StatusPatch(Field(sandbox, "status"), status), "status");
  return written.ok() || absl::IsNotFound(written) ? absl::OkStatus() : written;
}

}  // namespace sbx::k8s
