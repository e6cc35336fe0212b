#include "src/server/tenant_limits.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sbx::server {

TenantLimiter::TenantLimiter(const Clock* clock)
    : clock_(clock != nullptr ? clock : &Clock::Real()) {}

absl::Status TenantLimiter::TakeClaims(const Caller& caller, int claims) {
  const TenantLimits& limits = caller.limits;
  if (limits.claim_rate <= 0) return absl::OkStatus();
  if (claims > limits.claim_burst) {
    return absl::FailedPreconditionError(
        absl::StrCat("tenant \"", caller.tenant, "\" may claim at most ", limits.claim_burst,
                     " at once (its claim_burst); a batch of ", claims,
                     " can never be granted: ask for at most ", limits.claim_burst));
  }
  const absl::Time now = clock_->Now();
  double wait_seconds = 0;
  {
    absl::MutexLock lock(&mu_);
    auto [it, added] = buckets_.try_emplace(caller.tenant);
    Bucket& b = it->second;
    // New, or its rate changed at a reload (a change of namespaces keeps the bucket).
    if (added || b.limits.claim_rate != limits.claim_rate ||
        b.limits.claim_burst != limits.claim_burst) {
      b.limits = limits;
      b.tokens = limits.claim_burst;
      b.last = now;
    }
    if (now > b.last) {
      b.tokens = std::min<double>(
          limits.claim_burst, b.tokens + absl::ToDoubleSeconds(now - b.last) * limits.claim_rate);
      b.last = now;
    }
    if (b.tokens >= claims) {
      b.tokens -= claims;
      return absl::OkStatus();
    }
    ++b.refused;
    wait_seconds = (claims - b.tokens) / limits.claim_rate;
  }
  const int64_t wait_ms =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(wait_seconds * 1000)));
  absl::Status refused = absl::ResourceExhaustedError(absl::StrFormat(
      "tenant \"%s\" is above its claim rate (claim_rate %g/s, claim_burst %d); %d claim%s "
      "possible again in %d ms",
      caller.tenant, limits.claim_rate, limits.claim_burst, claims, claims == 1 ? " is" : "s are",
      wait_ms));
  refused.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(wait_ms)));
  return refused;
}

std::vector<std::pair<std::string, uint64_t>> TenantLimiter::Refusals() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [tenant, b] : buckets_) {
    if (b.refused > 0) out.emplace_back(tenant, b.refused);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sbx::server
