// Opening the RocksDB store's database, its checks, and recovery (rocksdb_store_open.h).
//
// Why the checks: RocksDB's create_if_missing would happily create a fresh database inside
// any directory, which after a mistake in a path (or a lost volume) would start sbx empty
// and forget every claim. So creation is allowed only for a missing or empty directory; a
// non-empty one must hold a database (CURRENT) that carries sbx's marker key (m/store).
// Everything RocksDB reports on open (bad CURRENT, missing or corrupt MANIFEST, missing
// log or table files, corrupt log records other than a torn tail) refuses the open, and
// so does a table block whose checksum does not match (verify_checksums_on_open).
//
// Opening on a full disk. DB::Open writes (a new MANIFEST, an OPTIONS file, a new log,
// the replayed log as a table file), so on a full disk it fails. The store then opens
// read-only (DB::OpenForReadOnly writes nothing), holding the database's LOCK file itself
// so that no other process opens it for writing, serves LoadAll, refuses commits, and the
// committer reopens the database for writing once the space is back (rocksdb_space.cc).
//
// Recovery reads the whole database with one iterator in key order, without filling the
// block cache, with a large readahead, decoding into reused protobuf messages.

#include "src/store/rocksdb_store_open.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/iterator.h"
#include "rocksdb/table.h"
#include "spdlog/spdlog.h"
#include "src/common/status_macros.h"
#include "src/store/record_codec.h"
#include "src/store/rocksdb_common.h"

namespace sbx::store::internal {
namespace {

namespace fs = std::filesystem;

// The status of a failed DB::Open. A file that the database's own metadata names but that
// is missing is data loss, not "not found".
absl::Status FromRocksOpen(const rocksdb::Status& s, absl::string_view path) {
  const std::string context = absl::StrCat("cannot open store at ", Quoted(path));
  if (s.IsNotFound() || s.IsPathNotFound()) {
    return absl::DataLossError(
        absl::StrCat(context, ": a file of the database is missing: ", s.ToString()));
  }
  return FromRocks(s, context);
}

// Faults in the reserved storage of a vector ahead of its writes, a few MiB at a time,
// with one madvise(MADV_POPULATE_WRITE) call instead of one page fault per 4 KiB page.
// Recovery writes hundreds of MB of records into fresh memory, and on virtual machines
// where a page fault is expensive that dominated LoadAll (on the 2-core development VM,
// 264 MB for a million claims took about 0.4 s of faults, and 0.05 s populated this way).
// Only capacity about to be used is populated, so over-reserving stays free. Without
// MADV_POPULATE_WRITE (Linux < 5.14), or if the call fails, pages fault in as usual.
template <typename T>
class Prefaulter {
 public:
  explicit Prefaulter(std::vector<T>* v) : v_(v) {}

  // Call before each possible append to *v_.
  void BeforeAppend() {
#ifdef MADV_POPULATE_WRITE
    if (v_->size() < populated_) return;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<uintptr_t>(v_->data());
    const uintptr_t end = base + v_->capacity() * sizeof(T);
    const uintptr_t from = (base + v_->size() * sizeof(T)) & ~(page - 1);
    const uintptr_t to = std::min<uintptr_t>(from + kStepBytes, end & ~(page - 1));
    if (to > from) {
      // Best effort: on failure the pages simply fault in when written.
      madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE);
    }
    populated_ = v_->size() + kStepBytes / sizeof(T);
#endif
  }

 private:
  static constexpr size_t kStepBytes = size_t{8} << 20;
  std::vector<T>* v_;
  size_t populated_ = 0;  // index up to which storage was populated
};

// Checks for sbx's marker key in an opened database, and writes it into a new one
// (`created`: this Open created the database).
absl::Status CheckMarker(rocksdb::DB& db, const std::string& path, bool created) {
  std::string value;
  rocksdb::Status s =
      db.Get(rocksdb::ReadOptions(),
             rocksdb::Slice(codec::kMarkerKey.data(), codec::kMarkerKey.size()), &value);
  if (s.ok()) {
    if (value == codec::MarkerValue()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("store at ", Quoted(path), ": record \"", codec::kMarkerKey,
                     "\" is not a store marker of format version ", codec::kFormatVersion,
                     " (written by a newer sbx, or corrupt)"));
  }
  if (!s.IsNotFound()) {
    return FromRocks(s, absl::StrCat("reading the marker of store at ", Quoted(path)));
  }
  // No marker. Either the database was created by this Open (write the marker now), or
  // it is not sbx's: a RocksDB database with keys of some other program, or an empty
  // one. An empty one is refused too: besides a first start that crashed between
  // creating the database and writing the marker, it is what a damaged MANIFEST (one
  // that lost its records of the table files) recovers to, and sbx must not start empty
  // on top of that.
  if (!created) {
    std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("reading store at ", Quoted(path))));
    if (it->Valid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "directory ", Quoted(path), " holds a RocksDB database that is not an sbx store (no \"",
          codec::kMarkerKey, "\" key); refusing to use it"));
    }
    return absl::DataLossError(absl::StrCat(
        "store at ", Quoted(path), " holds an empty RocksDB database without the sbx marker \"",
        codec::kMarkerKey,
        "\": its metadata may have lost the data, or the first start crashed while creating "
        "it (then delete the directory). Refusing to start empty"));
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  const std::string marker = codec::MarkerValue();
  return FromRocks(
      db.Put(wo, rocksdb::Slice(codec::kMarkerKey.data(), codec::kMarkerKey.size()), marker),
      absl::StrCat("writing the marker of store at ", Quoted(path)));
}

}  // namespace

// RocksDB settings for sbx's workload: small records, a write stream of small group
// commits that must each be durable, point writes only (no reads after start-up) and one
// full scan at start-up.
rocksdb::Options MakeRocksOptions(const RocksDbStoreOptions& o) {
  rocksdb::Options r;
  // The write-ahead log is the durability mechanism (never disabled). A torn record at the
  // tail of the log (a crash in the middle of a write that was therefore never
  // acknowledged) is dropped; corruption anywhere else refuses the open instead of
  // silently recovering to an earlier point (kPointInTimeRecovery, RocksDB's default).
  r.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  r.paranoid_checks = true;
  // Record log files in the MANIFEST so that a missing log is detected on open.
  r.track_and_verify_wals_in_manifest = true;
  // A modest memtable: the data set is small, and the log to replay after kill -9 stays
  // short. Three buffers let one fill while one flushes without stalling writes.
  r.write_buffer_size = o.write_buffer_bytes;
  r.max_write_buffer_number = 3;
  r.max_total_wal_size = 4 * o.write_buffer_bytes;
  // sbx shares small machines with the sandboxes it manages: one flush and one compaction
  // thread are plenty for its write rate.
  r.max_background_jobs = 2;
  // No automatic resume after a background error: the store reopens the database itself
  // (rocksdb_space.cc), and RocksDB's resume thread would race with that.
  r.max_bgerror_resume_count = 0;
  r.level_compaction_dynamic_level_bytes = true;
  // LZ4 everywhere: cheap enough for the hot levels, fast to decompress during recovery.
  // Without LZ4 in this RocksDB build, no compression.
  r.compression = rocksdb::kNoCompression;
  for (rocksdb::CompressionType c : rocksdb::GetSupportedCompressions()) {
    if (c == rocksdb::kLZ4Compression) r.compression = rocksdb::kLZ4Compression;
  }
  // Blocks of 16 KiB compress better and scan faster than the 4 KiB default; no bloom
  // filter, because the store does no point lookups on the claim path; a small block
  // cache, because reads happen only at start-up (and bypass the cache).
  rocksdb::BlockBasedTableOptions table;
  table.block_size = 16 * 1024;
  table.block_cache = rocksdb::NewLRUCache(8 << 20);
  r.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  r.compaction_readahead_size = 2 << 20;
  // The info log is InfoLog (set by the caller), not RocksDB's own file logger.
  return r;
}

absl::Status CheckPath(const std::string& path, bool* create) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::UnavailableError(
        absl::StrCat("cannot inspect store path ", Quoted(path), ": ", ec.message()));
  }
  if (!fs::exists(st)) {
    fs::create_directories(path, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot create store directory ", Quoted(path), ": ", ec.message()));
    }
    *create = true;
    return absl::OkStatus();
  }
  if (!fs::is_directory(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store path ", Quoted(path), " exists and is not a directory"));
  }
  bool empty = true;
  bool has_current = false;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "lost+found") continue;  // the root of a freshly formatted volume
    empty = false;
    if (name == "CURRENT") has_current = true;
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot list store directory ", Quoted(path), ": ", ec.message()));
  }
  if (empty) {
    *create = true;
    return absl::OkStatus();
  }
  if (!has_current) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store directory ", Quoted(path),
        " is not empty and holds no RocksDB database (no CURRENT file); refusing to create a "
        "store in it. Point the store at a missing or empty directory, or restore the database"));
  }
  *create = false;
  return absl::OkStatus();
}

// Opens the existing (or, with `create`, new) database at options.path with `rocks` (info
// log and listener set) and checks its marker: for writing, or read-only when
// `below_reserve` or when opening for writing fails for lack of space (never when
// creating). Fills opened.db, read_only and lock. Errors name the path.
absl::StatusOr<OpenedDb> OpenDb(const rocksdb::Options& rocks_in,
                                const RocksDbStoreOptions& options, bool create, bool below_reserve,
                                std::optional<uint64_t> free_bytes, bool verify_checksums) {
  OpenedDb opened;
  rocksdb::Options rocks = rocks_in;
  rocks.create_if_missing = create;
  rocks.error_if_exists = create;  // lost a race with someone creating it: refuse
  rocksdb::DB* raw = nullptr;
  std::string why_read_only;
  if (below_reserve) {
    why_read_only = absl::StrCat(FreeText(free_bytes), ", below the reserve of ",
                                 options.min_free_bytes, " bytes (min_free_bytes)");
  } else {
    rocksdb::Status s = rocksdb::DB::Open(rocks, options.path, &raw);
    if (!s.ok() && (create || !IsSpaceError(s))) return FromRocksOpen(s, options.path);
    if (!s.ok()) {
      why_read_only = absl::StrCat("opening it for writing failed for lack of space (",
                                   FreeText(FreeBytes(options.path)), "): ", s.ToString());
    }
  }
  if (!why_read_only.empty()) {
    // DB::OpenForReadOnly writes nothing, and does not take the LOCK file; the store takes
    // it, to keep another process from opening the database for writing meanwhile.
    rocksdb::Status s = rocks.env->LockFile(options.path + "/LOCK", &opened.lock);
    if (!s.ok()) return FromRocksOpen(s, options.path);
    opened.read_only = true;
    s = rocksdb::DB::OpenForReadOnly(rocks, options.path, &raw);
    if (!s.ok()) {
      rocks.env->UnlockFile(opened.lock).PermitUncheckedError();
      return FromRocksOpen(s, options.path);
    }
    spdlog::warn(
        "store at \"{}\" opened READ-ONLY: {}. Commits fail until the file system has room "
        "again; then the store reopens for writing by itself",
        options.path, why_read_only);
  }
  opened.db.reset(raw);
  absl::Status checked;
  if (verify_checksums) {
    // Reads every table block once and checks its checksum (about 60 ms per million
    // records from the page cache): damage inside a table file refuses the open, rather
    // than surfacing in LoadAll.
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    ro.readahead_size = 4 << 20;
    checked = FromRocksOpen(opened.db->VerifyChecksum(ro), options.path);
  }
  if (checked.ok()) checked = CheckMarker(*opened.db, options.path, create);
  if (!checked.ok()) {
    opened.db->Close().PermitUncheckedError();
    if (opened.lock != nullptr) rocks.env->UnlockFile(opened.lock).PermitUncheckedError();
    return checked;
  }
  return opened;
}

absl::StatusOr<Contents> ReadAll(rocksdb::DB& db, const std::string& path) {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  ro.fill_cache = false;  // read once at start-up; do not evict anything for it
  ro.readahead_size = 4 << 20;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(ro));
  Contents contents;
  // Reserve room for the bulky kinds up front: growing a vector of a million records
  // would copy it repeatedly and touch twice the memory (page faults dominate recovery
  // time on some virtual machines). The estimate counts all keys, so it over-reserves
  // each kind; capacity that is never written costs address space, not memory.
  uint64_t estimate = 0;
  if (db.GetIntProperty("rocksdb.estimate-num-keys", &estimate)) {
    estimate = std::min<uint64_t>(estimate + estimate / 8, uint64_t{1} << 24);
    contents.claims.reserve(estimate);
    contents.sandboxes.reserve(estimate);
  }
  codec::RecordDecoder decoder;
  Prefaulter<ClaimRecord> claims_prefaulter(&contents.claims);
  Prefaulter<SandboxRecord> sandboxes_prefaulter(&contents.sandboxes);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    claims_prefaulter.BeforeAppend();
    sandboxes_prefaulter.BeforeAppend();
    absl::Status s = decoder.Decode(View(it->key()), View(it->value()), &contents);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("store at ", Quoted(path), ": ", s.message()));
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("reading store at ", Quoted(path))));
  return contents;
}

Database::Database(std::string path, rocksdb::Options rocks, std::unique_ptr<rocksdb::DB> db,
                   rocksdb::FileLock* lock)
    : path_(std::move(path)), rocks_(std::move(rocks)) {
  absl::MutexLock hold(&mu_);
  db_ = std::move(db);
  lock_ = lock;
}

Database::~Database() {
  absl::MutexLock lock(&mu_);
  CloseLocked().PermitUncheckedError();
}

rocksdb::Status Database::CloseLocked() {
  rocksdb::Status closed = db_ != nullptr ? db_->Close() : rocksdb::Status::OK();
  db_.reset();
  if (lock_ != nullptr) {
    rocks_.env->UnlockFile(lock_).PermitUncheckedError();
    lock_ = nullptr;
  }
  return closed;
}

absl::StatusOr<bool> Database::Reopen(const RocksDbStoreOptions& options,
                                      std::optional<uint64_t> free_bytes, bool log_close_error,
                                      absl::FunctionRef<void()> after_close) {
  absl::WriterMutexLock lock(&mu_);
  if (db_ != nullptr) {
    // After a write error this reports the failed log's writer; what that writer wrote
    // before the error (every acknowledged commit) is in the log file.
    rocksdb::Status closed = db_->Close();
    if (!closed.ok() && log_close_error) {
      spdlog::info("store at \"{}\": closing after the write error: {}", path_, closed.ToString());
    }
    db_.reset();
  }
  if (lock_ != nullptr) {
    rocks_.env->UnlockFile(lock_).PermitUncheckedError();
    lock_ = nullptr;
  }
  after_close();
  absl::StatusOr<OpenedDb> opened =
      OpenDb(rocks_, options, /*create=*/false, /*below_reserve=*/false, free_bytes,
             /*verify_checksums=*/false);
  if (!opened.ok()) return opened.status();
  lock_ = opened->lock;
  db_ = std::move(opened->db);
  return opened->read_only;
}

absl::Status Database::Closed(absl::string_view what) const {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " on store at ", Quoted(path_), ", which is closed or lost its database"));
}

}  // namespace sbx::store::internal
