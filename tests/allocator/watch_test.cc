// Revisions and watches of the allocator (Allocator::revision, Watch, Suspend/Resume):
// the revision sequence across operations and restarts (MemoryStore and RocksDB), the
// initial state, live events in order and only after durability, resuming, OUT_OF_RANGE,
// ABORTED for a slow consumer, filters, and a concurrent stress test. The reorder buffer
// itself (WatchHub) is tested directly where the allocator cannot make commits finish out
// of order.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/allocator/allocator.h"
#include "src/allocator/watch_hub.h"
#include "src/store/memory_store.h"
#include "src/store/rocksdb_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::allocator {
namespace {

using store::ClaimState;
using store::EmptyPoolPolicy;
using store::MemoryStore;
using store::MemoryStoreOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Type = ClaimEvent::Type;

MemoryStoreOptions Inline() {
  MemoryStoreOptions o;
  o.callbacks = MemoryStoreOptions::CallbackMode::kInline;
  return o;
}

template <typename T>
struct Result {
  std::optional<T> value;
  auto callback() {
    return [this](T v) { value = std::move(v); };
  }
};

// A watch and what it delivered. `ready` only counts; the test polls.
struct Watcher {
  std::unique_ptr<ClaimWatch> watch;
  std::shared_ptr<std::atomic<int>> readies = std::make_shared<std::atomic<int>>(0);
  absl::Status ended;

  // Takes everything queued now.
  std::vector<ClaimEvent> Take() {
    std::vector<ClaimEvent> out;
    while (true) {
      std::vector<ClaimEventPtr> got;
      absl::Status s = watch->Poll(&got, 1000);
      for (const ClaimEventPtr& e : got) out.push_back(*e);
      if (!s.ok()) ended = s;
      if (got.empty()) return out;
    }
  }
};

WatchRequest Req(const std::string& owner, uint64_t start = 0) {
  WatchRequest r;
  r.owner = owner;
  r.start_revision = start;
  return r;
}

std::string Describe(const std::vector<ClaimEvent>& events) {
  std::string out;
  for (const ClaimEvent& e : events) {
    absl::StrAppend(&out, "{", static_cast<int>(e.type), " ", e.claim.owner, "/", e.claim.id,
                    " rev ", e.revision, e.initial ? " initial" : "", "} ");
  }
  return out;
}

class WatchTest : public ::testing::Test {
 protected:
  WatchTest() : store_(std::make_unique<MemoryStore>(Inline())) {}

  void SetUp() override {
    Start();
    Put(Template("py"));
    PutPoolRecord(PoolRec("py"));
    PutPoolRecord(PoolRec("other"));
  }

  void Start() {
    options_.timer_thread = false;
    allocator_.reset();
    auto a = Allocator::Create(options_, store_.get(), &runtime_, &reconciler_, &clock_, &ids_);
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
  }

  // A restart from what the store holds.
  void Restart() {
    allocator_.reset();
    store_ = std::make_unique<MemoryStore>(store_->Snapshot(), Inline());
    Start();
  }

  static store::TemplateRecord Template(const std::string& name) {
    store::TemplateRecord t;
    t.name = name;
    t.runtime = "local";
    return t;
  }
  static store::PoolRecord PoolRec(const std::string& name) {
    store::PoolRecord p;
    p.name = name;
    p.template_name = "py";
    p.min_warm = 0;
    p.max_warm = 10;
    p.empty_pool_policy = EmptyPoolPolicy::kFail;
    return p;
  }
  void Put(store::TemplateRecord t) {
    Result<absl::Status> r;
    allocator_->PutTemplate(std::move(t), r.callback());
    ASSERT_TRUE(r.value.has_value() && r.value->ok());
  }
  void PutPoolRecord(store::PoolRecord p) {
    Result<absl::Status> r;
    allocator_->PutPool(std::move(p), r.callback());
    ASSERT_TRUE(r.value.has_value() && r.value->ok());
  }
  void AddWarm(const std::string& id, const std::string& pool = "py") {
    runtime::SandboxInfo info;
    info.id = id;
    info.pool = pool;
    info.endpoint = "unix:/run/" + id;
    ASSERT_TRUE(allocator_->AddSandbox(info).ok());
  }
  // Claims `id` for `owner` on `pool` from a fresh warm sandbox.
  absl::StatusOr<store::ClaimRecord> ClaimNow(const std::string& id,
                                              const std::string& owner = "alice",
                                              const std::string& pool = "py",
                                              std::map<std::string, std::string> labels = {},
                                              bool add_warm = true) {
    if (add_warm) AddWarm(absl::StrCat("sb-", owner, "-", id), pool);
    ClaimRequest r;
    r.owner = owner;
    r.claim_id = id;
    r.pool = pool;
    r.labels = std::move(labels);
    Result<absl::StatusOr<ClaimResult>> out;
    allocator_->Claim(std::move(r), out.callback());
    if (!out.value.has_value()) return absl::InternalError("claim did not complete");
    if (!out.value->ok()) return out.value->status();
    return (*out.value)->claim;
  }
  absl::Status ReleaseNow(const std::string& id, const std::string& owner = "alice") {
    Result<absl::StatusOr<store::ClaimRecord>> out;
    allocator_->Release(owner, id, out.callback());
    if (!out.value.has_value()) return absl::InternalError("release did not complete");
    return out.value->status();
  }
  absl::StatusOr<store::ClaimRecord> RenewNow(const std::string& id) {
    Result<absl::StatusOr<ClaimResult>> out;
    allocator_->Renew("alice", id, absl::Hours(1), out.callback());
    if (!out.value.has_value()) return absl::InternalError("renew did not complete");
    if (!out.value->ok()) return out.value->status();
    return (*out.value)->claim;
  }
  absl::StatusOr<store::ClaimRecord> SuspendNow(const std::string& id, bool suspend = true,
                                                const std::string& owner = "alice") {
    Result<absl::StatusOr<ClaimResult>> out;
    if (suspend) {
      allocator_->Suspend(owner, id, out.callback());
    } else {
      allocator_->Resume(owner, id, out.callback());
    }
    if (!out.value.has_value()) return absl::InternalError("suspend did not complete");
    if (!out.value->ok()) return out.value->status();
    return (*out.value)->claim;
  }
  // Closes the idempotency window of every ended claim and fires the purges.
  void PurgeEnded() {
    clock_.Advance(options_.idempotency_window + absl::Seconds(1));
    allocator_->Tick();
  }
  Watcher WatchFrom(uint64_t start, const std::string& owner = "alice",
                    const std::string& pool = "", std::map<std::string, std::string> labels = {}) {
    Watcher w;
    WatchRequest r;
    r.owner = owner;
    r.pool = pool;
    r.labels = std::move(labels);
    r.start_revision = start;
    auto readies = w.readies;
    auto watch = allocator_->Watch(r, [readies] { readies->fetch_add(1); });
    EXPECT_TRUE(watch.ok()) << watch.status();
    if (watch.ok()) w.watch = std::move(*watch);
    return w;
  }
  uint64_t Revision() const { return allocator_->revision(); }

  AllocatorOptions options_;
  FakeClock clock_;
  SequentialIdGenerator ids_{"gen-"};
  std::unique_ptr<MemoryStore> store_;
  testing::ManualRuntime runtime_;
  testing::RecordingReconciler reconciler_;
  std::unique_ptr<Allocator> allocator_;
};

TEST_F(WatchTest, EveryChangeTakesTheNextRevision) {
  EXPECT_EQ(Revision(), 0u);
  auto c1 = ClaimNow("c1");
  ASSERT_TRUE(c1.ok()) << c1.status();
  EXPECT_EQ(c1->revision, 1u);
  EXPECT_EQ(Revision(), 1u);
  auto c2 = ClaimNow("c2");
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->revision, 2u);
  auto renewed = RenewNow("c1");
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->revision, 3u);
  auto suspended = SuspendNow("c1");
  ASSERT_TRUE(suspended.ok()) << suspended.status();
  EXPECT_EQ(suspended->revision, 4u);
  auto resumed = SuspendNow("c1", false);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->revision, 5u);
  ASSERT_TRUE(ReleaseNow("c1").ok());
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->revision, 6u);
  // The store has each record at the revision of its last change.
  for (const auto& c : store_->Snapshot().claims) {
    EXPECT_EQ(c.revision, c.id == "c1" ? 6u : 2u) << c.id;
  }
  // A failed commit uses up a revision but publishes nothing; the next change still gets
  // a higher one.
  AddWarm("s3");
  store_->FailNextCommits(1, absl::UnavailableError("disk"));
  EXPECT_FALSE(ClaimNow("c3", "alice", "py", {}, /*add_warm=*/false).ok());
  EXPECT_EQ(Revision(), 6u);
  auto c4 = ClaimNow("c4");
  ASSERT_TRUE(c4.ok());
  EXPECT_EQ(c4->revision, 8u);
  EXPECT_EQ(Revision(), 8u);
  // A batch takes one revision per claim.
  AddWarm("b-1");
  AddWarm("b-2");
  BatchRequest b;
  b.owner = "alice";
  b.batch_id = "b";
  b.pool = "py";
  b.count = 2;
  Result<absl::StatusOr<std::vector<ClaimResult>>> batch;
  allocator_->ClaimBatch(b, batch.callback());
  ASSERT_TRUE(batch.value.has_value() && batch.value->ok());
  EXPECT_EQ((**batch.value)[0].claim.revision, 9u);
  EXPECT_EQ((**batch.value)[1].claim.revision, 10u);
  // Deletion at the end of the window is a change too.
  PurgeEnded();
  EXPECT_EQ(Revision(), 11u);
  EXPECT_EQ(store_->Snapshot().revision, 11u);
}

TEST_F(WatchTest, RevisionsContinueAfterARestartEvenWhenTheNewestChangeWasADeletion) {
  ASSERT_TRUE(ClaimNow("c1").ok());
  ASSERT_TRUE(ClaimNow("c2").ok());
  ASSERT_TRUE(ReleaseNow("c2").ok());  // 3
  PurgeEnded();                        // 4: deletes c2, whose record held the highest
  EXPECT_EQ(Revision(), 4u);
  Restart();
  EXPECT_EQ(allocator_->recovery().revision, 4u);
  EXPECT_EQ(Revision(), 4u);
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->revision, 1u);
  auto c3 = ClaimNow("c3");
  ASSERT_TRUE(c3.ok());
  EXPECT_EQ(c3->revision, 5u);
  // A watch resuming from before the restart: the history did not survive it.
  WatchRequest r;
  r.owner = "alice";
  r.start_revision = 3;
  auto old = allocator_->Watch(r, [] {});
  EXPECT_EQ(old.status().code(), absl::StatusCode::kOutOfRange) << old.status();
}

TEST_F(WatchTest, RecoveredRevisionIsTheHighestOfMarkAndRecords) {
  ASSERT_TRUE(ClaimNow("c1").ok());
  store::Contents contents = store_->Snapshot();
  contents.revision = 40;
  contents.claims[0].revision = 41;
  allocator_.reset();
  store_ = std::make_unique<MemoryStore>(contents, Inline());
  Start();
  EXPECT_EQ(Revision(), 41u);
  contents.revision = 50;
  allocator_.reset();
  store_ = std::make_unique<MemoryStore>(contents, Inline());
  Start();
  EXPECT_EQ(Revision(), 50u);
  ASSERT_TRUE(ReleaseNow("c1").ok());
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->revision, 51u);
}

TEST_F(WatchTest, InitialStateThenLiveChangesInOrder) {
  ASSERT_TRUE(ClaimNow("b").ok());         // 1
  ASSERT_TRUE(ClaimNow("a").ok());         // 2
  ASSERT_TRUE(ClaimNow("x", "bob").ok());  // 3: another owner
  ASSERT_TRUE(ClaimNow("ended").ok());     // 4
  ASSERT_TRUE(ReleaseNow("ended").ok());   // 5
  Watcher w = WatchFrom(0);
  std::vector<ClaimEvent> initial = w.Take();
  ASSERT_EQ(initial.size(), 3u) << Describe(initial);
  EXPECT_EQ(initial[0].claim.id, "a");
  EXPECT_EQ(initial[1].claim.id, "b");
  EXPECT_EQ(initial[2].claim.id, "ended");
  EXPECT_EQ(initial[2].claim.state, ClaimState::kReleased);
  for (const ClaimEvent& e : initial) {
    EXPECT_EQ(e.type, Type::kAdded);
    EXPECT_TRUE(e.initial);
    EXPECT_EQ(e.revision, 5u);
  }
  EXPECT_EQ(initial[0].claim.revision, 2u);
  EXPECT_TRUE(w.ended.ok());

  ASSERT_TRUE(ClaimNow("c").ok());         // 6
  ASSERT_TRUE(RenewNow("c").ok());         // 7
  ASSERT_TRUE(ClaimNow("y", "bob").ok());  // 8: not alice's
  ASSERT_TRUE(ReleaseNow("a").ok());       // 9
  PurgeEnded();                            // 10, 11: "ended" and "a" are deleted
  std::vector<ClaimEvent> live = w.Take();
  ASSERT_EQ(live.size(), 5u) << Describe(live);
  EXPECT_EQ(live[0].type, Type::kAdded);
  EXPECT_EQ(live[0].claim.id, "c");
  EXPECT_EQ(live[0].revision, 6u);
  EXPECT_EQ(live[1].type, Type::kModified);
  EXPECT_EQ(live[1].revision, 7u);
  EXPECT_EQ(live[2].type, Type::kModified);
  EXPECT_EQ(live[2].claim.id, "a");
  EXPECT_EQ(live[2].claim.state, ClaimState::kReleased);
  EXPECT_EQ(live[2].revision, 9u);
  EXPECT_EQ(live[3].type, Type::kDeleted);
  EXPECT_EQ(live[4].type, Type::kDeleted);
  std::set<std::string> deleted = {live[3].claim.id, live[4].claim.id};
  EXPECT_EQ(deleted, (std::set<std::string>{"a", "ended"}));
  EXPECT_EQ(live[3].revision, 10u);
  EXPECT_EQ(live[4].revision, 11u);
  for (const ClaimEvent& e : live) {
    EXPECT_FALSE(e.initial);
    EXPECT_EQ(e.claim.revision, e.revision);
  }
  EXPECT_GT(w.readies->load(), 0);
}

TEST_F(WatchTest, ResumesFromARevisionAndRefusesRevisionsItCannotServe) {
  options_.watch_history = 3;
  Start();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ClaimNow(absl::StrCat("c", i)).ok());  // 1..5
  // History holds 3, 4, 5: resuming after 2 works, after 1 would miss revision 2.
  Watcher w = WatchFrom(2);
  std::vector<ClaimEvent> got = w.Take();
  ASSERT_EQ(got.size(), 3u) << Describe(got);
  EXPECT_EQ(got[0].revision, 3u);
  EXPECT_EQ(got[2].revision, 5u);
  EXPECT_FALSE(got[0].initial);
  // From the current revision: nothing until the next change.
  Watcher now = WatchFrom(5);
  EXPECT_TRUE(now.Take().empty());
  ASSERT_TRUE(ReleaseNow("c0").ok());
  got = now.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].revision, 6u);

  WatchRequest r;
  r.owner = "alice";
  r.start_revision = 1;
  auto old = allocator_->Watch(r, [] {});
  EXPECT_EQ(old.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(old.status().message(), HasSubstr("start_revision 1"));
  r.start_revision = 7;
  auto future = allocator_->Watch(r, [] {});
  EXPECT_EQ(future.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(future.status().message(), HasSubstr("newer than the current revision 6"));
  r.owner = "";
  r.start_revision = 0;
  EXPECT_EQ(allocator_->Watch(r, [] {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WatchTest, FiltersByOwnerPoolAndLabels) {
  Watcher by_pool = WatchFrom(0, "alice", "other");
  Watcher by_label = WatchFrom(0, "alice", "", {{"team", "rl"}});
  Watcher bob = WatchFrom(0, "bob");
  ASSERT_TRUE(ClaimNow("p1", "alice", "py", {{"team", "rl"}, {"run", "1"}}).ok());
  ASSERT_TRUE(ClaimNow("o1", "alice", "other", {{"team", "web"}}).ok());
  ASSERT_TRUE(ClaimNow("o2", "alice", "other", {{"team", "rl"}}).ok());
  ASSERT_TRUE(ClaimNow("b1", "bob", "py", {{"team", "rl"}}).ok());
  auto ids = [](const std::vector<ClaimEvent>& events) {
    std::vector<std::string> out;
    for (const ClaimEvent& e : events) out.push_back(e.claim.owner + "/" + e.claim.id);
    return out;
  };
  EXPECT_THAT(ids(by_pool.Take()), ElementsAre("alice/o1", "alice/o2"));
  EXPECT_THAT(ids(by_label.Take()), ElementsAre("alice/p1", "alice/o2"));
  EXPECT_THAT(ids(bob.Take()), ElementsAre("bob/b1"));
  // The same filters on a watch's initial state and on replayed history.
  EXPECT_THAT(ids(WatchFrom(0, "alice", "other", {{"team", "rl"}}).Take()),
              ElementsAre("alice/o2"));
  EXPECT_THAT(ids(WatchFrom(1, "alice", "", {{"team", "rl"}}).Take()), ElementsAre("alice/o2"));
}

TEST_F(WatchTest, NoEventBeforeTheChangeIsDurable) {
  Watcher w = WatchFrom(0);
  EXPECT_TRUE(w.Take().empty());
  AddWarm("s1");
  store_->Pause();
  ClaimRequest r;
  r.owner = "alice";
  r.claim_id = "c1";
  r.pool = "py";
  Result<absl::StatusOr<ClaimResult>> claimed;
  allocator_->Claim(r, claimed.callback());
  EXPECT_FALSE(claimed.value.has_value());
  EXPECT_TRUE(w.Take().empty());
  EXPECT_EQ(w.readies->load(), 0);
  EXPECT_EQ(Revision(), 0u);
  // Not visible to a new watch's initial state either.
  EXPECT_TRUE(WatchFrom(0).Take().empty());
  store_->Resume();
  ASSERT_TRUE(claimed.value.has_value() && claimed.value->ok());
  EXPECT_EQ(w.readies->load(), 1);
  std::vector<ClaimEvent> got = w.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].claim.id, "c1");
  EXPECT_EQ(Revision(), 1u);
  // The same for a release.
  store_->Pause();
  Result<absl::StatusOr<store::ClaimRecord>> released;
  allocator_->Release("alice", "c1", released.callback());
  EXPECT_TRUE(w.Take().empty());
  store_->Resume();
  got = w.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].claim.state, ClaimState::kReleased);
}

TEST_F(WatchTest, AFailedCommitPublishesNothingAndDoesNotStallLaterChanges) {
  Watcher w = WatchFrom(0);
  ASSERT_TRUE(ClaimNow("c1").ok());
  store_->FailNextCommits(1, absl::UnavailableError("disk"));
  EXPECT_FALSE(ReleaseNow("c1").ok());
  ASSERT_TRUE(ClaimNow("c2").ok());
  std::vector<ClaimEvent> got = w.Take();
  ASSERT_EQ(got.size(), 2u) << Describe(got);
  EXPECT_EQ(got[0].revision, 1u);
  EXPECT_EQ(got[1].revision, 3u);
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->state, ClaimState::kActive);
}

TEST_F(WatchTest, ASlowConsumerIsAbortedAndClaimsGoOn) {
  options_.watch_queue = 3;
  Start();
  ASSERT_TRUE(ClaimNow("old1").ok());
  ASSERT_TRUE(ClaimNow("old2").ok());
  ASSERT_TRUE(ClaimNow("old3").ok());
  ASSERT_TRUE(ClaimNow("old4").ok());
  // The initial state (4 claims) does not count against the bound.
  Watcher w = WatchFrom(0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ClaimNow(absl::StrCat("c", i)).ok());
  // One more than the queue holds.
  ASSERT_TRUE(ClaimNow("c3").ok());
  ASSERT_TRUE(ClaimNow("c4").ok());
  EXPECT_EQ(Revision(), 9u);
  EXPECT_TRUE(w.Take().empty());
  EXPECT_EQ(w.ended.code(), absl::StatusCode::kAborted) << w.ended;
  EXPECT_THAT(w.ended.message(), HasSubstr("read too slowly"));
  // A consumer that keeps up is not affected.
  Watcher fast = WatchFrom(9);
  for (int i = 5; i < 12; ++i) {
    ASSERT_TRUE(ClaimNow(absl::StrCat("c", i)).ok());
    EXPECT_EQ(fast.Take().size(), 1u);
  }
  EXPECT_TRUE(fast.ended.ok()) << fast.ended;
}

TEST_F(WatchTest, CloseWatchesAndShutdownEndWatchesWithUnavailable) {
  Watcher w = WatchFrom(0);
  ASSERT_TRUE(ClaimNow("c1").ok());
  allocator_->CloseWatches(absl::UnavailableError("server shutting down"));
  EXPECT_EQ(w.readies->load(), 0);  // it had not polled since the claim
  std::vector<ClaimEvent> got = w.Take();
  EXPECT_EQ(got.size(), 1u);  // what was queued is still delivered
  EXPECT_EQ(w.ended.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(allocator_->Watch(Req("alice"), [] {}).status().code(), absl::StatusCode::kUnavailable);

  Restart();
  Watcher survivor = WatchFrom(0);
  survivor.Take();
  allocator_.reset();  // the watch outlives the allocator
  EXPECT_EQ(survivor.readies->load(), 1);
  EXPECT_TRUE(survivor.Take().empty());
  EXPECT_EQ(survivor.ended.code(), absl::StatusCode::kUnavailable);
  survivor.watch.reset();
}

TEST_F(WatchTest, CancelFromInsideReadyDoesNotWaitForItself) {
  std::unique_ptr<ClaimWatch> watch;
  int readies = 0;
  auto w = allocator_->Watch(Req("alice"), [&] {
    ++readies;
    watch.reset();  // what a gRPC reactor deleted in its own callback does
  });
  ASSERT_TRUE(w.ok());
  watch = std::move(*w);
  std::vector<ClaimEventPtr> out;
  ASSERT_TRUE(watch->Poll(&out, 10).ok());  // arms it
  ASSERT_TRUE(ClaimNow("c1").ok());
  EXPECT_EQ(readies, 1);
  EXPECT_EQ(watch, nullptr);
  ASSERT_TRUE(ClaimNow("c2").ok());
  EXPECT_EQ(readies, 1);
}

TEST_F(WatchTest, SuspendAndResumeRecordTheStateWithARevisionAndAnEvent) {
  ASSERT_TRUE(ClaimNow("c1").ok());
  Watcher w = WatchFrom(1);
  auto s = SuspendNow("c1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->suspended);
  EXPECT_EQ(s->revision, 2u);
  EXPECT_TRUE(allocator_->GetClaim("alice", "c1")->suspended);
  EXPECT_TRUE(store_->Snapshot().claims.at(0).suspended);
  // Idempotent: OK, the runtime is asked again, but no new revision.
  auto again = SuspendNow("c1");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->suspended);
  EXPECT_EQ(again->revision, 2u);
  auto resumed = SuspendNow("c1", false);
  ASSERT_TRUE(resumed.ok());
  EXPECT_FALSE(resumed->suspended);
  EXPECT_EQ(resumed->revision, 3u);
  EXPECT_THAT(runtime_.freezes(),
              ElementsAre("suspend sb-alice-c1", "suspend sb-alice-c1", "resume sb-alice-c1"));
  std::vector<ClaimEvent> got = w.Take();
  ASSERT_EQ(got.size(), 2u) << Describe(got);
  EXPECT_EQ(got[0].type, Type::kModified);
  EXPECT_TRUE(got[0].claim.suspended);
  EXPECT_FALSE(got[1].claim.suspended);

  // A runtime error leaves the claim as it was.
  runtime_.FailNextFreeze(absl::UnavailableError("freezer busy"));
  auto failed = SuspendNow("c1");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr("claim \"c1\""));
  EXPECT_THAT(failed.status().message(), HasSubstr("freezer busy"));
  EXPECT_FALSE(allocator_->GetClaim("alice", "c1")->suspended);
  EXPECT_EQ(Revision(), 3u);
  // A store error too; a retry then works.
  store_->FailNextCommits(1, absl::UnavailableError("disk"));
  EXPECT_EQ(SuspendNow("c1").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(allocator_->GetClaim("alice", "c1")->suspended);
  ASSERT_TRUE(SuspendNow("c1").ok());
  EXPECT_TRUE(allocator_->GetClaim("alice", "c1")->suspended);

  // Errors.
  EXPECT_EQ(SuspendNow("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SuspendNow("c1", true, "bob").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(ReleaseNow("c1").ok());
  EXPECT_EQ(SuspendNow("c1").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SuspendNow("c1", false).status().code(), absl::StatusCode::kFailedPrecondition);

  // The suspended state survives a restart.
  ASSERT_TRUE(ClaimNow("c2").ok());
  ASSERT_TRUE(SuspendNow("c2").ok());
  Restart();
  EXPECT_TRUE(allocator_->GetClaim("alice", "c2")->suspended);
}

// A Kubernetes sandbox resumes in a new pod, with a new IP: the claim follows it, in the
// same revision as its resumption, and so does the sandbox's record (a restart finds it).
TEST_F(WatchTest, AResumedSandboxThatMovedIsFollowedByItsClaim) {
  ASSERT_TRUE(ClaimNow("c1").ok());
  const std::string before = allocator_->GetClaim("alice", "c1")->endpoint;
  const std::string sandbox = allocator_->GetClaim("alice", "c1")->sandbox_id;
  ASSERT_TRUE(SuspendNow("c1").ok());
  Watcher w = WatchFrom(Revision());
  runtime_.MoveOnResume(sandbox, "10.0.0.9:7070", "node-b");
  auto resumed = SuspendNow("c1", false);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(resumed->suspended);
  EXPECT_EQ(resumed->endpoint, "10.0.0.9:7070");
  EXPECT_NE(before, "10.0.0.9:7070");
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->endpoint, "10.0.0.9:7070");
  std::vector<ClaimEvent> got = w.Take();
  ASSERT_EQ(got.size(), 1u) << Describe(got);
  EXPECT_EQ(got[0].claim.endpoint, "10.0.0.9:7070");
  const auto stored = store_->Snapshot();
  ASSERT_EQ(stored.claims.size(), 1u);
  EXPECT_EQ(stored.claims[0].endpoint, "10.0.0.9:7070");
  bool found = false;
  for (const store::SandboxRecord& r : stored.sandboxes) {
    if (r.id != sandbox) continue;
    found = true;
    EXPECT_EQ(r.endpoint, "10.0.0.9:7070");
    EXPECT_EQ(r.node, "node-b");
  }
  EXPECT_TRUE(found);
  // Resumed again where it runs now: nothing changes.
  const uint64_t revision = Revision();
  ASSERT_TRUE(SuspendNow("c1", false).ok());
  EXPECT_EQ(Revision(), revision);
  Restart();
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->endpoint, "10.0.0.9:7070");
}

TEST_F(WatchTest, ExpiryStillFiresForASuspendedClaim) {
  ClaimRequest r;
  r.owner = "alice";
  r.claim_id = "c1";
  r.pool = "py";
  r.ttl = absl::Seconds(10);
  AddWarm("s1");
  Result<absl::StatusOr<ClaimResult>> out;
  allocator_->Claim(r, out.callback());
  ASSERT_TRUE(out.value.has_value() && out.value->ok());
  ASSERT_TRUE(SuspendNow("c1").ok());
  clock_.Advance(absl::Seconds(11));
  allocator_->Tick();
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->state, ClaimState::kExpired);
}

TEST_F(WatchTest, SandboxDeathDuringAnUpdateMakesTheClaimLost) {
  ASSERT_TRUE(ClaimNow("c1").ok());
  store_->Pause();
  Result<absl::StatusOr<ClaimResult>> renewed;
  allocator_->Renew("alice", "c1", absl::Minutes(1), renewed.callback());
  ASSERT_TRUE(allocator_->SandboxGone("sb-alice-c1").ok());
  store_->Resume();
  ASSERT_TRUE(renewed.value.has_value() && renewed.value->ok());
  EXPECT_EQ(allocator_->GetClaim("alice", "c1")->state, ClaimState::kLost);
}

// ---- The reorder buffer on its own ----

ClaimEventPtr Event(uint64_t revision, const std::string& id) {
  auto e = std::make_shared<ClaimEvent>();
  e->type = Type::kAdded;
  e->revision = revision;
  e->claim.owner = "alice";
  e->claim.id = id;
  e->claim.revision = revision;
  return e;
}

TEST(WatchHubTest, PublishesInRevisionOrderWhateverOrderCommitsFinishIn) {
  auto hub = std::make_shared<WatchHub>(10, 100, 100);
  auto watch = hub->Subscribe(
      Req("alice", 10), [] {},
      [](const WatchRequest&) { return std::vector<store::ClaimRecord>(); });
  ASSERT_TRUE(watch.ok());
  EXPECT_EQ(hub->Reserve(), 11u);
  EXPECT_EQ(hub->Reserve(2), 12u);
  EXPECT_EQ(hub->Reserve(), 14u);
  hub->Complete(13, Event(13, "c13"));
  hub->Complete(14, Event(14, "c14"));
  std::vector<ClaimEventPtr> got;
  ASSERT_TRUE((*watch)->Poll(&got, 10).ok());
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(hub->revision(), 10u);
  hub->Complete(12, nullptr);  // abandoned
  EXPECT_EQ(hub->revision(), 10u);
  hub->Complete(11, Event(11, "c11"));
  EXPECT_EQ(hub->revision(), 14u);
  ASSERT_TRUE((*watch)->Poll(&got, 10).ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0]->revision, 11u);
  EXPECT_EQ(got[1]->revision, 13u);
  EXPECT_EQ(got[2]->revision, 14u);
  // The abandoned revision is not the current revision (a restart might reuse it), but the
  // next real one is.
  EXPECT_EQ(hub->Reserve(), 15u);
  hub->Complete(15, nullptr);
  EXPECT_EQ(hub->revision(), 14u);
}

TEST(WatchHubTest, InitialStateHidesChangesItAlreadyShows) {
  auto hub = std::make_shared<WatchHub>(0, 100, 100);
  // c1 changed at 1 and 2, but revision 2 is published only after the snapshot was taken
  // at revision 1 and listed c1 at its newer state.
  EXPECT_EQ(hub->Reserve(2), 1u);
  hub->Complete(1, Event(1, "c1"));
  auto w = hub->Subscribe(
      Req("alice"), [] {},
      [&](const WatchRequest&) {
        hub->Complete(2, Event(2, "c1"));  // lands between registration and the scan
        EXPECT_EQ(hub->Reserve(), 3u);
        hub->Complete(3, Event(3, "c2"));
        store::ClaimRecord c1;
        c1.owner = "alice";
        c1.id = "c1";
        c1.revision = 2;
        return std::vector<store::ClaimRecord>{c1};
      });
  ASSERT_TRUE(w.ok());
  std::vector<ClaimEventPtr> got;
  ASSERT_TRUE((*w)->Poll(&got, 10).ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0]->initial);
  EXPECT_EQ(got[0]->revision, 1u);
  EXPECT_EQ(got[0]->claim.revision, 2u);
  EXPECT_EQ(got[1]->claim.id, "c2");
  EXPECT_EQ(got[1]->revision, 3u);
}

// ---- Restart with RocksDB ----

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "/sbx-watch-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

TEST(WatchRocksDbTest, RevisionsNeverGoBackwardsAcrossRestarts) {
  const std::string dir = TempDir();
  store::RocksDbStoreOptions so;
  so.path = dir + "/db";
  FakeClock clock;
  SequentialIdGenerator ids("id-");
  testing::RecordingReconciler reconciler;
  AllocatorOptions options;
  options.timer_thread = false;
  uint64_t last = 0;
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    auto store = store::OpenRocksDbStore(so);
    ASSERT_TRUE(store.ok()) << store.status();
    auto a = Allocator::Create(options, store->get(), nullptr, &reconciler, &clock, &ids);
    ASSERT_TRUE(a.ok()) << a.status();
    Allocator& alloc = **a;
    EXPECT_EQ(alloc.revision(), last);
    if (run == 0) {
      absl::Notification t, p;
      alloc.PutTemplate(store::TemplateRecord{"py", "local", "", 0},
                        [&](absl::Status) { t.Notify(); });
      t.WaitForNotification();
      store::PoolRecord pool;
      pool.name = "py";
      pool.template_name = "py";
      pool.max_warm = 10;
      pool.empty_pool_policy = EmptyPoolPolicy::kFail;
      alloc.PutPool(pool, [&](absl::Status) { p.Notify(); });
      p.WaitForNotification();
    }
    // A claim and its release; then every ended claim is deleted, so that the newest
    // revision lives only in the mark.
    ASSERT_TRUE(alloc.AddSandbox({absl::StrCat("s", run), "py", "unix:/x", ""}).ok());
    absl::Notification claimed;
    uint64_t claim_revision = 0;
    ClaimRequest r;
    r.owner = "alice";
    r.claim_id = absl::StrCat("c", run);
    r.pool = "py";
    alloc.Claim(r, [&](absl::StatusOr<ClaimResult> res) {
      EXPECT_TRUE(res.ok()) << res.status();
      if (res.ok()) claim_revision = res->claim.revision;
      claimed.Notify();
    });
    claimed.WaitForNotification();
    EXPECT_EQ(claim_revision, last + 1);
    absl::Notification released;
    alloc.Release("alice", r.claim_id, [&](absl::StatusOr<store::ClaimRecord> ended) {
      EXPECT_TRUE(ended.ok()) << ended.status();
      released.Notify();
    });
    released.WaitForNotification();
    clock.Advance(options.idempotency_window + absl::Seconds(1));
    alloc.Tick();
    ASSERT_TRUE((*store)->Close().ok());  // waits for the purge's commit
    EXPECT_EQ(alloc.revision(), last + 3);
    last = alloc.revision();
    a->reset();
  }
  std::system(("rm -rf " + dir).c_str());
}

// ---- Stress ----

// Several threads claim and release while a watcher checks that revisions strictly
// increase and that it sees every acknowledged change exactly once; a second watcher
// that starts from 0 in the middle must end up with the same state without duplicates.
TEST(WatchStressTest, ConcurrentChangesAreSeenExactlyOnceInOrder) {
  constexpr int kThreads = 6;
  constexpr int kPerThread = 400;
  store::MemoryStore store;  // callbacks on the committer thread, like RocksDB
  testing::RefillingReconciler reconciler("st-");
  SequentialIdGenerator ids("id-");
  AllocatorOptions options;
  options.watch_queue = 1'000'000;
  auto created = Allocator::Create(options, &store, nullptr, &reconciler, &Clock::Real(), &ids);
  ASSERT_TRUE(created.ok()) << created.status();
  Allocator& a = **created;
  {
    absl::Notification t, p;
    a.PutTemplate(store::TemplateRecord{"py", "local", "", 0}, [&](absl::Status) { t.Notify(); });
    t.WaitForNotification();
    store::PoolRecord pool;
    pool.name = "py";
    pool.template_name = "py";
    pool.min_warm = 16;
    pool.max_warm = 64;
    pool.empty_pool_policy = EmptyPoolPolicy::kWait;
    pool.default_wait = absl::Seconds(30);
    a.PutPool(pool, [&](absl::Status) { p.Notify(); });
    p.WaitForNotification();
  }
  reconciler.Start(&a);

  // A watcher thread: waits for `ready`, polls, checks order, records what it saw.
  struct Seen {
    std::map<std::string, std::vector<ClaimEvent>> by_claim;
    uint64_t last = 0;
    std::string error;
  };
  auto run_watcher = [&a](uint64_t start, Seen* seen, std::atomic<bool>* stop,
                          std::atomic<uint64_t>* reached, absl::Notification* subscribed) {
    absl::Mutex mu;
    bool wake = false;
    WatchRequest r;
    r.owner = "tenant";
    r.start_revision = start;
    auto watch = a.Watch(r, [&] {
      absl::MutexLock lock(&mu);
      wake = true;
    });
    subscribed->Notify();
    if (!watch.ok()) {
      seen->error = watch.status().ToString();
      return;
    }
    bool initial_done = start != 0;
    while (true) {
      std::vector<ClaimEventPtr> got;
      absl::Status s = (*watch)->Poll(&got, 512);
      if (!s.ok()) {
        seen->error = s.ToString();
        return;
      }
      for (const ClaimEventPtr& e : got) {
        if (e->initial) {
          if (initial_done) seen->error = "initial event after live ones";
          seen->last = e->revision;
        } else {
          initial_done = true;
          if (e->revision <= seen->last) {
            seen->error = absl::StrCat("revision ", e->revision, " after ", seen->last);
          }
          seen->last = e->revision;
        }
        seen->by_claim[e->claim.id].push_back(*e);
      }
      reached->store(seen->last);
      if (!got.empty()) continue;
      if (stop->load()) return;
      absl::MutexLock lock(&mu);
      mu.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(50));
      wake = false;
    }
  };
  Seen first, second;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> first_reached{0}, second_reached{0};
  absl::Notification first_subscribed, second_subscribed;
  std::thread watcher1(run_watcher, 0, &first, &stop, &first_reached, &first_subscribed);
  // The first watcher must see every change as a live event: it subscribes before any.
  first_subscribed.WaitForNotification();

  std::atomic<int> done_threads{0};
  absl::Mutex acked_mu;
  std::map<std::string, uint64_t> acked_claims;  // id -> revision
  std::map<std::string, bool> acked_releases;    // id -> released
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        ClaimRequest r;
        r.owner = "tenant";
        r.claim_id = absl::StrCat("t", t, "-", i);
        r.pool = "py";
        absl::Notification claimed;
        uint64_t rev = 0;
        a.Claim(r, [&](absl::StatusOr<ClaimResult> res) {
          if (res.ok()) rev = res->claim.revision;
          claimed.Notify();
        });
        claimed.WaitForNotification();
        if (rev == 0) continue;
        {
          absl::MutexLock lock(&acked_mu);
          acked_claims[r.claim_id] = rev;
        }
        if (i % 3 == 0) continue;  // keep some active
        absl::Notification released;
        bool ok = false;
        a.Release("tenant", r.claim_id, [&](absl::StatusOr<store::ClaimRecord> ended) {
          ok = ended.ok();
          released.Notify();
        });
        released.WaitForNotification();
        if (ok) {
          absl::MutexLock lock(&acked_mu);
          acked_releases[r.claim_id] = true;
        }
      }
      done_threads.fetch_add(1);
    });
  }
  // The second watcher starts from 0 while changes are in full flow (bounded: a claim path
  // that stalls fails here instead of hanging until the test's timeout).
  const absl::Time halfway_deadline = absl::Now() + absl::Seconds(60);
  while (a.revision() < static_cast<uint64_t>(kThreads * kPerThread / 2) &&
         absl::Now() < halfway_deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (a.revision() < static_cast<uint64_t>(kThreads * kPerThread / 2)) {
    // The claim threads are blocked in the allocator and cannot be joined: end here.
    std::fprintf(stderr, "FAILED: the claims stalled at revision %llu\n",
                 static_cast<unsigned long long>(a.revision()));
    std::abort();
  }
  std::thread watcher2(run_watcher, 0, &second, &stop, &second_reached, &second_subscribed);
  for (auto& th : threads) th.join();
  const uint64_t final_revision = a.revision();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while ((first_reached.load() < final_revision || second_reached.load() < final_revision) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  stop.store(true);
  watcher1.join();
  watcher2.join();
  reconciler.Stop();
  ASSERT_EQ(first.error, "");
  ASSERT_EQ(second.error, "");
  EXPECT_EQ(first.last, final_revision);
  EXPECT_EQ(second.last, final_revision);

  // The first watcher saw each acknowledged claim added once, at its revision, and each
  // acknowledged release once.
  ASSERT_EQ(acked_claims.size(), static_cast<size_t>(kThreads * kPerThread));
  for (const auto& [id, rev] : acked_claims) {
    const std::vector<ClaimEvent>& events = first.by_claim[id];
    const bool released = acked_releases.contains(id);
    ASSERT_EQ(events.size(), released ? 2u : 1u) << id << ": " << Describe(events);
    EXPECT_EQ(events[0].type, Type::kAdded) << id;
    EXPECT_EQ(events[0].revision, rev) << id;
    if (released) {
      EXPECT_EQ(events[1].type, Type::kModified) << id;
      EXPECT_EQ(events[1].claim.state, ClaimState::kReleased) << id;
    }
  }
  EXPECT_EQ(first.by_claim.size(), acked_claims.size());
  // The second watcher: for each claim, at most one initial event, then only changes
  // newer than what the initial event showed, ending in the same state as the allocator.
  ClaimFilter all;
  all.owner = "tenant";
  all.include_ended = true;
  all.limit = 0;
  for (const store::ClaimRecord& c : a.ListClaims(all)) {
    const std::vector<ClaimEvent>& events = second.by_claim[c.id];
    ASSERT_FALSE(events.empty()) << c.id;
    uint64_t shown = 0;
    for (const ClaimEvent& e : events) {
      EXPECT_GT(e.claim.revision, shown) << c.id << ": " << Describe(events);
      shown = e.claim.revision;
    }
    EXPECT_EQ(events.back().claim.state, c.state) << c.id;
    EXPECT_EQ(events.back().claim.revision, c.revision) << c.id;
  }
  std::printf("watch stress: %zu claims, final revision %llu\n", acked_claims.size(),
              static_cast<unsigned long long>(final_revision));
}

}  // namespace
}  // namespace sbx::allocator
