// RocksDbStore: the one file that sees RocksDB (the adapter). Layout of the data:
// record_codec.h / records.proto. Notes on the pieces:
//
// Group commit. Commit() checks and encodes the batch on the caller's thread (so encoding
// runs in parallel across callers) and appends it to queue_. The committer thread takes
// everything queued, up to max_group_bytes / max_group_mutations, copies it into one
// rocksdb::WriteBatch and writes it with one DB::Write (sync=true in kSync mode: one
// fdatasync of the write-ahead log for the whole group). While it writes, new commits queue
// up and form the next group, so the group size adapts to load without any timer: one
// writer gets one fsync per commit, many writers share them. After the write it runs the
// group's callbacks in submission order. RocksDB applies a WriteBatch atomically, also
// across a crash (the log record is checksummed as a whole), so a failed or torn group
// applies none of its batches.
//
// Pipelined commit (kSync with options.pipeline, the default). The committer writes each
// group without a sync and hands it to the syncer thread, then takes the next group at
// once; the syncer fdatasyncs the log files itself (WalSyncer: RocksDB has given every
// write to the OS when Write returns) once for every group written since its last sync,
// then waits for the standby (replication) and runs the groups' callbacks in order. A
// commit thus waits for the rest of the sync in progress and its own, not for the write,
// sync and callbacks of the group before it. Not DB::SyncWAL: it may not run after a
// failed write (below), and with writes going on beside it one can fail at any moment. A
// failed sync fails its groups and every later one written to the same database, and the
// committer reopens (as after a failed write).
//
// Opening. RocksDB's create_if_missing would happily create a fresh database inside any
// directory, which after a mistake in a path (or a lost volume) would start sbx empty and
// forget every claim. So creation is allowed only for a missing or empty directory; a
// non-empty one must hold a database (CURRENT) that carries sbx's marker key (m/store).
// Everything RocksDB reports on open (bad CURRENT, missing or corrupt MANIFEST, missing
// log or table files, corrupt log records other than a torn tail) refuses the open, and
// so does a table block whose checksum does not match (verify_checksums_on_open).
//
// Recovery reads the whole database with one iterator in key order, without filling the
// block cache, with a large readahead, decoding into reused protobuf messages.
//
// A full disk. Debian's librocksdb 7.8 is built with assert() enabled, and RocksDB's file
// writer asserts when it is written to again after a failed write, unless the failure came
// from SyncWithoutFlush (WritableFileWriter::AssertFalseAndGetStatusForPrevError,
// "sync_without_flush_called_"). Two paths reached it on a full disk:
//  - The built-in info log (the LOG file) ignores a failed append and writes its next
//    line to the same writer: the first line logged after the disk filled up aborted the
//    process, on whichever thread logged it: the committer logging its write error, or
//    DB::Open logging its header, so a restart on the full disk aborted again. InfoLog
//    below replaces it: one write(2) per line, a refused line is dropped.
//  - DB::SyncWAL on a log whose last write failed (Close() in kBuffered mode). Close()
//    calls SyncWAL and Flush only when the store has seen no write error since its last
//    recovery, and otherwise fsyncs the log files itself.
// The other RocksDB paths after a failed log write check the writer's error first
// (log::Writer::WriteBuffer, the destructor), and writes are refused while the database
// is stopped, so they do not reach the assert.
//
// Recovery. An out-of-space error stops RocksDB's writes (a hard error; ErrorListener also
// raises a compaction's soft one to hard, so that "out of space" is one state whatever ran
// out). RocksDB would recover by itself through its SstFileManager, polling every 5 s
// (fixed) and resuming only with a whole memtable of free space (16 MiB by default), and
// retryable I/O errors through a resume thread of its own. Both end in DB::Resume(), and
// in 7.8 that failed this store's full-disk test in two ways. It can wait forever: a
// background flush that starts while the error is set returns the error without taking
// its request off the flush queue (DBImpl::BackgroundFlush), SchedulePendingFlush then
// skips the column family as already queued, and Resume's flush is never scheduled
// (WaitForFlushMemTables; two runs in the first five hung there). And in other runs the
// first write after a successful Resume() hit the assert above, most likely because the
// failed log was a fresh, empty one, which Resume's memtable switch keeps (it switches logs
// only when the current one is not empty), so the next write appended to the failed writer.
// So the listener turns the space recovery off
// (OnErrorRecoveryBegin), max_bgerror_resume_count = 0 turns the other off, and the
// committer recovers the way a restart does: after a write or background error it closes
// the database and opens it again (at most once per free_space_check_interval, and after a
// space error only once the free space is back above min_free_bytes). The open replays the
// log; the failed group's torn record at its tail is dropped (kTolerateCorruptedTailRecords),
// so nothing acknowledged is lost and nothing refused is applied. If the open fails for lack
// of space, the store falls back to read-only (below) and retries.
//
// Opening on a full disk. DB::Open writes (a new MANIFEST, an OPTIONS file, a new log,
// the replayed log as a table file), so on a full disk it fails. The store then opens
// read-only (DB::OpenForReadOnly writes nothing), holding the database's LOCK file itself
// so that no other process opens it for writing, serves LoadAll, refuses commits, and the
// committer reopens the database for writing once the space is back.

#include "src/store/rocksdb_store.h"
#include "src/common/dropped.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/iterator.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/status.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "spdlog/spdlog.h"
#include "src/common/status_macros.h"
#include "src/store/batch_check.h"
#include "src/store/record_codec.h"
#include "src/store/replication.h"

namespace sbx::store {
namespace {

namespace fs = std::filesystem;

absl::string_view View(const rocksdb::Slice& s) { return {s.data(), s.size()}; }

std::string Quoted(absl::string_view path) { return absl::StrCat("\"", path, "\""); }

// A RocksDB status from a read or write, as an absl::Status whose message starts with
// `context` (which names the path).
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
  // (see the top of this file), and RocksDB's resume thread would race with that.
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

// Free bytes of the file system holding `path` for an unprivileged writer (f_bavail: the
// blocks that ext4 keeps for root do not count), or nullopt when statvfs fails.
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

// RocksDB's info log, in the database directory as LOG (rolled over to LOG.old at
// kMaxBytes). It replaces RocksDB's file logger, which aborts the process on the line
// after a failed write (see the top of this file): here each line is one write(2) to an
// O_APPEND file, and a line the file system refuses is dropped. Lines at ERROR and above
// also go to sbx's log, where an operator sees them even when the disk is full.
class InfoLog final : public rocksdb::Logger {
 public:
  explicit InfoLog(std::string dir)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), dir_(std::move(dir)) {
    absl::WriterMutexLock lock(&mu_);
    OpenLocked(/*truncate=*/false);
  }
  ~InfoLog() override {
    absl::WriterMutexLock lock(&mu_);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void LogHeader(const char* format, va_list ap) override {
    Write(rocksdb::InfoLogLevel::HEADER_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    Write(level, format, ap);
  }

 protected:
  rocksdb::Status CloseImpl() override {
    absl::WriterMutexLock lock(&mu_);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return rocksdb::Status::OK();
  }

 private:
  static constexpr uint64_t kMaxBytes = 4 << 20;

  void Write(rocksdb::InfoLogLevel level, const char* format, va_list ap) {
    static constexpr const char* kNames[] = {"DEBUG", "INFO", "WARN", "ERROR", "FATAL", "HEADER"};
    const int index = static_cast<int>(level);
    const char* name = index >= 0 && index < 6 ? kNames[index] : "?";
    char message[1024];
    va_list copy;
    va_copy(copy, ap);
    const int n = vsnprintf(message, sizeof(message), format, copy);
    va_end(copy);
    std::string text;
    if (n < 0) {
      text = format;
    } else if (static_cast<size_t>(n) < sizeof(message)) {
      text.assign(message, n);
    } else {
      text.resize(n + 1);
      va_copy(copy, ap);
      vsnprintf(text.data(), text.size(), format, copy);
      va_end(copy);
      text.resize(n);
    }
    while (!text.empty() && text.back() == '\n') text.pop_back();
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL &&
        level != rocksdb::InfoLogLevel::HEADER_LEVEL) {
      std::string one_line = text;  // some messages dump structures over several lines
      std::replace(one_line.begin(), one_line.end(), '\n', ' ');
      spdlog::error("rocksdb at \"{}\": {}", dir_, one_line);
    }
    const std::string line =
        absl::StrCat(absl::FormatTime("%Y/%m/%d-%H:%M:%E6S ", absl::Now(), absl::UTCTimeZone()),
                     gettid(), " [", name, "] ", text, "\n");
    bool roll = false;
    {
      // Shared: lines from several threads go out concurrently (O_APPEND keeps each line
      // whole); only a roll-over replaces fd_.
      absl::ReaderMutexLock lock(&mu_);
      if (fd_ >= 0 && write(fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
        roll = size_.fetch_add(line.size(), std::memory_order_relaxed) + line.size() >= kMaxBytes;
      }
    }
    if (roll || fd_missing_.load(std::memory_order_relaxed)) {
      absl::WriterMutexLock lock(&mu_);
      if (roll && size_.load(std::memory_order_relaxed) >= kMaxBytes) {
        // Best effort: a failed rename keeps writing to the full-size file until the next
        // attempt, and a failed open drops lines until one succeeds.
        std::rename((dir_ + "/LOG").c_str(), (dir_ + "/LOG.old").c_str());
        if (fd_ >= 0) close(fd_);
        OpenLocked(/*truncate=*/true);
      } else if (fd_ < 0) {
        OpenLocked(/*truncate=*/false);
      }
    }
  }

  void OpenLocked(bool truncate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    fd_ = open((dir_ + "/LOG").c_str(),
               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
    struct stat st;
    size_.store(fd_ >= 0 && fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0,
                std::memory_order_relaxed);
    fd_missing_.store(fd_ < 0, std::memory_order_relaxed);
  }

  const std::string dir_;
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  // Atomic because writers add to it under the shared lock. Relaxed: it only decides when
  // to roll over, and the roll re-checks it under the exclusive lock.
  std::atomic<uint64_t> size_{0};
  // Atomic so that a line can check it without the exclusive lock; relaxed, as size_.
  std::atomic<bool> fd_missing_{false};
};

// Watches RocksDB's background errors (from flushes, compactions, log writes) for the
// committer, and keeps RocksDB from recovering from space errors by itself (see the top
// of this file). The callbacks run on RocksDB's threads, without the DB mutex.
class ErrorListener final : public rocksdb::EventListener {
 public:
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status* error) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (IsSpaceError(*error) && error->severity() < rocksdb::Status::Severity::kHardError) {
      *error = rocksdb::Status(*error, rocksdb::Status::Severity::kHardError);
    }
    absl::MutexLock lock(&mu_);
    error_ = *error;
    error_.PermitUncheckedError();
    pending_.store(true, std::memory_order_release);
  }

  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason reason, rocksdb::Status error,
                            bool* auto_recovery) override {
    if (IsSpaceError(error)) *auto_recovery = false;
    error.PermitUncheckedError();
  }

  // The error reported since the last Take(), if any (OK otherwise).
  rocksdb::Status Take() ABSL_LOCKS_EXCLUDED(mu_) {
    if (!pending_.load(std::memory_order_acquire)) return rocksdb::Status::OK();
    absl::MutexLock lock(&mu_);
    pending_.store(false, std::memory_order_relaxed);
    rocksdb::Status e = error_;
    error_ = rocksdb::Status::OK();
    return e;
  }

  bool pending() const { return pending_.load(std::memory_order_acquire); }

 private:
  absl::Mutex mu_;
  rocksdb::Status error_ ABSL_GUARDED_BY(mu_);
  // Lets the committer check for an error once per group without the mutex. Release on
  // set, acquire on read: whoever sees true then finds error_ under the mutex anyway.
  std::atomic<bool> pending_{false};
};

// fdatasyncs the write-ahead log files in `dir` directly, for Close() after a write error,
// when DB::SyncWAL would abort (see the top of this file). Fails naming the first file
// that cannot be synced.
absl::Status SyncLogFiles(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".log") continue;
    const int fd = open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fdatasync(fd) != 0) {
      const int err = errno;
      if (fd >= 0) close(fd);
      return absl::UnavailableError(
          absl::StrCat("syncing ", Quoted(it->path().string()), ": ", strerror(err)));
    }
    close(fd);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("listing store directory ", Quoted(dir), ": ", ec.message()));
  }
  return absl::OkStatus();
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

// The store whose committer runs on this thread (so that Close() from a callback is
// refused instead of deadlocking on joining its own thread), or null.
thread_local const void* current_committer = nullptr;

// Makes the store's write-ahead log durable without going through RocksDB's writer: the
// pipelined commit's syncer fdatasyncs the log files (RocksDB has handed every write to
// the OS before Write returns, manual_wal_flush being off). DB::SyncWAL would do the same,
// but it may not run after a failed write (see the top of this file), and with writes
// going on beside it a write can fail at any moment. Keeps the files open between syncs
// and fsyncs the folder when a new log file appears (so that the file itself survives).
class WalSyncer {
 public:
  explicit WalSyncer(std::string dir) : dir_(std::move(dir)) {}
  ~WalSyncer() {
    for (auto& [name, fd] : fds_) close(fd);
  }
  WalSyncer(const WalSyncer&) = delete;
  WalSyncer& operator=(const WalSyncer&) = delete;

  absl::Status Sync() {
    std::error_code ec;
    std::vector<std::string> present;
    bool fresh = false;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() != ".log") continue;
      std::string name = it->path().filename().string();
      present.push_back(name);
      if (fds_.count(name) > 0) continue;
      const int fd = open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Error("opening", it->path().string());
      fds_.emplace(std::move(name), fd);
      fresh = true;
    }
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("listing store directory ", Quoted(dir_), ": ", ec.message()));
    }
    for (auto it = fds_.begin(); it != fds_.end();) {  // logs RocksDB has deleted
      if (std::find(present.begin(), present.end(), it->first) == present.end()) {
        close(it->second);
        it = fds_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [name, fd] : fds_) {
      if (fdatasync(fd) != 0) return Error("syncing", dir_ + "/" + name);
    }
    if (fresh) {
      const int dfd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd < 0) return Error("opening", dir_);
      const bool synced = fsync(dfd) == 0;
      const int err = errno;
      close(dfd);
      if (!synced) {
        errno = err;
        return Error("syncing", dir_);
      }
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Error(absl::string_view what, const std::string& path) {
    return absl::UnavailableError(absl::StrCat(what, " ", Quoted(path), ": ", strerror(errno)));
  }
  const std::string dir_;
  std::map<std::string, int> fds_;
};

// One accepted Commit(): its batch encoded into `buf` (keys and values back to back).
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

absl::Status CheckMarker(rocksdb::DB& db, const std::string& path, bool created);

// A database as OpenRocksDbStore opened it, for the store.
struct OpenedDb {
  std::unique_ptr<rocksdb::DB> db;
  // The options it was opened with (info log and listener included), to reopen it.
  rocksdb::Options rocks;
  std::shared_ptr<ErrorListener> listener;
  // Opened with DB::OpenForReadOnly, because the disk was full.
  bool read_only = false;
  // The database's LOCK file, held by the store while read-only (a read-write database
  // holds its own).
  rocksdb::FileLock* lock = nullptr;
  // Free bytes at the open.
  std::optional<uint64_t> free_bytes;
};

// Opens the existing (or, with `create`, new) database at options.path with `rocks` (info
// log and listener set) and checks its marker: for writing, or read-only when
// `below_reserve` or when opening for writing fails for lack of space (never when
// creating). Fills opened.db, read_only and lock. Errors name the path.
absl::StatusOr<OpenedDb> OpenDb(rocksdb::Options rocks, const RocksDbStoreOptions& options,
                                bool create, bool below_reserve, std::optional<uint64_t> free_bytes,
                                bool verify_checksums) {
  OpenedDb opened;
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

class RocksDbStore final : public Store, public Replicable {
 public:
  RocksDbStore(RocksDbStoreOptions options, OpenedDb opened)
      : options_(std::move(options)),
        rocks_options_(std::move(opened.rocks)),
        listener_(std::move(opened.listener)),
        probe_bytes_(options_.min_free_bytes / 8),
        db_(std::move(opened.db)),
        read_only_(opened.read_only),
        lock_(opened.lock) {
    pipelined_ = options_.durability == Durability::kSync && options_.pipeline;
    write_options_.sync = options_.durability == Durability::kSync && !pipelined_;
    free_bytes_ = opened.free_bytes;
    last_probe_ = std::chrono::steady_clock::now();
    low_space_ = IsLow(free_bytes_);
    free_bytes_stat_.store(free_bytes_.value_or(kUnknownFree), std::memory_order_relaxed);
    writable_stat_.store(Writable(), std::memory_order_relaxed);
    committer_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "sbx-commit");
      current_committer = this;
      CommitterLoop();
      current_committer = nullptr;
    });
    if (pipelined_) {
      syncer_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "sbx-sync");
        current_committer = this;  // commit callbacks run here
        SyncerLoop();
        current_committer = nullptr;
      });
    }
  }

  ~RocksDbStore() override { ReportDropped("store.close_at_destruction", Close()); }

  RocksDbStore(const RocksDbStore&) = delete;
  RocksDbStore& operator=(const RocksDbStore&) = delete;

  void Commit(WriteBatch batch, CommitCallback done) override ABSL_LOCKS_EXCLUDED(mu_) {
    Request req;
    req.status = CheckBatch(batch);
    if (req.status.ok()) Encode(batch, &req);
    req.sync = batch.sync();
    req.done = std::move(done);
    {
      absl::MutexLock lock(&mu_);
      if (!closing_) {
        queue_.push_back(std::move(req));
        return;
      }
    }
    // The committer is stopping or gone: fail on the caller's thread.
    std::move(req.done)(absl::FailedPreconditionError(
        absl::StrCat("store at ", Quoted(options_.path), " is closed; commit refused")));
  }

  absl::StatusOr<Contents> LoadAll() override ABSL_LOCKS_EXCLUDED(db_mu_) {
    absl::ReaderMutexLock lock(&db_mu_);
    if (db_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "LoadAll on store at ", Quoted(options_.path), ", which is closed or lost its database"));
    }
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    ro.fill_cache = false;  // read once at start-up; do not evict anything for it
    ro.readahead_size = 4 << 20;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    Contents contents;
    // Reserve room for the bulky kinds up front: growing a vector of a million records
    // would copy it repeatedly and touch twice the memory (page faults dominate recovery
    // time on some virtual machines). The estimate counts all keys, so it over-reserves
    // each kind; capacity that is never written costs address space, not memory.
    uint64_t estimate = 0;
    if (db_->GetIntProperty("rocksdb.estimate-num-keys", &estimate)) {
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
        return absl::DataLossError(
            absl::StrCat("store at ", Quoted(options_.path), ": ", s.message()));
      }
    }
    RETURN_IF_ERROR(
        FromRocks(it->status(), absl::StrCat("reading store at ", Quoted(options_.path))));
    return contents;
  }

  absl::Status Close() override ABSL_LOCKS_EXCLUDED(close_mu_, mu_, db_mu_) {
    if (current_committer == this) {
      return absl::FailedPreconditionError(absl::StrCat("Close of store at ", Quoted(options_.path),
                                                        " called from a commit callback"));
    }
    absl::MutexLock close_lock(&close_mu_);
    if (closed_) return close_status_;
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    committer_.join();  // it drains the queue before it exits
    if (syncer_.joinable()) {
      {
        absl::MutexLock lock(&sync_mu_);
        sync_closing_ = true;
      }
      syncer_.join();  // it answers every group the committer wrote
    }
    // The committer's state (read_only_, rocks_error_, low_space_) is final now: join()
    // orders its last writes before these reads.
    absl::Status status;
    {
      absl::WriterMutexLock lock(&db_mu_);
      const bool healthy = rocks_error_.ok() && !listener_->pending();
      if (db_ == nullptr) {
        // A reopen after a write error failed; its error was logged then.
      } else if (!read_only_ && healthy) {
        if (options_.durability == Durability::kBuffered) {
          status.Update(FromRocks(db_->SyncWAL(),
                                  absl::StrCat("syncing the log of ", Quoted(options_.path))));
        }
        // Flushing the memtable now means the next start reads tables, not the log. Not
        // below the reserve: the flush could fill the disk, and the log has it all anyway.
        if (!low_space_) {
          status.Update(FromRocks(db_->Flush(rocksdb::FlushOptions()),
                                  absl::StrCat("flushing store at ", Quoted(options_.path))));
        }
      }
      if (db_ != nullptr && !read_only_ && !healthy &&
          options_.durability == Durability::kBuffered) {
        // After a write error SyncWAL would abort (see the top of this file); the log files
        // hold every acknowledged commit, so sync them directly.
        status.Update(SyncLogFiles(options_.path));
      }
      rocksdb::Status closed = db_ != nullptr ? db_->Close() : rocksdb::Status::OK();
      if (!healthy && !closed.ok()) {
        // Expected after a write error: RocksDB reports that the failed log's writer was
        // closed with its error. The log was synced (or is synced per write), so it holds
        // every acknowledged commit.
        spdlog::warn("store at \"{}\" closed after a write error: {}", options_.path,
                     closed.ToString());
      } else {
        status.Update(FromRocks(closed, absl::StrCat("closing store at ", Quoted(options_.path))));
      }
      db_.reset();
      if (lock_ != nullptr) {
        rocks_options_.env->UnlockFile(lock_).PermitUncheckedError();
        lock_ = nullptr;
      }
    }
    closed_ = true;
    close_status_ = status;
    return status;
  }

  StoreStats Stats() const override {
    StoreStats s;
    s.commits = commits_.load(std::memory_order_relaxed);
    s.write_batches = write_batches_.load(std::memory_order_relaxed);
    s.syncs = syncs_.load(std::memory_order_relaxed);
    s.committer_busy_seconds =
        static_cast<double>(busy_nanos_.load(std::memory_order_relaxed)) / 1e9;
    s.syncer_busy_seconds =
        static_cast<double>(sync_busy_nanos_.load(std::memory_order_relaxed)) / 1e9;
    s.write_seconds = write_seconds_.Snapshot();
    s.group_commits = group_commits_.Snapshot();
    s.writable = writable_stat_.load(std::memory_order_relaxed);
    const uint64_t free = free_bytes_stat_.load(std::memory_order_relaxed);
    if (free != kUnknownFree) s.free_bytes = free;
    s.min_free_bytes = options_.min_free_bytes;
    return s;
  }

  // --- Replicable ---

  void SetShipper(GroupShipper* shipper) override ABSL_LOCKS_EXCLUDED(ship_mu_) {
    absl::MutexLock lock(&ship_mu_);
    shipper_ = shipper;
  }

  absl::Status Snapshot(absl::FunctionRef<void()> at,
                        absl::FunctionRef<void(absl::string_view, absl::string_view)> each) override
      ABSL_LOCKS_EXCLUDED(ship_mu_, db_mu_) {
    ship_mu_.Lock();
    absl::ReaderMutexLock lock(&db_mu_);
    if (db_ == nullptr) {
      ship_mu_.Unlock();
      return Closed("Snapshot");
    }
    const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
    at();
    ship_mu_.Unlock();
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot;
    ro.verify_checksums = true;
    ro.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (codec::IsReplicatedKey(View(it->key()))) each(View(it->key()), View(it->value()));
    }
    absl::Status status =
        FromRocks(it->status(), absl::StrCat("reading a snapshot of ", Quoted(options_.path)));
    it.reset();
    db_->ReleaseSnapshot(snapshot);
    return status;
  }

  absl::StatusOr<std::optional<ReplicaMarker>> ReadMarker() override ABSL_LOCKS_EXCLUDED(db_mu_) {
    absl::ReaderMutexLock lock(&db_mu_);
    if (db_ == nullptr) return Closed("ReadMarker");
    std::string value;
    rocksdb::Status s =
        db_->Get(rocksdb::ReadOptions(),
                 rocksdb::Slice(codec::kReplicaKey.data(), codec::kReplicaKey.size()), &value);
    if (s.IsNotFound()) return std::optional<ReplicaMarker>();
    RETURN_IF_ERROR(
        FromRocks(s, absl::StrCat("reading the replica marker of ", Quoted(options_.path))));
    absl::StatusOr<ReplicaMarker> marker = codec::DecodeReplicaMarker(value);
    if (!marker.ok()) {
      return absl::DataLossError(
          absl::StrCat("store at ", Quoted(options_.path), ": ", marker.status().message()));
    }
    return std::optional<ReplicaMarker>(*std::move(marker));
  }

  absl::Status WriteMarker(const ReplicaMarker& marker) override ABSL_LOCKS_EXCLUDED(db_mu_) {
    rocksdb::WriteBatch batch;
    batch.Put(Key(codec::kReplicaKey), codec::EncodeReplicaMarker(marker));
    return WriteSynced(batch, "writing the replica marker");
  }

  absl::Status BeginLoad(const ReplicaMarker& marker) override ABSL_LOCKS_EXCLUDED(db_mu_) {
    rocksdb::WriteBatch batch;
    for (absl::string_view prefix :
         {codec::kTemplatePrefix, codec::kPoolPrefix, codec::kSandboxPrefix, codec::kClaimPrefix,
          codec::kSnapshotPrefix}) {
      std::string end(prefix);
      end.back() = static_cast<char>(end.back() + 1);  // "c/" .. "c0": every key of the kind
      batch.DeleteRange(Key(prefix), end);
    }
    batch.Delete(Key(codec::kRevisionKey));
    ReplicaMarker loading = marker;
    loading.complete = false;
    batch.Put(Key(codec::kReplicaKey), codec::EncodeReplicaMarker(loading));
    return WriteSynced(batch, "clearing the store for a snapshot");
  }

  absl::Status LoadEntries(const std::vector<std::pair<std::string, std::string>>& entries) override
      ABSL_LOCKS_EXCLUDED(db_mu_) {
    rocksdb::WriteBatch batch;
    for (const auto& [key, value] : entries) {
      if (!codec::IsReplicatedKey(key)) {
        return absl::InvalidArgumentError(absl::StrCat("snapshot entry \"", absl::CHexEscape(key),
                                                       "\" is not a record of an sbx store"));
      }
      batch.Put(key, value);
    }
    absl::ReaderMutexLock lock(&db_mu_);
    if (db_ == nullptr) return Closed("LoadEntries");
    return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch),
                     absl::StrCat("loading a snapshot into ", Quoted(options_.path)));
  }

  absl::Status ApplyGroup(absl::string_view group) override ABSL_LOCKS_EXCLUDED(db_mu_) {
    rocksdb::WriteBatch batch{std::string(group)};
    // Only puts and deletes of records, in the default column family: what a leader's
    // committer writes. Anything else (another store's marker, a range delete, bytes that
    // are no write batch) is refused whole.
    class Check final : public rocksdb::WriteBatch::Handler {
     public:
      rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key,
                            const rocksdb::Slice&) override {
        return Allowed(cf, key);
      }
      rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
        return Allowed(cf, key);
      }
      static rocksdb::Status Allowed(uint32_t cf, const rocksdb::Slice& key) {
        if (cf == 0 && codec::IsReplicatedKey(View(key))) return rocksdb::Status::OK();
        return rocksdb::Status::InvalidArgument(
            absl::StrCat("entry \"", absl::CHexEscape(View(key)), "\" is not a record"));
      }
    } check;
    if (rocksdb::Status s = batch.Iterate(&check); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("shipped group refused: ", s.ToString()));
    }
    return WriteSynced(batch, "applying a shipped group");
  }

 private:
  static rocksdb::Slice Key(absl::string_view key) { return {key.data(), key.size()}; }

  absl::Status Closed(absl::string_view what) const {
    return absl::FailedPreconditionError(absl::StrCat(what, " on store at ", Quoted(options_.path),
                                                      ", which is closed or lost its database"));
  }

  absl::Status WriteSynced(rocksdb::WriteBatch& batch, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(db_mu_) {
    absl::ReaderMutexLock lock(&db_mu_);
    if (db_ == nullptr) return Closed(what);
    rocksdb::WriteOptions synced;
    synced.sync = true;
    return FromRocks(db_->Write(synced, &batch), absl::StrCat(what, " in ", Quoted(options_.path)));
  }

  static void Encode(const WriteBatch& batch, Request* req) {
    req->ops.reserve(batch.size());
    for (const Mutation& m : batch.mutations()) {
      Request::Op op;
      op.key_begin = req->buf.size();
      codec::AppendKey(m.kind, m.key, &req->buf);
      op.key_size = req->buf.size() - op.key_begin;
      if (std::holds_alternative<std::monostate>(m.record)) {
        op.value_size = Request::kDelete;
      } else {
        const size_t value_begin = req->buf.size();
        codec::EncodeValue(m, &req->buf);
        op.value_size = req->buf.size() - value_begin;
      }
      req->ops.push_back(op);
    }
  }

  void CommitterLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Request> group;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        // Wakes at least every check interval, so that an idle store still notices the
        // disk filling up or freeing (for Stats()) and retries after an error.
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](RocksDbStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                                   return !s->queue_.empty() || s->closing_;
                                 },
                                 this),
                             options_.free_space_check_interval);
        if (queue_.empty() && closing_) return;  // everything accepted is done
        size_t bytes = 0;
        size_t mutations = 0;
        while (!queue_.empty()) {
          Request& next = queue_.front();
          if (!group.empty() && (bytes + next.buf.size() > options_.max_group_bytes ||
                                 mutations + next.ops.size() > options_.max_group_mutations)) {
            break;
          }
          bytes += next.buf.size();
          mutations += next.ops.size();
          group.push_back(std::move(next));
          queue_.pop_front();
        }
      }
      if (group.empty()) {
        Refresh(0);  // the wait timed out
        continue;
      }
      const auto busy_from = std::chrono::steady_clock::now();
      WriteGroup(group);
      group.clear();
      busy_nanos_.fetch_add(
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - busy_from)
                                    .count()),
          std::memory_order_relaxed);
    }
  }

  void WriteGroup(std::vector<Request>& group) ABSL_LOCKS_EXCLUDED(db_mu_) {
    batch_.Clear();  // reused: keeps its buffer's capacity between groups
    for (const Request& req : group) {
      if (!req.status.ok()) continue;
      for (const Request::Op& op : req.ops) {
        const rocksdb::Slice key(req.buf.data() + op.key_begin, op.key_size);
        if (op.value_size == Request::kDelete) {
          batch_.Delete(key);
        } else {
          batch_.Put(key,
                     rocksdb::Slice(req.buf.data() + op.key_begin + op.key_size, op.value_size));
        }
      }
    }
    absl::Status result;
    WrittenGroup written;
    bool group_sync = false;
    for (const Request& req : group) group_sync = group_sync || (req.status.ok() && req.sync);
    if (batch_.Count() > 0) Refresh(batch_.GetDataSize());
    if (batch_.Count() > 0 && !Writable()) {
      result = Refusal(group.size());
    } else if (batch_.Count() > 0) {
      rocksdb::Status s;
      const auto start = std::chrono::steady_clock::now();
      GroupShipper* shipper = nullptr;
      uint64_t ticket = 0;
      absl::Status refused;
      {
        // Ship and write under one lock, so that a Snapshot sees a shipped group written.
        absl::MutexLock ship_lock(&ship_mu_);
        shipper = shipper_;
        // Shipped before the write: the standby's write and sync overlap with ours.
        if (shipper != nullptr) {
          absl::StatusOr<uint64_t> shipped = shipper->Ship(std::string(View(batch_.Data())));
          if (shipped.ok()) {
            ticket = *shipped;
          } else {
            // Not acknowledgeable now (a leader that keeps two copies and has no standby in
            // sync): not written either, so this store holds nothing its callers were told
            // failed, as with a refusal for want of space.
            refused = shipped.status();
            shipper = nullptr;
          }
        }
        if (refused.ok()) {
          // Shared: only keeps Close() from freeing the database during the write.
          absl::ReaderMutexLock lock(&db_mu_);
          s = db_->Write(group_sync ? write_options_ : unsynced_options_, &batch_);
        }
      }
      if (!refused.ok()) {
        result = refused;  // nothing written, nothing counted
      } else {
        if (shipper != nullptr && !s.ok()) shipper->LocalWriteFailed(ticket);
        if (pipelined_) {
          written.written = s.ok();
          written.needs_sync = s.ok() && group_sync;
          written.shipper = s.ok() ? shipper : nullptr;
          written.ticket = ticket;
          written.start = start;
        }
        if (!pipelined_ && shipper != nullptr && s.ok()) {
          if (absl::Status replicated = shipper->AwaitReplicated(ticket); !replicated.ok()) {
            result = replicated;
          }
        }
        if (!pipelined_) {
          write_seconds_.Observe(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        group_commits_.Observe(static_cast<double>(group.size()));
        write_batches_.fetch_add(1, std::memory_order_relaxed);
        if (write_options_.sync && group_sync) syncs_.fetch_add(1, std::memory_order_relaxed);
        if (!s.ok()) {
          // Whatever failed, the committer reopens the database at its next check (Refresh).
          rocks_error_ = s;
          free_bytes_ = FreeBytes(options_.path);
          PublishState();
          result = FromRocks(
              s, absl::StrCat("group write of ", group.size(), " commits to store at ",
                              Quoted(options_.path), " failed (", FreeText(free_bytes_), ")"));
        }
      }
    }
    if (pipelined_) {
      written.result = result;
      written.generation = generation_;
      written.requests = std::move(group);
      group.clear();
      absl::MutexLock lock(&sync_mu_);
      sync_queue_.push_back(std::move(written));
      return;
    }
    // Counted before the callbacks, so that a caller woken by its callback sees its commit.
    commits_.fetch_add(group.size(), std::memory_order_relaxed);
    for (Request& req : group) {
      std::move(req.done)(req.status.ok() ? result : std::move(req.status));
    }
  }

  // The pipelined commit's second half: syncs the log once for every group written so far,
  // then answers them in order (after the standby, with replication). A failed sync fails
  // its groups and every later group written to the same database (the kernel may have
  // dropped the pages: nothing after it is trusted), and makes the committer reopen.
  void SyncerLoop() ABSL_LOCKS_EXCLUDED(sync_mu_) {
    WalSyncer wal(options_.path);
    uint64_t broken_generation = 0;
    bool broken = false;
    std::deque<WrittenGroup> groups;
    while (true) {
      {
        absl::MutexLock lock(&sync_mu_);
        sync_mu_.Await(absl::Condition(
            +[](RocksDbStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->sync_mu_) {
              return !s->sync_queue_.empty() || s->sync_closing_;
            },
            this));
        if (sync_queue_.empty()) return;  // closing, and everything is answered
        groups.swap(sync_queue_);
      }
      const auto busy_from = std::chrono::steady_clock::now();
      absl::Status synced;
      bool any = false;
      for (const WrittenGroup& g : groups) any = any || g.needs_sync;
      if (any) {
        synced = wal.Sync();
        syncs_.fetch_add(1, std::memory_order_relaxed);
        if (!synced.ok()) {
          broken = true;
          broken_generation = 0;
          for (const WrittenGroup& g : groups) {
            broken_generation = std::max(broken_generation, g.generation);
          }
          spdlog::error("store at \"{}\": {}; the store reopens its database", options_.path,
                        synced.ToString());
          absl::MutexLock lock(&sync_mu_);
          sync_error_ = synced;
        }
      }
      const auto synced_at = std::chrono::steady_clock::now();
      for (WrittenGroup& g : groups) {
        absl::Status result = g.result;
        if (g.written && broken && g.generation <= broken_generation) {
          result = absl::UnavailableError(absl::StrCat(
              "group commit to store at ", Quoted(options_.path),
              " not made durable: ", synced.ok() ? "an earlier sync failed" : synced.message()));
          if (g.shipper != nullptr) g.shipper->LocalWriteFailed(g.ticket);
        } else if (g.needs_sync && g.shipper != nullptr) {
          // A group answered without a sync of its own is not waited for on the standby
          // either: a later synced group's acknowledgement covers it.
          if (absl::Status replicated = g.shipper->AwaitReplicated(g.ticket); !replicated.ok()) {
            result = replicated;
          }
        }
        if (g.written) {
          write_seconds_.Observe(std::chrono::duration<double>(synced_at - g.start).count());
        }
        commits_.fetch_add(g.requests.size(), std::memory_order_relaxed);
        for (Request& req : g.requests) {
          std::move(req.done)(req.status.ok() ? result : std::move(req.status));
        }
      }
      groups.clear();
      sync_busy_nanos_.fetch_add(
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - busy_from)
                                    .count()),
          std::memory_order_relaxed);
    }
  }

  // --- Free space and recovery; committer thread only (and the constructor). ---

  static constexpr uint64_t kUnknownFree = ~uint64_t{0};

  bool IsLow(std::optional<uint64_t> free) const {
    return options_.min_free_bytes > 0 && free.has_value() && *free < options_.min_free_bytes;
  }
  bool Writable() const { return !read_only_ && !low_space_ && rocks_error_.ok(); }

  // Before a group's write of `bytes` (0: the committer woke with nothing to write): checks
  // the free space when due, takes RocksDB's background errors in, and tries to recover
  // (at most once per check) when writes are refused and the space allows.
  void Refresh(size_t bytes) {
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
    if (pipelined_) {
      absl::MutexLock lock(&sync_mu_);
      if (!sync_error_.ok()) {
        if (rocks_error_.ok())
          rocks_error_ = rocksdb::Status::IOError(std::string(sync_error_.message()));
        sync_error_ = absl::OkStatus();
        PublishState();
      }
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

  // Closes the database and opens it again, as a restart would: for writing if it can,
  // else read-only (then the next check tries again), else the store stays without a
  // database and refuses writes with the error. Why not DB::Resume(): see the top of this
  // file.
  void Reopen() ABSL_LOCKS_EXCLUDED(db_mu_) {
    // Exclusive for the whole swap, so that LoadAll (at start-up, possibly racing with a
    // reopen when space returns at once) waits for the new database instead of finding none.
    absl::WriterMutexLock lock(&db_mu_);
    if (db_ != nullptr) {
      // After a write error this reports the failed log's writer; what that writer wrote
      // before the error (every acknowledged commit) is in the log file.
      rocksdb::Status closed = db_->Close();
      if (!closed.ok() && !read_only_) {
        spdlog::info("store at \"{}\": closing after the write error: {}", options_.path,
                     closed.ToString());
      }
      db_.reset();
    }
    if (lock_ != nullptr) {
      rocks_options_.env->UnlockFile(lock_).PermitUncheckedError();
      lock_ = nullptr;
    }
    listener_->Take();  // errors of the closed database
    const bool was_read_only = read_only_;
    absl::StatusOr<OpenedDb> opened =
        OpenDb(rocks_options_, options_, /*create=*/false, /*below_reserve=*/false, free_bytes_,
               /*verify_checksums=*/false);
    if (!opened.ok()) {
      rocks_error_ = rocksdb::Status::IOError(std::string(opened.status().message()));
      read_only_ = false;
      NoteRecoveryFailure(opened.status().ToString());
      return;
    }
    read_only_ = opened->read_only;
    lock_ = opened->lock;
    db_ = std::move(opened->db);
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
  void NoteRecoveryFailure(const std::string& error) {
    if (error == last_recovery_error_) return;
    last_recovery_error_ = error;
    spdlog::warn("store at \"{}\" still refuses writes ({}): {}", options_.path,
                 FreeText(free_bytes_), error);
  }

  // The status of a group refused without a write.
  absl::Status Refusal(size_t commits) const {
    const std::string head =
        absl::StrCat("store at ", Quoted(options_.path), " refuses writes",
                     commits > 0 ? absl::StrCat(" (", commits, " commits)") : "", ": ",
                     FreeText(free_bytes_), " on its file system");
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
  void PublishState() {
    const bool writable = Writable();
    free_bytes_stat_.store(free_bytes_.value_or(kUnknownFree), std::memory_order_relaxed);
    if (writable_stat_.exchange(writable, std::memory_order_relaxed) == writable) return;
    if (writable) {
      spdlog::info("store at \"{}\" accepts writes again ({})", options_.path,
                   FreeText(free_bytes_));
      last_recovery_error_.clear();
    } else {
      spdlog::warn("{}", std::string(Refusal(0).message()));
    }
  }

  const RocksDbStoreOptions options_;
  rocksdb::WriteOptions write_options_;     // set in the constructor, then read-only
  rocksdb::WriteOptions unsynced_options_;  // for groups of WriteBatch::sync() false only
  rocksdb::Options rocks_options_;          // for Reopen
  const std::shared_ptr<ErrorListener> listener_;
  const uint64_t probe_bytes_;  // check the free space after this many bytes written

  // Guards the lifetime of db_: held shared while reading or writing through it, exclusive
  // only by Close() to close and free it. Never contended on the commit path (the committer
  // is the only writer, and LoadAll runs at start-up).
  mutable absl::Mutex db_mu_ ABSL_ACQUIRED_AFTER(close_mu_);
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(db_mu_);

  // Held by the committer from shipping a group to its write, and by Snapshot() while it
  // takes its snapshot. Taken before db_mu_.
  absl::Mutex ship_mu_ ABSL_ACQUIRED_BEFORE(db_mu_);
  GroupShipper* shipper_ ABSL_GUARDED_BY(ship_mu_) = nullptr;

  absl::Mutex mu_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;

  // Only the committer thread touches these (and the constructor, and Close() after
  // joining the committer).
  rocksdb::WriteBatch batch_;
  bool read_only_;
  rocksdb::FileLock* lock_;
  std::optional<uint64_t> free_bytes_;  // at the last check
  bool low_space_ = false;              // free_bytes_ below min_free_bytes
  rocksdb::Status rocks_error_;         // RocksDB's error since the last recovery
  std::chrono::steady_clock::time_point last_probe_;
  uint64_t bytes_since_probe_ = 0;
  std::string last_recovery_error_;  // logged once until it changes

  std::thread committer_;

  // The pipelined commit (RocksDbStoreOptions::pipeline): the committer hands written
  // groups to the syncer thread through sync_queue_; a failed sync is handed back through
  // sync_error_ (the committer reopens).
  bool pipelined_ = false;   // set in the constructor, then read-only
  uint64_t generation_ = 0;  // committer only: database reopens
  std::thread syncer_;
  absl::Mutex sync_mu_;
  std::deque<WrittenGroup> sync_queue_ ABSL_GUARDED_BY(sync_mu_);
  bool sync_closing_ ABSL_GUARDED_BY(sync_mu_) = false;
  absl::Status sync_error_ ABSL_GUARDED_BY(sync_mu_);

  absl::Mutex close_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(close_mu_);

  // Statistics. Atomic so that Stats() reads them from any thread without a lock on the
  // commit path; only the committer thread writes them. Relaxed order suffices: they are
  // independent counters, and a caller that needs its own commit counted synchronizes
  // with the committer through that commit's callback, which runs after the increment.
  std::atomic<uint64_t> commits_{0};
  std::atomic<uint64_t> write_batches_{0};
  std::atomic<uint64_t> syncs_{0};
  std::atomic<uint64_t> busy_nanos_{0};       // committer_busy_seconds, in nanoseconds
  std::atomic<uint64_t> sync_busy_nanos_{0};  // syncer_busy_seconds, in nanoseconds
  // Observed by the committer only; read by Stats() (lock-free, see histogram.h).
  AtomicHistogram write_seconds_{CommitLatencyBuckets()};
  AtomicHistogram group_commits_{GroupSizeBuckets()};
  // Copies of the committer's Writable() and free_bytes_ (kUnknownFree for nullopt) for
  // Stats(), read at scrape time. Relaxed, as the counters: each is a value on its own.
  std::atomic<bool> writable_stat_{true};
  std::atomic<uint64_t> free_bytes_stat_{kUnknownFree};
};

// Classifies options.path. Sets *create when the database is to be created (the path is
// missing, or an empty directory); refuses anything else that is not a RocksDB database.
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
  RETURN_IF_ERROR(CheckPath(options.path, &create));

  const std::optional<uint64_t> free_bytes = FreeBytes(options.path);
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
  rocksdb::Options rocks = MakeRocksOptions(options);
  rocks.info_log = std::make_shared<InfoLog>(options.path);
  auto listener = std::make_shared<ErrorListener>();
  rocks.listeners.push_back(listener);
  absl::StatusOr<OpenedDb> opened =
      OpenDb(rocks, options, create, below_reserve, free_bytes, options.verify_checksums_on_open);
  if (!opened.ok()) return opened.status();
  opened->rocks = std::move(rocks);
  opened->listener = std::move(listener);
  opened->free_bytes = free_bytes;
  return std::unique_ptr<Store>(std::make_unique<RocksDbStore>(options, *std::move(opened)));
}

}  // namespace sbx::store
