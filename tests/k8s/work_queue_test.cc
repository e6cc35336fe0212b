#include "src/k8s/work_queue.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

TEST(WorkQueueTest, AKeyIsQueuedOnce) {
  WorkQueue queue;
  queue.Add("a");
  queue.Add("b");
  queue.Add("a");
  EXPECT_EQ(queue.Depth(), 2u);
  std::string key;
  ASSERT_TRUE(queue.Get(&key));
  EXPECT_EQ(key, "a");
  ASSERT_TRUE(queue.Get(&key));
  EXPECT_EQ(key, "b");
}

TEST(WorkQueueTest, AKeyAddedWhileWorkedOnComesBackAfterDone) {
  WorkQueue queue;
  queue.Add("a");
  std::string key;
  ASSERT_TRUE(queue.Get(&key));
  queue.Add("a");
  queue.Add("a");
  // Not handed to a second worker while the first has it.
  EXPECT_EQ(queue.Depth(), 0u);
  queue.Done("a");
  EXPECT_EQ(queue.Depth(), 1u);
  ASSERT_TRUE(queue.Get(&key));
  queue.Done("a");
  EXPECT_EQ(queue.Depth(), 0u);
}

TEST(WorkQueueTest, NoKeyIsWorkedOnTwiceAtOnce) {
  WorkQueue queue;
  std::atomic<int> in_flight[4] = {0, 0, 0, 0};
  std::atomic<bool> overlap{false};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      std::string key;
      while (queue.Get(&key)) {
        int k = key[0] - 'a';
        if (in_flight[k].fetch_add(1) != 0) overlap = true;
        std::this_thread::yield();
        in_flight[k].fetch_sub(1);
        processed.fetch_add(1);
        queue.Done(key);
      }
    });
  }
  for (int i = 0; i < 4000; ++i) queue.Add(std::string(1, static_cast<char>('a' + i % 4)));
  while (queue.Depth() > 0) std::this_thread::yield();
  queue.ShutDown();
  for (auto& w : workers) w.join();
  EXPECT_FALSE(overlap.load());
  EXPECT_GT(processed.load(), 0);
}

// Blocks until a Get of `queue` is waiting (bounded: fails after 10 s).
void AwaitWaitingWorker(const WorkQueue& queue) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (queue.Waiting() == 0 && absl::Now() < deadline) std::this_thread::yield();
  ASSERT_EQ(queue.Waiting(), 1) << "no worker waiting";
}

// Delayed adds come due by the injected clock, the earliest first; a later add of a key
// already delayed does not postpone it. Backoff doubles up to its maximum.
TEST(WorkQueueTest, DelayedAndRateLimitedAdds) {
  FakeClock clock;
  WorkQueue queue(WorkQueueOptions{absl::Milliseconds(10), absl::Milliseconds(40), &clock});
  queue.AddAfter("later", absl::Milliseconds(30));
  queue.AddAfter("later", absl::Hours(1));  // an earlier pending add wins
  queue.AddAfter("last", absl::Milliseconds(31));
  EXPECT_EQ(queue.Depth(), 0u);
  EXPECT_EQ(queue.Delayed(), 2u);
  clock.Advance(absl::Milliseconds(30));
  std::string key;
  ASSERT_TRUE(queue.Get(&key));  // due now: does not block
  EXPECT_EQ(key, "later");
  EXPECT_EQ(queue.Delayed(), 1u);  // "last" is not due yet
  queue.Done(key);
  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(queue.Get(&key));
  EXPECT_EQ(key, "last");
  queue.Done(key);

  // Four failures: 10, 20, 40, 40 ms (the last two at the maximum); the earliest pending
  // add is the first one's, due in 10 ms.
  for (int i = 1; i <= 4; ++i) queue.AddRateLimited("flaky");
  EXPECT_EQ(queue.Failures("flaky"), 4);
  queue.AddAfter("marker", absl::Milliseconds(9));
  clock.Advance(absl::Milliseconds(9));
  ASSERT_TRUE(queue.Get(&key));
  EXPECT_EQ(key, "marker");
  EXPECT_EQ(queue.Delayed(), 1u);
  queue.Done(key);
  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(queue.Get(&key));
  EXPECT_EQ(key, "flaky");
  queue.Forget("flaky");
  EXPECT_EQ(queue.Failures("flaky"), 0);
  queue.Done(key);
  // The backoff starts again from the base after Forget.
  queue.AddRateLimited("flaky");
  queue.AddAfter("marker", absl::Milliseconds(9));
  clock.Advance(absl::Milliseconds(9));
  ASSERT_TRUE(queue.Get(&key));
  EXPECT_EQ(key, "marker");
  EXPECT_EQ(queue.Delayed(), 1u);
}

TEST(WorkQueueTest, ShutDownWakesWorkers) {
  WorkQueue queue;
  std::thread worker([&] {
    std::string key;
    EXPECT_FALSE(queue.Get(&key));
  });
  AwaitWaitingWorker(queue);
  queue.ShutDown();
  worker.join();
  queue.Add("x");  // ignored after shutdown
  EXPECT_EQ(queue.Depth(), 0u);
}

// A worker already waiting on an empty queue (no deadline) gets a key added later with a
// delay once the delay is over, not only when something else wakes it.
TEST(WorkQueueTest, DelayedAddWakesAWorkerThatIsAlreadyWaiting) {
  FakeClock clock;
  WorkQueueOptions options;
  options.clock = &clock;
  WorkQueue q(options);
  std::string got;
  absl::Notification done;
  std::thread worker([&] {
    if (q.Get(&got)) done.Notify();
  });
  AwaitWaitingWorker(q);  // waiting with no deadline
  q.AddAfter("late", absl::Milliseconds(20));
  clock.Advance(absl::Milliseconds(20));
  // Generous: without the wake-up the worker would sleep for ever.
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  q.ShutDown();
  worker.join();
  EXPECT_EQ(got, "late");
}

}  // namespace
}  // namespace sbx::k8s
