#pragma once
// ReplicationHub: the leader's side of store replication (docs/architecture.md,
// "Replicas"). The leader's store ships every group commit here before writing it; the
// hub queues it for the attached standby and decides when the group's commits may be
// acknowledged.
//
// The rule: a group is acknowledged when every replica the Lease may name as in-sync
// (annotation sbx.dev/sync-replica; the confirmed value and any value being written) has
// acknowledged it (written and synced). A standby that attaches gets a snapshot and every
// group after it; once it has acknowledged everything shipped, it is in sync and the hub
// asks for the Lease to name it (publish). From then on every group waits for its
// acknowledgement. When it goes away or does not acknowledge within ack_timeout, the hub
// drops it and groups wait until the Lease names no one (publish("")); a replica the
// Lease does not name can never take the lead (LeaderElectionOptions::may_lead), so the
// leader may then acknowledge alone (HubOptions::copies kOne, the default). With kTwo the
// leader never acknowledges alone: while the Lease names no standby that is attached and
// in sync, Ship refuses every group (UNAVAILABLE; the store then writes nothing), a group
// already shipped fails once its standby is dropped (UNAVAILABLE; it is written on this
// replica, not acknowledged), and a dropped standby stays named (it holds everything
// acknowledged) until another one is in sync. A publish refused because this replica no longer
// holds the Lease fails every waiting and later group (UNAVAILABLE: clients retry on the
// new leader): a deposed leader acknowledges nothing.
//
// One standby at a time: with two replicas that is the other one; a third replica that
// tries to attach while one is attached is refused (it relays calls but cannot lead).
//
// Thread-safety: every method may be called from any thread.
// Lifetime: Stop drops the standby without un-naming it (it holds everything
// acknowledged, so it may take over), fails waiting and later groups with UNAVAILABLE
// (the hub stays the store's shipper, so the store acknowledges nothing more) and joins
// the publisher thread. The destructor stops and detaches from the store, which must
// still exist then.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sbx/replication/v1/replication.pb.h"
#include "src/store/replication.h"

namespace sbx::replication {

// How many copies a group needs before its commits are acknowledged.
enum class Copies {
  // Two while a standby is in sync; once it is dropped and the Lease names no one, the
  // leader's copy alone. Claims are served through a standby's restart, at the price of
  // losing what was acknowledged meanwhile if the leader's volume is lost before a
  // standby is in sync again.
  kOne,
  // Always the leader's and the named in-sync standby's: without one, nothing is
  // acknowledged (UNAVAILABLE) until a standby has loaded a snapshot and is named.
  kTwo,
};

struct HubOptions {
  // This leader's identity and Lease term, sent to the standby (its marker records them).
  std::string identity;
  int64_t term = 0;
  // How long a group waits for the in-sync standby's acknowledgement before the standby
  // is dropped.
  absl::Duration ack_timeout = absl::Seconds(2);
  // A standby whose unsent messages exceed this is dropped (it resyncs from a snapshot).
  size_t max_queued_bytes = size_t{256} << 20;
  // Snapshot entries per Chunk message, at most (bytes of keys and values).
  size_t chunk_bytes = size_t{1} << 20;
  // Makes the Lease name `sync_replica` ("" for none); blocking. OK once the Lease says
  // it; FAILED_PRECONDITION when this replica no longer holds the Lease (then the hub
  // acknowledges nothing more); any other error is retried every retry_period.
  std::function<absl::Status(const std::string& sync_replica)> publish;
  absl::Duration retry_period = absl::Milliseconds(200);
  Copies copies = Copies::kOne;
};

struct HubStats {
  bool attached = false;   // a standby is attached (loading or following)
  bool in_sync = false;    // it has acknowledged everything shipped since it attached
  std::string named;       // what the Lease names as in-sync, as last confirmed
  uint64_t shipped = 0;    // groups shipped (the last ticket)
  uint64_t acked = 0;      // the attached standby's last acknowledged ticket
  uint64_t drops = 0;      // standbys dropped (timeouts, errors, replaced)
  uint64_t publishes = 0;  // Lease updates made
  uint64_t refused = 0;    // groups refused for want of a second copy (Copies::kTwo)
};

class ReplicationHub final : public store::GroupShipper {
 public:
  // One attached standby's stream, as the service sees it.
  class Feed;

  // Ships the groups of `store` from now on. The hub is destroyed before the store.
  ReplicationHub(store::Replicable* store, HubOptions options);
  ~ReplicationHub() override;
  ReplicationHub(const ReplicationHub&) = delete;
  ReplicationHub& operator=(const ReplicationHub&) = delete;

  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // A standby named `identity` attaches: queues Start, the store's snapshot and, after
  // it, every group shipped since the snapshot. Drops a previous stream of the same
  // standby. FAILED_PRECONDITION after Stop or once this replica no longer leads;
  // RESOURCE_EXHAUSTED while another standby is attached; the snapshot's read error.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Feed>> Attach(const std::string& identity)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The next message for the standby, waiting up to `timeout`: nullopt on timeout, or
  // (with *dropped set to why) when the standby was dropped.
  std::optional<v1::LeaderMessage> Next(Feed& feed, absl::Duration timeout, absl::Status* dropped)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The standby has everything up to `ticket` on disk. INVALID_ARGUMENT (and the standby
  // is dropped) for a ticket never shipped to it or lower than one it acknowledged.
  [[nodiscard]] absl::Status Ack(Feed& feed, uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream ended.
  void Detach(Feed& feed, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  HubStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // store::GroupShipper. With Copies::kTwo, Ship is UNAVAILABLE (nothing shipped) while
  // the Lease names no attached, in-sync standby, and AwaitReplicated is UNAVAILABLE once
  // the group's standby is dropped before it acknowledged the group.
  [[nodiscard]] absl::StatusOr<uint64_t> Ship(std::string group) override ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status AwaitReplicated(uint64_t ticket) override ABSL_LOCKS_EXCLUDED(mu_);
  void LocalWriteFailed(uint64_t ticket) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DropLocked(Feed& feed, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushLocked(Feed& feed, v1::LeaderMessage message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReplicatedLocked(uint64_t ticket) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies::kTwo: whether the Lease names the attached standby and it is in sync; if not,
  // says why in *why (when not null).
  bool SecondCopyLocked(std::string* why) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status NoSecondCopyLocked(absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLoop() ABSL_LOCKS_EXCLUDED(mu_);

  store::Replicable* const store_;
  const HubOptions options_;

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Set when this replica can acknowledge nothing more (it no longer leads, or Stop).
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  uint64_t shipped_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<Feed> feed_ ABSL_GUARDED_BY(mu_);
  // The replica the Lease should name ("" none), and every value it may name now: the
  // last confirmed one plus those written since without a confirmation.
  std::string desired_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> maybe_named_ ABSL_GUARDED_BY(mu_) = {""};
  std::string named_ ABSL_GUARDED_BY(mu_);  // last confirmed
  uint64_t drops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t publishes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread publisher_;
};

}  // namespace sbx::replication
