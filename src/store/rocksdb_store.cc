// The RocksDB store's door (rocksdb_store.h): the Store and Replicable implementation,
// which only joins its rooms, each a file of this target with its own private header:
//   rocksdb_store_open    opening, the checks of a path and a database, recovery (LoadAll),
//                         and the Database that holds the open rocksdb::DB
//   rocksdb_commit        group commit: the committer, the pipelined syncer, WAL syncs
//   rocksdb_space         free space: the reserve, refusals, reopening after an error
//   rocksdb_replication   the replication hooks
//   rocksdb_info_log      RocksDB's info log
// Layout of the data: record_codec.h / records.proto. The full-disk story (why the store
// reopens its database itself, and which RocksDB paths it avoids): docs/architecture.md.

#include "src/store/rocksdb_store.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "spdlog/spdlog.h"
#include "src/common/dropped.h"
#include "src/common/status_macros.h"
#include "src/store/replication.h"
#include "src/store/rocksdb_commit.h"
#include "src/store/rocksdb_common.h"
#include "src/store/rocksdb_info_log.h"
#include "src/store/rocksdb_replication.h"
#include "src/store/rocksdb_space.h"
#include "src/store/rocksdb_store_open.h"

namespace sbx::store {
namespace {

using internal::Database;
using internal::ErrorListener;
using internal::FromRocks;
using internal::GroupCommitter;
using internal::OpenedDb;
using internal::Quoted;
using internal::ReplicationHooks;
using internal::SpaceKeeper;

// The store: its rooms, and Close() and Stats(), which read them all.
//
// Thread-safety: as for every Store (rocksdb_store.h). Lifetime: members are destroyed in
// reverse order of declaration, after the destructor's Close() has stopped the committer.
class RocksDbStore final : public Store, public Replicable {
 public:
  RocksDbStore(RocksDbStoreOptions options, rocksdb::Options rocks,
               std::shared_ptr<ErrorListener> listener, OpenedDb opened,
               std::optional<uint64_t> free_bytes)
      : options_(std::move(options)),
        database_(options_.path, std::move(rocks), std::move(opened.db), opened.lock),
        space_(options_, &database_, std::move(listener), opened.read_only, free_bytes),
        hooks_(&database_),
        committer_(options_, &database_, &space_, &hooks_) {
    committer_.Start();
  }

  ~RocksDbStore() override { ReportDropped("store.close_at_destruction", Close()); }

  RocksDbStore(const RocksDbStore&) = delete;
  RocksDbStore& operator=(const RocksDbStore&) = delete;

  void Commit(WriteBatch batch, CommitCallback done) override {
    committer_.Submit(std::move(batch), std::move(done));
  }

  absl::StatusOr<Contents> LoadAll() override {
    absl::ReaderMutexLock lock(&database_.mu());
    if (database_.get() == nullptr) return database_.Closed("LoadAll");
    return internal::ReadAll(*database_.get(), options_.path);
  }

  absl::Status Close() override ABSL_LOCKS_EXCLUDED(close_mu_) {
    if (committer_.OnCommitThread()) {
      return absl::FailedPreconditionError(absl::StrCat("Close of store at ", Quoted(options_.path),
                                                        " called from a commit callback"));
    }
    absl::MutexLock close_lock(&close_mu_);
    if (closed_) return close_status_;
    committer_.Stop();  // answers every accepted commit
    // The committer's state (read_only, the write error, low_space) is final now: Stop's
    // join() orders its last writes before these reads.
    absl::Status status;
    {
      absl::WriterMutexLock lock(&database_.mu());
      rocksdb::DB* db = database_.get();
      const bool healthy = space_.Healthy();
      const bool read_only = space_.read_only();
      if (db == nullptr) {
        // A reopen after a write error failed; its error was logged then.
      } else if (!read_only && healthy) {
        if (options_.durability == Durability::kBuffered) {
          status.Update(
              FromRocks(db->SyncWAL(), absl::StrCat("syncing the log of ", Quoted(options_.path))));
        }
        // Flushing the memtable now means the next start reads tables, not the log. Not
        // below the reserve: the flush could fill the disk, and the log has it all anyway.
        if (!space_.low_space()) {
          status.Update(FromRocks(db->Flush(rocksdb::FlushOptions()),
                                  absl::StrCat("flushing store at ", Quoted(options_.path))));
        }
      }
      if (db != nullptr && !read_only && !healthy && options_.durability == Durability::kBuffered) {
        // After a write error SyncWAL would abort (docs/architecture.md, "A full disk"); the
        // log files hold every acknowledged commit, so sync them directly.
        status.Update(internal::SyncLogFiles(options_.path));
      }
      rocksdb::Status closed = database_.CloseLocked();
      if (!healthy && !closed.ok()) {
        // Expected after a write error: RocksDB reports that the failed log's writer was
        // closed with its error. The log was synced (or is synced per write), so it holds
        // every acknowledged commit.
        spdlog::warn("store at \"{}\" closed after a write error: {}", options_.path,
                     closed.ToString());
      } else {
        status.Update(FromRocks(closed, absl::StrCat("closing store at ", Quoted(options_.path))));
      }
    }
    closed_ = true;
    close_status_ = status;
    return status;
  }

  StoreStats Stats() const override {
    StoreStats s;
    committer_.FillStats(&s);
    s.writable = space_.writable_stat();
    s.free_bytes = space_.free_bytes_stat();
    s.min_free_bytes = options_.min_free_bytes;
    return s;
  }

  // --- Replicable: the hooks' ---
  void SetShipper(GroupShipper* shipper) override { hooks_.SetShipper(shipper); }
  absl::Status Snapshot(
      absl::FunctionRef<void()> at,
      absl::FunctionRef<void(absl::string_view, absl::string_view)> each) override {
    return hooks_.Snapshot(at, each);
  }
  absl::StatusOr<std::optional<ReplicaMarker>> ReadMarker() override { return hooks_.ReadMarker(); }
  absl::Status WriteMarker(const ReplicaMarker& marker) override {
    return hooks_.WriteMarker(marker);
  }
  absl::Status BeginLoad(const ReplicaMarker& marker) override { return hooks_.BeginLoad(marker); }
  absl::Status LoadEntries(
      const std::vector<std::pair<std::string, std::string>>& entries) override {
    return hooks_.LoadEntries(entries);
  }
  absl::Status ApplyGroup(absl::string_view group) override { return hooks_.ApplyGroup(group); }

 private:
  const RocksDbStoreOptions options_;
  Database database_;
  SpaceKeeper space_;
  ReplicationHooks hooks_;
  GroupCommitter committer_;

  absl::Mutex close_mu_;
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(close_mu_);
};

}  // namespace

absl::string_view DurabilityName(Durability durability) {
  switch (durability) {
    case Durability::kSync:
      return "sync";
    case Durability::kBuffered:
      return "buffered";
  }
  return "unknown";
}

absl::StatusOr<Durability> ParseDurability(absl::string_view name) {
  if (name == "sync") return Durability::kSync;
  if (name == "buffered") return Durability::kBuffered;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown durability \"", name, "\" (want \"sync\" or \"buffered\")"));
}

absl::Status RocksDbStoreOptions::Validate() const {
  if (path.empty()) return absl::InvalidArgumentError("store path is empty");
  if (durability != Durability::kSync && durability != Durability::kBuffered) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown durability ", static_cast<int>(durability)));
  }
  if (max_group_bytes == 0) {
    return absl::InvalidArgumentError("max_group_bytes is 0 (want at least 1)");
  }
  if (max_group_mutations == 0) {
    return absl::InvalidArgumentError("max_group_mutations is 0 (want at least 1)");
  }
  if (free_space_check_interval <= absl::ZeroDuration() ||
      free_space_check_interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("free_space_check_interval ",
                                                   absl::FormatDuration(free_space_check_interval),
                                                   " is not a positive finite duration"));
  }
  constexpr size_t kMinWriteBuffer = 64 << 10;
  if (write_buffer_bytes < kMinWriteBuffer) {
    return absl::InvalidArgumentError(absl::StrCat("write_buffer_bytes ", write_buffer_bytes,
                                                   " is below the minimum ", kMinWriteBuffer));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Store>> OpenRocksDbStore(const RocksDbStoreOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  bool create = false;
  RETURN_IF_ERROR(internal::CheckPath(options.path, &create));

  const std::optional<uint64_t> free_bytes = internal::FreeBytes(options.path);
  const bool below_reserve =
      options.min_free_bytes > 0 && free_bytes.has_value() && *free_bytes < options.min_free_bytes;
  if (create && below_reserve) {
    // Refused before anything is written, so that the next start still finds the
    // directory empty.
    return absl::UnavailableError(
        absl::StrCat("cannot create store at ", Quoted(options.path), ": ", *free_bytes,
                     " bytes free on its file system, below the reserve of ",
                     options.min_free_bytes, " bytes (min_free_bytes)"));
  }
  rocksdb::Options rocks = internal::MakeRocksOptions(options);
  rocks.info_log = internal::NewInfoLog(options.path);
  auto listener = std::make_shared<ErrorListener>();
  rocks.listeners.push_back(listener);
  ASSIGN_OR_RETURN(OpenedDb opened, internal::OpenDb(rocks, options, create, below_reserve,
                                                     free_bytes, options.verify_checksums_on_open));
  return std::unique_ptr<Store>(std::make_unique<RocksDbStore>(
      options, std::move(rocks), std::move(listener), std::move(opened), free_bytes));
}

}  // namespace sbx::store
