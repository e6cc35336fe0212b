#pragma once
// LatencySamples: every latency of a run, kept exactly (a vector of nanoseconds, sorted
// once at the end), so percentiles have no bucketing error. A 10 s run at 40,000 ops/s
// keeps 400,000 samples (3.2 MB); sbx-loadgen runs are short enough for that.
//
// Percentiles use the nearest-rank definition: pX is the smallest sample such that at
// least X% of the samples are <= it (so p100 is the maximum, and a single sample is
// every percentile).
//
// Thread-safety: none; the owner serialises Add and Summarize (sbx-loadgen holds a mutex).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sbx::loadgen {

// Latencies in microseconds, as printed.
struct LatencySummary {
  uint64_t count = 0;
  double min_us = 0;
  double mean_us = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double p999_us = 0;
  double max_us = 0;
};

class LatencySamples {
 public:
  void Reserve(size_t n) { ns_.reserve(n); }
  void Add(int64_t ns) { ns_.push_back(ns < 0 ? 0 : ns); }
  size_t size() const { return ns_.size(); }

  // Sorts the samples (once; later Adds make it sort again) and summarises them. All
  // zeros when there are no samples.
  LatencySummary Summarize() {
    LatencySummary s;
    if (ns_.empty()) return s;
    std::sort(ns_.begin(), ns_.end());
    s.count = ns_.size();
    double sum = 0;
    for (int64_t v : ns_) sum += static_cast<double>(v);
    s.mean_us = sum / static_cast<double>(ns_.size()) / 1e3;
    s.min_us = ToUs(ns_.front());
    s.max_us = ToUs(ns_.back());
    s.p50_us = Percentile(50);
    s.p90_us = Percentile(90);
    s.p99_us = Percentile(99);
    s.p999_us = Percentile(99.9);
    return s;
  }

  // Nearest-rank percentile of the sorted samples, in microseconds. Call after Summarize.
  double Percentile(double pct) const {
    if (ns_.empty()) return 0;
    // The epsilon keeps e.g. 99.9% of 1000 at rank 999 despite 0.999 * 1000 rounding up.
    double rank = std::ceil(pct * static_cast<double>(ns_.size()) / 100.0 - 1e-9);
    size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
    return ToUs(ns_[std::min(index, ns_.size() - 1)]);
  }

 private:
  static double ToUs(int64_t ns) { return static_cast<double>(ns) / 1e3; }

  std::vector<int64_t> ns_;
};

}  // namespace sbx::loadgen
