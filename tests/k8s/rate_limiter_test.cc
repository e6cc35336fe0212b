#include "src/k8s/rate_limiter.h"

#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

TEST(RateLimiterTest, BurstThenSteadyRate) {
  RateLimiter limiter(/*qps=*/10, /*burst=*/3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(limiter.Reserve(kStart), absl::ZeroDuration());
  // Every further caller queues behind the previous one, 100 ms apart.
  EXPECT_EQ(limiter.Reserve(kStart), absl::Milliseconds(100));
  EXPECT_EQ(limiter.Reserve(kStart), absl::Milliseconds(200));
  // Half a second later the debt (2 tokens) is paid and 3 more accrued: the bucket
  // refills to at most its burst.
  EXPECT_EQ(limiter.Reserve(kStart + absl::Milliseconds(500)), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(kStart + absl::Milliseconds(500)), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(kStart + absl::Milliseconds(500)), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(kStart + absl::Milliseconds(500)), absl::Milliseconds(100));
}

TEST(RateLimiterTest, RefillIsCappedAtBurst) {
  RateLimiter limiter(/*qps=*/100, /*burst=*/2);
  EXPECT_EQ(limiter.Reserve(kStart), absl::ZeroDuration());
  const absl::Time later = kStart + absl::Hours(1);
  EXPECT_EQ(limiter.Reserve(later), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(later), absl::ZeroDuration());
  EXPECT_EQ(limiter.Reserve(later), absl::Milliseconds(10));
}

TEST(RateLimiterTest, ZeroQpsIsUnlimited) {
  RateLimiter limiter(/*qps=*/0, /*burst=*/1);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(limiter.Reserve(kStart), absl::ZeroDuration());
}

TEST(RateLimiterTest, OneHundredReservationsSpanTheirShareOfTime) {
  RateLimiter limiter(/*qps=*/50, /*burst=*/10);
  absl::Duration last;
  for (int i = 0; i < 100; ++i) last = limiter.Reserve(kStart);
  // 90 beyond the burst at 50/s: the last waits 1.8 s.
  EXPECT_EQ(last, absl::Milliseconds(1800));
}

}  // namespace
}  // namespace sbx::k8s
