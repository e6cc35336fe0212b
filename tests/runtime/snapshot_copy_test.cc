// The snapshot copy (src/runtime/snapshot_copy.h) on real trees in a temporary folder,
// made the way a hostile sandbox would leave them: links to host files, a FIFO, device
// nodes, a socket, whiteouts and opaque folders, set-user-id files, deep nesting, and a
// quota that refuses part-way.

#include "src/runtime/snapshot_copy.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::runtime::local {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SnapshotCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-snapcopy-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    src_ = dir_ + "/src";
    out_ = dir_ + "/out";
    fs::create_directories(src_);
    fs::create_directories(out_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  absl::StatusOr<CopyStats> Copy(bool overlay, const CopyCharge& charge = nullptr,
                                 int64_t max_entries = kMaxCopyEntries) {
    const int s = open(src_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int o = open(out_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    absl::StatusOr<CopyStats> r = CopyTree(s, o, "copy", overlay, charge, nullptr, max_entries);
    close(s);
    close(o);
    return r;
  }

  std::string dir_, src_, out_;
};

TEST_F(SnapshotCopyTest, LinksAreCopiedAsLinksNeverFollowed) {
  Write(dir_ + "/host-secret", "HOST SECRET\n");
  fs::create_symlink(dir_ + "/host-secret", src_ + "/abs");
  fs::create_symlink("../host-secret", src_ + "/rel");
  fs::create_symlink("/etc", src_ + "/etc-dir");
  fs::create_directories(src_ + "/d");
  Write(src_ + "/d/f", "mine");
  absl::StatusOr<CopyStats> r = Copy(false);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string c = out_ + "/copy";
  EXPECT_EQ(fs::read_symlink(c + "/abs"), dir_ + "/host-secret");
  EXPECT_EQ(fs::read_symlink(c + "/rel"), "../host-secret");
  EXPECT_EQ(fs::read_symlink(c + "/etc-dir"), "/etc");
  EXPECT_EQ(Read(c + "/d/f"), "mine");
  EXPECT_EQ(r->links, 3);
  EXPECT_EQ(r->files, 1);
  // Bytes: the file and the three link targets, nothing of what they point at.
  EXPECT_EQ(r->bytes, 4 + static_cast<int64_t>((dir_ + "/host-secret").size() +
                                               std::strlen("../host-secret") + 4));
}

TEST_F(SnapshotCopyTest, FifosAreMadeNotOpenedAndDevicesAndSocketsAreDropped) {
  ASSERT_EQ(mkfifo((src_ + "/fifo").c_str(), 0644), 0);
  const int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = src_ + "/sock";
  std::strncpy(addr.sun_path, sock_path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(sock);
  int devices = 0;
  if (geteuid() == 0) {
    ASSERT_EQ(mknod((src_ + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    ASSERT_EQ(mknod((src_ + "/loop").c_str(), S_IFBLK | 0600, makedev(7, 0)), 0);
    devices = 2;
  }
  // A whiteout (0:0), allowed unprivileged since Linux 5.8.
  const bool whiteout = mknod((src_ + "/gone").c_str(), S_IFCHR, makedev(0, 0)) == 0;
  absl::StatusOr<CopyStats> r = Copy(/*overlay=*/true);  // would hang on an opened FIFO
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string c = out_ + "/copy";
  struct stat st;
  ASSERT_EQ(lstat((c + "/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_NE(lstat((c + "/sock").c_str(), &st), 0);
  EXPECT_NE(lstat((c + "/null").c_str(), &st), 0);
  EXPECT_NE(lstat((c + "/loop").c_str(), &st), 0);
  EXPECT_EQ(r->dropped, 1 + devices);
  if (whiteout) {
    ASSERT_EQ(lstat((c + "/gone").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
    EXPECT_EQ(st.st_rdev, makedev(0, 0));
    EXPECT_EQ(r->whiteouts, 1);
    // Outside an overlay layer (a workspace) a whiteout is just a device: dropped.
    fs::remove_all(c);
    absl::StatusOr<CopyStats> ws = Copy(/*overlay=*/false);
    ASSERT_TRUE(ws.ok()) << ws.status();
    EXPECT_NE(lstat((c + "/gone").c_str(), &st), 0);
  }
}

TEST_F(SnapshotCopyTest, KeepsTheOpaqueMarkerDropsOtherXattrsAndSetIdBits) {
  fs::create_directories(src_ + "/opaque");
  const bool root = geteuid() == 0;
  const char* opaque = root ? "trusted.overlay.opaque" : "user.overlay.opaque";
  if (setxattr((src_ + "/opaque").c_str(), opaque, "y", 1, 0) != 0) {
    GTEST_SKIP() << "no " << opaque << " xattrs on /tmp";
  }
  ASSERT_EQ(setxattr((src_ + "/opaque").c_str(), "user.other", "x", 1, 0), 0);
  Write(src_ + "/suid", "x");
  ASSERT_EQ(chmod((src_ + "/suid").c_str(), 06755), 0);
  absl::StatusOr<CopyStats> r = Copy(true);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string c = out_ + "/copy";
  char v[8];
  EXPECT_EQ(getxattr((c + "/opaque").c_str(), opaque, v, sizeof(v)), 1);
  EXPECT_LT(getxattr((c + "/opaque").c_str(), "user.other", v, sizeof(v)), 0);
  struct stat st;
  ASSERT_EQ(stat((c + "/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
}

TEST_F(SnapshotCopyTest, TheChargeStopsTheCopyBeforeTheBytesAreWritten) {
  Write(src_ + "/big", std::string(3 << 20, 'x'));
  int64_t allowed = 2 << 20, charged = 0;
  absl::StatusOr<CopyStats> r = Copy(false, [&](int64_t n) {
    if (charged + n > allowed) return absl::ResourceExhaustedError("quota of the test");
    charged += n;
    return absl::OkStatus();
  });
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("quota of the test"));
  EXPECT_LE(charged, allowed);
  EXPECT_LE(static_cast<int64_t>(fs::file_size(out_ + "/copy/big")), allowed);
  ASSERT_TRUE(RemoveTree(open(out_.c_str(), O_RDONLY | O_DIRECTORY), "copy").ok());
  EXPECT_FALSE(fs::exists(out_ + "/copy"));
}

// Empty files cost no quota bytes; their number is bounded instead.
TEST_F(SnapshotCopyTest, TooManyEntriesAreRefused) {
  for (int i = 0; i < 12; ++i) Write(src_ + "/e" + std::to_string(i), "");
  EXPECT_TRUE(Copy(false, nullptr, 12).ok());
  fs::remove_all(out_ + "/copy");
  absl::StatusOr<CopyStats> r = Copy(false, nullptr, 11);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("more than 11 files"));
}

TEST_F(SnapshotCopyTest, TooDeepATreeIsRefused) {
  std::string p = src_;
  for (int i = 0; i <= kMaxCopyDepth + 1; ++i) {
    p += "/d";
    ASSERT_EQ(mkdir(p.c_str(), 0755), 0);
  }
  absl::StatusOr<CopyStats> r = Copy(false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("nested deeper than"));
}

}  // namespace
}  // namespace sbx::runtime::local

namespace sbx::runtime::local {
namespace {

// Reset's workspace copy: into an existing folder of the owner's, from a source only root
// can read, every entry (links included) made as the owner, no link followed.
TEST_F(SnapshotCopyTest, CopyIntoFillsAnExistingFolderAndGivesEverythingToTheOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another uid needs root";
  Write(dir_ + "/host-file", "HOST\n");
  fs::create_directories(src_ + "/d/e");
  Write(src_ + "/d/e/f", "mine");
  fs::create_symlink(dir_ + "/host-file", src_ + "/link");
  ASSERT_EQ(mkfifo((src_ + "/fifo").c_str(), 0644), 0);
  ASSERT_EQ(chmod(src_.c_str(), 0700), 0);        // readable by root only, as a snapshot is
  ASSERT_EQ(chown(out_.c_str(), 4242, 4242), 0);  // the owner's, as a sandbox's workspace
  const int s = open(src_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int o = open(out_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  absl::StatusOr<CopyStats> r = CopyInto(s, o, 4242);
  close(s);
  close(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Read(out_ + "/d/e/f"), "mine");
  EXPECT_EQ(fs::read_symlink(out_ + "/link"), dir_ + "/host-file");
  for (const char* p : {"/d", "/d/e", "/d/e/f", "/link", "/fifo"}) {
    struct stat st;
    ASSERT_EQ(lstat((out_ + p).c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_uid, 4242u) << p;
    EXPECT_EQ(st.st_gid, 4242u) << p;
  }
  // The link's target is untouched.
  struct stat host;
  ASSERT_EQ(stat((dir_ + "/host-file").c_str(), &host), 0);
  EXPECT_EQ(host.st_uid, 0u);
  EXPECT_EQ(Read(dir_ + "/host-file"), "HOST\n");
}

}  // namespace
}  // namespace sbx::runtime::local
