// Helpers shared by the rooms of the RocksDB store (rocksdb_common.h).

#include "src/store/rocksdb_common.h"

#include <sys/statvfs.h>

#include <utility>

namespace sbx::store::internal {

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(context, ": ", s.ToString());
  switch (s.code()) {
    case rocksdb::Status::kNotFound:
      return absl::NotFoundError(std::move(msg));
    case rocksdb::Status::kCorruption:
      return absl::DataLossError(std::move(msg));
    case rocksdb::Status::kInvalidArgument:
    case rocksdb::Status::kNotSupported:
      return absl::FailedPreconditionError(std::move(msg));
    case rocksdb::Status::kIOError:
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kTryAgain:
    case rocksdb::Status::kIncomplete:
    case rocksdb::Status::kShutdownInProgress:
      return absl::UnavailableError(std::move(msg));
    case rocksdb::Status::kAborted:
      return absl::AbortedError(std::move(msg));
    default:
      return absl::InternalError(std::move(msg));
  }
}

std::optional<uint64_t> FreeBytes(const std::string& path) {
  struct statvfs st;
  if (statvfs(path.c_str(), &st) != 0) return std::nullopt;
  return uint64_t{st.f_bavail} * st.f_frsize;
}

std::string FreeText(std::optional<uint64_t> free) {
  return free.has_value() ? absl::StrCat(*free, " bytes free") : "free space unknown";
}

bool IsSpaceError(const rocksdb::Status& s) {
  return s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit;
}

}  // namespace sbx::store::internal
