#include "src/k8s/claim_controller.h"

#include <cstdio>
#include <utility>

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
#include "src/common/hash.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/template_objects.h"
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
                     .Help("SandboxClaim creation (or client-first-requested-at) to Ready, ms")
                     .Register(*registry_)),
        controller_startup_(prometheus::BuildHistogram()
                                .Name("agent_sandbox_claim_controller_startup_latency_ms")
                                .Help("Controller first seeing a SandboxClaim to Ready, ms")
                                .Register(*registry_)),
        created_(prometheus::BuildCounter()
                     .Name("agent_sandbox_claim_creation_total")
                     .Help("SandboxClaims that became Ready, by launch type and warm pool")
                     .Register(*registry_)) {}

  void Ready(const std::string& launch_type, const std::string& sandbox_template,
             const std::string& pool, double startup_ms, double controller_ms) {
    Series& series = Of(launch_type, sandbox_template, pool);
    if (startup_ms >= 0) series.startup->Observe(startup_ms);
    if (controller_ms >= 0) series.controller_startup->Observe(controller_ms);
    series.created->Increment();
  }
  void set_namespace(std::string ns) { ns_ = std::move(ns); }

 private:
  // The series of one launch type, template and pool, made on first use (Family::Add
  // builds label maps and bucket vectors and locks the family: not once per claim).
  struct Series {
    prometheus::Histogram* startup;
    prometheus::Histogram* controller_startup;
    prometheus::Counter* created;
  };

  Series& Of(const std::string& launch_type, const std::string& sandbox_template,
             const std::string& pool) ABSL_LOCKS_EXCLUDED(mu_) {
    const std::string key = absl::StrCat(launch_type, "/", sandbox_template, "/", pool);
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = series_.try_emplace(key);
    if (inserted) {
      static const prometheus::Histogram::BucketBoundaries kBuckets{
          10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000};
      const prometheus::Labels labels{{"launch_type", launch_type},
                                      {"sandbox_template", sandbox_template}};
      it->second =
          Series{&startup_.Add(labels, kBuckets), &controller_startup_.Add(labels, kBuckets),
                 &created_.Add(
                     {{"launch_type", launch_type}, {"warmpool_name", pool}, {"namespace", ns_}})};
    }
    return it->second;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& startup_;
  prometheus::Family<prometheus::Histogram>& controller_startup_;
  prometheus::Family<prometheus::Counter>& created_;
  std::string ns_;
  absl::Mutex mu_;
  // Node map: a Series stays where it is while others are added.
  absl::node_hash_map<std::string, Series> series_ ABSL_GUARDED_BY(mu_);
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

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

Json Condition(const std::string& type, bool status, const std::string& reason,
               const std::string& message, const Json& old_status) {
  const std::string s = status ? "True" : "False";
  std::string since = Now();
  if (const Json* old = json_fields::FindCondition(old_status, type);
      old != nullptr && Str(*old, "status") == s) {
    since = Str(*old, "lastTransitionTime");
  }
  return {{"type", type},
          {"status", s},
          {"reason", reason},
          {"message", message},
          {"lastTransitionTime", since}};
}

// The offset basis GrpcClaimName has always used: one digit short of FNV-1a's
// (14695981039346656037). SandboxClaims already in clusters are named with it, so it
// stays.
constexpr uint64_t kGrpcClaimNameOffset = 1469598103934665603ULL;

absl::Time ParseRfc3339(const std::string& s, absl::Time fallback) {
  absl::Time t;
  std::string err;
  return absl::ParseTime(absl::RFC3339_full, s, &t, &err) ? t : fallback;
}

Json ClaimRef(const Json& claim) {
  const Json& meta = Field(claim, "metadata");
  return {{"apiVersion", "extensions.agents.x-k8s.io/v1beta1"},
          {"kind", "SandboxClaim"},
          {"name", Str(meta, "name")},
          {"uid", Str(meta, "uid")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

}  // namespace

absl::Status ClaimControllerOptions::Validate() const {
  if (ns.empty()) return absl::InvalidArgumentError("claim controller: namespace is empty");
  if (workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim controller workers ", workers, " must be at least 1"));
  }
  return absl::OkStatus();
}

std::string GrpcClaimName(const std::string& owner, const std::string& id) {
  char hex[17];
  std::snprintf(
      hex, sizeof(hex), "%016llx",
      static_cast<unsigned long long>(Fnv1a64(absl::StrCat(owner, "/", id), kGrpcClaimNameOffset)));
  return absl::StrCat("grpc-", hex);
}

ClaimController::ClaimController(Client* client, WriteScheduler* writes, Informer* sandboxes,
                                 Informer* pools, Informer* templates,
                                 ClaimControllerOptions options)
    : client_(client),
      writes_(writes),
      sandboxes_(sandboxes),
      pools_(pools),
      templates_(templates),
      options_(std::move(options)),
      metrics_(std::make_unique<ClaimControllerMetrics>(options_.registry)),
      claims_(client, NamespaceInformer(kSandboxClaims, options_.ns)) {
  metrics_->set_namespace(options_.ns);
  auto on_claim = [this](const ObjectPtr& o) {
    const Json& meta = Field(*o, "metadata");
    const Json& annotations = Field(meta, "annotations");
    const std::string owner = Str(annotations, kSbxOwnerAnnotation);
    if (!owner.empty()) {
      Enqueue(absl::StrCat("g/", owner, "/", Str(annotations, kSbxClaimIdAnnotation)));
    } else {
      Enqueue(absl::StrCat("c/", Str(meta, "name")));
    }
  };
  InformerHandler claim_handler;
  claim_handler.on_add = [this, on_claim](const ObjectPtr& o) {
    {
      absl::MutexLock lock(&mu_);
      first_seen_.try_emplace(Str(Field(*o, "metadata"), "uid"), absl::Now());
    }
    on_claim(o);
  };
  claim_handler.on_update = [on_claim](const ObjectPtr&, const ObjectPtr& o) { on_claim(o); };
  claim_handler.on_delete = [this](const ObjectPtr& o) {
    const Json& meta = Field(*o, "metadata");
    const Json& annotations = Field(meta, "annotations");
    const std::string uid = Str(meta, "uid");
    {
      absl::MutexLock lock(&mu_);
      first_seen_.erase(uid);
      written_.erase(uid);
    }
    allocator::Allocator* a = allocator_.load(std::memory_order_acquire);
    if (a == nullptr) return;  // Start looks for claims that went while it was away
    std::string owner = Str(annotations, kSbxOwnerAnnotation);
    std::string id = Str(annotations, kSbxClaimIdAnnotation);
    if (owner.empty()) {
      owner = KubeClaimOwner(options_.ns);
      id = uid;
    }
    // Ending an ended claim answers FAILED_PRECONDITION, which is fine: this is the
    // deletion of the claim object that the end of a gRPC claim asked for.
    a->Release(owner, id, [](absl::Status) {});
  };
  claims_.AddHandler(std::move(claim_handler));

  // A Sandbox change concerns the claim that owns it.
  auto on_sandbox = [this](const ObjectPtr& o) {
    const Json& meta = Field(*o, "metadata");
    if (Str(meta, "namespace") != options_.ns) return;
    const Json& refs = Field(meta, "ownerReferences");
    if (!refs.is_array()) return;
    for (const Json& ref : refs) {
      if (Str(ref, "kind") != "SandboxClaim") continue;
      ObjectPtr claim = claims_.Get(options_.ns, Str(ref, "name"));
      if (claim == nullptr) continue;
      const Json& annotations = Field(Field(*claim, "metadata"), "annotations");
      if (!Str(annotations, kSbxOwnerAnnotation).empty()) continue;  // gRPC: its own status
      Enqueue(absl::StrCat("c/", Str(ref, "name")));
    }
  };
  InformerHandler sandbox_handler;
  sandbox_handler.on_add = on_sandbox;
  sandbox_handler.on_update = [on_sandbox](const ObjectPtr&, const ObjectPtr& o) { on_sandbox(o); };
  sandbox_handler.on_delete = on_sandbox;
  sandboxes_->AddHandler(std::move(sandbox_handler));

  // A pool or template that is added, or whose spec changes, may be what a waiting claim
  // (WarmPoolNotFound, TemplateNotFound, a template policy that refused it) needs: its
  // claims go on now, not at the next resync. As upstream does, status-only updates are
  // ignored (a pool's status changes with every member; no waiting claim reads it) and so
  // is a template's deletion. Each informer fills its cache before its handlers run, so
  // whichever of the claim and the pool a handler sees last, that one's reconcile finds
  // the other in its cache.
  InformerHandler pool_handler;
  pool_handler.on_add = [this](const ObjectPtr& o) {
    EnqueueWaitingClaims({Str(Field(*o, "metadata"), "name")});
  };
  pool_handler.on_update = [this](const ObjectPtr& old, const ObjectPtr& o) {
    if (SameSpec(*old, *o)) return;
    EnqueueWaitingClaims({Str(Field(*o, "metadata"), "name")});
  };
  pool_handler.on_delete = pool_handler.on_add;  // their status says WarmPoolNotFound
  pools->AddHandler(std::move(pool_handler));

  auto template_changed = [this](const ObjectPtr& o) {
    const std::string name = Str(Field(*o, "metadata"), "name");
    absl::flat_hash_set<std::string> using_it;
    for (const ObjectPtr& pool : pools_->List()) {
      if (Str(Field(Field(*pool, "spec"), "sandboxTemplateRef"), "name") == name) {
        using_it.insert(Str(Field(*pool, "metadata"), "name"));
      }
    }
    EnqueueWaitingClaims(using_it);
  };
  InformerHandler template_handler;
  template_handler.on_add = template_changed;
  template_handler.on_update = [template_changed](const ObjectPtr& old, const ObjectPtr& o) {
    if (!SameSpec(*old, *o)) template_changed(o);
  };
  templates->AddHandler(std::move(template_handler));
}

void ClaimController::EnqueueWaitingClaims(const absl::flat_hash_set<std::string>& pools) {
  if (pools.empty()) return;
  // A scan of the claim cache, not an index by pool: it runs only when a pool or template
  // is added or its spec changes (rare) and costs a copy of the cached claims' pointers
  // and a few field reads each, while an index would have to be kept up on every claim
  // event, the frequent ones, and across relists.
  for (const ObjectPtr& claim : claims_.List()) {
    const Json& meta = Field(*claim, "metadata");
    if (json_fields::BeingDeleted(*claim)) continue;
    // gRPC claims are bound when they are made; bound claims never switch sandboxes.
    if (!Str(Field(meta, "annotations"), kSbxOwnerAnnotation).empty()) continue;
    if (!Str(Field(Field(*claim, "status"), "sandbox"), "name").empty()) continue;
    if (!pools.contains(Str(Field(Field(*claim, "spec"), "warmPoolRef"), "name"))) continue;
    Enqueue(absl::StrCat("c/", Str(meta, "name")));
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
  allocator::WatchRequest request;
  request.all_owners = true;
  request.include_ended = false;
  ASSIGN_OR_RETURN(watch_, allocator->Watch(request, [this] {
    absl::MutexLock lock(&mu_);
    watch_ready_ = true;
  }));
  allocator_.store(allocator, std::memory_order_release);
  // Claims that ended or whose objects went while sbx was away.
  allocator::ClaimFilter mine;
  mine.owner = KubeClaimOwner(options_.ns);
  mine.limit = 0;
  absl::flat_hash_set<std::string> present;
  for (const ObjectPtr& claim : claims_.List())
    present.insert(Str(Field(*claim, "metadata"), "uid"));
  for (const store::ClaimRecord& c : allocator->ListClaims(mine)) {
    if (!present.contains(c.id)) allocator->Release(c.owner, c.id, [](absl::Status) {});
  }
  for (const ObjectPtr& claim : claims_.List()) {
    const Json& meta = Field(*claim, "metadata");
    const std::string owner = Str(Field(meta, "annotations"), kSbxOwnerAnnotation);
    if (owner.empty()) Enqueue(absl::StrCat("c/", Str(meta, "name")));
  }
  watcher_ = BackgroundThread("sbx-k8s-mirror", [this] { WatchLoop(); });
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(BackgroundThread("sbx-k8s-claims", [this] { Worker(); }));
  }
  resync_ = PeriodicThread("sbx-k8s-clmsync", &stopping_, options_.resync, [this] {
    for (const ObjectPtr& claim : claims_.List()) {
      const Json& meta = Field(*claim, "metadata");
      if (Str(Field(meta, "annotations"), kSbxOwnerAnnotation).empty()) {
        Enqueue(absl::StrCat("c/", Str(meta, "name")));
      }
    }
  });
  return absl::OkStatus();
}

void ClaimController::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  {
    absl::MutexLock lock(&mu_);
    watch_ready_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  if (watch_ != nullptr) watch_->Cancel();
  queue_.ShutDown();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
  if (resync_.joinable()) resync_.join();
  claims_.Stop();
}

void ClaimController::WatchLoop() {
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
      Enqueue(absl::StrCat("g/", c.owner, "/", c.id));
    }
    if (!s.ok() && !stopping_.load(std::memory_order_acquire)) {
      // Too slow (ABORTED) or the history is gone: resume, or start over from the state.
      allocator::WatchRequest request;
      request.all_owners = true;
      request.include_ended = false;
      request.start_revision = last;
      auto ready = [this] {
        absl::MutexLock lock(&mu_);
        watch_ready_ = true;
      };
      absl::StatusOr<std::unique_ptr<allocator::ClaimWatch>> again =
          allocator->Watch(request, ready);
      if (!again.ok()) {
        request.start_revision = 0;
        again = allocator->Watch(request, ready);
      }
      if (again.ok()) {
        watch_ = *std::move(again);
      } else {
        spdlog::warn("gRPC claim mirror: allocator watch failed: {}", again.status().ToString());
        absl::SleepFor(absl::Seconds(1));
      }
    }
  }
}

void ClaimController::Worker() {
  std::string key;
  while (queue_.Get(&key)) {
    absl::Status s = Reconcile(key);
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
  if (key.rfind("c/", 0) == 0) return ReconcileKube(key.substr(2));
  std::vector<std::string> parts = absl::StrSplit(key, absl::MaxSplits('/', 2));
  if (parts.size() != 3 || parts[0] != "g") {
    return absl::InvalidArgumentError(absl::StrCat("bad work key \"", key, "\""));
  }
  return ReconcileGrpc(parts[1], parts[2]);
}

absl::Status ClaimController::BindSandbox(const Json& claim, const std::string& sandbox,
                                          const char* launch_type) {
  const std::string uid = Str(Field(claim, "metadata"), "uid");
  std::string seen_version;
  if (ObjectPtr seen = sandboxes_->Get(options_.ns, sandbox)) {
    if (Str(Field(Field(*seen, "metadata"), "labels"), kClaimUidLabel) == uid &&
        ControllerUid(*seen) == uid) {
      absl::MutexLock lock(&mu_);
      bound_.erase(sandbox);
      return absl::OkStatus();
    }
    seen_version = Str(Field(*seen, "metadata"), "resourceVersion");
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = bound_.find(sandbox);
    if (it != bound_.end() && it->second.first == uid && it->second.second == seen_version) {
      return absl::OkStatus();  // patched already; the cache has not caught up
    }
  }
  // The warm-pool label goes; sandbox-template-ref-hash stays (upstream keeps it, and the
  // template's NetworkPolicy selects the pod by it).
  Json patch = {
      {"metadata",
       {{"ownerReferences", Json::array({ClaimRef(claim)})},
        {"labels",
         {{kWarmPoolLabel, nullptr}, {kClaimUidLabel, uid}, {kLaunchTypeLabel, launch_type}}}}}};
  absl::Status patched = writes_->Run(WritePriority::kClaim, [&] {
    return client_->PatchNoResult(kSandboxes, options_.ns, sandbox, PatchType::kMerge, patch);
  });
  if (patched.ok()) {
    absl::MutexLock lock(&mu_);
    if (bound_.size() >= 65536) bound_.clear();  // entries of Sandboxes gone unseen
    bound_[sandbox] = {uid, seen_version};
  }
  return patched;
}

absl::Status ClaimController::PatchPodMetadata(const std::string& sandbox, const Json& extra) {
  if (!extra.is_object() || extra.empty()) return absl::OkStatus();
  Json patch = {{"metadata", Json::object()}};
  for (const char* part : {"labels", "annotations"}) {
    if (Field(extra, part).is_object()) patch["metadata"][part] = extra[part];
  }
  // Sent again only when the patch or the Sandbox changed since (a pod made again by the
  // Sandbox controller changes the Sandbox's status), not on every reconcile and resync.
  std::string version;
  if (ObjectPtr seen = sandboxes_->Get(options_.ns, sandbox)) {
    version = Str(Field(*seen, "metadata"), "resourceVersion");
  }
  const std::string memo = absl::StrCat(version, " ", patch.dump());
  {
    absl::MutexLock lock(&mu_);
    auto it = pod_metadata_sent_.find(sandbox);
    if (it != pod_metadata_sent_.end() && it->second == memo) return absl::OkStatus();
  }
  absl::Status s = writes_->Run(WritePriority::kClaim, [&] {
    return client_->PatchNoResult(kPods, options_.ns, sandbox, PatchType::kMerge, patch);
  });
  if (absl::IsNotFound(s)) return absl::OkStatus();  // no pod yet; the Sandbox will change
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    if (pod_metadata_sent_.size() >= 65536) pod_metadata_sent_.clear();  // of gone Sandboxes
    pod_metadata_sent_[sandbox] = memo;
  }
  return s;
}

absl::Status ClaimController::WriteStatus(const Json& claim, Json status) {
  const std::string uid = Str(Field(claim, "metadata"), "uid");
  Json old = Field(claim, "status");
  {
    absl::MutexLock lock(&mu_);
    if (auto it = written_.find(uid); it != written_.end()) old = it->second;
  }
  if (old.is_object()) {
    bool same = true;
    for (auto it = status.begin(); same && it != status.end(); ++it) {
      same = old.contains(it.key()) && old[it.key()] == it.value();
    }
    if (same) return absl::OkStatus();
  }
  const std::string name = Str(Field(claim, "metadata"), "name");
  absl::Status s = writes_->Run(WritePriority::kClaim, [&] {
    return client_->PatchNoResult(kSandboxClaims, options_.ns, name, PatchType::kMerge,
                                  Json{{"status", status}}, "status");
  });
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    written_[uid] = std::move(status);
  }
  return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
}

Json ClaimController::LastStatus(const Json& claim) {
  absl::MutexLock lock(&mu_);
  auto it = written_.find(Str(Field(claim, "metadata"), "uid"));
  return it != written_.end() ? it->second : Field(claim, "status");
}

absl::Status ClaimController::NotReady(const Json& claim, const std::string& reason,
                                       const std::string& message) {
  Json status = LastStatus(claim);
  if (!status.is_object()) status = Json::object();
  status["conditions"] = Json::array({Condition("Ready", false, reason, message, status)});
  return WriteStatus(claim, std::move(status));
}

absl::Status ClaimController::CreateColdSandbox(const Json& claim, const Json& sandbox_template) {
  const Json& meta = Field(claim, "metadata");
  const Json& spec = Field(claim, "spec");
  const Json& tspec = Field(sandbox_template, "spec");
  Json sb_spec = {{"podTemplate", Field(tspec, "podTemplate")}};
  if (Field(tspec, "service").is_boolean()) sb_spec["service"] = tspec["service"];
  const Json& vct = Field(spec, "volumeClaimTemplates").is_array()
                        ? spec["volumeClaimTemplates"]
                        : Field(tspec, "volumeClaimTemplates");
  if (vct.is_array()) sb_spec["volumeClaimTemplates"] = vct;
  Json& pod = sb_spec["podTemplate"];
  if (!pod.is_object()) pod = Json::object();
  Json& pod_spec = pod["spec"];
  if (!pod_spec.is_object()) pod_spec = Json::object();
  ApplyPodSecureDefaults(sandbox_template, &pod_spec);
  // env: appended, or replacing a template variable of the same name (policy checked).
  const Json& env = Field(spec, "env");
  if (env.is_array() && Field(pod_spec, "containers").is_array()) {
    for (Json& c : pod_spec["containers"]) {
      for (const Json& e : env) {
        const std::string target = Str(e, "containerName");
        if (!target.empty() && target != Str(c, "name")) continue;
        Json& list = c["env"];
        if (!list.is_array()) list = Json::array();
        bool replaced = false;
        for (Json& have : list) {
          if (Str(have, "name") == Str(e, "name")) {
            have = {{"name", Str(e, "name")}, {"value", Str(e, "value")}};
            replaced = true;
          }
        }
        if (!replaced) list.push_back({{"name", Str(e, "name")}, {"value", Str(e, "value")}});
      }
    }
  }
  const Json& extra = Field(spec, "additionalPodMetadata");
  for (const char* part : {"labels", "annotations"}) {
    if (!Field(extra, part).is_object()) continue;
    Json& into = pod["metadata"][part];
    if (!into.is_object()) into = Json::object();
    into.update(extra[part]);
  }
  Json sandbox = {
      {"apiVersion", "agents.x-k8s.io/v1beta1"},
      {"kind", "Sandbox"},
      {"metadata",
       {{"name", Str(meta, "name")},
        {"namespace", options_.ns},
        {"labels",
         {{kClaimUidLabel, Str(meta, "uid")},
          {kLaunchTypeLabel, "cold"},
          {kTemplateRefHashLabel, NameHash(Str(Field(sandbox_template, "metadata"), "name"))},
          {"sbx.dev/template", Str(Field(sandbox_template, "metadata"), "name")}}},
        {"ownerReferences", Json::array({ClaimRef(claim)})}}},
      {"spec", std::move(sb_spec)}};
  absl::Status s = writes_->Run(WritePriority::kClaim, [&] {
    return client_->Create(kSandboxes, options_.ns, sandbox).status();
  });
  return s.ok() || absl::IsAlreadyExists(s) ? absl::OkStatus() : s;
}

absl::Status ClaimController::ReconcileKube(const std::string& name) {
  allocator::Allocator* allocator = allocator_.load(std::memory_order_acquire);
  ObjectPtr found = claims_.Get(options_.ns, name);
  if (found == nullptr || json_fields::BeingDeleted(*found))
    return absl::OkStatus();  // on_delete releases
  const Json& claim = *found;
  const Json& meta = Field(claim, "metadata");
  const Json& spec = Field(claim, "spec");
  const Json status = LastStatus(claim);
  const std::string uid = Str(meta, "uid");
  const std::string owner = KubeClaimOwner(options_.ns);
  const absl::Time now = absl::Now();
  const Json& lifecycle = Field(spec, "lifecycle");

  // Lifecycle first: an expired claim is not (re)bound.
  const std::string shutdown = Str(lifecycle, "shutdownTime");
  if (!shutdown.empty()) {
    const absl::Time at = ParseRfc3339(shutdown, absl::InfiniteFuture());
    if (now >= at) {
      const std::string policy = Str(lifecycle, "shutdownPolicy");
      if (policy == "Delete" || policy == "DeleteForeground") {
        DeleteOptions o;
        o.propagation_policy = policy == "Delete" ? "Background" : "Foreground";
        absl::Status s = writes_->Run(WritePriority::kCleanup, [&] {
          return client_->Delete(kSandboxClaims, options_.ns, name, o);
        });
        return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
      }
      // Retain: the claim stays, its sandbox goes.
      allocator->Release(owner, uid, [](absl::Status) {});
      const std::string sandbox = Str(Field(status, "sandbox"), "name");
      if (!sandbox.empty()) {
        absl::Status s = writes_->Run(WritePriority::kCleanup, [&] {
          return client_->Delete(kSandboxes, options_.ns, sandbox, {});
        });
        if (!s.ok() && !absl::IsNotFound(s)) return s;
      }
      return NotReady(claim, "ClaimExpired", "the claim's shutdownTime has passed");
    }
    Enqueue(absl::StrCat("c/", name), at - now);
  }

  // Which sandbox: the one the allocator gave (durable), else the cold one named like the
  // claim, else a new choice.
  std::string sandbox;
  const char* launch_type = "warm";
  absl::StatusOr<store::ClaimRecord> have = allocator->GetClaim(owner, uid);
  if (have.ok()) {
    // An ended allocator claim (its sandbox died or finished) still shows what its Sandbox
    // says while that exists (Finished, and ttlSecondsAfterFinished runs from it).
    if (have->state != store::ClaimState::kActive &&
        sandboxes_->Get(options_.ns, have->sandbox_id) == nullptr) {
      return NotReady(claim, "SandboxMissing",
                      absl::StrCat("sandbox \"", have->sandbox_id, "\" is gone"));
    }
    sandbox = have->sandbox_id;
  } else if (ObjectPtr cold = sandboxes_->Get(options_.ns, name);
             cold != nullptr && ControllerUid(*cold) == uid) {
    sandbox = name;
    launch_type = "cold";
  } else if (!Str(Field(status, "sandbox"), "name").empty()) {
    // Bound before, and neither the allocator nor the cluster has it any more.
    return NotReady(
        claim, "SandboxMissing",
        absl::StrCat("sandbox \"", Str(Field(status, "sandbox"), "name"), "\" is gone"));
  }

  if (sandbox.empty()) {
    const std::string pool_name = Str(Field(spec, "warmPoolRef"), "name");
    ObjectPtr pool = pools_->Get(options_.ns, pool_name);
    if (pool == nullptr) {
      return NotReady(claim, "WarmPoolNotFound",
                      absl::StrCat("SandboxWarmPool \"", pool_name, "\" not found"));
    }
    const std::string template_name =
        Str(Field(Field(*pool, "spec"), "sandboxTemplateRef"), "name");
    ObjectPtr sandbox_template = templates_->Get(options_.ns, template_name);
    if (sandbox_template == nullptr) {
      return NotReady(claim, "TemplateNotFound",
                      absl::StrCat("SandboxTemplate \"", template_name, "\" not found"));
    }
    const Json& env = Field(spec, "env");
    const bool has_env = env.is_array() && !env.empty();
    if (has_env) {
      std::string policy = Str(Field(*sandbox_template, "spec"), "envVarsInjectionPolicy");
      if (policy.empty()) policy = "Disallowed";
      if (policy == "Disallowed") {
        return NotReady(claim, "EnvVarsInjectionRejected",
                        absl::StrCat("SandboxTemplate \"", template_name,
                                     "\" does not allow env in claims (envVarsInjectionPolicy: "
                                     "Disallowed)"));
      }
      if (policy == "Allowed") {  // new names only; Overrides may replace
        const Json& containers = Field(
            Field(Field(Field(*sandbox_template, "spec"), "podTemplate"), "spec"), "containers");
        for (const Json& e : env) {
          for (const Json& c : containers.is_array() ? containers : Json::array()) {
            for (const Json& have_env : Field(c, "env").is_array() ? c["env"] : Json::array()) {
              if (Str(have_env, "name") == Str(e, "name")) {
                return NotReady(claim, "EnvVarsInjectionRejected",
                                absl::StrCat("env \"", Str(e, "name"),
                                             "\" is set by the template; its "
                                             "envVarsInjectionPolicy Allowed forbids overriding"));
              }
            }
          }
        }
      }
    }
    const Json& vct = Field(spec, "volumeClaimTemplates");
    const bool has_vct = vct.is_array() && !vct.empty();
    if (has_vct) {
      std::string policy = Str(Field(*sandbox_template, "spec"), "volumeClaimTemplatesPolicy");
      if (policy.empty() || policy == "Disallowed") {
        return NotReady(claim, "InvalidMetadata",
                        absl::StrCat("SandboxTemplate \"", template_name,
                                     "\" does not allow volumeClaimTemplates in claims"));
      }
    }
    // Warm members run already: env or volumes of the claim's own need a new sandbox.
    bool warm_ok = !has_env && !has_vct;
    if (warm_ok) {
      allocator::ClaimRequest request;
      request.owner = owner;
      request.claim_id = uid;
      request.pool = pool_name;
      request.policy = store::EmptyPoolPolicy::kFail;
      absl::StatusOr<allocator::ClaimResult> got =
          WaitClaim([&](allocator::ClaimCallback cb) { allocator->Claim(request, std::move(cb)); });
      if (got.ok()) {
        sandbox = got->claim.sandbox_id;
      } else if (!absl::IsResourceExhausted(got.status()) && !absl::IsNotFound(got.status())) {
        return got.status();
      }
    }
    if (sandbox.empty()) {
      RETURN_IF_ERROR(CreateColdSandbox(claim, *sandbox_template));
      sandbox = name;
      launch_type = "cold";
    }
  }

  // Bound: the Sandbox belongs to the claim; status follows the Sandbox.
  if (std::string(launch_type) == "warm") {
    RETURN_IF_ERROR(BindSandbox(claim, sandbox, "warm"));
    RETURN_IF_ERROR(PatchPodMetadata(sandbox, Field(spec, "additionalPodMetadata")));
  }
  ObjectPtr sb = sandboxes_->Get(options_.ns, sandbox);
  Json next = status.is_object() ? status : Json::object();
  if (sb == nullptr) {
    if (std::string(launch_type) == "cold") {
      next["conditions"] = Json::array({Condition("Ready", false, "SandboxCreatePending",
                                                  "the sandbox is being created", next)});
      next["sandbox"] = {{"name", sandbox}};
      return WriteStatus(claim, std::move(next));
    }
    next["sandbox"] = {{"name", sandbox}};
  } else {
    const Json& sb_status = Field(*sb, "status");
    const Json* ready = json_fields::FindCondition(sb_status, "Ready");
    const bool is_ready = IsReady(sb_status);
    Json conditions = Json::array();
    conditions.push_back(Condition(
        "Ready", is_ready,
        ready != nullptr ? Str(*ready, "reason") : std::string("SandboxNotReady"),
        ready != nullptr ? Str(*ready, "message") : std::string("the sandbox is not ready yet"),
        next));
    if (const Json* finished = json_fields::FindCondition(sb_status, "Finished")) {
      conditions.push_back(*finished);
      // ttlSecondsAfterFinished: the claim goes that long after its sandbox finished.
      const Json& ttl = Field(lifecycle, "ttlSecondsAfterFinished");
      if (Str(*finished, "status") == "True" && ttl.is_number_integer()) {
        const absl::Time at = ParseRfc3339(Str(*finished, "lastTransitionTime"), now) +
                              absl::Seconds(ttl.get<int64_t>());
        if (now >= at) {
          absl::Status s = writes_->Run(WritePriority::kCleanup, [&] {
            return client_->Delete(kSandboxClaims, options_.ns, name, {});
          });
          return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
        }
        Enqueue(absl::StrCat("c/", name), at - now);
      }
    }
    next["conditions"] = std::move(conditions);
    next["sandbox"] = {{"name", sandbox}};
    if (Field(sb_status, "podIPs").is_array()) next["sandbox"]["podIPs"] = sb_status["podIPs"];
    const bool was_ready = [&] {
      const Json* c = json_fields::FindCondition(status, "Ready");
      return c != nullptr && Str(*c, "status") == "True";
    }();
    if (is_ready && !was_ready) {
      absl::Time seen = now;
      {
        absl::MutexLock lock(&mu_);
        if (auto it = first_seen_.find(uid); it != first_seen_.end()) seen = it->second;
      }
      const std::string asked =
          Str(Field(meta, "annotations"), "agents.x-k8s.io/client-first-requested-at");
      const absl::Time start =
          ParseRfc3339(asked.empty() ? Str(meta, "creationTimestamp") : asked, seen);
      ObjectPtr pool = pools_->Get(options_.ns, Str(Field(spec, "warmPoolRef"), "name"));
      const std::string template_name =
          pool ? Str(Field(Field(*pool, "spec"), "sandboxTemplateRef"), "name") : "";
      metrics_->Ready(launch_type, template_name, Str(Field(spec, "warmPoolRef"), "name"),
                      absl::ToDoubleMilliseconds(now - start),
                      absl::ToDoubleMilliseconds(now - seen));
    }
  }
  return WriteStatus(claim, std::move(next));
}

absl::Status ClaimController::ReconcileGrpc(const std::string& owner, const std::string& id) {
  allocator::Allocator* allocator = allocator_.load(std::memory_order_acquire);
  const std::string name = GrpcClaimName(owner, id);
  absl::StatusOr<store::ClaimRecord> c = allocator->GetClaim(owner, id);
  const bool active = c.ok() && c->state == store::ClaimState::kActive;
  ObjectPtr object = claims_.Get(options_.ns, name);
  if (!active) {
    if (object == nullptr) return absl::OkStatus();
    absl::Status s = writes_->Run(WritePriority::kCleanup, [&] {
      DeleteOptions o;
      o.propagation_policy = "Background";
      return client_->Delete(kSandboxClaims, options_.ns, name, o);
    });
    return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
  }
  Json claim;
  if (object != nullptr) {
    claim = *object;
  } else {
    Json fresh = {{"apiVersion", "extensions.agents.x-k8s.io/v1beta1"},
                  {"kind", "SandboxClaim"},
                  {"metadata",
                   {{"name", name},
                    {"namespace", options_.ns},
                    {"labels", {{"sbx.dev/source", "grpc"}}},
                    {"annotations",
                     {{kSbxOwnerAnnotation, owner},
                      {kSbxClaimIdAnnotation, id},
                      {kSandboxNameAnnotation, c->sandbox_id}}}}},
                  {"spec", {{"warmPoolRef", {{"name", c->pool}}}}}};
    absl::StatusOr<Json> created;
    RETURN_IF_ERROR(writes_->Run(WritePriority::kClaim, [&] {
      created = client_->Create(kSandboxClaims, options_.ns, fresh);
      if (absl::IsAlreadyExists(created.status())) {
        created = client_->Get(kSandboxClaims, options_.ns, name);  // ours, from a retry
      }
      return created.status();
    }));
    claim = *std::move(created);
  }
  // The object names the sandbox the allocator chose; it never changes.
  const std::string recorded =
      Str(Field(Field(claim, "metadata"), "annotations"), kSandboxNameAnnotation);
  if (recorded != c->sandbox_id) {
    return absl::InternalError(absl::StrCat("SandboxClaim \"", name, "\" names sandbox \"",
                                            recorded, "\", the allocator \"", c->sandbox_id,
                                            "\": not rebinding"));
  }
  RETURN_IF_ERROR(BindSandbox(claim, c->sandbox_id, "warm"));
  Json status = {{"conditions", Json::array({Condition("Ready", true, "DependenciesReady",
                                                       "claimed over gRPC", LastStatus(claim))})},
                 {"sandbox", {{"name", c->sandbox_id}}}};
  if (ObjectPtr sb = sandboxes_->Get(options_.ns, c->sandbox_id)) {
    const Json& ips = Field(Field(*sb, "status"), "podIPs");
    if (ips.is_array()) status["sandbox"]["podIPs"] = ips;
  }
  return WriteStatus(claim, std::move(status));
}

}  // namespace sbx::k8s
