#pragma once
// sbx::allocator: warm pools held in memory, claims answered from them, every claim made
// durable in a Store before it is acknowledged.
//
// A claim takes a warm sandbox from its pool's lock-free ready set (one CAS decides it),
// writes the claim record through the store's group commit, and completes its callback
// when the record is durable. Claims are idempotent by (owner, claim id). An empty pool
// follows the claim's policy: WAIT (queued with a deadline: by weighted fair share between
// owners, by priority within an owner, FIFO within one owner and priority; waiter_queue.h),
// COLD (Runtime::Create now) or FAIL (RESOURCE_EXHAUSTED with a retry hint). An owner may
// be held to a maximum of claims (max_claims; owner_claims.h). Expired claims are released
// by timers.
//
// Revisions and watches: every change of a claim (granted, renewed, suspended, resumed,
// released, expired, lost, and its deletion when the idempotency window closes) gets the
// next number of one increasing revision sequence, written in the claim's own record with
// the change (deletions also write the store's revision mark). Watch() streams the
// changes of one owner's claims in revision order, each after it is durable; a watch
// resumes from a revision while the change after it is still in the in-memory history.
// Revisions never go backwards across a restart: the sequence continues from the highest
// revision in the store.
//
// Thread-safety: every public method may be called from any thread concurrently. No
// method blocks on I/O: results arrive through callbacks, which run on the store's
// committer thread, the runtime's thread, the timer thread or the caller's thread, and
// must not block. No callback runs under one of the allocator's locks, so callbacks may
// call the allocator again.
// Lifetime: Store, Runtime, Reconciler and Clock passed to Create must outlive the
// Allocator. Destroying it stops the timer thread; claims still waiting get CANCELLED and
// watches still open end with UNAVAILABLE.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "src/allocator/demand.h"
#include "src/allocator/owner_claims.h"
#include "src/allocator/pool_counters.h"
#include "src/allocator/reconciler.h"
#include "src/allocator/sandbox.h"
#include "src/allocator/waiter_queue.h"
#include "src/allocator/watch.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/runtime/runtime.h"
#include "src/store/records.h"
#include "src/store/store.h"

namespace sbx::allocator {

// The longest claim TTL, and the largest pool default_ttl and max_ttl: 100 years of 365
// days. Every expiry (now + ttl) then stays far inside google.protobuf.Timestamp's range
// (up to 9999-12-31) and never saturates absl::Time to InfiniteFuture (which means "no
// expiry"). Longer TTLs are INVALID_ARGUMENT; a claim that should not expire has none.
inline constexpr absl::Duration kMaxTtl = absl::Hours(24 * 365 * 100);
// The longest ClaimBatch id: its claims are "<batch_id>#<i>" and a claim id has at most
// 128 characters.
inline constexpr size_t kMaxBatchIdLength = 120;
// The largest fair-share weight of an owner (ClaimRequest::weight).
inline constexpr int kMaxWeight = 1000;
// The longest a WAIT or COLD claim may wait for its sandbox: a claim's wait and a pool's
// default_wait, whoever writes them (gRPC, the config file, Kubernetes).
inline constexpr absl::Duration kMaxWait = absl::Hours(1);

// INVALID_ARGUMENT when `ttl` is above kMaxTtl, naming `field`, the TTL and the maximum;
// OK otherwise (sign and zero are the caller's business).
[[nodiscard]] absl::Status CheckMaxTtl(absl::string_view field, absl::Duration ttl);
// INVALID_ARGUMENT when `wait` is negative or above kMaxWait, naming `field` and the wait.
[[nodiscard]] absl::Status CheckWait(absl::string_view field, absl::Duration wait);

struct AllocatorOptions {
  // Ended (released, expired, lost) claims are kept this long so that a retried claim
  // with the same id gets a precise answer instead of a second sandbox; then deleted.
  absl::Duration idempotency_window = absl::Minutes(10);
  // Number of shards of the claim table (a power of two).
  int claim_shards = 64;
  // Run a thread that fires timers (expiry, deadlines). Tests with a FakeClock turn it
  // off and call Allocator::Tick() instead.
  bool timer_thread = true;
  // Largest ClaimBatch.
  int max_batch = 1000;
  // Largest max_warm of a pool, whoever writes it (the admin API, a config file, a
  // SandboxWarmPool's replicas).
  int max_pool_warm = 10000;
  // The namespace whose pools and templates are named without one (src/common/ids.h):
  // "x" is "<default_namespace>/x", and the allocator refuses that second spelling so
  // that each pool has one name. A DNS-1123 label.
  std::string default_namespace = "default";
  // Claim changes kept in memory for watches that resume from a revision: a watch from
  // revision N works while the change after N is among the last `watch_history` changes
  // (OUT_OF_RANGE otherwise). 0 keeps none (watches start from 0 or the current revision).
  size_t watch_history = 100000;
  // Events a watch may hold that its consumer has not taken yet (Poll). One more ends the
  // watch with ABORTED, so that a slow consumer costs bounded memory and never slows
  // claims. The initial state and the history replayed when a watch starts do not count.
  size_t watch_queue = 10000;
  // Estimators and tuning of demand sizing (pools with sizing kDemand; demand.h).
  DemandOptions demand;

  // Test hooks (sync points). Nullptr in production.
  // Runs after a claim pops a candidate sandbox and before its Warm→Claimed CAS.
  std::function<void(const SandboxPtr&)> after_pop;

  [[nodiscard]] absl::Status Validate() const;
};

// Lets the caller of Claim or ClaimBatch give up a wait (its RPC was cancelled): a claim
// or batch still waiting for sandboxes then ends CANCELLED and holds nothing; one already
// granted or being granted is not affected. Cancel may come before, during or after the
// wait. Thread-safe.
class WaitCancellation {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<absl::AnyInvocable<void() &&>> actions;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      cancelled_ = true;
      actions.swap(actions_);
    }
    for (auto& action : actions) std::move(action)();
  }
  // For the allocator: runs `action` once Cancel is called (now, if it was).
  void OnCancel(absl::AnyInvocable<void() &&> action) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!cancelled_) {
        actions_.push_back(std::move(action));
        return;
      }
    }
    std::move(action)();
  }

 private:
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::AnyInvocable<void() &&>> actions_ ABSL_GUARDED_BY(mu_);
};

struct ClaimRequest {
  // Tenant; claims are keyed by (owner, claim_id).
  std::string owner;
  // Idempotency key; generated when empty. [A-Za-z0-9._:-]{1,128}.
  std::string claim_id;
  std::string pool;
  // Empty-pool policy; the pool's default when unset.
  std::optional<store::EmptyPoolPolicy> policy;
  // How long WAIT/COLD may wait; the pool's default_wait when zero.
  absl::Duration wait = absl::ZeroDuration();
  // Claim lifetime; the pool's default_ttl when zero (and that zero: no expiry). At most
  // kMaxTtl.
  absl::Duration ttl = absl::ZeroDuration();
  std::map<std::string, std::string> labels;
  // The late-bound env, recorded with the claim (store::ClaimRecord::env).
  std::map<std::string, std::string> env;
  // Soft preference: a sandbox whose node has all these labels (such as
  // topology.kubernetes.io/zone or kubernetes.io/hostname) if one is warm, any sandbox
  // otherwise. Honoured by the spread and pack policies (ready_set.h) when taking a warm
  // sandbox; a claim that waits gets the next sandbox to become warm.
  std::map<std::string, std::string> node_preference;
  // Optional: the caller's way to give up waiting.
  std::shared_ptr<WaitCancellation> cancellation;
  // Where the claim waits among its owner's waiting claims of the pool (strictly by
  // priority, then FIFO).
  ClaimPriority priority = ClaimPriority::kNormal;
  // The owner's share of an empty pool against other owners' waiting claims, 1 to
  // kMaxWeight: waiting owners are served in turns of `weight` sandboxes (waiter_queue.h).
  // The server gives its tenant's weight.
  int weight = 1;
  // The most claims the owner may hold (waiting, being granted or active), this one
  // included; 0: no maximum. Beyond it RESOURCE_EXHAUSTED, and nothing is held. A retry of
  // an existing claim is answered as usual. The server gives its tenant's max_claims.
  int64_t max_claims = 0;
};

// The selection policies a pool may name (store::PoolRecord::selection_policy; what
// each does: ready_set.h), for error messages: "fifo, spread, pack".
absl::string_view KnownSelectionPolicies();
// Whether `name` names a selection policy ("" is fifo).
bool IsSelectionPolicy(absl::string_view name);

// The result of a claim: its record, and whether it was a retry answered from the table.
struct ClaimResult {
  store::ClaimRecord claim;
  bool replayed = false;
};
using ClaimCallback = absl::AnyInvocable<void(absl::StatusOr<ClaimResult>) &&>;

enum class BatchMode : uint8_t { kAllOrNothing, kBestEffort };

struct BatchRequest {
  std::string owner;
  // Idempotency key of the batch; its claims get ids "<batch_id>#<index>".
  std::string batch_id;
  std::string pool;
  int count = 1;
  BatchMode mode = BatchMode::kAllOrNothing;
  absl::Duration ttl = absl::ZeroDuration();
  std::map<std::string, std::string> labels;
  // As ClaimRequest::env, for every claim of the batch.
  std::map<std::string, std::string> env;
  // As ClaimRequest::node_preference, for every sandbox of the batch.
  std::map<std::string, std::string> node_preference;
  // When too few sandboxes are warm: FAIL answers RESOURCE_EXHAUSTED at once; WAIT and
  // COLD queue the missing ones as waiters of the pool (its target grows by them) until
  // they come or `wait` passes. The pool's default when unset.
  std::optional<store::EmptyPoolPolicy> policy;
  // How long WAIT/COLD may wait; the pool's default_wait when zero.
  absl::Duration wait = absl::ZeroDuration();
  // Optional: the caller's way to give up waiting.
  std::shared_ptr<WaitCancellation> cancellation;
  // As ClaimRequest's, for every waiting member of the batch.
  ClaimPriority priority = ClaimPriority::kNormal;
  int weight = 1;
  // As ClaimRequest's; the batch counts `count` claims, taken all at once or refused (a
  // BEST_EFFORT batch gives back those it is not granted). A retry of a granted batch is
  // answered; one of a batch still waiting for sandboxes counts again.
  int64_t max_claims = 0;
};
using BatchCallback = absl::AnyInvocable<void(absl::StatusOr<std::vector<ClaimResult>>) &&>;
using StatusCallback = absl::AnyInvocable<void(absl::Status) &&>;
// A claim's record once it has ended (Release).
using EndedCallback = absl::AnyInvocable<void(absl::StatusOr<store::ClaimRecord>) &&>;

// Runs `call` (an allocator method given a StatusCallback) and blocks until its callback
// has run; returns that status. For start-up code and controllers, never the claim path.
[[nodiscard]] inline absl::Status Wait(const std::function<void(StatusCallback)>& call) {
  absl::Notification done;
  absl::Status result;
  call([&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

struct PoolStatus {
  std::string name;
  int64_t warm = 0;
  int64_t claimed = 0;
  int64_t waiting = 0;
  int64_t target = 0;
  int32_t min_warm = 0;
  int32_t max_warm = 0;
  store::PoolSizing sizing = store::PoolSizing::kStatic;
  // What decided the target, and the demand estimate (computed for static pools too).
  TargetReason target_reason = TargetReason::kFloor;
  DemandEstimate demand;
  // Claims (a batch: its count) that reached the pool since it was created in this process.
  uint64_t arrivals = 0;
  // Claim outcomes, latencies and ends of this pool since it was created in this process.
  PoolCountsSnapshot counts;
  // The runtime's error of the last failed create, empty once a create succeeded; and the
  // failed creates since the pool was created in this process (ObserveCreateResult).
  std::string last_error;
  uint64_t create_failures = 0;
};

struct ClaimFilter {
  std::string owner;  // required (unless all_owners): a tenant lists only its own claims
  // Every owner's claims (owner is ignored). For sbx's own components (the Kubernetes
  // mirror of gRPC claims as SandboxClaims), never for a tenant's request.
  bool all_owners = false;
  std::string pool;  // empty: all pools
  // Every pair must match the claim's labels.
  std::map<std::string, std::string> labels;
  bool include_ended = false;
  // Page: claims are ordered by id; start after this id ("" = from the start).
  std::string after;
  int limit = 100;
};

struct RecoveryStats {
  size_t templates = 0, pools = 0, sandboxes = 0, active_claims = 0, ended_claims = 0;
  size_t dropped_sandboxes = 0;  // sandbox records of pools that no longer exist
  // Where the revision sequence continues: the highest of the store's revision mark and
  // the revisions in its claim records.
  uint64_t revision = 0;
  absl::Duration took;
  // The snapshot records the store held (snapshots.h takes them over at start).
  std::vector<store::SnapshotRecord> snapshots;
};

class Allocator {
 public:
  // Loads everything from `store` and rebuilds pools, warm sandboxes and claims. Turns off
  // abseil's debug deadlock detection for the process (see allocator_impl.cc for why).
  // Errors: the store's (DATA_LOSS for undecodable records), DATA_LOSS when the stored
  // state is inconsistent (a sandbox bound to two active claims), INVALID_ARGUMENT for
  // bad options.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Allocator>> Create(
      AllocatorOptions options, store::Store* store, runtime::Runtime* runtime,
      Reconciler* reconciler, Clock* clock, IdGenerator* ids);

  virtual ~Allocator() = default;

  virtual const RecoveryStats& recovery() const = 0;
  // The largest ClaimBatch count (AllocatorOptions::max_batch).
  virtual int max_batch() const = 0;
  // The largest max_warm of a pool (AllocatorOptions::max_pool_warm).
  virtual int max_pool_warm() const = 0;
  // The namespace of pools and templates named without one
  // (AllocatorOptions::default_namespace).
  virtual const std::string& default_namespace() const = 0;

  // --- Admin (durable before the callback) ---
  // Creates or replaces. INVALID_ARGUMENT for a bad name or runtime; NOT_FOUND when a
  // pool names a template that does not exist.
  virtual void PutTemplate(store::TemplateRecord t, StatusCallback done) = 0;
  [[nodiscard]] virtual absl::StatusOr<store::TemplateRecord> GetTemplate(
      const std::string& name) const = 0;
  virtual std::vector<store::TemplateRecord> ListTemplates() const = 0;
  // FAILED_PRECONDITION while a pool uses the template.
  virtual void DeleteTemplate(const std::string& name, StatusCallback done) = 0;
  virtual void PutPool(store::PoolRecord p, StatusCallback done) = 0;
  [[nodiscard]] virtual absl::StatusOr<PoolStatus> GetPoolStatus(const std::string& pool) const = 0;
  [[nodiscard]] virtual absl::StatusOr<store::PoolRecord> GetPool(
      const std::string& pool) const = 0;
  virtual std::vector<store::PoolRecord> ListPools() const = 0;
  // FAILED_PRECONDITION while claims are active on the pool; retires its warm sandboxes.
  virtual void DeletePool(const std::string& name, StatusCallback done) = 0;

  // --- Runtime side ---
  // A new sandbox is ready: it becomes warm in its pool (or goes straight to the next
  // waiting claim by fair share and priority). NOT_FOUND when the pool does not exist (the sandbox
  // is retired).
  [[nodiscard]] virtual absl::Status AddSandbox(const runtime::SandboxInfo& sandbox) = 0;
  // Sandbox `id` no longer exists. A warm one is skipped from now on; a claimed one
  // makes its claim LOST. NOT_FOUND for an unknown id.
  [[nodiscard]] virtual absl::Status SandboxGone(const std::string& id) = 0;
  // Takes warm sandbox `id` out of its pool for good (scale-down, a stale template): it
  // will never be claimed, its record is deleted and the reconciler is asked to retire
  // it. FAILED_PRECONDITION when it is not warm (a claim holds it or is taking it; the
  // claim wins), NOT_FOUND for an unknown id.
  [[nodiscard]] virtual absl::Status RetireWarm(const std::string& id) = 0;
  // Retires up to `n` warm sandboxes of `pool` (demand sizing's scale-down), the ones its
  // selection policy would hand out first. Returns how many it retired; NOT_FOUND for an
  // unknown pool.
  [[nodiscard]] virtual absl::StatusOr<int> TrimWarm(const std::string& pool, int n) = 0;
  // A sandbox of `pool` took `took` from its create request until it was ready (the
  // demand estimate's create latency). Unknown pools are ignored.
  virtual void ObserveCreateLatency(const std::string& pool, absl::Duration took) = 0;
  // How a create for `pool` ended: an error becomes the pool's last_error and counts in
  // its create_failures; OK clears last_error. Unknown pools are ignored.
  virtual void ObserveCreateResult(const std::string& pool, const absl::Status& result) = 0;
  // Ids of every sandbox the allocator tracks (warm or claimed), for reconciling with the
  // runtime after a restart: those the runtime does not have are reported SandboxGone.
  virtual std::vector<std::string> ListSandboxIds() const = 0;

  // --- Claims ---
  // Completes `done` once the claim is durable (or failed). Errors: INVALID_ARGUMENT,
  // NOT_FOUND (pool), RESOURCE_EXHAUSTED (FAIL policy, empty pool; or the owner is at its
  // max_claims; the message has a retry hint), DEADLINE_EXCEEDED (WAIT/COLD deadline passed;
  // nothing is left behind), ALREADY_EXISTS (the id names a claim on another pool),
  // FAILED_PRECONDITION (the id names a claim that has ended), the store's error (the sandbox
  // returns to the pool).
  virtual void Claim(ClaimRequest request, ClaimCallback done) = 0;
  // N claims in one durable write. kAllOrNothing: all N, from the warm ones and (WAIT or
  // COLD) those that come before the wait deadline; with FAIL, RESOURCE_EXHAUSTED unless
  // all N are warm now. kBestEffort: as many as are warm, or (WAIT or COLD) as came by the
  // deadline (RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED if none). RESOURCE_EXHAUSTED also
  // when the N claims would take the owner past max_claims. A batch id
  // that names an existing batch answers with its claims (replayed) when pool and count
  // match, ALREADY_EXISTS when they do not, ABORTED while it is being committed.
  virtual void ClaimBatch(BatchRequest request, BatchCallback done) = 0;
  // Ends the claim; its sandbox is retired (deleted, never reused) and the pool refilled.
  // Answers the ended claim's record. Idempotent: a claim that has ended already (released,
  // expired, lost) is answered with its final record, and one whose end (an expiry, a
  // concurrent release) is being committed is answered with its record once that end is
  // durable. Errors: NOT_FOUND (unknown to this owner), ABORTED (the claim is still being
  // granted or updated, or the end being committed failed; retry), the store's error.
  virtual void Release(const std::string& owner, const std::string& claim_id,
                       EndedCallback done) = 0;
  // Sets expiry to now + ttl (capped by the pool's max_ttl); an infinite ttl (and no
  // max_ttl) means the claim no longer expires. Same errors as Release, INVALID_ARGUMENT
  // for a ttl that is not positive or is finite and above kMaxTtl, and ABORTED while
  // another update (renew, suspend, resume) of the claim is in flight.
  virtual void Renew(const std::string& owner, const std::string& claim_id, absl::Duration ttl,
                     ClaimCallback done) = 0;
  // Freezes / thaws the claim's sandbox through Runtime::Suspend / Resume, then records
  // `suspended` in the claim (durable, a new revision, a MODIFIED event) and answers with
  // the updated claim. Idempotent: a claim already in that state is answered as it is,
  // with no new revision. The claim's TTL keeps running. Errors: NOT_FOUND (unknown to
  // this owner), FAILED_PRECONDITION (the claim has ended, or this allocator has no
  // runtime), ABORTED (the claim is being granted or updated; retry), the runtime's error
  // (the claim is unchanged), the store's error.
  virtual void Suspend(const std::string& owner, const std::string& claim_id,
                       ClaimCallback done) = 0;
  virtual void Resume(const std::string& owner, const std::string& claim_id,
                      ClaimCallback done) = 0;
  [[nodiscard]] virtual absl::StatusOr<store::ClaimRecord> GetClaim(
      const std::string& owner, const std::string& claim_id) const = 0;
  // Claims as they are now. Read revision() before listing to know where a watch must
  // start to miss nothing: every change up to it is in the list (a claim may also show a
  // newer change, whose event such a watch then repeats; its claim.revision tells).
  virtual std::vector<store::ClaimRecord> ListClaims(const ClaimFilter& filter) const = 0;

  // Claims held (waiting, being granted or active) and max_claims refusals, by owner: every
  // owner seen since the start, sorted by owner.
  virtual std::vector<OwnerClaimCount> OwnerClaimCounts() const = 0;

  // --- Revisions and watches ---
  // The current revision: every change up to it is durable and visible (GetClaim,
  // ListClaims) and has been delivered to the watches. After a restart, the highest
  // revision the store holds.
  virtual uint64_t revision() const = 0;
  // Starts a watch of `request.owner`'s claims (see WatchRequest). `ready` is called,
  // never under the allocator's locks and on whichever thread made the change (usually the
  // store's committer), when the watch has something to take after a Poll that found
  // nothing (or has ended). It may also be called when there turns out to be nothing; it
  // must not block. The caller must Poll once after Watch returns (the initial state and
  // any replayed history are already queued; `ready` is not called for them). Errors:
  // INVALID_ARGUMENT (no owner), OUT_OF_RANGE (start_revision is older than the history
  // kept, or newer than revision()), UNAVAILABLE (watches were closed).
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<ClaimWatch>> Watch(
      WatchRequest request, std::function<void()> ready) = 0;
  // Ends every watch with `status` (not OK) and refuses new ones with it, e.g. UNAVAILABLE
  // when the server starts shutting down, so that streams end at once instead of at the
  // end of the grace period. The allocator's destructor does the same.
  virtual void CloseWatches(absl::Status status) = 0;

  // Fires due timers now (expiry, deadlines, purges). Returns how many ran. The timer
  // thread calls this; tests with a FakeClock call it directly.
  virtual int Tick() = 0;
};

}  // namespace sbx::allocator
