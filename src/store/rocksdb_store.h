#pragma once
// The production Store: records in an embedded RocksDB database, written by group commit.
//
// One committer thread gathers the batches of all concurrent Commit() calls into one
// RocksDB write (one WriteBatch, so the group is atomic) followed by one fsync, and the
// group's callbacks run in submission order: on a syncer thread that syncs the log for
// every group written meanwhile (the pipelined commit, RocksDbStoreOptions::pipeline), or
// on the committer before its next group. A failed write fails every
// callback of its group and applies none of its batches. After Close(), Commit runs its
// callback at once on the caller's thread, with FAILED_PRECONDITION.
//
// A full disk. The committer checks the free space of the store's file system (statvfs,
// at most every free_space_check_interval or every min_free_bytes/8 bytes written) and
// refuses writes with UNAVAILABLE while it is below min_free_bytes, before RocksDB runs
// out. When the disk fills up anyway (something else filled it), the failed write and
// every later one fail with UNAVAILABLE naming the path and the free bytes, nothing
// acknowledged is lost, and once the free space is back above the reserve the store
// resumes writing by itself (it reopens its database inside; callers keep using the same
// Store). Any other RocksDB write error is handled the same way, retried every
// free_space_check_interval. Opened on a disk below the reserve (or one
// too full for RocksDB to open normally), the store opens read-only: LoadAll works,
// commits fail, and it reopens for writing by itself once space is back. Stats() reports
// whether it is writable and the free bytes.
//
// The encoding is versioned (see records.proto). The server never starts on data it
// cannot read: opening refuses a directory that is not an sbx store and a corrupt or
// unreadable database, and LoadAll() refuses a record it cannot decode, each with a
// message naming the path.
//
// The implementation, in rooms, and the full-disk story: docs/architecture.md ("The store").
//
// This header names no RocksDB or protobuf type; link sbx::store_rocksdb and use the
// returned sbx::store::Store.
//
// Thread-safety: as for every Store, all methods may be called from any thread.
// Lifetime: the destructor calls Close(). Close() must not be called from a commit
// callback (it returns FAILED_PRECONDITION there). Only one open store per path and process.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/store/store.h"

namespace sbx::store {

// When a commit's callback may report success.
enum class Durability : uint8_t {
  // After the group's write-ahead-log record is fsync'ed (fdatasync): survives power loss.
  kSync,
  // After the record is handed to the OS (no fsync): survives a crash of the process
  // (kill -9) but not of the machine. Close() still syncs before returning.
  kBuffered,
};

// "sync" or "buffered", for logs and flags.
absl::string_view DurabilityName(Durability durability);
// Parses DurabilityName's output; INVALID_ARGUMENT naming `name` otherwise.
[[nodiscard]] absl::StatusOr<Durability> ParseDurability(absl::string_view name);

struct RocksDbStoreOptions {
  // Directory of the database. Required. Created (with its parents) when missing; an
  // existing directory must be empty (a "lost+found" entry is ignored, so the root of a
  // fresh volume works) or hold an sbx store.
  std::string path;

  Durability durability = Durability::kSync;

  // kSync only: pipelined group commit. The committer writes each group without a sync
  // and goes on to the next while a second thread fdatasyncs the write-ahead log for every
  // group written so far and then answers them (after the standby's acknowledgement, with
  // replication), so a commit waits for at most the rest of one sync and its own instead
  // of the write, sync and callbacks of the group before it. False: each group is written
  // with sync=true and answered by the committer before the next (the former behaviour,
  // kept for comparison).
  bool pipeline = true;

  // Limits on one group commit; a group closes when either is reached (a single larger
  // batch still forms a group by itself). The bytes are the encoded keys and values.
  // 4 MiB is about 30,000 claim records: large enough that a group is never split under
  // load, small enough that a group's write+fsync stays in the low milliseconds.
  size_t max_group_bytes = size_t{4} << 20;
  size_t max_group_mutations = 32768;

  // Size of one RocksDB memtable (and so, roughly, of the write-ahead log replayed after
  // a crash). Modest on purpose: sbx's data set is small, and a short log keeps
  // restart-after-kill fast.
  size_t write_buffer_bytes = size_t{16} << 20;

  // Open reads every table block once to check its checksum, so that damage inside a
  // table file refuses the open (costs about 60 ms per million records when the files
  // are in the page cache). When false, such damage is found by LoadAll instead.
  bool verify_checksums_on_open = true;

  // Free space kept on the store's file system: below it, commits fail with UNAVAILABLE
  // instead of running RocksDB into a full disk (and a store opened below it opens
  // read-only). RocksDB needs room beyond the records themselves: a new log file and a
  // memtable flush (write_buffer_bytes each) and a compaction's output, so the default is
  // a few times the memtable size. 0 disables the reserve: writes go on until the file
  // system itself refuses them.
  uint64_t min_free_bytes = uint64_t{64} << 20;

  // How often the committer checks the free space (statvfs) when no more than
  // min_free_bytes/8 bytes were written since the last check, and how often it retries
  // while it refuses writes. Idle, it still checks this often, so Stats() stays current.
  absl::Duration free_space_check_interval = absl::Seconds(1);

  // INVALID_ARGUMENT naming the first bad field.
  [[nodiscard]] absl::Status Validate() const;
};

// Opens (or creates, when `options.path` is missing or empty) the store at options.path
// and starts its committer thread. Errors, each naming the path:
//   INVALID_ARGUMENT     bad options;
//   FAILED_PRECONDITION  the path is not a directory, or a non-empty directory that is not
//                        a RocksDB database, or a RocksDB database that is not an sbx store;
//   DATA_LOSS            the database is corrupt (CURRENT, MANIFEST, log or table files,
//                        including table contents unless verify_checksums_on_open is off),
//                        or it is an empty database without sbx's marker (which is what
//                        a MANIFEST that lost its records recovers to);
//   UNAVAILABLE          an I/O error, or the database is locked by another user, or a new
//                        database would start below min_free_bytes.
// An existing database on a file system below min_free_bytes, or one that RocksDB cannot
// open for lack of space, opens read-only (logged as a warning; see above).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Store>> OpenRocksDbStore(
    const RocksDbStoreOptions& options);

}  // namespace sbx::store
