// Store replication end to end in one process: a leader's RocksDbStore with its
// ReplicationHub behind a real gRPC server (ReplicationService), and a standby's
// RocksDbStore fed by a Follower over loopback. The Lease is a test double: `publish`
// records what the hub asks it to name, and can refuse as a Lease this replica no longer
// holds would.

#include <stdlib.h>

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
  void StartLeader(absl::Duration ack_timeout = absl::Seconds(2)) {
    HubOptions o;
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
    store::WriteBatch b;
    store::PoolRecord p;
    p.name = pool;
    p.template_name = "t";
    p.min_warm = 1;
    p.empty_pool_policy = store::EmptyPoolPolicy::kFail;
    p.selection_policy = "fifo";
    b.Put(p);
    return s.CommitAndWait(std::move(b));
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
