#include "src/common/histogram.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sbx {
namespace {

TEST(AtomicHistogramTest, BucketsAreLessOrEqual) {
  AtomicHistogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 2.0, 4.0, 5.0, 6.0, 100.0}) h.Observe(v);
  HistogramSnapshot s = h.Snapshot();
  ASSERT_EQ(s.bounds, (std::vector<double>{1, 2, 5}));
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{2, 2, 2, 2}));
  EXPECT_EQ(s.count(), 8u);
  EXPECT_DOUBLE_EQ(s.sum, 120.0);
}

TEST(AtomicHistogramTest, ConcurrentObservationsAreAllCounted) {
  AtomicHistogram h(ClaimLatencyBuckets());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h] {
      for (int i = 0; i < 10000; ++i) h.Observe(0.001);
    });
  }
  for (auto& t : threads) t.join();
  HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.count(), 40000u);
  EXPECT_NEAR(s.sum, 40.0, 1e-6);
}

TEST(AtomicHistogramTest, SharedBucketSetsIncrease) {
  for (const auto* b : {&ClaimLatencyBuckets(), &CommitLatencyBuckets(), &GroupSizeBuckets(),
                        &ExecDurationBuckets()}) {
    ASSERT_FALSE(b->empty());
    for (size_t i = 1; i < b->size(); ++i) EXPECT_LT((*b)[i - 1], (*b)[i]);
  }
  EXPECT_EQ(ClaimLatencyBuckets().front(), 25e-6);
  EXPECT_EQ(ClaimLatencyBuckets().back(), 5);
}

}  // namespace
}  // namespace sbx
