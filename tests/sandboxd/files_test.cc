// Streamed files of sbx-sandboxd (UploadFile, DownloadFile, UploadTar, DownloadTar, Stat,
// MakeDir, Move, Remove) and absolute paths: the real daemon on a unix socket in a
// temporary directory, driven by real gRPC clients. The tar attacks are archives written
// with libarchive by the test itself; each checks that nothing appeared outside the
// target directory.

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/sandboxd/sandboxd.h"

namespace sbx::sandboxd {
namespace {

using ::testing::HasSubstr;
namespace pb = ::sbx::sandboxd::v1;
namespace fs = std::filesystem;

// One entry of an archive the test writes.
struct TarEntry {
  std::string name;
  mode_t type = AE_IFREG;
  std::string content;
  // Symbolic link target (AE_IFLNK) or hard link target (hardlink = true).
  std::string link;
  bool hardlink = false;
  mode_t mode = 0644;
};

la_ssize_t AppendCallback(struct archive*, void* data, const void* buffer, size_t length) {
  static_cast<std::string*>(data)->append(static_cast<const char*>(buffer), length);
  return static_cast<la_ssize_t>(length);
}

std::string MakeTar(const std::vector<TarEntry>& entries, bool gzip = false) {
  std::string out;
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (gzip) archive_write_add_filter_gzip(a);
  archive_write_open(a, &out, nullptr, AppendCallback, nullptr);
  for (const TarEntry& t : entries) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, t.name.c_str());
    archive_entry_set_perm(e, t.mode);
    if (t.hardlink) {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_hardlink(e, t.link.c_str());
      archive_entry_set_size(e, 0);
    } else {
      archive_entry_set_filetype(e, t.type);
      if (t.type == AE_IFLNK) archive_entry_set_symlink(e, t.link.c_str());
      archive_entry_set_size(e, t.type == AE_IFREG ? static_cast<la_int64_t>(t.content.size()) : 0);
    }
    EXPECT_EQ(archive_write_header(a, e), ARCHIVE_OK) << archive_error_string(a);
    if (t.type == AE_IFREG && !t.hardlink && !t.content.empty()) {
      archive_write_data(a, t.content.data(), t.content.size());
    }
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
}

struct UploadResult {
  grpc::Status status;
  pb::UploadResponse response;
};

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-files-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // dir_/root is the sandbox's root; dir_/outside is the host beyond it.
    root_ = dir_ + "/root";
    workspace_ = root_ + "/ws";
    outside_ = dir_ + "/outside";
    fs::create_directories(workspace_);
    fs::create_directories(root_ + "/etc");
    fs::create_directories(outside_);
    Spit(outside_ + "/secret", "host secret");
    Spit(root_ + "/etc/hostname", "inside");
    options_.socket_path = dir_ + "/sd.sock";
    options_.workspace = workspace_;
    options_.sandbox_root = root_;
    options_.allow_unauthenticated = true;
  }

  void TearDown() override {
    if (daemon_ != nullptr) daemon_->Shutdown(absl::Seconds(5));
    daemon_.reset();
    fs::remove_all(dir_);
  }

  void Start() {
    auto daemon = Daemon::Start(options_);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    stub_ = pb::Sandboxd::NewStub(
        grpc::CreateChannel("unix:" + options_.socket_path, grpc::InsecureChannelCredentials()));
  }

  static void SetDeadline(grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }

  UploadResult Upload(bool tar, const pb::UploadStart& start, const std::string& data,
                      size_t chunk = 1 << 20, bool finish = true) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    UploadResult r;
    auto writer = tar ? stub_->UploadTar(&ctx, &r.response) : stub_->UploadFile(&ctx, &r.response);
    pb::UploadRequest req;
    *req.mutable_start() = start;
    bool ok = writer->Write(req);
    for (size_t off = 0; ok && off < data.size(); off += chunk) {
      pb::UploadRequest c;
      c.set_chunk(data.substr(off, chunk));
      ok = writer->Write(c);
    }
    if (ok && finish) {
      pb::UploadRequest f;
      f.set_finish(true);
      writer->Write(f);
    }
    writer->WritesDone();
    r.status = writer->Finish();
    return r;
  }

  UploadResult UploadTar(const std::string& path, const std::string& tar, int64_t max_entries = 0,
                         int64_t max_bytes = 0) {
    pb::UploadStart start;
    start.set_path(path);
    start.set_max_entries(max_entries);
    start.set_max_bytes(max_bytes);
    return Upload(true, start, tar, 4096);
  }

  grpc::Status Download(bool tar, const std::string& path, std::string* out,
                        pb::DownloadChunk* first = nullptr) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::DownloadRequest req;
    req.set_path(path);
    auto reader = tar ? stub_->DownloadTar(&ctx, req) : stub_->DownloadFile(&ctx, req);
    pb::DownloadChunk c;
    bool is_first = true;
    while (reader->Read(&c)) {
      if (is_first && first != nullptr) *first = c;
      is_first = false;
      out->append(c.data());
    }
    return reader->Finish();
  }

  // Entries of `dir` (names), to see that nothing is left behind.
  static std::vector<std::string> Names(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_, root_, workspace_, outside_;
  DaemonOptions options_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<pb::Sandboxd::Stub> stub_;
};

std::string RandomBytes(size_t n) {
  std::mt19937_64 rng(42);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST_F(FilesTest, UploadAndDownloadLargeFileInChunks) {
  Start();
  const std::string data = RandomBytes(9 << 20);  // more than the unary 1 MiB and 4 MiB limits
  pb::UploadStart start;
  start.set_path("dir/big.bin");
  start.set_create_parents(true);
  start.set_mode(0600);
  UploadResult up = Upload(false, start, data);
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  EXPECT_EQ(up.response.bytes(), static_cast<int64_t>(data.size()));
  EXPECT_EQ(Slurp(workspace_ + "/dir/big.bin"), data);
  EXPECT_EQ(Names(workspace_ + "/dir"), std::vector<std::string>{"big.bin"}) << "no temporary left";
  std::string back;
  pb::DownloadChunk first;
  grpc::Status s = Download(false, "dir/big.bin", &back, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(first.size(), static_cast<int64_t>(data.size()));
  EXPECT_EQ(first.mode(), 0600u);
  EXPECT_TRUE(back == data);
}

TEST_F(FilesTest, EmptyFileHasOneHeaderMessage) {
  Start();
  Spit(workspace_ + "/empty", "");
  std::string back;
  pb::DownloadChunk first;
  first.set_size(-1);
  ASSERT_TRUE(Download(false, "empty", &back, &first).ok());
  EXPECT_EQ(first.size(), 0);
  EXPECT_EQ(back, "");
}

TEST_F(FilesTest, CancelledUploadLeavesNothingAndKeepsTheOldFile) {
  Start();
  Spit(workspace_ + "/f", "old");
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  pb::UploadResponse resp;
  auto writer = stub_->UploadFile(&ctx, &resp);
  pb::UploadRequest req;
  req.mutable_start()->set_path("f");
  ASSERT_TRUE(writer->Write(req));
  pb::UploadRequest c;
  c.set_chunk(std::string(1 << 20, 'x'));
  ASSERT_TRUE(writer->Write(c));
  ctx.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The daemon notices the cancel on its own threads.
  for (int i = 0; i < 200 && Names(workspace_).size() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Names(workspace_), std::vector<std::string>{"f"});
  EXPECT_EQ(Slurp(workspace_ + "/f"), "old");
}

TEST_F(FilesTest, UploadWithoutFinishLeavesNothing) {
  Start();
  Spit(workspace_ + "/f", "old");
  pb::UploadStart start;
  start.set_path("f");
  UploadResult up = Upload(false, start, std::string(3 << 20, 'x'), 1 << 20, /*finish=*/false);
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(up.status.error_message(), HasSubstr("finish"));
  EXPECT_EQ(Names(workspace_), std::vector<std::string>{"f"});
  EXPECT_EQ(Slurp(workspace_ + "/f"), "old");
}

TEST_F(FilesTest, UploadRefusesAMissingStartAndADirectory) {
  Start();
  {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::UploadResponse resp;
    auto writer = stub_->UploadFile(&ctx, &resp);
    pb::UploadRequest c;
    c.set_chunk("x");
    writer->Write(c);
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("start"));
  }
  fs::create_directories(workspace_ + "/d");
  pb::UploadStart start;
  start.set_path("d");
  EXPECT_EQ(Upload(false, start, "x").status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  start.set_path("../escape");
  EXPECT_EQ(Upload(false, start, "x").status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(FilesTest, TarRoundTrip) {
  Start();
  fs::create_directories(workspace_ + "/src/sub");
  Spit(workspace_ + "/src/a.txt", "alpha");
  Spit(workspace_ + "/src/sub/b.bin", RandomBytes(300000));
  fs::create_symlink("sub/b.bin", workspace_ + "/src/link");
  chmod((workspace_ + "/src/a.txt").c_str(), 0750);
  std::string tar;
  grpc::Status s = Download(true, "src", &tar);
  ASSERT_TRUE(s.ok()) << s.error_message();
  UploadResult up = UploadTar("dst/copy", tar);
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  EXPECT_EQ(up.response.entries(), 4);
  EXPECT_EQ(Slurp(workspace_ + "/dst/copy/a.txt"), "alpha");
  EXPECT_EQ(Slurp(workspace_ + "/dst/copy/sub/b.bin"), Slurp(workspace_ + "/src/sub/b.bin"));
  EXPECT_EQ(fs::read_symlink(workspace_ + "/dst/copy/link"), "sub/b.bin");
  struct stat st;
  ASSERT_EQ(stat((workspace_ + "/dst/copy/a.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
}

TEST_F(FilesTest, GzipTarIntoAnAbsoluteDirectory) {
  Start();
  fs::create_directories(root_ + "/home/user");
  UploadResult up = UploadTar("/home/user/proj",
                              MakeTar({{.name = "./a/b.txt", .content = "gz"}}, /*gzip=*/true));
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  EXPECT_EQ(Slurp(root_ + "/home/user/proj/a/b.txt"), "gz");
  std::string tar;
  ASSERT_TRUE(Download(true, "/home/user/proj", &tar).ok());
  EXPECT_NE(tar.find("a/b.txt"), std::string::npos);
}

// ---- Tar attacks: each was run against the extraction without its defence and failed.

TEST_F(FilesTest, TarAttackDotDotEntryIsRefused) {
  Start();
  UploadResult up = UploadTar("t", MakeTar({{.name = "../../../outside/evil", .content = "x"}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(up.status.error_message(), HasSubstr("\"..\""));
  EXPECT_FALSE(fs::exists(outside_ + "/evil"));
  EXPECT_FALSE(fs::exists(root_ + "/evil"));
}

TEST_F(FilesTest, TarAttackAbsoluteEntryIsRefused) {
  Start();
  UploadResult up = UploadTar("t", MakeTar({{.name = outside_ + "/evil", .content = "x"}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(up.status.error_message(), HasSubstr("absolute"));
  EXPECT_FALSE(fs::exists(outside_ + "/evil"));
}

TEST_F(FilesTest, TarAttackFileThroughPlantedAbsoluteSymlinkIsRefused) {
  Start();
  UploadResult up = UploadTar("t", MakeTar({{.name = "link", .type = AE_IFLNK, .link = outside_},
                                            {.name = "link/evil", .content = "x"}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(up.status.error_message(), HasSubstr("symbolic link"));
  EXPECT_FALSE(fs::exists(outside_ + "/evil"));
}

TEST_F(FilesTest, TarAttackFileThroughPlantedRelativeSymlinkIsRefused) {
  Start();
  // Also a directory entry through the link, and a link the sandbox planted before.
  fs::create_directories(workspace_ + "/t");
  fs::create_symlink(outside_, workspace_ + "/t/pre");
  UploadResult up =
      UploadTar("t", MakeTar({{.name = "up", .type = AE_IFLNK, .link = "../../../outside"},
                              {.name = "up/sub", .type = AE_IFDIR, .mode = 0755},
                              {.name = "up/sub/evil", .content = "x"}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(fs::exists(outside_ + "/sub"));
  up = UploadTar("t", MakeTar({{.name = "pre/evil", .content = "x"}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(fs::exists(outside_ + "/evil"));
}

// A process of the sandbox swaps a directory of the target for a link to the outside, over
// and over, while an archive with many files in that directory is extracted: whatever
// the timing, nothing lands outside (entries either go into the real directory or are
// refused as going through a link).
TEST_F(FilesTest, TarAttackConcurrentSymlinkSwapNeverEscapes) {
  Start();
  const std::string target = workspace_ + "/t";
  fs::create_directories(target + "/d");
  std::vector<TarEntry> entries;
  for (int i = 0; i < 400; ++i) {
    entries.push_back({.name = "d/f" + std::to_string(i), .content = "x"});
  }
  const std::string tar = MakeTar(entries);
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const std::string dir = target + "/d", aside = target + "/d-aside", link = target + "/d-link";
    ::symlink(outside_.c_str(), link.c_str());
    while (!stop.load()) {
      // d -> aside, link -> d (now d is a link to the outside), and back.
      ::rename(dir.c_str(), aside.c_str());
      ::rename(link.c_str(), dir.c_str());
      std::this_thread::yield();
      ::rename(dir.c_str(), link.c_str());
      ::rename(aside.c_str(), dir.c_str());
    }
  });
  for (int round = 0; round < 20; ++round) UploadTar("t", tar);
  stop = true;
  swapper.join();
  EXPECT_EQ(Names(outside_), std::vector<std::string>{"secret"})
      << "an entry was written through the swapped-in link";
}

TEST_F(FilesTest, TarAttackHardlinkOutIsRefused) {
  Start();
  UploadResult up =
      UploadTar("t", MakeTar({{.name = "h", .link = "../../../outside/secret", .hardlink = true}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(fs::exists(workspace_ + "/t/h"));
  // Through a planted link to the outside.
  up = UploadTar("t", MakeTar({{.name = "l", .type = AE_IFLNK, .link = outside_},
                               {.name = "h2", .link = "l/secret", .hardlink = true}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(fs::exists(workspace_ + "/t/h2"));
  // Absolute.
  up = UploadTar("t", MakeTar({{.name = "h3", .link = outside_ + "/secret", .hardlink = true}}));
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(fs::exists(workspace_ + "/t/h3"));
  struct stat st;
  ASSERT_EQ(stat((outside_ + "/secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
  // A hard link inside the archive is fine.
  up = UploadTar("t", MakeTar({{.name = "a", .content = "same"},
                               {.name = "b", .link = "a", .hardlink = true}}));
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  EXPECT_EQ(Slurp(workspace_ + "/t/b"), "same");
}

TEST_F(FilesTest, TarAttackSpecialFilesAreSkippedAndSetuidStripped) {
  Start();
  UploadResult up =
      UploadTar("t", MakeTar({{.name = "fifo", .type = AE_IFIFO},
                              {.name = "tty", .type = AE_IFCHR},
                              {.name = "suid", .content = "#!/bin/sh\n", .mode = 06755},
                              {.name = "sticky", .type = AE_IFDIR, .mode = 01777}}));
  ASSERT_TRUE(up.status.ok()) << up.status.error_message();
  EXPECT_EQ(up.response.skipped(), 2);
  EXPECT_FALSE(fs::exists(fs::symlink_status(workspace_ + "/t/fifo")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(workspace_ + "/t/tty")));
  struct stat st;
  ASSERT_EQ(stat((workspace_ + "/t/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(stat((workspace_ + "/t/sticky").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07000, 0u);
}

TEST_F(FilesTest, TarLimitsAreEnforcedWithClearErrors) {
  Start();
  std::string tar = MakeTar({{.name = "a", .content = "1"},
                             {.name = "b", .content = "2"},
                             {.name = "c", .content = "3"}});
  UploadResult up = UploadTar("t", tar, /*max_entries=*/2);
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(up.status.error_message(), HasSubstr("max_entries"));
  up = UploadTar("t2", MakeTar({{.name = "big", .content = std::string(5000, 'x')}}), 0,
                 /*max_bytes=*/1000);
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(up.status.error_message(), HasSubstr("max_bytes"));
  EXPECT_FALSE(fs::exists(workspace_ + "/t2/big"));
  up = UploadTar("t3", "this is not a tar archive at all, just bytes");
  EXPECT_EQ(up.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// ---- Absolute paths resolve inside the sandbox's root, never outside it.

TEST_F(FilesTest, AbsolutePathsResolveInsideTheSandboxRoot) {
  Start();
  pb::UploadStart start;
  start.set_path("/ws/hello.txt");
  ASSERT_TRUE(Upload(false, start, "hi").status.ok());
  EXPECT_EQ(Slurp(workspace_ + "/hello.txt"), "hi");
  std::string back;
  ASSERT_TRUE(Download(false, "/etc/hostname", &back).ok());
  EXPECT_EQ(back, "inside");
  // An absolute link means the sandbox's /etc, not the host's.
  fs::create_symlink("/etc", workspace_ + "/etclink");
  back.clear();
  grpc::Status s = Download(false, "/ws/etclink/hostname", &back);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(back, "inside");
  // ".." in a link stops at the root.
  fs::create_symlink("../../../../../../outside", root_ + "/up");
  back.clear();
  s = Download(false, "/up/secret", &back);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(back, "");
  // An absolute link to the host's path of the outside folder is read inside the root.
  fs::create_symlink(outside_, root_ + "/abs");
  s = Download(false, "/abs/secret", &back);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // ".." components are refused outright.
  s = Download(false, "/../outside/secret", &back);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Writes through the links do not leave the root either.
  start.set_path("/up/evil");
  EXPECT_FALSE(Upload(false, start, "x").status.ok());
  EXPECT_FALSE(fs::exists(outside_ + "/evil"));
  // The unary calls take absolute paths too.
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  pb::ReadFileRequest rr;
  rr.set_path("/ws/hello.txt");
  pb::ReadFileResponse rresp;
  ASSERT_TRUE(stub_->ReadFile(&ctx, rr, &rresp).ok());
  EXPECT_EQ(rresp.content(), "hi");
}

TEST_F(FilesTest, AbsolutePathsAreRefusedWithoutASandboxRoot) {
  options_.sandbox_root.clear();
  Start();
  std::string back;
  grpc::Status s = Download(false, "/etc/hostname", &back);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("absolute"));
}

TEST_F(FilesTest, StatMakeDirMoveRemove) {
  Start();
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    return (stub_.get()->*method)(&ctx, req, resp);
  };
  pb::MakeDirRequest mk;
  mk.set_path("a/b/c");
  pb::MakeDirResponse mkr;
  EXPECT_EQ(call(&pb::Sandboxd::Stub::MakeDir, mk, &mkr).error_code(), grpc::StatusCode::NOT_FOUND);
  mk.set_parents(true);
  ASSERT_TRUE(call(&pb::Sandboxd::Stub::MakeDir, mk, &mkr).ok());
  ASSERT_TRUE(call(&pb::Sandboxd::Stub::MakeDir, mk, &mkr).ok()) << "mkdir -p is idempotent";
  mk.set_parents(false);
  EXPECT_EQ(call(&pb::Sandboxd::Stub::MakeDir, mk, &mkr).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);

  pb::StatRequest st;
  st.set_path("a/b/c");
  pb::StatResponse str;
  ASSERT_TRUE(call(&pb::Sandboxd::Stub::Stat, st, &str).ok());
  EXPECT_EQ(str.entry().type(), pb::FILE_TYPE_DIRECTORY);
  EXPECT_EQ(str.entry().path(), "a/b/c");
  st.set_path("/ws/a");
  ASSERT_TRUE(call(&pb::Sandboxd::Stub::Stat, st, &str).ok());
  EXPECT_EQ(str.entry().path(), "/ws/a");
  st.set_path("nope");
  EXPECT_EQ(call(&pb::Sandboxd::Stub::Stat, st, &str).error_code(), grpc::StatusCode::NOT_FOUND);

  Spit(workspace_ + "/x", "1");
  Spit(workspace_ + "/y", "2");
  pb::MoveRequest mv;
  mv.set_from("x");
  mv.set_to("y");
  pb::MoveResponse mvr;
  EXPECT_EQ(call(&pb::Sandboxd::Stub::Move, mv, &mvr).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  mv.set_overwrite(true);
  ASSERT_TRUE(call(&pb::Sandboxd::Stub::Move, mv, &mvr).ok());
  EXPECT_EQ(Slurp(workspace_ + "/y"), "1");
  mv.set_from("y");
  mv.set_to("new/dir/z");
  mv.set_create_parents(true);
  ASSERT_TRUE(call(&pb::Sandboxd::Stub::Move, mv, &mvr).ok());
  EXPECT_EQ(Slurp(workspace_ + "/new/dir/z"), "1");

  // Recursive removal removes links, never what they point to.
  fs::create_symlink(outside_, workspace_ + "/a/b/out");
  pb::RemoveRequest rm;
  rm.set_path("a");
  pb::RemoveResponse rmr;
  EXPECT_EQ(call(&pb::Sandboxd::Stub::Remove, rm, &rmr).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  rm.set_recursive(true);
  ASSERT_TRUE(call(&pb::Sandboxd::Stub::Remove, rm, &rmr).ok());
  EXPECT_FALSE(fs::exists(workspace_ + "/a"));
  EXPECT_EQ(Slurp(outside_ + "/secret"), "host secret");
  rm.set_path("");
  EXPECT_EQ(call(&pb::Sandboxd::Stub::Remove, rm, &rmr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// ---- WatchDir

class Watch {
 public:
  Watch(pb::Sandboxd::Stub* stub, const std::string& path, bool recursive) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pb::WatchDirRequest req;
    req.set_path(path);
    req.set_recursive(recursive);
    reader_ = stub->WatchDir(&ctx_, req);
  }
  // Reads until an event of `type` on `path`; false when the stream ended first.
  bool Until(pb::FileEventType type, const std::string& path) {
    pb::WatchDirEvent e;
    while (reader_->Read(&e)) {
      events.push_back(e);
      if (e.type() == type && e.path() == path) return true;
    }
    return false;
  }
  int Count(pb::FileEventType type, const std::string& path) const {
    int n = 0;
    for (const auto& e : events) n += e.type() == type && e.path() == path;
    return n;
  }
  grpc::Status Finish() {
    ctx_.TryCancel();
    pb::WatchDirEvent e;
    while (reader_->Read(&e)) events.push_back(e);
    return reader_->Finish();
  }
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<pb::WatchDirEvent>> reader_;
  std::vector<pb::WatchDirEvent> events;
};

TEST_F(FilesTest, WatchDirReportsDebouncedChangesRecursively) {
  Start();
  fs::create_directories(workspace_ + "/w/sub");
  // A link to the outside is not descended into: nothing from there is reported.
  fs::create_directory_symlink(outside_, workspace_ + "/w/out");
  Watch watch(stub_.get(), "w", /*recursive=*/true);
  pb::WatchDirEvent first;
  ASSERT_TRUE(watch.reader_->Read(&first)) << watch.reader_->Finish().error_message();
  EXPECT_TRUE(first.ready()) << "the first event says the watch is set up";
  Spit(outside_ + "/leak.txt", "outside");
  Spit(workspace_ + "/w/marker", "m");
  ASSERT_TRUE(watch.Until(pb::FILE_EVENT_CREATE, "w/marker"));
  for (const auto& e : watch.events) {
    EXPECT_EQ(e.path().find("leak"), std::string::npos) << "reported through a link: " << e.path();
  }
  Spit(workspace_ + "/w/a.txt", "0");
  for (int i = 0; i < 20; ++i) {
    std::ofstream out(workspace_ + "/w/a.txt", std::ios::app);
    out << i;
  }
  fs::rename(workspace_ + "/w/a.txt", workspace_ + "/w/b.txt");
  fs::remove(workspace_ + "/w/b.txt");
  ASSERT_TRUE(watch.Until(pb::FILE_EVENT_REMOVE, "w/b.txt"));
  EXPECT_EQ(watch.Count(pb::FILE_EVENT_CREATE, "w/a.txt"), 1);
  EXPECT_GE(watch.Count(pb::FILE_EVENT_WRITE, "w/a.txt"), 1);
  EXPECT_LE(watch.Count(pb::FILE_EVENT_WRITE, "w/a.txt"), 5) << "21 writes are debounced";
  EXPECT_EQ(watch.Count(pb::FILE_EVENT_RENAME, "w/a.txt"), 1);
  EXPECT_EQ(watch.Count(pb::FILE_EVENT_CREATE, "w/b.txt"), 1);
  // A subdirectory that existed, and one made now, are watched too.
  Spit(workspace_ + "/w/sub/s.txt", "s");
  ASSERT_TRUE(watch.Until(pb::FILE_EVENT_CREATE, "w/sub/s.txt"));
  fs::create_directories(workspace_ + "/w/sub/new");
  ASSERT_TRUE(watch.Until(pb::FILE_EVENT_CREATE, "w/sub/new"));
  EXPECT_TRUE(watch.events.back().is_dir());
  Spit(workspace_ + "/w/sub/new/deep.txt", "d");
  ASSERT_TRUE(watch.Until(pb::FILE_EVENT_CREATE, "w/sub/new/deep.txt"));
  EXPECT_EQ(watch.Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(FilesTest, WatchDirEndsWhenTheDirectoryGoesAndHasALimit) {
  Start();
  fs::create_directories(workspace_ + "/gone");
  {
    Watch watch(stub_.get(), "gone", false);
    pb::WatchDirEvent first;
    ASSERT_TRUE(watch.reader_->Read(&first));
    fs::remove(workspace_ + "/gone");
    pb::WatchDirEvent e;
    while (watch.reader_->Read(&e)) {
    }
    EXPECT_TRUE(watch.reader_->Finish().ok());
  }
  // More directories than the daemon's inotify watch limit.
  for (int i = 0; i < 4100; ++i) fs::create_directories(workspace_ + "/many/d" + std::to_string(i));
  Watch watch(stub_.get(), "many", true);
  pb::WatchDirEvent e;
  EXPECT_FALSE(watch.reader_->Read(&e));
  grpc::Status s = watch.reader_->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("4096"));
  Watch missing(stub_.get(), "nope", false);
  EXPECT_FALSE(missing.reader_->Read(&e));
  EXPECT_EQ(missing.reader_->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace sbx::sandboxd
