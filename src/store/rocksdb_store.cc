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

#include "src/store/rocksdb_store.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/status.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "src/common/status_macros.h"
#include "src/store/batch_check.h"
#include "src/store/record_codec.h"

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
  // Keep RocksDB's own info log (in the database directory) small.
  r.max_log_file_size = 4 << 20;
  r.keep_log_file_num = 3;
  return r;
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
  CommitCallback done;
};

class RocksDbStore final : public Store {
 public:
  RocksDbStore(RocksDbStoreOptions options, std::unique_ptr<rocksdb::DB> db)
      : options_(std::move(options)), db_(std::move(db)) {
    write_options_.sync = options_.durability == Durability::kSync;
    committer_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "sbx-commit");
      current_committer = this;
      CommitterLoop();
      current_committer = nullptr;
    });
  }

  ~RocksDbStore() override { Close().IgnoreError(); }

  RocksDbStore(const RocksDbStore&) = delete;
  RocksDbStore& operator=(const RocksDbStore&) = delete;

  void Commit(WriteBatch batch, CommitCallback done) override ABSL_LOCKS_EXCLUDED(mu_) {
    Request req;
    req.status = CheckBatch(batch);
    if (req.status.ok()) Encode(batch, &req);
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
      return absl::FailedPreconditionError(
          absl::StrCat("LoadAll on closed store at ", Quoted(options_.path)));
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
    absl::Status status;
    {
      absl::WriterMutexLock lock(&db_mu_);
      if (options_.durability == Durability::kBuffered) {
        status.Update(
            FromRocks(db_->SyncWAL(), absl::StrCat("syncing the log of ", Quoted(options_.path))));
      }
      // Flushing the memtable now means the next start reads tables, not the log.
      status.Update(FromRocks(db_->Flush(rocksdb::FlushOptions()),
                              absl::StrCat("flushing store at ", Quoted(options_.path))));
      status.Update(
          FromRocks(db_->Close(), absl::StrCat("closing store at ", Quoted(options_.path))));
      db_.reset();
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
    s.write_seconds = write_seconds_.Snapshot();
    s.group_commits = group_commits_.Snapshot();
    return s;
  }

 private:
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
        mu_.Await(absl::Condition(
            +[](RocksDbStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
              return !s->queue_.empty() || s->closing_;
            },
            this));
        if (queue_.empty()) return;  // closing, and everything accepted is done
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
      WriteGroup(group);
      group.clear();
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
    if (batch_.Count() > 0) {
      rocksdb::Status s;
      const auto start = std::chrono::steady_clock::now();
      {
        // Shared: only keeps Close() from freeing the database during the write.
        absl::ReaderMutexLock lock(&db_mu_);
        s = db_->Write(write_options_, &batch_);
      }
      write_seconds_.Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      group_commits_.Observe(static_cast<double>(group.size()));
      write_batches_.fetch_add(1, std::memory_order_relaxed);
      if (write_options_.sync) syncs_.fetch_add(1, std::memory_order_relaxed);
      result = FromRocks(s, absl::StrCat("group write of ", group.size(), " commits to store at ",
                                         Quoted(options_.path)));
    }
    // Counted before the callbacks, so that a caller woken by its callback sees its commit.
    commits_.fetch_add(group.size(), std::memory_order_relaxed);
    for (Request& req : group) {
      std::move(req.done)(req.status.ok() ? result : std::move(req.status));
    }
  }

  const RocksDbStoreOptions options_;
  rocksdb::WriteOptions write_options_;  // set in the constructor, then read-only

  // Guards the lifetime of db_: held shared while reading or writing through it, exclusive
  // only by Close() to close and free it. Never contended on the commit path (the committer
  // is the only writer, and LoadAll runs at start-up).
  mutable absl::Mutex db_mu_ ABSL_ACQUIRED_AFTER(close_mu_);
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(db_mu_);

  absl::Mutex mu_;
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;

  // Only the committer thread touches it.
  rocksdb::WriteBatch batch_;

  std::thread committer_;

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
  // Observed by the committer only; read by Stats() (lock-free, see histogram.h).
  AtomicHistogram write_seconds_{CommitLatencyBuckets()};
  AtomicHistogram group_commits_{GroupSizeBuckets()};
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

  rocksdb::Options rocks = MakeRocksOptions(options);
  rocks.create_if_missing = create;
  rocks.error_if_exists = create;  // lost a race with someone creating it: refuse
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(rocks, options.path, &raw);
  if (!s.ok()) return FromRocksOpen(s, options.path);
  std::unique_ptr<rocksdb::DB> db(raw);
  absl::Status checked;
  if (options.verify_checksums_on_open) {
    // Reads every table block once and checks its checksum (about 60 ms per million
    // records from the page cache): damage inside a table file refuses the open, rather
    // than surfacing in LoadAll.
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    ro.readahead_size = 4 << 20;
    checked = FromRocksOpen(db->VerifyChecksum(ro), options.path);
  }
  if (checked.ok()) checked = CheckMarker(*db, options.path, create);
  if (!checked.ok()) {
    db->Close().PermitUncheckedError();
    return checked;
  }
  return std::unique_ptr<Store>(std::make_unique<RocksDbStore>(options, std::move(db)));
}

}  // namespace sbx::store
