// The claim path: a claim from its request until it is active (allocator_impl.h;
// docs/architecture.md, "The path of a claim").

#include "src/allocator/allocator_impl.h"
#include "src/common/dropped.h"

namespace sbx::allocator::internal {

void AllocatorImpl::Claim(ClaimRequest req, ClaimCallback done) {
  if (req.claim_id.empty()) req.claim_id = ids_->Next();
  if (absl::Status s = ValidateClaimRequest(req); !s.ok()) return std::move(done)(s);
  absl::StatusOr<Pool*> pool_or = FindPool(req.pool);
  if (!pool_or.ok()) return std::move(done)(pool_or.status());
  Pool* pool = *pool_or;
  const store::PoolRecord settings = pool->settings();
  absl::StatusOr<absl::Duration> ttl = EffectiveTtl(settings, req.ttl);
  if (!ttl.ok()) return std::move(done)(ttl.status());

  auto entry = std::make_shared<ClaimEntry>(ClaimKey(req.owner, req.claim_id), pool);
  {
    absl::MutexLock lock(&entry->mu);
    ClaimRecord& r = entry->record;
    r.id = std::move(req.claim_id);
    r.owner = std::move(req.owner);
    r.pool = std::move(req.pool);
    r.labels = std::move(req.labels);
    r.env = std::move(req.env);
    r.created = clock_->Now();
    // Expiry counts from the request; InfiniteFuture when the claim has no TTL.
    r.expires = *ttl == absl::ZeroDuration() ? absl::InfiniteFuture() : r.created + *ttl;
    entry->callbacks.emplace_back(std::move(done), false);
  }
  auto [existing, inserted] = claims_.Insert(entry);
  if (!inserted) {
    ClaimCallback cb;
    {
      absl::MutexLock lock(&entry->mu);
      cb = std::move(entry->callbacks.front().first);
    }
    return AnswerExisting(existing, pool, std::move(cb), req.cancellation);
  }
  // The owner's slot is taken once the claim is known to be new, so that a retry of an
  // existing claim is answered even when its owner is at its maximum.
  absl::StatusOr<OwnerClaims::Slots> slot = owners_.Take(OwnerOf(*entry), 1, req.max_claims);
  if (!slot.ok()) {
    {
      absl::MutexLock lock(&entry->mu);
      entry->path = ClaimPath::kNone;
    }
    return FailEntry(entry, slot.status());
  }
  {
    absl::MutexLock lock(&entry->mu);
    entry->slot = *std::move(slot);
  }

  pool->CountArrivals(1);
  const std::function<void(const SandboxPtr&)>* hook =
      options_.after_pop ? &options_.after_pop : nullptr;
  if (SandboxPtr sb = pool->TryTake(hook, &req.node_preference)) {
    {
      absl::MutexLock lock(&entry->mu);
      entry->assigned = true;
    }
    CommitClaim(entry, std::move(sb), LaunchType::kWarm, false);
    if (pool->warm() < pool->target_hint()) reconciler_->PoolBelowTarget(pool->name());
    return;
  }

  const EmptyPoolPolicy policy = req.policy.value_or(settings.empty_pool_policy);
  const absl::Duration wait = req.wait > absl::ZeroDuration() ? req.wait : settings.default_wait;
  reconciler_->PoolBelowTarget(pool->name());
  pool->counters().CountExhausted();
  {
    absl::MutexLock lock(&entry->mu);
    entry->path = policy == EmptyPoolPolicy::kWait   ? ClaimPath::kWait
                  : policy == EmptyPoolPolicy::kCold ? ClaimPath::kCold
                                                     : ClaimPath::kNone;
  }
  switch (policy) {
    case EmptyPoolPolicy::kFail:
      FailEntry(entry,
                absl::ResourceExhaustedError(absl::StrCat(
                    "pool \"", pool->name(), "\" has no warm sandbox (target ", pool->target_hint(),
                    "); retry after about 1s, or claim with policy WAIT or COLD")));
      return;
    case EmptyPoolPolicy::kWait:
      Wait(entry, wait, req.priority, req.weight);
      if (req.cancellation) {
        req.cancellation->OnCancel([this, entry] { CallGaveUp(entry); });
      }
      return;
    case EmptyPoolPolicy::kCold:
      return ColdStart(entry, settings, wait);
  }
}

void AllocatorImpl::AnswerExisting(const EntryPtr& e, Pool* pool, ClaimCallback done,
                                   const std::shared_ptr<WaitCancellation>& cancellation) {
  absl::StatusOr<ClaimResult> answer;
  {
    absl::MutexLock lock(&e->mu);
    if (e->pool != pool) {
      answer = absl::AlreadyExistsError(absl::StrCat("claim id \"", e->record.id,
                                                     "\" already names a claim on pool \"",
                                                     e->record.pool, "\""));
    } else if (e->phase == ClaimEntry::Phase::kCommitting) {
      e->callbacks.emplace_back(std::move(done), true);
      ++e->calls;
      if (cancellation) cancellation->OnCancel([this, e] { CallGaveUp(e); });
      return;
    } else if (e->phase == ClaimEntry::Phase::kActive || e->phase == ClaimEntry::Phase::kUpdating) {
      answer = ClaimResult{RecordLocked(*e), true};
    } else {
      answer = absl::FailedPreconditionError(absl::StrCat(
          "claim \"", e->record.id, "\" ", EndedVerb(e->record.state), "; use a new claim id"));
    }
  }
  std::move(done)(std::move(answer));
}

void AllocatorImpl::CallGaveUp(const EntryPtr& e) {
  WaiterPtr waiter;
  std::string id;
  {
    absl::MutexLock lock(&e->mu);
    if (--e->calls > 0) return;
    waiter = e->waiter;
    id = e->record.id;
  }
  if (waiter == nullptr || !e->pool->CancelWaiter(waiter)) return;  // served meanwhile
  FailEntry(e, absl::CancelledError(
                   absl::StrCat("claim \"", id, "\" on pool \"", e->pool->name(),
                                "\": the caller gave up waiting (its call was cancelled)")));
}

void AllocatorImpl::FailEntry(const EntryPtr& e, absl::Status status) {
  std::vector<std::pair<ClaimCallback, bool>> callbacks;
  ClaimPath path;
  {
    absl::MutexLock lock(&e->mu);
    if (e->assigned || e->failed) return;
    e->failed = true;
    e->phase = ClaimEntry::Phase::kEnded;
    callbacks = std::move(e->callbacks);
    e->waiter = nullptr;
    path = e->path;
    e->slot.Reset();
  }
  e->pool->counters().CountClaims(status.code(), path);
  claims_.Erase(e);
  for (auto& [cb, _] : callbacks) std::move(cb)(status);
}

void AllocatorImpl::Deliver(const EntryPtr& e, SandboxPtr sb, LaunchType launch, bool new_sandbox) {
  bool assigned;
  {
    absl::MutexLock lock(&e->mu);
    assigned = !e->failed;
    e->assigned = assigned;
    e->waiter = nullptr;
  }
  if (!assigned) {
    if (new_sandbox) {
      store::WriteBatch batch;
      batch.Put(RecordOf(*sb));
      store_->Commit(std::move(batch), DropTo{"allocator.unassigned_sandbox_commit"});
    }
    e->pool->GiveBack(std::move(sb));
    return;
  }
  CommitClaim(e, std::move(sb), launch, new_sandbox);
}

void AllocatorImpl::Wait(const EntryPtr& e, absl::Duration wait, ClaimPriority priority,
                         int weight) {
  auto waiter = std::make_shared<Waiter>();
  waiter->deliver = [this, e](SandboxPtr sb) {
    Deliver(e, std::move(sb), LaunchType::kWarm, false);
  };
  waiter->owner = std::string(OwnerOf(*e));
  waiter->priority = priority;
  waiter->weight = weight;
  {
    absl::MutexLock lock(&e->mu);
    e->waiter = waiter;
  }
  if (SandboxPtr sb = e->pool->TakeOrEnqueue(waiter)) {
    return Deliver(e, std::move(sb), LaunchType::kWarm, false);
  }
  // Scheduled after queueing, so that the deadline always finds the waiter queued (or
  // sees that it was served).
  ScheduleTimer(clock_->Now() + wait, TimerTask::Kind::kWaitDeadline, e);
}

void AllocatorImpl::ColdStart(const EntryPtr& e, const store::PoolRecord& settings,
                              absl::Duration wait) {
  if (runtime_ == nullptr) {
    return FailEntry(e, absl::FailedPreconditionError(absl::StrCat(
                            "pool \"", e->pool->name(),
                            "\" is empty and this allocator has no runtime for cold starts")));
  }
  runtime::CreateRequest req;
  req.pool = e->pool->name();
  req.template_name = settings.template_name;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = templates_.find(settings.template_name);
    if (it != templates_.end()) req.template_spec = it->second.spec;
  }
  ScheduleTimer(clock_->Now() + wait, TimerTask::Kind::kColdDeadline, e);
  runtime_->Create(std::move(req), [this, e](absl::StatusOr<runtime::SandboxInfo> info) {
    if (!info.ok()) return FailEntry(e, info.status());
    auto sb = std::make_shared<Sandbox>(info->id, info->endpoint, info->node, e->pool,
                                        clock_->Now(), SandboxState::kClaimed,
                                        InternNodeLabels(info->node, info->node_labels));
    e->pool->AdoptClaimed(*sb);
    {
      absl::MutexLock lock(&sandboxes_mu_);
      sandboxes_.insert(sb);
    }
    Deliver(e, std::move(sb), LaunchType::kCold, true);
  });
}

void AllocatorImpl::CommitClaim(const EntryPtr& e, SandboxPtr sb, LaunchType launch,
                                bool new_sandbox) {
  {
    absl::MutexLock lock(&sb->mu);
    sb->claim = e;
  }
  store::WriteBatch batch;
  if (new_sandbox) batch.Put(RecordOf(*sb));
  uint64_t revision;
  {
    absl::MutexLock lock(&e->mu);
    e->record.launch_type = launch;
    // The entry is invisible while committing, so its record may carry the revision
    // before the change is durable.
    e->record.revision = revision = hub_->Reserve();
    e->sandbox = sb;
    batch.Put(RecordLocked(*e));
  }
  store_->Commit(std::move(batch), [this, e, sb, revision](absl::Status s) {
    if (!s.ok()) {
      {
        absl::MutexLock lock(&sb->mu);
        sb->claim.reset();
      }
      {
        absl::MutexLock lock(&e->mu);
        e->assigned = false;
        e->sandbox = nullptr;
      }
      e->pool->GiveBack(sb);
      FailEntry(e, s);
      hub_->Complete(revision, nullptr);
      return;
    }
    e->pool->AddClaimed(1);
    Activate(e);
  });
}

void AllocatorImpl::Activate(const EntryPtr& e) {
  std::vector<std::pair<ClaimCallback, bool>> callbacks;
  ClaimRecord record;
  bool gone;
  ClaimPath path;
  {
    absl::MutexLock lock(&e->mu);
    e->phase = ClaimEntry::Phase::kActive;
    callbacks = std::move(e->callbacks);
    record = RecordLocked(*e);
    ArmExpiryLocked(e);
    gone = e->sandbox->gone.load(std::memory_order_seq_cst);
    path = e->path;
  }
  PoolCounters& counters = e->pool->counters();
  counters.CountClaims(absl::StatusCode::kOk, path);
  counters.ObserveLatency(path, clock_->Now() - record.created);
  // Published after the entry is active: whoever sees the revision sees the claim.
  hub_->Complete(record.revision, MakeEvent(ClaimEvent::Type::kAdded, record));
  for (auto& [cb, replayed] : callbacks) std::move(cb)(ClaimResult{record, replayed});
  if (gone)
    EndClaim(e, ClaimState::kLost,
             DropTo{"allocator.lost_after_claim", absl::StatusCode::kFailedPrecondition});
}

}  // namespace sbx::allocator::internal
