#pragma once
// TenantLimiter: each tenant's claim rate (TenantLimits from the tokens file, auth.h) as a
// token bucket of claim_burst claims that refills at claim_rate per second. A claim takes
// one, a ClaimBatch of N takes N at once or none; a tenant without a rate is never
// limited. What one tenant does never changes another's bucket.
//
// Refusals are RESOURCE_EXHAUSTED naming the tenant and its limit, with the time until
// the bucket holds enough as the retry hint (payload kRetryAfterPayload, which the server
// sends as the trailing metadata "sbx-retry-after-ms"); a batch larger than the burst can
// never be granted and is FAILED_PRECONDITION.
//
// Thread-safety: any thread. The buckets of tenants whose limits change at a tokens
// reload start full with the new limits.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/server/auth.h"

namespace sbx::server {

// The payload of a refusal that says how long to wait, in milliseconds (decimal text).
inline constexpr char kRetryAfterPayload[] = "sbx-retry-after-ms";

class TenantLimiter {
 public:
  // `clock` null: the real clock.
  explicit TenantLimiter(const Clock* clock = nullptr);

  // Takes `claims` claims of `caller`'s tenant from its bucket. OK (taken), or the refusal
  // above (nothing taken).
  absl::Status TakeClaims(const Caller& caller, int claims) ABSL_LOCKS_EXCLUDED(mu_);

  // Refusals so far by tenant (sbx_tenant_limited_total{tenant,limit="claim_rate"}).
  std::vector<std::pair<std::string, uint64_t>> Refusals() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Bucket {
    TenantLimits limits;
    double tokens = 0;
    absl::Time last;
    uint64_t refused = 0;
  };

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server
