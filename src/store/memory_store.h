#pragma once
// MemoryStore: a Store kept in memory, for tests of the components that use a Store
// (allocator, server, controllers). It has the same semantics as RocksDbStore in kSync
// mode, minus the disk:
//
// - Commit() returns at once; `done` runs later, exactly once, in submission order.
//   By default it runs on the store's own committer thread, as with RocksDbStore, so a
//   component cannot come to rely on the callback having run when Commit returns.
//   CallbackMode::kInline instead runs it on the thread that calls Commit (or Resume),
//   before that call returns, for single-threaded tests.
// - Commits queued together form one group: one write batch, one (modelled) sync, counted
//   in Stats() the way RocksDbStore counts them.
// - A batch that is not well formed (see batch_check.h) fails with INVALID_ARGUMENT and
//   is not applied; after Close(), Commit fails with FAILED_PRECONDITION, and then `done`
//   runs inline on the caller's thread (the committer is gone), as with RocksDbStore.
// - LoadAll() returns what has been committed (applied) so far, each kind sorted by key.
//
// Test hooks make races with the store deterministic: FailNextCommits() injects write
// failures, Pause()/Resume() hold accepted commits un-applied and their callbacks un-run
// (so a test can, say, retry a claim while its first commit is still in flight), and
// AwaitPending()/AwaitIdle() let the test wait for a component to reach the store.
//
// Thread-safety: all methods may be called from any thread. Lifetime: the destructor
// calls Close(); Close() and the destructor must not be called from a commit callback.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/store/store.h"

namespace sbx::store {

struct MemoryStoreOptions {
  enum class CallbackMode : uint8_t {
    kCommitterThread,  // callbacks run on the store's thread (like RocksDbStore); default
    kInline,           // callbacks run inside Commit()/Resume() on the calling thread
  };
  CallbackMode callbacks = CallbackMode::kCommitterThread;
};

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(MemoryStoreOptions options = {});
  // Starts with `initial` already committed: a "restart" is
  // `MemoryStore restarted(old.Snapshot());`.
  explicit MemoryStore(Contents initial, MemoryStoreOptions options = {});
  ~MemoryStore() override;

  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  void Commit(WriteBatch batch, CommitCallback done) override ABSL_LOCKS_EXCLUDED(mu_);
  // FAILED_PRECONDITION after Close(), or the status given to FailNextLoadAll().
  [[nodiscard]] absl::StatusOr<Contents> LoadAll() override ABSL_LOCKS_EXCLUDED(mu_);
  // Releases a Pause(), waits until every accepted commit's callback has run, then refuses
  // new commits. Idempotent. FAILED_PRECONDITION if called from a commit callback.
  [[nodiscard]] absl::Status Close() override ABSL_LOCKS_EXCLUDED(mu_);
  StoreStats Stats() const override ABSL_LOCKS_EXCLUDED(mu_);

  // --- Test hooks ---

  // The next `n` calls of Commit() (counted from now, in submission order) fail with
  // `status`, which must not be OK; their batches are not applied.
  void FailNextCommits(int n, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // The next LoadAll() returns `status` (not OK).
  void FailNextLoadAll(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // Holds commits: commits not yet taken up by the committer (all of them, once a group
  // already being completed has finished) are neither applied nor completed until
  // Resume() or Close().
  void Pause() ABSL_LOCKS_EXCLUDED(mu_);
  // Applies and completes the held commits, in order; in kInline mode their callbacks run
  // on the calling thread before Resume returns.
  void Resume() ABSL_LOCKS_EXCLUDED(mu_);
  // Commits accepted whose callback has not finished yet.
  size_t PendingCommits() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until PendingCommits() >= n. Returns false if `timeout` passed first.
  bool AwaitPending(size_t n, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until PendingCommits() == 0. Returns false if `timeout` passed first (for
  // example because the store is paused).
  bool AwaitIdle(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // What is committed now (also after Close()).
  Contents Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    WriteBatch batch;
    absl::Status status;  // not OK: fail with it instead of applying
    CommitCallback done;
  };

  // Applies and completes queued commits until the queue is empty or the store is paused.
  // Only one thread drains at a time (draining_), which keeps callbacks in order.
  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyLocked(const WriteBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool OnDrainingThreadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Contents SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MemoryStoreOptions options_;

  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  // Commits taken off queue_ whose callbacks have not finished.
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // True while some thread runs DrainLocked (with mu_ released around callbacks).
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id draining_thread_ ABSL_GUARDED_BY(mu_);
  int fail_commits_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_commits_status_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> fail_load_ ABSL_GUARDED_BY(mu_);
  StoreStats stats_ ABSL_GUARDED_BY(mu_);

  std::map<std::string, TemplateRecord> templates_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SnapshotRecord> snapshots_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PoolRecord> pools_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SandboxRecord> sandboxes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ClaimRecord> claims_ ABSL_GUARDED_BY(mu_);
  uint64_t revision_ ABSL_GUARDED_BY(mu_) = 0;

  // Set once in the constructor (kCommitterThread mode), joined by Close().
  std::thread committer_;
  absl::Mutex close_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace sbx::store
