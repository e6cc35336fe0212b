// Tests of src/sandboxd/workspace.cc: path checks and confinement, directly (no gRPC).

#include "src/sandboxd/workspace.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::sandboxd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SplitPathTest, AcceptsRelativePaths) {
  auto parts = Workspace::SplitPath("path", "a/b//c/", false);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_THAT(*parts, ElementsAre("a", "b", "c"));
}

TEST(SplitPathTest, RootOnlyWhenAllowed) {
  EXPECT_TRUE(Workspace::SplitPath("cwd", "", true).ok());
  auto s = Workspace::SplitPath("path", "", false);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SplitPathTest, RefusesEscapesAndNamesThePath) {
  for (const char* bad : {"../x", "/etc/passwd", "a/../../x", "a/./b", ".."}) {
    auto s = Workspace::SplitPath("path", bad, true);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(bad));
  }
  std::string with_nul("a\0b", 3);
  EXPECT_EQ(Workspace::SplitPath("path", with_nul, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Workspace::SplitPath("path", std::string(5000, 'a'), true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class WorkspaceTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-ws-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(mkdir((dir_ + "/ws").c_str(), 0755), 0);
    ASSERT_EQ(mkdir((dir_ + "/outside").c_str(), 0755), 0);
    auto ws = Workspace::Open(dir_ + "/ws", 1 << 20, GetParam());
    ASSERT_TRUE(ws.ok()) << ws.status();
    ws_ = std::move(*ws);
  }
  void TearDown() override {
    ws_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<Workspace> ws_;
};

// Whether this kernel (and any seccomp filter around the test) lets openat2 resolve
// beneath a directory, asked directly.
bool KernelHasOpenat2() {
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH;
  const long fd = ::syscall(SYS_openat2, AT_FDCWD, ".", &how, sizeof(how));
  if (fd < 0) return false;
  ::close(static_cast<int>(fd));
  return true;
}

// Requested, openat2 is used exactly when the kernel has it; not requested, never.
TEST_P(WorkspaceTest, OpenAt2ProbeMatchesRequest) {
  EXPECT_EQ(ws_->uses_openat2(), GetParam() && KernelHasOpenat2());
}

TEST_P(WorkspaceTest, SymlinkOutIsRefusedForEveryOperation) {
  ASSERT_EQ(symlink((dir_ + "/outside").c_str(), (dir_ + "/ws/out").c_str()), 0);
  ASSERT_EQ(symlink("../outside", (dir_ + "/ws/rel").c_str()), 0);
  for (const char* link : {"out", "rel"}) {
    const std::string file = std::string(link) + "/f";
    auto w = ws_->WriteFile(file, "x", {});
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << file << w.status();
    auto wp = ws_->WriteFile(std::string(link) + "/sub/f", "x", {0, false, true});
    EXPECT_EQ(wp.status().code(), absl::StatusCode::kInvalidArgument) << wp.status();
    auto a = ws_->WriteFile(file, "x", {0, true, false});
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
    EXPECT_EQ(ws_->List(link, false).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ws_->OpenDirectory("cwd", link).status().code(), absl::StatusCode::kInvalidArgument);
  }
  struct stat st;
  EXPECT_NE(stat((dir_ + "/outside/f").c_str(), &st), 0) << "a write escaped the workspace";
  EXPECT_NE(stat((dir_ + "/outside/sub").c_str(), &st), 0) << "a mkdir escaped the workspace";
}

TEST_P(WorkspaceTest, SymlinkToFileOutsideIsNotRead) {
  ASSERT_EQ(symlink("/etc/passwd", (dir_ + "/ws/passwd").c_str()), 0);
  auto r = ws_->ReadFile("passwd", 0, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("passwd"));
}

TEST_P(WorkspaceTest, ReplaceKeepsModeAndAppendCreates) {
  auto w = ws_->WriteFile("f", "abc", {0600, false, false});
  ASSERT_TRUE(w.ok()) << w.status();
  w = ws_->WriteFile("f", "defg", {});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, 4);
  auto r = ws_->ReadFile("f", 0, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->content, "defg");
  EXPECT_EQ(r->mode, 0600u);
  auto a = ws_->WriteFile("g", "12", {0, true, false});
  ASSERT_TRUE(a.ok()) << a.status();
  a = ws_->WriteFile("g", "34", {0, true, false});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, 4);
  auto l = ws_->List("", false);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->entries.size(), 2u) << "no temporary files may be left behind";
}

INSTANTIATE_TEST_SUITE_P(Resolution, WorkspaceTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "openat2" : "walk"; });

}  // namespace
}  // namespace sbx::sandboxd
