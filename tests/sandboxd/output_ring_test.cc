// OutputRing: offsets, the byte cap, gaps for readers that fell behind, discarding.

#include "src/sandboxd/output_ring.h"

#include <string>

#include "gtest/gtest.h"

namespace sbx::sandboxd {
namespace {

std::string ReadAll(const OutputRing& ring, int64_t* cursor, int64_t* gap = nullptr) {
  std::string out;
  for (;;) {
    OutputRing::Read r = ring.ReadAt(cursor, 3);
    if (r.gap > 0) {
      if (gap != nullptr) *gap += r.gap;
      continue;
    }
    if (r.data.empty()) return out;
    out += r.data;
  }
}

TEST(OutputRingTest, ReadsInOrderWithStreams) {
  OutputRing ring(100);
  ring.Append(OutputStream::kStdout, "abc");
  ring.Append(OutputStream::kStderr, "XY");
  int64_t cursor = 0;
  OutputRing::Read r = ring.ReadAt(&cursor, 2);
  EXPECT_EQ(r.data, "ab");
  EXPECT_EQ(r.stream, OutputStream::kStdout);
  r = ring.ReadAt(&cursor, 10);
  EXPECT_EQ(r.data, "c");  // a read never mixes streams
  r = ring.ReadAt(&cursor, 10);
  EXPECT_EQ(r.data, "XY");
  EXPECT_EQ(r.stream, OutputStream::kStderr);
  EXPECT_EQ(cursor, 5);
  EXPECT_TRUE(ring.ReadAt(&cursor, 10).data.empty());
  EXPECT_EQ(ring.dropped(), 0);
}

TEST(OutputRingTest, HoldsAtMostItsCapacityAndCountsWhatItDrops) {
  OutputRing ring(10);
  for (int i = 0; i < 100; ++i)
    ring.Append(OutputStream::kStdout, "0123456789"[i % 10] + std::string("-"));
  EXPECT_EQ(ring.end(), 200);
  EXPECT_EQ(ring.size(), 10);
  EXPECT_EQ(ring.dropped(), 190);
  int64_t cursor = 0;
  int64_t gap = 0;
  EXPECT_EQ(ReadAll(ring, &cursor, &gap), "5-6-7-8-9-");
  EXPECT_EQ(gap, 190);
}

TEST(OutputRingTest, AChunkLargerThanTheRingKeepsItsTail) {
  OutputRing ring(4);
  ring.Append(OutputStream::kPty, "ab");
  ring.Append(OutputStream::kPty, "0123456789");
  EXPECT_EQ(ring.size(), 4);
  EXPECT_EQ(ring.dropped(), 8);
  int64_t cursor = 0;
  EXPECT_EQ(ReadAll(ring, &cursor), "6789");
}

TEST(OutputRingTest, DiscardedBytesAreNotDrops) {
  OutputRing ring(8);
  ring.Append(OutputStream::kStdout, "abcdef");
  ring.DiscardBefore(4);
  EXPECT_EQ(ring.start(), 4);
  EXPECT_EQ(ring.dropped(), 0);
  ring.Append(OutputStream::kStdout, "ghijkl");  // 8 held again: "efghijkl"
  EXPECT_EQ(ring.dropped(), 0);
  ring.Append(OutputStream::kStdout, "m");
  EXPECT_EQ(ring.dropped(), 1);
  int64_t cursor = 4;
  int64_t gap = 0;
  EXPECT_EQ(ReadAll(ring, &cursor, &gap), "fghijklm");
  EXPECT_EQ(gap, 1);
  ring.DiscardBefore(1000);  // clamped to the end
  EXPECT_EQ(ring.size(), 0);
  EXPECT_EQ(ring.start(), 13);
}

}  // namespace
}  // namespace sbx::sandboxd
