// The allocator's claim table alone (claim_table.h): one entry per key, erase only of the
// entry that is there, every entry visited, and concurrent use from many threads on one
// shard and on many.

#include "src/allocator/claim_table.h"

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace sbx::allocator {
namespace {

struct Item {
  explicit Item(std::string k) : key(std::move(k)) {}
  const std::string key;
  int value = 0;
};
using Table = ShardedTable<Item, &Item::key>;

class ClaimTableTest : public ::testing::TestWithParam<int> {};

TEST_P(ClaimTableTest, OneEntryPerKey) {
  Table t(GetParam());
  auto a = std::make_shared<Item>("alice/c1");
  auto [in, inserted] = t.Insert(a);
  EXPECT_TRUE(inserted);
  EXPECT_EQ(in, a);
  // A second entry under the same key is not inserted: the first is answered.
  auto twin = std::make_shared<Item>("alice/c1");
  auto [there, again] = t.Insert(twin);
  EXPECT_FALSE(again);
  EXPECT_EQ(there, a);
  EXPECT_EQ(t.Find("alice/c1"), a);
  EXPECT_EQ(t.Find("alice/c2"), nullptr);
  EXPECT_EQ(t.Find("bob/c1"), nullptr);
  EXPECT_EQ(t.size(), 1u);
}

TEST_P(ClaimTableTest, EraseRemovesOnlyTheEntryThatIsThere) {
  Table t(GetParam());
  auto a = std::make_shared<Item>("k");
  t.Insert(a);
  auto stale = std::make_shared<Item>("k");  // same key, another entry
  EXPECT_FALSE(t.Erase(stale));
  EXPECT_EQ(t.Find("k"), a);
  EXPECT_TRUE(t.Erase(a));
  EXPECT_EQ(t.Find("k"), nullptr);
  EXPECT_FALSE(t.Erase(a));  // already gone
  // The key is free again.
  EXPECT_TRUE(t.Insert(stale).second);
}

TEST_P(ClaimTableTest, ForEachVisitsEveryEntryOnce) {
  Table t(GetParam());
  t.Reserve(1000);
  for (int i = 0; i < 1000; ++i) t.Insert(std::make_shared<Item>(absl::StrCat("o/", i)));
  std::multiset<std::string> seen;
  t.ForEach([&](const std::shared_ptr<Item>& e) { seen.insert(e->key); });
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 1000u);
  // fn runs outside the shard's lock: it may use the table.
  t.ForEach([&](const std::shared_ptr<Item>& e) { EXPECT_EQ(t.Find(e->key), e); });
}

// Threads racing on the same keys: every key ends with exactly one winner, and every
// thread that lost found the winner's entry.
TEST_P(ClaimTableTest, ConcurrentInsertsOfTheSameKeysHaveOneWinnerEach) {
  Table t(GetParam());
  constexpr int kThreads = 4;
  constexpr int kKeys = 2000;
  std::vector<std::vector<std::shared_ptr<Item>>> got(kThreads);
  std::atomic<int> wins{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kKeys; ++i) {
        auto [e, inserted] = t.Insert(std::make_shared<Item>(absl::StrCat("k", i)));
        if (inserted) wins.fetch_add(1);
        got[th].push_back(e);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wins.load(), kKeys);
  EXPECT_EQ(t.size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    for (int th = 1; th < kThreads; ++th) EXPECT_EQ(got[th][i], got[0][i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, ClaimTableTest, ::testing::Values(1, 2, 64),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "shards");
                         });

}  // namespace
}  // namespace sbx::allocator
