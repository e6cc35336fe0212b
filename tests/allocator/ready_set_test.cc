// The selection policies (src/allocator/ready_set.cc), driven through a Pool, which moves
// the per-node claim counts they select by.

#include "src/allocator/ready_set.h"

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/allocator/allocator.h"
#include "src/allocator/pool.h"

namespace sbx::allocator {
namespace {

std::unique_ptr<Pool> NewPool(const std::string& policy) {
  store::PoolRecord p;
  p.name = "py";
  p.max_warm = 1000;
  p.selection_policy = policy;
  auto set = NewSelectionPolicy(policy);
  EXPECT_TRUE(set.ok()) << set.status();
  return std::make_unique<Pool>(p, std::move(*set));
}

SandboxPtr Warm(Pool* pool, const std::string& id, const std::string& node,
                NodeLabels labels = {}) {
  if (labels.empty()) labels = {{"kubernetes.io/hostname", node}};
  return std::make_shared<Sandbox>(id, "ep", node, pool, absl::UnixEpoch(), SandboxState::kWarm,
                                   std::make_shared<const NodeLabels>(std::move(labels)));
}

// `per_node` warm sandboxes on each of `nodes`, pushed node after node.
void Fill(Pool* pool, const std::vector<std::string>& nodes, int per_node) {
  for (const std::string& node : nodes) {
    for (int i = 0; i < per_node; ++i) pool->AddWarm(Warm(pool, absl::StrCat(node, "-", i), node));
  }
}

std::string TakeNode(Pool* pool, const NodeLabels* prefer = nullptr) {
  SandboxPtr sb = pool->TryTake(nullptr, prefer);
  return sb == nullptr ? "(none)" : sb->node;
}

TEST(SelectionPolicyTest, UnknownNamesAreRefusedNamingTheKnownOnes) {
  auto set = NewSelectionPolicy("zigzag");
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("\"zigzag\""), absl::string_view::npos);
  EXPECT_NE(set.status().message().find("fifo, spread, pack"), absl::string_view::npos);
  EXPECT_TRUE(NewSelectionPolicy("").ok());
  EXPECT_TRUE(IsSelectionPolicy("pack"));
  EXPECT_FALSE(IsSelectionPolicy("Pack"));
}

TEST(SelectionPolicyTest, SpreadTakesFromTheLeastClaimedNode) {
  auto pool = NewPool("spread");
  Fill(pool.get(), {"a", "b", "c"}, 3);
  std::multiset<std::string> taken;
  std::set<std::string> first_three;
  for (int i = 0; i < 6; ++i) {
    const std::string node = TakeNode(pool.get());
    if (i < 3) first_three.insert(node);
    taken.insert(node);
  }
  EXPECT_EQ(first_three, (std::set<std::string>{"a", "b", "c"}));
  for (const char* node : {"a", "b", "c"}) EXPECT_EQ(taken.count(node), 2u) << node;
}

TEST(SelectionPolicyTest, PackFillsTheMostClaimedNodeFirst) {
  auto pool = NewPool("pack");
  Fill(pool.get(), {"a", "b", "c"}, 3);
  const std::string first = TakeNode(pool.get());
  EXPECT_EQ(TakeNode(pool.get()), first);
  EXPECT_EQ(TakeNode(pool.get()), first);
  // That node has no warm sandbox left: the next node, and then it again.
  const std::string second = TakeNode(pool.get());
  EXPECT_NE(second, first);
  EXPECT_EQ(TakeNode(pool.get()), second);
}

TEST(SelectionPolicyTest, ReleasesMoveTheCounts) {
  auto pool = NewPool("pack");
  Fill(pool.get(), {"a", "b"}, 4);
  const NodeLabels on_b = {{"kubernetes.io/hostname", "b"}};
  SandboxPtr a1 = pool->TryTake();
  SandboxPtr a2 = pool->TryTake();
  ASSERT_EQ(a1->node, "a");
  ASSERT_EQ(a2->node, "a");
  ASSERT_EQ(TakeNode(pool.get(), &on_b), "b");
  ASSERT_EQ(TakeNode(pool.get(), &on_b), "b");
  // a: 2 claimed, b: 2 claimed. One of a's claims ends: b is now the most claimed.
  EXPECT_TRUE(pool->Retire(a1));
  EXPECT_EQ(a1->Load(), SandboxState::kRetired);
  EXPECT_EQ(TakeNode(pool.get()), "b");
  // A sandbox given back (its claim never committed) stops counting too: a has 0, b 3.
  pool->GiveBack(a2);
  EXPECT_EQ(a2->Load(), SandboxState::kWarm);
  EXPECT_EQ(TakeNode(pool.get()), "b");
}

TEST(SelectionPolicyTest, SpreadCountsASandboxGivenBackAsNotClaimed) {
  auto pool = NewPool("spread");
  Fill(pool.get(), {"a"}, 2);
  Fill(pool.get(), {"b"}, 1);
  SandboxPtr first = pool->TryTake();  // ties at 0 claimed: a, which has more warm
  ASSERT_EQ(first->node, "a");
  pool->GiveBack(first);
  // a: 2 warm, 0 claimed again, so a once more (b if the give-back had left a at 1).
  EXPECT_EQ(TakeNode(pool.get()), "a");
}

TEST(SelectionPolicyTest, PreferenceChoosesAMatchingNodeAndFallsBack) {
  for (const char* policy : {"spread", "pack"}) {
    SCOPED_TRACE(policy);
    auto pool = NewPool(policy);
    pool->AddWarm(Warm(pool.get(), "x1", "x", {{"topology.kubernetes.io/zone", "zx"}}));
    pool->AddWarm(Warm(pool.get(), "x2", "x", {{"topology.kubernetes.io/zone", "zx"}}));
    pool->AddWarm(Warm(pool.get(), "y1", "y", {{"topology.kubernetes.io/zone", "zy"}}));
    const NodeLabels zy = {{"topology.kubernetes.io/zone", "zy"}};
    EXPECT_EQ(TakeNode(pool.get(), &zy), "y");
    // No warm sandbox in zone zy any more: any other one, never a failure.
    EXPECT_EQ(TakeNode(pool.get(), &zy), "x");
    // Every preferred label must match.
    const NodeLabels both = {{"topology.kubernetes.io/zone", "zx"}, {"disk", "ssd"}};
    pool->AddWarm(Warm(pool.get(), "y2", "y", {{"topology.kubernetes.io/zone", "zy"}}));
    const NodeLabels zx = {{"topology.kubernetes.io/zone", "zx"}};
    EXPECT_EQ(TakeNode(pool.get(), &zx), "x");
    EXPECT_EQ(TakeNode(pool.get(), &both), "y");
    EXPECT_EQ(TakeNode(pool.get(), &zy), "(none)");
  }
}

TEST(SelectionPolicyTest, FifoIgnoresPreference) {
  auto pool = NewPool("fifo");
  Fill(pool.get(), {"a", "b"}, 1);
  const NodeLabels on_b = {{"kubernetes.io/hostname", "b"}};
  EXPECT_EQ(TakeNode(pool.get(), &on_b), "a");
  EXPECT_EQ(TakeNode(pool.get(), &on_b), "b");
}

TEST(SelectionPolicyTest, DeadSandboxesAreSkipped) {
  auto pool = NewPool("spread");
  auto a = Warm(pool.get(), "a1", "a");
  pool->AddWarm(a);
  pool->AddWarm(Warm(pool.get(), "b1", "b"));
  EXPECT_TRUE(pool->MarkDeadIfWarm(a));
  EXPECT_EQ(TakeNode(pool.get()), "b");
  EXPECT_EQ(TakeNode(pool.get()), "(none)");
}

TEST(SelectionPolicyTest, AWaiterServedDirectlyCountsOnItsNode) {
  auto pool = NewPool("spread");
  SandboxPtr got;
  auto waiter = std::make_shared<Waiter>();
  waiter->deliver = [&](SandboxPtr s) { got = std::move(s); };
  ASSERT_EQ(pool->TakeOrEnqueue(waiter), nullptr);
  pool->AddWarm(Warm(pool.get(), "a1", "a"));
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->Load(), SandboxState::kClaimed);
  Fill(pool.get(), {"a", "b"}, 2);
  EXPECT_EQ(TakeNode(pool.get()), "b");  // a already has a claim
}

TEST(SelectionPolicyTest, AdoptedClaimsCount) {
  auto pool = NewPool("spread");
  auto cold = std::make_shared<Sandbox>("a0", "ep", "a", pool.get(), absl::UnixEpoch(),
                                        SandboxState::kClaimed);
  pool->AdoptClaimed(*cold);
  Fill(pool.get(), {"a", "b"}, 2);
  EXPECT_EQ(TakeNode(pool.get()), "b");
  EXPECT_TRUE(pool->Retire(cold));
  EXPECT_EQ(TakeNode(pool.get()), "a");  // a: 0 claimed, b: 1
}

TEST(SelectionPolicyTest, PolicyChangesKeepEverySandbox) {
  auto pool = NewPool("fifo");
  Fill(pool.get(), {"a", "b"}, 3);
  store::PoolRecord settings = pool->settings();
  settings.selection_policy = "pack";
  pool->set_settings(settings);
  EXPECT_EQ(pool->warm(), 6);
  const std::string first = TakeNode(pool.get());
  EXPECT_EQ(TakeNode(pool.get()), first);  // packed now
  // spread and pack share one set: the switch keeps the counts (first: 2 claimed).
  settings.selection_policy = "spread";
  pool->set_settings(settings);
  const std::string other = first == "a" ? "b" : "a";
  EXPECT_EQ(TakeNode(pool.get()), other);
  EXPECT_EQ(TakeNode(pool.get()), other);
  // Back to fifo: the rest (one of each) are all there.
  settings.selection_policy = "fifo";
  pool->set_settings(settings);
  std::multiset<std::string> rest;
  for (int i = 0; i < 2; ++i) rest.insert(TakeNode(pool.get()));
  EXPECT_EQ(rest, (std::multiset<std::string>{"a", "b"}));
  EXPECT_EQ(TakeNode(pool.get()), "(none)");
  EXPECT_EQ(pool->warm(), 0);
}

// The race of a lock-free AddWarm with a policy change: the push lands in the set the
// change just emptied. AddWarm sees the change after its push and moves the sandbox on.
TEST(SelectionPolicyTest, APushRacingAPolicyChangeIsNotStranded) {
  store::PoolRecord settings;
  settings.name = "py";
  settings.max_warm = 10;
  Pool* pool = nullptr;
  bool changed = false;
  Pool racing(settings, NewFifoReadySet(), [&] {
    if (changed) return;
    changed = true;
    store::PoolRecord now = pool->settings();
    now.selection_policy = "spread";
    pool->set_settings(now);
  });
  pool = &racing;
  racing.AddWarm(Warm(pool, "a1", "a"));
  ASSERT_TRUE(changed);
  SandboxPtr got = racing.TryTake();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->id, "a1");
  // It went through the spread set, which points it at its node's count.
  ASSERT_NE(got->node_claims, nullptr);
  EXPECT_EQ(got->node_claims->load(), 1);
  EXPECT_EQ(racing.warm(), 0);
}

// Threads take and give back (or retire and re-add) sandboxes of 8 nodes at once: no
// sandbox is handed out twice, none is lost, and the per-node counts come back exact.
TEST(SelectionPolicyTest, ConcurrentTakesAndReleasesKeepCountsExact) {
  for (const char* policy : {"spread", "pack"}) {
    SCOPED_TRACE(policy);
    auto pool = NewPool(policy);
    constexpr int kNodes = 8;
    constexpr int kPerNode = 4;
    std::vector<std::string> nodes;
    for (int n = 0; n < kNodes; ++n) nodes.push_back(absl::StrCat("node-", n));
    Fill(pool.get(), nodes, kPerNode);
    constexpr int kThreads = 4;
    constexpr int kRounds = 20000;
    std::atomic<int> double_claims{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const NodeLabels prefer = {{"kubernetes.io/hostname", nodes[t]}};
        for (int i = 0; i < kRounds; ++i) {
          SandboxPtr sb = pool->TryTake(nullptr, i % 3 == 0 ? &prefer : nullptr);
          if (sb == nullptr) continue;
          if (sb->Load() != SandboxState::kClaimed) double_claims.fetch_add(1);
          if (i % 2 == 0) {
            pool->GiveBack(std::move(sb));
          } else {
            pool->Retire(sb);
            // A claim ended and its sandbox comes back as a new warm one.
            ASSERT_TRUE(sb->Transition(SandboxState::kRetired, SandboxState::kWarm));
            pool->AddWarm(std::move(sb));
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(double_claims.load(), 0);
    EXPECT_EQ(pool->warm(), kNodes * kPerNode);
    // Take them all: each once, and each node's count is then exactly its sandboxes.
    std::set<std::string> ids;
    std::vector<SandboxPtr> all;
    while (SandboxPtr sb = pool->TryTake()) {
      ids.insert(sb->id);
      all.push_back(std::move(sb));
    }
    EXPECT_EQ(ids.size(), static_cast<size_t>(kNodes * kPerNode));
    for (const SandboxPtr& sb : all) {
      ASSERT_NE(sb->node_claims, nullptr);
      EXPECT_EQ(sb->node_claims->load(), kPerNode) << sb->node;
    }
  }
}

}  // namespace
}  // namespace sbx::allocator
