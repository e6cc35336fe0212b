#include "src/allocator/timer_queue.h"

#include <vector>

#include "gtest/gtest.h"

namespace sbx::allocator {
namespace {

TEST(TimerQueueTest, RunsDueTimersInOrderAndHonoursCancel) {
  TimerQueue<int> q;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  std::vector<int> ran;
  auto run = [&](int v) { ran.push_back(v); };
  q.Schedule(t0 + absl::Seconds(3), 3);
  TimerHandle h = q.Schedule(t0 + absl::Seconds(2), 2);
  q.Schedule(t0 + absl::Seconds(1), 1);
  q.Schedule(t0 + absl::Seconds(1), 11);
  EXPECT_EQ(q.NextDeadline(), t0 + absl::Seconds(1));
  EXPECT_TRUE(q.Cancel(h));
  EXPECT_FALSE(q.Cancel(h));
  EXPECT_FALSE(q.Cancel(TimerHandle{}));
  EXPECT_EQ(q.RunDue(t0, run), 0);
  EXPECT_EQ(q.RunDue(t0 + absl::Seconds(2), run), 2);
  EXPECT_EQ(ran, (std::vector<int>{1, 11}));
  EXPECT_EQ(q.RunDue(t0 + absl::Seconds(10), run), 1);
  EXPECT_EQ(ran, (std::vector<int>{1, 11, 3}));
  EXPECT_EQ(q.NextDeadline(), absl::InfiniteFuture());
  EXPECT_EQ(q.size(), 0u);
}

TEST(TimerQueueTest, HandlersMayScheduleMore) {
  TimerQueue<int> q;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int n = 0;
  q.Schedule(t0, 1);
  EXPECT_EQ(q.RunDue(t0,
                     [&](int v) {
                       ++n;
                       if (v == 1) q.Schedule(t0, 2);
                     }),
            2);
  EXPECT_EQ(n, 2);
}

}  // namespace
}  // namespace sbx::allocator
