#pragma once
// TenantLimiter: each tenant's claim rates (TenantLimits from the tokens file, auth.h) as
// token buckets: claim_rate (every claim) and image_claim_rate (claims by image that an
// on-demand pool serves, image_pools.h), each a bucket of its burst that refills at its
// rate per second. A claim takes one, a ClaimBatch of N takes N at once or none; a tenant
// without a rate is never limited by it. What one tenant does never changes another's
// buckets. It also counts the refusals of limits checked elsewhere (image_cache_bytes),
// so that every tenant refusal is in one place for the metrics.
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
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/server/auth.h"

namespace sbx::server {

// The payload of a refusal that says how long to wait, in milliseconds (decimal text).
inline constexpr char kRetryAfterPayload[] = "sbx-retry-after-ms";

// How many calls of one tenant one limit refused (sbx_tenant_limited_total).
struct TenantRefusals {
  std::string tenant;
  std::string limit;  // "claim_rate", "image_claim_rate", "image_cache_bytes"
  uint64_t count = 0;
  bool operator==(const TenantRefusals&) const = default;
};

class TenantLimiter {
 public:
  // `clock` null: the real clock.
  explicit TenantLimiter(const Clock* clock = nullptr);

  // Takes `claims` claims of `caller`'s tenant from its claim_rate bucket. OK (taken), or
  // the refusal above (nothing taken).
  [[nodiscard]] absl::Status TakeClaims(const Caller& caller, int claims) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for its image_claim_rate bucket (claims by image of on-demand pools).
  [[nodiscard]] absl::Status TakeImageClaims(const Caller& caller, int claims)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a refusal of `tenant` by `limit`, a limit checked by its owner (image_cache_bytes).
  void CountRefusal(const std::string& tenant, absl::string_view limit) ABSL_LOCKS_EXCLUDED(mu_);

  // Refusals so far, by tenant and limit, sorted; only those above zero.
  std::vector<TenantRefusals> Refusals() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The buckets of one tenant.
  enum class Rate : uint8_t { kClaim, kImageClaim };
  struct Bucket {
    double rate = 0;
    int burst = 0;
    double tokens = 0;
    absl::Time last;
  };
  [[nodiscard]] absl::Status Take(const Caller& caller, Rate which, double rate, int burst,
                                  int claims) ABSL_LOCKS_EXCLUDED(mu_);

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::pair<std::string, Rate>, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> refused_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server
