#pragma once
// The allocator's implementation class, shared by its rooms (the way RocksDB splits
// DBImpl): allocator.cc (creation, options, renewals), claim_batch.cc (ClaimBatch and
// waiting batches), recovery.cc (Recover); the claim table is claim_table.h. Internal to
// sbx::allocator: nothing outside src/allocator/ includes it (allocator.h is the
// interface).

#include "src/allocator/allocator.h"

#include <pthread.h>

#include <algorithm>
#include <bit>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "src/allocator/claim_table.h"
#include "src/allocator/pool.h"
#include "src/allocator/ready_set.h"
#include "src/allocator/timer_queue.h"
#include "src/allocator/watch_hub.h"
#include "src/common/status_macros.h"

namespace sbx::allocator {

using store::ClaimRecord;
using store::ClaimState;
using store::EmptyPoolPolicy;
using store::LaunchType;

// One claim, from the moment it is requested until it is purged. Its key and pool never
// change; everything else is guarded by `mu`.
struct ClaimEntry {
  ClaimEntry(std::string key_in, Pool* pool_in) : key(std::move(key_in)), pool(pool_in) {}

  enum class Phase : uint8_t {
    kCommitting,  // waiting for a sandbox or for its record to become durable
    kActive,      // durable and holding its sandbox
    kUpdating,    // a renewal, suspension or resumption is in flight
    kEnding,      // a release / expiry / loss is being committed
    kEnded,       // ended durably; kept for the idempotency window
  };

  // "<owner>/<claim id>": claims are scoped by tenant. Also the record's store key.
  const std::string key;
  Pool* const pool;

  absl::Mutex mu;
  Phase phase ABSL_GUARDED_BY(mu) = Phase::kCommitting;
  // Set once a sandbox is given to the claim / once it has failed: whichever comes first
  // wins (deadline vs. delivery).
  bool assigned ABSL_GUARDED_BY(mu) = false;
  bool failed ABSL_GUARDED_BY(mu) = false;
  // sandbox_id and endpoint are empty here while `sandbox` is set (see RecordLocked).
  ClaimRecord record ABSL_GUARDED_BY(mu);
  // Where the sandbox is reached since a Resume brought it back elsewhere (a Kubernetes
  // sandbox's new pod); empty while it is where it was made.
  std::string moved_endpoint ABSL_GUARDED_BY(mu);
  // The sandbox held (kept after the claim ends, until the entry is purged).
  SandboxPtr sandbox ABSL_GUARDED_BY(mu);
  // The original caller first, then retries that arrived while committing; each with
  // whether its answer counts as a replay.
  std::vector<std::pair<ClaimCallback, bool>> callbacks ABSL_GUARDED_BY(mu);
  // While waiting in the pool's queue (policy WAIT).
  // Calls waiting for this claim that may still give up (the first and joined retries);
  // the wait ends CANCELLED when the last one does.
  int calls ABSL_GUARDED_BY(mu) = 1;
  WaiterPtr waiter ABSL_GUARDED_BY(mu);
  TimerHandle expiry ABSL_GUARDED_BY(mu);
  // How the claim gets its sandbox, for the pool's counters.
  ClaimPath path ABSL_GUARDED_BY(mu) = ClaimPath::kWarm;
  // Releases that arrived while the claim's end was being committed: answered with the
  // ended record once it is durable.
  std::vector<EndedCallback> end_waiters ABSL_GUARDED_BY(mu);
};

namespace internal {

using EntryPtr = std::shared_ptr<ClaimEntry>;

using store::ClaimKey;

inline const char* EndedVerb(ClaimState s) {
  switch (s) {
    case ClaimState::kReleased:
      return "was released";
    case ClaimState::kExpired:
      return "expired";
    case ClaimState::kLost:
      return "was lost (its sandbox is gone)";
    case ClaimState::kActive:
      break;
  }
  return "is ending";
}

inline ClaimEventPtr MakeEvent(ClaimEvent::Type type, ClaimRecord claim) {
  auto e = std::make_shared<ClaimEvent>();
  e->type = type;
  e->revision = claim.revision;
  e->claim = std::move(claim);
  return e;
}

// A batch (policy WAIT or COLD) waiting for the sandboxes it did not find warm: each
// missing one is a waiter in the pool's FIFO queue, so the pool's target grows by them.
// Granted when the last one comes; at the deadline a BEST_EFFORT batch is granted what it
// holds (if anything), otherwise everything held goes back to the pool.
struct BatchWait {
  BatchWait(BatchRequest r, Pool* p, absl::Duration t, BatchCallback d)
      : req(std::move(r)), pool(p), ttl(t), done(std::move(d)) {}
  const BatchRequest req;
  Pool* const pool;
  const absl::Duration ttl;
  absl::Mutex mu;
  BatchCallback done ABSL_GUARDED_BY(mu);
  std::vector<SandboxPtr> taken ABSL_GUARDED_BY(mu);
  std::vector<WaiterPtr> waiters ABSL_GUARDED_BY(mu);
  // Granted, failed or given up: sandboxes delivered from now on go back to the pool.
  bool finished ABSL_GUARDED_BY(mu) = false;
};
using BatchWaitPtr = std::shared_ptr<BatchWait>;

// What a timer does when it fires. Stored in the timer queue by value: no allocation.
struct TimerTask {
  enum class Kind : uint8_t {
    kExpire,         // the claim's TTL passed
    kPurge,          // the idempotency window of an ended claim closed
    kWaitDeadline,   // a WAIT claim waited long enough
    kColdDeadline,   // a COLD claim's sandbox took too long
    kBatchDeadline,  // a waiting batch waited long enough (`batch`, not `entry`)
  };
  Kind kind;
  EntryPtr entry;
  BatchWaitPtr batch;
};

// The claim table (claim_table.h): entries by their key "<owner>/<claim id>".
using ClaimTable = ShardedTable<ClaimEntry, &ClaimEntry::key>;

class AllocatorImpl final : public Allocator {
 public:
  AllocatorImpl(AllocatorOptions options, store::Store* store, runtime::Runtime* runtime,
                Reconciler* reconciler, Clock* clock, IdGenerator* ids)
      : options_(std::move(options)),
        store_(store),
        runtime_(runtime),
        reconciler_(reconciler),
        clock_(clock),
        ids_(ids),
        claims_(options_.claim_shards) {}

  ~AllocatorImpl() override {
    if (hub_ != nullptr) hub_->Close(absl::UnavailableError("the allocator is shutting down"));
    {
      absl::MutexLock lock(&timer_mu_);
      stopping_ = true;
      timer_wake_ = true;
    }
    if (timer_thread_.joinable()) timer_thread_.join();
    // Claims still waiting for a sandbox are answered, so that no caller hangs.
    claims_.ForEach([&](const EntryPtr& e) {
      bool waiting;
      {
        absl::MutexLock lock(&e->mu);
        waiting = e->phase == ClaimEntry::Phase::kCommitting && !e->assigned;
      }
      if (waiting) FailEntry(e, absl::CancelledError("the allocator is shutting down"));
    });
  }

  absl::Status Recover();
  void StartTimerThread() {
    if (options_.timer_thread) {
      timer_thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "sbx-timer");
        TimerLoop();
      });
    }
  }

  const RecoveryStats& recovery() const override { return recovery_; }
  int max_batch() const override { return options_.max_batch; }
  int max_pool_warm() const override { return options_.max_pool_warm; }
  const std::string& default_namespace() const override { return options_.default_namespace; }

  // A pool or template name: qualified (ids.h), and its one spelling.
  absl::Status ValidatePoolName(absl::string_view what, absl::string_view name) const {
    // On every claim: checks without building the canonical name.
    RETURN_IF_ERROR(ValidateQualifiedName(what, name));
    const size_t slash = name.find('/');
    if (slash != absl::string_view::npos && name.substr(0, slash) == options_.default_namespace) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " \"", name, "\" is named \"", name.substr(slash + 1),
          "\" (the default namespace, \"", options_.default_namespace, "\", is not spelled out)"));
    }
    return absl::OkStatus();
  }

  // ---- Admin ----

  void PutTemplate(store::TemplateRecord t, StatusCallback done) override {
    if (absl::Status s = ValidatePoolName("template name", t.name); !s.ok()) {
      return std::move(done)(s);
    }
    if (t.runtime != "local" && t.runtime != "kubernetes") {
      return std::move(done)(absl::InvalidArgumentError(
          absl::StrCat("template \"", t.name, "\": runtime \"", t.runtime,
                       "\" is not one of local, kubernetes")));
    }
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = templates_.find(t.name);
      t.generation = it == templates_.end() ? 1 : it->second.generation + 1;
    }
    store::WriteBatch batch;
    batch.Put(t);
    store_->Commit(std::move(batch), [this, t, done = std::move(done)](absl::Status s) mutable {
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        templates_[t.name] = t;
      }
      std::move(done)(s);
    });
  }

  absl::StatusOr<store::TemplateRecord> GetTemplate(const std::string& name) const override {
    absl::ReaderMutexLock lock(&mu_);
    auto it = templates_.find(name);
    if (it == templates_.end()) {
      return absl::NotFoundError(absl::StrCat("template \"", name, "\" not found"));
    }
    return it->second;
  }

  std::vector<store::TemplateRecord> ListTemplates() const override {
    absl::ReaderMutexLock lock(&mu_);
    std::vector<store::TemplateRecord> out;
    for (const auto& [_, t] : templates_) out.push_back(t);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
    return out;
  }

  void DeleteTemplate(const std::string& name, StatusCallback done) override {
    absl::Status refused;
    {
      absl::ReaderMutexLock lock(&mu_);
      if (!templates_.contains(name)) {
        refused = absl::NotFoundError(absl::StrCat("template \"", name, "\" not found"));
      }
      for (const auto& [pname, pool] : pools_) {
        if (refused.ok() && pool->settings().template_name == name) {
          refused = absl::FailedPreconditionError(
              absl::StrCat("template \"", name, "\" is used by pool \"", pname, "\""));
        }
      }
    }
    // Callbacks never run under a lock: they may call back into the allocator.
    if (!refused.ok()) return std::move(done)(refused);
    store::WriteBatch batch;
    batch.DeleteTemplate(name);
    store_->Commit(std::move(batch), [this, name, done = std::move(done)](absl::Status s) mutable {
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        templates_.erase(name);
      }
      std::move(done)(s);
    });
  }

  void PutPool(store::PoolRecord p, StatusCallback done) override {
    if (absl::Status s = ValidatePool(p); !s.ok()) return std::move(done)(s);
    Pool* existing = nullptr;
    bool have_template;
    {
      absl::ReaderMutexLock lock(&mu_);
      have_template = templates_.contains(p.template_name);
      existing = FindPoolLocked(p.name);
    }
    if (!have_template) {
      return std::move(done)(absl::NotFoundError(
          absl::StrCat("pool \"", p.name, "\": template \"", p.template_name, "\" not found")));
    }
    p.generation = existing == nullptr ? 1 : existing->settings().generation + 1;
    store::WriteBatch batch;
    batch.Put(p);
    store_->Commit(std::move(batch), [this, p, done = std::move(done)](absl::Status s) mutable {
      if (s.ok()) {
        Pool* pool = nullptr;
        {
          absl::MutexLock lock(&mu_);
          pool = FindPoolLocked(p.name);
          if (pool != nullptr) {
            pool->set_settings(p);
          } else {
            pool = AddPoolLocked(p);
          }
        }
        if (pool->warm() < pool->Target()) reconciler_->PoolBelowTarget(p.name);
      }
      std::move(done)(s);
    });
  }

  absl::StatusOr<PoolStatus> GetPoolStatus(const std::string& name) const override {
    ASSIGN_OR_RETURN(Pool * pool, FindPool(name));
    store::PoolRecord settings = pool->settings();
    PoolStatus st;
    st.name = name;
    st.warm = pool->warm();
    st.claimed = pool->claimed();
    st.waiting = pool->waiting();
    st.target = pool->Target();
    st.min_warm = settings.min_warm;
    st.max_warm = settings.max_warm;
    st.counts = pool->counters().Snapshot();
    return st;
  }

  absl::StatusOr<store::PoolRecord> GetPool(const std::string& name) const override {
    ASSIGN_OR_RETURN(Pool * pool, FindPool(name));
    return pool->settings();
  }

  std::vector<store::PoolRecord> ListPools() const override {
    absl::ReaderMutexLock lock(&mu_);
    std::vector<store::PoolRecord> out;
    for (const auto& [_, p] : pools_) out.push_back(p->settings());
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
    return out;
  }

  void DeletePool(const std::string& name, StatusCallback done) override {
    Pool* pool = nullptr;
    absl::Status refused;
    {
      absl::MutexLock lock(&mu_);
      pool = FindPoolLocked(name);
      if (pool == nullptr) {
        refused = absl::NotFoundError(absl::StrCat("pool \"", name, "\" not found"));
      } else if (pool->claimed() > 0 || pool->waiting() > 0) {
        refused = absl::FailedPreconditionError(
            absl::StrCat("pool \"", name, "\" has ", pool->claimed(), " active and ",
                         pool->waiting(), " waiting claims; release them first"));
      } else {
        // Unlisted at once so that no new claim finds it; the object stays alive
        // (retired_pools_) because sandboxes point to it.
        retired_pools_.push_back(std::move(pools_[name]));
        pools_.erase(name);
      }
    }
    if (!refused.ok()) return std::move(done)(refused);
    store::WriteBatch batch;
    batch.DeletePool(name);
    std::vector<store::SandboxRecord> retired;
    while (SandboxPtr sb = pool->TryTake()) {
      sb->Transition(SandboxState::kClaimed, SandboxState::kRetired);
      batch.DeleteSandbox(sb->id);
      retired.push_back(RecordOf(*sb));
      ForgetSandbox(sb->id);
    }
    store_->Commit(std::move(batch), [this, retired = std::move(retired),
                                      done = std::move(done)](absl::Status s) mutable {
      for (const auto& r : retired) reconciler_->RetireSandbox(r);
      std::move(done)(s);
    });
  }

  // ---- Runtime side ----

  absl::Status AddSandbox(const runtime::SandboxInfo& info) override {
    if (info.id.empty()) return absl::InvalidArgumentError("sandbox id is empty");
    Pool* pool = nullptr;
    {
      absl::ReaderMutexLock lock(&mu_);
      pool = FindPoolLocked(info.pool);
    }
    auto sb = std::make_shared<Sandbox>(info.id, info.endpoint, info.node, pool, clock_->Now(),
                                        SandboxState::kWarm);
    if (pool == nullptr) {
      reconciler_->RetireSandbox(RecordOf(*sb, info.pool));
      return absl::NotFoundError(
          absl::StrCat("sandbox \"", info.id, "\": pool \"", info.pool, "\" not found"));
    }
    {
      absl::MutexLock lock(&sandboxes_mu_);
      if (!sandboxes_.insert(sb).second) {
        return absl::AlreadyExistsError(absl::StrCat("sandbox \"", info.id, "\" is known already"));
      }
    }
    // The record is written in the background: the runtime, not the store, is the truth
    // for existence, and a claim's own record carries the sandbox it holds.
    store::WriteBatch batch;
    batch.Put(RecordOf(*sb));
    store_->Commit(std::move(batch), [id = info.id](absl::Status s) {
      if (!s.ok()) spdlog::warn("sandbox \"{}\": its record was not stored: {}", id, s.ToString());
    });
    pool->AddWarm(std::move(sb));
    return absl::OkStatus();
  }

  absl::Status SandboxGone(const std::string& id) override {
    SandboxPtr sb = FindSandbox(id);
    if (sb == nullptr) return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" not known"));
    sb->gone.store(true, std::memory_order_seq_cst);
    if (sb->pool->MarkDeadIfWarm(sb)) {
      ForgetSandbox(id);
      store::WriteBatch batch;
      batch.DeleteSandbox(id);
      store_->Commit(std::move(batch), [](absl::Status) {});
      reconciler_->PoolBelowTarget(sb->pool->name());
      return absl::OkStatus();
    }
    EntryPtr e;
    {
      absl::MutexLock lock(&sb->mu);
      e = sb->claim.lock();
    }
    // No entry yet means a claim is between taking it and committing: that claim sees
    // `gone` when it activates and ends itself as lost.
    if (e != nullptr) {
      bool active;
      {
        absl::MutexLock lock(&e->mu);
        active = e->phase == ClaimEntry::Phase::kActive;
      }
      if (active) EndClaim(e, ClaimState::kLost, [](absl::StatusOr<ClaimRecord>) {});
    }
    return absl::OkStatus();
  }

  absl::Status RetireWarm(const std::string& id) override {
    SandboxPtr sb = FindSandbox(id);
    if (sb == nullptr) return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" not known"));
    if (!sb->pool->MarkDeadIfWarm(sb)) {
      return absl::FailedPreconditionError(
          absl::StrCat("sandbox \"", id, "\" is not warm (a claim holds it)"));
    }
    ForgetSandbox(id);
    store::WriteBatch batch;
    batch.DeleteSandbox(id);
    store_->Commit(std::move(batch), [](absl::Status) {});
    reconciler_->RetireSandbox(RecordOf(*sb));
    reconciler_->PoolBelowTarget(sb->pool->name());
    return absl::OkStatus();
  }

  std::vector<std::string> ListSandboxIds() const override {
    absl::MutexLock lock(&sandboxes_mu_);
    std::vector<std::string> ids;
    ids.reserve(sandboxes_.size());
    for (const SandboxPtr& sb : sandboxes_) ids.push_back(sb->id);
    return ids;
  }

  // ---- Claims ----

  void Claim(ClaimRequest req, ClaimCallback done) override {
    if (req.claim_id.empty()) req.claim_id = ids_->Next();
    if (absl::Status s = ValidateClaimRequest(req); !s.ok()) return std::move(done)(s);
    absl::StatusOr<Pool*> pool_or = FindPool(req.pool);
    if (!pool_or.ok()) return std::move(done)(pool_or.status());
    Pool* pool = *pool_or;
    const store::PoolRecord settings = pool->settings();
    absl::StatusOr<absl::Duration> ttl = EffectiveTtl(settings, req.ttl);
    if (!ttl.ok()) return std::move(done)(ttl.status());

    auto entry = std::make_shared<ClaimEntry>(ClaimKey(req.owner, req.claim_id), pool);
    {
      absl::MutexLock lock(&entry->mu);
      ClaimRecord& r = entry->record;
      r.id = std::move(req.claim_id);
      r.owner = std::move(req.owner);
      r.pool = std::move(req.pool);
      r.labels = std::move(req.labels);
      r.created = clock_->Now();
      // Expiry counts from the request; InfiniteFuture when the claim has no TTL.
      r.expires = *ttl == absl::ZeroDuration() ? absl::InfiniteFuture() : r.created + *ttl;
      entry->callbacks.emplace_back(std::move(done), false);
    }
    auto [existing, inserted] = claims_.Insert(entry);
    if (!inserted) {
      ClaimCallback cb;
      {
        absl::MutexLock lock(&entry->mu);
        cb = std::move(entry->callbacks.front().first);
      }
      return AnswerExisting(existing, pool, std::move(cb), req.cancellation);
    }

    const std::function<void(const SandboxPtr&)>* hook =
        options_.after_pop ? &options_.after_pop : nullptr;
    if (SandboxPtr sb = pool->TryTake(hook)) {
      {
        absl::MutexLock lock(&entry->mu);
        entry->assigned = true;
      }
      CommitClaim(entry, std::move(sb), LaunchType::kWarm, false);
      if (pool->warm() < pool->min_warm()) reconciler_->PoolBelowTarget(pool->name());
      return;
    }

    const EmptyPoolPolicy policy = req.policy.value_or(settings.empty_pool_policy);
    const absl::Duration wait = req.wait > absl::ZeroDuration() ? req.wait : settings.default_wait;
    reconciler_->PoolBelowTarget(pool->name());
    pool->counters().CountExhausted();
    {
      absl::MutexLock lock(&entry->mu);
      entry->path = policy == EmptyPoolPolicy::kWait   ? ClaimPath::kWait
                    : policy == EmptyPoolPolicy::kCold ? ClaimPath::kCold
                                                       : ClaimPath::kNone;
    }
    switch (policy) {
      case EmptyPoolPolicy::kFail:
        FailEntry(entry,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "pool \"", pool->name(), "\" has no warm sandbox (target ", pool->Target(),
                      "); retry after about 1s, or claim with policy WAIT or COLD")));
        return;
      case EmptyPoolPolicy::kWait:
        Wait(entry, wait);
        if (req.cancellation) {
          req.cancellation->OnCancel([this, entry] { CallGaveUp(entry); });
        }
        return;
      case EmptyPoolPolicy::kCold:
        return ColdStart(entry, settings, wait);
    }
  }

  void ClaimBatch(BatchRequest req, BatchCallback done) override;
  // The rest of ClaimBatch once `taken` holds the batch's sandboxes (already kClaimed,
  // between 1 and req.count): new claims, one commit.
  void GrantBatch(const BatchRequest& req, Pool* pool, absl::Duration ttl,
                  std::vector<SandboxPtr> taken, BatchCallback done);
  void WaitForBatch(BatchRequest req, Pool* pool, absl::Duration ttl, std::vector<SandboxPtr> taken,
                    absl::Duration wait, BatchCallback done);
  void DeliverToBatch(const BatchWaitPtr& w, SandboxPtr sb);
  void BatchDeadline(const BatchWaitPtr& w);
  // Ends a waiting batch that is not granted yet: BEST_EFFORT with `grant_best_effort` is
  // granted what it holds (if anything); otherwise all goes back and `status` answers.
  void GiveUpBatch(const BatchWaitPtr& w, absl::Status status, bool grant_best_effort);

  void Release(const std::string& owner, const std::string& claim_id, EndedCallback done) override {
    EntryPtr e = claims_.Find(ClaimKey(owner, claim_id));
    if (e == nullptr) return std::move(done)(NotFound(claim_id));
    EndClaim(e, ClaimState::kReleased, std::move(done));
  }

  void Renew(const std::string& owner, const std::string& claim_id, absl::Duration ttl,
             ClaimCallback done) override;

  absl::StatusOr<ClaimRecord> GetClaim(const std::string& owner,
                                       const std::string& claim_id) const override {
    EntryPtr e = claims_.Find(ClaimKey(owner, claim_id));
    if (e == nullptr) return NotFound(claim_id);
    absl::MutexLock lock(&e->mu);
    if (e->phase == ClaimEntry::Phase::kCommitting) {
      return absl::NotFoundError(
          absl::StrCat("claim \"", claim_id, "\" is not yet granted (waiting or committing)"));
    }
    return RecordLocked(*e);
  }

  std::vector<ClaimRecord> ListClaims(const ClaimFilter& f) const override {
    std::vector<ClaimRecord> out;
    const std::string prefix = f.all_owners ? std::string() : absl::StrCat(f.owner, "/");
    claims_.ForEach([&](const EntryPtr& e) {
      if (e->key.compare(0, prefix.size(), prefix) != 0) return;
      absl::MutexLock lock(&e->mu);
      if (e->phase != ClaimEntry::Phase::kCommitting && Matches(e->record, f)) {
        out.push_back(RecordLocked(*e));
      }
    });
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.id < b.id; });
    if (f.limit > 0 && out.size() > static_cast<size_t>(f.limit)) out.resize(f.limit);
    return out;
  }

  void Suspend(const std::string& owner, const std::string& claim_id, ClaimCallback done) override {
    SetSuspended(owner, claim_id, true, std::move(done));
  }

  void Resume(const std::string& owner, const std::string& claim_id, ClaimCallback done) override {
    SetSuspended(owner, claim_id, false, std::move(done));
  }

  // ---- Revisions and watches ----

  uint64_t revision() const override { return hub_->revision(); }

  absl::StatusOr<std::unique_ptr<ClaimWatch>> Watch(WatchRequest request,
                                                    std::function<void()> ready) override {
    if (request.all_owners) {
      request.owner.clear();
    } else {
      RETURN_IF_ERROR(ValidateKey("watch owner", request.owner));
    }
    if (!request.pool.empty()) RETURN_IF_ERROR(ValidatePoolName("watch pool", request.pool));
    return hub_->Subscribe(std::move(request), std::move(ready), [this](const WatchRequest& w) {
      ClaimFilter f;
      f.owner = w.owner;
      f.all_owners = w.all_owners;
      f.pool = w.pool;
      f.labels = w.labels;
      f.include_ended = w.include_ended;
      f.limit = 0;
      return ListClaims(f);
    });
  }

  void CloseWatches(absl::Status status) override { hub_->Close(std::move(status)); }

  int Tick() override {
    return timers_.RunDue(clock_->Now(), [this](TimerTask t) { Fire(std::move(t)); });
  }

 private:
  static absl::Status NotFound(const std::string& claim_id) {
    return absl::NotFoundError(absl::StrCat("claim \"", claim_id, "\" not found"));
  }

  // OK if the claim is active; otherwise why it cannot be released, expired or renewed
  // now (ABORTED while it is being granted or renewed, FAILED_PRECONDITION once ended).
  static absl::Status NotActiveLocked(const ClaimEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu) {
    switch (e.phase) {
      case ClaimEntry::Phase::kActive:
        return absl::OkStatus();
      case ClaimEntry::Phase::kCommitting:
        return absl::AbortedError(absl::StrCat("claim \"", e.record.id,
                                               "\" is still being granted; retry when it returns"));
      case ClaimEntry::Phase::kUpdating:
        return absl::AbortedError(absl::StrCat(
            "claim \"", e.record.id, "\" is being updated (renewed, suspended or resumed); retry"));
      case ClaimEntry::Phase::kEnding:
      case ClaimEntry::Phase::kEnded:
        break;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("claim \"", e.record.id, "\" ", EndedVerb(e.record.state)));
  }

  // The claim's record as clients and the store see it. While the entry holds a sandbox,
  // the sandbox's id and endpoint are not kept twice in memory: they are filled in here.
  static ClaimRecord RecordLocked(const ClaimEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu) {
    ClaimRecord r = e.record;
    if (e.sandbox != nullptr) {
      r.sandbox_id = e.sandbox->id;
      r.endpoint = e.moved_endpoint.empty() ? e.sandbox->endpoint : e.moved_endpoint;
    }
    return r;
  }

  static bool Matches(const ClaimRecord& r, const ClaimFilter& f) {
    if (!f.include_ended && r.state != ClaimState::kActive) return false;
    if (!f.pool.empty() && r.pool != f.pool) return false;
    if (!f.after.empty() && r.id <= f.after) return false;
    for (const auto& [k, v] : f.labels) {
      auto it = r.labels.find(k);
      if (it == r.labels.end() || it->second != v) return false;
    }
    return true;
  }

  static store::SandboxRecord RecordOf(const Sandbox& sb, std::string pool_name = "") {
    store::SandboxRecord r;
    r.id = sb.id;
    r.pool = sb.pool != nullptr ? sb.pool->name() : std::move(pool_name);
    r.endpoint = sb.endpoint;
    r.node = sb.node;
    r.created = sb.created;
    return r;
  }

  absl::Status ValidatePool(const store::PoolRecord& p) const {
    RETURN_IF_ERROR(ValidatePoolName("pool name", p.name));
    RETURN_IF_ERROR(ValidatePoolName("template name", p.template_name));
    if (p.min_warm < 0 || p.max_warm < p.min_warm) {
      return absl::InvalidArgumentError(absl::StrCat("pool \"", p.name, "\": min_warm ", p.min_warm,
                                                     " and max_warm ", p.max_warm,
                                                     " must satisfy 0 <= min_warm <= max_warm"));
    }
    if (p.max_warm > options_.max_pool_warm) {
      return absl::InvalidArgumentError(absl::StrCat("pool \"", p.name, "\": max_warm ", p.max_warm,
                                                     " is above ", options_.max_pool_warm,
                                                     ", the allocator's max_pool_warm"));
    }
    if (p.default_wait < absl::ZeroDuration() || p.default_ttl < absl::ZeroDuration() ||
        p.max_ttl < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool \"", p.name, "\": durations must not be negative"));
    }
    RETURN_IF_ERROR(CheckMaxTtl(absl::StrCat("pool \"", p.name, "\": default_ttl"), p.default_ttl));
    RETURN_IF_ERROR(CheckMaxTtl(absl::StrCat("pool \"", p.name, "\": max_ttl"), p.max_ttl));
    RETURN_IF_ERROR(NewSelectionPolicy(p.selection_policy).status());
    return absl::OkStatus();
  }

  absl::Status ValidateClaimRequest(const ClaimRequest& req) const {
    RETURN_IF_ERROR(ValidateKey("owner", req.owner));
    RETURN_IF_ERROR(ValidateKey("claim id", req.claim_id));
    RETURN_IF_ERROR(ValidatePoolName("pool name", req.pool));
    if (req.wait < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("wait ", absl::FormatDuration(req.wait), " is negative"));
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<absl::Duration> EffectiveTtl(const store::PoolRecord& p,
                                                     absl::Duration requested) {
    if (requested < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ttl ", absl::FormatDuration(requested), " is negative"));
    }
    RETURN_IF_ERROR(CheckMaxTtl("ttl", requested));
    absl::Duration ttl = requested > absl::ZeroDuration() ? requested : p.default_ttl;
    if (p.max_ttl > absl::ZeroDuration() && (ttl == absl::ZeroDuration() || ttl > p.max_ttl)) {
      ttl = p.max_ttl;
    }
    // A pool stored before TTLs were bounded may still carry a longer default or bound.
    return std::min(ttl, kMaxTtl);
  }

  absl::StatusOr<Pool*> FindPool(const std::string& name) const {
    absl::ReaderMutexLock lock(&mu_);
    Pool* p = FindPoolLocked(name);
    if (p == nullptr) return absl::NotFoundError(absl::StrCat("pool \"", name, "\" not found"));
    return p;
  }
  Pool* FindPoolLocked(const std::string& name) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    auto it = pools_.find(name);
    return it == pools_.end() ? nullptr : it->second.get();
  }
  Pool* AddPoolLocked(const store::PoolRecord& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto policy = NewSelectionPolicy(p.selection_policy);
    auto pool = std::make_unique<Pool>(p, policy.ok() ? std::move(*policy) : NewFifoReadySet());
    Pool* raw = pool.get();
    pools_[p.name] = std::move(pool);
    return raw;
  }

  SandboxPtr FindSandbox(const std::string& id) const {
    absl::MutexLock lock(&sandboxes_mu_);
    auto it = sandboxes_.find(absl::string_view(id));
    return it == sandboxes_.end() ? nullptr : *it;
  }
  void ForgetSandbox(const std::string& id) {
    absl::MutexLock lock(&sandboxes_mu_);
    auto it = sandboxes_.find(absl::string_view(id));
    if (it != sandboxes_.end()) sandboxes_.erase(it);
  }

  // A retry of an existing claim id.
  void AnswerExisting(const EntryPtr& e, Pool* pool, ClaimCallback done,
                      const std::shared_ptr<WaitCancellation>& cancellation) {
    absl::StatusOr<ClaimResult> answer;
    {
      absl::MutexLock lock(&e->mu);
      if (e->pool != pool) {
        answer = absl::AlreadyExistsError(absl::StrCat("claim id \"", e->record.id,
                                                       "\" already names a claim on pool \"",
                                                       e->record.pool, "\""));
      } else if (e->phase == ClaimEntry::Phase::kCommitting) {
        e->callbacks.emplace_back(std::move(done), true);
        ++e->calls;
        if (cancellation) cancellation->OnCancel([this, e] { CallGaveUp(e); });
        return;
      } else if (e->phase == ClaimEntry::Phase::kActive ||
                 e->phase == ClaimEntry::Phase::kUpdating) {
        answer = ClaimResult{RecordLocked(*e), true};
      } else {
        answer = absl::FailedPreconditionError(absl::StrCat(
            "claim \"", e->record.id, "\" ", EndedVerb(e->record.state), "; use a new claim id"));
      }
    }
    std::move(done)(std::move(answer));
  }

  // A call waiting for `e` was cancelled. When it was the last, a claim still queued for a
  // sandbox leaves the queue and ends CANCELLED, so that nothing is granted to a claim
  // nobody waits for (it would hold its sandbox until its TTL).
  void CallGaveUp(const EntryPtr& e) {
    WaiterPtr waiter;
    std::string id;
    {
      absl::MutexLock lock(&e->mu);
      if (--e->calls > 0) return;
      waiter = e->waiter;
      id = e->record.id;
    }
    if (waiter == nullptr || !e->pool->CancelWaiter(waiter)) return;  // served meanwhile
    FailEntry(e, absl::CancelledError(
                     absl::StrCat("claim \"", id, "\" on pool \"", e->pool->name(),
                                  "\": the caller gave up waiting (its call was cancelled)")));
  }

  // Fails a claim that holds no sandbox: removes it from the table and answers every
  // caller attached to it. No-op if a sandbox was assigned first.
  void FailEntry(const EntryPtr& e, absl::Status status) {
    std::vector<std::pair<ClaimCallback, bool>> callbacks;
    ClaimPath path;
    {
      absl::MutexLock lock(&e->mu);
      if (e->assigned || e->failed) return;
      e->failed = true;
      e->phase = ClaimEntry::Phase::kEnded;
      callbacks = std::move(e->callbacks);
      e->waiter = nullptr;
      path = e->path;
    }
    e->pool->counters().CountClaims(status.code(), path);
    claims_.Erase(e);
    for (auto& [cb, _] : callbacks) std::move(cb)(status);
  }

  // Gives `sb` (already kClaimed) to a waiting claim, unless the claim failed first (its
  // deadline passed), in which case the sandbox goes back to the pool.
  void Deliver(const EntryPtr& e, SandboxPtr sb, LaunchType launch, bool new_sandbox) {
    bool assigned;
    {
      absl::MutexLock lock(&e->mu);
      assigned = !e->failed;
      e->assigned = assigned;
      e->waiter = nullptr;
    }
    if (!assigned) {
      sb->Transition(SandboxState::kClaimed, SandboxState::kWarm);
      if (new_sandbox) {
        store::WriteBatch batch;
        batch.Put(RecordOf(*sb));
        store_->Commit(std::move(batch), [](absl::Status) {});
      }
      e->pool->AddWarm(std::move(sb));
      return;
    }
    CommitClaim(e, std::move(sb), launch, new_sandbox);
  }

  void Wait(const EntryPtr& e, absl::Duration wait) {
    auto waiter = std::make_shared<Waiter>();
    waiter->deliver = [this, e](SandboxPtr sb) {
      Deliver(e, std::move(sb), LaunchType::kWarm, false);
    };
    {
      absl::MutexLock lock(&e->mu);
      e->waiter = waiter;
    }
    if (SandboxPtr sb = e->pool->TakeOrEnqueue(waiter)) {
      return Deliver(e, std::move(sb), LaunchType::kWarm, false);
    }
    // Scheduled after queueing, so that the deadline always finds the waiter queued (or
    // sees that it was served).
    ScheduleTimer(clock_->Now() + wait, TimerTask::Kind::kWaitDeadline, e);
  }

  void ColdStart(const EntryPtr& e, const store::PoolRecord& settings, absl::Duration wait) {
    if (runtime_ == nullptr) {
      return FailEntry(e, absl::FailedPreconditionError(absl::StrCat(
                              "pool \"", e->pool->name(),
                              "\" is empty and this allocator has no runtime for cold starts")));
    }
    runtime::CreateRequest req;
    req.pool = e->pool->name();
    req.template_name = settings.template_name;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = templates_.find(settings.template_name);
      if (it != templates_.end()) req.template_spec = it->second.spec;
    }
    ScheduleTimer(clock_->Now() + wait, TimerTask::Kind::kColdDeadline, e);
    runtime_->Create(std::move(req), [this, e](absl::StatusOr<runtime::SandboxInfo> info) {
      if (!info.ok()) return FailEntry(e, info.status());
      auto sb = std::make_shared<Sandbox>(info->id, info->endpoint, info->node, e->pool,
                                          clock_->Now(), SandboxState::kClaimed);
      {
        absl::MutexLock lock(&sandboxes_mu_);
        sandboxes_.insert(sb);
      }
      Deliver(e, std::move(sb), LaunchType::kCold, true);
    });
  }

  // Writes the claim record (and, for a new sandbox, its record) and completes the
  // claim's callbacks when durable. On a store error the sandbox returns to the pool.
  void CommitClaim(const EntryPtr& e, SandboxPtr sb, LaunchType launch, bool new_sandbox) {
    {
      absl::MutexLock lock(&sb->mu);
      sb->claim = e;
    }
    store::WriteBatch batch;
    if (new_sandbox) batch.Put(RecordOf(*sb));
    uint64_t revision;
    {
      absl::MutexLock lock(&e->mu);
      e->record.launch_type = launch;
      // The entry is invisible while committing, so its record may carry the revision
      // before the change is durable.
      e->record.revision = revision = hub_->Reserve();
      e->sandbox = sb;
      batch.Put(RecordLocked(*e));
    }
    store_->Commit(std::move(batch), [this, e, sb, revision](absl::Status s) {
      if (!s.ok()) {
        {
          absl::MutexLock lock(&sb->mu);
          sb->claim.reset();
        }
        {
          absl::MutexLock lock(&e->mu);
          e->assigned = false;
          e->sandbox = nullptr;
        }
        sb->Transition(SandboxState::kClaimed, SandboxState::kWarm);
        e->pool->AddWarm(sb);
        FailEntry(e, s);
        hub_->Complete(revision, nullptr);
        return;
      }
      e->pool->AddClaimed(1);
      Activate(e);
    });
  }

  // Marks a durable claim active, arms its expiry, publishes its revision and answers its
  // callers.
  void Activate(const EntryPtr& e) {
    std::vector<std::pair<ClaimCallback, bool>> callbacks;
    ClaimRecord record;
    bool gone;
    ClaimPath path;
    {
      absl::MutexLock lock(&e->mu);
      e->phase = ClaimEntry::Phase::kActive;
      callbacks = std::move(e->callbacks);
      record = RecordLocked(*e);
      ArmExpiryLocked(e);
      gone = e->sandbox->gone.load(std::memory_order_seq_cst);
      path = e->path;
    }
    PoolCounters& counters = e->pool->counters();
    counters.CountClaims(absl::StatusCode::kOk, path);
    counters.ObserveLatency(path, clock_->Now() - record.created);
    // Published after the entry is active: whoever sees the revision sees the claim.
    hub_->Complete(record.revision, MakeEvent(ClaimEvent::Type::kAdded, record));
    for (auto& [cb, replayed] : callbacks) std::move(cb)(ClaimResult{record, replayed});
    if (gone) EndClaim(e, ClaimState::kLost, [](absl::StatusOr<ClaimRecord>) {});
  }

  void ArmExpiryLocked(const EntryPtr& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu) {
    if (e->record.expires == absl::InfiniteFuture()) return;
    e->expiry = ScheduleTimer(e->record.expires, TimerTask::Kind::kExpire, e);
  }

  // Ends an active claim as `end`: writes the ended record and removes the sandbox
  // record in one batch; then retires the sandbox and asks for a refill.
  // Ends an active claim as `end` and answers its ended record. A claim that has ended is
  // answered with its final record; one whose end is being committed, once that end is
  // durable (Release's idempotence).
  void EndClaim(const EntryPtr& e, ClaimState end, EndedCallback done) {
    store::WriteBatch batch;
    SandboxPtr sb;
    absl::Status refused;
    std::optional<ClaimRecord> ended_before;
    absl::Time ended_at;
    uint64_t revision = 0;
    {
      absl::MutexLock lock(&e->mu);
      if (e->phase == ClaimEntry::Phase::kEnding) {
        e->end_waiters.push_back(std::move(done));
        return;
      }
      if (e->phase == ClaimEntry::Phase::kEnded) ended_before = RecordLocked(*e);
      refused = NotActiveLocked(*e);
      if (refused.ok()) {
        e->phase = ClaimEntry::Phase::kEnding;
        timers_.Cancel(e->expiry);
        ClaimRecord ended = RecordLocked(*e);
        ended.state = end;
        ended.ended = ended_at = clock_->Now();
        ended.revision = revision = hub_->Reserve();
        batch.Put(std::move(ended));
        sb = e->sandbox;
        batch.DeleteSandbox(sb->id);
      }
    }
    // Callbacks never run under a lock: they may call back into the allocator.
    if (ended_before.has_value()) return std::move(done)(*std::move(ended_before));
    if (!refused.ok()) return std::move(done)(refused);
    store_->Commit(std::move(batch), [this, e, end, sb, ended_at, revision,
                                      done = std::move(done)](absl::Status s) mutable {
      std::vector<EndedCallback> waiters;
      if (!s.ok()) {
        {
          absl::MutexLock lock(&e->mu);
          e->phase = ClaimEntry::Phase::kActive;
          ArmExpiryLocked(e);
          waiters.swap(e->end_waiters);
        }
        hub_->Complete(revision, nullptr);
        for (EndedCallback& w : waiters) {
          std::move(w)(absl::AbortedError(
              absl::StrCat("the end of claim \"", e->key, "\" being committed failed; retry")));
        }
        return std::move(done)(s);
      }
      ClaimRecord record;
      {
        absl::MutexLock lock(&e->mu);
        e->phase = ClaimEntry::Phase::kEnded;
        e->record.state = end;
        e->record.ended = ended_at;
        e->record.revision = revision;
        // e->sandbox stays: the ended claim still reports which sandbox it held.
        record = RecordLocked(*e);
        waiters.swap(e->end_waiters);
      }
      for (EndedCallback& w : waiters) std::move(w)(record);
      ClaimRecord answer = record;
      hub_->Complete(revision, MakeEvent(ClaimEvent::Type::kModified, std::move(record)));
      sb->Transition(SandboxState::kClaimed, SandboxState::kRetired);
      e->pool->AddClaimed(-1);
      e->pool->counters().CountEnded(end);
      ForgetSandbox(sb->id);
      if (end != ClaimState::kLost) reconciler_->RetireSandbox(RecordOf(*sb));
      reconciler_->PoolBelowTarget(e->pool->name());
      ScheduleTimer(ended_at + options_.idempotency_window, TimerTask::Kind::kPurge, e);
      std::move(done)(std::move(answer));
    });
  }

  void Fire(TimerTask t) {
    const EntryPtr& e = t.entry;
    switch (t.kind) {
      case TimerTask::Kind::kExpire:
        return EndClaim(e, ClaimState::kExpired, [](absl::StatusOr<ClaimRecord>) {});
      case TimerTask::Kind::kPurge:
        // After the idempotency window an ended claim leaves the table and the store.
        if (claims_.Erase(e)) Purge(e);
        return;
      case TimerTask::Kind::kWaitDeadline: {
        WaiterPtr waiter;
        absl::Duration waited;
        {
          absl::MutexLock lock(&e->mu);
          waiter = e->waiter;
          waited = clock_->Now() - e->record.created;
        }
        if (waiter == nullptr || !e->pool->CancelWaiter(waiter)) return;  // served meanwhile
        return FailEntry(e, absl::DeadlineExceededError(absl::StrCat(
                                "no sandbox of pool \"", e->pool->name(), "\" became ready within ",
                                absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))))));
      }
      case TimerTask::Kind::kBatchDeadline:
        return BatchDeadline(t.batch);
      case TimerTask::Kind::kColdDeadline: {
        absl::Duration waited;
        {
          absl::MutexLock lock(&e->mu);
          waited = clock_->Now() - e->record.created;
        }
        return FailEntry(
            e, absl::DeadlineExceededError(absl::StrCat(
                   "cold start of a sandbox of pool \"", e->pool->name(), "\" took longer than ",
                   absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))))));
      }
    }
  }

  // Deletes an ended claim whose window closed (already out of the table), with a new
  // revision that also becomes the store's revision mark. Purges are written one at a
  // time, in the order of their revisions, so that the mark in the store only rises.
  void Purge(EntryPtr e) ABSL_LOCKS_EXCLUDED(purge_mu_) {
    {
      absl::MutexLock lock(&purge_mu_);
      purges_.push_back(std::move(e));
      if (purging_) return;  // the thread that is purging takes it
      purging_ = true;
    }
    while (true) {
      EntryPtr next;
      {
        absl::MutexLock lock(&purge_mu_);
        if (purges_.empty()) {
          purging_ = false;
          return;
        }
        next = std::move(purges_.front());
        purges_.pop_front();
      }
      ClaimRecord last;
      {
        absl::MutexLock lock(&next->mu);
        last = RecordLocked(*next);
      }
      last.revision = hub_->Reserve();
      store::WriteBatch batch;
      batch.DeleteClaim(last.owner, last.id);
      batch.Put(store::RevisionRecord{last.revision});
      // No lock is held here: with an inline store the callback runs inside Commit.
      store_->Commit(std::move(batch), [this, last = std::move(last)](absl::Status s) mutable {
        const uint64_t revision = last.revision;
        if (!s.ok()) {
          spdlog::warn("purge of claim \"{}\" failed: {}", ClaimKey(last.owner, last.id),
                       s.ToString());
          return hub_->Complete(revision, nullptr);
        }
        hub_->Complete(revision, MakeEvent(ClaimEvent::Type::kDeleted, std::move(last)));
      });
    }
  }

  // Suspend and Resume: the runtime first (the claim marked kUpdating meanwhile, its expiry
  // timer held back), then the record if the state changed.
  void SetSuspended(const std::string& owner, const std::string& claim_id, bool suspend,
                    ClaimCallback done) {
    EntryPtr e = claims_.Find(ClaimKey(owner, claim_id));
    if (e == nullptr) return std::move(done)(NotFound(claim_id));
    if (runtime_ == nullptr) {
      return std::move(done)(absl::FailedPreconditionError(
          absl::StrCat("claim \"", claim_id, "\": this allocator has no runtime to ",
                       suspend ? "suspend" : "resume", " sandboxes with")));
    }
    std::string sandbox_id;
    absl::Status refused;
    {
      absl::MutexLock lock(&e->mu);
      refused = NotActiveLocked(*e);
      if (refused.ok()) {
        e->phase = ClaimEntry::Phase::kUpdating;
        timers_.Cancel(e->expiry);
        sandbox_id = e->sandbox->id;
      }
    }
    if (!refused.ok()) return std::move(done)(refused);
    if (suspend) {
      runtime_->Suspend(std::move(sandbox_id),
                        [this, e, done = std::move(done)](absl::Status s) mutable {
                          FinishSetSuspended(e, true, std::move(s), nullptr, std::move(done));
                        });
    } else {
      runtime_->Resume(std::move(sandbox_id), [this, e, done = std::move(done)](
                                                  absl::StatusOr<runtime::SandboxInfo> s) mutable {
        const runtime::SandboxInfo* at = s.ok() ? &*s : nullptr;
        FinishSetSuspended(e, false, s.status(), at, std::move(done));
      });
    }
  }

  // `resumed_at`: where a resumed sandbox is reached now (null for a suspension or a
  // failure). When that is not where the claim says, the claim and the sandbox's record
  // take the new place in the same commit.
  void FinishSetSuspended(const EntryPtr& e, bool suspend, absl::Status runtime_status,
                          const runtime::SandboxInfo* resumed_at, ClaimCallback done) {
    ClaimRecord updated;
    std::optional<store::SandboxRecord> moved;
    bool changed = false;
    bool gone = false;
    {
      absl::MutexLock lock(&e->mu);
      if (resumed_at != nullptr && !resumed_at->endpoint.empty() &&
          resumed_at->endpoint != RecordLocked(*e).endpoint) {
        moved = RecordOf(*e->sandbox);
        moved->endpoint = resumed_at->endpoint;
        moved->node = resumed_at->node;
      }
      if (runtime_status.ok()) changed = e->record.suspended != suspend || moved.has_value();
      if (changed) {
        updated = RecordLocked(*e);
        updated.suspended = suspend;
        if (moved) updated.endpoint = moved->endpoint;
        updated.revision = hub_->Reserve();
      } else {
        e->phase = ClaimEntry::Phase::kActive;
        ArmExpiryLocked(e);
        if (runtime_status.ok()) updated = RecordLocked(*e);
        gone = e->sandbox->gone.load(std::memory_order_seq_cst);
      }
    }
    if (!changed) {
      if (runtime_status.ok()) {
        std::move(done)(ClaimResult{std::move(updated), false});
      } else {
        std::move(done)(absl::Status(
            runtime_status.code(),
            absl::StrCat(suspend ? "suspending" : "resuming", " the sandbox of claim \"",
                         e->key.substr(e->key.find('/') + 1), "\": ", runtime_status.message())));
      }
      // The sandbox died while the runtime was asked (SandboxGone skips updating claims).
      if (gone) EndClaim(e, ClaimState::kLost, [](absl::StatusOr<ClaimRecord>) {});
      return;
    }
    const uint64_t revision = updated.revision;
    store::WriteBatch batch;
    batch.Put(std::move(updated));
    std::string endpoint;
    if (moved) {
      endpoint = moved->endpoint;
      batch.Put(*std::move(moved));
    }
    CommitUpdate(
        e, std::move(batch), revision,
        [e, suspend, endpoint = std::move(endpoint)](ClaimRecord& r)
            ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu) {
              r.suspended = suspend;
              if (!endpoint.empty()) e->moved_endpoint = endpoint;
            },
        std::move(done));
  }

  // Commits `batch`, an update of active claim `e` at `revision`; once durable, applies
  // `apply` to the claim in memory, publishes the change and answers `done` with the
  // updated claim (or the store's error). Either way the claim is active again, with its
  // expiry re-armed; if its sandbox died meanwhile it then becomes LOST.
  void CommitUpdate(const EntryPtr& e, store::WriteBatch batch, uint64_t revision,
                    absl::AnyInvocable<void(ClaimRecord&)> apply, ClaimCallback done) {
    store_->Commit(std::move(batch), [this, e, revision, apply = std::move(apply),
                                      done = std::move(done)](absl::Status s) mutable {
      absl::StatusOr<ClaimResult> result = s.ok() ? absl::UnknownError("unset") : s;
      bool gone;
      {
        absl::MutexLock lock(&e->mu);
        if (s.ok()) {
          apply(e->record);
          e->record.revision = revision;
          result = ClaimResult{RecordLocked(*e), false};
        }
        e->phase = ClaimEntry::Phase::kActive;
        ArmExpiryLocked(e);
        gone = e->sandbox->gone.load(std::memory_order_seq_cst);
      }
      hub_->Complete(revision,
                     s.ok() ? MakeEvent(ClaimEvent::Type::kModified, result->claim) : nullptr);
      std::move(done)(std::move(result));
      // The sandbox died while the claim was being updated (SandboxGone skips such claims).
      if (gone) EndClaim(e, ClaimState::kLost, [](absl::StatusOr<ClaimRecord>) {});
    });
  }

  TimerHandle ScheduleTimer(absl::Time when, TimerTask::Kind kind, EntryPtr e,
                            BatchWaitPtr batch = nullptr) {
    const bool earliest = options_.timer_thread && when < timers_.NextDeadline();
    TimerHandle h = timers_.Schedule(when, TimerTask{kind, std::move(e), std::move(batch)});
    if (earliest) {
      absl::MutexLock lock(&timer_mu_);
      timer_wake_ = true;
    }
    return h;
  }

  void TimerLoop() {
    absl::MutexLock lock(&timer_mu_);
    while (!stopping_) {
      timer_wake_ = false;
      timer_mu_.Unlock();
      Tick();
      const absl::Time next = std::min(timers_.NextDeadline(), clock_->Now() + absl::Seconds(1));
      timer_mu_.Lock();
      if (!timer_wake_) clock_->AwaitUntil(timer_mu_, &timer_wake_, next);
    }
  }

  const AllocatorOptions options_;
  store::Store* const store_;
  runtime::Runtime* const runtime_;
  Reconciler* const reconciler_;
  Clock* const clock_;
  IdGenerator* const ids_;

  ClaimTable claims_;
  TimerQueue<TimerTask> timers_;

  // Pools and templates: read on every claim (shared lock), written by admin calls.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Pool>> pools_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Pool>> retired_pools_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, store::TemplateRecord> templates_ ABSL_GUARDED_BY(mu_);

  // Every live sandbox by id (for death reports); not touched on the warm claim path.
  mutable absl::Mutex sandboxes_mu_;
  ByField<Sandbox, &Sandbox::id>::Set sandboxes_ ABSL_GUARDED_BY(sandboxes_mu_);

  absl::Mutex timer_mu_;
  bool timer_wake_ ABSL_GUARDED_BY(timer_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(timer_mu_) = false;
  std::thread timer_thread_;

  RecoveryStats recovery_;

  // The revision sequence and the watches; set by Recover.
  std::shared_ptr<WatchHub> hub_;

  // Purges waiting to be written (see Purge).
  absl::Mutex purge_mu_;
  std::deque<EntryPtr> purges_ ABSL_GUARDED_BY(purge_mu_);
  bool purging_ ABSL_GUARDED_BY(purge_mu_) = false;
};

}  // namespace internal
}  // namespace sbx::allocator
