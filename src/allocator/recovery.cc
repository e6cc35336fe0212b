// Recover: the allocator rebuilt from the store at start (allocator_impl.h).

#include "src/allocator/allocator_impl.h"

namespace sbx::allocator::internal {

absl::Status AllocatorImpl::Recover() {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(store::Contents contents, store_->LoadAll());
  // The revision sequence continues after every revision the store holds: the mark covers
  // deleted claims, the records the rest (a record is only ever rewritten with a higher
  // revision).
  uint64_t revision = contents.revision;
  for (const ClaimRecord& c : contents.claims) revision = std::max(revision, c.revision);
  recovery_.revision = revision;
  hub_ = std::make_shared<WatchHub>(revision, options_.watch_history, options_.watch_queue);
  recovery_.snapshots = std::move(contents.snapshots);
  recovery_.templates = contents.templates.size();
  recovery_.pools = contents.pools.size();
  absl::flat_hash_map<std::string, Pool*> pools;
  {
    absl::MutexLock lock(&mu_);
    for (auto& t : contents.templates) {
      std::string name = t.name;
      templates_.emplace(std::move(name), std::move(t));
    }
    for (const auto& p : contents.pools) pools[p.name] = AddPoolLocked(p);
  }
  auto pool_of = [&](const std::string& name) -> Pool* {
    auto it = pools.find(name);
    return it == pools.end() ? nullptr : it->second;
  };

  // First pass, on views into `contents`: which sandbox each active claim holds. A sandbox
  // held twice means the store is inconsistent; refuse it rather than guess.
  absl::flat_hash_map<absl::string_view, size_t> bound;  // sandbox id -> claim index
  bound.reserve(contents.claims.size());
  for (size_t i = 0; i < contents.claims.size(); ++i) {
    const ClaimRecord& c = contents.claims[i];
    if (c.state != ClaimState::kActive) continue;
    auto [it, fresh] = bound.try_emplace(c.sandbox_id, i);
    if (!fresh) {
      const ClaimRecord& other = contents.claims[it->second];
      return absl::DataLossError(absl::StrCat(
          "store holds sandbox \"", c.sandbox_id, "\" bound to two active claims, \"",
          ClaimKey(other.owner, other.id), "\" and \"", ClaimKey(c.owner, c.id), "\""));
    }
    if (pool_of(c.pool) == nullptr) {
      return absl::DataLossError(absl::StrCat("store holds active claim \"",
                                              ClaimKey(c.owner, c.id), "\" of pool \"", c.pool,
                                              "\", which does not exist"));
    }
  }
  // Sandbox records by id, for the claims that hold them.
  absl::flat_hash_map<absl::string_view, const store::SandboxRecord*> records;
  records.reserve(contents.sandboxes.size());
  for (const auto& sb : contents.sandboxes) records.emplace(sb.id, &sb);

  claims_.Reserve(contents.claims.size());
  {
    absl::MutexLock lock(&sandboxes_mu_);
    sandboxes_.reserve(contents.sandboxes.size() + bound.size());
  }
  // Sandboxes held by no active claim are warm again (the reconciler then checks with
  // the runtime that they still exist). Done before the claims below are moved out of
  // `contents`, since `bound` and `records` look into them.
  for (const store::SandboxRecord& rec : contents.sandboxes) {
    if (bound.contains(rec.id)) continue;
    Pool* pool = pool_of(rec.pool);
    if (pool == nullptr) {
      ++recovery_.dropped_sandboxes;
      reconciler_->RetireSandbox(rec);
      continue;
    }
    auto sb =
        std::make_shared<Sandbox>(rec.id, rec.endpoint, rec.node, pool, rec.created,
                                  SandboxState::kWarm, InternNodeLabels(rec.node, rec.node_labels));
    {
      absl::MutexLock lock(&sandboxes_mu_);
      sandboxes_.insert(sb);
    }
    pool->AddWarm(std::move(sb));
  }
  const absl::Time now = clock_->Now();
  for (ClaimRecord& c : contents.claims) {
    Pool* pool = pool_of(c.pool);
    auto e = std::make_shared<ClaimEntry>(ClaimKey(c.owner, c.id), pool);
    if (c.state != ClaimState::kActive) {
      const absl::Time purge_at = c.ended + options_.idempotency_window;
      {
        absl::MutexLock lock(&e->mu);
        e->phase = ClaimEntry::Phase::kEnded;
        e->record = std::move(c);
      }
      claims_.Insert(e);
      ScheduleTimer(std::max(purge_at, now), TimerTask::Kind::kPurge, std::move(e));
      ++recovery_.ended_claims;
      continue;
    }
    auto rec = records.find(c.sandbox_id);
    const store::SandboxRecord* r = rec == records.end() ? nullptr : rec->second;
    auto sb = std::make_shared<Sandbox>(
        std::move(c.sandbox_id), r != nullptr ? r->endpoint : std::move(c.endpoint),
        r != nullptr ? r->node : std::string(), pool, r != nullptr ? r->created : c.created,
        SandboxState::kClaimed, r != nullptr ? InternNodeLabels(r->node, r->node_labels) : nullptr);
    pool->AdoptClaimed(*sb);
    c.sandbox_id = std::string();
    c.endpoint = std::string();
    {
      absl::MutexLock lock(&sb->mu);
      sb->claim = e;
    }
    {
      absl::MutexLock lock(&sandboxes_mu_);
      sandboxes_.insert(sb);
    }
    {
      absl::MutexLock lock(&e->mu);
      e->phase = ClaimEntry::Phase::kActive;
      e->assigned = true;
      e->sandbox = std::move(sb);
      e->record = std::move(c);
      ArmExpiryLocked(e);
      // Counted whatever the owner's maximum is now (0: none): an owner recovered above a
      // lowered max_claims is refused new claims until it is below it.
      e->slot = *owners_.Take(OwnerOf(*e), 1, 0);
    }
    pool->AddClaimed(1);
    claims_.Insert(std::move(e));
    ++recovery_.active_claims;
  }
  recovery_.sandboxes = contents.sandboxes.size();
  recovery_.took = absl::Now() - start;
  return absl::OkStatus();
}

}  // namespace sbx::allocator::internal
