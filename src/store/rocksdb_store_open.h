#pragma once
// Private to sbx::store_rocksdb: opening the store's database, the checks that keep sbx
// from starting on the wrong or a damaged directory, recovery (reading every record at
// start-up), and the Database that holds the open rocksdb::DB for the other rooms.
//
// Opening refuses what RocksDB would happily use or create (docs/architecture.md, "The
// store"): creation only in a missing or empty directory; a non-empty one must hold a
// RocksDB database carrying sbx's marker key; anything RocksDB reports on open, and (with
// verify_checksums_on_open) a table block whose checksum does not match, refuses it. On a
// disk below the reserve, or too full for RocksDB to open it for writing, an existing
// database opens read-only, its LOCK file held by the store.
//
// Thread-safety: the free functions are safe from any thread; Database says its own.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"
#include "src/store/rocksdb_store.h"
#include "src/store/store.h"

namespace sbx::store::internal {

// RocksDB settings for sbx's workload (small records, small group commits that must each
// be durable, no reads after start-up but one full scan). The caller sets info_log and
// the listeners.
rocksdb::Options MakeRocksOptions(const RocksDbStoreOptions& options);

// Classifies `path`. Sets *create when the database is to be created (the path is
// missing, and is created now, or an empty directory); refuses anything else that is not
// a RocksDB database: FAILED_PRECONDITION naming the path, UNAVAILABLE for an I/O error.
[[nodiscard]] absl::Status CheckPath(const std::string& path, bool* create);

// A database as OpenDb opened it.
struct OpenedDb {
  std::unique_ptr<rocksdb::DB> db;
  // Opened with DB::OpenForReadOnly, because the disk was full.
  bool read_only = false;
  // The database's LOCK file, held by the store while read-only (a read-write database
  // holds its own).
  rocksdb::FileLock* lock = nullptr;
};

// Opens the existing (or, with `create`, new) database at options.path with `rocks` (info
// log and listener set) and checks its marker (writing it into a new database): for
// writing, or read-only when `below_reserve` or when opening for writing fails for lack
// of space (never when creating). Errors name the path, with the codes of
// OpenRocksDbStore.
[[nodiscard]] absl::StatusOr<OpenedDb> OpenDb(const rocksdb::Options& rocks,
                                              const RocksDbStoreOptions& options, bool create,
                                              bool below_reserve,
                                              std::optional<uint64_t> free_bytes,
                                              bool verify_checksums);

// Recovery: every record of `db`, read with one iterator in key order. DATA_LOSS naming
// `path` for a record that does not decode; the read's error otherwise.
[[nodiscard]] absl::StatusOr<Contents> ReadAll(rocksdb::DB& db, const std::string& path);

// The store's open database, or none (after Close, or after a reopen that failed), and
// the database's LOCK file while it is open read-only.
//
// Thread-safety: hold mu() shared to use get() (RocksDB reads and writes are safe
// concurrently); Reopen and CloseLocked replace or free it under mu() exclusive. Never
// contended on the commit path: the committer is the only writer, and LoadAll runs at
// start-up. Lock order: the replication hooks' ship lock is taken before mu().
// Lifetime: owned by the store; destroyed after every thread that uses it has stopped.
class Database {
 public:
  // `lock`: the LOCK file the store holds (a read-only database), or null.
  Database(std::string path, rocksdb::Options rocks, std::unique_ptr<rocksdb::DB> db,
           rocksdb::FileLock* lock);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  // Null when the store has no database (closed, or a reopen failed).
  rocksdb::DB* get() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return db_.get(); }
  const std::string& path() const { return path_; }
  // The options the database was opened with (info log and listener included).
  const rocksdb::Options& rocks_options() const { return rocks_; }

  // Closes and frees the database, if any, and releases the LOCK file if the store holds
  // it. Returns DB::Close's status (after a write error, that of the failed log's writer).
  rocksdb::Status CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Closes the database and opens it again as a restart would (not creating it, not
  // verifying checksums): for writing if it can, else read-only. `after_close` runs
  // between the two, under the lock. The whole swap holds mu() exclusive, so that a
  // reader (LoadAll at start-up, racing with a reopen when space returns) waits for the
  // new database instead of finding none. Returns whether it opened read-only, or the
  // open's error (the store then has no database). `log_close_error`: log a failed close.
  [[nodiscard]] absl::StatusOr<bool> Reopen(const RocksDbStoreOptions& options,
                                            std::optional<uint64_t> free_bytes,
                                            bool log_close_error,
                                            absl::FunctionRef<void()> after_close)
      ABSL_LOCKS_EXCLUDED(mu_);

  // FAILED_PRECONDITION: `what` found no database.
  [[nodiscard]] absl::Status Closed(absl::string_view what) const;

 private:
  const std::string path_;
  const rocksdb::Options rocks_;
  mutable absl::Mutex mu_;
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(mu_);
  rocksdb::FileLock* lock_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace sbx::store::internal
