// The store's info log (rocksdb_info_log.h).

#include "src/store/rocksdb_info_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace sbx::store::internal {
namespace {

// RocksDB's info log, in the database directory as LOG (rolled over to LOG.old at
// kMaxBytes). It replaces RocksDB's file logger, which aborts the process on the line
// after a failed write (docs/architecture.md, "A full disk"): here each line is one write(2) to an
// O_APPEND file, and a line the file system refuses is dropped. Lines at ERROR and above
// also go to sbx's log, where an operator sees them even when the disk is full.
class InfoLog final : public rocksdb::Logger {
 public:
  explicit InfoLog(std::string dir)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), dir_(std::move(dir)) {
    absl::WriterMutexLock lock(&mu_);
    OpenLocked(/*truncate=*/false);
  }
  ~InfoLog() override {
    absl::WriterMutexLock lock(&mu_);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void LogHeader(const char* format, va_list ap) override {
    Write(rocksdb::InfoLogLevel::HEADER_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    Write(level, format, ap);
  }

 protected:
  rocksdb::Status CloseImpl() override {
    absl::WriterMutexLock lock(&mu_);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return rocksdb::Status::OK();
  }

 private:
  static constexpr uint64_t kMaxBytes = 4 << 20;

  void Write(rocksdb::InfoLogLevel level, const char* format, va_list ap) {
    static constexpr const char* kNames[] = {"DEBUG", "INFO", "WARN", "ERROR", "FATAL", "HEADER"};
    const int index = static_cast<int>(level);
    const char* name = index >= 0 && index < 6 ? kNames[index] : "?";
    char message[1024];
    va_list copy;
    va_copy(copy, ap);
    const int n = vsnprintf(message, sizeof(message), format, copy);
    va_end(copy);
    std::string text;
    if (n < 0) {
      text = format;
    } else if (static_cast<size_t>(n) < sizeof(message)) {
      text.assign(message, n);
    } else {
      text.resize(n + 1);
      va_copy(copy, ap);
      vsnprintf(text.data(), text.size(), format, copy);
      va_end(copy);
      text.resize(n);
    }
    while (!text.empty() && text.back() == '\n') text.pop_back();
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL &&
        level != rocksdb::InfoLogLevel::HEADER_LEVEL) {
      std::string one_line = text;  // some messages dump structures over several lines
      std::replace(one_line.begin(), one_line.end(), '\n', ' ');
      spdlog::error("rocksdb at \"{}\": {}", dir_, one_line);
    }
    const std::string line =
        absl::StrCat(absl::FormatTime("%Y/%m/%d-%H:%M:%E6S ", absl::Now(), absl::UTCTimeZone()),
                     gettid(), " [", name, "] ", text, "\n");
    bool roll = false;
    {
      // Shared: lines from several threads go out concurrently (O_APPEND keeps each line
      // whole); only a roll-over replaces fd_.
      absl::ReaderMutexLock lock(&mu_);
      if (fd_ >= 0 && write(fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
        roll = size_.fetch_add(line.size(), std::memory_order_relaxed) + line.size() >= kMaxBytes;
      }
    }
    if (roll || fd_missing_.load(std::memory_order_relaxed)) {
      absl::WriterMutexLock lock(&mu_);
      if (roll && size_.load(std::memory_order_relaxed) >= kMaxBytes) {
        // Best effort: a failed rename keeps writing to the full-size file until the next
        // attempt, and a failed open drops lines until one succeeds.
        std::rename((dir_ + "/LOG").c_str(), (dir_ + "/LOG.old").c_str());
        if (fd_ >= 0) close(fd_);
        OpenLocked(/*truncate=*/true);
      } else if (fd_ < 0) {
        OpenLocked(/*truncate=*/false);
      }
    }
  }

  void OpenLocked(bool truncate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    fd_ = open((dir_ + "/LOG").c_str(),
               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
    struct stat st;
    size_.store(fd_ >= 0 && fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0,
                std::memory_order_relaxed);
    fd_missing_.store(fd_ < 0, std::memory_order_relaxed);
  }

  const std::string dir_;
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  // Atomic because writers add to it under the shared lock. Relaxed: it only decides when
  // to roll over, and the roll re-checks it under the exclusive lock.
  std::atomic<uint64_t> size_{0};
  // Atomic so that a line can check it without the exclusive lock; relaxed, as size_.
  std::atomic<bool> fd_missing_{false};
};

}  // namespace

std::shared_ptr<rocksdb::Logger> NewInfoLog(std::string dir) {
  return std::make_shared<InfoLog>(std::move(dir));
}

}  // namespace sbx::store::internal
