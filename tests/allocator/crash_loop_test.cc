// Crash loop: a child runs the allocator on a RocksDB store under claim load and is killed
// with SIGKILL at random moments, 50 times. After each kill the store must hold every
// claim the child acknowledged, bound to the same sandbox (released if its release was
// acknowledged), and no sandbox may be bound to two active claims. Revisions never go
// backwards: each restart recovers a revision at least as high as every one acknowledged
// before, and the claims it then makes get higher ones.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/store/rocksdb_store.h"

namespace sbx {
namespace {

constexpr int kKills = 50;

struct Acked {
  std::string sandbox;
  bool released = false;
};

struct Child {
  pid_t pid = -1;
  int out = -1;
};

Child Spawn(const std::string& db, int run) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    const std::string run_id = std::to_string(run);
    execl(SBX_CRASH_CHILD, SBX_CRASH_CHILD, db.c_str(), run_id.c_str(), nullptr);
    _exit(127);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

// Reads whatever the child wrote until `deadline` (or EOF). Appends complete lines.
bool ReadLines(int fd, absl::Time deadline, std::string& buf, std::vector<std::string>& lines) {
  fcntl(fd, F_SETFL, O_NONBLOCK);
  char chunk[65536];
  while (absl::Now() < deadline) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n == 0) return false;  // EOF
    if (n < 0) {
      usleep(1000);
      continue;
    }
    buf.append(chunk, n);
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      lines.push_back(buf.substr(0, nl));
      buf.erase(0, nl + 1);
    }
  }
  return true;
}

TEST(CrashLoopTest, AcknowledgedClaimsSurviveKillNine) {
  std::string dir = ::testing::TempDir() + "/sbx-crash-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string db = dir + "/db";
  absl::BitGen gen;
  std::map<std::string, Acked> acked;  // claim key -> what the child acknowledged
  size_t total_lines = 0;
  uint64_t max_acked_revision = 0;  // over all earlier runs

  for (int run = 0; run < kKills; ++run) {
    Child child = Spawn(db, run);
    ASSERT_GT(child.pid, 0);
    std::string buf;
    std::vector<std::string> lines;
    // Wait for READY (recovery done), then let it run a random while and kill it.
    const absl::Time ready_deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < ready_deadline &&
           (lines.empty() || !absl::StartsWith(lines.front(), "READY"))) {
      if (!ReadLines(child.out, absl::Now() + absl::Milliseconds(10), buf, lines)) break;
    }
    ASSERT_FALSE(lines.empty()) << "run " << run << ": child exited before READY";
    ASSERT_TRUE(absl::StartsWith(lines.front(), "READY")) << lines.front();
    {
      std::vector<std::string> f = absl::StrSplit(lines.front(), ' ');
      uint64_t recovered = 0;
      ASSERT_EQ(f.size(), 4u) << lines.front();
      ASSERT_TRUE(absl::SimpleAtoi(f[3], &recovered)) << lines.front();
      ASSERT_GE(recovered, max_acked_revision) << "run " << run << ": revision went backwards";
    }
    const uint64_t before_run = max_acked_revision;
    ReadLines(child.out, absl::Now() + absl::Milliseconds(absl::Uniform(gen, 20, 300)), buf, lines);
    kill(child.pid, SIGKILL);
    int status = 0;
    waitpid(child.pid, &status, 0);
    // Lines written before the kill are still in the pipe: they were acknowledged too.
    ReadLines(child.out, absl::Now() + absl::Milliseconds(200), buf, lines);
    close(child.out);
    ASSERT_TRUE(WIFSIGNALED(status)) << "run " << run << ": child ended by itself";

    for (size_t i = 1; i < lines.size(); ++i) {
      std::vector<std::string> f = absl::StrSplit(lines[i], ' ');
      uint64_t revision = 0;
      if (f.size() == 4 && f[0] == "A" && absl::SimpleAtoi(f[3], &revision)) {
        ASSERT_FALSE(acked.contains(f[1])) << "claim acknowledged twice: " << f[1];
        acked[f[1]].sandbox = f[2];
      } else if (f.size() == 3 && f[0] == "R" && absl::SimpleAtoi(f[2], &revision)) {
        ASSERT_TRUE(acked.contains(f[1])) << "release before claim: " << f[1];
        acked[f[1]].released = true;
      } else {
        FAIL() << "bad line from child: " << lines[i];
      }
      ASSERT_GT(revision, before_run) << "run " << run << ": revision reused: " << lines[i];
      max_acked_revision = std::max(max_acked_revision, revision);
    }
    total_lines += lines.size();

    // Check the store as a restart would see it.
    store::RocksDbStoreOptions so;
    so.path = db;
    auto s = store::OpenRocksDbStore(so);
    ASSERT_TRUE(s.ok()) << "run " << run << ": " << s.status();
    auto contents = (*s)->LoadAll();
    ASSERT_TRUE(contents.ok()) << contents.status();
    std::map<std::string, const store::ClaimRecord*> stored;
    std::map<std::string, std::string> holder;  // sandbox -> active claim
    for (const auto& c : contents->claims) {
      const std::string key = c.owner + "/" + c.id;
      stored[key] = &c;
      if (c.state == store::ClaimState::kActive) {
        auto [it, fresh] = holder.emplace(c.sandbox_id, key);
        ASSERT_TRUE(fresh) << "run " << run << ": sandbox " << c.sandbox_id << " is bound to "
                           << it->second << " and " << key;
      }
    }
    for (const auto& [key, a] : acked) {
      auto it = stored.find(key);
      ASSERT_NE(it, stored.end()) << "run " << run << ": acknowledged claim " << key << " lost";
      EXPECT_EQ(it->second->sandbox_id, a.sandbox) << key;
      if (a.released) {
        EXPECT_EQ(it->second->state, store::ClaimState::kReleased) << key;
      } else {
        // Not acknowledged as released: active, or released just before the kill.
        EXPECT_TRUE(it->second->state == store::ClaimState::kActive ||
                    it->second->state == store::ClaimState::kReleased)
            << key;
      }
    }
    ASSERT_TRUE((*s)->Close().ok());
  }
  EXPECT_GT(acked.size(), 100u) << "the child did too little work for the test to mean much";
  std::printf("crash loop: %d kills, %zu claims acknowledged, %zu lines\n", kKills, acked.size(),
              total_lines);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace sbx
