// Snapshots: records, ownership, quota and users of the runtime's snapshots (snapshots.h).

#include "src/allocator/snapshots.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sbx::allocator {
namespace {

absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("snapshot \"", id, "\" not found"));
}

}  // namespace

absl::Status SnapshotsOptions::Validate() const {
  if (quota_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot quota_bytes ", quota_bytes, " is negative (0: no quota)"));
  }
  return absl::OkStatus();
}

Snapshots::Snapshots(SnapshotsOptions options, Allocator* allocator, store::Store* store,
                     runtime::Runtime* runtime, Clock* clock, IdGenerator* ids)
    : options_(std::move(options)),
      allocator_(allocator),
      store_(store),
      runtime_(runtime),
      clock_(clock),
      ids_(ids) {}

absl::StatusOr<std::unique_ptr<Snapshots>> Snapshots::Make(SnapshotsOptions options,
                                                           Allocator* allocator,
                                                           store::Store* store,
                                                           runtime::Runtime* runtime, Clock* clock,
                                                           IdGenerator* ids) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<Snapshots> out(new Snapshots(options, allocator, store, runtime, clock, ids));
  std::vector<store::SnapshotRecord> records = allocator->recovery().snapshots;
  if (options.reconcile && runtime != nullptr) {
    absl::StatusOr<std::vector<std::string>> files = runtime->ListSnapshots();
    if (!files.ok()) {
      return absl::Status(files.status().code(),
                          absl::StrCat("listing the snapshots' files: ", files.status().message()));
    }
    absl::flat_hash_set<std::string> on_disk(files->begin(), files->end());
    absl::flat_hash_set<std::string> recorded;
    store::WriteBatch drop;
    std::vector<store::SnapshotRecord> kept;
    for (store::SnapshotRecord& r : records) {
      if (!on_disk.contains(r.id)) {
        spdlog::warn("snapshot {} (tenant \"{}\"): its files are gone; its record is dropped", r.id,
                     r.owner);
        drop.DeleteSnapshot(r.id);
        continue;
      }
      recorded.insert(r.id);
      kept.push_back(std::move(r));
    }
    records = std::move(kept);
    if (!drop.empty()) {
      if (absl::Status s = store->CommitAndWait(std::move(drop)); !s.ok()) return s;
    }
    // Files without a record: a crash after the files were renamed into place and before
    // the record was committed (the caller never got an answer).
    for (const std::string& id : *files) {
      if (recorded.contains(id)) continue;
      spdlog::info("snapshot {}: files without a record (a crash before its commit): removed", id);
      if (absl::Status s = runtime->DeleteSnapshot(id); !s.ok()) {
        spdlog::warn("snapshot {}: cannot remove its files: {}", id, std::string(s.message()));
      }
    }
  }
  {
    absl::MutexLock lock(&out->mu_);
    for (store::SnapshotRecord& r : records) {
      out->tenants_[r.owner].used += r.size_bytes;
      ++out->stats_.snapshots;
      out->stats_.bytes += r.size_bytes;
      std::string id = r.id;
      out->records_.emplace(std::move(id), std::move(r));
    }
  }
  return out;
}

Snapshots::~Snapshots() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

template <typename T>
absl::AnyInvocable<void(T) &&> Snapshots::Tracked(absl::AnyInvocable<void(T) &&> done) {
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  return [this, done = std::move(done)](T v) mutable {
    std::move(done)(std::move(v));
    absl::MutexLock lock(&mu_);
    --in_flight_;
  };
}

absl::Status Snapshots::ChargeLocked(Capture& c, int64_t bytes) {
  Tenant& t = tenants_[c.owner];
  if (options_.quota_bytes > 0 && t.used + t.reserved + bytes > options_.quota_bytes) {
    ++stats_.quota_refusals;
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", c.owner, "\" would pass its snapshot quota of ", options_.quota_bytes,
        " bytes (--snapshot_quota_bytes): its snapshots hold ", t.used, " bytes, ", t.reserved,
        " more are being copied; delete snapshots to make room"));
  }
  t.reserved += bytes;
  c.charged += bytes;
  return absl::OkStatus();
}

void Snapshots::EndCapture(const std::shared_ptr<Capture>& c) {
  absl::MutexLock lock(&mu_);
  tenants_[c->owner].reserved -= c->charged;
  c->charged = 0;
}

void Snapshots::Create(SnapshotCreateRequest request,
                       absl::AnyInvocable<void(absl::StatusOr<SnapshotCreated>) &&> done) {
  if (request.name.size() > kMaxSnapshotName) {
    return std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "snapshot name of ", request.name.size(), " bytes is longer than ", kMaxSnapshotName)));
  }
  if (request.labels.size() > kMaxSnapshotLabels) {
    return std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "snapshot has ", request.labels.size(), " labels, more than ", kMaxSnapshotLabels)));
  }
  absl::StatusOr<store::ClaimRecord> claim = allocator_->GetClaim(request.owner, request.claim_id);
  if (!claim.ok()) return std::move(done)(claim.status());
  if (claim->state != store::ClaimState::kActive) {
    return std::move(done)(absl::FailedPreconditionError(
        absl::StrCat("claim \"", request.claim_id, "\" has ended: its sandbox is gone")));
  }
  if (runtime_ == nullptr) return std::move(done)(runtime::NoSnapshots());
  // The template the sandbox was started from, for forks (none when its pool or template
  // has been deleted since: the snapshot then cannot be forked).
  store::TemplateRecord source_template;
  if (absl::StatusOr<store::PoolRecord> pool = allocator_->GetPool(claim->pool); pool.ok()) {
    if (absl::StatusOr<store::TemplateRecord> t = allocator_->GetTemplate(pool->template_name);
        t.ok()) {
      source_template = *std::move(t);
    }
  }
  const std::string id = absl::StrCat("sn-", ids_->Next().substr(0, 16));
  const absl::Time start = clock_->Now();
  auto capture = std::make_shared<Capture>();
  capture->owner = request.owner;
  // The charge runs on the runtime's thread as the copy proceeds.
  runtime::SnapshotCharge charge = [this, capture](int64_t bytes) {
    absl::MutexLock lock(&mu_);
    return ChargeLocked(*capture, bytes);
  };
  done = Tracked(std::move(done));
  runtime_->Snapshot(
      claim->sandbox_id, id, std::move(charge),
      [this, id, start, capture, request = std::move(request),
       source_template = std::move(source_template),
       done = std::move(done)](absl::StatusOr<runtime::SnapshotCapture> taken) mutable {
        if (!taken.ok()) {
          EndCapture(capture);
          {
            absl::MutexLock lock(&mu_);
            ++stats_.failed;
          }
          return std::move(done)(absl::Status(taken.status().code(),
                                              absl::StrCat("snapshot of claim \"", request.claim_id,
                                                           "\": ", taken.status().message())));
        }
        store::SnapshotRecord r;
        r.id = id;
        r.owner = request.owner;
        r.name = std::move(request.name);
        r.labels = std::move(request.labels);
        r.source_claim = request.claim_id;
        r.parent_snapshot = std::move(request.parent_snapshot);
        r.parent_image_digest = taken->image_digest;
        r.size_bytes = taken->bytes;
        r.created = clock_->Now();
        r.template_name = std::move(source_template.name);
        r.template_runtime = std::move(source_template.runtime);
        r.template_spec = std::move(source_template.spec);
        const int64_t dropped = taken->dropped;
        store::WriteBatch batch;
        batch.Put(r);
        store_->Commit(std::move(batch), [this, r, start, capture, dropped,
                                          done = std::move(done)](absl::Status s) mutable {
          if (!s.ok()) {
            EndCapture(capture);
            {
              absl::MutexLock lock(&mu_);
              ++stats_.failed;
            }
            if (absl::Status d = runtime_->DeleteSnapshot(r.id); !d.ok()) {
              spdlog::warn("snapshot {}: cannot remove its files after a failed commit: {}", r.id,
                           std::string(d.message()));
            }
            return std::move(done)(s);
          }
          {
            absl::MutexLock lock(&mu_);
            Tenant& t = tenants_[r.owner];
            t.reserved -= capture->charged;
            capture->charged = 0;
            t.used += r.size_bytes;
            ++stats_.created;
            ++stats_.snapshots;
            stats_.bytes += r.size_bytes;
            records_.insert_or_assign(r.id, r);
          }
          seconds_.Observe(absl::ToDoubleSeconds(clock_->Now() - start));
          SnapshotCreated out;
          out.snapshot = std::move(r);
          out.dropped_entries = dropped;
          std::move(done)(std::move(out));
        });
      });
}

absl::StatusOr<store::SnapshotRecord> Snapshots::Get(const std::string& owner,
                                                     const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(id);
  // Another tenant's snapshot is answered exactly like a missing one.
  if (it == records_.end() || it->second.owner != owner || deleting_.contains(id)) {
    return NotFound(id);
  }
  return it->second;
}

absl::StatusOr<store::SnapshotRecord> Snapshots::Find(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(id);
  if (it == records_.end() || deleting_.contains(id)) return NotFound(id);
  return it->second;
}

std::vector<store::SnapshotRecord> Snapshots::List(
    const std::string& owner, const std::map<std::string, std::string>& labels) const {
  std::vector<store::SnapshotRecord> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : records_) {
      if (r.owner != owner || deleting_.contains(id)) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto l = r.labels.find(k);
        if (l == r.labels.end() || l->second != v) {
          match = false;
          break;
        }
      }
      if (match) out.push_back(r);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.created != b.created ? a.created < b.created : a.id < b.id;
  });
  return out;
}

void Snapshots::Delete(const std::string& owner, const std::string& id,
                       absl::AnyInvocable<void(absl::Status) &&> done) {
  store::SnapshotRecord r;
  {
    absl::MutexLock lock(&mu_);
    auto it = records_.find(id);
    if (it == records_.end() || it->second.owner != owner || deleting_.contains(id)) {
      return std::move(done)(NotFound(id));
    }
    if (auto u = users_.find(id); u != users_.end() && !u->second.empty()) {
      return std::move(done)(absl::FailedPreconditionError(
          absl::StrCat("snapshot \"", id, "\" is in use by ", u->second.front(),
                       u->second.size() > 1 ? absl::StrCat(" and ", u->second.size() - 1, " more")
                                            : std::string(),
                       "; delete or change that first")));
    }
    deleting_[id] = true;
    r = it->second;
  }
  done = Tracked(std::move(done));
  store::WriteBatch batch;
  batch.DeleteSnapshot(id);
  store_->Commit(std::move(batch), [this, r, done = std::move(done)](absl::Status s) mutable {
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      deleting_.erase(r.id);
      return std::move(done)(s);
    }
    {
      absl::MutexLock lock(&mu_);
      deleting_.erase(r.id);
      records_.erase(r.id);
      tenants_[r.owner].used -= r.size_bytes;
      ++stats_.deleted;
      --stats_.snapshots;
      stats_.bytes -= r.size_bytes;
    }
    // The record is gone (durably): files left by a failure here are removed at the next
    // start, as files without a record.
    if (runtime_ != nullptr) {
      if (absl::Status d = runtime_->DeleteSnapshot(r.id); !d.ok()) {
        spdlog::warn("snapshot {}: cannot remove its files: {}", r.id, std::string(d.message()));
      }
    }
    std::move(done)(absl::OkStatus());
  });
}

void Snapshots::Reset(const std::string& owner, const std::string& claim_id,
                      const std::string& snapshot_id,
                      absl::AnyInvocable<void(const store::ClaimRecord&) &&> starting,
                      absl::AnyInvocable<void(absl::StatusOr<store::ClaimRecord>) &&> done) {
  // Ownership of both first, each NOT_FOUND as if it did not exist.
  absl::StatusOr<store::ClaimRecord> claim = allocator_->GetClaim(owner, claim_id);
  if (!claim.ok()) return std::move(done)(claim.status());
  absl::StatusOr<store::SnapshotRecord> snapshot = Get(owner, snapshot_id);
  if (!snapshot.ok()) return std::move(done)(snapshot.status());
  if (claim->state != store::ClaimState::kActive) {
    return std::move(done)(absl::FailedPreconditionError(
        absl::StrCat("claim \"", claim_id, "\" has ended: its sandbox is gone")));
  }
  if (runtime_ == nullptr) return std::move(done)(runtime::NoSnapshots());
  // Held while the reset copies it: its deletion is refused until the reset is done.
  const std::string user = absl::StrCat("the reset of claim \"", claim_id, "\"");
  if (absl::Status s = Hold(snapshot_id, user); !s.ok()) return std::move(done)(s);
  done = Tracked(std::move(done));
  std::move(starting)(*claim);
  const absl::Time start = clock_->Now();
  runtime_->Reset(claim->sandbox_id, snapshot_id, snapshot->parent_image_digest,
                  [this, snapshot_id, user, claim_id, claim = *claim, start,
                   done = std::move(done)](absl::Status s) mutable {
                    Unhold(snapshot_id, user);
                    if (s.ok())
                      reset_seconds_.Observe(absl::ToDoubleSeconds(clock_->Now() - start));
                    {
                      absl::MutexLock lock(&mu_);
                      if (s.ok()) {
                        ++stats_.resets;
                      } else {
                        ++stats_.reset_failures;
                      }
                    }
                    if (!s.ok()) {
                      return std::move(done)(absl::Status(
                          s.code(), absl::StrCat("reset of claim \"", claim_id, "\" to snapshot ",
                                                 snapshot_id, ": ", s.message())));
                    }
                    std::move(done)(std::move(claim));
                  });
}

absl::Status Snapshots::Hold(const std::string& id, const std::string& user) {
  absl::MutexLock lock(&mu_);
  if (!records_.contains(id) || deleting_.contains(id)) return NotFound(id);
  users_[id].push_back(user);
  return absl::OkStatus();
}

void Snapshots::Unhold(const std::string& id, const std::string& user) {
  absl::MutexLock lock(&mu_);
  auto it = users_.find(id);
  if (it == users_.end()) return;
  auto u = std::find(it->second.begin(), it->second.end(), user);
  if (u != it->second.end()) it->second.erase(u);
  if (it->second.empty()) users_.erase(it);
}

int64_t Snapshots::used_bytes(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(owner);
  return it == tenants_.end() ? 0 : it->second.used;
}

void Snapshots::RecordFork(bool ok, int claims, absl::Duration took) {
  if (ok) fork_seconds_.Observe(absl::ToDoubleSeconds(took));
  absl::MutexLock lock(&mu_);
  if (ok) {
    ++stats_.forks;
    stats_.forked += static_cast<uint64_t>(claims);
  } else {
    ++stats_.fork_failures;
  }
}

SnapshotStats Snapshots::stats() const {
  SnapshotStats out;
  {
    absl::MutexLock lock(&mu_);
    out = stats_;
  }
  out.seconds = seconds_.Snapshot();
  out.reset_seconds = reset_seconds_.Snapshot();
  out.fork_seconds = fork_seconds_.Snapshot();
  return out;
}

}  // namespace sbx::allocator
