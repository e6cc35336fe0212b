#pragma once
// Private to sbx::store_rocksdb: the store's group commit.
//
// Submit() checks and encodes a batch on the caller's thread (so encoding runs in parallel
// across callers) and queues it. The committer thread takes everything queued, up to
// max_group_bytes / max_group_mutations, copies it into one rocksdb::WriteBatch and writes
// it with one DB::Write: while it writes, new commits queue up and form the next group, so
// the group size adapts to load without any timer. RocksDB applies a WriteBatch
// atomically, also across a crash, so a failed or torn group applies none of its batches.
// Callbacks run in submission order: pipelined (kSync with options.pipeline), on the
// syncer thread after one fdatasync of the log for every group written meanwhile (and the
// standby's acknowledgement); otherwise on the committer, after a write with sync=true,
// before its next group.
//
// Thread-safety: Submit may be called from any thread. Start once, Stop from any thread
// but the committer's and the syncer's (a commit callback): OnCommitThread() says so.
// Lifetime: owned by the store; options, database, space and hooks outlive it. Stop (also
// run by the destructor) answers every accepted commit before it returns.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "src/common/histogram.h"
#include "src/store/replication.h"
#include "src/store/rocksdb_replication.h"
#include "src/store/rocksdb_space.h"
#include "src/store/rocksdb_store.h"
#include "src/store/rocksdb_store_open.h"
#include "src/store/store.h"

namespace sbx::store::internal {

// fdatasyncs the write-ahead log files in `dir` directly, for Close() after a write error,
// when DB::SyncWAL would abort (docs/architecture.md, "A full disk"). UNAVAILABLE naming
// the first file that cannot be synced.
[[nodiscard]] absl::Status SyncLogFiles(const std::string& dir);

class GroupCommitter {
 public:
  GroupCommitter(const RocksDbStoreOptions& options, Database* database, SpaceKeeper* space,
                 ReplicationHooks* hooks);
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Starts the committer (and, pipelined, the syncer) thread.
  void Start();

  // Queues `batch`; `done` runs once with its result (see rocksdb_store.h). After Stop,
  // runs `done` at once on this thread with FAILED_PRECONDITION.
  void Submit(WriteBatch batch, CommitCallback done) ABSL_LOCKS_EXCLUDED(mu_);

  // Refuses further commits, answers every accepted one and joins the threads.
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, sync_mu_);

  // Whether this thread is this committer's or its syncer's (commit callbacks run there).
  bool OnCommitThread() const;

  // Fills the commit counters and histograms of `stats`.
  void FillStats(StoreStats* stats) const;

 private:
  // One accepted Submit(): its batch encoded into `buf` (keys and values back to back).
  struct Request {
    struct Op {
      size_t key_begin;
      size_t key_size;
      size_t value_size;  // kDelete for a delete; the value follows the key in buf
    };
    static constexpr size_t kDelete = ~size_t{0};

    std::string buf;
    std::vector<Op> ops;
    absl::Status status;  // not OK: the batch was refused before the write
    bool sync = true;     // WriteBatch::sync
    CommitCallback done;
  };

  // A group the pipelined committer has written (or refused), waiting for the syncer.
  struct WrittenGroup {
    std::vector<Request> requests;
    absl::Status result;      // the write's, or the refusal
    bool written = false;     // a successful write
    bool needs_sync = false;  // written, with a batch that must be synced before its answer
    GroupShipper* shipper = nullptr;
    uint64_t ticket = 0;
    uint64_t generation = 0;  // the database's, at the write (reopens count up)
    std::chrono::steady_clock::time_point start;
  };

  static void Encode(const WriteBatch& batch, Request* req);
  void CommitterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void WriteGroup(std::vector<Request>& group);
  void SyncerLoop() ABSL_LOCKS_EXCLUDED(sync_mu_);
  // SpaceKeeper::Refresh with the syncer's failed sync, if any.
  void Refresh(size_t bytes) ABSL_LOCKS_EXCLUDED(sync_mu_);

  const RocksDbStoreOptions& options_;
  Database* const database_;
  SpaceKeeper* const space_;
  ReplicationHooks* const hooks_;
  const bool pipelined_;
  rocksdb::WriteOptions write_options_;     // set in the constructor, then read-only
  rocksdb::WriteOptions unsynced_options_;  // for groups of WriteBatch::sync() false only

  absl::Mutex mu_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;

  rocksdb::WriteBatch batch_;  // committer thread only; reused between groups
  std::thread committer_;

  // The pipelined commit: the committer hands written groups to the syncer thread through
  // sync_queue_; a failed sync is handed back through sync_error_ (the committer reopens).
  std::thread syncer_;
  absl::Mutex sync_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::deque<WrittenGroup> sync_queue_ ABSL_GUARDED_BY(sync_mu_);
  bool sync_closing_ ABSL_GUARDED_BY(sync_mu_) = false;
  absl::Status sync_error_ ABSL_GUARDED_BY(sync_mu_);

  absl::Mutex stop_mu_;  // serializes Stop()
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;

  // Statistics. Atomic so that Stats() reads them from any thread without a lock on the
  // commit path; only the committer and syncer threads write them. Relaxed order suffices:
  // they are independent counters, and a caller that needs its own commit counted
  // synchronizes with the committer through that commit's callback, which runs after the
  // increment.
  std::atomic<uint64_t> commits_{0};
  std::atomic<uint64_t> write_batches_{0};
  std::atomic<uint64_t> syncs_{0};
  std::atomic<uint64_t> busy_nanos_{0};       // committer_busy_seconds, in nanoseconds
  std::atomic<uint64_t> sync_busy_nanos_{0};  // syncer_busy_seconds, in nanoseconds
  // Observed by the committer or syncer only; read by Stats() (lock-free, see histogram.h).
  AtomicHistogram write_seconds_{CommitLatencyBuckets()};
  AtomicHistogram group_commits_{GroupSizeBuckets()};
};

}  // namespace sbx::store::internal
