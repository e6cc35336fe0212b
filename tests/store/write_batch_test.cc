// WriteBatch, the batch checks (batch_check.h) and Store::CommitAndWait.

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/store/batch_check.h"
#include "src/store/store.h"
#include "tests/store/test_records.h"

namespace sbx::store {
namespace {

using ::testing::HasSubstr;
using testing_records::FullClaim;
using testing_records::FullPool;
using testing_records::FullSandbox;
using testing_records::FullTemplate;

TEST(WriteBatchTest, PutsAndDeletesRecordKindKeyAndRecord) {
  WriteBatch b;
  EXPECT_TRUE(b.empty());
  b.Put(FullTemplate("t1"));
  b.Put(FullPool("p1"));
  b.Put(FullSandbox("s1"));
  b.Put(FullClaim("c1"));
  b.DeleteTemplate("t2");
  b.DeletePool("p2");
  b.DeleteSandbox("s2");
  b.DeleteClaim("tenant-a", "c2");
  ASSERT_EQ(b.size(), 8u);
  EXPECT_FALSE(b.empty());
  const auto& m = b.mutations();
  const Mutation::Kind kinds[] = {Mutation::Kind::kTemplate, Mutation::Kind::kPool,
                                  Mutation::Kind::kSandbox, Mutation::Kind::kClaim};
  const char* keys[] = {"t1", "p1", "s1", "tenant-a/c1", "t2", "p2", "s2", "tenant-a/c2"};
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(m[i].kind, kinds[i % 4]) << i;
    EXPECT_EQ(m[i].key, keys[i]) << i;
    EXPECT_EQ(std::holds_alternative<std::monostate>(m[i].record), i >= 4) << i;
  }
  EXPECT_EQ(std::get<ClaimRecord>(m[3].record).owner, FullClaim("c1").owner);
  EXPECT_EQ(std::get<PoolRecord>(m[1].record).max_ttl, FullPool("p1").max_ttl);
  EXPECT_TRUE(CheckBatch(b).ok());
}

TEST(WriteBatchTest, CheckBatchNamesTheBadMutation) {
  {
    WriteBatch b;
    b.Put(FullClaim("ok"));
    b.Put(FullClaim("c"));
    b.mutations()[1].key = "d";
    absl::Status s = CheckBatch(b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("mutation 1"));
    EXPECT_THAT(s.message(), HasSubstr("\"d\""));
    EXPECT_THAT(s.message(), HasSubstr("\"tenant-a/c\""));
  }
  {
    // A claim's key is its owner and id: the right id under another owner is a bad key,
    // and so is the bare id (the format before claims were scoped by owner).
    for (const std::string& wrong :
         {ClaimKey("tenant-b", "c"), std::string("c"), ClaimKey("c", "tenant-a")}) {
      SCOPED_TRACE(wrong);
      WriteBatch b;
      b.Put(FullClaim("c"));
      b.mutations()[0].key = wrong;
      absl::Status s = CheckBatch(b);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(s.message(), HasSubstr("mutation 0"));
      EXPECT_THAT(s.message(), HasSubstr("\"" + wrong + "\""));
    }
  }
  {
    // The same id under two owners: two records, two keys, one valid batch.
    ClaimRecord a = FullClaim("same");
    ClaimRecord b_rec = FullClaim("same");
    b_rec.owner = "tenant-b";
    WriteBatch b;
    b.Put(a);
    b.Put(b_rec);
    b.DeleteClaim("tenant-b", "same");
    ASSERT_EQ(b.size(), 3u);
    EXPECT_EQ(b.mutations()[0].key, "tenant-a/same");
    EXPECT_EQ(b.mutations()[1].key, "tenant-b/same");
    EXPECT_EQ(b.mutations()[2].key, "tenant-b/same");
    EXPECT_TRUE(CheckBatch(b).ok());
  }
  {
    WriteBatch b;
    b.Put(FullSandbox("s"));
    b.mutations()[0].kind = Mutation::Kind::kClaim;
    absl::Status s = CheckBatch(b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("claim mutation carries a sandbox record"));
  }
  {
    WriteBatch b;
    b.DeletePool("");
    absl::Status s = CheckBatch(b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("empty pool key"));
  }
  for (const char* owner : {"", "tenant-a"}) {
    // An empty id, with or without an owner: the key ("/" or "tenant-a/") is not empty,
    // but names no claim.
    ClaimRecord c;
    c.owner = owner;
    WriteBatch b;
    b.Put(FullClaim("ok"));
    b.Put(c);
    absl::Status s = CheckBatch(b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << owner;
    EXPECT_THAT(s.message(), HasSubstr("mutation 1: empty claim id")) << owner;
  }
}

// Completes each commit from another thread with a fixed status.
class FixedStatusStore final : public Store {
 public:
  explicit FixedStatusStore(absl::Status status) : status_(std::move(status)) {}
  ~FixedStatusStore() override {
    if (worker_.joinable()) worker_.join();
  }
  void Commit(WriteBatch batch, CommitCallback done) override {
    last_size_ = batch.size();
    if (worker_.joinable()) worker_.join();
    worker_ = std::thread([this, done = std::move(done)]() mutable {
      absl::SleepFor(absl::Milliseconds(20));  // make a missing wait visible
      std::move(done)(status_);
    });
  }
  absl::StatusOr<Contents> LoadAll() override { return Contents{}; }
  absl::Status Close() override { return absl::OkStatus(); }
  StoreStats Stats() const override { return {}; }

  size_t last_size_ = 0;

 private:
  absl::Status status_;
  std::thread worker_;
};

TEST(CommitAndWaitTest, ReturnsTheCallbacksStatus) {
  FixedStatusStore ok_store(absl::OkStatus());
  WriteBatch b;
  b.Put(FullClaim("c"));
  b.DeleteClaim("tenant", "d");
  EXPECT_TRUE(ok_store.CommitAndWait(std::move(b)).ok());
  EXPECT_EQ(ok_store.last_size_, 2u);

  FixedStatusStore failing(absl::UnavailableError("disk on fire"));
  absl::Status s = failing.CommitAndWait(WriteBatch());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "disk on fire");
}

}  // namespace
}  // namespace sbx::store

namespace sbx::store {
namespace {

TEST(WriteBatchTest, CheckBatchRefusesAnOwnerWithASlash) {
  WriteBatch b;
  ClaimRecord c = testing_records::SmallClaim("c");
  c.owner = "a/b";
  b.Put(c);
  absl::Status s = CheckBatch(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("\"a/b\" contains '/'"));
}

}  // namespace
}  // namespace sbx::store
