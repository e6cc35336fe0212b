#pragma once
// Per-pool claim counters: how many claims each pool granted or refused, by outcome and by
// how the sandbox was obtained, how long granted claims took, and how claims ended. Kept
// by the allocator with relaxed atomics on the claim path (no lock, no lookup: each Pool
// owns one), read as a PoolCountsSnapshot through Allocator::GetPoolStatus. The server's
// metrics wiring turns the snapshots into Prometheus series at scrape time.
//
// Thread-safety: every method may be called from any thread concurrently; counts are
// exact once quiet, approximate while they change.

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "src/common/histogram.h"
#include "src/store/records.h"

namespace sbx::allocator {

// How a claim got (or tried to get) its sandbox.
enum class ClaimPath : uint8_t {
  kWarm = 0,  // taken from the ready set at once
  kWait = 1,  // the pool was empty; queued (policy WAIT) until one was ready
  kCold = 2,  // the pool was empty; created for this claim (policy COLD)
  kNone = 3,  // the pool was empty and the claim did not wait (policy FAIL, short batch)
};
inline constexpr int kClaimPaths = 4;
// absl::StatusCode values 0..16 (OK..UNAUTHENTICATED).
inline constexpr int kStatusCodes = 17;

struct PoolCountsSnapshot {
  // claims[code][path]: claims answered with that code (OK = granted). A batch counts
  // once per claim it asked for.
  std::array<std::array<uint64_t, kClaimPaths>, kStatusCodes> claims{};
  // Time from the claim reaching the allocator until it was durable, of granted claims,
  // by path (seconds).
  std::array<HistogramSnapshot, kClaimPaths> latency;
  // Claims ended, by ClaimState - 1: released, expired, lost.
  std::array<uint64_t, 3> ended{};
  // Claims (and batches) that found no warm sandbox to take, whatever their policy.
  uint64_t exhausted = 0;
};

class PoolCounters {
 public:
  PoolCounters()
      : latency_{AtomicHistogram(ClaimLatencyBuckets()), AtomicHistogram(ClaimLatencyBuckets()),
                 AtomicHistogram(ClaimLatencyBuckets()), AtomicHistogram(ClaimLatencyBuckets())} {}

  void CountClaims(absl::StatusCode code, ClaimPath path, uint64_t n = 1) {
    int c = static_cast<int>(code);
    if (c < 0 || c >= kStatusCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
    claims_[c][static_cast<int>(path)].fetch_add(n, std::memory_order_relaxed);
  }
  void ObserveLatency(ClaimPath path, absl::Duration took) {
    latency_[static_cast<int>(path)].Observe(absl::ToDoubleSeconds(took));
  }
  void CountEnded(store::ClaimState state) {
    const int i = static_cast<int>(state) - 2;  // kReleased = 2
    if (i >= 0 && i < 3) ended_[i].fetch_add(1, std::memory_order_relaxed);
  }
  void CountExhausted() { exhausted_.fetch_add(1, std::memory_order_relaxed); }

  PoolCountsSnapshot Snapshot() const {
    PoolCountsSnapshot s;
    for (int c = 0; c < kStatusCodes; ++c) {
      for (int p = 0; p < kClaimPaths; ++p) {
        s.claims[c][p] = claims_[c][p].load(std::memory_order_relaxed);
      }
    }
    for (int p = 0; p < kClaimPaths; ++p) s.latency[p] = latency_[p].Snapshot();
    for (int i = 0; i < 3; ++i) s.ended[i] = ended_[i].load(std::memory_order_relaxed);
    s.exhausted = exhausted_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  // Relaxed: counters order no other memory.
  std::array<std::array<std::atomic<uint64_t>, kClaimPaths>, kStatusCodes> claims_{};
  std::array<AtomicHistogram, kClaimPaths> latency_;
  std::array<std::atomic<uint64_t>, 3> ended_{};
  std::atomic<uint64_t> exhausted_{0};
};

}  // namespace sbx::allocator
