// WriteScheduler: claim writes leave before refills, refills before clean-up, under the
// token bucket; a write that waits for its token waits on the injected clock. One worker
// and a FakeClock make the order deterministic: the test holds the worker with a gated
// write while it queues the others, and moves the clock only once the worker is seen
// waiting for a token (stats().throttled).

#include "src/k8s/write_scheduler.h"

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/common/clock.h"

namespace sbx::k8s {
namespace {

// Polls `done` (at most 20 s of real time) until it holds: a bounded wait for a marker.
bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// The names of the writes that ran, in order.
class Log {
 public:
  std::function<void()> Write(std::string name) {
    return [this, name] {
      absl::MutexLock lock(&mu_);
      ran_.push_back(name);
    };
  }
  std::vector<std::string> ran() const {
    absl::MutexLock lock(&mu_);
    return ran_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> ran_ ABSL_GUARDED_BY(mu_);
};

class WriteSchedulerTest : public ::testing::Test {
 protected:
  // One worker, one write per second of clock_, no burst beyond one.
  WriteSchedulerOptions Options() {
    WriteSchedulerOptions options;
    options.workers = 1;
    options.qps = 1;
    options.burst = 1;
    options.clock = &clock_;
    return options;
  }
  // Submits a write that blocks the worker until `release_` is notified, and waits until
  // it runs (it takes the one token of the burst).
  void HoldTheWorker(WriteScheduler& writes) {
    absl::Notification started;
    writes.Submit(WritePriority::kClaim, [this, &started] {
      started.Notify();
      release_.WaitForNotification();
    });
    started.WaitForNotification();
  }
  // Waits until the worker holds a write that waits for its token, then moves the clock by
  // one token's worth.
  void NextToken(WriteScheduler& writes) {
    ASSERT_TRUE(Eventually([&] { return writes.stats().throttled == 1; }))
        << "the worker is not waiting for a token";
    clock_.Advance(absl::Seconds(1));
  }

  FakeClock clock_;
  absl::Notification release_;
  Log log_;
};

TEST_F(WriteSchedulerTest, ClaimsBeforeRefillsBeforeCleanUp) {
  WriteScheduler writes(Options());
  HoldTheWorker(writes);
  // Queued while the worker is busy, lowest priority first.
  writes.Submit(WritePriority::kCleanup, log_.Write("cleanup-1"));
  writes.Submit(WritePriority::kRefill, log_.Write("refill-1"));
  writes.Submit(WritePriority::kCleanup, log_.Write("cleanup-2"));
  writes.Submit(WritePriority::kClaim, log_.Write("claim-1"));
  writes.Submit(WritePriority::kRefill, log_.Write("refill-2"));
  writes.Submit(WritePriority::kClaim, log_.Write("claim-2"));
  EXPECT_EQ(writes.stats().queued, (std::array<size_t, 3>{2, 2, 2}));
  release_.Notify();
  // The bucket is empty: each write waits for its token, one second of clock_ apart.
  for (size_t i = 1; i <= 6; ++i) {
    ASSERT_NO_FATAL_FAILURE(NextToken(writes));
    ASSERT_TRUE(Eventually([&] { return log_.ran().size() == i; }));
  }
  EXPECT_EQ(log_.ran(), (std::vector<std::string>{"claim-1", "claim-2", "refill-1", "refill-2",
                                                  "cleanup-1", "cleanup-2"}));
  const WriteSchedulerStats stats = writes.stats();
  EXPECT_EQ(stats.submitted, (std::array<uint64_t, 3>{3, 2, 2}));  // with the gate
  EXPECT_TRUE(Eventually([&] { return writes.stats().done[2] == 2; }));
}

// A claim that arrives while a refill already waits for its token goes before every other
// refill and clean-up still queued, though they came first.
TEST_F(WriteSchedulerTest, AClaimArrivingUnderTheLimitOvertakesWhatIsQueued) {
  WriteScheduler writes(Options());
  HoldTheWorker(writes);
  writes.Submit(WritePriority::kCleanup, log_.Write("cleanup"));
  writes.Submit(WritePriority::kRefill, log_.Write("refill-1"));
  writes.Submit(WritePriority::kRefill, log_.Write("refill-2"));
  release_.Notify();
  // refill-1 has left its queue and waits for its token: nothing has run.
  ASSERT_TRUE(Eventually([&] { return writes.stats().throttled == 1; }));
  EXPECT_TRUE(log_.ran().empty());
  writes.Submit(WritePriority::kClaim, log_.Write("claim"));
  for (size_t i = 1; i <= 4; ++i) {
    ASSERT_NO_FATAL_FAILURE(NextToken(writes));
    ASSERT_TRUE(Eventually([&] { return log_.ran().size() == i; }));
  }
  EXPECT_EQ(log_.ran(), (std::vector<std::string>{"refill-1", "claim", "refill-2", "cleanup"}));
}

// Stop runs nothing more: what is queued is dropped through its `dropped` hook, and Run
// answers CANCELLED.
TEST_F(WriteSchedulerTest, StopDropsWhatIsQueued) {
  WriteScheduler writes(Options());
  HoldTheWorker(writes);
  bool dropped = false;
  writes.Submit(WritePriority::kRefill, log_.Write("refill"), [&] { dropped = true; });
  absl::Status run;
  absl::Notification ran;
  std::thread runner([&] {
    run = writes.Run(WritePriority::kClaim, [] { return absl::OkStatus(); });
    ran.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return writes.stats().queued[0] == 1; }));
  std::thread stopper([&] { writes.Stop(); });
  // Stop has begun once a new write is dropped at once, in Submit (probes queued before
  // that are dropped by Stop with the rest). Only then is the gated write let go: the
  // worker must find nothing more to run.
  ASSERT_TRUE(Eventually([&] {
    auto at_once = std::make_shared<std::atomic<bool>>(false);
    writes.Submit(WritePriority::kCleanup, log_.Write("probe"), [at_once] { *at_once = true; });
    return at_once->load();
  }));
  release_.Notify();
  stopper.join();
  runner.join();
  EXPECT_TRUE(dropped);
  EXPECT_EQ(run.code(), absl::StatusCode::kCancelled) << run;
  EXPECT_TRUE(log_.ran().empty());
}

}  // namespace
}  // namespace sbx::k8s
