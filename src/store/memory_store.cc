#include "src/store/memory_store.h"
#include "src/common/dropped.h"

#include <thread>
#include <utility>
#include <variant>

#include "absl/base/internal/raw_logging.h"
#include "absl/status/status.h"
#include "src/store/batch_check.h"

namespace sbx::store {

MemoryStore::MemoryStore(MemoryStoreOptions options) : MemoryStore(Contents{}, options) {}

MemoryStore::MemoryStore(Contents initial, MemoryStoreOptions options) : options_(options) {
  {
    absl::MutexLock lock(&mu_);
    for (TemplateRecord& r : initial.templates) {
      std::string key = r.name;
      templates_.insert_or_assign(std::move(key), std::move(r));
    }
    for (PoolRecord& r : initial.pools) {
      std::string key = r.name;
      pools_.insert_or_assign(std::move(key), std::move(r));
    }
    for (SnapshotRecord& r : initial.snapshots) {
      std::string key = r.id;
      snapshots_.insert_or_assign(std::move(key), std::move(r));
    }
    for (SandboxRecord& r : initial.sandboxes) {
      std::string key = r.id;
      sandboxes_.insert_or_assign(std::move(key), std::move(r));
    }
    for (ClaimRecord& r : initial.claims) {
      std::string key = ClaimKey(r.owner, r.id);
      claims_.insert_or_assign(std::move(key), std::move(r));
    }
    revision_ = initial.revision;
  }
  if (options_.callbacks == MemoryStoreOptions::CallbackMode::kCommitterThread) {
    committer_ = std::thread([this] { CommitterLoop(); });
  }
}

MemoryStore::~MemoryStore() { ReportDropped("store.close_at_destruction", Close()); }

void MemoryStore::Commit(WriteBatch batch, CommitCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      absl::Status status = CheckBatch(batch);
      if (fail_commits_ > 0) {
        --fail_commits_;
        status = fail_commits_status_;
      }
      queue_.push_back(Pending{std::move(batch), std::move(status), std::move(done)});
      if (options_.callbacks == MemoryStoreOptions::CallbackMode::kInline && !draining_) {
        DrainLocked();
      }
      return;
    }
  }
  // The committer is gone: fail on the caller's thread, outside the lock.
  std::move(done)(absl::FailedPreconditionError("commit to a closed memory store"));
}

void MemoryStore::CommitterLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](MemoryStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
          return (!s->paused_ && !s->queue_.empty()) || (s->closed_ && s->queue_.empty());
        },
        this));
    if (closed_ && queue_.empty()) return;
    DrainLocked();
  }
}

bool MemoryStore::OnDrainingThreadLocked() const {
  return draining_ && draining_thread_ == std::this_thread::get_id();
}

void MemoryStore::DrainLocked() {
  draining_ = true;
  draining_thread_ = std::this_thread::get_id();
  while (!paused_ && !queue_.empty()) {
    std::deque<Pending> group;
    group.swap(queue_);
    in_flight_ += group.size();
    bool wrote = false;
    for (const Pending& p : group) {
      if (p.status.ok() && !p.batch.empty()) {
        ApplyLocked(p.batch);
        wrote = true;
      }
    }
    // Counted before the callbacks run, so that a caller woken by its callback sees them.
    stats_.commits += group.size();
    if (wrote) {
      ++stats_.write_batches;
      ++stats_.syncs;  // modelled: RocksDbStore in kSync mode syncs once per group
    }
    mu_.Unlock();
    for (Pending& p : group) {
      std::move(p.done)(std::move(p.status));
      absl::MutexLock lock(&mu_);
      --in_flight_;
    }
    mu_.Lock();
  }
  draining_ = false;
}

void MemoryStore::ApplyLocked(const WriteBatch& batch) {
  for (const Mutation& m : batch.mutations()) {
    const bool is_delete = std::holds_alternative<std::monostate>(m.record);
    switch (m.kind) {
      case Mutation::Kind::kTemplate:
        if (is_delete) {
          templates_.erase(m.key);
        } else {
          templates_.insert_or_assign(m.key, std::get<TemplateRecord>(m.record));
        }
        break;
      case Mutation::Kind::kPool:
        if (is_delete) {
          pools_.erase(m.key);
        } else {
          pools_.insert_or_assign(m.key, std::get<PoolRecord>(m.record));
        }
        break;
      case Mutation::Kind::kSandbox:
        if (is_delete) {
          sandboxes_.erase(m.key);
        } else {
          sandboxes_.insert_or_assign(m.key, std::get<SandboxRecord>(m.record));
        }
        break;
      case Mutation::Kind::kClaim:
        if (is_delete) {
          claims_.erase(m.key);
        } else {
          claims_.insert_or_assign(m.key, std::get<ClaimRecord>(m.record));
        }
        break;
      case Mutation::Kind::kRevision:
        revision_ = is_delete ? 0 : std::get<RevisionRecord>(m.record).revision;
        break;
      case Mutation::Kind::kSnapshot:
        if (is_delete) {
          snapshots_.erase(m.key);
        } else {
          snapshots_.insert_or_assign(m.key, std::get<SnapshotRecord>(m.record));
        }
        break;
    }
  }
}

absl::StatusOr<Contents> MemoryStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  if (fail_load_.has_value()) {
    absl::Status s = std::move(*fail_load_);
    fail_load_.reset();
    return s;
  }
  if (closed_) return absl::FailedPreconditionError("LoadAll on a closed memory store");
  return SnapshotLocked();
}

absl::Status MemoryStore::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (OnDrainingThreadLocked()) {
      return absl::FailedPreconditionError("MemoryStore::Close called from a commit callback");
    }
  }
  absl::MutexLock close_lock(&close_mu_);
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    paused_ = false;
    if (options_.callbacks == MemoryStoreOptions::CallbackMode::kInline && !draining_) {
      DrainLocked();
    }
    mu_.Await(absl::Condition(
        +[](MemoryStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
          return s->queue_.empty() && s->in_flight_ == 0;
        },
        this));
  }
  if (committer_.joinable()) committer_.join();
  return absl::OkStatus();
}

StoreStats MemoryStore::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void MemoryStore::FailNextCommits(int n, absl::Status status) {
  ABSL_RAW_CHECK(!status.ok(), "FailNextCommits needs a non-OK status");
  absl::MutexLock lock(&mu_);
  fail_commits_ = n;
  fail_commits_status_ = std::move(status);
}

void MemoryStore::FailNextLoadAll(absl::Status status) {
  ABSL_RAW_CHECK(!status.ok(), "FailNextLoadAll needs a non-OK status");
  absl::MutexLock lock(&mu_);
  fail_load_ = std::move(status);
}

void MemoryStore::Pause() {
  absl::MutexLock lock(&mu_);
  paused_ = true;
}

void MemoryStore::Resume() {
  absl::MutexLock lock(&mu_);
  paused_ = false;
  if (options_.callbacks == MemoryStoreOptions::CallbackMode::kInline && !draining_) {
    DrainLocked();
  }
}

size_t MemoryStore::PendingCommits() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + in_flight_;
}

bool MemoryStore::AwaitPending(size_t n, absl::Duration timeout) {
  struct Arg {
    MemoryStore* store;
    size_t n;
  } arg{this, n};
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                    // Evaluated by Await with mu_ held.
                                    return a->store->queue_.size() + a->store->in_flight_ >= a->n;
                                  },
                                  &arg),
                              timeout);
}

bool MemoryStore::AwaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](MemoryStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                                    return s->queue_.empty() && s->in_flight_ == 0;
                                  },
                                  this),
                              timeout);
}

Contents MemoryStore::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return SnapshotLocked();
}

Contents MemoryStore::SnapshotLocked() const {
  Contents c;
  c.templates.reserve(templates_.size());
  for (const auto& [key, r] : templates_) c.templates.push_back(r);
  c.pools.reserve(pools_.size());
  for (const auto& [key, r] : pools_) c.pools.push_back(r);
  c.sandboxes.reserve(sandboxes_.size());
  for (const auto& [key, r] : sandboxes_) c.sandboxes.push_back(r);
  c.claims.reserve(claims_.size());
  for (const auto& [key, r] : claims_) c.claims.push_back(r);
  c.revision = revision_;
  c.snapshots.reserve(snapshots_.size());
  for (const auto& [key, r] : snapshots_) c.snapshots.push_back(r);
  return c;
}

}  // namespace sbx::store
