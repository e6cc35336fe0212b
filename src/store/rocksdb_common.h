#pragma once
// Private to sbx::store_rocksdb: small helpers that every room of the RocksDB store uses
// (status conversion, quoting a path, the file system's free space). The rooms are:
//   rocksdb_store.cc        the Store and Replicable doors, Close, Stats, OpenRocksDbStore
//   rocksdb_store_open.cc   opening, the checks of a path and of the marker, recovery
//   rocksdb_commit.cc       group commit: the committer, the pipelined syncer, WAL syncs
//   rocksdb_space.cc        free space: the reserve, refusals, reopening after an error
//   rocksdb_replication.cc  the replication hooks (shipping, snapshots, a standby's writes)
//   rocksdb_info_log.cc     RocksDB's info log
// Only these files (and a few tests) see RocksDB (scripts/check_layering.py).
//
// Thread-safety: every function here is safe from any thread.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rocksdb/slice.h"
#include "rocksdb/status.h"

namespace sbx::store::internal {

inline absl::string_view View(const rocksdb::Slice& s) { return {s.data(), s.size()}; }
inline rocksdb::Slice Key(absl::string_view key) { return {key.data(), key.size()}; }

inline std::string Quoted(absl::string_view path) { return absl::StrCat("\"", path, "\""); }

// A RocksDB status from a read or write, as an absl::Status whose message starts with
// `context` (which names the path).
[[nodiscard]] absl::Status FromRocks(const rocksdb::Status& s, absl::string_view context);

// Free bytes of the file system holding `path` for an unprivileged writer (f_bavail: the
// blocks that ext4 keeps for root do not count), or nullopt when statvfs fails.
std::optional<uint64_t> FreeBytes(const std::string& path);

// "N bytes free", or "free space unknown".
std::string FreeText(std::optional<uint64_t> free);

// RocksDB's out-of-space errors (a full file system, or an SstFileManager's limit).
bool IsSpaceError(const rocksdb::Status& s);

}  // namespace sbx::store::internal
