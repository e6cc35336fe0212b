// TenantLimiter (issue 22): each tenant's claim rate as a token bucket on an injected
// clock; a tenant's refusals name it and say when to retry, and never touch another's.
// Issue 34: the image claim rate is a bucket of its own, and refusals are by limit.

#include "src/server/tenant_limits.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::server {
namespace {

using ::testing::HasSubstr;

Caller Tenant(const std::string& name, double rate, int burst) {
  Caller c;
  c.tenant = name;
  c.limits.claim_rate = rate;
  c.limits.claim_burst = burst;
  return c;
}

std::string RetryAfterMs(const absl::Status& s) {
  absl::optional<absl::Cord> wait = s.GetPayload(kRetryAfterPayload);
  return wait ? std::string(*wait) : "";
}

TEST(TenantLimiterTest, ABurstIsGrantedThenTheRateWithTheWaitNamed) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TenantLimiter limiter(&clock);
  const Caller alice = Tenant("alice", 2, 3);  // 2/s, 3 at once
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.TakeClaims(alice, 1).ok()) << i;
  absl::Status refused = limiter.TakeClaims(alice, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("tenant \"alice\""));
  EXPECT_THAT(refused.message(), HasSubstr("claim_rate 2/s"));
  EXPECT_EQ(RetryAfterMs(refused), "500");  // one claim at 2/s
  clock.Advance(absl::Milliseconds(499));
  EXPECT_FALSE(limiter.TakeClaims(alice, 1).ok());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(limiter.TakeClaims(alice, 1).ok());
  // Idle for long: the bucket holds its burst, no more.
  clock.Advance(absl::Hours(1));
  EXPECT_TRUE(limiter.TakeClaims(alice, 3).ok());
  EXPECT_FALSE(limiter.TakeClaims(alice, 1).ok());
  EXPECT_EQ(limiter.Refusals(), (std::vector<TenantRefusals>{{"alice", "claim_rate", 3}}));
}

TEST(TenantLimiterTest, ABatchTakesAllItsClaimsOrNone) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TenantLimiter limiter(&clock);
  const Caller alice = Tenant("alice", 10, 5);
  EXPECT_TRUE(limiter.TakeClaims(alice, 4).ok());
  absl::Status refused = limiter.TakeClaims(alice, 3);  // 1 left: none taken
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("3 claims are possible again in 200 ms"));
  EXPECT_EQ(RetryAfterMs(refused), "200");
  EXPECT_TRUE(limiter.TakeClaims(alice, 1).ok());  // the one left is still there
  absl::Status never = limiter.TakeClaims(alice, 6);
  EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition) << never;
  EXPECT_THAT(never.message(), HasSubstr("at most 5 at once"));
}

TEST(TenantLimiterTest, TenantsDoNotShareABucketAndUnlimitedOnesAreNeverRefused) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TenantLimiter limiter(&clock);
  const Caller alice = Tenant("alice", 1, 1);
  const Caller bob = Tenant("bob", 1, 1);
  Caller carol;
  carol.tenant = "carol";
  EXPECT_TRUE(limiter.TakeClaims(alice, 1).ok());
  EXPECT_FALSE(limiter.TakeClaims(alice, 1).ok());
  EXPECT_TRUE(limiter.TakeClaims(bob, 1).ok()) << "alice's refusals spent bob's claims";
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(limiter.TakeClaims(carol, 10).ok());
  EXPECT_EQ(limiter.Refusals(), (std::vector<TenantRefusals>{{"alice", "claim_rate", 1}}));
}

TEST(TenantLimiterTest, NewLimitsAtAReloadStartAFullBucket) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TenantLimiter limiter(&clock);
  EXPECT_TRUE(limiter.TakeClaims(Tenant("alice", 1, 1), 1).ok());
  EXPECT_FALSE(limiter.TakeClaims(Tenant("alice", 1, 1), 1).ok());
  EXPECT_TRUE(limiter.TakeClaims(Tenant("alice", 5, 5), 5).ok());
}

// Claims by image of on-demand pools have their own bucket: spending one does not spend
// the other; refusals name image_claim_rate and are counted apart, with image_cache_bytes
// refusals counted for its owner.
TEST(TenantLimiterTest, TheImageClaimRateIsABucketOfItsOwn) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TenantLimiter limiter(&clock);
  Caller alice = Tenant("alice", 1, 1);
  alice.limits.image_claim_rate = 0.5;
  alice.limits.image_claim_burst = 2;
  EXPECT_TRUE(limiter.TakeImageClaims(alice, 2).ok());
  absl::Status refused = limiter.TakeImageClaims(alice, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("tenant \"alice\" is above its image claim rate"));
  EXPECT_THAT(refused.message(), HasSubstr("image_claim_rate 0.5/s, image_claim_burst 2"));
  EXPECT_EQ(RetryAfterMs(refused), "2000");
  EXPECT_TRUE(limiter.TakeClaims(alice, 1).ok()) << "the image bucket spent the claim bucket";
  EXPECT_EQ(limiter.TakeImageClaims(alice, 3).code(), absl::StatusCode::kFailedPrecondition);
  limiter.CountRefusal("alice", "image_cache_bytes");
  limiter.CountRefusal("alice", "image_cache_bytes");
  EXPECT_FALSE(limiter.TakeClaims(alice, 1).ok());
  EXPECT_EQ(limiter.Refusals(), (std::vector<TenantRefusals>{{"alice", "claim_rate", 1},
                                                             {"alice", "image_cache_bytes", 2},
                                                             {"alice", "image_claim_rate", 1}}));
  clock.Advance(absl::Seconds(2));
  EXPECT_TRUE(limiter.TakeImageClaims(alice, 1).ok());
  // Without an image_claim_rate, claims by image are not limited.
  const Caller bob = Tenant("bob", 1, 1);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(limiter.TakeImageClaims(bob, 5).ok());
}

}  // namespace
}  // namespace sbx::server
