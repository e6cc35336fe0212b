#pragma once
// Store replication between leader-elected replicas, wired (docs/architecture.md,
// "Replicas"): while a standby, this replica follows the leader into its own store; when
// it may lead (its store holds every commit the last leader acknowledged) it takes the
// Lease, stops following, marks its store as the term's truth and ships every group to
// its own standby through a ReplicationHub.
//
// Thread-safety: MayLead runs on the elector's thread, Lead on the promotion thread, the
// services on gRPC's; the rest from main's thread.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/collectable.h"
#include "src/k8s/leader_election.h"
#include "src/replication/follower.h"
#include "src/replication/hub.h"
#include "src/store/replication.h"

namespace sbx::cmd {

struct ReplicationOptions {
  std::string identity;                                   // this replica's Lease identity
  std::string token;                                      // the replicas' replication token
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // to the leader; insecure when null
  absl::Duration ack_timeout = absl::Seconds(2);
  // How many Sandboxes of the cluster sbx made or bound (pool members, claimed ones), for
  // a missing Lease: only a replica that finds none (a new cluster) makes the Lease
  // without an operator's word. Null: none are ever found.
  std::function<size_t()> cluster_sandboxes;
  // kOne: with no standby in sync the leader acknowledges alone (claims stay served);
  // kTwo: it refuses every commit then (HubOptions::copies).
  replication::Copies copies = replication::Copies::kOne;
};

class Replication {
 public:
  // FAILED_PRECONDITION when `store` cannot be replicated.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Replication>> Create(
      store::Store* store, ReplicationOptions options);
  ~Replication();

  // A Follow service for one gRPC server (each server needs its own).
  std::shared_ptr<grpc::Service> NewService();
  // LeaderElectionOptions::may_lead: whether this replica's store holds every commit the
  // Lease's leader acknowledged (logs why not, once per reason).
  bool MayLead(const k8s::LeaseTerm& lease) ABSL_LOCKS_EXCLUDED(mu_);
  // Follows the leader at leader_address() until Lead or Stop.
  void StartFollowing(std::function<std::string()> leader_address);
  // LeaderElectionOptions::leader_unreachable: true while following and the stream from
  // the leader is down (it broke, or cannot be opened).
  bool LeaderUnreachable() const;
  // This replica took the Lease in `term`: stops following, checks that the store is
  // still the one MayLead approved, marks it as this term's truth and starts shipping.
  // FAILED_PRECONDITION when the store changed since the approval (do not serve then).
  [[nodiscard]] absl::Status Lead(int64_t term,
                                  std::function<absl::Status(const std::string&)> publish)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops following and shipping; groups committed after it fail. Before the store closes.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // sbx_replication_* families (docs/metrics.md).
  std::shared_ptr<prometheus::Collectable> Collector();

 private:
  Replication(store::Replicable* store, ReplicationOptions options);
  std::shared_ptr<replication::ReplicationHub> hub() const ABSL_LOCKS_EXCLUDED(mu_);
  // Logs `message` unless the last refusal had the same `why`.
  void RefuseOnce(const std::string& why, const std::string& message) ABSL_LOCKS_EXCLUDED(mu_);

  store::Replicable* const store_;
  const ReplicationOptions options_;
  std::unique_ptr<replication::Follower> follower_;
  // follower_ for the elector's thread (LeaderUnreachable), which runs before
  // StartFollowing: set once, after the follower started.
  std::atomic<const replication::Follower*> following_{nullptr};
  absl::Mutex stop_mu_;  // held through Stop
  mutable absl::Mutex mu_;
  std::shared_ptr<replication::ReplicationHub> hub_ ABSL_GUARDED_BY(mu_);
  // What MayLead last approved (nullopt: nothing, or a Lease without replication).
  std::optional<store::ReplicaMarker> approved_ ABSL_GUARDED_BY(mu_);
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::cmd
