// A helper process for rocksdb_store_test.cc: it does to a store what a test process
// cannot do to itself (be killed mid-commit, run out of file size limit).
//
//   store_test_child ack <path> <prefix>
//       Commits claims "<prefix>w<thread>-<n>" from 4 threads, each waiting for its callback, and
//       prints "<id>\n" to stdout once a commit is acknowledged; runs until killed.
//   store_test_child fail-group <path>
//       Commits "before" and "blocker", then queues three commits behind the blocked
//       committer and lowers RLIMIT_FSIZE so that their group's write fails. Prints one
//       line "<id> <status code>" per queued commit, then exits without closing the store
//       (like a crash right after the failure).

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "src/common/logging.h"
#include "src/store/rocksdb_store.h"
#include "src/store/store.h"

namespace sbx::store {
namespace {

void WriteLine(const std::string& line) {
  std::string s = line + "\n";
  // One write(2) per line, so that a kill never leaves half a line behind.
  if (write(STDOUT_FILENO, s.data(), s.size()) != static_cast<ssize_t>(s.size())) _exit(3);
}

std::unique_ptr<Store> OpenOrDie(const std::string& path, bool pipeline = true) {
  RocksDbStoreOptions options;
  options.path = path;
  options.durability = Durability::kSync;
  options.pipeline = pipeline;
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(options);
  if (!store.ok()) {
    fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    _exit(2);
  }
  return *std::move(store);
}

ClaimRecord Claim(const std::string& id, size_t label_bytes = 0) {
  ClaimRecord c;
  c.id = id;
  c.owner = "child";
  c.pool = "py";
  c.sandbox_id = "s-" + id;
  if (label_bytes > 0) c.labels["big"] = std::string(label_bytes, 'x');
  return c;
}

int Ack(const std::string& path, const std::string& prefix) {
  std::unique_ptr<Store> store = OpenOrDie(path);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, &prefix, t] {
      for (int n = 0;; ++n) {
        const std::string id = absl::StrCat(prefix, "w", t, "-", n);
        WriteBatch b;
        b.Put(Claim(id));
        absl::Status s = store->CommitAndWait(std::move(b));
        if (!s.ok()) _exit(4);
        WriteLine(id);
      }
    });
  }
  for (std::thread& t : threads) t.join();  // never: the parent kills us
  return 0;
}

uint64_t LargestFile(const std::string& path) {
  uint64_t largest = 0;
  for (const auto& e : std::filesystem::directory_iterator(path)) {
    if (e.is_regular_file()) largest = std::max<uint64_t>(largest, e.file_size());
  }
  return largest;
}

int FailGroup(const std::string& path) {
  signal(SIGXFSZ, SIG_IGN);  // get EFBIG from write(2) instead of dying
  // Serial commit: the construction below holds the committer in a commit callback, which
  // only the serial commit runs on the committer. (The pipelined commit's failed writes,
  // answered by its syncer, are exercised by rocksdb_store_full_disk_test.)
  std::unique_ptr<Store> store = OpenOrDie(path, /*pipeline=*/false);
  {
    WriteBatch b;
    b.Put(Claim("before"));
    if (!store->CommitAndWait(std::move(b)).ok()) return 5;
  }
  absl::Notification blocked;
  absl::Notification release;
  {
    WriteBatch b;
    b.Put(Claim("blocker"));
    store->Commit(std::move(b), [&](absl::Status s) {
      if (!s.ok()) _exit(6);
      blocked.Notify();
      release.WaitForNotification();
    });
  }
  blocked.WaitForNotification();  // "blocker" is written; the committer is held

  absl::Mutex mu;
  std::vector<std::string> lines;
  int done = 0;
  const std::vector<std::pair<std::string, size_t>> queued = {
      {"small-1", 0}, {"big", 1 << 20}, {"small-2", 0}};
  for (const auto& [id, bytes] : queued) {
    WriteBatch b;
    b.Put(Claim(id, bytes));
    b.Put(Claim(id + "-twin"));  // a second mutation in the same batch
    store->Commit(std::move(b), [&, id = id](absl::Status s) {
      absl::MutexLock lock(&mu);
      lines.push_back(absl::StrCat(id, " ", absl::StatusCodeToString(s.code()), " ", s.message()));
      ++done;
    });
  }
  // The limit applies to every file the process writes, RocksDB's info LOG included
  // (which is larger than the write-ahead log here, and must stay writable: the error
  // handler logs to it). Leave room for that, but far less than the 1 MiB the group needs.
  const uint64_t limit = LargestFile(path) + (256 << 10);
  struct rlimit rl = {limit, limit};
  if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 7;
  release.Notify();
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* d) { return *d == 3; }, &done));
    for (const std::string& line : lines) WriteLine(line);
  }
  _exit(0);  // no Close(): the store is left as a crash would leave it
}

}  // namespace
}  // namespace sbx::store

int main(int argc, char** argv) {
  // The store logs (a failed write, its recovery); to stderr, as sbx-server does, since
  // stdout is the protocol with the parent.
  if (!sbx::InitLogging({}).ok()) return 1;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "ack" && argc == 4) return sbx::store::Ack(argv[2], argv[3]);
  if (mode == "fail-group" && argc == 3) return sbx::store::FailGroup(argv[2]);
  fprintf(stderr, "usage: %s ack <path> <prefix> | fail-group <path>\n", argv[0]);
  return 1;
}
