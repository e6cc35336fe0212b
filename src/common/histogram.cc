#include "src/common/histogram.h"

#include <algorithm>
#include <cstdlib>

namespace sbx {

uint64_t HistogramSnapshot::count() const {
  uint64_t n = 0;
  for (uint64_t c : counts) n += c;
  return n;
}

AtomicHistogram::AtomicHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end()) ||
      std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end()) {
    std::abort();  // an invariant of the caller's constant bucket set
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void AtomicHistogram::Observe(double value) {
  // First bound >= value: Prometheus buckets are "less than or equal".
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  double sum = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(sum, sum + value, std::memory_order_relaxed)) {
  }
}

HistogramSnapshot AtomicHistogram::Snapshot() const {
  HistogramSnapshot s;
  s.bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

const std::vector<double>& ClaimLatencyBuckets() {
  static const auto* b =
      new std::vector<double>{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
                              25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1,    2.5,    5};
  return *b;
}

const std::vector<double>& CommitLatencyBuckets() {
  static const auto* b =
      new std::vector<double>{50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3, 10e-3,
                              25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1,      2.5,  5};
  return *b;
}

const std::vector<double>& GroupSizeBuckets() {
  static const auto* b =
      new std::vector<double>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 32768};
  return *b;
}

const std::vector<double>& ExecDurationBuckets() {
  static const auto* b =
      new std::vector<double>{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
                              1,    2.5,    5,    10,    30,    60,    300,    3600};
  return *b;
}

}  // namespace sbx
