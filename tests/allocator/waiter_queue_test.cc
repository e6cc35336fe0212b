// WaiterQueue (issue 22): deficit round robin between tenants by weight, strict priority
// within a tenant, FIFO within one tenant and priority, and removal from anywhere.

#include "src/allocator/waiter_queue.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace sbx::allocator {
namespace {

// Waiters are told apart by a name the test keeps for each.
class WaiterQueueTest : public ::testing::Test {
 protected:
  WaiterPtr Push(const std::string& owner, const std::string& name,
                 ClaimPriority priority = ClaimPriority::kNormal, int weight = 1) {
    auto w = std::make_shared<Waiter>();
    w->owner = owner;
    w->priority = priority;
    w->weight = weight;
    names_[w.get()] = name;
    queue_.Push(w);
    return w;
  }
  // Pops up to `n` waiters and returns their names (stops early when empty).
  std::vector<std::string> Pop(int n) {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      WaiterPtr w = queue_.Pop();
      if (w == nullptr) break;
      out.push_back(names_[w.get()]);
    }
    return out;
  }

  WaiterQueue queue_;
  std::map<const Waiter*, std::string> names_;
};

TEST_F(WaiterQueueTest, EmptyPopsNothing) {
  EXPECT_EQ(queue_.Pop(), nullptr);
  EXPECT_TRUE(queue_.empty());
  EXPECT_EQ(queue_.size("a"), 0u);
}

// One tenant's backlog does not hold back another's single waiter: with equal weights the
// newcomer is served second.
TEST_F(WaiterQueueTest, ANewcomerIsServedAfterOneTurnOfABacklog) {
  for (int i = 0; i < 1000; ++i) Push("a", absl::StrCat("a", i));
  EXPECT_EQ(Pop(3), (std::vector<std::string>{"a0", "a1", "a2"}));
  Push("b", "b0");
  EXPECT_EQ(queue_.size(), 998u);
  EXPECT_EQ(Pop(3), (std::vector<std::string>{"a3", "b0", "a4"}));
  EXPECT_EQ(queue_.size("b"), 0u);
  EXPECT_EQ(queue_.size("a"), 995u);
}

TEST_F(WaiterQueueTest, TenantsShareByWeight) {
  for (int i = 0; i < 100; ++i) {
    Push("a", absl::StrCat("a", i), ClaimPriority::kNormal, 3);
    Push("b", absl::StrCat("b", i), ClaimPriority::kNormal, 1);
  }
  EXPECT_EQ(Pop(8), (std::vector<std::string>{"a0", "a1", "a2", "b0", "a3", "a4", "a5", "b1"}));
  int a = 0, b = 0;
  for (const std::string& name : Pop(40)) (name[0] == 'a' ? a : b)++;
  EXPECT_EQ(a, 30);
  EXPECT_EQ(b, 10);
  // When one runs out, the other gets everything.
  std::vector<std::string> rest = Pop(1000);
  EXPECT_EQ(rest.size(), 200u - 48u);
  EXPECT_EQ(rest.back(), "b99");
  EXPECT_TRUE(queue_.empty());
}

// A tenant that arrives during another's turn waits at most for the rest of that turn.
TEST_F(WaiterQueueTest, ANewcomerWaitsAtMostTheRestOfTheCurrentTurn) {
  for (int i = 0; i < 10; ++i) Push("a", absl::StrCat("a", i), ClaimPriority::kNormal, 4);
  EXPECT_EQ(Pop(1), (std::vector<std::string>{"a0"}));
  Push("b", "b0");
  Push("c", "c0");
  EXPECT_EQ(Pop(6), (std::vector<std::string>{"a1", "a2", "a3", "b0", "c0", "a4"}));
}

TEST_F(WaiterQueueTest, PriorityIsStrictWithinATenantAndFifoWithinAPriority) {
  Push("a", "batch1", ClaimPriority::kBatch);
  Push("a", "normal1", ClaimPriority::kNormal);
  Push("a", "interactive1", ClaimPriority::kInteractive);
  Push("a", "batch2", ClaimPriority::kBatch);
  Push("a", "interactive2", ClaimPriority::kInteractive);
  Push("a", "normal2", ClaimPriority::kNormal);
  EXPECT_EQ(Pop(10), (std::vector<std::string>{"interactive1", "interactive2", "normal1", "normal2",
                                               "batch1", "batch2"}));
}

// Priority orders a tenant's own waiters; it does not let one tenant overtake another.
TEST_F(WaiterQueueTest, PriorityDoesNotOvertakeAnotherTenant) {
  Push("a", "a-batch1", ClaimPriority::kBatch);
  Push("a", "a-batch2", ClaimPriority::kBatch);
  Push("b", "b-interactive1", ClaimPriority::kInteractive);
  Push("b", "b-interactive2", ClaimPriority::kInteractive);
  Push("a", "a-interactive", ClaimPriority::kInteractive);
  EXPECT_EQ(Pop(5), (std::vector<std::string>{"a-interactive", "b-interactive1", "a-batch1",
                                              "b-interactive2", "a-batch2"}));
}

TEST_F(WaiterQueueTest, RemoveTakesAWaiterFromTheMiddleOnce) {
  Push("a", "a1");
  WaiterPtr a2 = Push("a", "a2");
  Push("a", "a3");
  WaiterPtr b1 = Push("b", "b1");
  EXPECT_TRUE(queue_.Remove(a2));
  EXPECT_FALSE(queue_.Remove(a2)) << "removed twice";
  EXPECT_EQ(queue_.size(), 3u);
  EXPECT_EQ(queue_.size("a"), 2u);
  // b's only waiter leaves: b leaves the ring and a is served alone.
  EXPECT_TRUE(queue_.Remove(b1));
  EXPECT_EQ(Pop(5), (std::vector<std::string>{"a1", "a3"}));
  EXPECT_TRUE(queue_.empty());
  // A waiter already popped is not queued: Remove says so, and it may be queued again.
  EXPECT_FALSE(queue_.Remove(b1));
  queue_.Push(b1);
  EXPECT_EQ(Pop(1), (std::vector<std::string>{"b1"}));
}

// A waiter of another queue is not this queue's to remove, even with the same owner.
TEST_F(WaiterQueueTest, RemoveIgnoresAWaiterOfAnotherQueue) {
  WaiterQueue other;
  auto w = std::make_shared<Waiter>();
  w->owner = "a";
  other.Push(w);
  Push("a", "a1");
  EXPECT_FALSE(queue_.Remove(w));
  EXPECT_EQ(queue_.size(), 1u);
  EXPECT_TRUE(other.Remove(w));
}

// A tenant that leaves (its last waiter removed) and comes back joins the back of the
// ring, behind tenants that kept waiting.
TEST_F(WaiterQueueTest, ATenantThatLeftRejoinsAtTheBack) {
  WaiterPtr a1 = Push("a", "a1");
  Push("b", "b1");
  Push("b", "b2");
  Push("c", "c1");
  EXPECT_TRUE(queue_.Remove(a1));
  Push("a", "a2");
  EXPECT_EQ(Pop(5), (std::vector<std::string>{"b1", "c1", "a2", "b2"}));
}

}  // namespace
}  // namespace sbx::allocator
