// Templates and pools: their admin operations (allocator_impl.h).

#include "src/allocator/allocator_impl.h"

namespace sbx::allocator::internal {

void AllocatorImpl::PutTemplate(store::TemplateRecord t, StatusCallback done) {
  if (absl::Status s = ValidatePoolName("template name", t.name); !s.ok()) {
    return std::move(done)(s);
  }
  if (t.runtime != "local" && t.runtime != "kubernetes") {
    return std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "template \"", t.name, "\": runtime \"", t.runtime, "\" is not one of local, kubernetes")));
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = templates_.find(t.name);
    t.generation = it == templates_.end() ? 1 : it->second.generation + 1;
  }
  store::WriteBatch batch;
  batch.Put(t);
  store_->Commit(std::move(batch), [this, t, done = std::move(done)](absl::Status s) mutable {
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      templates_[t.name] = t;
    }
    std::move(done)(s);
  });
}

void AllocatorImpl::DeleteTemplate(const std::string& name, StatusCallback done) {
  absl::Status refused;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (!templates_.contains(name)) {
      refused = absl::NotFoundError(absl::StrCat("template \"", name, "\" not found"));
    }
    for (const auto& [pname, pool] : pools_) {
      if (refused.ok() && pool->settings().template_name == name) {
        refused = absl::FailedPreconditionError(
            absl::StrCat("template \"", name, "\" is used by pool \"", pname, "\""));
      }
    }
  }
  // Callbacks never run under a lock: they may call back into the allocator.
  if (!refused.ok()) return std::move(done)(refused);
  store::WriteBatch batch;
  batch.DeleteTemplate(name);
  store_->Commit(std::move(batch), [this, name, done = std::move(done)](absl::Status s) mutable {
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      templates_.erase(name);
    }
    std::move(done)(s);
  });
}

void AllocatorImpl::PutPool(store::PoolRecord p, StatusCallback done) {
  if (absl::Status s = ValidatePool(p); !s.ok()) return std::move(done)(s);
  Pool* existing = nullptr;
  bool have_template;
  {
    absl::ReaderMutexLock lock(&mu_);
    have_template = templates_.contains(p.template_name);
    existing = FindPoolLocked(p.name);
  }
  if (!have_template) {
    return std::move(done)(absl::NotFoundError(
        absl::StrCat("pool \"", p.name, "\": template \"", p.template_name, "\" not found")));
  }
  p.generation = existing == nullptr ? 1 : existing->settings().generation + 1;
  store::WriteBatch batch;
  batch.Put(p);
  store_->Commit(std::move(batch), [this, p, done = std::move(done)](absl::Status s) mutable {
    if (s.ok()) {
      Pool* pool = nullptr;
      {
        absl::MutexLock lock(&mu_);
        pool = FindPoolLocked(p.name);
        if (pool != nullptr) {
          pool->set_settings(p);
        } else {
          pool = AddPoolLocked(p);
        }
      }
      if (pool->warm() < pool->Target(clock_->Now())) reconciler_->PoolBelowTarget(p.name);
    }
    std::move(done)(s);
  });
}

absl::StatusOr<PoolStatus> AllocatorImpl::GetPoolStatus(const std::string& name) const {
  ASSIGN_OR_RETURN(Pool * pool, FindPool(name));
  store::PoolRecord settings = pool->settings();
  PoolStatus st;
  st.name = name;
  st.warm = pool->warm();
  st.claimed = pool->claimed();
  st.waiting = pool->waiting();
  const TargetDecision target = pool->Decide(clock_->Now());
  st.target = target.target;
  st.target_reason = target.reason;
  st.demand = target.estimate;
  st.arrivals = pool->arrivals();
  st.min_warm = settings.min_warm;
  st.max_warm = settings.max_warm;
  st.sizing = settings.sizing;
  st.counts = pool->counters().Snapshot();
  st.last_error = pool->last_error();
  st.create_failures = pool->create_failures();
  return st;
}

void AllocatorImpl::DeletePool(const std::string& name, StatusCallback done) {
  Pool* pool = nullptr;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    pool = FindPoolLocked(name);
    if (pool == nullptr) {
      refused = absl::NotFoundError(absl::StrCat("pool \"", name, "\" not found"));
    } else if (pool->claimed() > 0 || pool->waiting() > 0) {
      refused = absl::FailedPreconditionError(
          absl::StrCat("pool \"", name, "\" has ", pool->claimed(), " active and ", pool->waiting(),
                       " waiting claims; release them first"));
    } else {
      // Unlisted at once so that no new claim finds it; the object stays alive
      // (retired_pools_) because sandboxes point to it.
      retired_pools_.push_back(std::move(pools_[name]));
      pools_.erase(name);
    }
  }
  if (!refused.ok()) return std::move(done)(refused);
  store::WriteBatch batch;
  batch.DeletePool(name);
  std::vector<store::SandboxRecord> retired;
  while (SandboxPtr sb = pool->TryTake()) {
    pool->Retire(sb);
    batch.DeleteSandbox(sb->id);
    retired.push_back(RecordOf(*sb));
    ForgetSandbox(sb->id);
  }
  store_->Commit(std::move(batch), [this, retired = std::move(retired),
                                    done = std::move(done)](absl::Status s) mutable {
    for (const auto& r : retired) reconciler_->RetireSandbox(r);
    std::move(done)(s);
  });
}

absl::Status AllocatorImpl::ValidatePool(const store::PoolRecord& p) const {
  RETURN_IF_ERROR(ValidatePoolName("pool name", p.name));
  RETURN_IF_ERROR(ValidatePoolName("template name", p.template_name));
  if (p.min_warm < 0 || p.max_warm < p.min_warm) {
    return absl::InvalidArgumentError(absl::StrCat("pool \"", p.name, "\": min_warm ", p.min_warm,
                                                   " and max_warm ", p.max_warm,
                                                   " must satisfy 0 <= min_warm <= max_warm"));
  }
  if (p.max_warm > options_.max_pool_warm) {
    return absl::InvalidArgumentError(absl::StrCat("pool \"", p.name, "\": max_warm ", p.max_warm,
                                                   " is above ", options_.max_pool_warm,
                                                   ", the allocator's max_pool_warm"));
  }
  if (p.default_ttl < absl::ZeroDuration() || p.max_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool \"", p.name, "\": durations must not be negative"));
  }
  RETURN_IF_ERROR(CheckWait(absl::StrCat("pool \"", p.name, "\": default_wait"), p.default_wait));
  RETURN_IF_ERROR(CheckMaxTtl(absl::StrCat("pool \"", p.name, "\": default_ttl"), p.default_ttl));
  RETURN_IF_ERROR(CheckMaxTtl(absl::StrCat("pool \"", p.name, "\": max_ttl"), p.max_ttl));
  if (!IsSelectionPolicy(p.selection_policy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool \"", p.name, "\": selection policy \"", p.selection_policy,
                     "\" is not known (known: ", KnownSelectionPolicies(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace sbx::allocator::internal
