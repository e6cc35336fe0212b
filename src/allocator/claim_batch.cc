// ClaimBatch: claims granted together (all or nothing, or best effort), and batches that
// wait for the refill (allocator_impl.h).

#include "src/allocator/allocator_impl.h"

namespace sbx::allocator::internal {

void AllocatorImpl::ClaimBatch(BatchRequest req, BatchCallback done) {
  if (req.batch_id.empty()) req.batch_id = ids_->Next();
  if (absl::Status s = ValidateKey("owner", req.owner); !s.ok()) return std::move(done)(s);
  if (absl::Status s = ValidateKey("batch id", req.batch_id); !s.ok()) return std::move(done)(s);
  if (req.batch_id.size() > kMaxBatchIdLength) {
    return std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("batch id \"", req.batch_id.substr(0, 40), "...\" is longer than ",
                     kMaxBatchIdLength, " characters")));
  }
  if (req.count < 1 || req.count > options_.max_batch) {
    return std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("batch count ", req.count, " is outside 1..", options_.max_batch)));
  }
  if (absl::Status s = CheckWait("wait", req.wait); !s.ok()) return std::move(done)(s);
  if (absl::Status s = ValidateShare(req.priority, req.weight, req.max_claims); !s.ok()) {
    return std::move(done)(s);
  }
  absl::StatusOr<Pool*> pool_or = FindPool(req.pool);
  if (!pool_or.ok()) return std::move(done)(pool_or.status());
  Pool* pool = *pool_or;
  const store::PoolRecord settings = pool->settings();
  absl::StatusOr<absl::Duration> ttl = EffectiveTtl(settings, req.ttl);
  if (!ttl.ok()) return std::move(done)(ttl.status());

  auto id_of = [&](int i) { return absl::StrCat(req.batch_id, "#", i); };
  // A retried batch: answer from the claims it made, if it is the same batch (claims.proto:
  // a batch id reused for another pool or count is ALREADY_EXISTS).
  if (EntryPtr first = claims_.Find(ClaimKey(req.owner, id_of(0)))) {
    std::vector<ClaimResult> results;
    for (int i = 0;; ++i) {
      EntryPtr e = i == 0 ? first : claims_.Find(ClaimKey(req.owner, id_of(i)));
      if (e == nullptr) break;
      absl::Status refused;
      {
        absl::MutexLock lock(&e->mu);
        if (e->pool != pool) {
          refused = absl::AlreadyExistsError(
              absl::StrCat("batch id \"", req.batch_id, "\" already names a batch on pool \"",
                           e->record.pool, "\"; this request is for pool \"", req.pool, "\""));
        } else if (e->record.batch_count != 0 && e->record.batch_count != req.count) {
          refused = absl::AlreadyExistsError(
              absl::StrCat("batch id \"", req.batch_id, "\" already names a batch of count ",
                           e->record.batch_count, " on pool \"", e->record.pool,
                           "\"; this request asks for count ", req.count));
        } else if (e->phase == ClaimEntry::Phase::kCommitting) {
          refused = absl::AbortedError(
              absl::StrCat("batch \"", req.batch_id, "\" is still being granted; retry"));
        } else {
          results.push_back(ClaimResult{RecordLocked(*e), true});
        }
      }
      if (!refused.ok()) return std::move(done)(refused);
    }
    // Claims stored without their batch's count (batch_count 0, from an older build): a
    // BEST_EFFORT batch may hold fewer claims than it asked for, so only more claims than
    // this request's count prove a different count.
    if (results.size() > static_cast<size_t>(req.count)) {
      return std::move(done)(absl::AlreadyExistsError(absl::StrCat(
          "batch id \"", req.batch_id, "\" already names a batch of ", results.size(),
          " claims on pool \"", req.pool, "\"; this request asks for count ", req.count)));
    }
    return std::move(done)(std::move(results));
  }

  // A new batch: all its slots of the owner's max_claims, or none.
  absl::StatusOr<OwnerClaims::Slots> slots = owners_.Take(req.owner, req.count, req.max_claims);
  if (!slots.ok()) {
    pool->counters().CountClaims(absl::StatusCode::kResourceExhausted, ClaimPath::kNone,
                                 static_cast<uint64_t>(req.count));
    return std::move(done)(slots.status());
  }

  pool->CountArrivals(static_cast<uint64_t>(req.count));
  std::vector<SandboxPtr> taken;
  taken.reserve(req.count);
  while (static_cast<int>(taken.size()) < req.count) {
    SandboxPtr sb = pool->TryTake(nullptr, &req.node_preference);
    if (sb == nullptr) break;
    taken.push_back(std::move(sb));
  }
  const bool short_all =
      req.mode == BatchMode::kAllOrNothing && static_cast<int>(taken.size()) < req.count;
  const EmptyPoolPolicy policy = req.policy.value_or(settings.empty_pool_policy);
  if ((short_all || taken.empty()) && policy != EmptyPoolPolicy::kFail) {
    const absl::Duration wait = req.wait > absl::ZeroDuration() ? req.wait : settings.default_wait;
    return WaitForBatch(std::move(req), pool, *ttl, std::move(taken), *std::move(slots), wait,
                        std::move(done));
  }
  if (short_all || taken.empty()) {
    slots->Reset();
    const size_t had = taken.size();
    for (SandboxPtr& sb : taken) {
      pool->GiveBack(std::move(sb));
    }
    reconciler_->PoolBelowTarget(pool->name());
    pool->counters().CountExhausted();
    pool->counters().CountClaims(absl::StatusCode::kResourceExhausted, ClaimPath::kNone,
                                 static_cast<uint64_t>(req.count));
    return std::move(done)(absl::ResourceExhaustedError(absl::StrCat(
        "pool \"", pool->name(), "\" had ", had, " warm sandboxes; the batch asked for ", req.count,
        "; retry after about 1s")));
  }
  GrantBatch(req, pool, *ttl, std::move(taken), *std::move(slots), std::move(done));
}

void AllocatorImpl::WaitForBatch(BatchRequest req, Pool* pool, absl::Duration ttl,
                                 std::vector<SandboxPtr> taken, OwnerClaims::Slots slots,
                                 absl::Duration wait, BatchCallback done) {
  reconciler_->PoolBelowTarget(pool->name());
  pool->counters().CountExhausted();
  const int missing = req.count - static_cast<int>(taken.size());
  // Not kept in the BatchWait: its action holds the BatchWait.
  std::shared_ptr<WaitCancellation> cancellation = std::move(req.cancellation);
  auto w = std::make_shared<BatchWait>(std::move(req), pool, ttl, std::move(done));
  {
    absl::MutexLock lock(&w->mu);
    w->taken = std::move(taken);
    w->waiters.reserve(missing);
    w->slots = std::move(slots);
  }
  // The deadline first: a batch served while its waiters are still being queued finds
  // it scheduled, and a deadline before the last waiter is queued cancels all queued.
  ScheduleTimer(clock_->Now() + wait, TimerTask::Kind::kBatchDeadline, nullptr, w);
  for (int i = 0; i < missing; ++i) {
    auto waiter = std::make_shared<Waiter>();
    waiter->deliver = [this, w](SandboxPtr sb) { DeliverToBatch(w, std::move(sb)); };
    waiter->owner = w->req.owner;
    waiter->priority = w->req.priority;
    waiter->weight = w->req.weight;
    {
      absl::MutexLock lock(&w->mu);
      if (w->finished) return;  // the deadline came first
      w->waiters.push_back(waiter);
    }
    if (SandboxPtr sb = pool->TakeOrEnqueue(waiter)) DeliverToBatch(w, std::move(sb));
  }
  if (cancellation) {
    cancellation->OnCancel([this, w] {
      GiveUpBatch(w,
                  absl::CancelledError(
                      absl::StrCat("batch \"", w->req.batch_id, "\" on pool \"", w->pool->name(),
                                   "\": the caller gave up waiting (its call was cancelled)")),
                  false);
    });
  }
}

void AllocatorImpl::DeliverToBatch(const BatchWaitPtr& w, SandboxPtr sb) {
  std::vector<SandboxPtr> taken;
  OwnerClaims::Slots slots;
  BatchCallback done;
  {
    absl::MutexLock lock(&w->mu);
    if (!w->finished) {
      w->taken.push_back(std::move(sb));
      if (static_cast<int>(w->taken.size()) < w->req.count) return;
      w->finished = true;
      taken = std::move(w->taken);
      slots = std::move(w->slots);
      done = std::move(w->done);
    }
  }
  if (sb != nullptr) {  // too late: back to the pool
    w->pool->GiveBack(std::move(sb));
    return;
  }
  GrantBatch(w->req, w->pool, w->ttl, std::move(taken), std::move(slots), std::move(done));
}

void AllocatorImpl::BatchDeadline(const BatchWaitPtr& w) {
  size_t had;
  {
    absl::MutexLock lock(&w->mu);
    had = w->taken.size();
  }
  GiveUpBatch(w,
              absl::DeadlineExceededError(
                  absl::StrCat("batch of ", w->req.count, " on pool \"", w->pool->name(),
                               "\": ", had, " sandboxes became ready within the wait (",
                               w->req.mode == BatchMode::kBestEffort ? "at least one" : "all",
                               " needed); nothing is held")),
              true);
}

void AllocatorImpl::GiveUpBatch(const BatchWaitPtr& w, absl::Status status,
                                bool grant_best_effort) {
  std::vector<SandboxPtr> taken;
  std::vector<WaiterPtr> waiters;
  OwnerClaims::Slots slots;  // given back on return unless granted
  BatchCallback done;
  {
    absl::MutexLock lock(&w->mu);
    if (w->finished) return;
    w->finished = true;
    taken = std::move(w->taken);
    waiters = std::move(w->waiters);
    slots = std::move(w->slots);
    done = std::move(w->done);
  }
  // A waiter already matched but not yet delivered gives its sandbox back on delivery.
  for (const WaiterPtr& waiter : waiters) w->pool->CancelWaiter(waiter);
  if (grant_best_effort && w->req.mode == BatchMode::kBestEffort && !taken.empty()) {
    return GrantBatch(w->req, w->pool, w->ttl, std::move(taken), std::move(slots), std::move(done));
  }
  slots.Reset();  // before the answer: a caller that retries at once finds them free
  for (SandboxPtr& sb : taken) {
    w->pool->GiveBack(std::move(sb));
  }
  w->pool->counters().CountClaims(status.code(), ClaimPath::kWait,
                                  static_cast<uint64_t>(w->req.count));
  std::move(done)(std::move(status));
}

void AllocatorImpl::GrantBatch(const BatchRequest& req, Pool* pool, absl::Duration ttl,
                               std::vector<SandboxPtr> taken, OwnerClaims::Slots slots,
                               BatchCallback done) {
  auto id_of = [&](int i) { return absl::StrCat(req.batch_id, "#", i); };
  const absl::Time now = clock_->Now();
  std::vector<EntryPtr> entries;
  entries.reserve(taken.size());
  // Every member's id must be new. The replay check above looked at member #0 only: a
  // later member of an earlier batch with this id may outlive it (members end and are
  // purged one by one), and a concurrent batch with this id may be inserting its members
  // now. The entries are invisible while committing (GetClaim, ListClaims).
  for (size_t i = 0; i < taken.size(); ++i) {
    const std::string id = id_of(static_cast<int>(i));
    auto e = std::make_shared<ClaimEntry>(ClaimKey(req.owner, id), pool);
    {
      absl::MutexLock lock(&e->mu);
      ClaimRecord& r = e->record;
      r.id = id;
      r.owner = req.owner;
      r.pool = req.pool;
      r.labels = req.labels;
      r.env = req.env;
      r.created = now;
      r.expires = ttl == absl::ZeroDuration() ? absl::InfiniteFuture() : now + ttl;
      r.launch_type = LaunchType::kWarm;
      r.batch_count = req.count;
      e->assigned = true;
      e->sandbox = taken[i];
    }
    auto [existing, inserted] = claims_.Insert(e);
    if (inserted) {
      entries.push_back(std::move(e));
      continue;
    }
    bool committing;
    {
      absl::MutexLock lock(&existing->mu);
      committing = existing->phase == ClaimEntry::Phase::kCommitting;
    }
    for (const EntryPtr& mine : entries) claims_.Erase(mine);
    slots.Reset();
    for (SandboxPtr& sb : taken) {
      pool->GiveBack(std::move(sb));
    }
    if (committing) {
      return std::move(done)(absl::AbortedError(
          absl::StrCat("batch \"", req.batch_id, "\" is still being granted; retry")));
    }
    return std::move(done)(absl::AlreadyExistsError(
        absl::StrCat("batch id \"", req.batch_id, "\" still names claim \"", id,
                     "\" of an earlier batch with this id (its claim \"", id_of(0),
                     "\" is gone); use a new batch id")));
  }
  store::WriteBatch batch;
  const uint64_t first_revision = hub_->Reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const EntryPtr& e = entries[i];
    {
      absl::MutexLock lock(&e->mu);
      e->record.revision = first_revision + i;
      e->slot = slots.Split(1);
      batch.Put(RecordLocked(*e));
    }
    absl::MutexLock lock(&taken[i]->mu);
    taken[i]->claim = e;
  }
  slots.Reset();  // those of members a BEST_EFFORT batch did not get
  if (pool->warm() < pool->target_hint()) reconciler_->PoolBelowTarget(pool->name());
  store_->Commit(std::move(batch), [this, pool, first_revision, entries = std::move(entries),
                                    done = std::move(done)](absl::Status s) mutable {
    if (!s.ok()) {
      for (EntryPtr& e : entries) {
        SandboxPtr sb;
        {
          absl::MutexLock lock(&e->mu);
          sb = std::move(e->sandbox);
          e->assigned = false;
        }
        FailEntry(e, s);
        pool->GiveBack(std::move(sb));
      }
      for (size_t i = 0; i < entries.size(); ++i) hub_->Complete(first_revision + i, nullptr);
      return std::move(done)(s);
    }
    std::vector<ClaimResult> results;
    results.reserve(entries.size());
    pool->AddClaimed(static_cast<int64_t>(entries.size()));
    for (EntryPtr& e : entries) {
      {
        absl::MutexLock lock(&e->mu);
        results.push_back(ClaimResult{RecordLocked(*e), false});
      }
      Activate(e);
    }
    std::move(done)(std::move(results));
  });
}

}  // namespace sbx::allocator::internal
