#include "src/server/convert.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::server {
namespace {

using ::testing::HasSubstr;
using Op = LabelRequirement::Op;

TEST(LabelSelectorTest, ParsesEveryForm) {
  auto r = ParseLabelSelector(" a=b , c!=d,e , !f,g==h ");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 5u);
  EXPECT_EQ((*r)[0].op, Op::kEquals);
  EXPECT_EQ((*r)[0].key, "a");
  EXPECT_EQ((*r)[0].value, "b");
  EXPECT_EQ((*r)[1].op, Op::kNotEquals);
  EXPECT_EQ((*r)[1].value, "d");
  EXPECT_EQ((*r)[2].op, Op::kExists);
  EXPECT_EQ((*r)[2].key, "e");
  EXPECT_EQ((*r)[3].op, Op::kNotExists);
  EXPECT_EQ((*r)[3].key, "f");
  EXPECT_EQ((*r)[4].op, Op::kEquals);
  EXPECT_EQ((*r)[4].value, "h");
  EXPECT_TRUE(ParseLabelSelector("").value().empty());
}

TEST(LabelSelectorTest, RejectsBadTermsByName) {
  for (const char* bad : {"a=b,", "=x", "a b=c", "!", "a=b!", "k=v=w"}) {
    auto r = ParseLabelSelector(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("label_selector term")) << bad;
  }
  EXPECT_FALSE(ParseLabelSelector(std::string(2000, 'a')).ok());
}

TEST(LabelSelectorTest, Matches) {
  const std::map<std::string, std::string> labels = {{"team", "rl"}, {"run", "7"}};
  auto m = [&](const char* sel) { return Matches(ParseLabelSelector(sel).value(), labels); };
  EXPECT_TRUE(m("team=rl,run"));
  EXPECT_FALSE(m("team=web"));
  EXPECT_TRUE(m("team!=web,!debug"));
  EXPECT_FALSE(m("run!=7"));
  EXPECT_FALSE(m("debug"));
  EXPECT_TRUE(m("other!=x"));  // absent counts as "not equal"
}

// Timestamps stay inside google.protobuf.Timestamp's range (0001-01-01 to 9999-12-31),
// for times stored before TTLs were bounded. Failed on 660dada: seconds were copied.
TEST(ConvertTest, TimestampsAreClampedToTheirValidRange) {
  google::protobuf::Timestamp t;
  ToProto(absl::FromUnixSeconds(1'000'000'000'000'000), &t);
  EXPECT_EQ(t.seconds(), 253402300799);
  EXPECT_EQ(t.nanos(), 999999999);
  ToProto(absl::FromUnixSeconds(-1'000'000'000'000'000), &t);
  EXPECT_EQ(t.seconds(), -62135596800);
  EXPECT_EQ(t.nanos(), 0);
  ToProto(absl::FromUnixSeconds(1'700'000'000) + absl::Nanoseconds(5), &t);
  EXPECT_EQ(t.seconds(), 1'700'000'000);
  EXPECT_EQ(t.nanos(), 5);
}

TEST(ConvertTest, DurationsRejectNegativeAndMalformed) {
  google::protobuf::Duration d;
  d.set_seconds(-1);
  EXPECT_THAT(std::string(FromProto("ttl", d).status().message()), HasSubstr("ttl"));
  d.set_seconds(1);
  d.set_nanos(-5);
  EXPECT_FALSE(FromProto("ttl", d).ok());
  d.set_nanos(500'000'000);
  EXPECT_EQ(FromProto("ttl", d).value(), absl::Milliseconds(1500));
  google::protobuf::Duration back;
  ToProto(absl::Milliseconds(1500), &back);
  EXPECT_EQ(back.seconds(), 1);
  EXPECT_EQ(back.nanos(), 500'000'000);
}

TEST(ConvertTest, PageTokensAreTiedToTheirFilter) {
  const std::string t = EncodePageToken("claims", 42, "job-7");
  EXPECT_EQ(DecodePageToken("claims", 42, t).value(), "job-7");
  EXPECT_EQ(DecodePageToken("claims", 42, "").value(), "");
  EXPECT_FALSE(DecodePageToken("claims", 43, t).ok());
  EXPECT_FALSE(DecodePageToken("pools", 42, t).ok());
  EXPECT_FALSE(DecodePageToken("claims", 42, "%%%").ok());
  EXPECT_EQ(PageSize(0).value(), 100);
  EXPECT_FALSE(PageSize(-1).ok());
  EXPECT_FALSE(PageSize(1001).ok());
}

TEST(ConvertTest, PoolDefaultsAndLimits) {
  v1::Pool p;
  p.set_name("py");
  p.set_template_("py");
  p.set_max_warm(3);
  auto r = PoolFromProto(p, "default");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->empty_pool_policy, store::EmptyPoolPolicy::kWait);
  EXPECT_EQ(r->default_wait, absl::Seconds(30));
  EXPECT_EQ(r->selection_policy, "fifo");
  // The ceiling of max_warm is the allocator's (AllocatorTest.MaxWarmAboveTheAllocatorsLimit...).
  p.set_max_warm(10001);
  EXPECT_TRUE(PoolFromProto(p, "default").ok());
  p.set_max_warm(3);
  p.mutable_default_ttl()->set_seconds(100);
  p.mutable_max_ttl()->set_seconds(10);
  EXPECT_THAT(std::string(PoolFromProto(p, "default").status().message()),
              HasSubstr("default_ttl"));
  p.clear_default_ttl();
  p.set_max_sandboxes(5);
  EXPECT_EQ(PoolFromProto(p, "default").status().code(), absl::StatusCode::kUnimplemented);
  p.set_max_sandboxes(0);
  for (const char* known : {"fifo", "spread", "pack"}) {
    p.set_selection_policy(known);
    absl::StatusOr<store::PoolRecord> with = PoolFromProto(p, "default");
    ASSERT_TRUE(with.ok()) << known << ": " << with.status();
    EXPECT_EQ(with->selection_policy, known);
  }
  p.set_selection_policy("round-robin");
  absl::Status unknown = PoolFromProto(p, "default").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("\"round-robin\""));
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("fifo, spread, pack"));
}

}  // namespace
}  // namespace sbx::server
