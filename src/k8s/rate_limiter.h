#pragma once
// RateLimiter: a token bucket (steady `qps`, up to `burst` at once) that tells each caller
// how long to wait before its request may go. Reservations are first come, first served:
// a caller that must wait has its token already taken, so waiters never starve each other.
//
// Thread-safety: Reserve may be called from any thread.

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sbx::k8s {

class RateLimiter {
 public:
  // qps <= 0 means unlimited.
  RateLimiter(double qps, int burst) : qps_(qps), burst_(std::max(1, burst)), tokens_(burst_) {}

  // Takes one token at `now`; returns how long the caller must wait before using it
  // (zero when a token was at hand).
  absl::Duration Reserve(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_) {
    if (qps_ <= 0) return absl::ZeroDuration();
    absl::MutexLock lock(&mu_);
    if (last_ == absl::InfinitePast()) last_ = now;
    if (now > last_) {
      tokens_ = std::min<double>(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * qps_);
      last_ = now;
    }
    tokens_ -= 1;
    if (tokens_ >= 0) return absl::ZeroDuration();
    // Negative tokens are debt: the wait until the bucket has refilled to zero.
    return absl::Seconds(-tokens_ / qps_) + (last_ - now);
  }

 private:
  const double qps_;
  const int burst_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace sbx::k8s
