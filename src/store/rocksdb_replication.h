#pragma once
// Private to sbx::store_rocksdb: the store's replication hooks (replication.h), on the
// leader's side the shipping of every group commit before its write and the snapshots a
// standby starts from, on a standby's side the writes of what the leader sends.
//
// Thread-safety: every method may be called from any thread. The ship lock is held by the
// committer from shipping a group to its write, and by Snapshot() while it takes its
// snapshot, so that a snapshot sees a shipped group written (never shipped and not yet
// written). Lock order: the ship lock before the Database's. Lifetime: owned by the store;
// the Database outlives it, and a shipper outlives the hooks or a later SetShipper(null).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/write_batch.h"
#include "src/store/replication.h"
#include "src/store/rocksdb_store_open.h"

namespace sbx::store::internal {

class ReplicationHooks final : public Replicable {
 public:
  explicit ReplicationHooks(Database* database) : database_(database) {}
  ReplicationHooks(const ReplicationHooks&) = delete;
  ReplicationHooks& operator=(const ReplicationHooks&) = delete;

  // The committer's side. Under the ship lock: ships `group` to the shipper, if one is
  // set, and unless it refuses calls `write` (which writes the group). Sets *shipper (null
  // when none, or when it refused) and *ticket. Returns the shipper's refusal (nothing was
  // written then), else OK whatever `write` did.
  [[nodiscard]] absl::Status ShipThenWrite(const rocksdb::WriteBatch& group,
                                           absl::FunctionRef<void()> write, GroupShipper** shipper,
                                           uint64_t* ticket) ABSL_LOCKS_EXCLUDED(ship_mu_);

  // --- Replicable ---
  void SetShipper(GroupShipper* shipper) override ABSL_LOCKS_EXCLUDED(ship_mu_);
  [[nodiscard]] absl::Status Snapshot(
      absl::FunctionRef<void()> at,
      absl::FunctionRef<void(absl::string_view, absl::string_view)> each) override
      ABSL_LOCKS_EXCLUDED(ship_mu_);
  [[nodiscard]] absl::StatusOr<std::optional<ReplicaMarker>> ReadMarker() override;
  [[nodiscard]] absl::Status WriteMarker(const ReplicaMarker& marker) override;
  [[nodiscard]] absl::Status BeginLoad(const ReplicaMarker& marker) override;
  [[nodiscard]] absl::Status LoadEntries(
      const std::vector<std::pair<std::string, std::string>>& entries) override;
  [[nodiscard]] absl::Status ApplyGroup(absl::string_view group) override;

 private:
  // Writes `batch` synced; errors say `what` and name the path.
  [[nodiscard]] absl::Status WriteSynced(rocksdb::WriteBatch& batch, absl::string_view what);

  Database* const database_;
  absl::Mutex ship_mu_;
  GroupShipper* shipper_ ABSL_GUARDED_BY(ship_mu_) = nullptr;
};

}  // namespace sbx::store::internal
