#include "src/k8s/work_queue.h"

#include <algorithm>

namespace sbx::k8s {

void WorkQueue::AddLocked(const std::string& key) {
  if (shutting_down_) return;
  if (!dirty_.insert(key).second) return;  // already queued (or to be re-queued)
  if (processing_.contains(key)) return;   // Done() queues it again
  queue_.push_back(key);
}

void WorkQueue::Add(const std::string& key) {
  absl::MutexLock lock(&mu_);
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, absl::Duration delay) {
  if (delay <= absl::ZeroDuration()) {
    Add(key);
    return;
  }
  const absl::Time at = clock_->Now() + delay;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  auto existing = delayed_at_.find(key);
  if (existing != delayed_at_.end()) {
    if (existing->second <= at) return;
    // Replace the later entry with this earlier one.
    auto range = delayed_.equal_range(existing->second);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == key) {
        delayed_.erase(it);
        break;
      }
    }
  }
  delayed_.emplace(at, key);
  delayed_at_[key] = at;
  ++delayed_changes_;  // wakes a Get sleeping until a later (or no) deadline
}

void WorkQueue::AddRateLimited(const std::string& key) {
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    const int failures = ++failures_[key];
    delay = options_.base_backoff * (int64_t{1} << std::min(failures - 1, 30));
    delay = std::min(delay, options_.max_backoff);
  }
  AddAfter(key, delay);
}

void WorkQueue::Forget(const std::string& key) {
  absl::MutexLock lock(&mu_);
  failures_.erase(key);
}

int WorkQueue::Failures(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

void WorkQueue::PromoteDueLocked(absl::Time now) {
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    std::string key = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    delayed_at_.erase(key);
    AddLocked(key);
  }
}

bool WorkQueue::Get(std::string* key) {
  absl::MutexLock lock(&mu_);
  while (true) {
    PromoteDueLocked(clock_->Now());
    if (shutting_down_) return false;
    if (!queue_.empty()) break;
    const absl::Time wake = delayed_.empty() ? absl::InfiniteFuture() : delayed_.begin()->first;
    const uint64_t changes = delayed_changes_;
    auto ready = [this, changes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || !queue_.empty() || delayed_changes_ != changes;
    };
    ++waiting_;
    clock_->AwaitUntil(mu_, absl::Condition(&ready), wake);
    --waiting_;
  }
  *key = std::move(queue_.front());
  queue_.pop_front();
  dirty_.erase(*key);
  processing_.insert(*key);
  return true;
}

void WorkQueue::Done(const std::string& key) {
  absl::MutexLock lock(&mu_);
  processing_.erase(key);
  if (dirty_.contains(key) && !shutting_down_) queue_.push_back(key);
}

void WorkQueue::ShutDown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
}

size_t WorkQueue::Depth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

int WorkQueue::Waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

bool WorkQueue::Idle() const {
  absl::MutexLock lock(&mu_);
  return queue_.empty() && processing_.empty();
}

size_t WorkQueue::Delayed() const {
  absl::MutexLock lock(&mu_);
  return delayed_.size();
}

}  // namespace sbx::k8s
