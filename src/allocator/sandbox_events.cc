// What the runtime reports of sandboxes: new ones, gone ones, warm ones retired
// (allocator_impl.h).

#include "src/allocator/allocator_impl.h"
#include "src/common/dropped.h"

namespace sbx::allocator::internal {

absl::Status AllocatorImpl::AddSandbox(const runtime::SandboxInfo& info) {
  if (info.id.empty()) return absl::InvalidArgumentError("sandbox id is empty");
  Pool* pool = nullptr;
  {
    absl::ReaderMutexLock lock(&mu_);
    pool = FindPoolLocked(info.pool);
  }
  auto sb =
      std::make_shared<Sandbox>(info.id, info.endpoint, info.node, pool, clock_->Now(),
                                SandboxState::kWarm, InternNodeLabels(info.node, info.node_labels));
  if (pool == nullptr) {
    reconciler_->RetireSandbox(RecordOf(*sb, info.pool));
    return absl::NotFoundError(
        absl::StrCat("sandbox \"", info.id, "\": pool \"", info.pool, "\" not found"));
  }
  {
    absl::MutexLock lock(&sandboxes_mu_);
    if (!sandboxes_.insert(sb).second) {
      return absl::AlreadyExistsError(absl::StrCat("sandbox \"", info.id, "\" is known already"));
    }
  }
  // The record is written in the background: the runtime, not the store, is the truth
  // for existence, and a claim's own record carries the sandbox it holds.
  store::WriteBatch batch;
  batch.Put(RecordOf(*sb));
  batch.set_sync(false);  // no one waits for it; the reconciliation restores a lost one
  store_->Commit(std::move(batch), [id = info.id](absl::Status s) {
    if (!s.ok()) spdlog::warn("sandbox \"{}\": its record was not stored: {}", id, s.ToString());
  });
  pool->AddWarm(std::move(sb));
  return absl::OkStatus();
}

absl::Status AllocatorImpl::SandboxGone(const std::string& id) {
  SandboxPtr sb = FindSandbox(id);
  if (sb == nullptr) return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" not known"));
  sb->gone.store(true, std::memory_order_seq_cst);
  if (sb->pool->MarkDeadIfWarm(sb)) {
    ForgetSandbox(id);
    store::WriteBatch batch;
    batch.DeleteSandbox(id);
    batch.set_sync(false);  // a record left behind is dropped by the reconciliation
    store_->Commit(std::move(batch), DropTo{"allocator.warm_gone_commit"});
    reconciler_->PoolBelowTarget(sb->pool->name());
    return absl::OkStatus();
  }
  EntryPtr e;
  {
    absl::MutexLock lock(&sb->mu);
    e = sb->claim.lock();
  }
  // No entry yet means a claim is between taking it and committing: that claim sees
  // `gone` when it activates and ends itself as lost.
  if (e != nullptr) {
    bool active;
    {
      absl::MutexLock lock(&e->mu);
      active = e->phase == ClaimEntry::Phase::kActive;
    }
    if (active)
      EndClaim(e, ClaimState::kLost,
               DropTo{"allocator.sandbox_gone", absl::StatusCode::kFailedPrecondition});
  }
  return absl::OkStatus();
}

absl::Status AllocatorImpl::RetireWarm(const std::string& id) {
  SandboxPtr sb = FindSandbox(id);
  if (sb == nullptr) return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" not known"));
  if (!sb->pool->MarkDeadIfWarm(sb)) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox \"", id, "\" is not warm (a claim holds it)"));
  }
  ForgetSandbox(id);
  store::WriteBatch batch;
  batch.DeleteSandbox(id);
  batch.set_sync(false);  // a record left behind is dropped by the reconciliation
  store_->Commit(std::move(batch), DropTo{"allocator.retire_commit"});
  reconciler_->RetireSandbox(RecordOf(*sb));
  reconciler_->PoolBelowTarget(sb->pool->name());
  return absl::OkStatus();
}

absl::StatusOr<int> AllocatorImpl::TrimWarm(const std::string& pool_name, int n) {
  ASSIGN_OR_RETURN(Pool * pool, FindPool(pool_name));
  int trimmed = 0;
  store::WriteBatch batch;
  batch.set_sync(false);  // a record left behind is dropped by the reconciliation
  std::vector<SandboxPtr> retired;
  while (trimmed < n) {
    // Taken like a claim takes one (Warm→Claimed, so no claim can get it), then retired.
    SandboxPtr sb = pool->TryTake();
    if (sb == nullptr) break;
    pool->Retire(sb);  // its node's claimed count goes back down too
    ForgetSandbox(sb->id);
    batch.DeleteSandbox(sb->id);
    retired.push_back(std::move(sb));
    ++trimmed;
  }
  if (trimmed == 0) return 0;
  store_->Commit(std::move(batch), DropTo{"allocator.trim_commit"});
  for (const SandboxPtr& sb : retired) reconciler_->RetireSandbox(RecordOf(*sb));
  return trimmed;
}

void AllocatorImpl::ObserveCreateLatency(const std::string& pool, absl::Duration took) {
  absl::StatusOr<Pool*> p = FindPool(pool);
  if (p.ok()) (*p)->ObserveCreateLatency(took);
}

void AllocatorImpl::ObserveCreateResult(const std::string& pool, const absl::Status& result) {
  absl::StatusOr<Pool*> p = FindPool(pool);
  if (p.ok()) (*p)->ObserveCreateResult(result);
}

}  // namespace sbx::allocator::internal
