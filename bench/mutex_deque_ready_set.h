#pragma once
// Baseline ready sets for the allocator benchmarks: a std::deque behind a mutex, with the
// same SelectionPolicy interface as the lock-free FIFO (NewFifoReadySet), so that both
// can run in one binary and be compared in one run.
//
// Two variants, because the choice of mutex matters under contention: absl::Mutex (what
// sbx uses everywhere else; spins briefly, then parks) and std::mutex (a plain futex
// mutex in libstdc++).
//
// Thread-safety: Push, Pop and SizeApprox may be called concurrently from any threads.

#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/ready_set.h"
#include "src/allocator/sandbox.h"

namespace sbx::bench {

class AbslMutexDequeReadySet final : public allocator::SelectionPolicy {
 public:
  void Push(allocator::SandboxPtr sandbox) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(sandbox));
  }
  allocator::SandboxPtr Pop() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (queue_.empty()) return nullptr;
    allocator::SandboxPtr out = std::move(queue_.front());
    queue_.pop_front();
    return out;
  }
  size_t SizeApprox() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  mutable absl::Mutex mu_;
  std::deque<allocator::SandboxPtr> queue_ ABSL_GUARDED_BY(mu_);
};

class StdMutexDequeReadySet final : public allocator::SelectionPolicy {
 public:
  void Push(allocator::SandboxPtr sandbox) override {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(sandbox));
  }
  allocator::SandboxPtr Pop() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return nullptr;
    allocator::SandboxPtr out = std::move(queue_.front());
    queue_.pop_front();
    return out;
  }
  size_t SizeApprox() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }

 private:
  // Guards queue_. Not annotated: libstdc++'s std::mutex is not a thread-safety
  // capability, so -Wthread-safety cannot check it (the absl variant above is checked).
  mutable std::mutex mu_;
  std::deque<allocator::SandboxPtr> queue_;
};

}  // namespace sbx::bench
