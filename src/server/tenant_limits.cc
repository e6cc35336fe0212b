#include "src/server/tenant_limits.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sbx::server {
namespace {

// The tokens-file names of each bucket's limits, and how a refusal describes them.
struct RateNames {
  const char* rate;
  const char* burst;
  const char* what;
};
constexpr RateNames kClaimRate{"claim_rate", "claim_burst", "claim rate"};
constexpr RateNames kImageClaimRate{"image_claim_rate", "image_claim_burst",
                                    "image claim rate (claims by image that no declared "
                                    "pool serves)"};

}  // namespace

TenantLimiter::TenantLimiter(const Clock* clock)
    : clock_(clock != nullptr ? clock : &Clock::Real()) {}

absl::Status TenantLimiter::TakeClaims(const Caller& caller, int claims) {
  return Take(caller, Rate::kClaim, caller.limits.claim_rate, caller.limits.claim_burst, claims);
}

absl::Status TenantLimiter::TakeImageClaims(const Caller& caller, int claims) {
  return Take(caller, Rate::kImageClaim, caller.limits.image_claim_rate,
              caller.limits.image_claim_burst, claims);
}

void TenantLimiter::CountRefusal(const std::string& tenant, absl::string_view limit) {
  absl::MutexLock lock(&mu_);
  ++refused_[{tenant, std::string(limit)}];
}

absl::Status TenantLimiter::Take(const Caller& caller, Rate which, double rate, int burst,
                                 int claims) {
  if (rate <= 0) return absl::OkStatus();
  const RateNames& names = which == Rate::kClaim ? kClaimRate : kImageClaimRate;
  if (claims > burst) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tenant \"", caller.tenant, "\" may claim at most ", burst, " at once (its ", names.burst,
        "); a batch of ", claims, " can never be granted: ask for at most ", burst));
  }
  const absl::Time now = clock_->Now();
  double wait_seconds = 0;
  {
    absl::MutexLock lock(&mu_);
    auto [it, added] = buckets_.try_emplace({caller.tenant, which});
    Bucket& b = it->second;
    // New, or its rate changed at a reload (a change of namespaces keeps the bucket).
    if (added || b.rate != rate || b.burst != burst) {
      b.rate = rate;
      b.burst = burst;
      b.tokens = burst;
      b.last = now;
    }
    if (now > b.last) {
      b.tokens = std::min<double>(burst, b.tokens + absl::ToDoubleSeconds(now - b.last) * rate);
      b.last = now;
    }
    if (b.tokens >= claims) {
      b.tokens -= claims;
      return absl::OkStatus();
    }
    ++refused_[{caller.tenant, names.rate}];
    wait_seconds = (claims - b.tokens) / rate;
  }
  const int64_t wait_ms =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(wait_seconds * 1000)));
  absl::Status refused = absl::ResourceExhaustedError(absl::StrFormat(
      "tenant \"%s\" is above its %s (%s %g/s, %s %d); %d claim%s possible again in %d ms",
      caller.tenant, names.what, names.rate, rate, names.burst, burst, claims,
      claims == 1 ? " is" : "s are", wait_ms));
  refused.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(wait_ms)));
  return refused;
}

std::vector<TenantRefusals> TenantLimiter::Refusals() const {
  std::vector<TenantRefusals> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, n] : refused_) {
      if (n > 0) out.push_back({key.first, key.second, n});
    }
  }
  std::sort(out.begin(), out.end(), [](const TenantRefusals& a, const TenantRefusals& b) {
    return std::tie(a.tenant, a.limit) < std::tie(b.tenant, b.limit);
  });
  return out;
}

}  // namespace sbx::server
