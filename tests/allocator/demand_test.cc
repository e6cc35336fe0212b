// The demand estimators and the target they give (src/allocator/demand.h): Poisson
// sizing, surges, silence, clock jumps, the cool-down and recurring bursts.

#include "src/allocator/demand.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace sbx::allocator {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

// E[(N - t)+] for N ~ Poisson(mu), summed directly in log space.
double Shortfall(double mu, int64_t t) {
  double sum = 0;
  const int64_t hi = static_cast<int64_t>(mu + 60 * std::sqrt(mu) + 60);
  for (int64_t k = t + 1; k <= hi; ++k) {
    const double log_p = static_cast<double>(k) * std::log(mu) - mu - std::lgamma(k + 1.0);
    sum += static_cast<double>(k - t) * std::exp(log_p);
  }
  return sum;
}

TEST(PoissonShortfallTargetTest, IsTheSmallestTargetWithinTheAllowedShortfall) {
  for (double mu : {0.05, 0.5, 3.0, 40.0, 250.0}) {
    for (double share : {0.001, 0.005, 0.05}) {
      const int64_t t = PoissonShortfallTarget(mu, share);
      SCOPED_TRACE(testing::Message() << "mu " << mu << " share " << share << " target " << t);
      EXPECT_LE(Shortfall(mu, t), share * mu * (1 + 1e-9));
      ASSERT_GT(t, 0);
      EXPECT_GT(Shortfall(mu, t - 1), share * mu);
    }
  }
}

TEST(PoissonShortfallTargetTest, NormalApproximationIsCloseForLargeMeans) {
  for (double mu : {600.0, 2000.0}) {
    const int64_t t = PoissonShortfallTarget(mu, 0.005);
    // Within one sandbox of the exact answer.
    EXPECT_LE(Shortfall(mu, t + 1), 0.005 * mu) << mu;
    EXPECT_GT(Shortfall(mu, t - 2), 0.005 * mu) << mu;
  }
}

TEST(PoissonShortfallTargetTest, NothingForNoDemandAndNoNaN) {
  EXPECT_EQ(PoissonShortfallTarget(0, 0.005), 0);
  EXPECT_EQ(PoissonShortfallTarget(1e-4, 0.005), 0);
  EXPECT_EQ(PoissonShortfallTarget(-3, 0.005), 0);
  EXPECT_EQ(PoissonShortfallTarget(std::nan(""), 0.005), 0);
}

TEST(StaticTargetTest, FloorPlusWaitersCappedByTheCeiling) {
  EXPECT_EQ(StaticTarget(2, 10, 0).target, 2);
  EXPECT_EQ(StaticTarget(2, 10, 0).reason, TargetReason::kFloor);
  EXPECT_EQ(StaticTarget(2, 10, 3).target, 5);
  EXPECT_EQ(StaticTarget(2, 10, 3).reason, TargetReason::kWaiters);
  EXPECT_EQ(StaticTarget(2, 10, 30).target, 10);
  EXPECT_EQ(StaticTarget(2, 10, 30).reason, TargetReason::kCeiling);
  EXPECT_EQ(StaticTarget(4, 1, 0).target, 4);  // a ceiling below the floor is the floor
}

TEST(DemandOptionsTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(DemandOptions().Validate().ok());
  DemandOptions o;
  o.cold_fraction = 0;
  EXPECT_NE(o.Validate().message().find("cold_fraction"), std::string::npos);
  o = DemandOptions();
  o.latency_quantile = 1.5;
  EXPECT_NE(o.Validate().message().find("latency_quantile"), std::string::npos);
  o = DemandOptions();
  o.short_window = absl::Milliseconds(10);
  EXPECT_NE(o.Validate().message().find("short_window"), std::string::npos);
}

// Drives an estimator with arrivals at a constant rate, sampled every 100 ms.
class Driver {
 public:
  explicit Driver(DemandOptions options = DemandOptions()) : est_(options, kStart) {
    est_.Sample(now_, total_);
  }
  // `rate` claims per second for `d`, deterministic (spread evenly).
  void Run(double rate, absl::Duration d) {
    const absl::Time end = now_ + d;
    while (now_ < end) {
      now_ += absl::Milliseconds(100);
      carry_ += rate * 0.1;
      const auto n = static_cast<uint64_t>(carry_);
      carry_ -= static_cast<double>(n);
      total_ += n;
      est_.Sample(now_, total_);
      last_ = est_.Decide(now_, floor_, ceiling_, waiting_);
    }
  }
  // `n` claims at once, then `d` of silence.
  void Burst(uint64_t n, absl::Duration quiet) {
    total_ += n;
    Run(0, quiet);
  }
  TargetDecision Decide() {
    est_.Sample(now_, total_);
    return last_ = est_.Decide(now_, floor_, ceiling_, waiting_);
  }
  void SetClock(absl::Time t) { now_ = t; }

  DemandEstimator est_;
  absl::Time now_ = kStart;
  uint64_t total_ = 0;
  double carry_ = 0;
  int32_t floor_ = 0;
  int32_t ceiling_ = 100000;
  int64_t waiting_ = 0;
  TargetDecision last_;
};

TEST(DemandEstimatorTest, SteadyTrafficIsSizedByLittlesLaw) {
  DemandOptions o;
  o.default_create_latency = absl::Seconds(2);
  Driver d(o);
  d.Run(20, absl::Minutes(20));  // four long windows
  const TargetDecision t = d.last_;
  EXPECT_NEAR(t.estimate.rate_long, 20, 1);
  EXPECT_NEAR(t.estimate.rate_short, 20, 1);
  EXPECT_EQ(t.estimate.create_latency, absl::Seconds(2));
  EXPECT_EQ(t.reason, TargetReason::kDemand);
  // 40 claims expected while a sandbox is made: a few more than 40, fewer than 60.
  EXPECT_GT(t.target, 40);
  EXPECT_LT(t.target, 60);
}

TEST(DemandEstimatorTest, ASurgeIsSeenWithinTwoSeconds) {
  Driver d;
  d.Run(5, absl::Minutes(10));
  const int64_t before = d.last_.target;
  d.Run(100, absl::Seconds(2));
  // The long rate has barely moved; the short one carries the surge.
  EXPECT_LT(d.last_.estimate.rate_long, 10);
  EXPECT_GT(d.last_.target, 5 * before);
}

TEST(DemandEstimatorTest, SilenceLowersTheTargetOnlyAfterTheCoolDown) {
  DemandOptions o;
  o.cool_down = absl::Seconds(30);
  Driver d(o);
  d.Run(5, absl::Minutes(10));
  d.Run(100, absl::Seconds(10));
  const int64_t peak = d.last_.target;
  d.Run(0, absl::Seconds(25));
  EXPECT_EQ(d.last_.target, peak) << "fell inside the cool-down";
  d.Run(0, absl::Seconds(30));
  EXPECT_LT(d.last_.target, peak);
  // The long rate still remembers the traffic of the last minutes.
  EXPECT_GT(d.last_.estimate.rate_long, 1);
  EXPECT_GT(d.last_.target, 0);
  d.Run(0, absl::Minutes(60));
  EXPECT_EQ(d.last_.target, 0);
  EXPECT_EQ(d.last_.reason, TargetReason::kFloor);
}

TEST(DemandEstimatorTest, AClockJumpForwardCountsAsBoundedSilence) {
  Driver d;
  d.Run(20, absl::Minutes(20));
  const double rate = d.last_.estimate.rate_long;
  d.SetClock(d.now_ + absl::Hours(5));
  d.Decide();
  // At most max_gap (10 s) of decay of the 5-minute average, not five hours of it.
  EXPECT_GT(d.last_.estimate.rate_long, rate * std::exp(-11.0 / 300));
  d.Run(20, absl::Seconds(5));
  EXPECT_NEAR(d.last_.estimate.rate_long, 20, 2);
}

TEST(DemandEstimatorTest, AClockJumpBackKeepsCountingAndDoesNotPinTheTarget) {
  DemandOptions o;
  o.cool_down = absl::Seconds(30);
  Driver d(o);
  d.Run(100, absl::Minutes(20));
  const int64_t high = d.last_.target;
  d.SetClock(d.now_ - absl::Hours(1));
  // Traffic stops after the jump: the cool-down counts from the new time, and the high
  // targets decided "in the future" do not hold it up for an hour.
  d.Run(0, absl::Minutes(40));
  EXPECT_LT(d.last_.target, high / 2);
  d.Run(50, absl::Minutes(20));
  EXPECT_NEAR(d.last_.estimate.rate_long, 50, 5);
}

TEST(DemandEstimatorTest, CreateLatencyIsTheChosenQuantileOfRecentCreates) {
  DemandOptions o;
  o.latency_quantile = 0.9;
  o.latency_samples = 100;
  o.default_create_latency = absl::Seconds(7);
  Driver d(o);
  EXPECT_EQ(d.Decide().estimate.create_latency, absl::Seconds(7));
  for (int i = 1; i <= 100; ++i) d.est_.ObserveCreateLatency(absl::Milliseconds(i));
  EXPECT_EQ(d.Decide().estimate.create_latency, absl::Milliseconds(90));
  EXPECT_EQ(d.last_.estimate.create_samples, 100);
  // Old samples leave the window: 100 slow creates replace them.
  for (int i = 1; i <= 100; ++i) d.est_.ObserveCreateLatency(absl::Seconds(3));
  EXPECT_EQ(d.Decide().estimate.create_latency, absl::Seconds(3));
}

TEST(DemandEstimatorTest, WaitersAddToDemandAndTheCeilingCuts) {
  Driver d;
  d.floor_ = 2;
  d.ceiling_ = 50;
  d.Run(1, absl::Minutes(10));
  const int64_t demand = d.last_.estimate.demand;
  d.waiting_ = 20;
  TargetDecision t = d.Decide();
  EXPECT_EQ(t.target, std::max<int64_t>(demand + 20, 2));
  EXPECT_EQ(t.reason, TargetReason::kWaiters);
  d.waiting_ = 500;
  t = d.Decide();
  EXPECT_EQ(t.target, 50);
  EXPECT_EQ(t.reason, TargetReason::kCeiling);
}

TEST(DemandEstimatorTest, RecurringBurstsArePrewarmedShortlyBeforeTheyAreDue) {
  DemandOptions o;
  o.default_create_latency = absl::Seconds(2);
  Driver d(o);
  d.Run(0, absl::Seconds(5));
  for (int i = 0; i < 3; ++i) d.Burst(500, absl::Seconds(60));
  // Three bursts a minute apart: the next is due 60 s after the last, which came 60 s
  // ago (minus the sampling). Bursts are events, not rate.
  TargetDecision t = d.Decide();
  EXPECT_EQ(t.estimate.burst_size, 500);
  EXPECT_EQ(t.estimate.burst_period, absl::Seconds(60));
  EXPECT_LT(t.estimate.rate_long, 1);
  // 60 s after the third burst the fourth is due: pre-warmed since 2*2 s + 0.15*60 s.
  EXPECT_EQ(t.target, 500);
  EXPECT_EQ(t.reason, TargetReason::kBurst);

  // It comes: once it is being counted, the pre-warm ends.
  d.Burst(500, absl::Seconds(2));
  t = d.Decide();
  EXPECT_LT(t.target, 50);
  // Long before the next one: nothing pre-warmed.
  d.Run(0, absl::Seconds(30));
  EXPECT_LT(d.last_.target, 50);
  // Inside the lead time of the fifth.
  d.Run(0, absl::Seconds(20));
  EXPECT_EQ(d.last_.target, 500);
}

TEST(DemandEstimatorTest, IrregularBurstsAreNotPrewarmed) {
  Driver d;
  d.Run(0, absl::Seconds(5));
  d.Burst(500, absl::Seconds(20));
  d.Burst(500, absl::Seconds(90));
  d.Burst(500, absl::Seconds(35));
  for (int i = 0; i < 120; ++i) {
    d.Run(0, absl::Seconds(1));
    EXPECT_LT(d.last_.target, 100) << "second " << i;
  }
}

TEST(DemandEstimatorTest, ALongSurgeIsRateNotABurst) {
  Driver d;
  d.Run(2, absl::Minutes(10));
  d.Run(200, absl::Seconds(10));
  // Ten seconds of 100x traffic: past burst_max_buckets it feeds the rates.
  EXPECT_GT(d.last_.estimate.rate_short, 100);
  EXPECT_GT(d.last_.target, 200);
  EXPECT_EQ(d.last_.reason, TargetReason::kDemand);
}

}  // namespace
}  // namespace sbx::allocator
