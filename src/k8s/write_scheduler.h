#pragma once
// WriteScheduler: the one door through which sbx's Kubernetes runtime and claim
// controllers write to the API server. Writes wait in three FIFO queues by priority —
// claim-path writes (bindings, claim status) before refills (new warm members) before
// clean-up (deletes) — and leave them under one token bucket per cluster, run by a fixed
// set of worker threads (the client is blocking; the workers give it concurrency). A
// burst of refills or deletes can therefore never hold back the binding of a claim by
// more than the writes already running.
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
#include "src/k8s/rate_limiter.h"

namespace sbx::k8s {

enum class WritePriority : uint8_t { kClaim = 0, kRefill = 1, kCleanup = 2 };

struct WriteSchedulerOptions {
  // Threads running writes; the most writes in flight at once.
  int workers = 32;
  // Token bucket over all writes of this scheduler (0 qps: unlimited).
  double qps = 2000;
  int burst = 200;

  absl::Status Validate() const;
};

struct WriteSchedulerStats {
  std::array<uint64_t, 3> submitted{};  // by priority
  std::array<uint64_t, 3> done{};
  std::array<size_t, 3> queued{};
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
  absl::Status Run(WritePriority priority, std::function<absl::Status()> write)
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
  RateLimiter limiter_;
  std::vector<std::thread> workers_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::array<std::deque<Item>, 3> queues_ ABSL_GUARDED_BY(mu_);
  WriteSchedulerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s
