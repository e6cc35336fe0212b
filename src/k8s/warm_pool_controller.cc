#include "src/k8s/warm_pool_controller.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {
namespace {

// Controller workers may wait for the allocator: they are not on the claim path.
using allocator::Wait;

// Work keys, with the allocator's pool names: "<pool>" is a full pass; "~<pool>" (after
// member changes) writes the status and looks for a surplus only when the counts say
// there may be one.
constexpr char kQuickPrefix[] = "~";

int64_t Replicas(const types::SandboxWarmPool& pool) {
  const std::optional<int64_t>& r = pool.spec.replicas;
  return r.has_value() ? std::max<int64_t>(0, *r) : 1;
}

// Demand sizing, opted into with annotations (never spec fields: the CRD stays
// upstream's). spec.replicas stays the floor the user asked for.
struct Sizing {
  store::PoolSizing sizing = store::PoolSizing::kStatic;
  int64_t ceiling = 0;  // sbx.dev/max-warm; 0: none given
};

// `warn`: log annotation values that cannot be read (the full pass does; the member-change
// fast path, which runs far more often, does not repeat it).
Sizing SizingOf(const types::SandboxWarmPool& pool, bool warn = false) {
  Sizing out;
  const std::string& mode = pool.metadata.Annotation(kSizingAnnotation);
  const std::string& ceiling = pool.metadata.Annotation(kMaxWarmAnnotation);
  const std::string& name = pool.metadata.Name();
  if (mode == "demand") {
    out.sizing = store::PoolSizing::kDemand;
  } else if (warn && !mode.empty() && mode != "static") {
    spdlog::warn(
        "SandboxWarmPool \"{}\": annotation {}=\"{}\" is not static or demand; sized static", name,
        kSizingAnnotation, mode);
  }
  if (!ceiling.empty() && (!absl::SimpleAtoi(ceiling, &out.ceiling) || out.ceiling < 0)) {
    if (warn) {
      spdlog::warn("SandboxWarmPool \"{}\": annotation {}=\"{}\" is not a count; ignored", name,
                   kMaxWarmAnnotation, ceiling);
    }
    out.ceiling = 0;
  }
  return out;
}

// How many members the controller keeps: spec.replicas, or for demand sizing the
// allocator's target (the refill retires warm surplus then; the controller only unready
// members beyond what the target still needs).
int64_t Desired(const types::SandboxWarmPool& pool, const allocator::PoolStatus& st) {
  if (SizingOf(pool).sizing == store::PoolSizing::kDemand) return std::max(st.target, st.warm);
  return Replicas(pool);
}

const std::string& Created(const types::ObjectMeta& meta) {
  static const std::string* const kNone = new std::string();
  return meta.creation_timestamp.has_value() ? *meta.creation_timestamp : *kNone;
}

// How long ago `object` was created; zero when its creationTimestamp cannot be read.
absl::Duration Age(const types::ObjectMeta& object, absl::Time now) {
  absl::Time created;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, Created(object), &created, &err)) {
    return absl::ZeroDuration();
  }
  return now - created;
}

}  // namespace

absl::Status WarmPoolControllerOptions::Validate() const {
  RETURN_IF_ERROR(namespaces.Validate("warm pool controller"));
  if (workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("warm pool controller workers ", workers, " must be at least 1"));
  }
  return absl::OkStatus();
}

WarmPoolController::WarmPoolController(Client* client, WriteScheduler* writes, Informer* sandboxes,
                                       WarmPoolControllerOptions options)
    : client_(client),
      writes_(writes),
      sandboxes_(sandboxes),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      registry_(options_.registry ? options_.registry : std::make_shared<prometheus::Registry>()),
      reconciles_(*registry_, kWarmPoolControllerName),
      queue_(WorkQueueOptions{.clock = clock_}),
      pools_(client, InformerOn(kSandboxWarmPools)),
      templates_(client, InformerOn(kSandboxTemplates)),
      typed_pools_(&pools_, &types::DecodeSandboxWarmPool),
      typed_members_(sandboxes, &types::DecodeSandbox) {
  InformerHandler pool_handler;
  pool_handler.on_add = [this](const ObjectPtr& o) { queue_.Add(options_.namespaces.Qualify(*o)); };
  pool_handler.on_update = [this](const ObjectPtr& old, const ObjectPtr& o) {
    // Our own status writes come back as updates: they need no full pass. (Metadata that
    // does not decode counts as a change: the full pass says why.)
    const absl::StatusOr<types::ObjectMeta> before = types::DecodeMetadataOf(*old);
    const absl::StatusOr<types::ObjectMeta> after = types::DecodeMetadataOf(*o);
    const bool changed = !before.ok() || !after.ok() || before->generation != after->generation ||
                         before->deletion_timestamp != after->deletion_timestamp ||
                         before->uid != after->uid;
    const std::string name = options_.namespaces.Qualify(*o);
    queue_.Add(changed ? name : absl::StrCat(kQuickPrefix, name));
  };
  pool_handler.on_delete = pool_handler.on_add;
  pools_.AddHandler(std::move(pool_handler));

  // A template change concerns the pools of its namespace that use it.
  auto template_changed = [this](const ObjectPtr& o) {
    absl::StatusOr<types::ObjectMeta> meta = types::DecodeMetadataOf(*o);
    if (!meta.ok()) {
      spdlog::warn("SandboxTemplate not looked at by the warm pool controller: {}",
                   meta.status().ToString());
      return;
    }
    for (const ObjectPtr& object : pools_.List()) {
      TypedCache<types::SandboxWarmPool>::Ptr pool = TypedOf(typed_pools_, object);
      if (pool != nullptr && pool->metadata.Namespace() == meta->Namespace() &&
          pool->spec.sandbox_template_ref.name == meta->name) {
        queue_.Add(options_.namespaces.Qualify(pool->metadata.Namespace(), pool->metadata.Name()));
      }
    }
  };
  InformerHandler template_handler;
  template_handler.on_add = template_changed;
  template_handler.on_update = [template_changed](const ObjectPtr&, const ObjectPtr& o) {
    template_changed(o);
  };
  template_handler.on_delete = template_changed;
  templates_.AddHandler(std::move(template_handler));

  InformerHandler member_handler;
  member_handler.on_add = [this](const ObjectPtr& o) { EnqueueMember(o, options_.coalesce); };
  member_handler.on_update = [this](const ObjectPtr&, const ObjectPtr& o) {
    EnqueueMember(o, options_.coalesce);
  };
  member_handler.on_delete = [this](const ObjectPtr& o) { EnqueueMember(o, options_.coalesce); };
  sandboxes_->AddHandler(std::move(member_handler));
}

WarmPoolController::~WarmPoolController() { Stop(); }

InformerOptions WarmPoolController::InformerOn(const Resource& resource) const {
  InformerOptions options = NamespaceInformer(resource, options_.namespaces.watch);
  options.clock = clock_;
  return options;
}

template <class T>
typename TypedCache<T>::Ptr WarmPoolController::TypedOf(const TypedCache<T>& cache,
                                                        const ObjectPtr& object) const {
  // The informer's key: "namespace/name" (object names have no '/').
  const std::string key = KeyOf(*object);
  const size_t slash = key.find('/');
  const NamespacedName where = slash == std::string::npos
                                   ? NamespacedName{"", key}
                                   : NamespacedName{key.substr(0, slash), key.substr(slash + 1)};
  absl::StatusOr<typename TypedCache<T>::Ptr> typed = cache.Get(where.ns, where.name);
  if (!typed.ok()) {
    // The API server validates these against their schemas: only a store that skips that
    // can hold one that does not decode. It is left alone until it changes.
    spdlog::warn("warm pool controller: {} left alone: {}", Namespaces::Path(where),
                 typed.status().ToString());
    return nullptr;
  }
  return *std::move(typed);
}

absl::Status WarmPoolController::DeleteMember(const types::Sandbox& judged) {
  // The member as this pass judged it: the delete holds only while the Sandbox is still
  // that version. One that changed since (a write that lands late, a deposed leader's
  // paused after its fence check, would otherwise delete a member the new leader bound)
  // fails 409 and is judged again at the next pass.
  const types::ObjectMeta& meta = judged.metadata;
  const NamespacedName where{meta.Namespace(), meta.Name()};
  absl::Status s = writes_->Run(WritePriority::kCleanup, [&] {
    DeleteOptions o;
    o.propagation_policy = "Background";
    o.precondition_uid = meta.Uid();
    o.precondition_resource_version = meta.resource_version.value_or("");
    return client_->Delete(kSandboxes, where.ns, where.name, o);
  });
  if (absl::IsAborted(s)) {
    // It changed since: the next pass judges it again.
    spdlog::debug("Sandbox \"{}\" changed before its delete: kept for the next pass ({})",
                  Namespaces::Path(where), std::string(s.message()));
    return absl::OkStatus();
  }
  return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
}

void WarmPoolController::EnqueueMember(const ObjectPtr& sandbox, absl::Duration delay) {
  // The event's metadata alone (cheap: no spec), at every member change.
  absl::StatusOr<types::ObjectMeta> meta = types::DecodeMetadataOf(*sandbox);
  if (!meta.ok()) return;  // not one of ours: sbx writes members' metadata well-formed
  const std::string& ns = meta->Namespace();
  if (!options_.namespaces.Serves(ns)) return;
  const std::string& pool = meta->Label(kSbxPoolLabel);
  // A member's change needs the pool's status and a surplus check, not a full pass.
  if (!pool.empty()) {
    queue_.AddAfter(absl::StrCat(kQuickPrefix, options_.namespaces.Qualify(ns, pool)), delay);
  }
}

absl::Status WarmPoolController::StartInformers(absl::Duration sync_timeout) {
  RETURN_IF_ERROR(options_.Validate());
  pools_.Start();
  templates_.Start();
  // A wait for the API server (I/O), not a timer: real time, whatever the clock.
  const absl::Time deadline = absl::Now() + sync_timeout;
  for (Informer* informer : {&pools_, &templates_}) {
    if (!informer->WaitForSync(deadline - absl::Now())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "warm pool controller: caches did not sync within ", absl::FormatDuration(sync_timeout),
          " (are the extensions.agents.x-k8s.io CRDs installed?)"));
    }
  }
  return absl::OkStatus();
}

void WarmPoolController::Start(allocator::Allocator* allocator, KubeRuntime* runtime) {
  allocator_ = allocator;
  runtime_ = runtime;
  // Pools the allocator remembers whose SandboxWarmPool is gone are looked at too.
  for (const store::PoolRecord& p : allocator_->ListPools()) queue_.Add(p.name);
  for (const ObjectPtr& pool : pools_.List()) queue_.Add(options_.namespaces.Qualify(*pool));
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(BackgroundThread("sbx-k8s-pools", [this] { Worker(); }));
  }
  resync_ = std::make_unique<PeriodicPass>("sbx-k8s-poolsy", options_.resync, *clock_, [this] {
    for (const ObjectPtr& pool : pools_.List()) queue_.Add(options_.namespaces.Qualify(*pool));
  });
}

void WarmPoolController::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  queue_.ShutDown();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
  if (resync_ != nullptr) resync_->Stop();
  pools_.Stop();
  templates_.Stop();
}

void WarmPoolController::Worker() {
  std::string name;
  while (queue_.Get(&name)) {
    reconciles_.SetDepth(queue_.Depth());
    absl::Status s = Reconcile(name);
    reconciles_.Reconciled(s.ok() ? ReconcileMetrics::Result::kSuccess
                                  : ReconcileMetrics::Result::kError);
    if (s.ok()) {
      queue_.Forget(name);
    } else {
      spdlog::warn("SandboxWarmPool \"{}\": {}", Namespaces::Path(options_.namespaces.Split(name)),
                   s.ToString());
      queue_.AddRateLimited(name);
    }
    queue_.Done(name);
  }
}

absl::Status WarmPoolController::NotDecoded(const NamespacedName& where,
                                            const absl::Status& status) {
  // The API server validates SandboxWarmPools against the CRD's schema: only a store that
  // skips that can hold one that does not decode. It waits for its next change.
  spdlog::warn("SandboxWarmPool \"{}\" not reconciled: {}", Namespaces::Path(where),
               status.ToString());
  return absl::OkStatus();
}

absl::Status WarmPoolController::Reconcile(const std::string& key) {
  if (options_.is_leader && !options_.is_leader()) return absl::OkStatus();
  if (key.rfind(kQuickPrefix, 0) == 0) {
    const std::string name = key.substr(1);
    const NamespacedName where = options_.namespaces.Split(name);
    absl::StatusOr<TypedCache<types::SandboxWarmPool>::Ptr> pool =
        typed_pools_.Get(where.ns, where.name);
    if (!pool.ok()) return NotDecoded(where, pool.status());
    absl::StatusOr<allocator::PoolStatus> st = allocator_->GetPoolStatus(name);
    if (*pool == nullptr || (*pool)->metadata.BeingDeleted() || !st.ok()) return absl::OkStatus();
    // Maybe a surplus, or members that nobody tracks (creates whose answers were lost):
    // the full pass decides (and writes the status). Members still labelled include the
    // claimed ones not yet bound, so the second count is an upper bound.
    const int64_t desired = Desired(**pool, *st);
    if (st->warm + runtime_->PendingIn(name) > desired ||
        static_cast<int64_t>(sandboxes_->ByLabel(kWarmPoolLabel, NameHash(where.name)).size()) >
            desired) {
      queue_.Add(name);
      return absl::OkStatus();
    }
    return WriteStatus(**pool);
  }
  const std::string& name = key;  // the allocator's
  const NamespacedName where = options_.namespaces.Split(name);
  absl::StatusOr<TypedCache<types::SandboxWarmPool>::Ptr> found =
      options_.namespaces.Serves(where.ns) ? typed_pools_.Get(where.ns, where.name)
                                           : TypedCache<types::SandboxWarmPool>::Ptr();
  if (!found.ok()) return NotDecoded(where, found.status());
  if (*found == nullptr || (*found)->metadata.BeingDeleted()) return RemovePool(name);
  const types::SandboxWarmPool& pool = **found;
  if (absl::Status valid = ValidateName("SandboxWarmPool name", where.name); !valid.ok()) {
    return absl::OkStatus();  // served by nobody; said once at the informer's add
  }
  const std::string template_name = pool.spec.sandbox_template_ref.name.value_or("");
  ObjectPtr sandbox_template = templates_.Get(where.ns, template_name);

  // The allocator's template names the SandboxTemplate; its pool follows spec.replicas.
  store::TemplateRecord t;
  t.name = name;
  t.runtime = "kubernetes";
  t.spec = template_name;
  absl::StatusOr<store::TemplateRecord> have_t = allocator_->GetTemplate(name);
  if (!have_t.ok() || have_t->runtime != t.runtime || have_t->spec != t.spec) {
    RETURN_IF_ERROR(
        Wait([&](allocator::StatusCallback cb) { allocator_->PutTemplate(t, std::move(cb)); }));
  }
  store::PoolRecord p;
  p.name = name;
  p.template_name = name;
  // No member can come while the template is missing: the target is zero until it does.
  const int64_t replicas = sandbox_template == nullptr ? 0 : Replicas(pool);
  p.min_warm = p.max_warm = static_cast<int32_t>(std::min<int64_t>(replicas, 1 << 30));
  const Sizing sizing = SizingOf(pool, /*warn=*/true);
  p.sizing = sizing.sizing;
  if (sizing.sizing == store::PoolSizing::kDemand && sandbox_template != nullptr) {
    // The ceiling: sbx.dev/max-warm, never below the floor nor above the allocator's limit.
    p.max_warm = static_cast<int32_t>(std::clamp<int64_t>(
        sizing.ceiling, p.min_warm, std::max<int64_t>(p.min_warm, allocator_->max_pool_warm())));
  }
  p.empty_pool_policy = store::EmptyPoolPolicy::kFail;
  absl::StatusOr<store::PoolRecord> have_p = allocator_->GetPool(name);
  if (have_p.ok()) p.selection_policy = have_p->selection_policy;
  // The selection policy comes from an annotation: the CRD stays upstream's. Without it
  // the pool keeps the policy it has (fifo, or what an admin set over gRPC).
  const std::string& policy = pool.metadata.Annotation(kSelectionPolicyAnnotation);
  if (allocator::IsSelectionPolicy(policy) && !policy.empty()) {
    p.selection_policy = policy;
  } else if (!policy.empty()) {
    spdlog::warn(
        "SandboxWarmPool \"{}\": annotation {}: \"{}\" is not a selection policy "
        "(known: {}); the pool keeps \"{}\"",
        Namespaces::Path(where), kSelectionPolicyAnnotation, policy,
        std::string(allocator::KnownSelectionPolicies()), p.selection_policy);
  }
  if (!have_p.ok() || have_p->template_name != p.template_name || have_p->min_warm != p.min_warm ||
      have_p->max_warm != p.max_warm || have_p->empty_pool_policy != p.empty_pool_policy ||
      have_p->sizing != p.sizing || have_p->selection_policy != p.selection_policy) {
    if (have_p.ok()) {  // keep what an admin set over gRPC besides the target
      store::PoolRecord merged = *have_p;
      merged.template_name = p.template_name;
      merged.min_warm = p.min_warm;
      merged.max_warm = p.max_warm;
      merged.empty_pool_policy = p.empty_pool_policy;
      merged.sizing = p.sizing;
      merged.selection_policy = p.selection_policy;
      p = merged;
    }
    RETURN_IF_ERROR(
        Wait([&](allocator::StatusCallback cb) { allocator_->PutPool(p, std::move(cb)); }));
  }
  if (sandbox_template != nullptr) RETURN_IF_ERROR(TrimMembers(pool, *sandbox_template));
  return WriteStatus(pool);
}

absl::Status WarmPoolController::RemovePool(const std::string& name) {
  absl::StatusOr<store::TemplateRecord> t = allocator_->GetTemplate(name);
  if (!t.ok() || t->runtime != "kubernetes") return absl::OkStatus();  // not one of ours
  if (allocator_->GetPool(name).ok()) {
    absl::Status s =
        Wait([&](allocator::StatusCallback cb) { allocator_->DeletePool(name, std::move(cb)); });
    // Claims still hold sandboxes of it: the pool stays until they end.
    if (absl::IsFailedPrecondition(s)) {
      queue_.AddAfter(name, absl::Seconds(5));
      return absl::OkStatus();
    }
    if (!s.ok() && !absl::IsNotFound(s)) return s;
  }
  absl::Status s =
      Wait([&](allocator::StatusCallback cb) { allocator_->DeleteTemplate(name, std::move(cb)); });
  if (!s.ok() && !absl::IsNotFound(s)) return s;
  spdlog::info("SandboxWarmPool \"{}\" is gone: its allocator pool is removed",
               Namespaces::Path(options_.namespaces.Split(name)));
  return absl::OkStatus();
}

absl::Status WarmPoolController::TrimMembers(const types::SandboxWarmPool& pool,
                                             const Json& sandbox_template) {
  const std::string& ns = pool.metadata.Namespace();
  const std::string& object_name = pool.metadata.Name();
  const std::string name = options_.namespaces.Qualify(ns, object_name);  // the allocator's
  const std::string hash = NameHash(object_name);
  const std::string spec_hash = TemplateSpecHash(sandbox_template);
  const bool recreate = pool.spec.update_strategy.type == "Recreate";
  // The warm count first, then the tracked ids: a member that turns warm in between is
  // counted once (as tracked), never as warm and unready both.
  absl::StatusOr<allocator::PoolStatus> st = allocator_->GetPoolStatus(name);
  if (!st.ok()) return absl::OkStatus();
  int64_t warm_count = st->warm;
  absl::flat_hash_set<std::string> tracked;
  for (std::string& id : allocator_->ListSandboxIds()) tracked.insert(std::move(id));
  if (options_.after_tracked_snapshot) options_.after_tracked_snapshot();

  // Members: still labelled as the pool's (a claimed one loses the label when bound).
  using Member = TypedCache<types::Sandbox>::Ptr;
  std::vector<Member> unready, warm;
  std::vector<std::pair<Member, absl::Duration>> maybe_untracked;  // member, age
  const absl::Time now = clock_->Now();
  for (const ObjectPtr& object : sandboxes_->ByLabel(kWarmPoolLabel, hash)) {
    Member member = TypedOf(typed_members_, object);
    if (member == nullptr) continue;  // gone since, or left alone (logged)
    const types::ObjectMeta& meta = member->metadata;
    if (meta.Namespace() != ns || meta.BeingDeleted()) continue;
    if (meta.Label(kWarmPoolLabel) != hash || meta.Label(kSbxPoolLabel) != object_name) continue;
    const std::string id = options_.namespaces.Qualify(ns, meta.Name());
    if (tracked.contains(id)) {
      warm.push_back(member);  // warm, or claimed and not yet bound
    } else if (runtime_->IsPending(id)) {
      unready.push_back(member);
    } else {
      maybe_untracked.emplace_back(member, Age(meta, now));
    }
  }
  // Neither tracked nor pending may still be in passage: its create has not answered yet,
  // or it has just turned warm after the snapshot above. Not counted: counting it twice
  // would delete a member the pool needs; missing it at most leaves a surplus for the next
  // pass. It is nobody's when, asked in this order, no create of the pool is in flight
  // (or it is older than orphan_grace), the runtime does not have it in passage, and the
  // allocator does not track it now. (Waiting out orphan_grace alone kept the members of
  // creates whose answers faults lost for 30 s after the faults: issue 23. Taking the
  // first snapshot for the answer deleted members that turned warm during the pass.)
  const bool creates_in_flight = runtime_->CreatesInFlight(name) > 0;
  auto id_of = [this](const Member& m) {
    return options_.namespaces.Qualify(m->metadata.Namespace(), m->metadata.Name());
  };
  std::vector<Member> untracked;
  for (auto& [member, age] : maybe_untracked) {
    if ((creates_in_flight && age < options_.orphan_grace) || runtime_->InPassage(id_of(member))) {
      continue;
    }
    untracked.push_back(std::move(member));
  }
  if (!untracked.empty()) {
    tracked.clear();
    for (std::string& id : allocator_->ListSandboxIds()) tracked.insert(std::move(id));
  }
  for (const Member& member : untracked) {
    const std::string id = id_of(member);
    if (tracked.contains(id)) continue;
    spdlog::info("Sandbox \"{}\" of pool \"{}\" is tracked by nobody: deleting it",
                 Namespaces::Path(options_.namespaces.Split(id)), name);
    RETURN_IF_ERROR(DeleteMember(*member));
  }
  // Newest first (by creationTimestamp, then name), keys read once per member.
  auto newest_first = [](std::vector<Member>* members) {
    std::vector<std::pair<std::string, Member>> keyed;
    keyed.reserve(members->size());
    for (Member& m : *members) {
      keyed.emplace_back(absl::StrCat(Created(m->metadata), " ", m->metadata.Name()), std::move(m));
    }
    std::sort(keyed.begin(), keyed.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    members->clear();
    for (auto& [key, m] : keyed) members->push_back(std::move(m));
  };
  newest_first(&unready);
  newest_first(&warm);

  auto delete_unready = [&](const Member& member) { return DeleteMember(*member); };
  // Stale members (Recreate): replaced at once; the reconciler makes new ones.
  if (recreate) {
    for (auto* list : {&unready, &warm}) {
      std::vector<Member> keep;
      for (const Member& m : *list) {
        if (m->metadata.Label(kSbxTemplateHashLabel) == spec_hash) {
          keep.push_back(m);
          continue;
        }
        if (list == &unready) {
          RETURN_IF_ERROR(delete_unready(m));
        } else if (allocator_->RetireWarm(id_of(m)).ok()) {
          --warm_count;
        } else {
          keep.push_back(m);  // claimed meanwhile: it is the claim's now
        }
      }
      *list = std::move(keep);
    }
  }
  // Scale-down: unready members first, then the newest warm ones.
  int64_t surplus = warm_count + static_cast<int64_t>(unready.size()) - Desired(pool, *st);
  for (const Member& m : unready) {
    if (surplus <= 0) break;
    RETURN_IF_ERROR(delete_unready(m));
    --surplus;
  }
  for (const Member& m : warm) {
    if (surplus <= 0) break;
    if (allocator_->RetireWarm(id_of(m)).ok()) --surplus;
  }
  return absl::OkStatus();
}

absl::Status WarmPoolController::WriteStatus(const types::SandboxWarmPool& pool) {
  const types::ObjectMeta& meta = pool.metadata;
  const std::string& object_name = meta.Name();
  const std::string name = options_.namespaces.Qualify(meta.Namespace(), object_name);
  absl::StatusOr<allocator::PoolStatus> st = allocator_->GetPoolStatus(name);
  // Counts, not a scan of the members: ready ones are the allocator's warm sandboxes, the
  // others the runtime's creates that wait for Ready.
  const int64_t ready = st.ok() ? st->warm : 0;
  types::SandboxWarmPoolStatus status;
  status.replicas = ready + runtime_->PendingIn(name);
  status.ready_replicas = ready;
  status.selector = absl::StrCat(kWarmPoolLabel, "=", NameHash(object_name));
  status.observed_generation = meta.generation;
  // Written only when a field it sets differs (fields it leaves out are not compared).
  const types::SandboxWarmPoolStatus& old = pool.status;
  const bool same = old.present && old.replicas == status.replicas &&
                    old.ready_replicas == status.ready_replicas &&
                    old.selector == status.selector &&
                    (!status.observed_generation.has_value() ||
                     old.observed_generation == status.observed_generation);
  if (same) return absl::OkStatus();
  absl::Status s =
      client_->PatchNoResult(kSandboxWarmPools, meta.Namespace(), object_name, PatchType::kMerge,
                             Json{{"status", types::Encode(status)}}, "status");
  return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
}

}  // namespace sbx::k8s
