// Informers against the API emulator: sync, handlers, indexes, relist after 410, and
// convergence to the server's true state under injected faults.

#include "src/k8s/informer.h"

#include <map>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "src/common/clock.h"
#include "src/k8s/objects_types.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

using ::sbx::k8s::testing::TestEmulator;

Json Lease(const std::string& name, const std::string& holder,
           const Json& labels = Json::object()) {
  return {{"metadata", {{"name", name}, {"labels", labels}}},
          {"spec", {{"holderIdentity", holder}}}};
}

// What the handlers say the world is: name -> holderIdentity.
class Mirror {
 public:
  InformerHandler Handler() {
    InformerHandler handler;
    handler.on_add = [this](const ObjectPtr& o) { Set(*o, /*added=*/true); };
    handler.on_update = [this](const ObjectPtr&, const ObjectPtr& o) { Set(*o, false); };
    handler.on_delete = [this](const ObjectPtr& o) {
      absl::MutexLock lock(&mu_);
      ++deletes_;
      if (state_.erase((*o)["metadata"]["name"].get<std::string>()) == 0) ++deletes_of_unknown_;
    };
    return handler;
  }
  std::map<std::string, std::string> state() {
    absl::MutexLock lock(&mu_);
    return state_;
  }
  int adds_of_known() {
    absl::MutexLock lock(&mu_);
    return adds_of_known_;
  }
  int deletes_of_unknown() {
    absl::MutexLock lock(&mu_);
    return deletes_of_unknown_;
  }

 private:
  void Set(const Json& o, bool added) {
    absl::MutexLock lock(&mu_);
    const std::string name = o["metadata"]["name"];
    if (added && state_.contains(name)) ++adds_of_known_;
    state_[name] = o["spec"].value("holderIdentity", "");
  }
  absl::Mutex mu_;
  std::map<std::string, std::string> state_ ABSL_GUARDED_BY(mu_);
  int deletes_ ABSL_GUARDED_BY(mu_) = 0;
  int adds_of_known_ ABSL_GUARDED_BY(mu_) = 0;
  int deletes_of_unknown_ ABSL_GUARDED_BY(mu_) = 0;
};

std::map<std::string, std::string> TrueState(Client& client) {
  std::map<std::string, std::string> out;
  absl::StatusOr<ListResult> all = client.List(kLeases, "default");
  EXPECT_TRUE(all.ok()) << all.status();
  if (!all.ok()) return out;
  for (const Json& item : all->items) {
    out[item["metadata"]["name"]] = item["spec"].value("holderIdentity", "");
  }
  return out;
}

std::map<std::string, std::string> CacheState(const Informer& informer) {
  std::map<std::string, std::string> out;
  for (const ObjectPtr& o : informer.List()) {
    out[(*o)["metadata"]["name"]] = (*o)["spec"].value("holderIdentity", "");
  }
  return out;
}

// Waits (bounded) until the informer's cache and the mirror equal the server's state.
bool Converges(Client& client, const Informer& informer, Mirror& mirror) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    auto truth = TrueState(client);
    if (CacheState(informer) == truth && mirror.state() == truth) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST(InformerTest, SyncsHandlesEventsAndIndexes) {
  TestEmulator emulator({"--bookmark_interval_ms", "200"});
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(client
                    ->Create(kLeases, "default",
                             Lease(absl::StrCat("pre", i), "a", {{"pool", i % 3 == 0 ? "x" : "y"}}))
                    .ok());
  }
  InformerOptions options;
  options.resource = kLeases;
  options.ns = "default";
  options.page_size = 5;  // three pages
  Informer informer(client.get(), options);
  Mirror mirror;
  informer.AddHandler(mirror.Handler());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  EXPECT_EQ(informer.size(), 12u);
  EXPECT_EQ(informer.ByLabel("pool", "x").size(), 4u);

  absl::StatusOr<Json> owner = client->Get(kLeases, "default", "pre0");
  ASSERT_TRUE(owner.ok());
  Json child = Lease("child", "b");
  child["metadata"]["ownerReferences"] = {{{"apiVersion", "coordination.k8s.io/v1"},
                                           {"kind", "Lease"},
                                           {"name", "pre0"},
                                           {"uid", (*owner)["metadata"]["uid"]}}};
  ASSERT_TRUE(client->Create(kLeases, "default", child).ok());
  ASSERT_TRUE(client
                  ->Patch(kLeases, "default", "pre1", PatchType::kMerge,
                          {{"spec", {{"holderIdentity", "z"}}},
                           {"metadata", {{"labels", {{"pool", "x"}}}}}})
                  .ok());
  ASSERT_TRUE(client->Delete(kLeases, "default", "pre2").ok());
  ASSERT_TRUE(Converges(*client, informer, mirror));
  EXPECT_EQ(informer.ByOwner((*owner)["metadata"]["uid"]).size(), 1u);
  // pre1 moved into pool x: the label index follows updates.
  EXPECT_EQ(informer.ByLabel("pool", "x").size(), 5u);
  ASSERT_NE(informer.Get("default", "pre1"), nullptr);
  EXPECT_EQ((*informer.Get("default", "pre1"))["spec"]["holderIdentity"], "z");
  EXPECT_EQ(informer.Get("default", "pre2"), nullptr);
  EXPECT_EQ(mirror.adds_of_known(), 0);
  EXPECT_EQ(mirror.deletes_of_unknown(), 0);
  informer.Stop();
}

// The typed copy follows the cache: one decode per version read, a new version decoded
// when read, an undecodable one answered as INVALID_ARGUMENT naming the field, a deleted
// one gone.
TEST(InformerTest, TypedCacheFollowsTheCacheDecodingEachVersionOnce) {
  TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  ASSERT_TRUE(client->Create(kLeases, "default", Lease("a", "x")).ok());
  Informer informer(client.get(), NamespaceInformer(kLeases, "default"));
  TypedCache<types::Lease> typed(&informer, &types::DecodeLease);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  auto holder_is = [&](const std::string& holder) {
    ObjectPtr o = informer.Get("default", "a");
    return o != nullptr && (*o)["spec"].value("holderIdentity", "") == holder;
  };

  absl::StatusOr<TypedCache<types::Lease>::Ptr> first = typed.Get("default", "a");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(*first, nullptr);
  EXPECT_EQ((*first)->spec.holder_identity, "x");
  EXPECT_EQ(typed.Get("default", "a")->get(), first->get()) << "the same version decoded again";
  EXPECT_EQ(*typed.Get("default", "absent"), nullptr);

  ASSERT_TRUE(
      client
          ->Patch(kLeases, "default", "a", PatchType::kMerge, {{"spec", {{"holderIdentity", "y"}}}})
          .ok());
  ASSERT_TRUE(testing::Eventually([&] { return holder_is("y"); }, absl::Seconds(10)));
  absl::StatusOr<TypedCache<types::Lease>::Ptr> second = typed.Get("default", "a");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->spec.holder_identity, "y");
  EXPECT_EQ((*first)->spec.holder_identity, "x") << "a reader's copy does not change under it";

  ASSERT_TRUE(client
                  ->Patch(kLeases, "default", "a", PatchType::kMerge,
                          {{"spec", {{"holderIdentity", "z"}, {"leaseDurationSeconds", "soon"}}}})
                  .ok());
  ASSERT_TRUE(testing::Eventually([&] { return holder_is("z"); }, absl::Seconds(10)));
  absl::StatusOr<TypedCache<types::Lease>::Ptr> bad = typed.Get("default", "a");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      bad.status().message().find("Lease \"default/a\": spec.leaseDurationSeconds is a string"),
      std::string::npos)
      << bad.status();

  ASSERT_TRUE(client->Delete(kLeases, "default", "a").ok());
  ASSERT_TRUE(testing::Eventually([&] { return informer.Get("default", "a") == nullptr; },
                                  absl::Seconds(10)));
  absl::StatusOr<TypedCache<types::Lease>::Ptr> gone = typed.Get("default", "a");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(*gone, nullptr);
  informer.Stop();
}

TEST(InformerTest, RelistsAfterGoneAndReportsTheDifference) {
  TestEmulator emulator({"--bookmark_interval_ms", "100000"});
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client->Create(kLeases, "default", Lease(absl::StrCat("l", i), "a")).ok());
  }
  InformerOptions options;
  options.resource = kLeases;
  options.ns = "default";
  options.initial_backoff = absl::Milliseconds(10);
  Informer informer(client.get(), options);
  Mirror mirror;
  informer.AddHandler(mirror.Handler());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  ASSERT_TRUE(Converges(*client, informer, mirror));

  // Every delivered event now cuts the stream, and every watch is answered 410 Gone: the
  // informer must relist, and learns the changes below from lists (as after a
  // compaction), reporting the difference to its handlers.
  emulator.SetFaults({{"watch_drop_rate", 1.0}, {"errors", {{"410", 1.0}}}});
  ASSERT_TRUE(client->Delete(kLeases, "default", "l0").ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (informer.stats().expired == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(informer.stats().expired, 1);
  ASSERT_TRUE(client
                  ->Patch(kLeases, "default", "l1", PatchType::kMerge,
                          {{"spec", {{"holderIdentity", "b"}}}})
                  .ok());
  emulator.Admin("POST", "/emulator/compact");
  ASSERT_TRUE(client->Create(kLeases, "default", Lease("new", "c")).ok());
  emulator.ClearFaults();
  ASSERT_TRUE(Converges(*client, informer, mirror));
  const InformerStats stats = informer.stats();
  EXPECT_GE(stats.lists, 2);
  EXPECT_GE(stats.expired, 1);
  EXPECT_EQ(mirror.adds_of_known(), 0);
  EXPECT_EQ(mirror.deletes_of_unknown(), 0);
  informer.Stop();
}

// Issue 23: a watch stream that breaks after delivering events is resumed at once. With
// every event cutting its stream, 15 changes need 15 streams; before the fix (0045959) the
// informer slept after each drop, longer each time (never reset by a stream that worked),
// so the cache (and the handlers) lagged by more than 30 s. Here the informer's clock is a
// FakeClock that never moves: a backoff would never end, so the changes arrive only if no
// drop is followed by one (no wall-clock bound to tune).
TEST(InformerTest, ResumesAtOnceAfterAStreamThatDeliveredEvents) {
  TestEmulator emulator({"--bookmark_interval_ms", "100000"});
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  ASSERT_TRUE(client->Create(kLeases, "default", Lease("l", "0")).ok());
  FakeClock clock;
  InformerOptions options = NamespaceInformer(kLeases, "default");
  options.clock = &clock;
  Informer informer(client.get(), options);
  Mirror mirror;
  informer.AddHandler(mirror.Handler());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  ASSERT_TRUE(Converges(*client, informer, mirror));

  emulator.SetFaults({{"watch_drop_rate", 1.0}});
  for (int i = 1; i <= 15; ++i) {
    ASSERT_TRUE(client
                    ->Patch(kLeases, "default", "l", PatchType::kMerge,
                            {{"spec", {{"holderIdentity", absl::StrCat(i)}}}})
                    .ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (mirror.state()["l"] != "15" && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(mirror.state()["l"], "15") << "the informer backed off after a stream that worked";
  EXPECT_GE(informer.stats().watches, 15);  // one stream per change: each was cut
  EXPECT_EQ(informer.stats().lists, 1);     // resumed, never relisted
  informer.Stop();
}

TEST(InformerTest, ConvergesUnderTenPercentFaults) {
  TestEmulator emulator({"--bookmark_interval_ms", "300", "--seed", "7"});
  ASSERT_TRUE(emulator.ok());
  ClientOptions options;
  options.retry_initial_backoff = absl::Milliseconds(2);
  options.max_retries = 10;
  auto writer = *Client::Create(emulator.Cluster(), options);
  auto reader = *Client::Create(emulator.Cluster(), options);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(writer->Create(kLeases, "default", Lease(absl::StrCat("s", i), "0")).ok());
  }
  InformerOptions informer_options;
  informer_options.resource = kLeases;
  informer_options.ns = "default";
  informer_options.page_size = 7;
  informer_options.initial_backoff = absl::Milliseconds(5);
  informer_options.max_backoff = absl::Milliseconds(200);
  informer_options.watch_timeout = absl::Seconds(2);
  Informer informer(reader.get(), informer_options);
  Mirror mirror;
  informer.AddHandler(mirror.Handler());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(20)));

  // 10% of requests fail (429, 500, 409 on writes, 410 on watches and continues) and
  // 10% of watch events cut their stream, while 600 random writes go on; every 100 writes
  // the history is compacted, so a stream resumed after that gets a real 410 Gone.
  emulator.SetFaults({{"errors", {{"429", 0.03}, {"500", 0.03}, {"409", 0.02}, {"410", 0.02}}},
                      {"retry_after_seconds", 0},
                      {"watch_drop_rate", 0.1}});
  absl::BitGen rng(std::seed_seq{42});
  int failed_writes = 0;
  for (int i = 0; i < 600; ++i) {
    if (i % 100 == 99) emulator.Admin("POST", "/emulator/compact");
    const std::string name = absl::StrCat("s", absl::Uniform(rng, 0, 40));
    absl::Status status;
    switch (absl::Uniform(rng, 0, 3)) {
      case 0:
        status = writer->Create(kLeases, "default", Lease(name, absl::StrCat(i))).status();
        break;
      case 1:
        status = writer
                     ->Patch(kLeases, "default", name, PatchType::kMerge,
                             {{"spec", {{"holderIdentity", absl::StrCat(i)}}}})
                     .status();
        break;
      default:
        status = writer->Delete(kLeases, "default", name);
        break;
    }
    // Creates of existing names and writes to absent ones fail by design; injected 409s
    // are not retried (a conflict is the caller's to resolve).
    if (!status.ok() && !absl::IsAlreadyExists(status) && !absl::IsNotFound(status)) {
      ++failed_writes;
    }
  }
  emulator.ClearFaults();
  ASSERT_TRUE(Converges(*reader, informer, mirror))
      << "informer did not converge; stats: lists=" << informer.stats().lists
      << " watches=" << informer.stats().watches;
  const InformerStats stats = informer.stats();
  EXPECT_GT(stats.watches, 1);  // dropped streams were resumed
  // Whether a stream resumed too late and had to relist (an injected 410, or a compaction
  // it fell behind) is chance: since dropped streams resume at once (issue 23) they rarely
  // fall behind a compaction. RelistsAfterGoneAndReportsTheDifference covers the relist.
  EXPECT_EQ(mirror.adds_of_known(), 0);
  EXPECT_EQ(mirror.deletes_of_unknown(), 0);
  std::cout << "writes failed by injected faults: " << failed_writes
            << "; informer lists=" << stats.lists << " watches=" << stats.watches
            << " expired=" << stats.expired << " errors=" << stats.errors
            << " events=" << stats.events << "\n";
  informer.Stop();
}

}  // namespace
}  // namespace sbx::k8s
