#include "src/allocator/allocator_impl.h"

#include "src/allocator/allocator.h"

namespace sbx::allocator {
namespace internal {

void AllocatorImpl::Renew(const std::string& owner, const std::string& claim_id, absl::Duration ttl,
                          ClaimCallback done) {
  EntryPtr e = claims_.Find(ClaimKey(owner, claim_id));
  if (e == nullptr) return std::move(done)(NotFound(claim_id));
  if (ttl <= absl::ZeroDuration()) {
    return std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("renew ttl ", absl::FormatDuration(ttl), " must be positive")));
  }
  if (ttl != absl::InfiniteDuration()) {
    if (absl::Status s = CheckMaxTtl("ttl", ttl); !s.ok()) return std::move(done)(s);
  }
  const store::PoolRecord settings = e->pool->settings();
  if (settings.max_ttl > absl::ZeroDuration() && ttl > settings.max_ttl) ttl = settings.max_ttl;
  // A pool stored before TTLs were bounded may carry a max_ttl above kMaxTtl.
  if (ttl != absl::InfiniteDuration()) ttl = std::min(ttl, kMaxTtl);
  const absl::Time expires = clock_->Now() + ttl;
  store::WriteBatch batch;
  absl::Status refused;
  uint64_t revision = 0;
  {
    absl::MutexLock lock(&e->mu);
    refused = BeginChangeLocked(*e, ClaimEntry::Phase::kUpdating);
    if (refused.ok()) {
      ClaimRecord renewed = RecordLocked(*e);
      renewed.expires = expires;
      renewed.revision = revision = hub_->Reserve();
      batch.Put(std::move(renewed));
    }
  }
  if (!refused.ok()) return std::move(done)(refused);
  CommitUpdate(
      e, std::move(batch), revision, [expires](ClaimRecord& r) { r.expires = expires; },
      std::move(done));
}

}  // namespace internal

absl::Status CheckMaxTtl(absl::string_view field, absl::Duration ttl) {
  if (ttl <= kMaxTtl) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " ", absl::FormatDuration(ttl),
                                                 " is above the maximum ",
                                                 absl::FormatDuration(kMaxTtl), " (100 years)"));
}

absl::Status CheckWait(absl::string_view field, absl::Duration wait) {
  if (wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", absl::FormatDuration(wait), " is negative"));
  }
  if (wait > kMaxWait) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", absl::FormatDuration(wait),
                                                   " is above ", absl::FormatDuration(kMaxWait)));
  }
  return absl::OkStatus();
}

absl::string_view KnownSelectionPolicies() { return kKnownSelectionPolicies; }

bool IsSelectionPolicy(absl::string_view name) { return NewSelectionPolicy(name).ok(); }

absl::StatusOr<std::unique_ptr<Allocator>> Allocator::Create(AllocatorOptions options,
                                                             store::Store* store,
                                                             runtime::Runtime* runtime,
                                                             Reconciler* reconciler, Clock* clock,
                                                             IdGenerator* ids) {
  RETURN_IF_ERROR(options.Validate());
  // Debian builds abseil without NDEBUG, which turns on absl::Mutex deadlock detection:
  // a process-wide graph of every mutex ever locked. With one mutex per claim and per
  // sandbox that graph grows with every claim and makes locking O(mutexes). sbx's lock
  // order is checked at compile time by -Wthread-safety instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (store == nullptr || reconciler == nullptr || clock == nullptr || ids == nullptr) {
    return absl::InvalidArgumentError("allocator needs a store, a reconciler, a clock and ids");
  }
  auto a = std::make_unique<internal::AllocatorImpl>(std::move(options), store, runtime, reconciler,
                                                     clock, ids);
  RETURN_IF_ERROR(a->Recover());
  a->StartTimerThread();
  return std::unique_ptr<Allocator>(std::move(a));
}

absl::Status AllocatorOptions::Validate() const {
  if (claim_shards < 1 || (claim_shards & (claim_shards - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim_shards ", claim_shards, " is not a power of two"));
  }
  if (idempotency_window < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("idempotency_window is negative");
  }
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch ", max_batch, " is below 1"));
  }
  if (max_pool_warm < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pool_warm ", max_pool_warm, " is negative"));
  }
  RETURN_IF_ERROR(ValidateName("default_namespace", default_namespace));
  RETURN_IF_ERROR(demand.Validate());
  return absl::OkStatus();
}

}  // namespace sbx::allocator
