#include "src/k8s/sandbox_controller.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// The series are made once: a family's children are kept in maps by their label values
// (joined into one key), so an informer event or a first Ready costs a hash lookup, not a
// Family::Add (which builds and hashes a label map under the family's lock).
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
  // Counts Sandbox `key` (namespace/name) in agent_sandboxes under the labels of `sandbox`
  // (a watch event's object), moving it out of the series it was counted in; null counts
  // it out (it is deleted).
  void CountSandbox(const std::string& key, const Json* sandbox) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    prometheus::Gauge* now = sandbox != nullptr ? SandboxGaugeLocked(*sandbox) : nullptr;
    auto it = counted_.find(key);
    prometheus::Gauge* was = it != counted_.end() ? it->second : nullptr;
    if (was == now) return;
    if (was != nullptr) was->Decrement();
    if (now == nullptr) {
      counted_.erase(it);
      return;
    }
    now->Increment();
    counted_[key] = now;
  }
  prometheus::Counter& errors() { return errors_; }
  prometheus::Gauge& depth() { return depth_; }
  void Created(const types::Sandbox& sandbox, double ms) ABSL_LOCKS_EXCLUDED(mu_) {
    const types::ObjectMeta& meta = sandbox.metadata;
    const std::string& launch = meta.Label(kLaunchTypeLabel);
    const std::string launch_type = launch.empty() ? "none" : launch;
    const std::string template_name = TemplateOf(sandbox);
    prometheus::Histogram* histogram = nullptr;
    {
      absl::MutexLock lock(&mu_);
      prometheus::Histogram*& child = creation_children_[absl::StrJoin(
          {meta.Namespace(), launch_type, template_name}, kLabelSeparator)];
      if (child == nullptr) {
        child =
            &creation_.Add({{"namespace", meta.Namespace()},
                            {"launch_type", launch_type},
                            {"sandbox_template", template_name}},
                           prometheus::Histogram::BucketBoundaries{
                               10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000});
      }
      histogram = child;
    }
    histogram->Observe(ms);
  }

 private:
  // Joins label values into a child's key (a byte no label value of these series holds).
  static constexpr char kLabelSeparator[] = "\x1f";
  // The template a Sandbox was made from (upstream's sandbox-template-ref annotation), or
  // "unknown" for one made by hand.
  static std::string TemplateOf(const types::Sandbox& sandbox) {
    const std::string& name = sandbox.metadata.Annotation(kTemplateRefAnnotation);
    return name.empty() ? "unknown" : name;
  }
  // The agent_sandboxes series of `sandbox`'s labels (upstream's), made on first use. The
  // labels are read from the watch event's JSON (the edge): the informer's one thread runs
  // this for every event, and decoding each Sandbox there (its pod template included)
  // slowed the refill (docs/benchmarks.md, "Typed Sandboxes").
  prometheus::Gauge* SandboxGaugeLocked(const Json& sandbox) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Json& meta = json_fields::Field(sandbox, "metadata");
    const Json* ready = json_fields::FindCondition(json_fields::Field(sandbox, "status"), "Ready");
    const bool is_ready = ready != nullptr && json_fields::Str(*ready, "status") == "True";
    const bool expired = ready != nullptr && json_fields::Str(*ready, "reason") == "SandboxExpired";
    const std::string ns = json_fields::Str(meta, "namespace");
    const std::string ready_label = is_ready ? "true" : "false";
    const std::string expired_label = expired ? "true" : "false";
    const std::string launch =
        json_fields::Str(json_fields::Field(meta, "labels"), kLaunchTypeLabel) == "warm" ? "warm"
                                                                                         : "cold";
    std::string template_name =
        json_fields::Str(json_fields::Field(meta, "annotations"), kTemplateRefAnnotation);
    if (template_name.empty()) template_name = "unknown";
    const std::string owned_by = ExtensionsControllerKind(sandbox);
    const std::string created_by = CreatedBy(sandbox);
    prometheus::Gauge*& child = sandbox_children_[absl::StrJoin(
        {ns, ready_label, expired_label, launch, template_name, owned_by, created_by},
        kLabelSeparator)];
    if (child == nullptr) {
      child = &sandboxes_.Add({{"namespace", ns},
                               {"ready_condition", ready_label},
                               {"expired", expired_label},
                               {"launch_type", launch},
                               {"sandbox_template", template_name},
                               {"owned_by", owned_by},
                               {"created_by", created_by}});
    }
    return child;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram& duration_;
  prometheus::Counter& errors_;
  prometheus::Gauge& depth_;
  prometheus::Family<prometheus::Histogram>& creation_;
  prometheus::Family<prometheus::Gauge>& sandboxes_;
  ReconcileMetrics reconciles_;
  absl::Mutex mu_;
  // The series made so far, by their label values joined.
  absl::flat_hash_map<std::string, prometheus::Gauge*> sandbox_children_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> creation_children_ ABSL_GUARDED_BY(mu_);
  // The series each Sandbox (namespace/name) is counted in.
  absl::flat_hash_map<std::string, prometheus::Gauge*> counted_ ABSL_GUARDED_BY(mu_);
};

namespace {

// How often a Sandbox blocked by someone else's object is looked at again.
constexpr absl::Duration kConflictRecheck = absl::Seconds(2);
// How long a created object may stay unseen by the informers before it is looked for.
constexpr absl::Duration kExpectationTimeout = absl::Seconds(10);

std::string ObjectId(const Resource& resource, const std::string& ns, const std::string& name) {
  return absl::StrCat(resource.resource, "/", ns, "/", name);
}

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

// The merge patch turning `old_status` into `status` (both encoded): fields that are gone
// become null.
Json StatusPatch(const Json& old_status, const Json& status) {
  Json patch = status;
  if (old_status.is_object()) {
    for (const auto& [key, value] : old_status.items()) {
      if (!status.contains(key)) patch.emplace(key, nullptr);
    }
  }
  return Json{{"status", patch}};
}

// True when `status` may be held back (options.first_status_hold): no status was written yet, and
// it only says that the pod is on its way. An error, an unschedulable pod, a suspension or an
// expiry is written at once (the runtime keeps unschedulable members by this condition).
bool MayHoldFirstStatus(const types::SandboxStatus& old_status,
                        const types::SandboxStatus& status) {
  if (old_status.conditions.has_value()) return false;
  if (!status.conditions.has_value()) return true;
  for (const types::Condition& c : *status.conditions) {
    const std::string type = c.type.value_or("");
    if (type == "Ready" && c.reason == "DependenciesNotReady") continue;
    if (type == "Suspended" && c.reason == "NotSuspended") continue;
    if (type == "PodScheduled" && c.status == "True") continue;
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
      pvcs_(client, InformerFor(kPersistentVolumeClaims, options_.ns, kNameHashLabel, clock_)),
      typed_sandboxes_(&sandboxes_, &types::DecodeSandbox),
      typed_pods_(&pods_, &types::DecodePod),
      typed_services_(&services_, &types::DecodeService),
      typed_pvcs_(&pvcs_, &types::DecodePersistentVolumeClaim) {
  // The handlers run on each informer's one thread for every watch event: they read the
  // few fields they need from the event's JSON (the edge), and the typed copies are made by
  // the reconciles, on the workers.
  InformerHandler sandbox_handler;
  sandbox_handler.on_add = [this](const ObjectPtr& o) {
    metrics_->CountSandbox(KeyOf(*o), o.get());
    queue_.Add(KeyOf(*o));
  };
  sandbox_handler.on_update = [this](const ObjectPtr&, const ObjectPtr& o) {
    metrics_->CountSandbox(KeyOf(*o), o.get());
    queue_.Add(KeyOf(*o));
  };
  sandbox_handler.on_delete = [this](const ObjectPtr& o) {
    metrics_->CountSandbox(KeyOf(*o), nullptr);
    absl::MutexLock lock(&seen_mu_);
    counted_ready_.erase(json_fields::Str(json_fields::Field(*o, "metadata"), "uid"));
  };
  sandboxes_.AddHandler(std::move(sandbox_handler));
  for (auto [informer, resource] : {std::pair{&pods_, &kPods}, std::pair{&services_, &kServices},
                                    std::pair{&pvcs_, &kPersistentVolumeClaims}}) {
    InformerHandler owned;
    owned.on_add = [this, resource = resource](const ObjectPtr& o) { OnOwned(*resource, o); };
    owned.on_update = [this, resource = resource](const ObjectPtr&, const ObjectPtr& o) {
      OnOwned(*resource, o);
    };
    owned.on_delete = [this, resource = resource](const ObjectPtr& o) { OnOwned(*resource, o); };
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

void SandboxController::OnOwned(const Resource& resource, const ObjectPtr& object) {
  const Json& meta = json_fields::Field(*object, "metadata");
  const std::string ns = json_fields::Str(meta, "namespace");
  const std::string name = json_fields::Str(meta, "name");
  const std::string controller_uid = ControllerUid(*object);
  EndExpectation(resource, ns, name, controller_uid);
  // One without a controller (left by `kubectl delete --cascade=orphan`) goes to the Sandbox
  // of its name, which may adopt it: that Sandbox may have looked while this informer still
  // showed the old controller, and nothing else would bring it back.
  if (controller_uid.empty()) {
    queue_.Add(absl::StrCat(ns, "/", name));
    return;
  }
  const Json& refs = json_fields::Field(meta, "ownerReferences");
  if (!refs.is_array()) return;
  for (const Json& ref : refs) {
    const Json& controller = json_fields::Field(ref, "controller");
    if (json_fields::Str(ref, "kind") == "Sandbox" && controller.is_boolean() &&
        controller.get<bool>()) {
      queue_.Add(absl::StrCat(ns, "/", json_fields::Str(ref, "name")));
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
  // The informer's copy, typed (decoded once per version). The API server validates
  // Sandboxes against the CRD's schema, so one that does not decode can only come from a
  // store that skips it; it waits for its next change.
  absl::StatusOr<TypedCache<types::Sandbox>::Ptr> sandbox =
      typed_sandboxes_.Get(parts[0], parts[1]);
  if (!sandbox.ok()) {
    spdlog::warn("Sandbox {} not reconciled: {}", key, sandbox.status().ToString());
    return absl::OkStatus();
  }
  if (*sandbox == nullptr || (*sandbox)->metadata.BeingDeleted()) {
    return absl::OkStatus();  // owner GC cleans up
  }
  return ReconcileSandbox(**sandbox);
}

std::optional<SandboxController::Expectation> SandboxController::Expected(
    const std::string& id, const std::string& owner_uid) {
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it == expected_.end()) return std::nullopt;
  if (clock_->Now() - it->second.created > kExpectationTimeout ||
      it->second.owner_uid != owner_uid) {
    expected_.erase(it);
    return std::nullopt;
  }
  return it->second;
}

void SandboxController::Expect(const Resource& resource, const std::string& ns,
                               const std::string& name, Expectation expectation) {
  const std::string id = ObjectId(resource, ns, name);
  const std::string owner_uid = expectation.owner_uid;
  const absl::Time created = clock_->Now();
  expectation.created = created;
  {
    absl::MutexLock lock(&expect_mu_);
    expected_[id] = std::move(expectation);
  }
  const Informer& informer =
      &resource == &kPods ? pods_ : (&resource == &kServices ? services_ : pvcs_);
  ObjectPtr cached = informer.Get(ns, name);
  if (cached == nullptr || ControllerUid(*cached) != owner_uid) return;
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it != expected_.end() && it->second.created == created && it->second.owner_uid == owner_uid) {
    expected_.erase(it);
  }
}

void SandboxController::EndExpectation(const Resource& resource, const std::string& ns,
                                       const std::string& name, const std::string& controller_uid) {
  const std::string id = ObjectId(resource, ns, name);
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it != expected_.end() && it->second.owner_uid == controller_uid) expected_.erase(it);
}

absl::Status SandboxController::EnsurePvcs(const types::Sandbox& sandbox, Observed* observed) {
  const std::string& uid = sandbox.metadata.Uid();
  absl::Status problem = absl::OkStatus();
  // Notes the first reason a PVC is not there for the pod, and the first API error.
  auto missing = [observed, &problem](std::string why, absl::Status status) {
    if (observed->pvcs_missing.empty()) observed->pvcs_missing = std::move(why);
    if (problem.ok()) problem = std::move(status);
  };
  // Notes what an existing PVC of the name, read from the API, means for the pod.
  auto judge = [&](const Json& live) {
    absl::StatusOr<types::PersistentVolumeClaim> pvc = types::DecodePersistentVolumeClaim(live);
    if (!pvc.ok()) {
      missing(std::string(pvc.status().message()), pvc.status());
      return;
    }
    std::string why;
    const PvcFit fit = FitOfPvc(*pvc, sandbox, &why);
    if (fit == PvcFit::kUsable) return;
    missing(why, absl::OkStatus());
    if (fit == PvcFit::kRefused && observed->error.empty()) observed->error = why;
  };
  const std::vector<Json> desired = DesiredPvcs(sandbox);
  if (!sandbox.spec.volume_claim_templates.has_value()) return problem;
  size_t next = 0;  // DesiredPvcs makes one body per entry with a name, in order
  for (const types::VolumeClaimTemplate& entry : *sandbox.spec.volume_claim_templates) {
    const std::string volume = entry.metadata.name.value_or("");
    if (volume.empty() || next >= desired.size()) continue;
    const Json& body = desired[next++];
    const std::string name = volume + "-" + sandbox.metadata.Name();
    const std::string& ns = sandbox.metadata.Namespace();
    const std::string id = ObjectId(kPersistentVolumeClaims, ns, name);
    // Created for this Sandbox (the API's answer says it exists), not in the informer yet.
    if (Expected(id, uid).has_value()) continue;
    absl::StatusOr<TypedCache<types::PersistentVolumeClaim>::Ptr> cached =
        typed_pvcs_.Get(ns, name);
    if (!cached.ok() || *cached != nullptr) {
      if (cached.ok() && FitOfPvc(**cached, sandbox, nullptr) == PvcFit::kUsable) continue;
      // An earlier Sandbox's, or being deleted, says the cache, which may lag (or its copy
      // does not decode): the API decides.
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
    absl::StatusOr<Json> created = client_->Create(kPersistentVolumeClaims, ns, body);
    if (created.ok()) {
      Expectation expectation;
      expectation.owner_uid = uid;
      Expect(kPersistentVolumeClaims, ns, name, std::move(expectation));
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

absl::Status SandboxController::StillAdopts(const types::Sandbox& sandbox) {
  // The object was orphaned by the deletion of a Sandbox of this name, and the informers
  // are separate watches: the pod's "owner removed" event can arrive while the Sandbox
  // cache still holds the deleted Sandbox, which would then adopt the pod for a uid that
  // no longer exists (and its successor finds it "not controlled by this Sandbox" until
  // garbage collection). So, as Kubernetes' ControllerRefManager rechecks the owner with
  // an uncached read before it adopts, adoption asks the API server itself.
  const std::string& ns = sandbox.metadata.Namespace();
  const std::string& name = sandbox.metadata.Name();
  const std::string& uid = sandbox.metadata.Uid();
  absl::StatusOr<Json> read = client_->Get(kSandboxes, ns, name);
  if (absl::IsNotFound(read.status())) {
    return absl::AbortedError(
        absl::StrCat("Sandbox ", ns, "/", name, " is gone: its orphaned objects are not adopted"));
  }
  if (!read.ok()) return read.status();
  absl::StatusOr<types::Sandbox> live = types::DecodeSandbox(*read);
  if (!live.ok()) return live.status();
  if (live->metadata.Uid() != uid || live->metadata.BeingDeleted()) {
    return absl::AbortedError(absl::StrCat("Sandbox ", ns, "/", name, " uid ", uid,
                                           " was replaced or is being deleted: not adopting"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const types::Service>> SandboxController::EnsureService(
    const types::Sandbox& sandbox, bool wanted) {
  using ServicePtr = std::shared_ptr<const types::Service>;
  const std::string& ns = sandbox.metadata.Namespace();
  const std::string& name = sandbox.metadata.Name();
  const std::string& uid = sandbox.metadata.Uid();
  ASSIGN_OR_RETURN(ServicePtr existing, typed_services_.Get(ns, name));
  const bool ours = existing != nullptr && ControllerUid(existing->metadata) == uid;
  if (wanted) {
    if (ours) return existing;
    if (existing != nullptr && MayAdopt(sandbox, *existing)) {
      // As upstream: one left by `kubectl delete --cascade=orphan` of an earlier Sandbox
      // of this name (it carries the tracking label) is taken over, not refused.
      RETURN_IF_ERROR(StillAdopts(sandbox));
      absl::StatusOr<Json> adopted =
          client_->Patch(kServices, ns, name, PatchType::kMerge, AdoptionPatch(sandbox, *existing));
      if (!adopted.ok()) return adopted.status();
      spdlog::info("Sandbox {}/{}: adopted its Service", ns, name);
      ASSIGN_OR_RETURN(types::Service service, types::DecodeService(*adopted));
      return std::make_shared<const types::Service>(std::move(service));
    }
    if (existing != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("service \"", name, "\" exists and is not controlled by this Sandbox"));
    }
    const std::string id = ObjectId(kServices, ns, name);
    if (std::optional<Expectation> expected = Expected(id, uid)) return expected->service;
    absl::StatusOr<Json> created = client_->Create(kServices, ns, DesiredService(sandbox));
    if (created.ok()) {
      ASSIGN_OR_RETURN(types::Service service, types::DecodeService(*created));
      auto shown = std::make_shared<const types::Service>(std::move(service));
      Expectation expectation;
      expectation.owner_uid = uid;
      expectation.service = shown;
      Expect(kServices, ns, name, std::move(expectation));
      return shown;
    }
    if (!absl::IsAlreadyExists(created.status())) return created.status();
    return ServicePtr();  // the informer will show it
  }
  if (ours) {
    DeleteOptions options;
    options.precondition_uid = existing->metadata.Uid();
    absl::Status deleted = client_->Delete(kServices, ns, name, options);
    if (!deleted.ok() && !absl::IsNotFound(deleted)) return deleted;
  }
  return ServicePtr();
}

absl::Status SandboxController::ReconcileSandbox(const types::Sandbox& sandbox) {
  using PodPtr = std::shared_ptr<const types::Pod>;
  const types::SandboxSpec& spec = sandbox.spec;
  const std::string& ns = sandbox.metadata.Namespace();
  const std::string& name = sandbox.metadata.Name();
  const std::string& uid = sandbox.metadata.Uid();
  const std::string key = absl::StrCat(ns, "/", name);
  const absl::Time now = clock_->Now();

  Observed observed;
  // Expiry at shutdownTime: a timer (the queue's delayed add), not polling.
  const std::string shutdown = spec.shutdown_time.value_or("");
  if (!shutdown.empty()) {
    const absl::Time at = ParseTime(shutdown);
    if (at <= now) {
      observed.expired = true;
      if (spec.shutdown_policy == "Delete") {
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
  observed.suspended = spec.operating_mode == "Suspended";

  // The PVCs first: the pod is made only once each of them exists and is the Sandbox's.
  absl::Status problem = EnsurePvcs(sandbox, &observed);

  // The Service: true creates it, false deletes it, unset leaves it; expiry deletes it.
  if (observed.expired || spec.service == false) {
    absl::StatusOr<std::shared_ptr<const types::Service>> service =
        EnsureService(sandbox, /*wanted=*/false);
    if (!service.ok() && problem.ok()) problem = service.status();
  } else if (spec.service == true) {
    observed.service_wanted = true;
    absl::StatusOr<std::shared_ptr<const types::Service>> service =
        EnsureService(sandbox, /*wanted=*/true);
    if (service.ok()) {
      observed.service = *std::move(service);
    } else if (problem.ok()) {
      problem = service.status();
    }
  } else {
    absl::StatusOr<std::shared_ptr<const types::Service>> existing = typed_services_.Get(ns, name);
    if (!existing.ok()) {
      if (problem.ok()) problem = existing.status();
    } else if (*existing != nullptr && ControllerUid((*existing)->metadata) == uid) {
      observed.service = *existing;
    }
  }

  // The pod.
  for (const ObjectPtr& pod : pods_.ByOwner(uid)) {
    ASSIGN_OR_RETURN(PodPtr typed, typed_pods_.Of(pod));
    if (ControllerUid(typed->metadata) == uid) observed.pods.push_back(std::move(typed));
  }
  ASSIGN_OR_RETURN(PodPtr named, typed_pods_.Get(ns, name));
  if (named != nullptr && MayAdopt(sandbox, *named)) {
    // As upstream: a pod left by `kubectl delete --cascade=orphan` of an earlier Sandbox
    // of this name (it carries the tracking label) runs on under this one.
    absl::Status still = StillAdopts(sandbox);
    absl::StatusOr<Json> adopted = still.ok() ? client_->Patch(kPods, ns, name, PatchType::kMerge,
                                                               AdoptionPatch(sandbox, *named))
                                              : absl::StatusOr<Json>(still);
    absl::StatusOr<types::Pod> typed =
        adopted.ok() ? types::DecodePod(*adopted) : absl::StatusOr<types::Pod>(adopted.status());
    if (typed.ok()) {
      spdlog::info("Sandbox {}/{}: adopted its pod", ns, name);
      named = std::make_shared<const types::Pod>(*std::move(typed));
      observed.pods.push_back(named);
    } else if (problem.ok()) {
      problem = typed.status();
    }
  }
  if (named != nullptr && ControllerUid(named->metadata) != uid) {
    observed.error =
        absl::StrCat("pod \"", name, "\" exists and is not controlled by this Sandbox");
  } else if (observed.suspended || observed.expired) {
    for (const PodPtr& pod : observed.pods) {
      if (pod->metadata.BeingDeleted()) continue;
      DeleteOptions options;
      options.precondition_uid = pod->metadata.Uid();
      absl::Status deleted = client_->Delete(kPods, ns, pod->metadata.Name(), options);
      if (!deleted.ok() && !absl::IsNotFound(deleted) && problem.ok()) problem = deleted;
    }
  } else if (observed.pods.empty() && !observed.pvcs_missing.empty()) {
    // No pod before its PVCs: it would mount a claim that is not (or no longer) its own.
  } else if (observed.pods.empty()) {
    const std::string id = ObjectId(kPods, ns, name);
    std::optional<Expectation> expected = Expected(id, uid);
    PodPtr pod = expected.has_value() ? expected->pod : nullptr;
    absl::Status created = absl::OkStatus();
    if (!expected.has_value()) {
      // Until the informer has it, the pod as sent stands for it (no phase: Pending); the
      // stored object in the answer is not needed, so it is not parsed.
      Json desired = DesiredPod(sandbox);
      if (options_.sandboxd_secret) {
        SetSandboxdSecret(&desired, kSandboxdPortName, options_.sandboxd_secret(ns, name));
      }
      absl::StatusOr<types::Pod> sent = types::DecodePod(desired);
      created = sent.ok() ? client_->CreateNoResult(kPods, ns, desired) : sent.status();
      if (created.ok()) {
        pod = std::make_shared<const types::Pod>(*std::move(sent));
        Expectation expectation;
        expectation.owner_uid = uid;
        expectation.pod = pod;
        Expect(kPods, ns, name, std::move(expectation));
      }
    }
    if (created.ok() && pod != nullptr) {
      observed.pods.push_back(std::move(pod));
    } else if (absl::IsAlreadyExists(created)) {
      // Not in our cache: either the cache lags, or the pod is someone else's.
      absl::StatusOr<Json> read = client_->Get(kPods, ns, name);
      absl::StatusOr<types::Pod> live =
          read.ok() ? types::DecodePod(*read) : absl::StatusOr<types::Pod>(read.status());
      if (live.ok() && ControllerUid(live->metadata) != uid) {
        observed.error =
            absl::StrCat("pod \"", name, "\" exists and is not controlled by this Sandbox");
      } else if (live.ok()) {
        observed.pods.push_back(std::make_shared<const types::Pod>(*std::move(live)));
      }
    } else if (!created.ok() && problem.ok()) {
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

  const types::SandboxStatus status = ComputeStatus(sandbox, observed, sandbox.status, now);
  // Compared and patched as JSON: the status as stored (an absent one is null) against the
  // one computed, so an unchanged world writes nothing.
  const Json old_json = sandbox.status.present ? types::Encode(sandbox.status) : Json();
  const Json status_json = types::Encode(status);
  const absl::Time created_at = ParseTime(sandbox.metadata.creation_timestamp.value_or(""));
  if (status_json != old_json) {
    if (MayHoldFirstStatus(sandbox.status, status) && created_at != absl::InfinitePast() &&
        now < created_at + options_.first_status_hold) {
      queue_.AddAfter(key, created_at + options_.first_status_hold - now);
    } else {
      RETURN_IF_ERROR(WriteStatus(sandbox, old_json, status_json));
    }
  }
  if (IsReady(status)) {
    bool first = false;
    {
      absl::MutexLock lock(&seen_mu_);
      first = counted_ready_.insert(uid).second;
    }
    if (first && !IsReady(sandbox.status)) {
      if (created_at != absl::InfinitePast()) {
        metrics_->Created(sandbox, absl::ToDoubleMilliseconds(now - created_at));
      }
    }
  }
  // A problem is retried with backoff (after the status says what it is).
  return problem;
}

absl::Status SandboxController::WriteStatus(const types::Sandbox& sandbox, const Json& old_status,
                                            const Json& status) {
  absl::Status written =
      client_->PatchNoResult(kSandboxes, sandbox.metadata.Namespace(), sandbox.metadata.Name(),
                             PatchType::kMerge, StatusPatch(old_status, status), "status");
  return written.ok() || absl::IsNotFound(written) ? absl::OkStatus() : written;
}

}  // namespace sbx::k8s
