#include "src/common/paths.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx {
namespace {

using ::testing::HasSubstr;

TEST(PathsTest, NormalAbsolutePaths) {
  for (const char* good : {"/", "/a", "/a/b.c", "/a/...", "/.a/b.", "/run/sbxdata"}) {
    EXPECT_TRUE(CheckNormalAbsolutePath("p", good).ok()) << good;
  }
  struct Case {
    std::string path;
    std::string rule;
  };
  const Case bad[] = {
      {"", "p is empty"},
      {"a/b", "is not an absolute path"},
      {"./a", "is not an absolute path"},
      {"/a/", "ends with \"/\""},
      {"//", "ends with \"/\""},
      {"//a", "empty component"},
      {"/a//b", "empty component"},
      {"/.", "\".\" component"},
      {"/a/./b", "\".\" component"},
      {"/..", "\"..\" component"},
      {"/a/..", "\"..\" component"},
      {"/a/../b", "\"..\" component"},
      {std::string("/a\0", 3), "contains a NUL byte"},
      {"/" + std::string(kMaxPathBytes, 'a'), "is longer than 4095 bytes"},
  };
  for (const Case& c : bad) {
    absl::Status s = CheckNormalAbsolutePath("p", c.path);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.path;
    EXPECT_THAT(s.message(), HasSubstr(c.rule)) << c.path;
    if (!c.path.empty() && c.path.size() < 20 && c.path.find('\0') == std::string::npos) {
      EXPECT_THAT(s.message(), HasSubstr("p \"" + c.path + "\"")) << "names the path";
    }
  }
}

TEST(PathsTest, WithinIsByComponent) {
  EXPECT_TRUE(PathIsWithin("/run/sbx", "/run/sbx"));
  EXPECT_TRUE(PathIsWithin("/run/sbx/sock", "/run/sbx"));
  EXPECT_FALSE(PathIsWithin("/run/sbxdata", "/run/sbx"));
  EXPECT_FALSE(PathIsWithin("/run", "/run/sbx"));
  EXPECT_TRUE(PathIsWithin("/anything", "/"));
  EXPECT_TRUE(PathIsWithin("/", "/"));
}

TEST(PathsTest, MountTargetsKeepOffTheControlPaths) {
  for (const char* good : {"/data", "/run/other", "/devices", "/procfs", "/tmp/x"}) {
    EXPECT_TRUE(CheckSandboxMountTarget("t", good).ok()) << good;
  }
  struct Case {
    const char* target;
    const char* message;
  };
  const Case bad[] = {
      {"/", "t \"/\" covers \"/run/sbx\""},
      {"/run", "t \"/run\" covers \"/run/sbx\""},
      {"/run/sbx", "t \"/run/sbx\" is \"/run/sbx\""},
      {"/run/sbx/bin/sbx-sandboxd", "lies under \"/run/sbx\""},
      {"/proc", "is \"/proc\""},
      {"/proc/1/root", "lies under \"/proc\""},
      {"/dev/shm", "lies under \"/dev\""},
      {"/a/../proc", "\"..\" component"},
  };
  for (const Case& c : bad) {
    absl::Status s = CheckSandboxMountTarget("t", c.target);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.target;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.target;
  }
}

}  // namespace
}  // namespace sbx
