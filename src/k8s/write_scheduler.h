#pragma once
// WriteScheduler: the one door through which the allocator's side of sbx on Kubernetes
// (the sbx::k8s_pools room) writes to the API server: the KubeRuntime (member creates at
// refill priority, deletes at clean-up), the ClaimWriter for the ClaimController and its
// GrpcClaimMirror (bindings, claim status and pod patches at claim priority, their deletes
// at clean-up) and the WarmPoolController (its
// deletes of surplus, stale and untracked members, at clean-up). Writes wait in three FIFO
// queues by priority — claim-path writes before refills (new warm members) before clean-up
// (deletes) — and leave them under one token bucket per cluster, run by a fixed set of
// worker threads (the client is blocking; the workers give it concurrency). A burst of
// refills or deletes can therefore never hold back the binding of a claim by more than
// the writes already running.
//
// The SandboxController and TemplateController write through the client directly (under
// its own token bucket). They run with every runtime, also where no scheduler exists
// (`--runtime` other than kubernetes), and their writes are not of one priority: the
// Sandbox controller's pod creates and status writes are the second half of every refill
// and of every claim's readiness, so putting its deletes (pods of suspended or expired
// Sandboxes, an expired Sandbox, its Service) alone behind this door would split one
// reconcile's writes between two queues without putting a claim ahead of anything.
//
// Thread-safety: Submit from any thread. Writes run on the workers, concurrently; each
// write must be safe to run at the same time as any other.
// Lifetime: Stop (or the destructor) runs nothing more, drops what is queued after
// calling each dropped write's `dropped` hook, and joins the workers.

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/k8s/rate_limiter.h"

namespace sbx::k8s {

enum class WritePriority : uint8_t { kClaim = 0, kRefill = 1, kCleanup = 2 };

struct WriteSchedulerOptions {
  // Threads running writes; the most writes in flight at once.
  int workers = 32;
  // Token bucket over all writes of this scheduler (0 qps: unlimited).
  double qps = 2000;
  int burst = 200;
  // Time of the token bucket's waits; the real clock when null. Must outlive the scheduler.
  const Clock* clock = nullptr;

  [[nodiscard]] absl::Status Validate() const;
};

struct WriteSchedulerStats {
  std::array<uint64_t, 3> submitted{};  // by priority
  std::array<uint64_t, 3> done{};
  std::array<size_t, 3> queued{};
  // Workers holding a write that waits for its token now.
  int throttled = 0;
};

class WriteScheduler {
 public:
  explicit WriteScheduler(WriteSchedulerOptions options);
  ~WriteScheduler();
  WriteScheduler(const WriteScheduler&) = delete;
  WriteScheduler& operator=(const WriteScheduler&) = delete;

  // Queues `write`. After Stop, `write` is not run (`dropped` runs instead, if given).
  void Submit(WritePriority priority, std::function<void()> write,
              std::function<void()> dropped = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `write` and blocks until it has run; returns its status, or CANCELLED when the
  // scheduler stopped first. For callers that may wait (controller workers).
  [[nodiscard]] absl::Status Run(WritePriority priority, std::function<absl::Status()> write)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  WriteSchedulerStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Item {
    std::function<void()> write;
    std::function<void()> dropped;
  };
  void Worker() ABSL_LOCKS_EXCLUDED(mu_);

  const WriteSchedulerOptions options_;
  const Clock* const clock_;
  RateLimiter limiter_;
  std::vector<std::thread> workers_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::array<std::deque<Item>, 3> queues_ ABSL_GUARDED_BY(mu_);
  WriteSchedulerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s
