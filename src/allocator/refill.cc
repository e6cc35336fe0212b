#include "src/allocator/refill.h"

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sbx::allocator {

absl::Status RefillOptions::Validate() const {
  if (!(qps > 0))
    return absl::InvalidArgumentError(absl::StrCat("refill qps ", qps, " must be > 0"));
  if (burst < 1)
    return absl::InvalidArgumentError(absl::StrCat("refill burst ", burst, " is below 1"));
  if (max_creating_per_pool < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_creating_per_pool ", max_creating_per_pool, " is below 1"));
  }
  if (initial_backoff <= absl::ZeroDuration() || max_backoff < initial_backoff) {
    return absl::InvalidArgumentError("refill backoff must satisfy 0 < initial <= max");
  }
  if (resync <= absl::ZeroDuration())
    return absl::InvalidArgumentError("refill resync must be > 0");
  if (coalesce < absl::ZeroDuration() || coalesce > absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("refill coalesce ", absl::FormatDuration(coalesce), " is outside 0..1s"));
  }
  return absl::OkStatus();
}

RefillReconciler::RefillReconciler(RefillOptions options, runtime::Runtime* runtime, Clock* clock)
    : options_(std::move(options)),
      runtime_(runtime),
      clock_(clock),
      tokens_(options_.burst),
      refilled_at_(clock->Now()) {}

RefillReconciler::~RefillReconciler() { Stop(); }

void RefillReconciler::Start(Allocator* allocator) {
  Attach(allocator);
  worker_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sbx-refill");
    Loop();
  });
}

void RefillReconciler::Attach(Allocator* allocator) {
  allocator_ = allocator;
  // Every pool is looked at once: after a restart some may be below target with no claim
  // to say so (sandboxes that went while sbx was down, creates the crash cut short).
  absl::MutexLock lock(&mu_);
  for (const store::PoolRecord& p : allocator->ListPools()) dirty_.insert(p.name);
  wake_ = true;
}

void RefillReconciler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_ = true;
  }
  if (worker_.joinable()) worker_.join();
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

void RefillReconciler::PoolBelowTarget(const std::string& pool) {
  absl::MutexLock lock(&mu_);
  dirty_.insert(pool);
  wake_ = true;
}

void RefillReconciler::RetireSandbox(const store::SandboxRecord& sandbox) {
  absl::MutexLock lock(&mu_);
  deletes_.push_back(sandbox.id);
  wake_ = true;
}

int RefillReconciler::TakeTokensLocked(int want) {
  const absl::Time now = clock_->Now();
  tokens_ = std::min<double>(options_.burst,
                             tokens_ + options_.qps * absl::ToDoubleSeconds(now - refilled_at_));
  refilled_at_ = now;
  const int got = std::min(want, static_cast<int>(std::floor(tokens_)));
  if (got <= 0) return 0;
  tokens_ -= got;
  return got;
}

void RefillReconciler::RunOnce() {
  if (allocator_ == nullptr || runtime_ == nullptr) return;
  std::vector<std::string> check;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    if (now >= next_resync_) {
      for (const auto& [pool, _] : pools_) dirty_.insert(pool);
      next_resync_ = now + options_.resync;
    }
    check.assign(dirty_.begin(), dirty_.end());
    dirty_.clear();
  }

  // Decide under the lock; read the allocator and call the runtime outside it.
  std::vector<std::pair<runtime::CreateRequest, int>> creates;
  std::vector<std::pair<std::string, int>> trims;
  for (const std::string& pool : check) {
    absl::StatusOr<PoolStatus> st = allocator_->GetPoolStatus(pool);
    absl::StatusOr<store::PoolRecord> settings = allocator_->GetPool(pool);
    absl::MutexLock lock(&mu_);
    if (!st.ok() || !settings.ok()) {  // the pool is gone
      auto it = pools_.find(pool);
      if (it != pools_.end() && it->second.creating == 0) pools_.erase(it);
      continue;
    }
    PoolState& ps = pools_[pool];
    if (clock_->Now() < ps.retry_at) {
      dirty_.insert(pool);  // backing off: look again later
      continue;
    }
    if (st->sizing == store::PoolSizing::kDemand && st->warm > st->target) {
      // Demand fell (the estimate's cool-down has passed): the surplus goes. Static pools
      // keep what they have, as they always did (a SandboxWarmPool's controller trims its
      // own).
      trims.emplace_back(pool, static_cast<int>(st->warm - st->target));
      continue;
    }
    int deficit = static_cast<int>(st->target - st->warm) - ps.creating;
    deficit = std::min(deficit, options_.max_creating_per_pool - ps.creating);
    if (deficit <= 0) continue;
    const int got = TakeTokensLocked(deficit);
    if (got < deficit) dirty_.insert(pool);  // the rest when tokens come back
    if (got == 0) continue;
    ps.creating += got;
    in_flight_ += got;
    stats_.creates_started += got;
    runtime::CreateRequest req;
    req.pool = pool;
    req.template_name = settings->template_name;
    creates.emplace_back(std::move(req), got);
  }
  for (const auto& [pool, n] : trims) {
    // Retired sandboxes come back through RetireSandbox, to be deleted below.
    absl::StatusOr<int> trimmed = allocator_->TrimWarm(pool, n);
    if (trimmed.ok() && *trimmed > 0) {
      absl::MutexLock lock(&mu_);
      stats_.trimmed += static_cast<uint64_t>(*trimmed);
    }
  }
  for (auto& [req, n] : creates) {
    absl::StatusOr<store::TemplateRecord> t = allocator_->GetTemplate(req.template_name);
    if (t.ok()) req.template_spec = t->spec;
  }

  // Clean-up only with the budget the creates left.
  std::vector<std::string> deletes;
  {
    absl::MutexLock lock(&mu_);
    const int n = TakeTokensLocked(static_cast<int>(deletes_.size()));
    for (int i = 0; i < n; ++i) {
      deletes.push_back(std::move(deletes_.front()));
      deletes_.pop_front();
    }
    in_flight_ += n;
    stats_.deletes_started += n;
  }

  for (auto& [req, n] : creates) {
    for (int i = 0; i < n; ++i) {
      const std::string pool = req.pool;
      const absl::Time started = clock_->Now();
      runtime_->Create(req, [this, pool, started](absl::StatusOr<runtime::SandboxInfo> info) {
        OnCreated(pool, started, std::move(info));
      });
    }
  }
  for (std::string& id : deletes) {
    runtime_->Delete(id, [this, id](absl::Status s) { OnDeleted(id, std::move(s)); });
  }
}

void RefillReconciler::OnCreated(const std::string& pool, absl::Time started,
                                 absl::StatusOr<runtime::SandboxInfo> info) {
  bool orphan = false;
  if (info.ok()) {
    // Before the sandbox is added: a waiter it serves then sees the latency it waited for.
    allocator_->ObserveCreateLatency(pool, clock_->Now() - started);
    absl::Status added = allocator_->AddSandbox(*info);
    // NOT_FOUND: the pool was deleted meanwhile (the allocator already asked to retire
    // the sandbox). Anything else: the sandbox is not tracked, so it must not live on.
    orphan = !added.ok() && !absl::IsNotFound(added);
    if (!added.ok()) {
      spdlog::warn("new sandbox \"{}\" of pool \"{}\" not added: {}", info->id, pool,
                   added.ToString());
    }
  } else {
    spdlog::warn("creating a sandbox for pool \"{}\" failed: {}", pool, info.status().ToString());
  }
  // Where the operator looks (PoolStatus.last_error, sbx pools, a metric), not only the log.
  allocator_->ObserveCreateResult(pool, info.status());
  absl::MutexLock lock(&mu_);
  PoolState& ps = pools_[pool];
  --ps.creating;
  --in_flight_;
  if (orphan) deletes_.push_back(info->id);
  if (info.ok()) {
    ++stats_.creates_succeeded;
    // The runtime works: the backoff of earlier failures is over. Creates run concurrently,
    // so a burst's failures (say 12% of 64 under API faults) each double the backoff
    // before any success comes back; keeping that retry time after a success stalled
    // the pool for up to max_backoff with its members being claimed (issue 23).
    ps.failures = 0;
    ps.retry_at = absl::InfinitePast();
  } else {
    ++stats_.creates_failed;
    ++ps.failures;
    absl::Duration backoff = options_.initial_backoff;
    for (int i = 1; i < ps.failures && backoff < options_.max_backoff; ++i) backoff *= 2;
    ps.retry_at = clock_->Now() + std::min(backoff, options_.max_backoff);
  }
  dirty_.insert(pool);
  wake_ = true;
}

void RefillReconciler::OnDeleted(const std::string& id, absl::Status status) {
  if (!status.ok() && !absl::IsNotFound(status)) {
    spdlog::warn("deleting sandbox \"{}\" failed: {}", id, status.ToString());
  }
  absl::MutexLock lock(&mu_);
  --in_flight_;
  if (!status.ok() && !absl::IsNotFound(status)) ++stats_.deletes_failed;
}

void RefillReconciler::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    wake_ = false;
    ++stats_.passes;
    mu_.Unlock();
    RunOnce();
    mu_.Lock();
    if (wake_ && options_.coalesce > absl::ZeroDuration()) {
      // Notified again during the pass: more are likely on their way. Let them gather
      // (the condition holds only for Stop, so the notifications do not wake this
      // thread) and take them in one pass.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.coalesce);
    }
    // Sleep until woken or the next resync; with work waiting for tokens or a backoff,
    // look again soon.
    absl::Time deadline = next_resync_;
    if (!dirty_.empty() || !deletes_.empty()) {
      deadline = std::min(deadline, clock_->Now() + absl::Milliseconds(10));
    }
    if (!wake_ && !stopping_) clock_->AwaitUntil(mu_, &wake_, deadline);
  }
}

int RefillReconciler::creating(const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? 0 : it->second.creating;
}

size_t RefillReconciler::pending_deletes() const {
  absl::MutexLock lock(&mu_);
  return deletes_.size();
}

RefillStats RefillReconciler::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace sbx::allocator
