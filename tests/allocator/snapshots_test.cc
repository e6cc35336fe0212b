// allocator::Snapshots over a real allocator and MemoryStore, with a runtime whose snapshot
// files are a set in memory: ownership (another tenant's snapshot is NOT_FOUND), the byte
// quota (charged as the copy proceeds, reservations of captures in flight included),
// refcounted deletion, a failed commit, and the start's reconciliation of records with
// files.

#include "src/allocator/snapshots.h"

#include <memory>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::allocator {
namespace {

using ::testing::HasSubstr;

// Snapshot files as a set; each capture charges `bytes` in chunks of 10, as a copy would.
class SnapshotRuntime : public testing::ManualRuntime {
 public:
  void Snapshot(std::string sandbox_id, std::string snapshot_id, runtime::SnapshotCharge charge,
                runtime::SnapshotCallback done) override {
    int64_t bytes;
    {
      absl::MutexLock lock(&mu_);
      bytes = bytes_;
      captured_.push_back(sandbox_id);
    }
    for (int64_t left = bytes; left > 0; left -= 10) {
      if (absl::Status s = charge(std::min<int64_t>(10, left)); !s.ok()) {
        return std::move(done)(s);  // a real runtime removes the partial files
      }
    }
    runtime::SnapshotCapture c;
    c.bytes = bytes;
    c.image_digest = "sha256:img";
    {
      absl::MutexLock lock(&mu_);
      files_.insert(snapshot_id);
      if (hold_) {
        held_.push_back([c, done = std::move(done)]() mutable { std::move(done)(c); });
        return;
      }
    }
    std::move(done)(c);
  }
  // Resets are recorded and answered when FinishResets() is called.
  void Reset(std::string sandbox_id, std::string snapshot_id, std::string image_digest,
             runtime::DoneCallback done) override {
    absl::MutexLock lock(&mu_);
    resets_.push_back(absl::StrCat(sandbox_id, " ", snapshot_id, " ", image_digest));
    pending_resets_.push_back(std::move(done));
  }
  void FinishResets(absl::Status s) {
    std::vector<runtime::DoneCallback> pending;
    {
      absl::MutexLock lock(&mu_);
      pending.swap(pending_resets_);
    }
    for (auto& d : pending) std::move(d)(s);
  }
  std::vector<std::string> resets() const {
    absl::MutexLock lock(&mu_);
    return resets_;
  }
  absl::Status DeleteSnapshot(const std::string& id) override {
    absl::MutexLock lock(&mu_);
    files_.erase(id);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> ListSnapshots() override {
    absl::MutexLock lock(&mu_);
    return std::vector<std::string>(files_.begin(), files_.end());
  }
  void set_bytes(int64_t b) {
    absl::MutexLock lock(&mu_);
    bytes_ = b;
  }
  // Captures answer only when Finish() is called (their charges are taken at once).
  void set_hold(bool h) {
    absl::MutexLock lock(&mu_);
    hold_ = h;
  }
  void FinishHeld() {
    std::vector<absl::AnyInvocable<void() &&>> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (auto& h : held) std::move(h)();
  }
  void AddFiles(const std::string& id) {
    absl::MutexLock lock(&mu_);
    files_.insert(id);
  }
  bool HasFiles(const std::string& id) const {
    absl::MutexLock lock(&mu_);
    return files_.contains(id);
  }

 private:
  mutable absl::Mutex mu_;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 50;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> files_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> captured_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void() &&>> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> resets_ ABSL_GUARDED_BY(mu_);
  std::vector<runtime::DoneCallback> pending_resets_ ABSL_GUARDED_BY(mu_);
};

store::MemoryStoreOptions Inline() {
  store::MemoryStoreOptions o;
  o.callbacks = store::MemoryStoreOptions::CallbackMode::kInline;
  return o;
}

class SnapshotsTest : public ::testing::Test {
 protected:
  SnapshotsTest() : store_(std::make_unique<store::MemoryStore>(Inline())) {}
  // A reset a failed assertion left unanswered is answered, so that ~Snapshots (which
  // waits for its callbacks) does not wait for ever.
  void TearDown() override { runtime_.FinishResets(absl::CancelledError("the test ended")); }

  void SetUp() override {
    Start();
    store::TemplateRecord t;
    t.name = "py";
    t.runtime = "local";
    Wait([&](auto cb) { allocator_->PutTemplate(t, cb); });
    store::PoolRecord p;
    p.name = "py";
    p.template_name = "py";
    p.max_warm = 10;
    p.empty_pool_policy = store::EmptyPoolPolicy::kFail;
    Wait([&](auto cb) { allocator_->PutPool(p, cb); });
  }

  void Start(int64_t quota = 100) {
    snapshots_.reset();
    allocator_.reset();
    AllocatorOptions options;
    options.timer_thread = false;
    auto a = Allocator::Create(options, store_.get(), &runtime_, &reconciler_, &clock_,
                               &IdGenerator::Random());
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
    SnapshotsOptions so;
    so.quota_bytes = quota;
    auto s = Snapshots::Make(so, allocator_.get(), store_.get(), &runtime_, &clock_,
                             &IdGenerator::Random());
    ASSERT_TRUE(s.ok()) << s.status();
    snapshots_ = std::move(*s);
  }

  template <typename F>
  void Wait(F f) {
    std::optional<absl::Status> r;
    f([&](absl::Status s) { r = s; });
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->ok()) << *r;
  }

  // A claim of `owner` on a new warm sandbox.
  std::string ClaimFor(const std::string& owner) {
    const std::string sb = absl::StrCat("sb-", ++n_);
    runtime::SandboxInfo info;
    info.id = sb;
    info.pool = "py";
    info.endpoint = "unix:/run/" + sb;
    EXPECT_TRUE(allocator_->AddSandbox(info).ok());
    ClaimRequest r;
    r.owner = owner;
    r.claim_id = absl::StrCat("c", n_);
    r.pool = "py";
    std::optional<absl::StatusOr<ClaimResult>> out;
    allocator_->Claim(r, [&](absl::StatusOr<ClaimResult> c) { out = std::move(c); });
    EXPECT_TRUE(out.has_value() && out->ok());
    return r.claim_id;
  }

  // The answer, or INTERNAL "held" while the runtime holds the capture (the answer then
  // lands in `late`, which outlives the call).
  absl::StatusOr<SnapshotCreated> Create(const std::string& owner, const std::string& claim) {
    auto out = std::make_shared<std::optional<absl::StatusOr<SnapshotCreated>>>();
    SnapshotCreateRequest r;
    r.owner = owner;
    r.claim_id = claim;
    r.name = "n";
    snapshots_->Create(r, [out](absl::StatusOr<SnapshotCreated> c) { *out = std::move(c); });
    late_.push_back(out);
    if (!out->has_value()) return absl::InternalError("held");
    return **out;
  }

  absl::Status Delete(const std::string& owner, const std::string& id) {
    std::optional<absl::Status> out;
    snapshots_->Delete(owner, id, [&](absl::Status s) { out = s; });
    return out.value_or(absl::InternalError("no answer"));
  }

  // Starts a reset; its answer lands in the returned slot (empty until the runtime
  // answers), `started` says whether the starting hook ran.
  std::shared_ptr<std::optional<absl::StatusOr<store::ClaimRecord>>> Reset(
      const std::string& owner, const std::string& claim, const std::string& snapshot,
      bool* started = nullptr) {
    auto out = std::make_shared<std::optional<absl::StatusOr<store::ClaimRecord>>>();
    snapshots_->Reset(
        owner, claim, snapshot,
        [started](const store::ClaimRecord&) {
          if (started != nullptr) *started = true;
        },
        [out](absl::StatusOr<store::ClaimRecord> c) { *out = std::move(c); });
    return out;
  }

  std::unique_ptr<store::MemoryStore> store_;
  SnapshotRuntime runtime_;
  testing::RecordingReconciler reconciler_;
  FakeClock clock_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Snapshots> snapshots_;
  std::vector<std::shared_ptr<std::optional<absl::StatusOr<SnapshotCreated>>>> late_;
  int n_ = 0;
};

TEST_F(SnapshotsTest, AnotherTenantsSnapshotIsNotFound) {
  const std::string c = ClaimFor("alice");
  absl::StatusOr<SnapshotCreated> s = Create("alice", c);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string id = s->snapshot.id;
  EXPECT_EQ(s->snapshot.owner, "alice");
  EXPECT_EQ(s->snapshot.size_bytes, 50);
  EXPECT_EQ(snapshots_->Get("bob", id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Delete("bob", id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(snapshots_->List("bob", {}).empty());
  EXPECT_EQ(Create("bob", c).status().code(), absl::StatusCode::kNotFound);  // alice's claim
  // The not-found answers are the same as for an id that never existed.
  EXPECT_EQ(snapshots_->Get("bob", id).status().message(),
            absl::StrCat("snapshot \"", id, "\" not found"));
  EXPECT_TRUE(snapshots_->Get("alice", id).ok());
  EXPECT_TRUE(runtime_.HasFiles(id));
}

TEST_F(SnapshotsTest, TheQuotaCountsRecordedSnapshotsAndCapturesInFlight) {
  const std::string c = ClaimFor("alice");
  runtime_.set_bytes(60);
  absl::StatusOr<SnapshotCreated> first = Create("alice", c);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<SnapshotCreated> second = Create("alice", c);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("--snapshot_quota_bytes"));
  EXPECT_THAT(second.status().message(), HasSubstr("alice"));
  EXPECT_EQ(snapshots_->used_bytes("alice"), 60);
  EXPECT_EQ(snapshots_->stats().quota_refusals, 1u);
  // Another tenant has a quota of its own.
  EXPECT_TRUE(Create("bob", ClaimFor("bob")).ok());
  ASSERT_TRUE(Delete("alice", first->snapshot.id).ok());
  EXPECT_EQ(snapshots_->used_bytes("alice"), 0);
  // Two captures in flight: the second is refused by the first's reservation, before
  // either is recorded.
  runtime_.set_hold(true);
  EXPECT_EQ(Create("alice", c).status().code(), absl::StatusCode::kInternal);  // held
  EXPECT_EQ(Create("alice", c).status().code(), absl::StatusCode::kResourceExhausted);
  runtime_.FinishHeld();
  ASSERT_TRUE(late_[late_.size() - 2]->has_value());
  EXPECT_TRUE(late_[late_.size() - 2]->value().ok());
  EXPECT_EQ(snapshots_->used_bytes("alice"), 60);
  EXPECT_EQ(snapshots_->List("alice", {}).size(), 1u);
}

TEST_F(SnapshotsTest, ASnapshotInUseRefusesDeletionNamingItsUser) {
  absl::StatusOr<SnapshotCreated> s = Create("alice", ClaimFor("alice"));
  ASSERT_TRUE(s.ok());
  const std::string id = s->snapshot.id;
  ASSERT_TRUE(snapshots_->Hold(id, "template \"golden\"").ok());
  absl::Status d = Delete("alice", id);
  EXPECT_EQ(d.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(d.message(), HasSubstr("template \"golden\""));
  EXPECT_TRUE(runtime_.HasFiles(id));
  snapshots_->Unhold(id, "template \"golden\"");
  EXPECT_TRUE(Delete("alice", id).ok());
  EXPECT_FALSE(runtime_.HasFiles(id));
  EXPECT_EQ(snapshots_->Hold(id, "x").code(), absl::StatusCode::kNotFound);
}

TEST_F(SnapshotsTest, AFailedCommitLeavesNoFilesAndGivesTheBytesBack) {
  const std::string c = ClaimFor("alice");
  store_->FailNextCommits(1, absl::UnavailableError("disk full"));
  absl::StatusOr<SnapshotCreated> s = Create("alice", c);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(runtime_.ListSnapshots()->empty());
  EXPECT_EQ(snapshots_->used_bytes("alice"), 0);
  runtime_.set_bytes(100);  // the whole quota is free again
  EXPECT_TRUE(Create("alice", c).ok());
}

TEST_F(SnapshotsTest, TheStartDropsRecordsWithoutFilesAndFilesWithoutRecords) {
  const std::string c = ClaimFor("alice");
  runtime_.set_bytes(10);
  absl::StatusOr<SnapshotCreated> kept = Create("alice", c);
  absl::StatusOr<SnapshotCreated> lost = Create("alice", c);
  ASSERT_TRUE(kept.ok() && lost.ok());
  ASSERT_TRUE(runtime_.DeleteSnapshot(lost->snapshot.id).ok());  // its files are gone
  runtime_.AddFiles("sn-orphan");                                // files, no record
  Start();
  EXPECT_TRUE(snapshots_->Get("alice", kept->snapshot.id).ok());
  EXPECT_EQ(snapshots_->Get("alice", lost->snapshot.id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(runtime_.HasFiles("sn-orphan"));
  EXPECT_EQ(snapshots_->used_bytes("alice"), 10);
  // The dropped record is gone from the store too.
  for (const store::SnapshotRecord& r : store_->Snapshot().snapshots) {
    EXPECT_NE(r.id, lost->snapshot.id);
  }
  EXPECT_EQ(store_->Snapshot().snapshots.size(), 1u);
}

TEST_F(SnapshotsTest, AnEndedClaimCannotBeSnapshotted) {
  const std::string c = ClaimFor("alice");
  std::optional<absl::StatusOr<store::ClaimRecord>> out;
  allocator_->Release("alice", c, [&](absl::StatusOr<store::ClaimRecord> r) { out = r; });
  ASSERT_TRUE(out.has_value() && out->ok());
  EXPECT_EQ(Create("alice", c).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sbx::allocator

namespace sbx::allocator {
namespace {

// Another tenant's claim or snapshot is NOT_FOUND, and nothing reaches the runtime; the
// owner's reset passes the sandbox, the snapshot and its image to the runtime, holds the
// snapshot until the runtime answers, and gives the claim back.
TEST_F(SnapshotsTest, ResetChecksBothOwnersAndHoldsTheSnapshotWhileItRuns) {
  const std::string a = ClaimFor("alice");
  const std::string b = ClaimFor("bob");
  absl::StatusOr<SnapshotCreated> sa = Create("alice", a);
  absl::StatusOr<SnapshotCreated> sb = Create("bob", b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  bool started = false;
  auto r = Reset("bob", a, sb->snapshot.id, &started);  // alice's claim
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(r->value().status().code(), absl::StatusCode::kNotFound);
  r = Reset("bob", b, sa->snapshot.id, &started);  // alice's snapshot
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(r->value().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r->value().status().message(),
            absl::StrCat("snapshot \"", sa->snapshot.id, "\" not found"));
  EXPECT_FALSE(started);
  EXPECT_TRUE(runtime_.resets().empty());

  r = Reset("alice", a, sa->snapshot.id, &started);
  EXPECT_TRUE(started);
  EXPECT_FALSE(r->has_value());  // the runtime has not answered
  ASSERT_EQ(runtime_.resets().size(), 1u);
  EXPECT_EQ(runtime_.resets()[0], absl::StrCat("sb-1 ", sa->snapshot.id, " sha256:img"));
  absl::Status d = Delete("alice", sa->snapshot.id);
  EXPECT_EQ(d.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(d.message(), HasSubstr(absl::StrCat("the reset of claim \"", a, "\"")));
  runtime_.FinishResets(absl::OkStatus());
  ASSERT_TRUE(r->has_value());
  ASSERT_TRUE(r->value().ok()) << r->value().status();
  EXPECT_EQ(r->value()->id, a);
  EXPECT_EQ(snapshots_->stats().resets, 1u);
  EXPECT_TRUE(Delete("alice", sa->snapshot.id).ok());

  // A runtime error is passed on with the claim and the snapshot named, and the hold goes.
  r = Reset("bob", b, sb->snapshot.id);
  runtime_.FinishResets(absl::FailedPreconditionError("another image"));
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(r->value().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r->value().status().message(), HasSubstr(sb->snapshot.id));
  EXPECT_THAT(r->value().status().message(), HasSubstr("another image"));
  EXPECT_EQ(snapshots_->stats().reset_failures, 1u);
  EXPECT_TRUE(Delete("bob", sb->snapshot.id).ok());
}

}  // namespace
}  // namespace sbx::allocator
