#pragma once
// The allocator's implementation class, shared by its rooms (the way RocksDB splits
// DBImpl): allocator_impl.cc (creation, options, renewals), claim_path.cc (a claim from its
// request until it is active), claim_batch.cc (ClaimBatch and waiting batches),
// claim_changes.cc (release, expiry, loss, suspension, purging), sandbox_events.cc (what
// the runtime reports), admin.cc (templates and pools), recovery.cc (Recover); the claim
// table is claim_table.h, waiting claims waiter_queue.h, watches watch_hub.h. Internal to
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
  // The owner's slot (max_claims) the claim holds until it fails or its end is durable.
  OwnerClaims::Slots slot ABSL_GUARDED_BY(mu);
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
// missing one is a waiter in the pool's queue, so the pool's target grows by them.
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
  // The owner's slots for the batch's `count` claims (max_claims).
  OwnerClaims::Slots slots ABSL_GUARDED_BY(mu);
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

  [[nodiscard]] absl::Status Recover();
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
  [[nodiscard]] absl::Status ValidatePoolName(absl::string_view what,
                                              absl::string_view name) const {
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

  void PutTemplate(store::TemplateRecord t, StatusCallback done) override;

  [[nodiscard]] absl::StatusOr<store::TemplateRecord> GetTemplate(
      const std::string& name) const override {
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

  void DeleteTemplate(const std::string& name, StatusCallback done) override;

  void PutPool(store::PoolRecord p, StatusCallback done) override;

  [[nodiscard]] absl::StatusOr<PoolStatus> GetPoolStatus(const std::string& name) const override;

  [[nodiscard]] absl::StatusOr<store::PoolRecord> GetPool(const std::string& name) const override {
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

  void DeletePool(const std::string& name, StatusCallback done) override;

  // ---- Runtime side ----

  [[nodiscard]] absl::Status AddSandbox(const runtime::SandboxInfo& info) override;

  [[nodiscard]] absl::Status SandboxGone(const std::string& id) override;

  [[nodiscard]] absl::Status RetireWarm(const std::string& id) override;
  [[nodiscard]] absl::StatusOr<int> TrimWarm(const std::string& pool, int n) override;
  void ObserveCreateLatency(const std::string& pool, absl::Duration took) override;
  void ObserveCreateResult(const std::string& pool, const absl::Status& result) override;

  std::vector<std::string> ListSandboxIds() const override {
    absl::MutexLock lock(&sandboxes_mu_);
    std::vector<std::string> ids;
    ids.reserve(sandboxes_.size());
    for (const SandboxPtr& sb : sandboxes_) ids.push_back(sb->id);
    return ids;
  }

  // ---- Claims ----

  void Claim(ClaimRequest req, ClaimCallback done) override;

  void ClaimBatch(BatchRequest req, BatchCallback done) override;
  // The rest of ClaimBatch once `taken` holds the batch's sandboxes (already kClaimed,
  // between 1 and req.count): new claims, one commit. Each claim takes one of `slots`; the
  // rest are given back.
  void GrantBatch(const BatchRequest& req, Pool* pool, absl::Duration ttl,
                  std::vector<SandboxPtr> taken, OwnerClaims::Slots slots, BatchCallback done);
  void WaitForBatch(BatchRequest req, Pool* pool, absl::Duration ttl, std::vector<SandboxPtr> taken,
                    OwnerClaims::Slots slots, absl::Duration wait, BatchCallback done);
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

  [[nodiscard]] absl::StatusOr<ClaimRecord> GetClaim(const std::string& owner,
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

  std::vector<OwnerClaimCount> OwnerClaimCounts() const override { return owners_.Counts(); }

  // ---- Revisions and watches ----

  uint64_t revision() const override { return hub_->revision(); }

  [[nodiscard]] absl::StatusOr<std::unique_ptr<ClaimWatch>> Watch(
      WatchRequest request, std::function<void()> ready) override {
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
  [[nodiscard]] static absl::Status NotFound(const std::string& claim_id) {
    return absl::NotFoundError(absl::StrCat("claim \"", claim_id, "\" not found"));
  }

  // Begins a change of an active claim (a renewal, suspension or resumption: kUpdating;
  // its end: kEnding): moves it to `to` and cancels its expiry timer, so that no other
  // change writes between this one's record and its commit. The one way every change
  // starts. Otherwise why not (NotActiveLocked), with nothing changed.
  [[nodiscard]] absl::Status BeginChangeLocked(ClaimEntry& e, ClaimEntry::Phase to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu) {
    if (absl::Status refused = NotActiveLocked(e); !refused.ok()) return refused;
    e.phase = to;
    timers_.Cancel(e.expiry);
    return absl::OkStatus();
  }

  // OK if the claim is active; otherwise why it cannot be released, expired or renewed
  // now (ABORTED while it is being granted or renewed, FAILED_PRECONDITION once ended).
  [[nodiscard]] static absl::Status NotActiveLocked(const ClaimEntry& e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.mu) {
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
    if (sb.node_labels != nullptr) r.node_labels = *sb.node_labels;
    r.created = sb.created;
    return r;
  }

  [[nodiscard]] absl::Status ValidatePool(const store::PoolRecord& p) const;

  [[nodiscard]] absl::Status ValidateClaimRequest(const ClaimRequest& req) const {
    RETURN_IF_ERROR(ValidateKey("owner", req.owner));
    RETURN_IF_ERROR(ValidateKey("claim id", req.claim_id));
    RETURN_IF_ERROR(ValidatePoolName("pool name", req.pool));
    RETURN_IF_ERROR(CheckWait("wait", req.wait));
    return ValidateShare(req.priority, req.weight, req.max_claims);
  }

  [[nodiscard]] static absl::Status ValidateShare(ClaimPriority priority, int weight,
                                                  int64_t max_claims) {
    if (static_cast<int>(priority) >= kClaimPriorities) {
      return absl::InvalidArgumentError(
          absl::StrCat("priority ", static_cast<int>(priority), " is not a ClaimPriority"));
    }
    if (weight < 1 || weight > kMaxWeight) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight ", weight, " is outside 1..", kMaxWeight));
    }
    if (max_claims < 0) {
      return absl::InvalidArgumentError(absl::StrCat("max_claims ", max_claims, " is negative"));
    }
    return absl::OkStatus();
  }

  // The owner part of a claim's key "<owner>/<claim id>" (owners have no '/').
  static absl::string_view OwnerOf(const ClaimEntry& e) {
    return absl::string_view(e.key).substr(0, e.key.find('/'));
  }

  [[nodiscard]] static absl::StatusOr<absl::Duration> EffectiveTtl(const store::PoolRecord& p,
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

  [[nodiscard]] absl::StatusOr<Pool*> FindPool(const std::string& name) const {
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
    auto pool = std::make_unique<Pool>(p, policy.ok() ? std::move(*policy) : NewFifoReadySet(),
                                       nullptr, options_.demand, clock_->Now());
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
                      const std::shared_ptr<WaitCancellation>& cancellation);

  // A call waiting for `e` was cancelled. When it was the last, a claim still queued for a
  // sandbox leaves the queue and ends CANCELLED, so that nothing is granted to a claim
  // nobody waits for (it would hold its sandbox until its TTL).
  void CallGaveUp(const EntryPtr& e);

  // Fails a claim that holds no sandbox: removes it from the table and answers every
  // caller attached to it. No-op if a sandbox was assigned first.
  void FailEntry(const EntryPtr& e, absl::Status status);

  // Gives `sb` (already kClaimed) to a waiting claim, unless the claim failed first (its
  // deadline passed), in which case the sandbox goes back to the pool.
  void Deliver(const EntryPtr& e, SandboxPtr sb, LaunchType launch, bool new_sandbox);

  // Queues `e` as a waiter of its pool with `priority` and its owner's `weight`.
  void Wait(const EntryPtr& e, absl::Duration wait, ClaimPriority priority, int weight);

  void ColdStart(const EntryPtr& e, const store::PoolRecord& settings, absl::Duration wait);

  // Writes the claim record (and, for a new sandbox, its record) and completes the
  // claim's callbacks when durable. On a store error the sandbox returns to the pool.
  void CommitClaim(const EntryPtr& e, SandboxPtr sb, LaunchType launch, bool new_sandbox);

  // Marks a durable claim active, arms its expiry, publishes its revision and answers its
  // callers.
  void Activate(const EntryPtr& e);

  void ArmExpiryLocked(const EntryPtr& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu) {
    if (e->record.expires == absl::InfiniteFuture()) return;
    e->expiry = ScheduleTimer(e->record.expires, TimerTask::Kind::kExpire, e);
  }

  // Ends an active claim as `end`: writes the ended record and removes the sandbox
  // record in one batch; then retires the sandbox and asks for a refill.
  // Ends an active claim as `end` and answers its ended record. A claim that has ended is
  // answered with its final record; one whose end is being committed, once that end is
  // durable (Release's idempotence).
  void EndClaim(const EntryPtr& e, ClaimState end, EndedCallback done);

  void Fire(TimerTask t);

  // Deletes an ended claim whose window closed (already out of the table), with a new
  // revision that also becomes the store's revision mark. Purges are written one at a
  // time, in the order of their revisions, so that the mark in the store only rises.
  void Purge(EntryPtr e) ABSL_LOCKS_EXCLUDED(purge_mu_);

  // Suspend and Resume: the runtime first (the claim marked kUpdating meanwhile, its expiry
  // timer held back), then the record if the state changed.
  void SetSuspended(const std::string& owner, const std::string& claim_id, bool suspend,
                    ClaimCallback done);

  // `resumed_at`: where a resumed sandbox is reached now (null for a suspension or a
  // failure). When that is not where the claim says, the claim and the sandbox's record
  // take the new place in the same commit.
  void FinishSetSuspended(const EntryPtr& e, bool suspend, absl::Status runtime_status,
                          const runtime::SandboxInfo* resumed_at, ClaimCallback done);

  // Commits `batch`, an update of active claim `e` at `revision`; once durable, applies
  // `apply` to the claim in memory, publishes the change and answers `done` with the
  // updated claim (or the store's error). Either way the claim is active again, with its
  // expiry re-armed; if its sandbox died meanwhile it then becomes LOST.
  void CommitUpdate(const EntryPtr& e, store::WriteBatch batch, uint64_t revision,
                    absl::AnyInvocable<void(ClaimRecord&)> apply, ClaimCallback done);

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

  void TimerLoop();

  const AllocatorOptions options_;
  store::Store* const store_;
  runtime::Runtime* const runtime_;
  Reconciler* const reconciler_;
  Clock* const clock_;
  IdGenerator* const ids_;

  ClaimTable claims_;
  // Claims held per owner, for max_claims.
  OwnerClaims owners_;
  TimerQueue<TimerTask> timers_;

  // Pools and templates: read on every claim (shared lock), written by admin calls.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Pool>> pools_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Pool>> retired_pools_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, store::TemplateRecord> templates_ ABSL_GUARDED_BY(mu_);

  // Every live sandbox by id (for death reports); not touched on the warm claim path.
  // The labels of `node` as one object shared by its sandboxes: the last labels reported
  // for it, replaced when they differ (held sandboxes keep the ones they came with). One
  // entry per node ever seen: bounded by the cluster.
  NodeLabelsPtr InternNodeLabels(const std::string& node, const NodeLabels& labels)
      ABSL_LOCKS_EXCLUDED(node_labels_mu_) {
    if (labels.empty()) return nullptr;
    absl::MutexLock lock(&node_labels_mu_);
    NodeLabelsPtr& shared = node_labels_[node];
    if (shared == nullptr || *shared != labels) shared = std::make_shared<const NodeLabels>(labels);
    return shared;
  }
  absl::Mutex node_labels_mu_;
  absl::flat_hash_map<std::string, NodeLabelsPtr> node_labels_ ABSL_GUARDED_BY(node_labels_mu_);

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
