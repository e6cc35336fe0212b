#pragma once
// Clock: the one source of time for sbx components, injected so that tests can drive
// time by hand (FakeClock) instead of sleeping.
//
// Thread-safety: all methods of every Clock are safe to call from any thread.
// Lifetime: a Clock must outlive every component it was given to.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sbx {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock now. Used for expiry times that are stored and shown to clients.
  virtual absl::Time Now() const = 0;
  // Blocks the calling thread until Now() >= deadline or `condition` holds (evaluated
  // with `mu` held; the caller holds `mu`). Returns true if `condition` held.
  // Timer threads use this so that a FakeClock can release them when time moves.
  virtual bool AwaitUntil(absl::Mutex& mu, const absl::Condition& condition,
                          absl::Time deadline) const = 0;
  // The same for the condition "`*wake` is true".
  bool AwaitUntil(absl::Mutex& mu, const bool* wake, absl::Time deadline) const {
    return AwaitUntil(mu, absl::Condition(wake), deadline);
  }

  // The process-wide real clock.
  static Clock& Real();
};

// A clock that moves only when told. Waiters in AwaitUntil wake when Advance/Set passes
// their deadline (they re-check under their own mutex, so tests should call
// Advance and then the component's synchronous tick where one exists).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));
  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);
  using Clock::AwaitUntil;
  bool AwaitUntil(absl::Mutex& mu, const absl::Condition& condition,
                  absl::Time deadline) const override;
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  void Set(absl::Time t) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx
