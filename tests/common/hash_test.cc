#include "src/common/hash.h"

#include "gtest/gtest.h"

namespace sbx {
namespace {

// The published FNV-1a test values, so that names already in clusters and page tokens
// already given out stay valid.
TEST(HashTest, KnownValues) {
  EXPECT_EQ(Fnv1a32(""), 0x811c9dc5u);
  EXPECT_EQ(Fnv1a32("a"), 0xe40c292cu);
  EXPECT_EQ(Fnv1a32("foobar"), 0xbf9cf968u);
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(HashTest, ContinuesFromAPreviousValue) {
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
  EXPECT_EQ(Fnv1a32("bar", Fnv1a32("foo")), Fnv1a32("foobar"));
}

}  // namespace
}  // namespace sbx
