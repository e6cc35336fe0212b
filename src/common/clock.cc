#include "src/common/clock.h"

namespace sbx {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  using Clock::AwaitUntil;
  bool AwaitUntil(absl::Mutex& mu, const absl::Condition& condition,
                  absl::Time deadline) const override {
    return mu.AwaitWithDeadline(condition, deadline);
  }
};

}  // namespace

Clock& Clock::Real() {
  static RealClock* clock = new RealClock();
  return *clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

bool FakeClock::AwaitUntil(absl::Mutex& mu, const absl::Condition& condition,
                           absl::Time deadline) const {
  // Fake time does not pass by itself: poll in short real-time slices so that a thread
  // parked here notices both `condition` and an Advance() beyond its deadline.
  while (true) {
    if (mu.AwaitWithTimeout(condition, absl::Milliseconds(1))) return true;
    if (Now() >= deadline) return false;
  }
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

void FakeClock::Set(absl::Time t) {
  absl::MutexLock lock(&mu_);
  now_ = t;
}

}  // namespace sbx
