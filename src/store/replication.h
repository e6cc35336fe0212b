#pragma once
// The replication side of a store: what a leader's store hands to its standby, and what a
// standby's store takes from the leader (docs/architecture.md, "Replicas").
//
// Leader side: every group commit is shipped to a GroupShipper before its local write, and
// its commits are acknowledged only when the shipper says the group may be (the standby
// that could be promoted holds it). Snapshot() gives a consistent copy of the store at a
// point between two groups, so that a standby can start from it and follow the groups
// shipped after.
//
// Standby side: BeginLoad/LoadChunk/WriteMarker take a leader's snapshot, ApplyGroup its
// later groups; the ReplicaMarker says whose acknowledged commits the store holds, so that
// a replica knows whether it may lead.
//
// Thread-safety: as for Store, every method may be called from any thread.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/store/store.h"

namespace sbx::store {

// Whose acknowledged commits a store holds ("m/replica").
struct ReplicaMarker {
  // Identity of the leader (its Lease holder identity) whose acknowledged commits this
  // store holds, and that leader's Lease term (leaseTransitions when it took the Lease).
  std::string leader;
  int64_t term = 0;
  // Identity of the replica that wrote the marker: the leader itself, or its standby.
  std::string self;
  // False while a standby is loading a snapshot: the store then holds a part of one.
  bool complete = false;

  bool operator==(const ReplicaMarker& o) const {
    return leader == o.leader && term == o.term && self == o.self && complete == o.complete;
  }
};

// Receives a leader store's group commits (ReplicationHub in src/replication).
class GroupShipper {
 public:
  virtual ~GroupShipper() = default;
  // On the committer thread, before the group's local write, under the store's ship lock
  // (so a Snapshot is taken before a shipped group or after its write, never between).
  // `group` is the group's encoded write batch. Must not block. Returns the group's ticket
  // (1, 2, ... in shipping order), or the refusal (UNAVAILABLE: its commits may not be
  // acknowledged now) with which the store fails the group's commits without writing it.
  [[nodiscard]] virtual absl::StatusOr<uint64_t> Ship(std::string group) = 0;
  // After the group's local write succeeded; blocks until its commits may be acknowledged.
  // An error fails them (this replica no longer leads).
  [[nodiscard]] virtual absl::Status AwaitReplicated(uint64_t ticket) = 0;
  // The group's local write failed: a standby may hold what this store does not.
  virtual void LocalWriteFailed(uint64_t ticket) = 0;
};

class Replicable {
 public:
  virtual ~Replicable() = default;

  // --- Leader side ---
  // Ships every later group to `shipper` (null: stops shipping). `shipper` must outlive
  // the store or a later SetShipper(nullptr).
  virtual void SetShipper(GroupShipper* shipper) = 0;
  // A consistent copy of the store: takes a snapshot under the ship lock and calls `at`
  // there (so that what `at` registers sees exactly the groups shipped after the
  // snapshot), then calls `each` for every record and the revision mark (not the store's
  // own markers) in key order, on this thread. Errors: the read's.
  [[nodiscard]] virtual absl::Status Snapshot(
      absl::FunctionRef<void()> at,
      absl::FunctionRef<void(absl::string_view key, absl::string_view value)> each) = 0;

  // --- Both ---
  [[nodiscard]] virtual absl::StatusOr<std::optional<ReplicaMarker>> ReadMarker() = 0;
  // Writes the marker, synced.
  [[nodiscard]] virtual absl::Status WriteMarker(const ReplicaMarker& marker) = 0;

  // --- Standby side (never while the store has commits of its own in flight) ---
  // Deletes every record and the claim revision mark and writes `marker` (with complete
  // false), in one synced write.
  [[nodiscard]] virtual absl::Status BeginLoad(const ReplicaMarker& marker) = 0;
  // Writes entries of a snapshot (not synced: WriteMarker at the end syncs).
  // INVALID_ARGUMENT for a key outside the store's records (nothing is written then).
  [[nodiscard]] virtual absl::Status LoadEntries(
      const std::vector<std::pair<std::string, std::string>>& entries) = 0;
  // Applies one shipped group, synced. INVALID_ARGUMENT, with nothing applied, for bytes
  // that are not a write batch or that touch anything but records and the revision mark.
  [[nodiscard]] virtual absl::Status ApplyGroup(absl::string_view group) = 0;
};

// The replication side of `store`, or null when it has none (a MemoryStore).
inline Replicable* ReplicationOf(Store* store) { return dynamic_cast<Replicable*>(store); }

}  // namespace sbx::store
