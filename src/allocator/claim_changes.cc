// Changes of an active claim and their timers: ending (release, expiry, loss),
// suspension, purging after the idempotency window (allocator_impl.h).

#include "src/allocator/allocator_impl.h"
#include "src/common/dropped.h"

namespace sbx::allocator::internal {

void AllocatorImpl::EndClaim(const EntryPtr& e, ClaimState end, EndedCallback done) {
  store::WriteBatch batch;
  SandboxPtr sb;
  absl::Status refused;
  std::optional<ClaimRecord> ended_before;
  absl::Time ended_at;
  uint64_t revision = 0;
  {
    absl::MutexLock lock(&e->mu);
    if (e->phase == ClaimEntry::Phase::kEnding) {
      e->end_waiters.push_back(std::move(done));
      return;
    }
    if (e->phase == ClaimEntry::Phase::kEnded) ended_before = RecordLocked(*e);
    refused = BeginChangeLocked(*e, ClaimEntry::Phase::kEnding);
    if (refused.ok()) {
      ClaimRecord ended = RecordLocked(*e);
      ended.state = end;
      ended.ended = ended_at = clock_->Now();
      ended.revision = revision = hub_->Reserve();
      batch.Put(std::move(ended));
      sb = e->sandbox;
      batch.DeleteSandbox(sb->id);
    }
  }
  // Callbacks never run under a lock: they may call back into the allocator.
  if (ended_before.has_value()) return std::move(done)(*std::move(ended_before));
  if (!refused.ok()) return std::move(done)(refused);
  store_->Commit(std::move(batch), [this, e, end, sb, ended_at, revision,
                                    done = std::move(done)](absl::Status s) mutable {
    std::vector<EndedCallback> waiters;
    if (!s.ok()) {
      {
        absl::MutexLock lock(&e->mu);
        e->phase = ClaimEntry::Phase::kActive;
        ArmExpiryLocked(e);
        waiters.swap(e->end_waiters);
      }
      hub_->Complete(revision, nullptr);
      for (EndedCallback& w : waiters) {
        std::move(w)(absl::AbortedError(
            absl::StrCat("the end of claim \"", e->key, "\" being committed failed; retry")));
      }
      return std::move(done)(s);
    }
    ClaimRecord record;
    {
      absl::MutexLock lock(&e->mu);
      e->phase = ClaimEntry::Phase::kEnded;
      e->record.state = end;
      e->record.ended = ended_at;
      e->record.revision = revision;
      // e->sandbox stays: the ended claim still reports which sandbox it held.
      record = RecordLocked(*e);
      waiters.swap(e->end_waiters);
      e->slot.Reset();  // durably ended: the owner may claim again
    }
    for (EndedCallback& w : waiters) std::move(w)(record);
    ClaimRecord answer = record;
    hub_->Complete(revision, MakeEvent(ClaimEvent::Type::kModified, std::move(record)));
    e->pool->Retire(sb);
    e->pool->AddClaimed(-1);
    e->pool->counters().CountEnded(end);
    ForgetSandbox(sb->id);
    if (end != ClaimState::kLost) reconciler_->RetireSandbox(RecordOf(*sb));
    reconciler_->PoolBelowTarget(e->pool->name());
    ScheduleTimer(ended_at + options_.idempotency_window, TimerTask::Kind::kPurge, e);
    std::move(done)(std::move(answer));
  });
}

void AllocatorImpl::Fire(TimerTask t) {
  const EntryPtr& e = t.entry;
  switch (t.kind) {
    case TimerTask::Kind::kExpire:
      return EndClaim(e, ClaimState::kExpired,
                      DropTo{"allocator.expire", absl::StatusCode::kFailedPrecondition});
    case TimerTask::Kind::kPurge:
      // After the idempotency window an ended claim leaves the table and the store.
      if (claims_.Erase(e)) Purge(e);
      return;
    case TimerTask::Kind::kWaitDeadline: {
      WaiterPtr waiter;
      absl::Duration waited;
      {
        absl::MutexLock lock(&e->mu);
        waiter = e->waiter;
        waited = clock_->Now() - e->record.created;
      }
      if (waiter == nullptr || !e->pool->CancelWaiter(waiter)) return;  // served meanwhile
      return FailEntry(e, absl::DeadlineExceededError(absl::StrCat(
                              "no sandbox of pool \"", e->pool->name(), "\" became ready within ",
                              absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))))));
    }
    case TimerTask::Kind::kBatchDeadline:
      return BatchDeadline(t.batch);
    case TimerTask::Kind::kColdDeadline: {
      absl::Duration waited;
      {
        absl::MutexLock lock(&e->mu);
        waited = clock_->Now() - e->record.created;
      }
      return FailEntry(
          e, absl::DeadlineExceededError(absl::StrCat(
                 "cold start of a sandbox of pool \"", e->pool->name(), "\" took longer than ",
                 absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))))));
    }
  }
}

void AllocatorImpl::Purge(EntryPtr e) {
  {
    absl::MutexLock lock(&purge_mu_);
    purges_.push_back(std::move(e));
    if (purging_) return;  // the thread that is purging takes it
    purging_ = true;
  }
  while (true) {
    EntryPtr next;
    {
      absl::MutexLock lock(&purge_mu_);
      if (purges_.empty()) {
        purging_ = false;
        return;
      }
      next = std::move(purges_.front());
      purges_.pop_front();
    }
    ClaimRecord last;
    {
      absl::MutexLock lock(&next->mu);
      last = RecordLocked(*next);
    }
    last.revision = hub_->Reserve();
    store::WriteBatch batch;
    batch.DeleteClaim(last.owner, last.id);
    batch.Put(store::RevisionRecord{last.revision});
    // No lock is held here: with an inline store the callback runs inside Commit.
    store_->Commit(std::move(batch), [this, last = std::move(last)](absl::Status s) mutable {
      const uint64_t revision = last.revision;
      if (!s.ok()) {
        spdlog::warn("purge of claim \"{}\" failed: {}", ClaimKey(last.owner, last.id),
                     s.ToString());
        return hub_->Complete(revision, nullptr);
      }
      hub_->Complete(revision, MakeEvent(ClaimEvent::Type::kDeleted, std::move(last)));
    });
  }
}

void AllocatorImpl::SetSuspended(const std::string& owner, const std::string& claim_id,
                                 bool suspend, ClaimCallback done) {
  EntryPtr e = claims_.Find(ClaimKey(owner, claim_id));
  if (e == nullptr) return std::move(done)(NotFound(claim_id));
  if (runtime_ == nullptr) {
    return std::move(done)(absl::FailedPreconditionError(
        absl::StrCat("claim \"", claim_id, "\": this allocator has no runtime to ",
                     suspend ? "suspend" : "resume", " sandboxes with")));
  }
  std::string sandbox_id;
  absl::Status refused;
  {
    absl::MutexLock lock(&e->mu);
    refused = BeginChangeLocked(*e, ClaimEntry::Phase::kUpdating);
    if (refused.ok()) {
      sandbox_id = e->sandbox->id;
    }
  }
  if (!refused.ok()) return std::move(done)(refused);
  if (suspend) {
    runtime_->Suspend(std::move(sandbox_id),
                      [this, e, done = std::move(done)](absl::Status s) mutable {
                        FinishSetSuspended(e, true, std::move(s), nullptr, std::move(done));
                      });
  } else {
    runtime_->Resume(std::move(sandbox_id), [this, e, done = std::move(done)](
                                                absl::StatusOr<runtime::SandboxInfo> s) mutable {
      const runtime::SandboxInfo* at = s.ok() ? &*s : nullptr;
      FinishSetSuspended(e, false, s.status(), at, std::move(done));
    });
  }
}

void AllocatorImpl::FinishSetSuspended(const EntryPtr& e, bool suspend, absl::Status runtime_status,
                                       const runtime::SandboxInfo* resumed_at, ClaimCallback done) {
  ClaimRecord updated;
  std::optional<store::SandboxRecord> moved;
  bool changed = false;
  bool gone = false;
  {
    absl::MutexLock lock(&e->mu);
    if (resumed_at != nullptr && !resumed_at->endpoint.empty() &&
        resumed_at->endpoint != RecordLocked(*e).endpoint) {
      moved = RecordOf(*e->sandbox);
      moved->endpoint = resumed_at->endpoint;
      moved->node = resumed_at->node;
    }
    if (runtime_status.ok()) changed = e->record.suspended != suspend || moved.has_value();
    if (changed) {
      updated = RecordLocked(*e);
      updated.suspended = suspend;
      if (moved) updated.endpoint = moved->endpoint;
      updated.revision = hub_->Reserve();
    } else {
      e->phase = ClaimEntry::Phase::kActive;
      ArmExpiryLocked(e);
      if (runtime_status.ok()) updated = RecordLocked(*e);
      gone = e->sandbox->gone.load(std::memory_order_seq_cst);
    }
  }
  if (!changed) {
    if (runtime_status.ok()) {
      std::move(done)(ClaimResult{std::move(updated), false});
    } else {
      std::move(done)(absl::Status(
          runtime_status.code(),
          absl::StrCat(suspend ? "suspending" : "resuming", " the sandbox of claim \"",
                       e->key.substr(e->key.find('/') + 1), "\": ", runtime_status.message())));
    }
    // The sandbox died while the runtime was asked (SandboxGone skips updating claims).
    if (gone)
      EndClaim(e, ClaimState::kLost,
               DropTo{"allocator.lost_after_suspend", absl::StatusCode::kFailedPrecondition});
    return;
  }
  const uint64_t revision = updated.revision;
  store::WriteBatch batch;
  batch.Put(std::move(updated));
  std::string endpoint;
  if (moved) {
    endpoint = moved->endpoint;
    batch.Put(*std::move(moved));
  }
  CommitUpdate(
      e, std::move(batch), revision,
      [e, suspend, endpoint = std::move(endpoint)](ClaimRecord& r)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu) {
            r.suspended = suspend;
            if (!endpoint.empty()) e->moved_endpoint = endpoint;
          },
      std::move(done));
}

void AllocatorImpl::CommitUpdate(const EntryPtr& e, store::WriteBatch batch, uint64_t revision,
                                 absl::AnyInvocable<void(ClaimRecord&)> apply, ClaimCallback done) {
  store_->Commit(std::move(batch), [this, e, revision, apply = std::move(apply),
                                    done = std::move(done)](absl::Status s) mutable {
    absl::StatusOr<ClaimResult> result = s.ok() ? absl::UnknownError("unset") : s;
    bool gone;
    {
      absl::MutexLock lock(&e->mu);
      if (s.ok()) {
        apply(e->record);
        e->record.revision = revision;
        result = ClaimResult{RecordLocked(*e), false};
      }
      e->phase = ClaimEntry::Phase::kActive;
      ArmExpiryLocked(e);
      gone = e->sandbox->gone.load(std::memory_order_seq_cst);
    }
    hub_->Complete(revision,
                   s.ok() ? MakeEvent(ClaimEvent::Type::kModified, result->claim) : nullptr);
    std::move(done)(std::move(result));
    // The sandbox died while the claim was being updated (SandboxGone skips such claims).
    if (gone)
      EndClaim(e, ClaimState::kLost,
               DropTo{"allocator.lost_after_update", absl::StatusCode::kFailedPrecondition});
  });
}

void AllocatorImpl::TimerLoop() {
  absl::MutexLock lock(&timer_mu_);
  while (!stopping_) {
    timer_wake_ = false;
    timer_mu_.Unlock();
    Tick();
    const absl::Time next = std::min(timers_.NextDeadline(), clock_->Now() + absl::Seconds(1));
    timer_mu_.Lock();
    if (!timer_wake_) clock_->AwaitUntil(timer_mu_, &timer_wake_, next);
  }
}

}  // namespace sbx::allocator::internal
