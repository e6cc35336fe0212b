// RocksDbStore specifics: opening and refusing, the on-disk encoding, durability and
// group commit details. Every test uses a real RocksDB in a fresh temporary directory. The
// Store contract shared with MemoryStore is in store_conformance_test.cc.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "src/store/record_codec.h"
#include "src/store/rocksdb_store.h"
#include "src/store/store.h"
#include "tests/store/test_records.h"

extern char** environ;

namespace sbx::store {
namespace {

namespace fs = std::filesystem;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing_records::FullClaim;
using testing_records::FullSandbox;
using testing_records::SmallClaim;

// The stored value of `claim`, encoded the way the store encodes it.
std::string ClaimValue(const ClaimRecord& claim) {
  WriteBatch b;
  b.Put(claim);
  std::string value;
  codec::EncodeValue(b.mutations()[0], &value);
  return value;
}

class RocksDbStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "sbx_rocksdb_store_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/db";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  RocksDbStoreOptions Options(Durability durability = Durability::kSync) const {
    RocksDbStoreOptions o;
    o.path = path_;
    o.durability = durability;
    return o;
  }

  std::unique_ptr<Store> OpenOk(const RocksDbStoreOptions& o) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(o);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  std::unique_ptr<Store> OpenOk() { return OpenOk(Options()); }

  // Creates a store at path_ holding `n` small claims, and closes it.
  void CreateWithClaims(int n) {
    std::unique_ptr<Store> store = OpenOk();
    ASSERT_NE(store, nullptr);
    WriteBatch b;
    for (int i = 0; i < n; ++i) b.Put(SmallClaim(absl::StrCat("c", i)));
    ASSERT_TRUE(store->CommitAndWait(std::move(b)).ok());
    ASSERT_TRUE(store->Close().ok());
  }

  // Writes one raw entry into the (closed) store, the way a bug or bit rot would.
  void RawPut(const std::string& key, const std::string& value) {
    rocksdb::Options o;
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(o, path_, &raw);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, value).ok());
    ASSERT_TRUE(db->Close().ok());
  }

  // Files of the database whose name matches `pred`.
  std::vector<fs::path> Files(const std::function<bool(const std::string&)>& pred) const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(path_)) {
      if (pred(e.path().filename().string())) out.push_back(e.path());
    }
    return out;
  }

  static void WriteFile(const fs::path& p, const std::string& contents) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << contents;
  }

  // Open must fail with `code` and a message naming the path.
  void ExpectRefused(absl::StatusCode code) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(Options());
    EXPECT_EQ(store.status().code(), code) << store.status();
    EXPECT_THAT(store.status().message(), HasSubstr(path_));
  }

  std::string dir_;
  std::string path_;
};

// --- Opening ---

TEST_F(RocksDbStoreTest, CreatesAMissingDirectoryAndItsParents) {
  path_ = dir_ + "/a/b/db";
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(fs::exists(path_ + "/CURRENT"));
}

TEST_F(RocksDbStoreTest, CreatesInAnEmptyDirectoryIgnoringLostAndFound) {
  fs::create_directories(path_ + "/lost+found");
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(fs::exists(path_ + "/CURRENT"));
}

TEST_F(RocksDbStoreTest, RefusesANonEmptyDirectoryThatIsNotADatabase) {
  fs::create_directories(path_);
  WriteFile(path_ + "/notes.txt", "my precious files");
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(Options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("\"" + path_ + "\""));
  EXPECT_THAT(store.status().message(), HasSubstr("not empty"));
  // Nothing was created in it.
  EXPECT_EQ(Files([](const std::string&) { return true; }).size(), 1u);
}

TEST_F(RocksDbStoreTest, RefusesAPathThatIsAFile) {
  WriteFile(path_, "x");
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(Options());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
}

TEST_F(RocksDbStoreTest, RefusesARocksDbDatabaseThatIsNotAnSbxStore) {
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, path_, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "user:1", "alice").ok());
    ASSERT_TRUE(db->Close().ok());
  }
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(Options());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  EXPECT_THAT(store.status().message(), HasSubstr("not an sbx store"));
}

TEST_F(RocksDbStoreTest, RefusesAnEmptyRocksDbDatabaseWithoutTheMarker) {
  // What a MANIFEST that lost its table files recovers to (or a first start that crashed
  // between creating the database and writing the marker leaves): never start empty on it.
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, path_, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Close().ok());
  }
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(Options());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  EXPECT_THAT(store.status().message(), HasSubstr("Refusing to start empty"));
}

TEST_F(RocksDbStoreTest, RefusesAMarkerOfAnotherFormat) {
  CreateWithClaims(1);
  RawPut("m/store", std::string("\x02sbx.store"));
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(Options());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  EXPECT_THAT(store.status().message(), HasSubstr("m/store"));
}

TEST_F(RocksDbStoreTest, RefusesASecondOpenOfTheSamePath) {
  std::unique_ptr<Store> first = OpenOk();
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<Store>> second = OpenRocksDbStore(Options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(path_));
}

TEST_F(RocksDbStoreTest, RefusesAGarbageCurrentFile) {
  CreateWithClaims(10);
  WriteFile(path_ + "/CURRENT", "garbage-without-newline");
  ExpectRefused(absl::StatusCode::kDataLoss);
}

TEST_F(RocksDbStoreTest, RefusesACurrentFileNamingAMissingManifest) {
  CreateWithClaims(10);
  WriteFile(path_ + "/CURRENT", "MANIFEST-999999\n");
  ExpectRefused(absl::StatusCode::kDataLoss);
}

TEST_F(RocksDbStoreTest, RefusesATruncatedManifest) {
  // RocksDB reads a MANIFEST cut short as if its writer had crashed, and recovers to the
  // state before the lost records: here, before the table holding every record. The
  // store must notice that it would start empty.
  CreateWithClaims(10);
  std::vector<fs::path> manifests =
      Files([](const std::string& n) { return n.rfind("MANIFEST-", 0) == 0; });
  ASSERT_FALSE(manifests.empty());
  for (const fs::path& m : manifests) fs::resize_file(m, fs::file_size(m) / 2);
  ExpectRefused(absl::StatusCode::kDataLoss);
}

TEST_F(RocksDbStoreTest, RefusesAManifestWithCorruptContents) {
  CreateWithClaims(10);
  std::vector<fs::path> manifests =
      Files([](const std::string& n) { return n.rfind("MANIFEST-", 0) == 0; });
  ASSERT_FALSE(manifests.empty());
  for (const fs::path& m : manifests) {
    std::fstream f(m, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(fs::file_size(m) / 2));
    f << std::string(8, '\x5a');
  }
  ExpectRefused(absl::StatusCode::kDataLoss);
}

TEST_F(RocksDbStoreTest, RefusesAMissingTableFile) {
  CreateWithClaims(1000);
  std::vector<fs::path> tables =
      Files([](const std::string& n) { return n.size() > 4 && n.substr(n.size() - 4) == ".sst"; });
  ASSERT_FALSE(tables.empty()) << "Close() should have flushed the memtable";
  for (const fs::path& t : tables) fs::remove(t);
  ExpectRefused(absl::StatusCode::kDataLoss);
}

TEST_F(RocksDbStoreTest, RefusesATruncatedTableFile) {
  CreateWithClaims(1000);
  std::vector<fs::path> tables =
      Files([](const std::string& n) { return n.size() > 4 && n.substr(n.size() - 4) == ".sst"; });
  ASSERT_FALSE(tables.empty());
  for (const fs::path& t : tables) fs::resize_file(t, fs::file_size(t) - 100);
  ExpectRefused(absl::StatusCode::kDataLoss);
}

TEST_F(RocksDbStoreTest, RefusesATableFileWithCorruptContents) {
  CreateWithClaims(5000);
  std::vector<fs::path> tables =
      Files([](const std::string& n) { return n.size() > 4 && n.substr(n.size() - 4) == ".sst"; });
  ASSERT_FALSE(tables.empty());
  for (const fs::path& t : tables) {
    // Overwrite bytes in the data blocks (the start of the file), keeping the size.
    std::fstream f(t, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(100);
    f << std::string(64, '\x5a');
  }
  ExpectRefused(absl::StatusCode::kDataLoss);

  // Without the check at open, LoadAll finds it: never a silent partial load.
  RocksDbStoreOptions o = Options();
  o.verify_checksums_on_open = false;
  std::unique_ptr<Store> store = OpenOk(o);
  ASSERT_NE(store, nullptr);
  absl::Status s = store->LoadAll().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(path_));
}

// --- Decoding ---

TEST_F(RocksDbStoreTest, LoadAllRefusesAValueThatDoesNotParse) {
  CreateWithClaims(3);
  RawPut("c/bad-claim", std::string("\x01\xff\xff\xff\xff", 5));
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  absl::Status s = store->LoadAll().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("c/bad-claim"));
  EXPECT_THAT(s.message(), HasSubstr(path_));
}

TEST_F(RocksDbStoreTest, LoadAllRefusesAnUnknownFormatVersion) {
  CreateWithClaims(3);
  RawPut("s/from-the-future", std::string("\x07\x0a\x02py", 5));
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  absl::Status s = store->LoadAll().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("s/from-the-future"));
  EXPECT_THAT(s.message(), HasSubstr("format version 7"));
}

TEST_F(RocksDbStoreTest, LoadAllRefusesOtherDamage) {
  struct Case {
    std::string key;
    std::string value;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"c/empty", "", "empty value"},
      {"x/unknown-kind", std::string("\x01", 1), "unknown key prefix"},
      {"m/unknown-meta", std::string("\x01", 1), "unknown metadata key"},
      {"c/", std::string("\x01", 1), "empty name"},
      // owner "o" (field 1), launch_type 1 (field 6), state 9 (field 7): no such state.
      {"c/o/bad-state", std::string("\x01\x0a\x01o\x30\x01\x38\x09", 8), "claim state 9"},
      // A well-formed claim of owner "tenant" under another owner's key, and under its
      // bare id (how a claim was keyed before claims were scoped by owner).
      {"c/tenant-b/x", ClaimValue(SmallClaim("x")), "does not start with its owner \"tenant/\""},
      {"c/x", ClaimValue(SmallClaim("x")), "does not start with its owner \"tenant/\""},
      // pool: empty_pool_policy (field 4) = 0, which is never valid.
      {"p/no-policy", std::string("\x01", 1), "empty pool policy 0"},
      // sandbox: created_ns (field 5) = 1e9.
      {"s/bad-nanos", std::string("\x01\x28\x80\x94\xeb\xdc\x03", 7), "nanoseconds"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    TearDown();
    SetUp();
    CreateWithClaims(1);
    RawPut(c.key, c.value);
    std::unique_ptr<Store> store = OpenOk();
    ASSERT_NE(store, nullptr);
    absl::Status s = store->LoadAll().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
    EXPECT_THAT(s.message(), HasSubstr("\"" + c.key + "\""));
  }
}

// --- Durability and group commit ---

TEST_F(RocksDbStoreTest, ACallbackRunsOnlyOnceItsWriteIsInTheDatabase) {
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  // A secondary instance reads the primary's files (log included) independently.
  rocksdb::Options so;
  so.max_open_files = -1;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenAsSecondary(so, path_, dir_ + "/secondary", &raw);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> secondary(raw);

  constexpr int kCommits = 20;
  std::atomic<int> seen{0};
  for (int i = 0; i < kCommits; ++i) {
    const std::string id = absl::StrCat("visible-", i);
    WriteBatch b;
    b.Put(SmallClaim(id));
    store->Commit(std::move(b), [&, id](absl::Status st) {
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_TRUE(secondary->TryCatchUpWithPrimary().ok());
      std::string value;
      rocksdb::Status g =
          secondary->Get(rocksdb::ReadOptions(), "c/" + ClaimKey(SmallClaim(id).owner, id), &value);
      EXPECT_TRUE(g.ok()) << id << ": " << g.ToString();
      if (g.ok()) seen.fetch_add(1);
    });
  }
  ASSERT_TRUE(store->Close().ok());
  EXPECT_EQ(seen.load(), kCommits);
}

TEST_F(RocksDbStoreTest, GroupLimitsSplitQueuedCommits) {
  RocksDbStoreOptions o = Options();
  o.max_group_mutations = 4;
  // Serial commit: a blocked callback holds the committer there, so that all the commits
  // below queue before any group forms. (The pipelined commit runs callbacks on its
  // syncer; its committer forms groups with the same limits, under load-dependent timing.)
  o.pipeline = false;
  std::unique_ptr<Store> store = OpenOk(o);
  ASSERT_NE(store, nullptr);
  absl::Notification in_callback;
  absl::Notification release;
  store->Commit(WriteBatch(), [&](absl::Status) {
    in_callback.Notify();
    release.WaitForNotification();
  });
  in_callback.WaitForNotification();
  const StoreStats before = store->Stats();
  for (int i = 0; i < 10; ++i) {
    WriteBatch b;
    b.Put(SmallClaim(absl::StrCat("c", i)));
    store->Commit(std::move(b), [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
  }
  // A batch larger than the limit still goes out, alone and whole.
  WriteBatch big;
  for (int i = 0; i < 9; ++i) big.Put(SmallClaim(absl::StrCat("big", i)));
  store->Commit(std::move(big), [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
  release.Notify();
  ASSERT_TRUE(store->Close().ok());
  // 10 single-mutation commits in groups of 4, 4, 2, then the big batch alone.
  EXPECT_EQ(store->Stats().write_batches - before.write_batches, 4u);
  // The committer's time on those groups is counted (its rate is its busy fraction).
  EXPECT_GT(store->Stats().committer_busy_seconds, before.committer_busy_seconds);

  store = OpenOk(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->LoadAll()->claims.size(), 19u);
}

TEST_F(RocksDbStoreTest, GroupBytesLimitSplitsQueuedCommits) {
  RocksDbStoreOptions o = Options();
  o.max_group_bytes = 1;  // every commit is its own group
  std::unique_ptr<Store> store = OpenOk(o);
  ASSERT_NE(store, nullptr);
  absl::Notification in_callback;
  absl::Notification release;
  store->Commit(WriteBatch(), [&](absl::Status) {
    in_callback.Notify();
    release.WaitForNotification();
  });
  in_callback.WaitForNotification();
  for (int i = 0; i < 5; ++i) {
    WriteBatch b;
    b.Put(SmallClaim(absl::StrCat("c", i)));
    store->Commit(std::move(b), [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
  }
  release.Notify();
  ASSERT_TRUE(store->Close().ok());
  EXPECT_EQ(store->Stats().write_batches, 5u);
}

// A batch marked set_sync(false) is answered once written, without a sync of its own;
// the next synced commit covers it. Both the pipelined and the serial commit.
TEST_F(RocksDbStoreTest, UnsyncedBatchesAreAnsweredWithoutASyncOfTheirOwn) {
  for (bool pipeline : {true, false}) {
    SCOPED_TRACE(pipeline ? "pipelined" : "serial");
    RocksDbStoreOptions o = Options();
    o.pipeline = pipeline;
    std::unique_ptr<Store> store = OpenOk(o);
    ASSERT_NE(store, nullptr);
    const StoreStats before = store->Stats();
    for (int i = 0; i < 10; ++i) {
      WriteBatch b;
      b.Put(FullSandbox(absl::StrCat("warm-", i)));
      b.set_sync(false);
      ASSERT_TRUE(store->CommitAndWait(std::move(b)).ok());
    }
    EXPECT_EQ(store->Stats().write_batches - before.write_batches, 10u);
    EXPECT_EQ(store->Stats().syncs - before.syncs, 0u);
    WriteBatch claim;
    claim.Put(SmallClaim("c1"));
    ASSERT_TRUE(store->CommitAndWait(std::move(claim)).ok());
    EXPECT_EQ(store->Stats().syncs - before.syncs, 1u);
    ASSERT_TRUE(store->Close().ok());
    store = OpenOk(o);
    ASSERT_NE(store, nullptr);
    absl::StatusOr<Contents> c = store->LoadAll();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->sandboxes.size(), 10u);
    EXPECT_EQ(c->claims.size(), 1u);
    ASSERT_TRUE(store->Close().ok());
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
}

TEST_F(RocksDbStoreTest, BufferedModeWritesWithoutSyncing) {
  std::unique_ptr<Store> store = OpenOk(Options(Durability::kBuffered));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 10; ++i) {
    WriteBatch b;
    b.Put(SmallClaim(absl::StrCat("c", i)));
    ASSERT_TRUE(store->CommitAndWait(std::move(b)).ok());
  }
  EXPECT_EQ(store->Stats().write_batches, 10u);
  EXPECT_EQ(store->Stats().syncs, 0u);
  store.reset();
  store = OpenOk(Options(Durability::kBuffered));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->LoadAll()->claims.size(), 10u);
}

TEST_F(RocksDbStoreTest, DestructorDrainsAndCloses) {
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  std::atomic<int> ok{0};
  for (int i = 0; i < 100; ++i) {
    WriteBatch b;
    b.Put(FullClaim(absl::StrCat("c", i)));
    store->Commit(std::move(b), [&](absl::Status s) {
      if (s.ok()) ok.fetch_add(1);
    });
  }
  store.reset();
  EXPECT_EQ(ok.load(), 100);
  store = OpenOk();  // would fail if the old instance still held the lock
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->LoadAll()->claims.size(), 100u);
}

TEST_F(RocksDbStoreTest, CloseFromACallbackIsRefused) {
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  absl::Status from_callback;
  ASSERT_TRUE(store
                  ->CommitAndWait([&] {
                    WriteBatch b;
                    b.Put(SmallClaim("c"));
                    return b;
                  }())
                  .ok());
  absl::Notification done;
  store->Commit(WriteBatch(), [&](absl::Status) {
    from_callback = store->Close();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(from_callback.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store->Close().ok());
}

// --- Child processes ---

struct ChildResult {
  int wait_status = 0;
  std::string out;
};

// Runs store_test_child with `args`; kills it with SIGKILL after `kill_after` unless it
// exits first (a zero duration waits for it to exit).
ChildResult RunChild(const std::vector<std::string>& args, absl::Duration kill_after) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> argv_storage = {SBX_STORE_TEST_CHILD};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);

  ChildResult result;
  std::thread reader([&] {
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) result.out.append(buf, n);
  });
  if (kill_after > absl::ZeroDuration()) {
    absl::SleepFor(kill_after);
    kill(pid, SIGKILL);
  }
  waitpid(pid, &result.wait_status, 0);
  reader.join();
  close(fds[0]);
  return result;
}

TEST_F(RocksDbStoreTest, AcknowledgedCommitsSurviveKill9) {
  std::mt19937 rng(20240601);
  std::uniform_int_distribution<int> delay_ms(100, 500);
  std::set<std::string> acked;
  constexpr int kRounds = 6;
  for (int round = 0; round < kRounds; ++round) {
    ChildResult r =
        RunChild({"ack", path_, absl::StrCat("r", round, "-")}, absl::Milliseconds(delay_ms(rng)));
    ASSERT_TRUE(WIFSIGNALED(r.wait_status) && WTERMSIG(r.wait_status) == SIGKILL)
        << "child ended on its own, status " << r.wait_status;
    for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      acked.insert(std::string(line));
    }
    // Every claim acknowledged in this and all earlier rounds is there after the restart.
    std::unique_ptr<Store> store = OpenOk();
    ASSERT_NE(store, nullptr);
    absl::StatusOr<Contents> c = store->LoadAll();
    ASSERT_TRUE(c.ok()) << c.status();
    std::set<std::string> present;
    for (const ClaimRecord& claim : c->claims) present.insert(claim.id);
    size_t missing = 0;
    for (const std::string& id : acked) {
      if (!present.count(id)) {
        ++missing;
        ADD_FAILURE() << "round " << round << ": acknowledged claim " << id << " lost";
      }
      if (missing > 5) break;
    }
    ASSERT_EQ(missing, 0u);
  }
  // Some kills must have hit a child in the middle of committing, or this proved nothing.
  EXPECT_GT(acked.size(), 100u);
}

TEST_F(RocksDbStoreTest, AFailedWriteFailsEveryCommitOfItsGroupAndAppliesNone) {
  ChildResult r = RunChild({"fail-group", path_}, absl::ZeroDuration());
  ASSERT_TRUE(WIFEXITED(r.wait_status) && WEXITSTATUS(r.wait_status) == 0)
      << "child status " << r.wait_status << ", output: " << r.out;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.out;
  const char* ids[] = {"small-1 ", "big ", "small-2 "};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_THAT(lines[i], ::testing::StartsWith(ids[i])) << "callbacks out of order";
    // The same write error for every member of the group, naming the path.
    EXPECT_THAT(lines[i], HasSubstr("UNAVAILABLE")) << lines[i];
    EXPECT_THAT(lines[i], HasSubstr(path_)) << lines[i];
  }

  // Reopen without the file size limit: the acknowledged commits are there, nothing of
  // the failed group is (the torn log record at the tail is dropped, not replayed).
  std::unique_ptr<Store> store = OpenOk();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<Contents> c = store->LoadAll();
  ASSERT_TRUE(c.ok()) << c.status();
  std::set<std::string> present;
  for (const ClaimRecord& claim : c->claims) present.insert(claim.id);
  EXPECT_EQ(present, (std::set<std::string>{"before", "blocker"}));
}

// --- Options ---

TEST(RocksDbStoreOptionsTest, ValidateNamesTheBadField) {
  RocksDbStoreOptions o;
  EXPECT_THAT(o.Validate().message(), HasSubstr("path"));
  o.path = "/tmp/x";
  EXPECT_TRUE(o.Validate().ok());
  o.max_group_bytes = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("max_group_bytes"));
  o.max_group_bytes = 1;
  o.max_group_mutations = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("max_group_mutations"));
  o.max_group_mutations = 1;
  o.write_buffer_bytes = 1024;
  EXPECT_THAT(o.Validate().message(), HasSubstr("write_buffer_bytes"));
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenRocksDbStore(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RocksDbStoreOptionsTest, DefaultsAreDocumentedOnes) {
  RocksDbStoreOptions o;
  EXPECT_EQ(o.durability, Durability::kSync);
  EXPECT_EQ(o.max_group_bytes, size_t{4} << 20);
  EXPECT_EQ(o.max_group_mutations, 32768u);
  EXPECT_EQ(o.write_buffer_bytes, size_t{16} << 20);
  EXPECT_TRUE(o.verify_checksums_on_open);
  EXPECT_EQ(o.min_free_bytes, uint64_t{64} << 20);
  EXPECT_EQ(o.free_space_check_interval, absl::Seconds(1));
}

TEST(RocksDbStoreOptionsTest, ValidateRefusesANonPositiveCheckInterval) {
  RocksDbStoreOptions o;
  o.path = "/tmp/x";
  for (absl::Duration d : {absl::ZeroDuration(), absl::Seconds(-1), absl::InfiniteDuration()}) {
    o.free_space_check_interval = d;
    EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(o.Validate().message(), HasSubstr("free_space_check_interval")) << d;
  }
  o.free_space_check_interval = absl::Milliseconds(1);
  EXPECT_TRUE(o.Validate().ok());
}

TEST(RocksDbStoreOptionsTest, DurabilityNamesRoundTrip) {
  EXPECT_EQ(DurabilityName(Durability::kSync), "sync");
  EXPECT_EQ(DurabilityName(Durability::kBuffered), "buffered");
  for (Durability d : {Durability::kSync, Durability::kBuffered}) {
    absl::StatusOr<Durability> parsed = ParseDurability(DurabilityName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  absl::StatusOr<Durability> bad = ParseDurability("fsync");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"fsync\""));
}

}  // namespace
}  // namespace sbx::store
