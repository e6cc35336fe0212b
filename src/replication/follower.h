#pragma once
// Follower: a standby's side of store replication. While this replica is a standby it
// follows the leader (the address the Lease names): it loads the leader's snapshot into
// its own store (BeginLoad wipes it; the marker is complete once the snapshot is in) and
// applies every later group, acknowledging each once it is synced. On any error it
// reconnects and loads a new snapshot.
//
// Thread-safety: Start/Stop from one thread; Stats from any.
// Lifetime: Stop (or the destructor) cancels the stream and joins; after it returns the
// follower writes nothing more to the store.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "src/store/replication.h"

namespace sbx::replication {

struct FollowerOptions {
  std::string identity;  // this replica's (Hello, and the marker's `self`)
  // The leader's address ("host:port"), "" when unknown or when this replica leads.
  std::function<std::string()> leader_address;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // insecure when null
  std::string token;                                      // the replication token
  store::Replicable* store = nullptr;
  absl::Duration retry_period = absl::Milliseconds(500);
};

struct FollowerStats {
  bool following = false;  // the snapshot is loaded and groups are applied
  std::string leader;
  uint64_t acked = 0;  // last ticket acknowledged to the current leader
  uint64_t loads = 0;  // snapshots loaded
};

class Follower {
 public:
  explicit Follower(FollowerOptions options);
  ~Follower();
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  void Start();
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  FollowerStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  // One stream to `address`, until it ends; the reason.
  [[nodiscard]] absl::Status FollowOnce(const std::string& address);

  const FollowerOptions options_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open stream's
  FollowerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::replication
