#include "src/allocator/pool.h"

#include <algorithm>

namespace sbx::allocator {

namespace {

absl::string_view PolicyName(const std::string& name) {
  return name.empty() ? absl::string_view("fifo") : absl::string_view(name);
}

}  // namespace

Pool::Pool(store::PoolRecord settings, std::unique_ptr<SelectionPolicy> ready,
           Hook before_unlocked_push, DemandOptions demand, absl::Time start)
    : name_(settings.name),
      ready_(ready.get()),
      before_unlocked_push_(std::move(before_unlocked_push)),
      target_hint_(settings.min_warm),
      demand_(std::move(demand), start),
      settings_(std::move(settings)) {
  absl::MutexLock lock(&mu_);
  sets_.push_back(std::move(ready));
}

store::PoolRecord Pool::settings() const {
  absl::ReaderMutexLock lock(&mu_);
  return settings_;
}

void Pool::set_settings(store::PoolRecord settings) {
  absl::MutexLock lock(&mu_);
  const absl::string_view policy = PolicyName(settings.selection_policy);
  if (policy != PolicyName(settings_.selection_policy)) {
    SelectionPolicy* old = ready_.load(std::memory_order_relaxed);
    if (!old->SwitchTo(policy)) {
      // Validated by the caller; an unknown name keeps the set in use.
      absl::StatusOr<std::unique_ptr<SelectionPolicy>> made = NewSelectionPolicy(policy);
      if (made.ok()) {
        sets_.push_back(std::move(*made));
        ready_.store(sets_.back().get(), std::memory_order_seq_cst);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        MoveLocked(old);
      }
    }
  }
  settings_ = std::move(settings);
}

void Pool::MoveLocked(SelectionPolicy* from) {
  SelectionPolicy* to = ready_.load(std::memory_order_relaxed);
  while (SandboxPtr sandbox = from->Pop()) {
    sandbox->node_claims = nullptr;  // the counts of `from` are not the new set's
    to->Push(std::move(sandbox));
  }
}

SandboxPtr Pool::PopWarm(const std::function<void(const SandboxPtr&)>* after_pop,
                         const NodeLabels* prefer) {
  SelectionPolicy* ready = ready_.load(std::memory_order_acquire);
  while (true) {
    while (SandboxPtr candidate =
               prefer != nullptr ? ready->PopPreferring(*prefer) : ready->Pop()) {
      if (after_pop != nullptr && *after_pop) (*after_pop)(candidate);
      if (candidate->Transition(SandboxState::kWarm, SandboxState::kClaimed)) {
        warm_.fetch_sub(1, std::memory_order_relaxed);
        CountClaimed(*candidate);
        return candidate;
      }
      // Not warm any more (died while queued): its death already left warm_; drop it.
    }
    // Empty, unless the policy changed meanwhile and the sandboxes moved to a new set.
    SelectionPolicy* now = ready_.load(std::memory_order_acquire);
    if (now == ready) return nullptr;
    ready = now;
  }
}

SandboxPtr Pool::TryTake(const std::function<void(const SandboxPtr&)>* after_pop,
                         const NodeLabels* prefer) {
  return PopWarm(after_pop, prefer != nullptr && !prefer->empty() ? prefer : nullptr);
}

void Pool::GiveBack(SandboxPtr sandbox) {
  Uncount(*sandbox);
  sandbox->Transition(SandboxState::kClaimed, SandboxState::kWarm);
  AddWarm(std::move(sandbox));
}

bool Pool::Retire(const SandboxPtr& sandbox) {
  const bool retired = sandbox->Transition(SandboxState::kClaimed, SandboxState::kRetired);
  Uncount(*sandbox);
  return retired;
}

void Pool::AdoptClaimed(Sandbox& sandbox) {
  sandbox.node_claims = ready_.load(std::memory_order_acquire)->ClaimCounter(sandbox);
  CountClaimed(sandbox);
}

void Pool::AddWarm(SandboxPtr sandbox) {
  if (waiting_.load(std::memory_order_seq_cst) == 0) {
    SelectionPolicy* ready = ready_.load(std::memory_order_seq_cst);
    if (before_unlocked_push_) before_unlocked_push_();
    warm_.fetch_add(1, std::memory_order_relaxed);
    ready->Push(std::move(sandbox));
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ready_.load(std::memory_order_seq_cst) != ready) {
      // The policy changed meanwhile; the move may have missed this sandbox.
      absl::MutexLock lock(&mu_);
      MoveLocked(ready);
    }
    if (waiting_.load(std::memory_order_seq_cst) == 0) return;
    // A claim began to wait meanwhile and may have missed the sandbox just pushed.
    return MatchWaiters();
  }
  WaiterPtr waiter;
  {
    absl::MutexLock lock(&mu_);
    SelectionPolicy* ready = ready_.load(std::memory_order_relaxed);  // stable under mu_
    if (waiters_.empty()) {
      warm_.fetch_add(1, std::memory_order_relaxed);
      ready->Push(std::move(sandbox));
      return;
    }
    if (!sandbox->Transition(SandboxState::kWarm, SandboxState::kClaimed)) return;  // died
    sandbox->node_claims = ready->ClaimCounter(*sandbox);
    CountClaimed(*sandbox);
    waiter = waiters_.Pop();
    waiting_.fetch_sub(1, std::memory_order_seq_cst);
  }
  std::move(waiter->deliver)(std::move(sandbox));
}

void Pool::MatchWaiters() {
  while (true) {
    WaiterPtr waiter;
    SandboxPtr sandbox;
    {
      absl::MutexLock lock(&mu_);
      if (waiters_.empty()) return;
      sandbox = PopWarm(nullptr, nullptr);
      if (sandbox == nullptr) return;
      waiter = waiters_.Pop();
      waiting_.fetch_sub(1, std::memory_order_seq_cst);
    }
    std::move(waiter->deliver)(std::move(sandbox));
  }
}

SandboxPtr Pool::TakeOrEnqueue(WaiterPtr waiter) {
  absl::MutexLock lock(&mu_);
  waiting_.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (SandboxPtr s = PopWarm(nullptr, nullptr)) {
    waiting_.fetch_sub(1, std::memory_order_seq_cst);
    return s;
  }
  waiters_.Push(std::move(waiter));
  return nullptr;
}

bool Pool::CancelWaiter(const WaiterPtr& waiter) {
  absl::MutexLock lock(&mu_);
  if (!waiters_.Remove(waiter)) return false;
  waiting_.fetch_sub(1, std::memory_order_seq_cst);
  return true;
}

bool Pool::MarkDeadIfWarm(const SandboxPtr& sandbox) {
  if (!sandbox->Transition(SandboxState::kWarm, SandboxState::kDead)) return false;
  warm_.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

int64_t Pool::waiting() const {
  absl::ReaderMutexLock lock(&mu_);
  return static_cast<int64_t>(waiters_.size());
}

void Pool::ObserveCreateResult(const absl::Status& result) {
  absl::MutexLock lock(&error_mu_);
  if (result.ok()) {
    last_error_.clear();
    return;
  }
  last_error_ = result.ToString();
  ++create_failures_;
}

std::string Pool::last_error() const {
  absl::MutexLock lock(&error_mu_);
  return last_error_;
}

uint64_t Pool::create_failures() const {
  absl::MutexLock lock(&error_mu_);
  return create_failures_;
}

void Pool::ObserveCreateLatency(absl::Duration took) {
  absl::MutexLock lock(&demand_mu_);
  demand_.ObserveCreateLatency(took);
}

TargetDecision Pool::Decide(absl::Time now) {
  int32_t floor;
  int32_t ceiling;
  store::PoolSizing sizing;
  int64_t waiting;
  {
    absl::ReaderMutexLock lock(&mu_);
    floor = settings_.min_warm;
    ceiling = settings_.max_warm;
    sizing = settings_.sizing;
    waiting = static_cast<int64_t>(waiters_.size());
  }
  TargetDecision d;
  {
    absl::MutexLock lock(&demand_mu_);
    demand_.Sample(now, arrivals());
    // Estimated for static pools too: their status shows what demand sizing would do.
    d = demand_.Decide(now, floor, ceiling, waiting);
  }
  if (sizing == store::PoolSizing::kStatic) {
    DemandEstimate estimate = d.estimate;
    d = StaticTarget(floor, ceiling, waiting);
    d.estimate = estimate;
  }
  target_hint_.store(d.target, std::memory_order_relaxed);
  return d;
}

}  // namespace sbx::allocator
