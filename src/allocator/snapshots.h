#pragma once
// sbx::allocator::Snapshots: snapshots of claimed sandboxes (issue 37). The runtime owns
// a snapshot's files (Runtime::Snapshot, DeleteSnapshot, ListSnapshots); this keeps their
// records durable in the store, owned by the tenant that made them, counted against a
// per-tenant byte quota, and kept alive while something uses them.
//
// Durability: Create answers once the files are whole and synced (the runtime's rename of
// <id>.partial) and the record is committed; Delete commits the record's deletion before
// removing the files. A crash in between leaves files without a record (removed by
// Make at the next start) or, for a record whose files a runtime lost, a record without
// files (dropped by Make, logged). Nothing is ever half there.
//
// Tenancy: every call names the owner; another owner's snapshot is NOT_FOUND.
//
// Quota: a tenant's snapshots may hold at most quota_bytes (sizes as recorded); a capture
// in flight reserves its bytes as it copies them (Runtime::Snapshot's charge), so two
// concurrent snapshots cannot together pass the quota, and a capture is stopped with
// RESOURCE_EXHAUSTED the moment it would.
//
// Users: Hold/Unhold count what uses a snapshot (a template naming it, a sandbox started
// from it); Delete refuses a held snapshot with FAILED_PRECONDITION naming a user.
//
// Thread-safety: every method may be called from any thread; callbacks run on the
// runtime's or the store's threads and must not block.
// Lifetime: the Allocator, Store, Runtime and Clock must outlive it; destroy it after the
// gRPC server (no call in flight).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/allocator.h"
#include "src/common/clock.h"
#include "src/common/histogram.h"
#include "src/common/ids.h"
#include "src/runtime/runtime.h"
#include "src/store/records.h"
#include "src/store/store.h"

namespace sbx::allocator {

// The longest snapshot name, the most labels.
inline constexpr size_t kMaxSnapshotName = 128;
inline constexpr size_t kMaxSnapshotLabels = 64;

struct SnapshotsOptions {
  // Bytes of snapshots one tenant may hold (sbx-server --snapshot_quota_bytes). 0: no
  // quota. Default 10 GiB.
  int64_t quota_bytes = int64_t{10} << 30;
  // Whether the runtime keeps snapshot files (the local runtime): then Make reconciles the
  // records with them. False (Kubernetes, no runtime): records are kept as they are.
  bool reconcile = true;

  [[nodiscard]] absl::Status Validate() const;
};

struct SnapshotCreateRequest {
  std::string owner;
  std::string claim_id;
  std::string name;
  std::map<std::string, std::string> labels;
  // The snapshot the claim's sandbox started from (its template's, which only the server
  // reads), recorded as the new snapshot's parent. Empty: none.
  std::string parent_snapshot;
};

struct SnapshotCreated {
  store::SnapshotRecord snapshot;
  int64_t dropped_entries = 0;
};

// What Snapshots has done since Make, for metrics.
struct SnapshotStats {
  int64_t snapshots = 0;  // held now
  int64_t bytes = 0;      // their sizes
  uint64_t created = 0;
  uint64_t failed = 0;
  uint64_t deleted = 0;
  uint64_t quota_refusals = 0;
  uint64_t resets = 0;          // sandboxes reset to a snapshot
  uint64_t reset_failures = 0;  // resets that failed
  uint64_t forks = 0;           // Fork calls answered with their claims (RecordFork)
  uint64_t fork_failures = 0;   // Fork calls that failed
  uint64_t forked = 0;          // claims those Forks answered
  // How long successful snapshots took, from the request to the durable record (seconds).
  HistogramSnapshot seconds;
  // How long successful resets took, from the request to the new sandbox serving.
  HistogramSnapshot reset_seconds;
  // How long successful Fork calls took, until every fork was up (RecordFork).
  HistogramSnapshot fork_seconds;
};

class Snapshots {
 public:
  // Takes over the records the allocator recovered (Allocator::recovery().snapshots) and,
  // with options.reconcile, removes files without a record and drops records without
  // files. Errors: INVALID_ARGUMENT for bad options, the runtime's ListSnapshots error.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Snapshots>> Make(
      SnapshotsOptions options, Allocator* allocator, store::Store* store,
      runtime::Runtime* runtime, Clock* clock, IdGenerator* ids);

  // Captures the sandbox of the owner's claim. Errors: INVALID_ARGUMENT (name, labels),
  // NOT_FOUND (claim), FAILED_PRECONDITION (claim ended), RESOURCE_EXHAUSTED (quota,
  // naming it), the runtime's and the store's errors (the files are then removed).
  void Create(SnapshotCreateRequest request,
              absl::AnyInvocable<void(absl::StatusOr<SnapshotCreated>) &&> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND for an unknown id or another owner's.
  [[nodiscard]] absl::StatusOr<store::SnapshotRecord> Get(const std::string& owner,
                                                          const std::string& id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Snapshot `id` whoever owns it: for what the server itself checks (a template naming
  // it), never to answer a tenant. NOT_FOUND for an unknown id.
  [[nodiscard]] absl::StatusOr<store::SnapshotRecord> Find(const std::string& id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The owner's snapshots carrying all of `labels`, oldest first.
  std::vector<store::SnapshotRecord> List(const std::string& owner,
                                          const std::map<std::string, std::string>& labels) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes the owner's snapshot. NOT_FOUND; FAILED_PRECONDITION naming a user while held;
  // the store's error (nothing deleted).
  void Delete(const std::string& owner, const std::string& id,
              absl::AnyInvocable<void(absl::Status) &&> done) ABSL_LOCKS_EXCLUDED(mu_);

  // Rewinds the sandbox of the owner's claim to the owner's snapshot (Runtime::Reset),
  // holding the snapshot while it runs (its deletion is refused meanwhile). Errors:
  // NOT_FOUND (the claim or the snapshot is not the owner's), FAILED_PRECONDITION (claim
  // ended; the snapshot is of another image, naming both), the runtime's errors.
  // `starting` runs once both are found to be the owner's, just before the sandbox's
  // processes are killed (the server notes the reset there, so that the calls the kill
  // ends say why); `done` gets the claim on success.
  void Reset(const std::string& owner, const std::string& claim_id, const std::string& snapshot_id,
             absl::AnyInvocable<void(const store::ClaimRecord&) &&> starting,
             absl::AnyInvocable<void(absl::StatusOr<store::ClaimRecord>) &&> done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // `user` (e.g. `template "py"`, `sandbox lb-...`) uses snapshot `id` from now on, until
  // Unhold. NOT_FOUND for an unknown id.
  [[nodiscard]] absl::Status Hold(const std::string& id, const std::string& user)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unhold(const std::string& id, const std::string& user) ABSL_LOCKS_EXCLUDED(mu_);

  // A Fork call (served by the server, which runs it as a batch of claims) ended: `claims`
  // forks answered after `took`, or `ok` false.
  void RecordFork(bool ok, int claims, absl::Duration took) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for the captures and commits in flight (their callbacks use this object).
  ~Snapshots() ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes of the owner's snapshots, and the quota (0: none).
  int64_t used_bytes(const std::string& owner) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t quota_bytes() const { return options_.quota_bytes; }
  SnapshotStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Snapshots(SnapshotsOptions options, Allocator* allocator, store::Store* store,
            runtime::Runtime* runtime, Clock* clock, IdGenerator* ids);

  struct Tenant {
    int64_t used = 0;      // recorded snapshots
    int64_t reserved = 0;  // captures in flight, as far as they have copied
  };
  // A capture's reservation: what it charged so far.
  struct Capture {
    std::string owner;
    int64_t charged = 0;
  };

  [[nodiscard]] absl::Status ChargeLocked(Capture& c, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `done`, counted in in_flight_ until it has run.
  template <typename T>
  absl::AnyInvocable<void(T) &&> Tracked(absl::AnyInvocable<void(T) &&> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void EndCapture(const std::shared_ptr<Capture>& c) ABSL_LOCKS_EXCLUDED(mu_);

  const SnapshotsOptions options_;
  Allocator* const allocator_;
  store::Store* const store_;
  runtime::Runtime* const runtime_;
  Clock* const clock_;
  IdGenerator* const ids_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, store::SnapshotRecord> records_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  // Users of each held snapshot.
  absl::flat_hash_map<std::string, std::vector<std::string>> users_ ABSL_GUARDED_BY(mu_);
  // Snapshots whose deletion is being committed: not usable, not deletable twice.
  absl::flat_hash_map<std::string, bool> deleting_ ABSL_GUARDED_BY(mu_);
  SnapshotStats stats_ ABSL_GUARDED_BY(mu_);
  // Creates and deletes whose callbacks have not run yet.
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  AtomicHistogram seconds_{{0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60}};
  AtomicHistogram reset_seconds_{{0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30}};
  AtomicHistogram fork_seconds_{{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300}};
};

}  // namespace sbx::allocator
