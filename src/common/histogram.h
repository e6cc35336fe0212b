#pragma once
// AtomicHistogram: a histogram with fixed buckets that any thread may observe into
// without a lock (one relaxed increment of a bucket and a compare-and-swap loop on the
// sum), for measurements on hot paths (claims, group commits). Components keep these as
// plain counters; the server's metrics wiring (src/server/metrics.h) reads a Snapshot at
// scrape time and turns it into Prometheus families, so no component below the server
// depends on a metrics library.
//
// Thread-safety: Observe and Snapshot may run concurrently from any thread. A snapshot
// taken during observations may see a bucket incremented and the sum not yet (or the
// reverse); each field on its own is exact.
// Lifetime: no rules; the bucket bounds are fixed at construction.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace sbx {

struct HistogramSnapshot {
  // Upper bounds (inclusive, increasing); a last bucket above them (+Inf) is implied.
  std::vector<double> bounds;
  // Observations per bucket, not cumulative: bounds.size() + 1 entries (the last is +Inf).
  std::vector<uint64_t> counts;
  double sum = 0;

  uint64_t count() const;
};

class AtomicHistogram {
 public:
  // `bounds` must be increasing (a CHECK).
  explicit AtomicHistogram(std::vector<double> bounds);

  AtomicHistogram(const AtomicHistogram&) = delete;
  AtomicHistogram& operator=(const AtomicHistogram&) = delete;

  void Observe(double value);
  HistogramSnapshot Snapshot() const;

 private:
  const std::vector<double> bounds_;
  // Relaxed: the counts order no other memory; readers want totals, not a consistent cut.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  // Updated by compare-and-swap (relaxed), like a Prometheus counter.
  std::atomic<double> sum_{0};
};

// Bucket sets shared by producers and documentation (docs/metrics.md).
// Claim latency in seconds: 25 us to 5 s.
const std::vector<double>& ClaimLatencyBuckets();
// Store group commit (write + fsync) in seconds: 50 us to 5 s.
const std::vector<double>& CommitLatencyBuckets();
// Commits per group commit: 1 to 32768.
const std::vector<double>& GroupSizeBuckets();
// Exec duration in seconds: 1 ms to 1 h.
const std::vector<double>& ExecDurationBuckets();

}  // namespace sbx
