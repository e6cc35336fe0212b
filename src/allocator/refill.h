#pragma once
// RefillReconciler: the Reconciler that keeps pools at their target by creating sandboxes
// through a Runtime, and deletes retired ones. Level-triggered: whenever it runs it
// compares each pool's target with what is warm plus what it is already creating, so a
// lost or repeated notification never causes over- or under-creation.
//
// Runtime writes go through one token bucket (qps, burst) shared by creates and deletes;
// creates go first, deletes (clean-up) only with budget left over, as design.md asks.
// A failed create is retried with exponential backoff per pool; a create that succeeds
// ends the backoff. Every pass samples each pool's demand estimate (Pool::Decide); pools
// sized by demand lose their surplus warm sandboxes when the target falls (TrimWarm), and
// every create's latency is reported to the estimate.
//
// Thread-safety: PoolBelowTarget and RetireSandbox may be called from any thread and
// only set state and wake the worker (at most once per RefillOptions::coalesce while
// they keep coming). Runtime callbacks may arrive on any thread.
// Lifetime: Start() after the Allocator exists; Stop() (or the destructor) before the
// Allocator and the Runtime are destroyed. Stop waits for the creates and deletes in
// flight to call back.

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/allocator/allocator.h"
#include "src/allocator/reconciler.h"
#include "src/common/clock.h"
#include "src/runtime/runtime.h"

namespace sbx::allocator {

struct RefillOptions {
  // Runtime writes (creates + deletes) per second, and how many may be spent at once.
  double qps = 200;
  int burst = 50;
  // At most this many creates in flight per pool.
  int max_creating_per_pool = 64;
  // Backoff after a failed create: starts here, doubles up to max_backoff.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  // Every pool is re-checked this often even without a notification (level-triggered).
  absl::Duration resync = absl::Seconds(1);
  // While notifications keep coming (one arrived during the last pass), the worker lets
  // them gather this long (real time) before its next pass instead of being woken for
  // each: under a stream of claims it then runs once per window for many of them, not
  // once or twice per claim (a context switch each). A lone notification is still acted
  // on at once. Zero: a pass per wake-up.
  absl::Duration coalesce = absl::Milliseconds(2);

  // INVALID_ARGUMENT naming the bad field.
  [[nodiscard]] absl::Status Validate() const;
};

struct RefillStats {
  uint64_t creates_started = 0;
  uint64_t creates_succeeded = 0;
  uint64_t creates_failed = 0;
  uint64_t deletes_started = 0;
  uint64_t deletes_failed = 0;
  // Warm sandboxes retired because demand sizing lowered the target.
  uint64_t trimmed = 0;
  // Passes of the worker thread (Start), each after a wake-up, a resync or a retry.
  uint64_t passes = 0;
};

class RefillReconciler final : public Reconciler {
 public:
  RefillReconciler(RefillOptions options, runtime::Runtime* runtime, Clock* clock);
  ~RefillReconciler() override;

  // Starts the worker; `allocator` receives the new sandboxes. Call once.
  void Start(Allocator* allocator) ABSL_LOCKS_EXCLUDED(mu_);
  // Like Start, without a worker: the caller drives passes with RunOnce (tests).
  void Attach(Allocator* allocator);
  // Stops the worker and waits for runtime calls in flight. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  void PoolBelowTarget(const std::string& pool) override ABSL_LOCKS_EXCLUDED(mu_);
  void RetireSandbox(const store::SandboxRecord& sandbox) override ABSL_LOCKS_EXCLUDED(mu_);

  // Runs one reconcile pass now (what the worker does when woken). For tests with a
  // FakeClock, which call it instead of starting the worker.
  void RunOnce() ABSL_LOCKS_EXCLUDED(mu_);

  // Creates in flight for `pool`.
  int creating(const std::string& pool) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t pending_deletes() const ABSL_LOCKS_EXCLUDED(mu_);
  RefillStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct PoolState {
    int creating = 0;
    int failures = 0;                            // consecutive failed creates
    absl::Time retry_at = absl::InfinitePast();  // backoff: no create before this
  };

  // Takes up to `want` tokens; returns how many it got.
  int TakeTokensLocked(int want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCreated(const std::string& pool, absl::Time started,
                 absl::StatusOr<runtime::SandboxInfo> info) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDeleted(const std::string& id, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const RefillOptions options_;
  runtime::Runtime* const runtime_;
  Clock* const clock_;
  Allocator* allocator_ = nullptr;  // set by Start/Attach, before any pass runs
  std::thread worker_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  // Runtime calls whose callback has not run yet; Stop waits for zero.
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_at_ ABSL_GUARDED_BY(mu_);
  absl::Time next_resync_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Pools to look at on the next pass, and every pool seen (for resyncs).
  absl::flat_hash_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PoolState> pools_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> deletes_ ABSL_GUARDED_BY(mu_);
  RefillStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::allocator
