#pragma once
// sbx::store: durable state behind the allocator. `Store` is the interface the allocator
// and the Kubernetes controllers use; RocksDbStore (rocksdb_store.h) is the production
// implementation, MemoryStore (memory_store.h) the one for tests of other components.
//
// Thread-safety: every method of a Store may be called from any thread concurrently.
// Lifetime: Close() (or destruction) waits for commits already accepted; after it, Commit
// fails with FAILED_PRECONDITION.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/common/histogram.h"
#include "src/store/records.h"

namespace sbx::store {

// One durable change: a record to write, or a key to delete.
struct Mutation {
  enum class Kind : uint8_t { kTemplate, kPool, kSandbox, kClaim, kRevision, kSnapshot };
  Kind kind;
  // The record's name or id; for a claim, ClaimKey(owner, id); for the revision mark,
  // kRevisionRecordKey.
  std::string key;
  // The record to put; std::monostate deletes `key`.
  std::variant<std::monostate, TemplateRecord, PoolRecord, SandboxRecord, ClaimRecord,
               RevisionRecord, SnapshotRecord>
      record;
};

// Mutations applied atomically: all of them or none.
class WriteBatch {
 public:
  void Put(TemplateRecord r);
  void Put(PoolRecord r);
  void Put(SandboxRecord r);
  void Put(ClaimRecord r);
  // Sets the store's claim revision mark (replacing the stored one).
  void Put(RevisionRecord r);
  void Put(SnapshotRecord r);
  void DeleteTemplate(std::string name);
  void DeletePool(std::string name);
  void DeleteSandbox(std::string id);
  void DeleteClaim(absl::string_view owner, absl::string_view id);
  void DeleteSnapshot(std::string id);

  bool empty() const { return mutations_.empty(); }
  size_t size() const { return mutations_.size(); }
  const std::vector<Mutation>& mutations() const { return mutations_; }
  std::vector<Mutation>& mutations() { return mutations_; }

  // false: the commit may be answered once written, without waiting for a sync of its own
  // (it survives a crash of the process, not of the machine, until the next synced commit
  // covers it). For records whose loss something else repairs: a warm sandbox's record,
  // which the reconciliation with the runtime restores. Default true. A group with one
  // synced batch is synced whole.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

 private:
  std::vector<Mutation> mutations_;
  bool sync_ = true;
};

// Everything the store holds, as loaded at start-up.
struct Contents {
  std::vector<TemplateRecord> templates;
  std::vector<PoolRecord> pools;
  std::vector<SandboxRecord> sandboxes;
  std::vector<ClaimRecord> claims;
  // The stored RevisionRecord's revision; 0 when there is none.
  uint64_t revision = 0;
  std::vector<SnapshotRecord> snapshots;
};

// Called exactly once per Commit, with OK when the batch is durable (per the store's
// durability mode) or the error that kept it from being written.
using CommitCallback = absl::AnyInvocable<void(absl::Status) &&>;

struct StoreStats {
  uint64_t commits = 0;        // Commit() calls completed
  uint64_t write_batches = 0;  // physical writes (one per group commit)
  uint64_t syncs = 0;          // fsyncs issued
  // Time the store's committer spent on groups (from taking a group to the end of its
  // callbacks, replication included), in seconds; its rate is the committer's busy
  // fraction. 0 for stores without a committer.
  double committer_busy_seconds = 0;
  // The same for the pipelined commit's syncer thread (its fsyncs, the standby's
  // acknowledgements and the callbacks); 0 without one.
  double syncer_busy_seconds = 0;
  // Per physical write (group commit): how long the write and its fsync took (seconds),
  // and how many Commit() calls it carried. Empty (no bounds) for stores without groups.
  HistogramSnapshot write_seconds;
  HistogramSnapshot group_commits;
  // Whether the store accepts writes now. A RocksDbStore refuses them while its file
  // system is below its reserve of free space, after a write error until it has recovered,
  // and while it is open read-only (it was opened on a full disk).
  bool writable = true;
  // Free bytes of the store's file system at its last check; nullopt for stores without a
  // file system, or when the check failed.
  std::optional<uint64_t> free_bytes;
  // The reserve below which writes are refused (RocksDbStoreOptions::min_free_bytes).
  uint64_t min_free_bytes = 0;
};

class Store {
 public:
  virtual ~Store() = default;

  // Queues `batch` for the next group commit and returns at once. `done` runs when the
  // batch is durable, on the store's committer thread (it must not block: hand long work
  // elsewhere). Errors: FAILED_PRECONDITION after Close(), INTERNAL/UNAVAILABLE when the
  // write fails (the batch is then not applied), UNAVAILABLE when the store refuses writes
  // (its disk is full or below its reserve; the message names the path and the free bytes).
  virtual void Commit(WriteBatch batch, CommitCallback done) = 0;

  // Reads every record. Used once at start-up for recovery. Errors: DATA_LOSS for a record
  // that cannot be decoded (naming its key), or the I/O error.
  [[nodiscard]] virtual absl::StatusOr<Contents> LoadAll() = 0;

  // Waits for accepted commits, then stops accepting new ones. Idempotent.
  [[nodiscard]] virtual absl::Status Close() = 0;

  virtual StoreStats Stats() const = 0;

  // Blocking convenience around Commit for start-up and admin paths (never on a claim path).
  [[nodiscard]] absl::Status CommitAndWait(WriteBatch batch);
};

}  // namespace sbx::store
