// Store replication end to end in one process: a leader's RocksDbStore with its
// ReplicationHub behind a real gRPC server (ReplicationService), and a standby's
// RocksDbStore fed by a Follower over loopback. The Lease is a test double: `publish`
// records what the hub asks it to name, and can refuse as a Lease this replica no longer
// holds would.

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/replication/v1/replication.grpc.pb.h"
#include "src/replication/follower.h"
#include "src/replication/hub.h"
#include "src/replication/service.h"
#include "src/store/replication.h"
#include "src/store/rocksdb_store.h"

namespace sbx::replication {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kToken[] = "replication-token-for-tests";

// What the Lease names, as the hub asked; `refuse` makes it answer as a Lease held by
// someone else.
class FakeLease {
 public:
  absl::Status Publish(const std::string& name) {
    absl::MutexLock lock(&mu_);
    if (!refusal_.ok()) return refusal_;
    named_ = name;
    history_.push_back(name);
    return absl::OkStatus();
  }
  std::string named() {
    absl::MutexLock lock(&mu_);
    return named_;
  }
  std::vector<std::string> history() {
    absl::MutexLock lock(&mu_);
    return history_;
  }
  void Refuse(absl::Status s) {
    absl::MutexLock lock(&mu_);
    refusal_ = std::move(s);
  }
  bool WaitNamed(const std::string& name, absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto named = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return named_ == name; };
    return mu_.AwaitWithTimeout(absl::Condition(&named), timeout);
  }

 private:
  absl::Mutex mu_;
  std::string named_;
  std::vector<std::string> history_;
  absl::Status refusal_;
};

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "sbx_replication_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    leader_store_ = Open("leader");
    standby_store_ = Open("standby");
    ASSERT_NE(leader_store_, nullptr);
    ASSERT_NE(standby_store_, nullptr);
  }
  void TearDown() override {
    follower_.reset();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    hub_.reset();  // before the store it ships from
    leader_store_.reset();
    standby_store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<store::Store> Open(const std::string& name) {
    store::RocksDbStoreOptions o;
    o.path = dir_ + "/" + name;
    o.min_free_bytes = 0;
    auto s = store::OpenRocksDbStore(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // The leader: a hub on its store, served by a real gRPC server.
  void StartLeader(absl::Duration ack_timeout = absl::Seconds(2), Copies copies = Copies::kOne) {
    HubOptions o;
    o.copies = copies;
    o.identity = "replica-a";
    o.term = 4;
    o.ack_timeout = ack_timeout;
    o.retry_period = absl::Milliseconds(20);
    o.publish = [this](const std::string& name) { return lease_.Publish(name); };
    hub_ = std::make_shared<ReplicationHub>(store::ReplicationOf(leader_store_.get()), o);
    service_ = std::make_unique<ReplicationService>(kToken, [this] { return hub_; });
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void StartFollower(const std::string& identity = "replica-b") {
    FollowerOptions o;
    o.identity = identity;
    o.leader_address = [this] { return "127.0.0.1:" + std::to_string(port_); };
    o.token = kToken;
    o.store = store::ReplicationOf(standby_store_.get());
    o.retry_period = absl::Milliseconds(50);
    follower_ = std::make_unique<Follower>(o);
    follower_->Start();
  }

  absl::Status Commit(store::Store& s, const std::string& pool) {
    return s.CommitAndWait(PoolBatch(pool));
  }
  static store::WriteBatch PoolBatch(const std::string& pool) {
    store::WriteBatch b;
    store::PoolRecord p;
    p.name = pool;
    p.template_name = "t";
    p.min_warm = 1;
    p.empty_pool_policy = store::EmptyPoolPolicy::kFail;
    p.selection_policy = "fifo";
    b.Put(p);
    return b;
  }

  // Waits until the hub knows the Lease names `name` and, unless `name` is "", that the
  // standby is attached and in sync (what a commit with two copies needs).
  bool WaitHubNamed(const std::string& name, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      HubStats st = hub_->Stats();
      if (st.named == name && (name.empty() || (st.attached && st.in_sync))) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  // Attaches a hand-driven standby `identity` and acknowledges its snapshot: it is then in
  // sync, and acknowledges nothing more unless told to (AckAll).
  std::shared_ptr<ReplicationHub::Feed> AttachByHand(const std::string& identity) {
    auto feed = hub_->Attach(identity);
    EXPECT_TRUE(feed.ok()) << feed.status();
    if (!feed.ok()) return nullptr;
    AckAll(**feed);
    return *feed;
  }
  // Reads what the hub queued for `feed` and acknowledges the last group (or snapshot).
  void AckAll(ReplicationHub::Feed& feed) {
    uint64_t last = 0;
    bool any = false;
    absl::Status dropped;
    while (auto m = hub_->Next(feed, absl::Milliseconds(50), &dropped)) {
      if (m->has_snapshot_end()) last = m->snapshot_end().ticket(), any = true;
      if (m->has_group()) last = m->group().ticket(), any = true;
    }
    if (any) EXPECT_TRUE(hub_->Ack(feed, last).ok());
  }

  static bool Has(const std::vector<std::string>& pools, const std::string& name) {
    return std::find(pools.begin(), pools.end(), name) != pools.end();
  }

  static std::vector<std::string> Pools(store::Store& s) {
    std::vector<std::string> names;
    auto c = s.LoadAll();
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) {
      for (const auto& p : c->pools) names.push_back(p.name);
    }
    return names;
  }

  grpc::Status FollowWith(const std::string& authorization, v1::LeaderMessage* first) {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Replication::NewStub(channel);
    grpc::ClientContext ctx;
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto stream = stub->Follow(&ctx);
    v1::FollowerMessage hello;
    hello.mutable_hello()->set_identity("mallory");
    stream->Write(hello);
    if (stream->Read(first)) {  // it was sent the leader's data
      ctx.TryCancel();
      stream->Finish();
      return grpc::Status::OK;
    }
    return stream->Finish();
  }

  std::string dir_;
  std::unique_ptr<store::Store> leader_store_;
  std::unique_ptr<store::Store> standby_store_;
  FakeLease lease_;
  std::shared_ptr<ReplicationHub> hub_;
  std::unique_ptr<ReplicationService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<Follower> follower_;
};

TEST_F(ReplicationTest, AStandbyGetsTheSnapshotAndEveryLaterGroupBeforeItIsAcknowledged) {
  StartLeader();
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(Commit(*leader_store_, "before-" + std::to_string(i)).ok());
  // The standby had a store of its own: the snapshot replaces it.
  ASSERT_TRUE(Commit(*standby_store_, "stale").ok());
  StartFollower();
  ASSERT_TRUE(lease_.WaitNamed("replica-b"));
  // Named: every commit from now on is on the standby when it is acknowledged.
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Commit(*leader_store_, "after-" + std::to_string(i)).ok());
    std::vector<std::string> pools = Pools(*standby_store_);
    EXPECT_NE(std::find(pools.begin(), pools.end(), "after-" + std::to_string(i)), pools.end())
        << "acknowledged before the standby had it";
  }
  EXPECT_EQ(Pools(*standby_store_), Pools(*leader_store_));
  auto marker = store::ReplicationOf(standby_store_.get())->ReadMarker();
  ASSERT_TRUE(marker.ok() && marker->has_value());
  EXPECT_EQ(**marker, (store::ReplicaMarker{"replica-a", 4, "replica-b", true}));
  EXPECT_TRUE(follower_->Stats().following);
}

TEST_F(ReplicationTest, CommitsDuringTheSnapshotAllReachTheStandby) {
  StartLeader();
  for (int i = 0; i < 2000; ++i) {
    store::WriteBatch b;
    store::SandboxRecord s;
    s.id = "sb-" + std::to_string(i);
    s.pool = "py";
    s.endpoint = std::string(200, 'x');
    b.Put(s);
    leader_store_->Commit(std::move(b), [](absl::Status st) { ASSERT_TRUE(st.ok()) << st; });
  }
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop.load() && i < 5000; ++i) {
      ASSERT_TRUE(Commit(*leader_store_, "during-" + std::to_string(i)).ok());
    }
  });
  StartFollower();
  ASSERT_TRUE(lease_.WaitNamed("replica-b"));
  stop = true;
  writer.join();
  ASSERT_TRUE(Commit(*leader_store_, "last").ok());
  auto a = leader_store_->LoadAll();
  auto b = standby_store_->LoadAll();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Pools(*standby_store_), Pools(*leader_store_));
  EXPECT_EQ(b->sandboxes.size(), a->sandboxes.size());
}

TEST_F(ReplicationTest, AStandbyThatStopsAnsweringIsDroppedAndTheLeaseNamesNoOne) {
  StartLeader(/*ack_timeout=*/absl::Milliseconds(300));
  StartFollower();
  ASSERT_TRUE(lease_.WaitNamed("replica-b"));
  ASSERT_TRUE(Commit(*leader_store_, "one").ok());
  // The standby goes away: the next commit waits for the Lease to name no one, then is
  // acknowledged by the leader alone.
  follower_->Stop();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(Commit(*leader_store_, "two").ok());
  EXPECT_EQ(lease_.named(), "");
  EXPECT_THAT(lease_.history(), ::testing::ElementsAre("replica-b", ""));
  EXPECT_GE(hub_->Stats().drops, 1u);
  (void)start;
}

// A leader that lost the Lease (the update is refused) while its standby is named
// acknowledges nothing more: the standby may be leading already.
TEST_F(ReplicationTest, ADeposedLeaderAcknowledgesNothing) {
  StartLeader(/*ack_timeout=*/absl::Milliseconds(300));
  StartFollower();
  ASSERT_TRUE(lease_.WaitNamed("replica-b"));
  lease_.Refuse(absl::FailedPreconditionError("the Lease is held by replica-b"));
  follower_->Stop();  // the standby was promoted: it stopped following
  absl::Status s = Commit(*leader_store_, "lost");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no longer leads"));
  EXPECT_EQ(Commit(*leader_store_, "later").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lease_.named(), "replica-b");  // nothing un-named it
}

// A leader that stops (SIGTERM) fails what it has not acknowledged instead of un-naming
// its standby: the standby holds everything acknowledged and may take over at once.
TEST_F(ReplicationTest, AStoppingLeaderLeavesItsStandbyNamed) {
  StartLeader();
  StartFollower();
  ASSERT_TRUE(lease_.WaitNamed("replica-b"));
  ASSERT_TRUE(Commit(*leader_store_, "acknowledged").ok());
  hub_->Stop();
  EXPECT_EQ(Commit(*leader_store_, "after").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lease_.named(), "replica-b");
  EXPECT_THAT(lease_.history(), ::testing::ElementsAre("replica-b"));
  std::vector<std::string> pools = Pools(*standby_store_);
  EXPECT_NE(std::find(pools.begin(), pools.end(), "acknowledged"), pools.end());
}

// The stream carries every tenant's claims: nobody without the replicas' token follows it.
TEST_F(ReplicationTest, FollowingNeedsTheReplicationToken) {
  StartLeader();
  ASSERT_TRUE(Commit(*leader_store_, "secret-pool").ok());
  v1::LeaderMessage first;
  EXPECT_EQ(FollowWith("", &first).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(FollowWith("Bearer tok-alice", &first).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(FollowWith(std::string("Bearer ") + kToken + "x", &first).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(first.has_start());
  // The right token is followed (the harness works).
  EXPECT_TRUE(FollowWith(std::string("Bearer ") + kToken, &first).ok());
  EXPECT_TRUE(first.has_start());
}

TEST_F(ReplicationTest, AStandbyServesNoStream) {
  service_ = std::make_unique<ReplicationService>(kToken, [] { return nullptr; });
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
  v1::LeaderMessage first;
  EXPECT_EQ(FollowWith(std::string("Bearer ") + kToken, &first).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ReplicationTest, OneStandbyAtATime) {
  StartLeader();
  StartFollower();
  ASSERT_TRUE(lease_.WaitNamed("replica-b"));
  auto other = hub_->Attach("replica-c");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kResourceExhausted) << other.status();
  ASSERT_TRUE(Commit(*leader_store_, "still-fine").ok());
}

// Copies::kTwo with no standby: every commit fails at once, UNAVAILABLE, saying why, and
// nothing of it is written on the leader.
TEST_F(ReplicationTest, TwoCopiesWithNoStandbyRefuseEveryCommitAndWriteNothing) {
  StartLeader(absl::Seconds(2), Copies::kTwo);
  for (int i = 0; i < 3; ++i) {
    absl::Status s = Commit(*leader_store_, "refused-" + std::to_string(i));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("no standby is in sync"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("two copies"));
  }
  EXPECT_TRUE(Pools(*leader_store_).empty());
  EXPECT_EQ(hub_->Stats().refused, 3u);
  EXPECT_EQ(hub_->Stats().shipped, 0u);
  EXPECT_TRUE(lease_.history().empty());
}

// Copies::kTwo: once a standby has loaded the snapshot and the Lease names it, commits
// are acknowledged again, each one on the standby before its answer.
TEST_F(ReplicationTest, TwoCopiesAcknowledgeOnceAStandbyIsInSyncAndNamed) {
  StartLeader(absl::Seconds(2), Copies::kTwo);
  ASSERT_EQ(Commit(*leader_store_, "alone").code(), absl::StatusCode::kUnavailable);
  StartFollower();
  ASSERT_TRUE(WaitHubNamed("replica-b"));
  for (int i = 0; i < 10; ++i) {
    const std::string pool = "two-" + std::to_string(i);
    ASSERT_TRUE(Commit(*leader_store_, pool).ok());
    EXPECT_TRUE(Has(Pools(*standby_store_), pool)) << "acknowledged before the standby had it";
  }
  EXPECT_FALSE(Has(Pools(*leader_store_), "alone"));
  EXPECT_FALSE(Has(Pools(*standby_store_), "alone"));
}

// Copies::kTwo: a standby that goes away turns acknowledgements off again (the Lease
// keeps naming it: it holds everything acknowledged), and back on once it is in sync.
TEST_F(ReplicationTest, TwoCopiesStopAcknowledgingWhenTheStandbyGoesAndResumeWhenItIsBack) {
  StartLeader(absl::Milliseconds(300), Copies::kTwo);
  StartFollower();
  ASSERT_TRUE(WaitHubNamed("replica-b"));
  ASSERT_TRUE(Commit(*leader_store_, "acknowledged").ok());
  follower_->Stop();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (hub_->Stats().attached && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(hub_->Stats().attached);
  absl::Status s = Commit(*leader_store_, "while-gone");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("replica-b"));
  EXPECT_FALSE(Has(Pools(*leader_store_), "while-gone"));
  EXPECT_EQ(lease_.named(), "replica-b");
  EXPECT_THAT(lease_.history(), ::testing::ElementsAre("replica-b"));
  // The standby comes back: a new snapshot, in sync, and commits are acknowledged again.
  StartFollower();
  ASSERT_TRUE(WaitHubNamed("replica-b"));
  ASSERT_TRUE(Commit(*leader_store_, "back").ok());
  EXPECT_TRUE(Has(Pools(*standby_store_), "back"));
  EXPECT_TRUE(Has(Pools(*standby_store_), "acknowledged"));
  EXPECT_FALSE(Has(Pools(*standby_store_), "while-gone"));
}

// Copies::kTwo: a group shipped to the named standby, which is dropped before it
// acknowledges it (here: no acknowledgement within the ack timeout), fails UNAVAILABLE;
// it was written on the leader (the state the docs describe), and is not acknowledged.
TEST_F(ReplicationTest, TwoCopiesFailAGroupWhoseStandbyIsDroppedBeforeItsAcknowledgement) {
  StartLeader(absl::Milliseconds(300), Copies::kTwo);
  auto feed = AttachByHand("replica-x");
  ASSERT_NE(feed, nullptr);
  ASSERT_TRUE(WaitHubNamed("replica-x"));
  // Acknowledged: the hand-driven standby acknowledges it while the commit waits.
  absl::Status first = absl::UnknownError("not answered");
  absl::Notification first_done;
  leader_store_->Commit(PoolBatch("acked"), [&](absl::Status st) {
    first = st;
    first_done.Notify();
  });
  while (!first_done.HasBeenNotified()) AckAll(*feed);
  ASSERT_TRUE(first.ok()) << first;
  // Not acknowledged by the standby: dropped at the ack timeout, and the group fails.
  absl::Status s = Commit(*leader_store_, "unacknowledged");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("written on this leader but not acknowledged"));
  EXPECT_FALSE(hub_->Stats().attached);
  EXPECT_TRUE(Has(Pools(*leader_store_), "unacknowledged"));
  EXPECT_EQ(lease_.named(), "replica-x");
  // Still nothing is acknowledged with one copy.
  EXPECT_EQ(Commit(*leader_store_, "after").code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(Has(Pools(*leader_store_), "after"));
}

// Copies::kOne (the default) with no standby: the leader acknowledges alone.
TEST_F(ReplicationTest, OneCopyAcknowledgesAloneWithoutAStandby) {
  StartLeader();
  ASSERT_TRUE(Commit(*leader_store_, "alone").ok());
  EXPECT_TRUE(Has(Pools(*leader_store_), "alone"));
  EXPECT_EQ(hub_->Stats().refused, 0u);
}

TEST_F(ReplicationTest, AnAckOfAGroupNeverSentDropsTheStandby) {
  StartLeader();
  auto feed = hub_->Attach("replica-x");
  ASSERT_TRUE(feed.ok()) << feed.status();
  absl::Status bad = hub_->Ack(**feed, 1000);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_FALSE(hub_->Stats().attached);
  EXPECT_EQ(lease_.named(), "");
}

}  // namespace
}  // namespace sbx::replication
