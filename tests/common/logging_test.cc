#include "src/common/logging.h"

#include <string>

#include "gtest/gtest.h"

namespace sbx {
namespace {

std::string Escaped(absl::string_view s) {
  std::string out;
  AppendJsonEscaped(s, &out);
  return out;
}

TEST(LoggingTest, JsonEscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(Escaped("plain"), "plain");
  EXPECT_EQ(Escaped(R"(pool "py")"), R"(pool \"py\")");
  EXPECT_EQ(Escaped(R"(a\b)"), R"(a\\b)");
  EXPECT_EQ(Escaped("a\nb\tc\r"), R"(a\nb\tc\r)");
  EXPECT_EQ(Escaped(std::string("x\x01y\x7f", 4)), R"(x\u0001y\u007f)");
  EXPECT_EQ(Escaped("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 passes through
}

TEST(LoggingTest, FieldsNestAndUnwind) {
  ScopedLogField outer("request_id", "r1");
  {
    ScopedLogField inner("claim", "c1");
    EXPECT_EQ(inner.outer(), &outer);
    EXPECT_EQ(inner.key(), "claim");
  }
  EXPECT_EQ(outer.outer(), nullptr);
}

TEST(LoggingTest, OptionsAreValidated) {
  LogOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.format = "xml";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.format = "json";
  o.level = "loud";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sbx
