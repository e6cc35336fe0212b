#include "src/allocator/demand.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace sbx::allocator {
namespace {

constexpr absl::Duration kBucket = absl::Seconds(1);

// Decay of an exponentially weighted average over one bucket, for time constant `tau`.
double DecayPerBucket(absl::Duration tau) {
  return std::exp(-absl::ToDoubleSeconds(kBucket) / absl::ToDoubleSeconds(tau));
}

}  // namespace

const char* PoolSizingName(PoolSizing s) {
  switch (s) {
    case PoolSizing::kStatic:
      return "static";
    case PoolSizing::kDemand:
      return "demand";
  }
  return "unknown";
}

absl::StatusOr<PoolSizing> ParsePoolSizing(absl::string_view name) {
  if (name == "static" || name.empty()) return PoolSizing::kStatic;
  if (name == "demand") return PoolSizing::kDemand;
  return absl::InvalidArgumentError(
      absl::StrCat("pool sizing \"", name, "\" is not known (known: static, demand)"));
}

const char* TargetReasonName(TargetReason r) {
  switch (r) {
    case TargetReason::kFloor:
      return "floor";
    case TargetReason::kDemand:
      return "demand";
    case TargetReason::kWaiters:
      return "waiters";
    case TargetReason::kBurst:
      return "burst";
    case TargetReason::kCeiling:
      return "ceiling";
  }
  return "unknown";
}

absl::Status DemandOptions::Validate() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("demand sizing: ", parts...));
  };
  if (short_window < kBucket)
    return bad("short_window ", absl::FormatDuration(short_window), " is below 1s");
  if (long_window < short_window)
    return bad("long_window ", absl::FormatDuration(long_window), " is below short_window");
  if (!(surge_sigmas >= 0)) return bad("surge_sigmas ", surge_sigmas, " is negative");
  if (!(latency_quantile > 0 && latency_quantile <= 1))
    return bad("latency_quantile ", latency_quantile, " is outside (0, 1]");
  if (latency_samples < 1) return bad("latency_samples ", latency_samples, " is below 1");
  if (default_create_latency <= absl::ZeroDuration())
    return bad("default_create_latency ", absl::FormatDuration(default_create_latency),
               " is not positive");
  if (!(cold_fraction > 0 && cold_fraction < 1))
    return bad("cold_fraction ", cold_fraction, " is outside (0, 1)");
  if (!(burst_margin >= 0)) return bad("burst_margin ", burst_margin, " is negative");
  if (cool_down < absl::ZeroDuration())
    return bad("cool_down ", absl::FormatDuration(cool_down), " is negative");
  if (burst_min_size < 1) return bad("burst_min_size ", burst_min_size, " is below 1");
  if (!(burst_factor >= 1)) return bad("burst_factor ", burst_factor, " is below 1");
  if (burst_max_buckets < 1) return bad("burst_max_buckets ", burst_max_buckets, " is below 1");
  if (!(prewarm_lead >= 0 && prewarm_lead < 1))
    return bad("prewarm_lead ", prewarm_lead, " is outside [0, 1)");
  if (max_gap < kBucket) return bad("max_gap ", absl::FormatDuration(max_gap), " is below 1s");
  return absl::OkStatus();
}

TargetDecision StaticTarget(int32_t floor, int32_t ceiling, int64_t waiting) {
  TargetDecision d;
  const int64_t cap = std::max(ceiling, floor);
  const int64_t want = int64_t{floor} + waiting;
  d.target = std::clamp<int64_t>(want, floor, cap);
  d.reason = waiting <= 0 ? TargetReason::kFloor
             : want > cap ? TargetReason::kCeiling
                          : TargetReason::kWaiters;
  return d;
}

int64_t PoissonShortfallTarget(double mu, double cold_fraction) {
  if (!(mu >= 1e-3)) return 0;  // also NaN
  const double allowed = cold_fraction * mu;
  const double sigma = std::sqrt(mu);
  // Far more than any sensible share needs; bounds the loops whatever the rounding.
  const int64_t limit = static_cast<int64_t>(std::ceil(mu + 40 * sigma + 40));
  if (mu > 500) {
    // exp(-mu) underflows soon after; the normal approximation is close here. Expected
    // shortfall of a normal: sigma * (pdf(z) - z * (1 - cdf(z))).
    int64_t t = static_cast<int64_t>(std::floor(mu));
    for (; t < limit; ++t) {
      const double z = (static_cast<double>(t) - mu) / sigma;
      const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
      const double upper = 0.5 * std::erfc(z / std::sqrt(2.0));
      if (sigma * (pdf - z * upper) <= allowed) break;
    }
    return t;
  }
  // Exact: E[(N - T)+] = mu - sum_{k<T} P(N > k).
  double p = std::exp(-mu);  // P(N = t)
  double cdf = p;            // P(N <= t)
  double shortfall = mu;     // E[(N - t)+]
  int64_t t = 0;
  while (shortfall > allowed && t < limit) {
    shortfall -= std::max(0.0, 1 - cdf);
    ++t;
    p *= mu / static_cast<double>(t);
    cdf += p;
  }
  return t;
}

DemandEstimator::DemandEstimator(DemandOptions options, absl::Time start)
    : options_(std::move(options)),
      short_decay_(DecayPerBucket(options_.short_window)),
      long_decay_(DecayPerBucket(options_.long_window)),
      bucket_start_(start) {
  latencies_.reserve(static_cast<size_t>(options_.latency_samples));
}

void DemandEstimator::Sample(absl::Time now, uint64_t arrivals_total) {
  if (!have_total_) {
    // The counter may have counted before the estimator existed (a settings change).
    have_total_ = true;
    last_total_ = arrivals_total;
    bucket_start_ = now;
    return;
  }
  bucket_count_ += arrivals_total >= last_total_ ? arrivals_total - last_total_ : 0;
  last_total_ = arrivals_total;
  if (now < bucket_start_) {
    // The clock went back: what was counted stays in the open bucket, which starts again.
    bucket_start_ = now;
    return;
  }
  if (now - bucket_start_ < kBucket) return;
  absl::Duration rest;  // abseil's IDivDuration needs somewhere to put the remainder
  const int64_t elapsed = absl::IDivDuration(now - bucket_start_, kBucket, &rest);
  // The arrivals since the last sample go to the bucket being closed: samples come at
  // least every refill resync (1 s), so they are at most that late. Buckets after it were
  // silent; a gap longer than max_gap counts as max_gap of silence (a clock jump or a
  // stalled process must not make the long rate forget its trend).
  const int64_t max_buckets = absl::IDivDuration(options_.max_gap, kBucket, &rest);
  const int64_t closes = std::min(elapsed, max_buckets);
  for (int64_t i = 0; i < closes; ++i) {
    CloseBucket();
    bucket_count_ = 0;
  }
  bucket_start_ += elapsed * kBucket;
}

bool DemandEstimator::IsBurstCount(uint64_t count) const {
  const double expected = std::max(LongRate(), ShortRate()) * absl::ToDoubleSeconds(kBucket);
  return count >= static_cast<uint64_t>(options_.burst_min_size) &&
         static_cast<double>(count) >= options_.burst_factor * expected;
}

void DemandEstimator::CloseBucket() {
  const uint64_t count = bucket_count_;
  auto feed = [this](double c) {
    last_bucket_ = c;
    rate_short_ = short_decay_ * rate_short_ + (1 - short_decay_) * c;
    rate_long_ = long_decay_ * rate_long_ + (1 - long_decay_) * c;
    short_weight_ = short_decay_ * short_weight_ + (1 - short_decay_);
    long_weight_ = long_decay_ * long_weight_ + (1 - long_decay_);
  };
  const bool high = IsBurstCount(count);
  // A burst is an event, not a rate: it is kept out of the averages. It comes at once, so
  // a second high bucket holding half the first's count or more (or more high buckets
  // than burst_max_buckets) is a surge, which is rate, seen within two seconds. (A burst
  // split evenly across a bucket boundary is taken for a surge: sized as rate, it is
  // over-provisioned for one cool-down, never under-provisioned.)
  if (high && open_burst_buckets_ == 0) {
    last_bucket_ = 0;
    open_burst_ = Burst{bucket_start_, static_cast<int64_t>(count)};
    open_burst_first_ = count;
    open_burst_buckets_ = 1;
    return;
  }
  if (high && open_burst_buckets_ < options_.burst_max_buckets && 2 * count < open_burst_first_) {
    open_burst_.size += static_cast<int64_t>(count);
    ++open_burst_buckets_;
    return;
  }
  if (open_burst_buckets_ > 0) {
    if (high) {
      // Too long for a burst: a surge. What was held back counts as rate after all.
      const double per_bucket =
          static_cast<double>(open_burst_.size) / static_cast<double>(open_burst_buckets_);
      for (int i = 0; i < open_burst_buckets_; ++i) feed(per_bucket);
    } else {
      bursts_.push_back(open_burst_);
      while (bursts_.size() > 4) bursts_.pop_front();
    }
    open_burst_buckets_ = 0;
  }
  feed(static_cast<double>(count));
}

void DemandEstimator::ObserveCreateLatency(absl::Duration took) {
  if (took < absl::ZeroDuration()) took = absl::ZeroDuration();  // a clock that went back
  if (latencies_.size() < static_cast<size_t>(options_.latency_samples)) {
    latencies_.push_back(took);
  } else {
    latencies_[latency_next_] = took;
  }
  latency_next_ = (latency_next_ + 1) % static_cast<size_t>(options_.latency_samples);
}

absl::Duration DemandEstimator::CreateLatency() const {
  if (latencies_.empty()) return options_.default_create_latency;
  std::vector<absl::Duration> sorted = latencies_;
  const size_t n = sorted.size();
  size_t index = static_cast<size_t>(std::ceil(options_.latency_quantile * static_cast<double>(n)));
  index = std::clamp<size_t>(index, 1, n) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<ptrdiff_t>(index), sorted.end());
  return sorted[index];
}

double DemandEstimator::ShortRate() const {
  return short_weight_ > 0 ? rate_short_ / short_weight_ : 0;
}

double DemandEstimator::LongRate() const {
  return long_weight_ > 0 ? rate_long_ / long_weight_ : 0;
}

double DemandEstimator::Rate() const {
  const double rate_short = ShortRate();
  const double rate_long = LongRate();
  // Each faster estimate replaces the slower one only when it is above it by more than its
  // own Poisson noise (variance rate x (1-a)/(1+a) for an average with decay a per bucket,
  // rate for a single bucket); below 1/s the noise means little.
  const double base = std::max(rate_long, 1.0);
  double rate = rate_long;
  const double short_noise = std::sqrt(base * (1 - short_decay_) / (1 + short_decay_));
  if (rate_short > rate + options_.surge_sigmas * short_noise) rate = rate_short;
  // The last second alone: a surge is sized at its level one second in, before the short
  // average has caught up with it.
  if (last_bucket_ > rate + options_.surge_sigmas * std::sqrt(base)) rate = last_bucket_;
  return rate;
}

int64_t DemandEstimator::PrewarmSize(absl::Time now, absl::Duration latency,
                                     DemandEstimate* est) const {
  if (bursts_.size() < 3) return 0;
  const Burst& a = bursts_[bursts_.size() - 3];
  const Burst& b = bursts_[bursts_.size() - 2];
  const Burst& c = bursts_[bursts_.size() - 1];
  const absl::Duration i1 = b.start - a.start;
  const absl::Duration i2 = c.start - b.start;
  if (i1 <= absl::ZeroDuration() || i2 <= absl::ZeroDuration()) return 0;
  // Recurring: the last two intervals agree within a fifth.
  if (absl::AbsDuration(i1 - i2) > 0.2 * std::max(i1, i2)) return 0;
  const absl::Duration period = (i1 + i2) / 2;
  const int64_t size = std::max({a.size, b.size, c.size});
  const absl::Time next = c.start + period;
  est->burst_size = size;
  est->burst_period = period;
  est->next_burst = next;
  // The burst has begun (it is being counted): its sandboxes are being taken, and making
  // the same number again would only leave them idle.
  if (open_burst_buckets_ > 0 || IsBurstCount(bucket_count_)) return 0;
  const absl::Duration lead = 2 * latency + options_.prewarm_lead * period;
  if (now >= next - lead && now < next + period / 2) return size;
  return 0;
}

TargetDecision DemandEstimator::Decide(absl::Time now, int32_t floor, int32_t ceiling,
                                       int64_t waiting) {
  TargetDecision d;
  DemandEstimate& e = d.estimate;
  e.rate_short = ShortRate();
  e.rate_long = LongRate();
  e.create_latency = CreateLatency();
  e.create_samples = static_cast<int>(latencies_.size());
  const double mu = Rate() * absl::ToDoubleSeconds(e.create_latency);
  const int64_t poisson = PoissonShortfallTarget(mu, options_.cold_fraction);
  const int64_t base =
      poisson == 0 ? 0 : poisson + static_cast<int64_t>(std::ceil(options_.burst_margin * mu));

  // Cool-down: the highest base of the last cool_down, by second.
  const absl::Time second = absl::FromUnixSeconds(absl::ToUnixSeconds(now));
  while (!held_.empty() && held_.back().first > second) held_.pop_back();  // clock went back
  if (!held_.empty() && held_.back().first == second) {
    held_.back().second = std::max(held_.back().second, base);
  } else {
    held_.emplace_back(second, base);
  }
  while (held_.size() > 1 && held_.front().first + options_.cool_down < second) held_.pop_front();
  int64_t held = 0;
  for (const auto& [_, v] : held_) held = std::max(held, v);
  e.demand = held;

  const int64_t burst = PrewarmSize(now, e.create_latency, &e);
  const int64_t demand = std::max(held, burst);
  const int64_t want = demand + std::max<int64_t>(waiting, 0);
  const int64_t cap = std::max(ceiling, floor);
  d.target = std::clamp<int64_t>(want, floor, cap);
  if (want > cap) {
    d.reason = TargetReason::kCeiling;
  } else if (want <= floor) {
    d.reason = TargetReason::kFloor;
  } else if (burst > held && burst >= waiting) {
    d.reason = TargetReason::kBurst;
  } else if (waiting > demand) {
    d.reason = TargetReason::kWaiters;
  } else {
    d.reason = TargetReason::kDemand;
  }
  return d;
}

}  // namespace sbx::allocator
