#pragma once
// Timers for claim expiry, wait deadlines and the idempotency window: an ordered map by
// deadline, so that firing costs O(log n) per timer and never scans all claims. Each
// timer carries a small payload (the allocator's is a kind and a claim), stored in the
// map itself: scheduling allocates no callback.
//
// Thread-safety: all methods may be called concurrently. RunDue hands payloads to its
// function outside the queue's lock, so that function may schedule or cancel timers.

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sbx::allocator {

// Identifies one scheduled timer; a default handle names none.
struct TimerHandle {
  absl::Time when = absl::InfinitePast();
  uint64_t seq = 0;
  bool valid() const { return seq != 0; }
};

template <typename Payload>
class TimerQueue {
 public:
  TimerHandle Schedule(absl::Time when, Payload payload) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    TimerHandle h{when, next_seq_++};
    timers_.emplace(std::make_pair(when, h.seq), std::move(payload));
    return h;
  }

  // Returns true if the timer was still pending (it will not run).
  bool Cancel(const TimerHandle& handle) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!handle.valid()) return false;
    absl::MutexLock lock(&mu_);
    return timers_.erase(std::make_pair(handle.when, handle.seq)) > 0;
  }

  // Calls fn(payload) for every timer due at `now`, earliest first. Returns how many ran.
  template <typename Fn>
  int RunDue(absl::Time now, Fn&& fn) ABSL_LOCKS_EXCLUDED(mu_) {
    int ran = 0;
    while (std::optional<Payload> p = PopDue(now)) {
      fn(std::move(*p));
      ++ran;
    }
    return ran;
  }

  // The earliest pending deadline, or InfiniteFuture() when none.
  absl::Time NextDeadline() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
  }

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return timers_.size();
  }

 private:
  std::optional<Payload> PopDue(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = timers_.begin();
    if (it == timers_.end() || it->first.first > now) return std::nullopt;
    std::optional<Payload> p(std::move(it->second));
    timers_.erase(it);
    return p;
  }

  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::btree_map<std::pair<absl::Time, uint64_t>, Payload> timers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::allocator
