#pragma once
// A pool: its settings, its lock-free ready set of warm sandboxes, and the queue of claims
// waiting for one (served by fair share between tenants, by priority within a tenant, and
// FIFO within one tenant and priority: waiter_queue.h).
//
// Thread-safety: all methods may be called concurrently. TryTake is lock-free (the
// ready set's queue plus one CAS per candidate), and so is AddWarm while no claim waits;
// the waiter queue and settings use a mutex, touched on the claim path only when the
// pool is empty.
// Lifetime: owned by the Allocator, never freed before it (sandboxes point to it). A
// pool keeps every ready set it has had (a change of selection policy makes a new one)
// until it is destroyed: threads may still be using the previous one, and claimed
// sandboxes point to its per-node counts.
//
// Per-node claim counts (for the spread and pack policies): a sandbox counts on its
// node from the moment it leaves the ready set as claimed (TryTake, a waiting claim
// served by AddWarm, AdoptClaimed) until it goes back (GiveBack) or its claim ends
// (Retire).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/demand.h"
#include "src/allocator/pool_counters.h"
#include "src/allocator/ready_set.h"
#include "src/allocator/sandbox.h"
#include "src/allocator/waiter_queue.h"
#include "src/store/records.h"

namespace sbx::allocator {

class Pool {
 public:
  // Test hook (a sync point): runs in AddWarm's lock-free path after it saw no waiter and
  // read which ready set to push to, and before it pushes. Null in production.
  using Hook = std::function<void()>;

  // `ready` follows settings.selection_policy.
  Pool(store::PoolRecord settings, std::unique_ptr<SelectionPolicy> ready,
       Hook before_unlocked_push = nullptr, DemandOptions demand = {},
       absl::Time start = absl::UnixEpoch());

  const std::string& name() const { return name_; }

  store::PoolRecord settings() const ABSL_LOCKS_EXCLUDED(mu_);
  // New settings (validated by the caller). A new selection policy takes effect at once:
  // spread and pack switch in place, keeping the per-node counts; a switch to or from
  // fifo moves the warm sandboxes to a new ready set, whose counts start from the claims
  // made after the switch.
  void set_settings(store::PoolRecord settings) ABSL_LOCKS_EXCLUDED(mu_);

  // Takes a warm sandbox and moves it to kClaimed, or returns nullptr when none is warm.
  // Dead sandboxes met on the way are dropped. Lock-free. `after_pop` is a test hook run
  // between popping a candidate and claiming it (nullptr in production). With `prefer`
  // (not null, not empty) a sandbox on a node with those labels goes first, when the
  // policy knows nodes (ready_set.h).
  SandboxPtr TryTake(const std::function<void(const SandboxPtr&)>* after_pop = nullptr,
                     const NodeLabels* prefer = nullptr);

  // A sandbox taken from this pool (kClaimed) that no claim keeps: back to kWarm and the
  // ready set (or a waiting claim), no longer counted as claimed on its node.
  void GiveBack(SandboxPtr sandbox) ABSL_LOCKS_EXCLUDED(mu_);
  // The claim holding `sandbox` ended: kClaimed -> kRetired, no longer counted on its
  // node. Returns whether this call made the transition.
  bool Retire(const SandboxPtr& sandbox);
  // `sandbox` of this pool was made claimed (a cold start, a claim recovered from the
  // store): it counts on its node like one taken from the ready set.
  void AdoptClaimed(Sandbox& sandbox);

  // Adds a warm sandbox (state kWarm). If claims are waiting, the next by fair share and
  // priority (WaiterQueue::Pop) gets it directly (no thundering herd) and this returns
  // after delivering; otherwise it joins the ready set.
  void AddWarm(SandboxPtr sandbox) ABSL_LOCKS_EXCLUDED(mu_);

  // Slow path of a WAIT claim: under the lock, tries the ready set once more (so that a
  // sandbox added concurrently is never missed) and otherwise queues `waiter` (by its
  // owner, weight and priority).
  // Returns the sandbox if one was taken (the waiter is then not queued).
  SandboxPtr TakeOrEnqueue(WaiterPtr waiter) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes `waiter` if still queued. Returns true if removed (it will never be
  // delivered), false if it was already handed a sandbox.
  bool CancelWaiter(const WaiterPtr& waiter) ABSL_LOCKS_EXCLUDED(mu_);

  // A warm sandbox of this pool died: it is marked dead here only if it was warm (a CAS
  // against claims). Returns true if this call killed a warm sandbox.
  bool MarkDeadIfWarm(const SandboxPtr& sandbox);

  // Counters (approximate under concurrency, exact when quiet).
  int64_t warm() const { return warm_.load(std::memory_order_relaxed); }
  int64_t claimed() const { return claimed_.load(std::memory_order_relaxed); }
  int64_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);
  void AddClaimed(int64_t delta) { claimed_.fetch_add(delta, std::memory_order_relaxed); }

  // Claim outcomes and latencies of this pool, for metrics.
  PoolCounters& counters() { return counters_; }
  const PoolCounters& counters() const { return counters_; }

  // Counts claims (a batch: its count) that reached this pool, for the demand estimate.
  // Lock-free.
  void CountArrivals(uint64_t n) { arrivals_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t arrivals() const { return arrivals_.load(std::memory_order_relaxed); }
  // A sandbox of this pool took `took` from the create request until it was ready.
  void ObserveCreateLatency(absl::Duration took) ABSL_LOCKS_EXCLUDED(demand_mu_);
  // How a create for this pool ended (Allocator::ObserveCreateResult), and what it left.
  void ObserveCreateResult(const absl::Status& result) ABSL_LOCKS_EXCLUDED(error_mu_);
  std::string last_error() const ABSL_LOCKS_EXCLUDED(error_mu_);
  uint64_t create_failures() const ABSL_LOCKS_EXCLUDED(error_mu_);

  // The number of warm sandboxes the pool should have at `now`, and why: static sizing is
  // the floor plus the claims waiting, demand sizing follows the demand estimate
  // (demand.h); both between floor and ceiling. Samples the arrival counter, so the
  // scheduler calls it on every pass.
  TargetDecision Decide(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_, demand_mu_);
  int64_t Target(absl::Time now) { return Decide(now).target; }
  // The last target decided (the floor before any), for the claim path's cheap "below
  // target?" check.
  int64_t target_hint() const { return target_hint_.load(std::memory_order_relaxed); }

 private:
  SandboxPtr PopWarm(const std::function<void(const SandboxPtr&)>* after_pop,
                     const NodeLabels* prefer);
  // Hands warm sandboxes in the ready set to queued waiters until one side is empty.
  void MatchWaiters() ABSL_LOCKS_EXCLUDED(mu_);
  // Moves every sandbox left in `from` (a ready set the pool no longer uses) to the
  // current one.
  void MoveLocked(SelectionPolicy* from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void CountClaimed(Sandbox& sandbox) {
    if (sandbox.node_claims != nullptr)
      sandbox.node_claims->fetch_add(1, std::memory_order_relaxed);
  }
  static void Uncount(Sandbox& sandbox) {
    if (sandbox.node_claims != nullptr)
      sandbox.node_claims->fetch_sub(1, std::memory_order_relaxed);
    sandbox.node_claims = nullptr;
  }

  const std::string name_;
  // The ready set in use, one of sets_. Atomic because set_settings replaces it while
  // claims pop from it without a lock. Loaded with acquire (it is published with a
  // seq_cst store after its construction); AddWarm's lock-free path re-reads it after a
  // seq_cst fence: either that read sees the new set, or the move out of the old set
  // (after its own fence) sees the sandbox pushed, so none is stranded.
  std::atomic<SelectionPolicy*> ready_;
  const Hook before_unlocked_push_;
  // Counters read by the scheduler and metrics; relaxed, as they order nothing.
  std::atomic<int64_t> warm_{0};
  std::atomic<int64_t> claimed_{0};
  // Claims queued or about to queue as waiters. Lets AddWarm skip the lock when nobody
  // waits. seq_cst, with a fence on each side (AddWarm: push, fence, load; TakeOrEnqueue:
  // increment, fence, pop): either the waiter's pop sees the pushed sandbox or AddWarm
  // sees the waiter and matches them under the lock, so no wakeup is lost.
  std::atomic<int64_t> waiting_{0};
  PoolCounters counters_;
  std::atomic<uint64_t> arrivals_{0};
  std::atomic<int64_t> target_hint_{0};

  // Separate from mu_: the scheduler's sampling never delays waiters.
  mutable absl::Mutex error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);
  uint64_t create_failures_ ABSL_GUARDED_BY(error_mu_) = 0;
  absl::Mutex demand_mu_ ABSL_ACQUIRED_AFTER(mu_);
  DemandEstimator demand_ ABSL_GUARDED_BY(demand_mu_);

  mutable absl::Mutex mu_;
  store::PoolRecord settings_ ABSL_GUARDED_BY(mu_);
  WaiterQueue waiters_ ABSL_GUARDED_BY(mu_);
  // Every ready set this pool has had, the one in use last.
  std::vector<std::unique_ptr<SelectionPolicy>> sets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::allocator
