// MemoryStore specifics: callback threads and its test hooks. The Store contract itself is
// checked for MemoryStore by store_conformance_test.cc.

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "src/store/memory_store.h"
#include "tests/store/test_records.h"

namespace sbx::store {
namespace {

using testing_records::FullClaim;
using testing_records::FullPool;
using testing_records::FullSandbox;
using testing_records::FullTemplate;
using testing_records::SameContents;
using testing_records::SmallClaim;

constexpr MemoryStoreOptions kInline{MemoryStoreOptions::CallbackMode::kInline};

WriteBatch ClaimBatch(const std::string& id) {
  WriteBatch b;
  b.Put(SmallClaim(id));
  return b;
}

// Records the order and thread of callbacks.
struct Recorder {
  absl::Mutex mu;
  std::vector<std::string> order ABSL_GUARDED_BY(mu);
  std::vector<absl::Status> statuses ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> threads ABSL_GUARDED_BY(mu);

  CommitCallback Callback(std::string name) {
    return [this, name = std::move(name)](absl::Status s) {
      absl::MutexLock lock(&mu);
      order.push_back(name);
      statuses.push_back(std::move(s));
      threads.push_back(std::this_thread::get_id());
    };
  }
  size_t count() {
    absl::MutexLock lock(&mu);
    return order.size();
  }
};

TEST(MemoryStoreTest, DefaultModeRunsCallbacksOnTheCommitterThread) {
  MemoryStore store;
  Recorder rec;
  store.Commit(ClaimBatch("a"), rec.Callback("a"));
  ASSERT_TRUE(store.AwaitIdle(absl::Seconds(10)));
  absl::MutexLock lock(&rec.mu);
  ASSERT_EQ(rec.threads.size(), 1u);
  EXPECT_NE(rec.threads[0], std::this_thread::get_id());
  EXPECT_TRUE(rec.statuses[0].ok());
}

TEST(MemoryStoreTest, InlineModeRunsTheCallbackBeforeCommitReturns) {
  MemoryStore store(kInline);
  Recorder rec;
  store.Commit(ClaimBatch("a"), rec.Callback("a"));
  absl::MutexLock lock(&rec.mu);
  ASSERT_EQ(rec.order.size(), 1u);
  EXPECT_EQ(rec.threads[0], std::this_thread::get_id());
}

TEST(MemoryStoreTest, PauseHoldsCommitsUntilResume) {
  MemoryStore store;
  Recorder rec;
  store.Pause();
  // The "retry vs in-flight commit" shape: a first commit is held in flight, a retry of
  // the same claim arrives, then the store lets both through in order.
  store.Commit(ClaimBatch("claim-1"), rec.Callback("first"));
  ASSERT_TRUE(store.AwaitPending(1, absl::Seconds(10)));
  ClaimRecord retried = SmallClaim("claim-1");  // same owner and id: the same record
  retried.sandbox_id = "s-retry";
  WriteBatch retry;
  retry.Put(retried);
  store.Commit(std::move(retry), rec.Callback("retry"));
  EXPECT_EQ(store.PendingCommits(), 2u);

  EXPECT_FALSE(store.AwaitIdle(absl::Milliseconds(100)));  // held, not lost
  EXPECT_EQ(rec.count(), 0u);
  EXPECT_TRUE(store.Snapshot().claims.empty());  // not applied either
  EXPECT_EQ(store.Stats().commits, 0u);

  store.Resume();
  ASSERT_TRUE(store.AwaitIdle(absl::Seconds(10)));
  {
    absl::MutexLock lock(&rec.mu);
    EXPECT_EQ(rec.order, (std::vector<std::string>{"first", "retry"}));
  }
  Contents c = store.Snapshot();
  ASSERT_EQ(c.claims.size(), 1u);
  EXPECT_EQ(c.claims[0].sandbox_id, "s-retry");
  EXPECT_EQ(store.Stats().commits, 2u);
  EXPECT_EQ(store.Stats().write_batches, 1u);  // held commits went out as one group
}

TEST(MemoryStoreTest, InlineResumeRunsHeldCallbacksOnTheResumingThread) {
  MemoryStore store(kInline);
  Recorder rec;
  store.Pause();
  store.Commit(ClaimBatch("a"), rec.Callback("a"));
  store.Commit(ClaimBatch("b"), rec.Callback("b"));
  EXPECT_EQ(rec.count(), 0u);
  EXPECT_EQ(store.PendingCommits(), 2u);
  store.Resume();
  absl::MutexLock lock(&rec.mu);
  EXPECT_EQ(rec.order, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(rec.threads[1], std::this_thread::get_id());
}

TEST(MemoryStoreTest, AwaitPendingTimesOutWhenNothingArrives) {
  MemoryStore store;
  EXPECT_FALSE(store.AwaitPending(1, absl::Milliseconds(20)));
  EXPECT_TRUE(store.AwaitIdle(absl::Milliseconds(20)));
}

TEST(MemoryStoreTest, FailNextCommitsFailsExactlyThatManyAndAppliesNothingOfThem) {
  for (MemoryStoreOptions options : {MemoryStoreOptions{}, kInline}) {
    MemoryStore store(options);
    store.FailNextCommits(2, absl::UnavailableError("injected"));
    EXPECT_EQ(store.CommitAndWait(ClaimBatch("a")).code(), absl::StatusCode::kUnavailable);
    absl::Status second = store.CommitAndWait(ClaimBatch("b"));
    EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(second.message(), "injected");
    EXPECT_TRUE(store.CommitAndWait(ClaimBatch("c")).ok());
    Contents c = store.Snapshot();
    ASSERT_EQ(c.claims.size(), 1u);
    EXPECT_EQ(c.claims[0].id, "c");
    EXPECT_EQ(store.Stats().commits, 3u);
    EXPECT_EQ(store.Stats().write_batches, 1u);  // failed commits wrote nothing
  }
}

TEST(MemoryStoreTest, InjectedFailureHitsOnlyItsCommitWithinAGroup) {
  MemoryStore store;
  Recorder rec;
  store.Pause();
  store.Commit(ClaimBatch("a"), rec.Callback("a"));
  store.FailNextCommits(1, absl::AbortedError("injected"));
  store.Commit(ClaimBatch("b"), rec.Callback("b"));
  store.Commit(ClaimBatch("c"), rec.Callback("c"));
  store.Resume();
  ASSERT_TRUE(store.AwaitIdle(absl::Seconds(10)));
  {
    absl::MutexLock lock(&rec.mu);
    ASSERT_EQ(rec.statuses.size(), 3u);
    EXPECT_TRUE(rec.statuses[0].ok());
    EXPECT_EQ(rec.statuses[1].code(), absl::StatusCode::kAborted);
    EXPECT_TRUE(rec.statuses[2].ok());
  }
  EXPECT_EQ(store.Snapshot().claims.size(), 2u);
}

TEST(MemoryStoreTest, FailNextLoadAllFailsOnce) {
  MemoryStore store;
  store.FailNextLoadAll(absl::DataLossError("injected"));
  EXPECT_EQ(store.LoadAll().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(store.LoadAll().ok());
}

TEST(MemoryStoreTest, CloseReleasesAPauseAndCompletesHeldCommits) {
  for (MemoryStoreOptions options : {MemoryStoreOptions{}, kInline}) {
    MemoryStore store(options);
    Recorder rec;
    store.Pause();
    store.Commit(ClaimBatch("a"), rec.Callback("a"));
    ASSERT_TRUE(store.Close().ok());
    {
      absl::MutexLock lock(&rec.mu);
      ASSERT_EQ(rec.statuses.size(), 1u);
      EXPECT_TRUE(rec.statuses[0].ok());
    }
    EXPECT_EQ(store.Snapshot().claims.size(), 1u);  // Snapshot works after Close
  }
}

TEST(MemoryStoreTest, CloseFromACallbackIsRefused) {
  for (MemoryStoreOptions options : {MemoryStoreOptions{}, kInline}) {
    MemoryStore store(options);
    absl::Notification done;
    absl::Status close_status;
    store.Commit(ClaimBatch("a"), [&](absl::Status) {
      close_status = store.Close();
      done.Notify();
    });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(close_status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(store.Close().ok());
  }
}

// A claim of `owner`, otherwise FullClaim(id).
ClaimRecord OwnedClaim(const std::string& owner, const std::string& id) {
  ClaimRecord r = FullClaim(id);
  r.owner = owner;
  return r;
}

TEST(MemoryStoreTest, StartsFromInitialContentsSortedByKey) {
  Contents initial;
  initial.templates = {FullTemplate("t2"), FullTemplate("t1")};
  initial.pools = {FullPool("p")};
  initial.sandboxes = {FullSandbox("s")};
  // Claims are keyed by owner and id: "c1" of tenant-b is not "c1" of tenant-a, and
  // tenant-b's "c0" sorts after all of tenant-a's claims.
  initial.claims = {FullClaim("c2"), OwnedClaim("tenant-b", "c1"), FullClaim("c1"),
                    OwnedClaim("tenant-b", "c0")};
  MemoryStore store(initial);
  Contents want;
  want.templates = {FullTemplate("t1"), FullTemplate("t2")};
  want.pools = {FullPool("p")};
  want.sandboxes = {FullSandbox("s")};
  want.claims = {FullClaim("c1"), FullClaim("c2"), OwnedClaim("tenant-b", "c0"),
                 OwnedClaim("tenant-b", "c1")};
  absl::StatusOr<Contents> got = store.LoadAll();
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(SameContents(*got, want));

  // The initial claims have the keys a commit uses: a delete by owner and id finds them.
  WriteBatch b;
  b.DeleteClaim("tenant-b", "c1");
  ASSERT_TRUE(store.CommitAndWait(std::move(b)).ok());
  want.claims = {FullClaim("c1"), FullClaim("c2"), OwnedClaim("tenant-b", "c0")};
  EXPECT_TRUE(SameContents(store.Snapshot(), want));
}

}  // namespace
}  // namespace sbx::store
