// RocksDbStore on a full file system: a real store on a small tmpfs that a filler file
// fills up. Needs root (to mount); without it, or when the mount fails, each test skips and
// says why.
//
// Checked against 660dada (before the store handled a full disk): the first three tests
// (the ones that need no option 660dada lacks) aborted the test process. RocksDB's info log (the
// LOG file in the data directory) ignores its first failed write, and its next line trips an
// assert() that Debian's librocksdb 7.8 keeps (`sync_without_flush_called_` in WritableFileWriter);
// the first line logged after the disk filled up killed the process (seen in the committer thread,
// logging the write error from DB::Write, and in DB::Open on a full disk).

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/store/rocksdb_store.h"
#include "src/store/store.h"

namespace sbx::store {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A claim carrying about `label_bytes` of payload, so that a few hundred fill a memtable.
ClaimRecord Claim(const std::string& id, size_t label_bytes = 1024) {
  ClaimRecord c;
  c.id = id;
  c.owner = "tenant";
  c.pool = "py";
  c.sandbox_id = "s-" + id;
  c.labels["payload"] = std::string(label_bytes, 'p');
  return c;
}

absl::Status CommitClaim(Store& store, const std::string& id) {
  WriteBatch b;
  b.Put(Claim(id));
  return store.CommitAndWait(std::move(b));
}

// Moves the process into a mount namespace of its own (once), so that its tmpfs mounts
// vanish with it even when it dies without unmounting (a crash, a timeout). Returns an
// error message, or "" on success. Must run before the process starts threads: the
// threads share the namespace of the thread that created them.
std::string PrivateMountNamespace() {
  static const std::string error = [] {
    if (unshare(CLONE_NEWNS) != 0) return absl::StrCat("unshare(CLONE_NEWNS): ", strerror(errno));
    // Without this, mounts under a shared "/" would propagate back to the host.
    if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return absl::StrCat("making / private: ", strerror(errno));
    }
    return std::string();
  }();
  return error;
}

class FullDiskTest : public ::testing::Test {
 protected:
  static constexpr size_t kDiskBytes = size_t{8} << 20;

  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root to mount a small tmpfs (running as uid " << geteuid() << ")";
    }
    if (std::string error = PrivateMountNamespace(); !error.empty()) {
      GTEST_SKIP() << "cannot make a private mount namespace: " << error;
    }
    std::string tmpl = ::testing::TempDir() + "sbx_full_disk_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    const std::string size = absl::StrCat("size=", kDiskBytes);
    if (mount("tmpfs", dir_.c_str(), "tmpfs", 0, size.c_str()) != 0) {
      const int err = errno;
      fs::remove(dir_);
      dir_.clear();
      GTEST_SKIP() << "cannot mount a tmpfs: " << strerror(err);
    }
    path_ = dir_ + "/db";
    filler_ = dir_ + "/filler";
  }

  void TearDown() override {
    if (dir_.empty()) return;
    umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  RocksDbStoreOptions Options() const {
    RocksDbStoreOptions o;
    o.path = path_;
    // Small memtables: they fill and flush to table files while the disk fills, so
    // background flushes run out of space too, not only the log writes.
    o.write_buffer_bytes = 64 << 10;
    // No reserve: these tests run RocksDB itself into the full disk (as when something
    // else fills it between two checks). The reserve has tests of its own.
    o.min_free_bytes = 0;
    o.free_space_check_interval = absl::Milliseconds(10);
    return o;
  }

  std::unique_ptr<Store> OpenOk(const RocksDbStoreOptions& o) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(o);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  uint64_t FreeBytes() const {
    struct statvfs st;
    if (statvfs(dir_.c_str(), &st) != 0) return 0;
    return uint64_t{st.f_bavail} * st.f_frsize;
  }

  // Appends to the filler file until the file system refuses, or until at most `leave`
  // bytes are free.
  void Fill(uint64_t leave = 0) {
    const int fd = open(filler_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    const std::string chunk(4096, 'f');
    while (FreeBytes() > leave) {
      const size_t n = std::min<uint64_t>(chunk.size(), FreeBytes() - leave);
      if (write(fd, chunk.data(), n) <= 0) break;
    }
    close(fd);
  }

  void Unfill() { ASSERT_TRUE(fs::remove(filler_)); }

  // Commits claims "<prefix><n>" until one fails (at most `limit`); the acknowledged ids go
  // into acked_. Returns the first failure.
  absl::Status CommitUntilFailure(Store& store, const std::string& prefix, int limit = 4000) {
    for (int n = 0; n < limit; ++n) {
      const std::string id = absl::StrCat(prefix, n);
      absl::Status s = CommitClaim(store, id);
      if (!s.ok()) {
        failed_.insert(id);
        return s;
      }
      acked_.insert(id);
    }
    return absl::OkStatus();
  }

  // Commits claims "<prefix><n>" until one succeeds; the disk must have room again. The
  // deadline only bounds the test's run time when the store never recovers.
  absl::Status CommitUntilSuccess(Store& store, const std::string& prefix) {
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    absl::Status s;
    for (int n = 0; absl::Now() < deadline; ++n) {
      const std::string id = absl::StrCat(prefix, n);
      s = CommitClaim(store, id);
      if (s.ok()) {
        acked_.insert(id);
        return s;
      }
      failed_.insert(id);
      absl::SleepFor(absl::Milliseconds(5));
    }
    return s;
  }

  // Reopens the store at path_ and checks that every acknowledged claim is there and no
  // failed one is.
  void ExpectAckedPresentFailedAbsent() {
    std::unique_ptr<Store> store = OpenOk(Options());
    ASSERT_NE(store, nullptr);
    absl::StatusOr<Contents> c = store->LoadAll();
    ASSERT_TRUE(c.ok()) << c.status();
    std::set<std::string> present;
    for (const ClaimRecord& claim : c->claims) present.insert(claim.id);
    for (const std::string& id : acked_)
      EXPECT_TRUE(present.contains(id)) << "acked " << id << " lost";
    for (const std::string& id : failed_) {
      EXPECT_FALSE(present.contains(id)) << "failed commit " << id << " applied";
    }
    EXPECT_TRUE(store->Close().ok());
  }

  std::string dir_;
  std::string path_;
  std::string filler_;
  // Waits until the store's Stats() report `writable` (the committer checks the free
  // space every check interval, also when idle). The deadline only bounds the run time.
  static bool AwaitWritable(const Store& store, bool writable) {
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    while (store.Stats().writable != writable) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  std::set<std::string> acked_;
  std::set<std::string> failed_;
};

TEST_F(FullDiskTest, WritesFailCleanlyWhileTheDiskIsFullAndResumeWhenSpaceReturns) {
  std::unique_ptr<Store> store = OpenOk(Options());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(CommitUntilFailure(*store, "before-", 50).ok());

  Fill();
  absl::Status failed = CommitUntilFailure(*store, "full-");
  ASSERT_FALSE(failed.ok()) << "4000 commits of 1 KiB fit on a full 8 MiB disk";
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr(path_));
  EXPECT_THAT(failed.message(), HasSubstr("bytes free"));
  EXPECT_FALSE(store->Stats().writable);
  // Later commits fail the same way, and the process is still here.
  for (int i = 0; i < 3; ++i) {
    const std::string id = absl::StrCat("refused-", i);
    absl::Status s = CommitClaim(*store, id);
    failed_.insert(id);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr(path_));
    EXPECT_THAT(s.message(), HasSubstr("bytes free"));
  }

  // Space returns: writes resume by themselves, without reopening the store.
  Unfill();
  absl::Status resumed = CommitUntilSuccess(*store, "after-");
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_TRUE(store->Stats().writable);
  ASSERT_TRUE(CommitUntilFailure(*store, "more-", 20).ok());
  EXPECT_TRUE(store->Close().ok());

  ExpectAckedPresentFailedAbsent();
}

TEST_F(FullDiskTest, OpensOnAFullDiskServesWhatItHasAndBecomesWritableWhenSpaceReturns) {
  {
    std::unique_ptr<Store> store = OpenOk(Options());
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(CommitUntilFailure(*store, "before-", 50).ok());
    ASSERT_TRUE(store->Close().ok());
  }
  Fill();
  std::unique_ptr<Store> store = OpenOk(Options());
  ASSERT_NE(store, nullptr);
  absl::StatusOr<Contents> c = store->LoadAll();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->claims.size(), acked_.size());

  absl::Status s = CommitClaim(*store, "full-0");
  failed_.insert("full-0");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(path_));
  EXPECT_THAT(s.message(), HasSubstr("0 bytes free"));
  EXPECT_THAT(s.message(), HasSubstr("read-only"));
  EXPECT_FALSE(store->Stats().writable);

  Unfill();
  absl::Status resumed = CommitUntilSuccess(*store, "after-");
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_TRUE(store->Close().ok());

  ExpectAckedPresentFailedAbsent();
}

TEST_F(FullDiskTest, CloseWhileTheDiskIsFullDoesNotAbortOrLoseAcknowledgedWrites) {
  for (Durability durability : {Durability::kSync, Durability::kBuffered}) {
    SCOPED_TRACE(DurabilityName(durability));
    RocksDbStoreOptions o = Options();
    o.durability = durability;
    std::unique_ptr<Store> store = OpenOk(o);
    ASSERT_NE(store, nullptr);
    const std::string prefix = absl::StrCat(DurabilityName(durability), "-");
    ASSERT_TRUE(CommitUntilFailure(*store, prefix + "before-", 20).ok());
    Fill();
    ASSERT_FALSE(CommitUntilFailure(*store, prefix + "full-").ok());
    // Closing syncs the log (buffered) and flushes the memtable when it can; on a full disk
    // it cannot, and must say so rather than abort.
    absl::Status closed = store->Close();
    if (!closed.ok()) EXPECT_THAT(closed.message(), HasSubstr(path_));
    store.reset();
    Unfill();
    ExpectAckedPresentFailedAbsent();
  }
}

TEST_F(FullDiskTest, RefusesWritesBelowTheReserveBeforeTheDiskIsFull) {
  RocksDbStoreOptions o = Options();
  o.min_free_bytes = 2 << 20;
  std::unique_ptr<Store> store = OpenOk(o);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(CommitUntilFailure(*store, "before-", 50).ok());
  EXPECT_TRUE(store->Stats().writable);
  EXPECT_EQ(store->Stats().min_free_bytes, uint64_t{2} << 20);

  Fill(/*leave=*/1 << 20);
  ASSERT_TRUE(AwaitWritable(*store, false)) << "still writable with " << FreeBytes() << " free";
  const StoreStats stats = store->Stats();
  ASSERT_TRUE(stats.free_bytes.has_value());
  EXPECT_LT(*stats.free_bytes, uint64_t{2} << 20);
  EXPECT_GT(*stats.free_bytes, 0u);
  absl::Status s = CommitClaim(*store, "low-0");
  failed_.insert("low-0");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(path_));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(*stats.free_bytes, " bytes free")));
  EXPECT_THAT(s.message(), HasSubstr("min_free_bytes"));
  // Refused before RocksDB ran out: the reserve is still free.
  EXPECT_GT(FreeBytes(), uint64_t{512} << 10);

  Unfill();
  ASSERT_TRUE(AwaitWritable(*store, true));
  ASSERT_TRUE(CommitUntilFailure(*store, "after-", 20).ok());
  EXPECT_TRUE(store->Close().ok());
  ExpectAckedPresentFailedAbsent();
}

TEST_F(FullDiskTest, OpensReadOnlyBelowTheReserve) {
  {
    std::unique_ptr<Store> store = OpenOk(Options());
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(CommitUntilFailure(*store, "before-", 50).ok());
    ASSERT_TRUE(store->Close().ok());
  }
  Fill(/*leave=*/1 << 20);
  RocksDbStoreOptions o = Options();
  o.min_free_bytes = 2 << 20;
  std::unique_ptr<Store> store = OpenOk(o);
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->Stats().writable);
  absl::StatusOr<Contents> c = store->LoadAll();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->claims.size(), acked_.size());
  absl::Status s = CommitClaim(*store, "low-0");
  failed_.insert("low-0");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr(path_));
  EXPECT_THAT(s.message(), HasSubstr("read-only"));
  EXPECT_THAT(s.message(), HasSubstr("min_free_bytes"));

  Unfill();
  ASSERT_TRUE(AwaitWritable(*store, true));
  ASSERT_TRUE(CommitUntilFailure(*store, "after-", 20).ok());
  EXPECT_TRUE(store->Close().ok());
  ExpectAckedPresentFailedAbsent();
}

TEST_F(FullDiskTest, RefusesToCreateAStoreBelowTheReserveAndLeavesNothingBehind) {
  Fill(/*leave=*/1 << 20);
  RocksDbStoreOptions o = Options();
  o.min_free_bytes = 2 << 20;
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  EXPECT_THAT(store.status().message(), HasSubstr("min_free_bytes"));
  // The directory stays empty, so a start with room creates the store.
  EXPECT_TRUE(fs::is_empty(path_));
  Unfill();
  std::unique_ptr<Store> created = OpenOk(o);
  ASSERT_NE(created, nullptr);
  EXPECT_TRUE(CommitClaim(*created, "first").ok());
}

}  // namespace
}  // namespace sbx::store
