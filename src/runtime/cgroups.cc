#include "src/runtime/cgroups.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {

namespace fs = std::filesystem;

Cgroups Cgroups::Detect(bool use_freezer) {
  Cgroups c;
  auto usable = [](const std::string& base) {
    std::error_code ec;
    fs::create_directories(base, ec);
    return !ec && access(base.c_str(), W_OK) == 0 ? base : std::string();
  };
  if (fs::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    c.memory = usable("/sys/fs/cgroup/memory/sbx");
  }
  if (fs::exists("/sys/fs/cgroup/pids/cgroup.procs")) c.pids = usable("/sys/fs/cgroup/pids/sbx");
  if (use_freezer && fs::exists("/sys/fs/cgroup/freezer/cgroup.procs")) {
    c.freezer = usable("/sys/fs/cgroup/freezer/sbx");
  }
  return c;
}

std::vector<std::string> Cgroups::DirsOf(const std::string& id) const {
  std::vector<std::string> dirs;
  for (const std::string* base : {&memory, &pids, &freezer}) {
    if (!base->empty()) dirs.push_back(*base + "/" + id);
  }
  return dirs;
}

std::vector<pid_t> CgroupProcs(const std::string& dir) {
  std::vector<pid_t> out;
  for (absl::string_view line :
       absl::StrSplit(ReadSmallFile(dir + "/cgroup.procs"), '\n', absl::SkipEmpty())) {
    pid_t pid = 0;
    if (absl::SimpleAtoi(line, &pid) && pid > 0) out.push_back(pid);
  }
  return out;
}

std::vector<std::string> MakeCgroups(const Cgroups& cgroups, const std::string& id,
                                     const LocalSpec& spec, std::string* freezer) {
  std::vector<std::string> dirs;
  auto make = [&](const std::string& base, const std::string& file, int64_t value,
                  const char* what) -> bool {
    if (base.empty()) {
      spdlog::warn("sandbox {}: {} limit {} not applied: no writable cgroup controller", id, what,
                   value);
      return false;
    }
    const std::string dir = base + "/" + id;
    if (mkdir(dir.c_str(), 0755) != 0 ||
        (!file.empty() && !WriteFile(dir + "/" + file, std::to_string(value)))) {
      spdlog::warn("sandbox {}: {} {} not applied: cannot write {}/{}: {}", id, what, value, dir,
                   file, sbx::ErrnoText(errno));
      rmdir(dir.c_str());
      return false;
    }
    dirs.push_back(dir);
    return true;
  };
  if (spec.memory_limit_bytes > 0) {
    make(cgroups.memory, "memory.limit_in_bytes", spec.memory_limit_bytes, "memory");
  }
  if (spec.pids_limit > 0) make(cgroups.pids, "pids.max", spec.pids_limit, "pids");
  if (!cgroups.freezer.empty() && make(cgroups.freezer, "", 0, "freezer")) {
    *freezer = dirs.back();
  }
  return dirs;
}

// A runtime on another root that was killed leaves them behind, and nothing else would
// ever remove them. A live sandbox's cgroups hold its processes (rmdir fails on them), and
// a sandbox being made fills its cgroups within its ready timeout.
void PruneEmptyCgroups(const Cgroups& cgroups) {
  const auto cutoff = fs::file_time_type::clock::now() - std::chrono::minutes(1);
  int removed = 0;
  for (const std::string* base : {&cgroups.memory, &cgroups.pids, &cgroups.freezer}) {
    if (base->empty()) continue;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(*base, ec)) {
      if (entry.path().filename().string().rfind(kIdPrefix, 0) != 0) continue;
      std::error_code time_ec;
      const auto written = fs::last_write_time(entry.path(), time_ec);
      if (!time_ec && written < cutoff && rmdir(entry.path().c_str()) == 0) ++removed;
    }
  }
  if (removed > 0) spdlog::info("local runtime: removed {} empty sandbox cgroups", removed);
}

std::vector<pid_t> Members(const Sandbox& sb) {
  if (sb.cgroup_dirs.empty()) {
    return Alive(sb.pid, sb.start_time) ? ProcessTree(sb.pid) : std::vector<pid_t>();
  }
  absl::flat_hash_set<pid_t> all;
  for (const std::string& cg : sb.cgroup_dirs) {
    for (pid_t p : CgroupProcs(cg)) all.insert(p);
  }
  return std::vector<pid_t>(all.begin(), all.end());
}

// Freezing passes through FREEZING while tasks reach the refrigerator.
absl::Status SetFreezer(const Sandbox& sb, const std::string& state) {
  const std::string file = sb.freezer + "/freezer.state";
  const absl::Time deadline = absl::Now() + kSettleTimeout;
  for (int i = 0;; ++i) {
    // Rewriting FROZEN retries tasks that could not be frozen yet.
    if (i % 16 == 0 && !WriteFile(file, state)) {
      return absl::UnavailableError(absl::StrCat("sandbox ", sb.id, ": cannot write ", state,
                                                 " to ", file, ": ", sbx::ErrnoText(errno)));
    }
    std::string now = ReadSmallFile(file);
    while (!now.empty() && now.back() == '\n') now.pop_back();
    if (now == state) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("sandbox ", sb.id, ": ", file, " reads \"",
                                                      now, "\", not ", state, " after ",
                                                      absl::FormatDuration(kSettleTimeout)));
    }
    absl::SleepFor(absl::Microseconds(500));
  }
}

// SIGSTOP again for the processes forked meanwhile.
absl::Status StopAll(const Sandbox& sb) {
  absl::flat_hash_set<pid_t> stopped;
  for (int round = 0; round < 100; ++round) {
    bool more = false;
    for (pid_t p : Members(sb)) {
      if (stopped.insert(p).second) {
        kill(p, SIGSTOP);
        more = true;
      }
    }
    if (!more) break;
  }
  const absl::Time deadline = absl::Now() + kSettleTimeout;
  for (pid_t p : stopped) {
    while (true) {
      const std::optional<ProcStat> st = ReadStat(p);
      if (!st || st->state == 'T' || st->state == 't' || st->state == 'Z' || st->state == 'X') {
        break;
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("sandbox ", sb.id, ": process ", p,
                                                        " did not stop (state ",
                                                        std::string(1, st->state), ")"));
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  return absl::OkStatus();
}

void ContinueAll(const Sandbox& sb) {
  for (pid_t p : Members(sb)) kill(p, SIGCONT);
}

}  // namespace sbx::runtime::local
