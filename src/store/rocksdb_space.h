#pragma once
// Private to sbx::store_rocksdb: the store's free space and its recovery from write errors
// (docs/architecture.md, "A full disk").
//
// The committer checks the free space of the store's file system (statvfs, at most every
// free_space_check_interval or every min_free_bytes/8 bytes written) and refuses writes
// with UNAVAILABLE while it is below min_free_bytes. After a failed write, a failed sync or
// a background error of RocksDB, writes are refused until the store has reopened its
// database (at most once per check interval, and after a space error only once the space
// is back above the reserve). A database opened read-only (a full disk at start) reopens
// for writing the same way.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/listener.h"
#include "rocksdb/status.h"
#include "src/store/rocksdb_store.h"
#include "src/store/rocksdb_store_open.h"

namespace sbx::store::internal {

// Watches RocksDB's background errors (from flushes, compactions, log writes) for the
// committer, and keeps RocksDB from recovering from space errors by itself (rocksdb_space.cc
// says why).
//
// Thread-safety: the callbacks run on RocksDB's threads, without the DB mutex; Take and
// pending may be called from any thread. Lifetime: shared by the rocksdb::Options of every
// database the store opens.
class ErrorListener final : public rocksdb::EventListener {
 public:
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status* error) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason reason, rocksdb::Status error,
                            bool* auto_recovery) override;

  // The error reported since the last Take(), if any (OK otherwise).
  rocksdb::Status Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an error was reported since the last Take().
  bool pending() const { return pending_.load(std::memory_order_acquire); }

 private:
  absl::Mutex mu_;
  rocksdb::Status error_ ABSL_GUARDED_BY(mu_);
  // Lets the committer check for an error once per group without the mutex. Release on
  // set, acquire on read: whoever sees true then finds error_ under the mutex anyway.
  std::atomic<bool> pending_{false};
};

// The store's writability: the free space at the last check, the error since the last
// recovery, whether the database is open read-only; and the reopen that recovers.
//
// Thread-safety: the committer thread alone calls every method but the *_stat() ones,
// which any thread may call (Stats()); Close() reads the committer's state after joining
// its thread (join() orders the committer's writes before those reads). Lifetime: owned by
// the store; `database` and `listener` outlive it.
class SpaceKeeper {
 public:
  SpaceKeeper(const RocksDbStoreOptions& options, Database* database,
              std::shared_ptr<ErrorListener> listener, bool read_only,
              std::optional<uint64_t> free_bytes);
  SpaceKeeper(const SpaceKeeper&) = delete;
  SpaceKeeper& operator=(const SpaceKeeper&) = delete;

  // Before a group's write of `bytes` (0: the committer woke with nothing to write):
  // checks the free space when due, takes RocksDB's background errors and `sync_error`
  // (a failed sync of the pipelined commit) in, and reopens (at most once per check) when
  // writes are refused and the space allows.
  void Refresh(size_t bytes, const absl::Status& sync_error);

  // Whether a group may be written now.
  bool Writable() const { return !read_only_ && !low_space_ && rocks_error_.ok(); }

  // The UNAVAILABLE status of a group of `commits` refused without a write (0: for the
  // log), naming the path, the free space and why.
  [[nodiscard]] absl::Status Refusal(size_t commits) const;

  // A group write of `commits` failed with `s`: writes are refused until a reopen. Returns
  // the group's status, naming the path and the free space.
  [[nodiscard]] absl::Status WriteFailed(const rocksdb::Status& s, size_t commits);

  // How many times the database was reopened: a failed sync fails only the groups written
  // to the same database.
  uint64_t generation() const { return generation_; }

  // For Close(), after the committer has stopped: open read-only; below the reserve at
  // the last check; no write or background error since the last recovery.
  bool read_only() const { return read_only_; }
  bool low_space() const { return low_space_; }
  bool Healthy() const { return rocks_error_.ok() && !listener_->pending(); }

  // Any thread: copies of Writable() and the free bytes as of the last check.
  bool writable_stat() const { return writable_stat_.load(std::memory_order_relaxed); }
  std::optional<uint64_t> free_bytes_stat() const;

 private:
  static constexpr uint64_t kUnknownFree = ~uint64_t{0};

  bool IsLow(std::optional<uint64_t> free) const;
  void Reopen();
  void NoteRecoveryFailure(const std::string& error);
  void PublishState();

  const RocksDbStoreOptions& options_;
  Database* const database_;
  const std::shared_ptr<ErrorListener> listener_;
  const uint64_t probe_bytes_;  // check the free space after this many bytes written

  // Committer thread only (see the class comment).
  bool read_only_;
  std::optional<uint64_t> free_bytes_;  // at the last check
  bool low_space_ = false;              // free_bytes_ below min_free_bytes
  rocksdb::Status rocks_error_;         // RocksDB's error since the last recovery
  std::chrono::steady_clock::time_point last_probe_;
  uint64_t bytes_since_probe_ = 0;
  std::string last_recovery_error_;  // logged once until it changes
  uint64_t generation_ = 0;          // database reopens

  // Copies of Writable() and free_bytes_ (kUnknownFree for nullopt) for Stats(), read at
  // scrape time. Relaxed: each is a value on its own, written by the committer only.
  std::atomic<bool> writable_stat_{true};
  std::atomic<uint64_t> free_bytes_stat_{kUnknownFree};
};

}  // namespace sbx::store::internal
