#include "src/allocator/pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace sbx::allocator {
namespace {

store::PoolRecord Settings(int min, int max) {
  store::PoolRecord p;
  p.name = "py";
  p.min_warm = min;
  p.max_warm = max;
  return p;
}

SandboxPtr NewSandbox(Pool* pool, const std::string& id) {
  return std::make_shared<Sandbox>(id, "ep", "", pool, absl::UnixEpoch(), SandboxState::kWarm);
}

TEST(PoolTest, TakesInFifoOrderAndSkipsDead) {
  Pool pool(Settings(0, 10), NewFifoReadySet());
  auto a = NewSandbox(&pool, "a"), b = NewSandbox(&pool, "b"), c = NewSandbox(&pool, "c");
  pool.AddWarm(a);
  pool.AddWarm(b);
  pool.AddWarm(c);
  EXPECT_EQ(pool.warm(), 3);
  EXPECT_TRUE(pool.MarkDeadIfWarm(b));
  EXPECT_EQ(pool.warm(), 2);
  EXPECT_EQ(pool.TryTake(), a);
  EXPECT_EQ(a->Load(), SandboxState::kClaimed);
  EXPECT_EQ(pool.TryTake(), c);
  EXPECT_EQ(pool.TryTake(), nullptr);
  EXPECT_EQ(pool.warm(), 0);
  // A claimed sandbox cannot be killed as warm.
  EXPECT_FALSE(pool.MarkDeadIfWarm(a));
}

TEST(PoolTest, WaitersGetNewSandboxesDirectly) {
  Pool pool(Settings(1, 10), NewFifoReadySet());
  std::vector<std::string> got;
  auto w1 = std::make_shared<Waiter>();
  w1->deliver = [&](SandboxPtr s) { got.push_back("w1:" + s->id); };
  auto w2 = std::make_shared<Waiter>();
  w2->deliver = [&](SandboxPtr s) { got.push_back("w2:" + s->id); };
  EXPECT_EQ(pool.TakeOrEnqueue(w1), nullptr);
  EXPECT_EQ(pool.TakeOrEnqueue(w2), nullptr);
  EXPECT_EQ(pool.waiting(), 2);
  EXPECT_EQ(pool.Target(absl::UnixEpoch()), 3);
  pool.AddWarm(NewSandbox(&pool, "a"));
  EXPECT_TRUE(pool.CancelWaiter(w2));
  EXPECT_FALSE(pool.CancelWaiter(w1));  // already served
  pool.AddWarm(NewSandbox(&pool, "b"));
  EXPECT_EQ(got, (std::vector<std::string>{"w1:a"}));
  EXPECT_EQ(pool.warm(), 1);
}

TEST(PoolTest, TargetStaysWithinFloorAndCeiling) {
  Pool pool(Settings(2, 3), NewFifoReadySet());
  EXPECT_EQ(pool.Target(absl::UnixEpoch()), 2);
  std::vector<WaiterPtr> ws;
  for (int i = 0; i < 5; ++i) {
    ws.push_back(std::make_shared<Waiter>());
    ws.back()->deliver = [](SandboxPtr) {};
    pool.TakeOrEnqueue(ws.back());
  }
  EXPECT_EQ(pool.Target(absl::UnixEpoch()), 3);
}

// Many threads take while others add: every sandbox is taken at most once and none is lost.
TEST(PoolTest, ConcurrentTakeIsExactlyOnce) {
  Pool pool(Settings(0, 1000000), NewFifoReadySet());
  constexpr int kSandboxes = 200000;
  std::vector<SandboxPtr> all;
  for (int i = 0; i < kSandboxes; ++i) all.push_back(NewSandbox(&pool, std::to_string(i)));
  std::vector<std::atomic<int>> taken(kSandboxes);
  std::atomic<int> total{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (auto& s : all) pool.AddWarm(s);
  });
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (total.load() < kSandboxes) {
        if (SandboxPtr s = pool.TryTake()) {
          taken[std::stoi(s->id)].fetch_add(1);
          total.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSandboxes; ++i) ASSERT_EQ(taken[i].load(), 1) << "sandbox " << i;
  EXPECT_EQ(pool.warm(), 0);
}

// The race AddWarm's lock-free path must win, made deterministic: a claim starts waiting
// after AddWarm saw no waiter and before it pushed. The waiter must still get the sandbox.
TEST(PoolTest, WaiterArrivingDuringUnlockedPushIsServed) {
  std::vector<std::string> got;
  auto waiter = std::make_shared<Waiter>();
  waiter->deliver = [&](SandboxPtr s) { got.push_back(s->id); };
  Pool* self = nullptr;
  bool fired = false;
  Pool pool(Settings(0, 10), NewFifoReadySet(), [&] {
    if (fired) return;
    fired = true;
    EXPECT_EQ(self->TakeOrEnqueue(waiter), nullptr);
  });
  self = &pool;
  pool.AddWarm(NewSandbox(&pool, "a"));
  EXPECT_TRUE(fired);
  EXPECT_EQ(got, (std::vector<std::string>{"a"}));
  EXPECT_EQ(pool.warm(), 0);
  EXPECT_EQ(pool.waiting(), 0);
}

// Claims that find the pool empty queue as waiters while a producer adds sandboxes
// without the lock: no waiter may be left waiting while a sandbox sits in the ready set.
TEST(PoolTest, WaitersNeverMissConcurrentlyAddedSandboxes) {
  Pool pool(Settings(0, 1000000), NewFifoReadySet());
  constexpr int kConsumers = 4;
  constexpr int kEach = 20000;
  std::atomic<int> served{0}, stuck{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        if (pool.TryTake() != nullptr) {
          served.fetch_add(1);
          continue;
        }
        auto done = std::make_shared<absl::Notification>();
        auto waiter = std::make_shared<Waiter>();
        waiter->deliver = [done](SandboxPtr) { done->Notify(); };
        if (pool.TakeOrEnqueue(waiter) == nullptr &&
            !done->WaitForNotificationWithTimeout(absl::Seconds(20))) {
          stuck.fetch_add(1);
          pool.CancelWaiter(waiter);
          return;
        }
        served.fetch_add(1);
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < kConsumers * kEach; ++i) pool.AddWarm(NewSandbox(&pool, "s"));
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(stuck.load(), 0);
  EXPECT_EQ(served.load(), kConsumers * kEach);
  EXPECT_EQ(pool.warm(), 0);
  EXPECT_EQ(pool.waiting(), 0);
}

// Issue 22: with waiters of several owners, weights and priorities queued, cancelled (a
// deadline, a caller that gave up) and served concurrently, each waiter is either served
// once or cancelled, never both and never neither, and no sandbox is lost.
TEST(PoolTest, WaitersOfManyOwnersAreServedOrCancelledExactlyOnce) {
  Pool pool(Settings(0, 1000000), NewFifoReadySet());
  constexpr int kOwners = 4;
  constexpr int kEach = 5000;
  struct Slot {
    WaiterPtr waiter;
    std::atomic<int> delivered{0};
    bool cancelled = false;
    bool took = false;  // TakeOrEnqueue answered with a sandbox: never queued
  };
  std::vector<std::vector<Slot>> slots(kOwners);
  for (auto& v : slots) v = std::vector<Slot>(kEach);
  std::vector<std::thread> threads;
  for (int o = 0; o < kOwners; ++o) {
    threads.emplace_back([&, o] {
      for (int i = 0; i < kEach; ++i) {
        Slot& slot = slots[o][i];
        slot.waiter = std::make_shared<Waiter>();
        slot.waiter->owner = absl::StrCat("owner-", o);
        slot.waiter->weight = o + 1;
        slot.waiter->priority = static_cast<ClaimPriority>(i % kClaimPriorities);
        slot.waiter->deliver = [&slot](SandboxPtr) { slot.delivered.fetch_add(1); };
        slot.took = pool.TakeOrEnqueue(slot.waiter) != nullptr;
        // Every third waiter gives up, from the middle of its owner's queue if still there.
        if (i % 3 == 2) slot.cancelled = pool.CancelWaiter(slots[o][i - 1].waiter);
      }
    });
  }
  constexpr int kSandboxes = kOwners * kEach;
  threads.emplace_back([&] {
    for (int i = 0; i < kSandboxes; ++i) pool.AddWarm(NewSandbox(&pool, "s"));
  });
  for (auto& t : threads) t.join();
  int served = 0;
  for (int o = 0; o < kOwners; ++o) {
    for (int i = 0; i < kEach; ++i) {
      const Slot& slot = slots[o][i];
      // The cancellation of waiter i - 1 is recorded on waiter i.
      const bool cancelled = i + 1 < kEach && i % 3 == 1 && slots[o][i + 1].cancelled;
      const int outcomes = slot.delivered.load() + (slot.took ? 1 : 0) + (cancelled ? 1 : 0);
      ASSERT_EQ(outcomes, 1) << "owner " << o << " waiter " << i;
      served += slot.delivered.load() + (slot.took ? 1 : 0);
    }
  }
  EXPECT_EQ(pool.waiting(), 0);
  EXPECT_EQ(served + pool.warm(), kSandboxes);
}

}  // namespace
}  // namespace sbx::allocator
