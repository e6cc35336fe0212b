// The RocksDB store's rooms tested on their own, below the Store interface: the info log
// (rocksdb_info_log.h) and the Database that holds the open rocksdb::DB
// (rocksdb_store_open.h). The Store behaviour they make up is tested through the
// interface in rocksdb_store_test.cc, rocksdb_store_full_disk_test.cc and
// store_conformance_test.cc. Real RocksDB, real files in a fresh temporary directory.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"
#include "src/store/rocksdb_info_log.h"
#include "src/store/rocksdb_store.h"
#include "src/store/rocksdb_store_open.h"

namespace sbx::store::internal {
namespace {

namespace fs = std::filesystem;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

class RoomsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "sbx_rocksdb_rooms_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static std::vector<std::string> Lines(const std::string& file) {
    std::vector<std::string> lines;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::string dir_;
};

// --- The info log ---

TEST_F(RoomsTest, InfoLogWritesOneLinePerMessageWithItsLevel) {
  std::shared_ptr<rocksdb::Logger> log = NewInfoLog(dir_);
  rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, log, "hello %d", 7);
  rocksdb::Log(rocksdb::InfoLogLevel::WARN_LEVEL, log, "two trailing newlines\n\n");
  rocksdb::Log(rocksdb::InfoLogLevel::DEBUG_LEVEL, log, "below the log's level");
  rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, log, "%s", std::string(3000, 'x').c_str());

  const std::vector<std::string> lines = Lines(dir_ + "/LOG");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], EndsWith(" [INFO] hello 7"));
  EXPECT_THAT(lines[1], EndsWith(" [WARN] two trailing newlines"));
  // Longer than the formatting buffer: still whole.
  EXPECT_THAT(lines[2], EndsWith(absl::StrCat(" [INFO] ", std::string(3000, 'x'))));
}

TEST_F(RoomsTest, InfoLogRollsOverToLogOldWithoutLosingALine) {
  std::shared_ptr<rocksdb::Logger> log = NewInfoLog(dir_);
  // About 4.5 MiB of lines: one roll-over at 4 MiB.
  const std::string payload(1000, 'p');
  constexpr int kLines = 4700;
  for (int i = 0; i < kLines; ++i) {
    rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, log, "line %d %s", i, payload.c_str());
  }
  ASSERT_TRUE(fs::exists(dir_ + "/LOG.old"));
  EXPECT_GE(fs::file_size(dir_ + "/LOG.old"), uint64_t{4} << 20);
  EXPECT_LT(fs::file_size(dir_ + "/LOG"), uint64_t{4} << 20);
  std::vector<std::string> lines = Lines(dir_ + "/LOG.old");
  const std::vector<std::string> current = Lines(dir_ + "/LOG");
  lines.insert(lines.end(), current.begin(), current.end());
  ASSERT_EQ(lines.size(), static_cast<size_t>(kLines));
  for (int i = 0; i < kLines; ++i) {
    ASSERT_THAT(lines[i], EndsWith(absl::StrCat(" [INFO] line ", i, " ", payload)));
  }
}

TEST_F(RoomsTest, InfoLogLinesFromManyThreadsStayWhole) {
  std::shared_ptr<rocksdb::Logger> log = NewInfoLog(dir_);
  constexpr int kThreads = 4;
  constexpr int kEach = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&log, t] {
      for (int i = 0; i < kEach; ++i) {
        rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, log, "thread %d line %d end", t, i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::string> seen;
  for (const std::string& line : Lines(dir_ + "/LOG")) {
    const size_t at = line.find(" [INFO] ");
    ASSERT_NE(at, std::string::npos) << line;
    ASSERT_THAT(line, EndsWith(" end"));
    seen.insert(line.substr(at));
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kEach));
}

TEST_F(RoomsTest, InfoLogDropsLinesItCannotWriteAndResumesWhenItCan) {
  const std::string missing = dir_ + "/later";
  std::shared_ptr<rocksdb::Logger> log = NewInfoLog(missing);  // the folder is not there yet
  rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, log, "dropped");
  ASSERT_TRUE(fs::create_directory(missing));
  // The first line after the folder is back reopens the file after its own write failed
  // (so it is dropped too); the lines after it are written.
  rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, log, "reopens");
  rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, log, "kept");
  const std::vector<std::string> lines = Lines(missing + "/LOG");
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), EndsWith(" [INFO] kept"));
  for (const std::string& line : lines) EXPECT_THAT(line, Not(HasSubstr("dropped")));
}

// --- The Database ---

class DatabaseTest : public RoomsTest {
 protected:
  void SetUp() override {
    RoomsTest::SetUp();
    options_.path = dir_ + "/db";
    rocks_ = MakeRocksOptions(options_);
    rocks_.info_log = NewInfoLog(dir_);  // beside the database: a fresh one must be empty
  }

  // Opens options_.path, creating it when missing.
  std::unique_ptr<Database> Open(bool below_reserve = false) {
    bool create = false;
    EXPECT_TRUE(CheckPath(options_.path, &create).ok());
    absl::StatusOr<OpenedDb> opened =
        OpenDb(rocks_, options_, create, below_reserve, std::nullopt, /*verify_checksums=*/true);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return nullptr;
    EXPECT_EQ(opened->read_only, below_reserve);
    return std::make_unique<Database>(options_.path, rocks_, std::move(opened->db), opened->lock);
  }

  RocksDbStoreOptions options_;
  rocksdb::Options rocks_;
};

TEST_F(DatabaseTest, ReopenKeepsWhatWasWrittenAndTakesTheCallbackBetween) {
  std::unique_ptr<Database> db = Open();
  ASSERT_NE(db, nullptr);
  {
    absl::ReaderMutexLock lock(&db->mu());
    ASSERT_TRUE(db->get()->Put(rocksdb::WriteOptions(), "c/kept", "v").ok());
  }
  int between = 0;
  absl::StatusOr<bool> read_only =
      db->Reopen(options_, std::nullopt, /*log_close_error=*/true, [&] { ++between; });
  ASSERT_TRUE(read_only.ok()) << read_only.status();
  EXPECT_FALSE(*read_only);
  EXPECT_EQ(between, 1);
  absl::ReaderMutexLock lock(&db->mu());
  ASSERT_NE(db->get(), nullptr);
  std::string value;
  ASSERT_TRUE(db->get()->Get(rocksdb::ReadOptions(), "c/kept", &value).ok());
  EXPECT_EQ(value, "v");
}

TEST_F(DatabaseTest, AFailedReopenLeavesNoDatabaseAndSaysSo) {
  std::unique_ptr<Database> db = Open();
  ASSERT_NE(db, nullptr);
  absl::StatusOr<bool> reopened = db->Reopen(options_, std::nullopt, /*log_close_error=*/true, [&] {
    // Between close and open: the database loses its CURRENT file.
    fs::remove(options_.path + "/CURRENT");
  });
  ASSERT_FALSE(reopened.ok());
  EXPECT_THAT(std::string(reopened.status().message()), HasSubstr(options_.path));
  {
    absl::ReaderMutexLock lock(&db->mu());
    EXPECT_EQ(db->get(), nullptr);
  }
  const absl::Status closed = db->Closed("LoadAll");
  EXPECT_EQ(closed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(closed.message()),
              HasSubstr(absl::StrCat("LoadAll on store at \"", options_.path,
                                     "\", which is closed or lost its database")));
}

TEST_F(DatabaseTest, AReadOnlyDatabaseHoldsTheLockUntilItCloses) {
  Open().reset();  // create it, and close it again
  std::unique_ptr<Database> db = Open(/*below_reserve=*/true);
  ASSERT_NE(db, nullptr);
  // DB::OpenForReadOnly takes no LOCK; the Database holds it, so no writer gets in.
  rocksdb::Options writer = rocks_;
  writer.info_log.reset();
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(writer, options_.path, &raw);
  EXPECT_FALSE(s.ok()) << "a writer opened the database beside the read-only store";
  EXPECT_THAT(s.ToString(), HasSubstr("lock"));
  delete raw;
  {
    absl::MutexLock lock(&db->mu());
    EXPECT_TRUE(db->CloseLocked().ok());
  }
  raw = nullptr;
  s = rocksdb::DB::Open(writer, options_.path, &raw);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (raw != nullptr) {
    EXPECT_TRUE(raw->Close().ok());
    delete raw;
  }
  EXPECT_THAT(s.ToString(), Not(HasSubstr("lock")));
}

}  // namespace
}  // namespace sbx::store::internal
