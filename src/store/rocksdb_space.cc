// The store's free space and its recovery from write errors (rocksdb_space.h). The full
// story, with what went wrong in RocksDB 7.8, is in docs/architecture.md ("A full disk").
//
// Why the store reopens its database instead of letting RocksDB recover. An out-of-space
// error stops RocksDB's writes (a hard error; ErrorListener also raises a compaction's
// soft one to hard, so that "out of space" is one state whatever ran out). RocksDB's own
// recovery (its SstFileManager polling every 5 s for a whole memtable of free space, and a
// resume thread for retryable I/O errors) ends in DB::Resume(), which in 7.8 could wait
// forever for a flush that was never scheduled, or hand the next write to the failed log
// writer (and so to an assert). So OnErrorRecoveryBegin turns the space recovery off,
// max_bgerror_resume_count = 0 turns the other off, and the committer recovers the way a
// restart does: it closes the database and opens it again. The open replays the log; the
// failed group's torn record at its tail is dropped (kTolerateCorruptedTailRecords), so
// nothing acknowledged is lost and nothing refused is applied. If the open fails for lack
// of space, the store falls back to read-only (rocksdb_store_open.cc) and retries.

#include "src/store/rocksdb_space.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "src/store/rocksdb_common.h"

namespace sbx::store::internal {

void ErrorListener::OnBackgroundError(rocksdb::BackgroundErrorReason reason,
                                      rocksdb::Status* error) {
  if (IsSpaceError(*error) && error->severity() < rocksdb::Status::Severity::kHardError) {
    *error = rocksdb::Status(*error, rocksdb::Status::Severity::kHardError);
  }
  absl::MutexLock lock(&mu_);
  error_ = *error;
  error_.PermitUncheckedError();
  pending_.store(true, std::memory_order_release);
}

void ErrorListener::OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason reason,
                                         rocksdb::Status error, bool* auto_recovery) {
  if (IsSpaceError(error)) *auto_recovery = false;
  error.PermitUncheckedError();
}

rocksdb::Status ErrorListener::Take() {
  if (!pending_.load(std::memory_order_acquire)) return rocksdb::Status::OK();
  absl::MutexLock lock(&mu_);
  pending_.store(false, std::memory_order_relaxed);
  rocksdb::Status e = error_;
  error_ = rocksdb::Status::OK();
  return e;
}

SpaceKeeper::SpaceKeeper(const RocksDbStoreOptions& options, Database* database,
                         std::shared_ptr<ErrorListener> listener, bool read_only,
                         std::optional<uint64_t> free_bytes)
    : options_(options),
      database_(database),
      listener_(std::move(listener)),
      probe_bytes_(options.min_free_bytes / 8),
      read_only_(read_only),
      free_bytes_(free_bytes),
      last_probe_(std::chrono::steady_clock::now()) {
  low_space_ = IsLow(free_bytes_);
  free_bytes_stat_.store(free_bytes_.value_or(kUnknownFree), std::memory_order_relaxed);
  writable_stat_.store(Writable(), std::memory_order_relaxed);
}

std::optional<uint64_t> SpaceKeeper::free_bytes_stat() const {
  const uint64_t free = free_bytes_stat_.load(std::memory_order_relaxed);
  if (free == kUnknownFree) return std::nullopt;
  return free;
}

bool SpaceKeeper::IsLow(std::optional<uint64_t> free) const {
  return options_.min_free_bytes > 0 && free.has_value() && *free < options_.min_free_bytes;
}

void SpaceKeeper::Refresh(size_t bytes, const absl::Status& sync_error) {
  const auto now = std::chrono::steady_clock::now();
  bytes_since_probe_ += bytes;
  const bool due =
      now - last_probe_ >= absl::ToChronoNanoseconds(options_.free_space_check_interval) ||
      (probe_bytes_ > 0 && bytes_since_probe_ >= probe_bytes_);
  if (due) {
    last_probe_ = now;
    bytes_since_probe_ = 0;
    free_bytes_ = FreeBytes(options_.path);
    low_space_ = IsLow(free_bytes_);
  }
  if (rocksdb::Status e = listener_->Take(); !e.ok() && rocks_error_.ok()) rocks_error_ = e;
  if (!sync_error.ok()) {
    if (rocks_error_.ok())
      rocks_error_ = rocksdb::Status::IOError(std::string(sync_error.message()));
    PublishState();
  }
  // Recover only after a fresh check: at most once per interval while refused, and not
  // while the space that ran out is still missing.
  const bool space_back =
      !free_bytes_.has_value() || (*free_bytes_ > 0 && *free_bytes_ >= options_.min_free_bytes);
  if (due && (read_only_ || !rocks_error_.ok()) &&
      (space_back || !(read_only_ || IsSpaceError(rocks_error_)))) {
    Reopen();
  }
  PublishState();
}

absl::Status SpaceKeeper::WriteFailed(const rocksdb::Status& s, size_t commits) {
  // Whatever failed, the committer reopens the database at its next check (Refresh).
  rocks_error_ = s;
  free_bytes_ = FreeBytes(options_.path);
  PublishState();
  return FromRocks(s, absl::StrCat("group write of ", commits, " commits to store at ",
                                   Quoted(options_.path), " failed (", FreeText(free_bytes_), ")"));
}

// Closes the database and opens it again, as a restart would: for writing if it can, else
// read-only (then the next check tries again), else the store stays without a database and
// refuses writes with the error.
void SpaceKeeper::Reopen() {
  const bool was_read_only = read_only_;
  absl::StatusOr<bool> reopened =
      database_->Reopen(options_, free_bytes_, /*log_close_error=*/!read_only_, [this] {
        listener_->Take(); /* errors of the closed database */
      });
  if (!reopened.ok()) {
    rocks_error_ = rocksdb::Status::IOError(std::string(reopened.status().message()));
    read_only_ = false;
    NoteRecoveryFailure(reopened.status().ToString());
    return;
  }
  read_only_ = *reopened;
  rocks_error_ = rocksdb::Status::OK();
  ++generation_;  // groups written from now on are not covered by an earlier failed sync
  if (read_only_) {
    NoteRecoveryFailure("still too full to open for writing");
  } else {
    spdlog::info("store at \"{}\" {} ({})", options_.path,
                 was_read_only ? "reopened for writing" : "reopened after the write error",
                 FreeText(free_bytes_));
  }
}

// Logs a failed recovery once per distinct error: while the disk stays short, the
// committer retries every check interval.
void SpaceKeeper::NoteRecoveryFailure(const std::string& error) {
  if (error == last_recovery_error_) return;
  last_recovery_error_ = error;
  spdlog::warn("store at \"{}\" still refuses writes ({}): {}", options_.path,
               FreeText(free_bytes_), error);
}

// The status of a group refused without a write.
absl::Status SpaceKeeper::Refusal(size_t commits) const {
  const std::string head = absl::StrCat("store at ", Quoted(options_.path), " refuses writes",
                                        commits > 0 ? absl::StrCat(" (", commits, " commits)") : "",
                                        ": ", FreeText(free_bytes_), " on its file system");
  const std::string reserve =
      absl::StrCat("the reserve of ", options_.min_free_bytes, " bytes (min_free_bytes)");
  if (read_only_) {
    return absl::UnavailableError(
        absl::StrCat(head,
                     "; it is open read-only (its disk was full when it opened) and reopens for "
                     "writing once free space is back above ",
                     reserve));
  }
  if (!rocks_error_.ok()) {
    return absl::UnavailableError(absl::StrCat(
        head, "; a write failed (", rocks_error_.ToString(),
        ") and the store reopens its database ",
        IsSpaceError(rocks_error_) ? absl::StrCat("once free space is back above ", reserve)
                                   : std::string("at its next check")));
  }
  return absl::UnavailableError(absl::StrCat(head, ", below ", reserve));
}

// Makes the state visible to Stats() and logs its changes.
void SpaceKeeper::PublishState() {
  const bool writable = Writable();
  free_bytes_stat_.store(free_bytes_.value_or(kUnknownFree), std::memory_order_relaxed);
  if (writable_stat_.exchange(writable, std::memory_order_relaxed) == writable) return;
  if (writable) {
    spdlog::info("store at \"{}\" accepts writes again ({})", options_.path, FreeText(free_bytes_));
    last_recovery_error_.clear();
  } else {
    spdlog::warn("{}", std::string(Refusal(0).message()));
  }
}

}  // namespace sbx::store::internal
