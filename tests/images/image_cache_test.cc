// The image cache with the real skopeo and umoci, on images the test writes itself
// (tests/images/make_oci.py: OCI layouts from a JSON spec, offline). Hostile layers are
// the attacks of issue 34: nothing may land outside the cache folder.

#include "src/images/image_cache.h"

#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "src/images/process.h"

namespace sbx::images {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::json;

class ImageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-images-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ + "/import");
    fs::create_directories(root_ + "/outside");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Writes image `tag` into the layout import/<layout> from `spec` (make_oci.py).
  std::string Make(const std::string& layout, const std::string& tag, const Json& spec) {
    ToolRun run;
    run.argv = {"/usr/bin/python3", std::string(SBX_SOURCE_DIR) + "/tests/images/make_oci.py",
                root_ + "/import/" + layout, tag, spec.dump()};
    run.timeout = absl::Minutes(2);
    absl::StatusOr<std::string> out = RunTool(run);
    EXPECT_TRUE(out.ok()) << out.status();
    return absl::StrCat("oci:", root_, "/import/", layout, ":", tag);
  }

  Json Busybox(const std::string& marker = "one") {
    return {
        {"config",
         {{"Env", {"A=1", "PATH=/bin"}},
          {"WorkingDir", "/work"},
          {"User", "0"},
          {"Cmd", {"/bin/sh"}}}},
        {"layers",
         {{{{"name", "bin"}, {"type", "dir"}},
           {{"name", "bin/busybox"}, {"type", "file"}, {"from", "/bin/busybox"}, {"mode", 0755}},
           {{"name", "bin/sh"}, {"type", "symlink"}, {"link", "busybox"}},
           {{"name", "marker"}, {"type", "file"}, {"data", marker}}}}}};
  }

  ImageCacheOptions Options(int64_t budget = int64_t{1} << 30) {
    ImageCacheOptions o;
    o.dir = root_ + "/cache";
    o.budget_bytes = budget;
    o.import_dirs = {root_ + "/import"};
    o.allow_registry = false;
    return o;
  }

  // Every file under root_ outside the cache and import folders (what escaped).
  std::vector<std::string> Escaped() {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root_)) {
      const std::string p = e.path();
      if (p.rfind(root_ + "/cache", 0) == 0 || p.rfind(root_ + "/import", 0) == 0) continue;
      if (p == root_ + "/outside" || p == root_ + "/outside/passwd") continue;  // the host's
      out.push_back(p);
    }
    return out;
  }

  std::string root_;
};

TEST_F(ImageCacheTest, AnImageIsUnpackedOnceAndItsConfigRead) {
  const std::string ref = Make("bb", "v1", Busybox());
  auto cache = ImageCache::Open(Options());
  ASSERT_TRUE(cache.ok()) << cache.status();
  absl::StatusOr<Image> image = (*cache)->Acquire(ref);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->digest.rfind("sha256:", 0), 0u);
  EXPECT_TRUE(fs::is_regular_file(image->rootfs + "/bin/busybox"));
  EXPECT_TRUE(fs::is_symlink(image->rootfs + "/bin/sh"));
  EXPECT_EQ(image->config.env, (std::vector<std::string>{"A=1", "PATH=/bin"}));
  EXPECT_EQ(image->config.working_dir, "/work");
  EXPECT_EQ(image->config.user, "0");
  EXPECT_EQ(image->config.cmd, std::vector<std::string>{"/bin/sh"});
  EXPECT_GT(image->bytes, 1 << 20);
  EXPECT_EQ(image->holders, 1);
  absl::StatusOr<Image> again = (*cache)->Acquire(ref);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->digest, image->digest);
  EXPECT_EQ(again->rootfs, image->rootfs);
  const ImageCacheStats st = (*cache)->Stats();
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.images, 1);
  EXPECT_EQ(st.bytes, image->bytes);
  EXPECT_EQ((*cache)->Remove(image->digest).code(), absl::StatusCode::kFailedPrecondition);
  (*cache)->Release(image->digest);
  (*cache)->Release(image->digest);
  absl::StatusOr<Image> pulled = (*cache)->Pull(ref);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->holders, 0) << "Pull shows its own hold";
  // By the short digest `sbx images` shows.
  EXPECT_TRUE((*cache)->Remove(image->digest.substr(0, 19)).ok());
  EXPECT_FALSE(fs::exists(image->rootfs));
}

TEST_F(ImageCacheTest, ConcurrentFirstUsesPullOnce) {
  const std::string ref = Make("bb", "v1", Busybox());
  auto cache = ImageCache::Open(Options());
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<Image> image = (*cache)->Acquire(ref);
      if (image.ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ((*cache)->Stats().misses, 1u);
  EXPECT_EQ((*cache)->List().size(), 1u);
  EXPECT_EQ((*cache)->List()[0].holders, 4);
}

TEST_F(ImageCacheTest, TheCacheSurvivesARestartAndDropsHalfMadePulls) {
  const std::string ref = Make("bb", "v1", Busybox());
  std::string digest;
  {
    auto cache = ImageCache::Open(Options());
    ASSERT_TRUE(cache.ok()) << cache.status();
    absl::StatusOr<Image> image = (*cache)->Pull(ref);
    ASSERT_TRUE(image.ok()) << image.status();
    digest = image->digest;
  }
  fs::create_directories(root_ + "/cache/tmp/pull-99/image/rootfs");  // a pull cut short
  fs::create_directories(root_ + "/cache/images/notanimage");
  auto cache = ImageCache::Open(Options());
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_EQ((*cache)->List().size(), 1u);
  EXPECT_EQ((*cache)->List()[0].digest, digest);
  EXPECT_EQ((*cache)->List()[0].config.working_dir, "/work");
  EXPECT_FALSE(fs::exists(root_ + "/cache/tmp/pull-99"));
  EXPECT_FALSE(fs::exists(root_ + "/cache/images/notanimage"));
  ASSERT_TRUE((*cache)->Pull(ref).ok());
  EXPECT_EQ((*cache)->Stats().hits, 1u);
  EXPECT_EQ((*cache)->Stats().misses, 0u);
}

TEST_F(ImageCacheTest, TheLeastRecentlyUsedUnheldImageMakesRoomAndAHeldOneDoesNot) {
  const std::string a = Make("bb", "a", Busybox("a"));
  const std::string b = Make("bb", "b", Busybox("b"));
  // Room for one busybox image (about 2 MB), not two.
  auto cache = ImageCache::Open(Options(3 << 20));
  ASSERT_TRUE(cache.ok()) << cache.status();
  absl::StatusOr<Image> first = (*cache)->Acquire(a);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<Image> refused = (*cache)->Acquire(b);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find(b), std::string::npos) << refused.status();
  (*cache)->Release(first->digest);
  absl::StatusOr<Image> second = (*cache)->Acquire(b);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(fs::exists(first->rootfs)) << "the unheld image was not evicted";
  EXPECT_EQ((*cache)->Stats().evictions, 1u);
  EXPECT_LE((*cache)->Stats().bytes, 3 << 20);
}

// Issue 34's attacks on the unpack: paths with "..", an absolute symlink written through,
// a hardlink to a host file, a whiteout of the host's /etc/passwd, a device node, a FIFO,
// set-uid and set-gid files. The pull may succeed; nothing lands outside the image's
// folder, no set-uid/set-gid bit and no special file is left, the host file is intact.
TEST_F(ImageCacheTest, AHostileLayerStaysInsideItsFolder) {
  const std::string sentinel = root_ + "/outside/passwd";
  { std::ofstream(sentinel) << "host\n"; }
  Json spec = {{"layers",
                {{{{"name", "etc"}, {"type", "dir"}},
                  {{"name", "../escaped"}, {"type", "file"}, {"data", "pwn"}},
                  {{"name", "../../escaped2"}, {"type", "file"}, {"data", "pwn"}},
                  {{"name", "/abs-escaped"}, {"type", "file"}, {"data", "pwn"}},
                  {{"name", "out"}, {"type", "symlink"}, {"link", root_ + "/outside"}},
                  {{"name", "out/written-through"}, {"type", "file"}, {"data", "pwn"}},
                  {{"name", "up"},
                   {"type", "symlink"},
                   {"link", "../../../../../../../../" + root_ + "/outside"}},
                  {{"name", "up/written-up"}, {"type", "file"}, {"data", "pwn"}},
                  {{"name", "setuid"}, {"type", "file"}, {"data", "x"}, {"mode", 06755}},
                  {{"name", "setgid-dir"}, {"type", "dir"}, {"mode", 02775}},
                  {{"name", "null"}, {"type", "chardev"}},
                  {{"name", "fifo"}, {"type", "fifo"}}},
                 {{{"name", "etc/.wh.passwd"}, {"type", "file"}, {"data", ""}},
                  {{"name", "out/.wh.passwd"}, {"type", "file"}, {"data", ""}}}}}};
  const std::string ref = Make("evil", "v1", spec);
  // A hard link to the host's file, and one that climbs out, in images of their own (umoci
  // refuses the whole layer).
  const std::string hard =
      Make("evil", "hard",
           {{"layers",
             {{{{"name", "hard"}, {"type", "hardlink"}, {"link", sentinel}},
               {{"name", "hard2"}, {"type", "hardlink"}, {"link", "../../../outside/passwd"}}}}}});
  auto cache = ImageCache::Open(Options());
  ASSERT_TRUE(cache.ok()) << cache.status();
  absl::StatusOr<Image> linked = (*cache)->Pull(hard);
  EXPECT_FALSE(linked.ok() && fs::exists(linked->rootfs + "/hard") &&
               fs::equivalent(linked->rootfs + "/hard", sentinel))
      << "a hard link to the host's file";
  absl::StatusOr<Image> image = (*cache)->Pull(ref);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(Escaped(), std::vector<std::string>{}) << image.status();
  std::ifstream host(sentinel);
  std::string line;
  std::getline(host, line);
  EXPECT_EQ(line, "host") << "the host file changed";
  struct stat st;
  ASSERT_EQ(stat(sentinel.c_str(), &st), 0) << "the host file was removed";
  EXPECT_EQ(st.st_nlink, 1u) << "the host file got a hard link";
  for (const auto& e :
       fs::recursive_directory_iterator(fs::path(image->rootfs), fs::directory_options::none)) {
    struct stat s;
    ASSERT_EQ(lstat(e.path().c_str(), &s), 0);
    EXPECT_EQ(s.st_mode & (S_ISUID | S_ISGID), 0u) << e.path() << " keeps a set-id bit";
    EXPECT_FALSE(S_ISCHR(s.st_mode) || S_ISBLK(s.st_mode) || S_ISFIFO(s.st_mode) ||
                 S_ISSOCK(s.st_mode))
        << e.path() << " is a special file";
  }
}

TEST_F(ImageCacheTest, ALayerWhoseBytesDoNotMatchItsDigestIsRefused) {
  Json spec = Busybox();
  spec["corrupt_layer"] = true;
  const std::string ref = Make("bad", "v1", spec);
  auto cache = ImageCache::Open(Options());
  ASSERT_TRUE(cache.ok()) << cache.status();
  absl::StatusOr<Image> image = (*cache)->Pull(ref);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find(ref), std::string::npos) << image.status();
  EXPECT_TRUE((*cache)->List().empty());
  EXPECT_FALSE(fs::exists(root_ + "/cache/tmp") && !fs::is_empty(root_ + "/cache/tmp"))
      << "a failed pull left files";
}

// A gzip bomb: 64 MiB of zeros in a layer of about 64 KiB, against a 16 MiB budget. The
// unpack is killed once it has written more than the budget allows, and nothing stays.
TEST_F(ImageCacheTest, AGzipBombIsStoppedAtTheBudget) {
  Json spec = Busybox();
  spec["zeros_file"] = {{"name", "bomb"}, {"bytes", int64_t{64} << 20}};
  const std::string ref = Make("bomb", "v1", spec);
  auto cache = ImageCache::Open(Options(16 << 20));
  ASSERT_TRUE(cache.ok()) << cache.status();
  absl::StatusOr<Image> image = (*cache)->Pull(ref);
  EXPECT_EQ(image.status().code(), absl::StatusCode::kResourceExhausted) << image.status();
  EXPECT_NE(image.status().message().find(ref), std::string::npos) << image.status();
  // Stopped while it wrote, not refused after writing it all.
  EXPECT_NE(image.status().message().find("grew past"), std::string::npos) << image.status();
  EXPECT_TRUE((*cache)->List().empty());
  EXPECT_LE((*cache)->Stats().bytes, 16 << 20);
}

// Extended attributes of a layer that mean something to the kernel or to overlayfs
// (file capabilities, overlayfs's own trusted.overlay.* and user.overlay.* marks: opaque
// folders, redirects, whiteouts, metacopy) are dropped when the image is unpacked; other
// user.* attributes are the image's content and stay.
TEST_F(ImageCacheTest, ALayersKernelAndOverlayAttributesAreDropped) {
  Json spec = Busybox();
  spec["layers"][0].push_back(
      {{"name", "etc"},
       {"type", "dir"},
       {"xattrs", {{"trusted.overlay.opaque", "y"}, {"user.overlay.opaque", "y"}}}});
  spec["layers"][0].push_back(
      {{"name", "etc/redirected"},
       {"type", "dir"},
       {"xattrs",
        {{"trusted.overlay.redirect", "/outside"}, {"user.overlay.redirect", "/outside"}}}});
  spec["layers"][0].push_back(
      {{"name", "capped"},
       {"type", "file"},
       {"data", "x"},
       {"mode", 0755},
       {"xattrs",
        {// CAP_NET_BIND_SERVICE, effective (vfs_cap_data v2)
         {"security.capability", "hex:0100000200040000000000000000000000000000"},
         {"user.kept", "mine"}}}});
  const std::string ref = Make("xattrs", "v1", spec);
  auto cache = ImageCache::Open(Options());
  ASSERT_TRUE(cache.ok()) << cache.status();
  absl::StatusOr<Image> image = (*cache)->Pull(ref);
  ASSERT_TRUE(image.ok()) << image.status();
  for (const char* rel : {"/etc", "/etc/redirected", "/capped"}) {
    const std::string path = image->rootfs + rel;
    ASSERT_TRUE(fs::exists(path)) << path;
    char names[4096];
    const ssize_t n = llistxattr(path.c_str(), names, sizeof(names));
    ASSERT_GE(n, 0) << path << ": " << std::strerror(errno);
    for (ssize_t at = 0; at < n; at += static_cast<ssize_t>(std::strlen(names + at)) + 1) {
      const std::string name = names + at;
      EXPECT_NE(name.rfind("trusted.", 0), 0u) << path << " keeps " << name;
      EXPECT_NE(name.rfind("security.", 0), 0u) << path << " keeps " << name;
      EXPECT_NE(name.rfind("user.overlay.", 0), 0u) << path << " keeps " << name;
    }
  }
  char value[64];
  const ssize_t kept =
      lgetxattr((image->rootfs + "/capped").c_str(), "user.kept", value, sizeof(value));
  EXPECT_EQ(std::string(value, kept > 0 ? static_cast<size_t>(kept) : 0), "mine");

  // An image unpacked by a version that let them through is cleaned when the cache opens.
  const std::string etc = image->rootfs + "/etc";
  ASSERT_EQ(lsetxattr(etc.c_str(), "user.overlay.opaque", "y", 1, 0), 0) << std::strerror(errno);
  const std::string meta_path = fs::path(image->rootfs).parent_path() / "image.json";
  Json meta = Json::parse(std::ifstream(meta_path));
  meta.erase("sanitized");
  std::ofstream(meta_path, std::ios::trunc) << meta.dump();
  cache->reset();
  auto reopened = ImageCache::Open(Options());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->List().size(), 1u);
  EXPECT_LT(lgetxattr(etc.c_str(), "user.overlay.opaque", value, sizeof(value)), 0);
}

// The "10 GiB layer against a 1 GiB budget": the manifest's declared sizes are
// checked before anything is fetched, and the cache keeps serving.
TEST_F(ImageCacheTest, ALayerDeclaredLargerThanTheBudgetIsRefusedBeforeItIsFetched) {
  Json spec = Busybox();
  spec["declare_layer_size"] = int64_t{10} << 30;
  const std::string huge = Make("huge", "v1", spec);
  const std::string small = Make("small", "v1", Busybox());
  auto cache = ImageCache::Open(Options(int64_t{1} << 30));
  ASSERT_TRUE(cache.ok()) << cache.status();
  absl::StatusOr<Image> image = (*cache)->Pull(huge);
  EXPECT_EQ(image.status().code(), absl::StatusCode::kResourceExhausted) << image.status();
  EXPECT_NE(image.status().message().find(huge), std::string::npos) << image.status();
  EXPECT_NE(image.status().message().find("10737418240"), std::string::npos) << image.status();
  EXPECT_NE(image.status().message().find("nothing was fetched"), std::string::npos)
      << image.status();
  EXPECT_TRUE((*cache)->List().empty());
  EXPECT_EQ((*cache)->Stats().misses, 1u);
  // The cache still serves.
  EXPECT_TRUE((*cache)->Pull(small).ok());
}

TEST_F(ImageCacheTest, ReferencesOutsideTheImportFoldersAreRefused) {
  const std::string ref = Make("bb", "v1", Busybox());
  auto cache = ImageCache::Open(Options());
  ASSERT_TRUE(cache.ok()) << cache.status();
  // A layout outside the import folder, and a link inside it that leads out.
  fs::create_directories(root_ + "/outside/layout");
  fs::create_symlink(root_ + "/outside", root_ + "/import/link");
  for (const std::string& bad : {absl::StrCat("oci:", root_, "/outside/layout:v1"),
                                 absl::StrCat("oci:", root_, "/import/link/layout:v1"),
                                 absl::StrCat("oci:", root_, "/import/../outside/layout"),
                                 std::string("docker://busybox:latest"), std::string("dir:/tmp"),
                                 std::string("oci:relative/path"), std::string("")}) {
    absl::Status s = (*cache)->CheckReference(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
    EXPECT_EQ((*cache)->Pull(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE((*cache)->CheckReference(ref).ok());
  EXPECT_EQ((*cache)->Stats().misses, 0u);
}

}  // namespace
}  // namespace sbx::images
