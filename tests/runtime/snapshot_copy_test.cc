// The snapshot copy (src/runtime/snapshot_copy.h) on real trees in a temporary folder,
// made the way a hostile sandbox would leave them: links to host files, a FIFO, device
// nodes, a socket, whiteouts and opaque folders, set-user-id files, deep nesting, and a
// quota that refuses part-way.

#include "src/runtime/snapshot_copy.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// MergeTree against the kernel's own overlayfs: a sandbox's changes made through a real
// overlay (upper over a snapshot's layer over an image), then the merge of the snapshot's
// layer with that upper layer, mounted over the image, must show exactly what the overlay
// of the three shows; and the merged workspace (flat) exactly what its overlay shows.
class MergeTreeTest : public SnapshotCopyTest {
 protected:
  void SetUp() override {
    SnapshotCopyTest::SetUp();
    if (geteuid() != 0) GTEST_SKIP() << "mounting overlays needs root";
    for (const char* d : {"image", "base", "up", "work", "m", "ref", "got", "out"}) {
      fs::create_directories(dir_ + "/" + d);
    }
  }
  void TearDown() override {
    for (const char* d : {"m", "ref", "got"}) umount2((dir_ + "/" + d).c_str(), MNT_DETACH);
    SnapshotCopyTest::TearDown();
  }
  void Mount(const std::string& options, const std::string& at) {
    ASSERT_EQ(mount("overlay", at.c_str(), "overlay", 0, options.c_str()), 0)
        << options << ": " << std::strerror(errno);
  }
  // Every entry below `root` as "path type mode [content|target]", sorted.
  static std::vector<std::string> Describe(const std::string& root) {
    std::vector<std::string> out;
    for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
         ++it) {
      const std::string p = it->path().string();
      struct stat st;
      EXPECT_EQ(lstat(p.c_str(), &st), 0) << p;
      std::string line = p.substr(root.size()) + " " + std::to_string(st.st_mode);
      if (S_ISREG(st.st_mode)) line += " " + Read(p);
      if (S_ISLNK(st.st_mode)) line += " -> " + fs::read_symlink(p).string();
      out.push_back(line);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  absl::StatusOr<CopyStats> Merge(const std::string& base, const std::string& upper, bool flat,
                                  const CopyCharge& charge = nullptr) {
    const int b = open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int u = open(upper.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int o = open((dir_ + "/out").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int i = open((dir_ + "/image").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    absl::StatusOr<CopyStats> r = MergeTree(b, u, i, o, "merged", flat, charge);
    close(i);
    close(b);
    close(u);
    close(o);
    return r;
  }
};

TEST_F(MergeTreeTest, AMergedLayerShowsWhatTheOverlayShowed) {
  const std::string image = dir_ + "/image", base = dir_ + "/base", m = dir_ + "/m";
  for (const char* d : {"/etc", "/usr/lib", "/opt/tool", "/var/gone"}) {
    fs::create_directories(image + d);
  }
  Write(image + "/etc/os", "image os\n");
  Write(image + "/usr/lib/libx", "libx\n");
  Write(image + "/opt/tool/bin", "tool\n");
  Write(image + "/var/gone/f", "f\n");
  // The snapshot's layer: what an earlier sandbox changed over the image.
  fs::create_directories(base + "/etc");
  fs::create_directories(base + "/data/deep");
  Write(base + "/etc/os", "snapshot os\n");
  Write(base + "/data/a", "a\n");
  Write(base + "/data/deep/b", "b\n");
  Write(base + "/file-then-dir", "was a file\n");
  ASSERT_EQ(mknod((base + "/opt").c_str(), S_IFCHR, makedev(0, 0)), 0);  // the image's /opt: gone
  fs::create_directories(base + "/rebuilt");
  ASSERT_EQ(setxattr((base + "/rebuilt").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  Write(base + "/rebuilt/only", "only\n");
  // A sandbox started at it changes things through a real overlay.
  Mount("lowerdir=" + base + ":" + image + ",upperdir=" + dir_ + "/up,workdir=" + dir_ + "/work",
        m);
  Write(m + "/data/a", "a changed\n");
  fs::remove(m + "/data/deep/b");
  Write(m + "/data/deep/c", "c\n");
  fs::remove_all(m + "/var/gone");
  fs::remove(m + "/file-then-dir");
  fs::create_directories(m + "/file-then-dir");
  Write(m + "/file-then-dir/inside", "inside\n");
  fs::create_directories(m + "/opt");  // over the snapshot's whiteout
  Write(m + "/opt/new", "new\n");
  fs::remove_all(m + "/usr/lib");
  fs::create_directories(m + "/usr/lib");
  Write(m + "/usr/lib/liby", "liby\n");
  fs::create_symlink("/etc/shadow", m + "/link");
  fs::permissions(m + "/data", fs::perms(0750));
  Write(m + "/etc/os", "sandbox os\n");
  ASSERT_EQ(umount2(m.c_str(), 0), 0);
  int64_t charged = 0;
  absl::StatusOr<CopyStats> r = Merge(base, dir_ + "/up", /*flat=*/false, [&](int64_t n) {
    charged += n;
    return absl::OkStatus();
  });
  ASSERT_TRUE(r.ok()) << r.status();
  // The reference: the sandbox's layer over the snapshot's over the image, read-only.
  Mount("lowerdir=" + dir_ + "/up:" + base + ":" + image, dir_ + "/ref");
  Mount("lowerdir=" + dir_ + "/out/merged:" + image, dir_ + "/got");
  EXPECT_EQ(Describe(dir_ + "/got"), Describe(dir_ + "/ref"));
  // Only the sandbox's own bytes were charged; the snapshot's unchanged files are shared.
  EXPECT_EQ(charged, r->bytes);
  EXPECT_LT(charged, 100);
  struct stat a, b;
  ASSERT_EQ(stat((base + "/rebuilt/only").c_str(), &a), 0);
  ASSERT_EQ(stat((dir_ + "/out/merged/rebuilt/only").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(Read(base + "/data/a"), "a\n");  // the base is never written
}

TEST_F(MergeTreeTest, AMergedWorkspaceIsAPlainTreeOfWhatTheOverlayShowed) {
  const std::string base = dir_ + "/base", m = dir_ + "/m";
  fs::create_directories(base + "/src/pkg");
  Write(base + "/src/main.py", "print(1)\n");
  Write(base + "/src/pkg/util.py", "u\n");
  Write(base + "/notes", "n\n");
  Mount("lowerdir=" + base + ",upperdir=" + dir_ + "/up,workdir=" + dir_ + "/work", m);
  fs::remove(m + "/notes");
  fs::remove_all(m + "/src/pkg");
  fs::create_directories(m + "/src/pkg");
  Write(m + "/src/pkg/other.py", "o\n");
  Write(m + "/src/main.py", "print(2)\n");
  ASSERT_EQ(umount2(m.c_str(), 0), 0);
  absl::StatusOr<CopyStats> r = Merge(base, dir_ + "/up", /*flat=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  Mount("lowerdir=" + dir_ + "/up:" + base, dir_ + "/ref");
  EXPECT_EQ(Describe(dir_ + "/out/merged"), Describe(dir_ + "/ref"));
  // Plain: no whiteout and no opaque marker is left in a workspace.
  struct stat st;
  EXPECT_NE(lstat((dir_ + "/out/merged/notes").c_str(), &st), 0);
  char v[8];
  EXPECT_LT(getxattr((dir_ + "/out/merged/src/pkg").c_str(), "trusted.overlay.opaque", v, 8), 0);
}

TEST_F(MergeTreeTest, AHostileUpperLayerIsReadAsCopyTreeReadsIt) {
  const std::string base = dir_ + "/base", up = dir_ + "/up";
  fs::create_directories(base + "/d");
  Write(base + "/d/f", "snapshot\n");
  Write(dir_ + "/host-secret", "HOST\n");
  // The sandbox swapped its folder for a link to a host folder, and left a FIFO where the
  // snapshot has a file: neither is followed or opened, and the base is untouched.
  fs::create_symlink(dir_, up + "/d");
  fs::create_directories(up + "/e");
  ASSERT_EQ(mkfifo((up + "/e/pipe").c_str(), 0644), 0);
  Write(base + "/pipe", "was a file\n");
  ASSERT_EQ(mkfifo((up + "/pipe").c_str(), 0644), 0);
  absl::StatusOr<CopyStats> r = Merge(base, up, /*flat=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(fs::read_symlink(dir_ + "/out/merged/d"), dir_);
  struct stat st;
  ASSERT_EQ(lstat((dir_ + "/out/merged/pipe").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(Read(base + "/d/f"), "snapshot\n");
  EXPECT_EQ(Read(base + "/pipe"), "was a file\n");
  EXPECT_EQ(Read(dir_ + "/host-secret"), "HOST\n");
  EXPECT_FALSE(fs::exists(dir_ + "/f"));
}

}  // namespace
}  // namespace sbx::runtime::local
