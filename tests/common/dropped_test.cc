// Errors with no caller are logged and counted by site; expected answers are not.

#include "src/common/dropped.h"

#include "gtest/gtest.h"

namespace sbx {
namespace {

uint64_t Count(const std::string& site) {
  auto counts = DroppedErrorCounts();
  auto it = counts.find(site);
  return it == counts.end() ? 0 : it->second;
}

TEST(DroppedTest, ErrorsAreCountedBySiteAndOkIsNot) {
  ReportDropped("test.site_a", absl::OkStatus());
  EXPECT_EQ(Count("test.site_a"), 0u);
  ReportDropped("test.site_a", absl::UnavailableError("store down"));
  ReportDropped("test.site_a", absl::StatusOr<int>(absl::InternalError("x")));
  ReportDropped("test.site_b", absl::StatusOr<int>(3));
  EXPECT_EQ(Count("test.site_a"), 2u);
  EXPECT_EQ(Count("test.site_b"), 0u);
}

TEST(DroppedTest, ACallbackIgnoresOnlyTheCodesItExpects) {
  DropTo drop{"test.site_c", absl::StatusCode::kFailedPrecondition, absl::StatusCode::kNotFound};
  drop(absl::FailedPreconditionError("ended already"));
  drop(absl::StatusOr<int>(absl::NotFoundError("gone")));
  EXPECT_EQ(Count("test.site_c"), 0u);
  drop(absl::UnavailableError("store down"));
  drop(absl::StatusOr<int>(absl::DataLossError("bad record")));
  EXPECT_EQ(Count("test.site_c"), 2u);
}

}  // namespace
}  // namespace sbx
