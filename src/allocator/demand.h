#pragma once
// Demand-driven sizing of a pool: estimators of the claim arrival rate and of the time a
// new sandbox takes to become ready, and the warm target they give (docs/architecture.md,
// "The scheduler").
//
// The target is what is expected to be claimed while a new sandbox is being made
// (Little's law: arrival rate x create latency, each at a chosen quantile), plus the
// claims waiting now, plus a burst margin, between the pool's floor and ceiling. Three
// pieces of state feed it:
//  - arrivals, counted by the claim path on an atomic counter and sampled here into one-
//    second buckets. Closed buckets feed two exponentially weighted rates: a short one
//    (a surge is seen within a second or two) and a long one (the trend, kept through a
//    lull). Steady traffic is sized by the long rate; the short rate takes over only when
//    it is above the long one by more than its own Poisson noise.
//  - bursts: a bucket far above the long rate (an RL trainer asking for 2,000 sandboxes at
//    once) is not a rate but an event. Bursts that recur with a steady period are
//    pre-warmed shortly before the next one is due; others are met by the waiters term.
//  - create latencies, the last `latency_samples` of them, read at `latency_quantile`.
// The target rises at once and falls only to the highest demand of the last `cool_down`
// (hysteresis), so a lull of a few seconds does not throw away warm sandboxes.
//
// Thread-safety: DemandEstimator is not thread-safe; its owner (Pool) guards it.

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/store/records.h"

namespace sbx::allocator {

using store::PoolSizing;
const char* PoolSizingName(PoolSizing s);
// The sizing named `name` ("static", "demand"); INVALID_ARGUMENT naming it otherwise.
[[nodiscard]] absl::StatusOr<PoolSizing> ParsePoolSizing(absl::string_view name);

// What decided a pool's target.
enum class TargetReason : uint8_t {
  kFloor = 0,    // min_warm: nothing asks for more
  kDemand = 1,   // claims expected while a new sandbox is made
  kWaiters = 2,  // claims waiting now
  kBurst = 3,    // a recurring burst is due soon and is pre-warmed
  kCeiling = 4,  // max_warm cut what demand and waiters ask for
};
const char* TargetReasonName(TargetReason r);

struct DemandOptions {
  // Time constants of the short and the long arrival rate.
  absl::Duration short_window = absl::Seconds(2);
  absl::Duration long_window = absl::Minutes(5);
  // The short rate is used instead of the long one when it exceeds the long one by this
  // many standard deviations of a Poisson rate measured over short_window.
  double surge_sigmas = 3;
  // The create latency used is this quantile of the last latency_samples creates; before
  // any create finished, default_create_latency.
  double latency_quantile = 0.5;
  int latency_samples = 128;
  absl::Duration default_create_latency = absl::Seconds(1);
  // The share of claims allowed to find the pool empty: the demand term is the smallest
  // number of warm sandboxes whose expected shortfall over one create latency (Poisson
  // arrivals) is at most this share of the claims expected meanwhile.
  double cold_fraction = 0.005;
  // Burst margin: added to the demand term, as a share of the claims expected while a
  // sandbox is made.
  double burst_margin = 0.1;
  // The target falls only to the highest demand term of this last stretch of time.
  absl::Duration cool_down = absl::Seconds(30);
  // A one-second bucket is a burst when it holds at least burst_min_size claims and
  // burst_factor times what the rates expect. A burst comes at once: the high buckets
  // after its first (at most burst_max_buckets in all) must each hold less than half of
  // the first; otherwise they are a surge and count as rate.
  int burst_min_size = 20;
  double burst_factor = 5;
  int burst_max_buckets = 3;
  // A recurring burst is pre-warmed from (2 create latencies + prewarm_lead x period)
  // before it is due until half a period after.
  double prewarm_lead = 0.15;
  // A gap between samples longer than this is taken as a clock jump or a stalled process
  // and counts as this much silence.
  absl::Duration max_gap = absl::Seconds(10);

  // INVALID_ARGUMENT naming the bad field.
  [[nodiscard]] absl::Status Validate() const;
};

struct DemandEstimate {
  double rate_short = 0;                                 // claims per second, short window
  double rate_long = 0;                                  // claims per second, long window
  absl::Duration create_latency = absl::ZeroDuration();  // at latency_quantile
  int create_samples = 0;                                // latencies it is based on
  int64_t demand = 0;  // the demand term (after the cool-down hold), before waiters
  // The recurring burst, if one was recognised: its size, period and next due time.
  int64_t burst_size = 0;
  absl::Duration burst_period = absl::ZeroDuration();
  absl::Time next_burst = absl::InfiniteFuture();
};

struct TargetDecision {
  int64_t target = 0;
  TargetReason reason = TargetReason::kFloor;
  DemandEstimate estimate;  // zero for static sizing
};

// Static sizing: floor plus waiters, capped by the ceiling (never below the floor).
TargetDecision StaticTarget(int32_t floor, int32_t ceiling, int64_t waiting);

// The smallest T >= 0 with E[(N - T)+] <= cold_fraction * mu for N ~ Poisson(mu): how many
// sandboxes to keep so that at most that share of mu expected claims finds none. 0 when
// mu is negligible (below 1e-3).
int64_t PoissonShortfallTarget(double mu, double cold_fraction);

class DemandEstimator {
 public:
  DemandEstimator(DemandOptions options, absl::Time start);

  // Takes the pool's arrival counter (monotonic) at `now`. May be called at any rate.
  void Sample(absl::Time now, uint64_t arrivals_total);
  void ObserveCreateLatency(absl::Duration took);

  // The target at `now` (call Sample first), with hysteresis state updated.
  TargetDecision Decide(absl::Time now, int32_t floor, int32_t ceiling, int64_t waiting);

 private:
  struct Burst {
    absl::Time start;
    int64_t size;
  };
  void CloseBucket();
  double Rate() const;
  double ShortRate() const;
  double LongRate() const;
  absl::Duration CreateLatency() const;
  // Size of the recurring burst due around `now` that should be warm now, or 0.
  int64_t PrewarmSize(absl::Time now, absl::Duration latency, DemandEstimate* est) const;
  bool IsBurstCount(uint64_t count) const;

  const DemandOptions options_;
  const double short_decay_;  // per one-second bucket
  const double long_decay_;

  uint64_t last_total_ = 0;
  bool have_total_ = false;
  absl::Time bucket_start_;
  uint64_t bucket_count_ = 0;
  // Exponentially weighted sums of the per-bucket counts, and of the weights: their ratio
  // is the average without the bias toward zero of a young average (a pool a minute old
  // would otherwise read a fifth of its rate on the five-minute average).
  double rate_short_ = 0;
  double rate_long_ = 0;
  double short_weight_ = 0;
  double long_weight_ = 0;
  double last_bucket_ = 0;  // claims in the last bucket fed to the rates
  // The burst being seen (consecutive burst buckets), and recognised bursts.
  int open_burst_buckets_ = 0;
  uint64_t open_burst_first_ = 0;  // count of its first bucket
  Burst open_burst_{};
  std::deque<Burst> bursts_;

  std::vector<absl::Duration> latencies_;  // ring
  size_t latency_next_ = 0;

  // Per second, the highest demand term decided in it (the cool-down's sliding max).
  std::deque<std::pair<absl::Time, int64_t>> held_;
};

}  // namespace sbx::allocator
