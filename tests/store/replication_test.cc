// The replication side of RocksDbStore (replication.h): a leader's groups shipped before
// they are acknowledged, snapshots, and a standby that takes only records. Real RocksDB
// stores in fresh temporary directories; the shipper here is a test double (the real one,
// ReplicationHub, is tested in tests/replication).

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/write_batch.h"
#include "src/store/record_codec.h"
#include "src/store/replication.h"
#include "src/store/rocksdb_store.h"
#include "tests/store/test_records.h"

namespace sbx::store {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_records::FullClaim;
using testing_records::FullPool;
using testing_records::FullSandbox;

// Keeps what is shipped; acknowledges when `release` allows (at once by default).
class RecordingShipper final : public GroupShipper {
 public:
  absl::StatusOr<uint64_t> Ship(std::string group) override {
    absl::MutexLock lock(&mu_);
    if (!refusal_.ok()) return refusal_;
    if (recording_) groups_.push_back(std::move(group));
    return ++shipped_;
  }
  absl::Status AwaitReplicated(uint64_t ticket) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](RecordingShipper* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->open_; }, this));
    awaited_.push_back(ticket);
    return verdict_;
  }
  void LocalWriteFailed(uint64_t ticket) override {
    absl::MutexLock lock(&mu_);
    failed_.push_back(ticket);
  }
  // Keeps only the groups shipped from now on (as a standby attached now would get).
  void Record(bool on) {
    absl::MutexLock lock(&mu_);
    recording_ = on;
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Release(absl::Status verdict = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    verdict_ = std::move(verdict);
    open_ = true;
  }
  std::vector<std::string> groups() {
    absl::MutexLock lock(&mu_);
    return groups_;
  }
  std::vector<uint64_t> awaited() {
    absl::MutexLock lock(&mu_);
    return awaited_;
  }
  std::vector<uint64_t> failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  // Ship refuses every group with `refusal` (OK: ships again).
  void Refuse(absl::Status refusal) {
    absl::MutexLock lock(&mu_);
    refusal_ = std::move(refusal);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> groups_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> awaited_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> failed_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool recording_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t shipped_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status verdict_ ABSL_GUARDED_BY(mu_);
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);
};

class ReplicationStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "sbx_replication_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::unique_ptr<Store> Open(const std::string& name, bool pipeline = true) {
    RocksDbStoreOptions o;
    o.path = dir_ + "/" + name;
    o.min_free_bytes = 0;
    o.pipeline = pipeline;
    absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(o);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  static Replicable& R(Store& s) {
    Replicable* r = ReplicationOf(&s);
    EXPECT_NE(r, nullptr);
    return *r;
  }
  // Everything a store's LoadAll returns, as (kind, key) text for comparison.
  static std::vector<std::string> Keys(Store& s) {
    absl::StatusOr<Contents> c = s.LoadAll();
    EXPECT_TRUE(c.ok()) << c.status();
    std::vector<std::string> keys;
    if (!c.ok()) return keys;
    for (const auto& p : c->pools) keys.push_back("p/" + p.name);
    for (const auto& x : c->sandboxes) keys.push_back("s/" + x.id);
    for (const auto& x : c->claims) keys.push_back("c/" + ClaimKey(x.owner, x.id));
    keys.push_back("rev " + std::to_string(c->revision));
    return keys;
  }

  std::string dir_;
};

TEST_F(ReplicationStoreTest, AGroupIsShippedBeforeItsCommitsAreAcknowledged) {
  auto leader = Open("leader");
  RecordingShipper shipper;
  R(*leader).SetShipper(&shipper);
  shipper.Hold();
  WriteBatch b;
  b.Put(FullPool("py"));
  b.Put(FullSandbox("sb-1"));
  absl::Notification done;
  absl::Status result = absl::UnknownError("not called");
  leader->Commit(std::move(b), [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  // Written locally, shipped, but not acknowledged while the shipper holds it.
  while (shipper.groups().empty()) std::this_thread::yield();
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  shipper.Release();
  done.WaitForNotification();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(shipper.awaited(), std::vector<uint64_t>{1});

  // The shipped bytes, applied to a standby, give it the same records.
  auto standby = Open("standby");
  for (const std::string& g : shipper.groups()) ASSERT_TRUE(R(*standby).ApplyGroup(g).ok());
  EXPECT_EQ(Keys(*standby), Keys(*leader));
  R(*leader).SetShipper(nullptr);
}

TEST_F(ReplicationStoreTest, AShipperErrorFailsTheGroupsCommits) {
  auto leader = Open("leader");
  RecordingShipper shipper;
  R(*leader).SetShipper(&shipper);
  shipper.Release(absl::FailedPreconditionError("no longer leads"));
  WriteBatch b;
  b.Put(FullPool("py"));
  absl::Status s = leader->CommitAndWait(std::move(b));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  R(*leader).SetShipper(nullptr);
}

// A group the shipper refuses (a leader that keeps two copies with no standby in sync) is
// failed with the refusal and not written: nothing the caller was told failed stays in the
// store, with the pipelined commit and without.
TEST_F(ReplicationStoreTest, AGroupTheShipperRefusesIsNotWritten) {
  for (bool pipeline : {true, false}) {
    SCOPED_TRACE(pipeline ? "pipelined" : "not pipelined");
    auto leader = Open(pipeline ? "pipelined" : "plain", pipeline);
    {
      WriteBatch b;
      b.Put(FullPool("before"));
      ASSERT_TRUE(leader->CommitAndWait(std::move(b)).ok());
    }
    const std::vector<std::string> before = Keys(*leader);
    RecordingShipper shipper;
    R(*leader).SetShipper(&shipper);
    shipper.Refuse(absl::UnavailableError("no standby is in sync"));
    WriteBatch b;
    b.Put(FullPool("refused"));
    b.Put(FullSandbox("sb-refused"));
    absl::Status s = leader->CommitAndWait(std::move(b));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("no standby is in sync"));
    EXPECT_EQ(Keys(*leader), before);
    EXPECT_TRUE(shipper.groups().empty());
    EXPECT_TRUE(shipper.awaited().empty());
    EXPECT_TRUE(shipper.failed().empty());
    // Shipping again: the next group is written and acknowledged as usual.
    shipper.Refuse(absl::OkStatus());
    WriteBatch again;
    again.Put(FullPool("after"));
    EXPECT_TRUE(leader->CommitAndWait(std::move(again)).ok());
    EXPECT_EQ(shipper.groups().size(), 1u);
    R(*leader).SetShipper(nullptr);
  }
}

TEST_F(ReplicationStoreTest, ASnapshotAndTheGroupsAfterItRebuildTheStoreOnAStandby) {
  auto leader = Open("leader");
  {
    WriteBatch b;
    b.Put(FullPool("py"));
    for (int i = 0; i < 50; ++i) b.Put(FullSandbox("sb-" + std::to_string(i)));
    b.Put(RevisionRecord{7});
    ASSERT_TRUE(leader->CommitAndWait(std::move(b)).ok());
  }
  RecordingShipper shipper;
  shipper.Record(false);
  R(*leader).SetShipper(&shipper);
  std::vector<std::pair<std::string, std::string>> entries;
  bool at_called = false;
  ASSERT_TRUE(R(*leader)
                  .Snapshot(
                      [&] {
                        at_called = true;
                        shipper.Record(true);  // as a standby attached here
                      },
                      [&](absl::string_view k, absl::string_view v) {
                        EXPECT_TRUE(codec::IsReplicatedKey(k)) << k;
                        entries.emplace_back(k, v);
                      })
                  .ok());
  EXPECT_TRUE(at_called);
  {
    WriteBatch b;
    b.Put(FullClaim("c-1"));
    b.DeleteSandbox("sb-3");
    ASSERT_TRUE(leader->CommitAndWait(std::move(b)).ok());
  }
  auto standby = Open("standby");
  {  // The standby held records of its own before: the load replaces them.
    WriteBatch b;
    b.Put(FullPool("stale"));
    b.Put(FullClaim("stale-claim"));
    ASSERT_TRUE(standby->CommitAndWait(std::move(b)).ok());
  }
  ReplicaMarker marker{"replica-a", 3, "replica-b", false};
  Replicable& r = R(*standby);
  ASSERT_TRUE(r.BeginLoad(marker).ok());
  ASSERT_TRUE(r.LoadEntries(entries).ok());
  marker.complete = true;
  ASSERT_TRUE(r.WriteMarker(marker).ok());
  for (const std::string& g : shipper.groups()) ASSERT_TRUE(r.ApplyGroup(g).ok());
  EXPECT_EQ(Keys(*standby), Keys(*leader));
  absl::StatusOr<std::optional<ReplicaMarker>> read = r.ReadMarker();
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ(**read, marker);
  R(*leader).SetShipper(nullptr);

  // The marker survives a reopen, and LoadAll (recovery) skips it.
  standby.reset();
  standby = Open("standby");
  read = R(*standby).ReadMarker();
  ASSERT_TRUE(read.ok() && read->has_value());
  EXPECT_EQ(**read, marker);
  EXPECT_TRUE(standby->LoadAll().ok());
}

TEST_F(ReplicationStoreTest, AFreshStoreHasNoMarker) {
  auto store = Open("fresh");
  absl::StatusOr<std::optional<ReplicaMarker>> read = R(*store).ReadMarker();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->has_value());
}

// A leader (or anyone who got onto the replication stream) cannot make a standby's store
// claim to be someone else's, or another kind of database: only records are taken.
TEST_F(ReplicationStoreTest, AStandbyTakesOnlyRecordsFromAShippedGroup) {
  auto standby = Open("standby");
  Replicable& r = R(*standby);
  const ReplicaMarker mine{"replica-a", 1, "replica-b", true};
  ASSERT_TRUE(r.WriteMarker(mine).ok());
  {
    rocksdb::WriteBatch evil;
    evil.Put("p/fine", "x");
    evil.Put(std::string(codec::kReplicaKey),
             codec::EncodeReplicaMarker({"mallory", 99, "replica-b", true}));
    absl::Status s = r.ApplyGroup(evil.Data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("m/replica"));
  }
  {
    rocksdb::WriteBatch evil;
    evil.Delete(std::string(codec::kMarkerKey));
    EXPECT_EQ(r.ApplyGroup(evil.Data()).code(), absl::StatusCode::kInvalidArgument);
  }
  {
    rocksdb::WriteBatch evil;
    evil.DeleteRange("a", "z");
    EXPECT_EQ(r.ApplyGroup(evil.Data()).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(r.ApplyGroup("not a write batch").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.LoadEntries({{std::string(codec::kMarkerKey), "x"}}).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing of the refused groups was applied.
  absl::StatusOr<std::optional<ReplicaMarker>> read = r.ReadMarker();
  ASSERT_TRUE(read.ok() && read->has_value());
  EXPECT_EQ(**read, mine);
  absl::StatusOr<Contents> c = standby->LoadAll();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->pools.empty());
}

}  // namespace
}  // namespace sbx::store
