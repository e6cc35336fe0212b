#pragma once
// A pool: its settings, its lock-free ready set of warm sandboxes, and the queue of claims
// waiting for one (served by fair share between tenants, by priority within a tenant, and
// FIFO within one tenant and priority: waiter_queue.h).
//
// Thread-safety: all methods may be called concurrently. TryTake is lock-free (the
// ready set's queue plus one CAS per candidate), and so is AddWarm while no claim waits;
// the waiter queue and settings use a mutex, touched on the claim path only when the
// pool is empty.
// Lifetime: owned by the Allocator, never freed before it (sandboxes point to it).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/pool_counters.h"
#include "src/allocator/ready_set.h"
#include "src/allocator/sandbox.h"
#include "src/allocator/waiter_queue.h"
#include "src/store/records.h"

namespace sbx::allocator {

class Pool {
 public:
  // Test hook (a sync point): runs in AddWarm's lock-free path after it saw no waiter and
  // before it pushes. Null in production.
  using Hook = std::function<void()>;

  Pool(store::PoolRecord settings, std::unique_ptr<SelectionPolicy> ready,
       Hook before_unlocked_push = nullptr);

  const std::string& name() const { return name_; }

  store::PoolRecord settings() const ABSL_LOCKS_EXCLUDED(mu_);
  void set_settings(store::PoolRecord settings) ABSL_LOCKS_EXCLUDED(mu_);

  // Takes a warm sandbox and moves it to kClaimed, or returns nullptr when none is warm.
  // Dead sandboxes met on the way are dropped. Lock-free. `after_pop` is a test hook run
  // between popping a candidate and claiming it (nullptr in production).
  SandboxPtr TryTake(const std::function<void(const SandboxPtr&)>* after_pop = nullptr);

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

  // The floor, readable without the lock on the claim path.
  int32_t min_warm() const { return min_warm_.load(std::memory_order_relaxed); }

  // The number of warm sandboxes the pool should have now: its floor plus the claims
  // waiting, capped by its ceiling.
  int64_t Target() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  SandboxPtr PopWarm(const std::function<void(const SandboxPtr&)>* after_pop);
  // Hands warm sandboxes in the ready set to queued waiters until one side is empty.
  void MatchWaiters() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_;
  const std::unique_ptr<SelectionPolicy> ready_;
  const Hook before_unlocked_push_;
  // Counters read by the scheduler and metrics; relaxed, as they order nothing.
  std::atomic<int64_t> warm_{0};
  std::atomic<int64_t> claimed_{0};
  // Copy of settings_.min_warm for the lock-free refill check; relaxed, a hint only.
  std::atomic<int32_t> min_warm_{0};
  // Claims queued or about to queue as waiters. Lets AddWarm skip the lock when nobody
  // waits. seq_cst, with a fence on each side (AddWarm: push, fence, load; TakeOrEnqueue:
  // increment, fence, pop): either the waiter's pop sees the pushed sandbox or AddWarm
  // sees the waiter and matches them under the lock, so no wakeup is lost.
  std::atomic<int64_t> waiting_{0};
  PoolCounters counters_;

  mutable absl::Mutex mu_;
  store::PoolRecord settings_ ABSL_GUARDED_BY(mu_);
  WaiterQueue waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::allocator
