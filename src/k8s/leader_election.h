#pragma once
// LeaderElector: at most one of several replicas acts, decided through a
// coordination.k8s.io/v1 Lease (holderIdentity, leaseDurationSeconds, acquireTime,
// renewTime, leaseTransitions), written with optimistic concurrency. A replica takes the
// lease when it is free or its holder has not renewed it for leaseDurationSeconds; the
// leader renews it every retry_period and gives up leadership (before the lease could
// expire for the others) when it cannot renew for renew_deadline.
//
// Fencing (docs/architecture.md, "Fencing"): leadership is a window on the monotonic
// clock, not a flag. Each successful renewal opens it until renew_deadline after the
// attempt began (before its Lease write was sent); IsLeader and WriteWindow say false once
// it has passed, whatever the elector thread is doing (a process paused past its Lease
// resumes fenced). A standby whose link to the leader broke (leader_unreachable) takes the
// Lease once it has seen the same renewal for renew_deadline + takeover_margin on its own
// monotonic clock: by then the leader's window has closed, with no trust in either wall
// clock. Otherwise a Lease is taken when its renewTime is leaseDurationSeconds old.
// The elector's client should bound each request by retry_period and not retry it (the
// wiring gives it a client of its own), so that an attempt cannot hang.
//
// Thread-safety: IsLeader and WriteWindow may be called from any thread. Callbacks run on
// the elector's thread.
// Lifetime: Stop (or the destructor) joins the thread, releasing the lease if held.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/k8s/client.h"
#include "src/k8s/objects_types.h"

namespace sbx::k8s {

// What a Lease says of the store that must survive its holder (docs/architecture.md,
// "Replicas"): the leader whose store is the truth, its term, and the standby that holds
// every commit it acknowledged.
struct LeaseTerm {
  // False when there is no Lease: nothing says which store is the truth then.
  bool exists = true;
  // False for a Lease written by a version of sbx without store replication (or by
  // something else): nothing is known of the stores then.
  bool replicated = false;
  std::string leader;        // annotation kTermLeaderAnnotation
  int64_t term = 0;          // spec.leaseTransitions
  std::string sync_replica;  // annotation kSyncReplicaAnnotation; "" for none
  // Annotation kPromoteAnnotation: the replica an operator named to lead next whatever its
  // store holds (docs/operations.md, "Losing the only complete copy"); "" for none.
  std::string promote;
};

struct LeaderElectionOptions {
  std::string lease_namespace = "default";
  std::string lease_name = "sbx-controller";
  // Unique per replica (pod name + a random suffix, say).
  std::string identity;
  // This replica's gRPC address to begin with (SetAddress changes it).
  std::string address;
  absl::Duration lease_duration = absl::Seconds(15);
  absl::Duration renew_deadline = absl::Seconds(10);
  absl::Duration retry_period = absl::Seconds(2);
  // Time of renewals, expiry and waits; the real clock when null. Must outlive the elector.
  // The write window is measured on CLOCK_MONOTONIC with the real clock, on this clock's
  // Now() with another (tests move it).
  const Clock* clock = nullptr;
  // Asked before each attempt to take the Lease (free, expired, still naming this identity
  // after a restart, or missing: LeaseTerm::exists false) with what the Lease says; false:
  // do not take it, look again after retry_period. Null: always take it. Not asked while
  // this replica leads.
  std::function<bool(const LeaseTerm&)> may_lead;
  // True while this replica has lost its link to the leader (its replication stream
  // broke). Then the Lease is looked at every fast_poll and taken once its holder's last
  // renewal has been seen unchanged for renew_deadline + takeover_margin (see above).
  // Null: never.
  std::function<bool()> leader_unreachable;
  absl::Duration takeover_margin = absl::Milliseconds(500);
  absl::Duration fast_poll = absl::Milliseconds(200);

  [[nodiscard]] absl::Status Validate() const;
};

class LeaderElector final : public WriteFence {
 public:
  LeaderElector(Client* client, LeaderElectionOptions options, std::function<void()> on_started,
                std::function<void()> on_stopped);
  ~LeaderElector() override;

  void Start();
  // Stops campaigning; a leader releases the lease (so another replica takes over at once)
  // and hears on_stopped.
  void Stop();
  // True while this replica leads and its write window is open (see above).
  bool IsLeader() const;
  // WriteFence: the time left in this replica's write window; FAILED_PRECONDITION naming
  // the Lease when it does not lead or the window has closed.
  [[nodiscard]] absl::StatusOr<absl::Duration> WriteWindow() const override;
  // When the current write window closes, on Monotonic() (InfinitePast: none).
  absl::Time WindowEnd() const;
  // The clock of the write window: CLOCK_MONOTONIC, or a test clock's Now().
  absl::Time Monotonic() const;
  // Where this replica serves (its gRPC "host:port"), written into the Lease's annotation
  // kLeaderAddressAnnotation whenever it takes or renews it, so that standbys can relay
  // calls to the leader. May be set at any time (the next renewal writes it).
  void SetAddress(std::string address) ABSL_LOCKS_EXCLUDED(mu_);
  // The current leader's address: this replica's own while it leads, else the one the
  // Lease named when last read (every retry_period) if its holder's term had not expired
  // then; "" when unknown.
  std::string LeaderAddress() const ABSL_LOCKS_EXCLUDED(mu_);
  // This leader's term: spec.leaseTransitions when it took the Lease (0 before).
  int64_t Term() const { return term_.load(std::memory_order_acquire); }
  // Writes kSyncReplicaAnnotation = `identity` ("" for none) into the Lease, as long as
  // this replica holds it in its term (a compare-and-swap on the Lease). OK once written;
  // FAILED_PRECONDITION when this replica does not lead or the Lease is another's (or of
  // another term); UNAVAILABLE for errors of the API, which may be retried.
  [[nodiscard]] absl::Status PublishSyncReplica(const std::string& identity)
      ABSL_LOCKS_EXCLUDED(mu_);
  // When the elector thread, now waiting between two attempts, looks again;
  // InfinitePast while it is not waiting (for tests that move a FakeClock).
  absl::Time SleepingUntil() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  // One attempt to take or renew the lease; true when this replica holds it afterwards.
  // `attempt_start` is the monotonic time the attempt began.
  bool TryAcquireOrRenew(absl::Time attempt_start);
  void Release();
  bool Sleep(absl::Duration d);

  Client* const client_;
  const LeaderElectionOptions options_;
  const Clock* const clock_;
  std::function<void()> on_started_;
  std::function<void()> on_stopped_;
  std::thread thread_;
  // Written by the elector thread, read by workers to decide whether to act; acquire/
  // release pairs it with the lease state the elector saw.
  std::atomic<bool> leader_{false};
  std::atomic<int64_t> term_{0};
  // End of the write window in nanoseconds of Monotonic() since the Unix epoch:
  // written by the elector thread after each successful renewal, read by every writer
  // (relaxed would do for the value itself; acquire/release orders it with leader_).
  std::atomic<int64_t> window_end_ns_{0};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::string observed_address_ ABSL_GUARDED_BY(mu_);
  // When the other holder's term, as last read, runs out (InfiniteFuture: not known).
  absl::Time observed_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time sleeping_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The other holder's last renewal as seen ("holder|renewTime") and when it was first
  // seen (monotonic), for the takeover of a leader this replica cannot reach.
  std::string observed_renewal_ ABSL_GUARDED_BY(mu_);
  absl::Time observed_renewal_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The Lease annotation with the leader's gRPC address.
inline constexpr char kLeaderAddressAnnotation[] = "sbx.dev/leader-address";
// The leader whose store is the truth (written when a replica takes the Lease, kept after
// it releases it), and the standby that holds every commit that leader acknowledged.
inline constexpr char kTermLeaderAnnotation[] = "sbx.dev/term-leader";
inline constexpr char kSyncReplicaAnnotation[] = "sbx.dev/sync-replica";
// Written by an operator: the identity of the replica that may take the Lease next whatever
// its store holds (accepting the loss of what only the lost stores had). Removed by that
// replica when it takes the Lease.
inline constexpr char kPromoteAnnotation[] = "sbx.dev/promote";
// What `lease` (a coordination.k8s.io/v1 Lease) says of the stores.
LeaseTerm LeaseTermOf(const types::Lease& lease);
// The same of a Lease as JSON (decoded first); one that does not decode says nothing of
// the stores (`replicated` false). The elector itself never acts on such a Lease.
LeaseTerm LeaseTermOf(const Json& lease);

// RFC 3339 with microseconds, as Kubernetes writes MicroTime.
std::string FormatMicroTime(absl::Time t);
// Parses RFC 3339 (with or without fractional seconds); InfinitePast when malformed.
absl::Time ParseTime(const std::string& text);

}  // namespace sbx::k8s
