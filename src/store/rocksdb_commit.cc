// The store's group commit (rocksdb_commit.h).
//
// Pipelined commit (kSync with options.pipeline, the default). The committer writes each
// group without a sync and hands it to the syncer thread, then takes the next group at
// once; the syncer fdatasyncs the log files itself (WalSyncer: RocksDB has given every
// write to the OS when Write returns) once for every group written since its last sync,
// then waits for the standby (replication) and runs the groups' callbacks in order. A
// commit thus waits for the rest of the sync in progress and its own, not for the write,
// sync and callbacks of the group before it. Not DB::SyncWAL: it may not run after a
// failed write (docs/architecture.md, "A full disk"), and with writes going on beside it
// one can fail at any moment. A failed sync fails its groups and every later one written
// to the same database, and the committer reopens (as after a failed write).

#include "src/store/rocksdb_commit.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/store/batch_check.h"
#include "src/store/record_codec.h"
#include "src/store/rocksdb_common.h"

namespace sbx::store::internal {
namespace {

namespace fs = std::filesystem;

// The committer whose committer or syncer runs on this thread (so that Close() from a
// callback is refused instead of deadlocking on joining its own thread), or null.
thread_local const void* current_committer = nullptr;

// Makes the store's write-ahead log durable without going through RocksDB's writer: the
// pipelined commit's syncer fdatasyncs the log files (RocksDB has handed every write to
// the OS before Write returns, manual_wal_flush being off). DB::SyncWAL would do the same,
// but it may not run after a failed write (docs/architecture.md, "A full disk"), and with writes
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
    return absl::UnavailableError(
        absl::StrCat(what, " ", Quoted(path), ": ", sbx::ErrnoText(errno)));
  }
  const std::string dir_;
  std::map<std::string, int> fds_;
};

uint64_t NanosSince(std::chrono::steady_clock::time_point from) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - from)
          .count());
}

}  // namespace

absl::Status SyncLogFiles(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".log") continue;
    const int fd = open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fdatasync(fd) != 0) {
      const int err = errno;
      if (fd >= 0) close(fd);
      return absl::UnavailableError(
          absl::StrCat("syncing ", Quoted(it->path().string()), ": ", sbx::ErrnoText(err)));
    }
    close(fd);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("listing store directory ", Quoted(dir), ": ", ec.message()));
  }
  return absl::OkStatus();
}

GroupCommitter::GroupCommitter(const RocksDbStoreOptions& options, Database* database,
                               SpaceKeeper* space, ReplicationHooks* hooks)
    : options_(options),
      database_(database),
      space_(space),
      hooks_(hooks),
      pipelined_(options.durability == Durability::kSync && options.pipeline) {
  write_options_.sync = options_.durability == Durability::kSync && !pipelined_;
}

GroupCommitter::~GroupCommitter() { Stop(); }

void GroupCommitter::Start() {
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

bool GroupCommitter::OnCommitThread() const { return current_committer == this; }

void GroupCommitter::Submit(WriteBatch batch, CommitCallback done) {
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

void GroupCommitter::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  if (committer_.joinable()) committer_.join();  // it drains the queue before it exits
  if (syncer_.joinable()) {
    {
      absl::MutexLock lock(&sync_mu_);
      sync_closing_ = true;
    }
    syncer_.join();  // it answers every group the committer wrote
  }
}

void GroupCommitter::FillStats(StoreStats* s) const {
  s->commits = commits_.load(std::memory_order_relaxed);
  s->write_batches = write_batches_.load(std::memory_order_relaxed);
  s->syncs = syncs_.load(std::memory_order_relaxed);
  s->committer_busy_seconds =
      static_cast<double>(busy_nanos_.load(std::memory_order_relaxed)) / 1e9;
  s->syncer_busy_seconds =
      static_cast<double>(sync_busy_nanos_.load(std::memory_order_relaxed)) / 1e9;
  s->write_seconds = write_seconds_.Snapshot();
  s->group_commits = group_commits_.Snapshot();
}

void GroupCommitter::Refresh(size_t bytes) {
  absl::Status sync_error;
  if (pipelined_) {
    absl::MutexLock lock(&sync_mu_);
    sync_error = std::move(sync_error_);
    sync_error_ = absl::OkStatus();
  }
  space_->Refresh(bytes, sync_error);
}

void GroupCommitter::Encode(const WriteBatch& batch, Request* req) {
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

void GroupCommitter::CommitterLoop() {
  std::vector<Request> group;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wakes at least every check interval, so that an idle store still notices the
      // disk filling up or freeing (for Stats()) and retries after an error.
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](GroupCommitter* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
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
    busy_nanos_.fetch_add(NanosSince(busy_from), std::memory_order_relaxed);
  }
}

void GroupCommitter::WriteGroup(std::vector<Request>& group) {
  batch_.Clear();  // reused: keeps its buffer's capacity between groups
  for (const Request& req : group) {
    if (!req.status.ok()) continue;
    for (const Request::Op& op : req.ops) {
      const rocksdb::Slice key(req.buf.data() + op.key_begin, op.key_size);
      if (op.value_size == Request::kDelete) {
        batch_.Delete(key);
      } else {
        batch_.Put(key, rocksdb::Slice(req.buf.data() + op.key_begin + op.key_size, op.value_size));
      }
    }
  }
  absl::Status result;
  WrittenGroup written;
  bool group_sync = false;
  for (const Request& req : group) group_sync = group_sync || (req.status.ok() && req.sync);
  if (batch_.Count() > 0) Refresh(batch_.GetDataSize());
  if (batch_.Count() > 0 && !space_->Writable()) {
    result = space_->Refusal(group.size());
  } else if (batch_.Count() > 0) {
    rocksdb::Status s;
    const auto start = std::chrono::steady_clock::now();
    GroupShipper* shipper = nullptr;
    uint64_t ticket = 0;
    // Shipped and written under the hooks' ship lock, so that a Snapshot sees a shipped
    // group written.
    const absl::Status refused = hooks_->ShipThenWrite(
        batch_,
        [&] {
          // Shared: only keeps Close() from freeing the database during the write.
          absl::ReaderMutexLock lock(&database_->mu());
          s = database_->get()->Write(group_sync ? write_options_ : unsynced_options_, &batch_);
        },
        &shipper, &ticket);
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
      if (!s.ok()) result = space_->WriteFailed(s, group.size());
    }
  }
  if (pipelined_) {
    written.result = result;
    written.generation = space_->generation();
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
void GroupCommitter::SyncerLoop() {
  WalSyncer wal(options_.path);
  uint64_t broken_generation = 0;
  bool broken = false;
  std::deque<WrittenGroup> groups;
  while (true) {
    {
      absl::MutexLock lock(&sync_mu_);
      sync_mu_.Await(absl::Condition(
          +[](GroupCommitter* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->sync_mu_) {
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
    sync_busy_nanos_.fetch_add(NanosSince(busy_from), std::memory_order_relaxed);
  }
}

}  // namespace sbx::store::internal
