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

TEST(WorkQueueTest, DelayedAndRateLimitedAdds) {
  WorkQueue queue(WorkQueueOptions{absl::Milliseconds(10), absl::Milliseconds(40)});
  queue.AddAfter("later", absl::Milliseconds(30));
  queue.AddAfter("later", absl::Hours(1));  // an earlier pending add wins
  EXPECT_EQ(queue.Depth(), 0u);
  EXPECT_EQ(queue.Delayed(), 1u);
  std::string key;
  ASSERT_TRUE(queue.Get(&key));  // blocks until due
  EXPECT_EQ(key, "later");
  queue.Done(key);

  for (int i = 1; i <= 4; ++i) queue.AddRateLimited("flaky");
  EXPECT_EQ(queue.Failures("flaky"), 4);
  ASSERT_TRUE(queue.Get(&key));
  EXPECT_EQ(key, "flaky");
  queue.Forget("flaky");
  EXPECT_EQ(queue.Failures("flaky"), 0);
  queue.Done(key);
}

TEST(WorkQueueTest, ShutDownWakesWorkers) {
  WorkQueue queue;
  std::thread worker([&] {
    std::string key;
    EXPECT_FALSE(queue.Get(&key));
  });
  absl::SleepFor(absl::Milliseconds(20));
  queue.ShutDown();
  worker.join();
  queue.Add("x");  // ignored after shutdown
  EXPECT_EQ(queue.Depth(), 0u);
}

// A worker already waiting on an empty queue (no deadline) gets a key added later with a
// delay once the delay is over, not only when something else wakes it.
TEST(WorkQueueTest, DelayedAddWakesAWorkerThatIsAlreadyWaiting) {
  WorkQueue q;
  std::string got;
  absl::Notification done;
  std::thread worker([&] {
    if (q.Get(&got)) done.Notify();
  });
  absl::SleepFor(absl::Milliseconds(50));  // the worker is waiting with no deadline
  q.AddAfter("late", absl::Milliseconds(20));
  // Generous: without the wake-up the worker would sleep for ever.
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  q.ShutDown();
  worker.join();
  EXPECT_EQ(got, "late");
}

}  // namespace
}  // namespace sbx::k8s
