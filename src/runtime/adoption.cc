#include "src/runtime/adoption.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "src/runtime/proc.h"
#include "src/runtime/reaper.h"
#include "src/runtime/state_file.h"

namespace sbx::runtime::local {
namespace {

namespace fs = std::filesystem;

bool Connects(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // Non-blocking: a frozen daemon's full backlog must not hang the caller.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// The sandbox id whose host folder (root/lb-...) a working directory lies in, or empty:
// every sandbox's top process (bwrap, or the plain daemon) works in its host folder.
std::string IdOfCwd(const std::string& cwd, const std::string& root) {
  const std::string marker = absl::StrCat(root, "/", kIdPrefix);
  if (!absl::StartsWith(cwd, marker)) return "";
  const size_t end = cwd.find('/', root.size() + 1);
  return cwd.substr(root.size() + 1,
                    end == std::string::npos ? std::string::npos : end - root.size() - 1);
}

}  // namespace

std::vector<SandboxPtr> AdoptOrCleanUp(const std::string& root, const Cgroups& cgroups) {
  std::vector<SandboxPtr> adopted;
  std::vector<SandboxPtr> dead;
  absl::flat_hash_set<std::string> keep;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kIdPrefix, 0) != 0) continue;
    auto sb = std::make_shared<Sandbox>();
    sb->dir = entry.path().string();
    struct stat st;
    const bool own_dir =
        lstat(sb->dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid();
    const bool has_state = own_dir && DecodeState(ReadOwnFile(sb->dir, kStateName), sb.get());
    sb->endpoint = absl::StrCat("unix:", sb->dir, "/", kSocketName);
    for (const std::string& cg : cgroups.DirsOf(name)) {
      if (fs::exists(cg)) {
        sb->cgroup_dirs.push_back(cg);
        if (!cgroups.freezer.empty() && cg.rfind(cgroups.freezer, 0) == 0) sb->freezer = cg;
      }
    }
    if (has_state && sb->id == name && Alive(sb->pid, sb->start_time) &&
        ProcessCwd(sb->pid) == sb->dir) {
      // The pidfd names the process for good; the start time is checked again after
      // opening it, in case the pid was recycled in between.
      sb->pidfd.Reset(PidfdOpen(sb->pid));
      if (Alive(sb->pid, sb->start_time) && Connects(sb->dir + "/" + kSocketName)) {
        if (!Alive(sb->init_pid, sb->init_start_time)) sb->init_pid = -1;
        const int64_t uid = ProcessUid(sb->pid);
        sb->host_uid = uid >= 0 ? static_cast<uid_t>(uid) : geteuid();
        if (!sb->freezer.empty()) {
          std::string state = ReadSmallFile(sb->freezer + "/freezer.state");
          bool frozen = state.rfind("FROZEN", 0) == 0;
          // Frozen although its state file (written by every Suspend and Resume) says it
          // runs: a snapshot's freeze that a crash interrupted. Thawed, as the snapshot
          // would have done.
          if (frozen && !sb->suspended.load(std::memory_order_relaxed)) {
            if (absl::Status s = SetFreezer(*sb, "THAWED"); s.ok()) {
              spdlog::info("sandbox {}: thawed (frozen by a snapshot a crash interrupted)", sb->id);
              frozen = false;
            }
          }
          sb->suspended.store(frozen, std::memory_order_relaxed);
        }
        OpenOutput(*sb);
        keep.insert(name);
        adopted.push_back(std::move(sb));
        continue;
      }
    }
    // Not adoptable: its processes are found below by their working folder; what the state
    // file said about pids is not used to kill anything.
    sb->id = name;
    sb->pid = -1;
    sb->init_pid = -1;
    sb->pidfd.Reset();
    if (!own_dir) sb->dir.clear();  // not ours to remove
    dead.push_back(std::move(sb));
  }
  // Processes of the dead ones (or of folders already removed), found by the folder they
  // work in: a bwrap still starting when its sbx was killed has no state file yet. With
  // each such top process goes its children: bwrap's pid 1 of the sandbox, whose end
  // ends the sandbox's pid namespace.
  int killed = 0;
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  absl::flat_hash_set<pid_t> strays;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid) || pid == getpid()) continue;
    if (auto st = ReadStat(pid)) parent_of.emplace_back(pid, st->ppid);
    const std::string id = IdOfCwd(ProcessCwd(pid), root);
    if (!id.empty() && !keep.contains(id)) strays.insert(pid);
  }
  for (const auto& [pid, ppid] : parent_of) {
    if (strays.contains(ppid) && kill(pid, SIGKILL) == 0) ++killed;
  }
  for (pid_t pid : strays) {
    if (kill(pid, SIGKILL) == 0) ++killed;
  }
  for (SandboxPtr& sb : dead) {
    absl::MutexLock lock(&sb->op_mu);
    KillSandbox(*sb);
  }
  if (!adopted.empty() || !dead.empty() || killed > 0) {
    spdlog::warn(
        "local runtime: under {}: adopted {} running sandboxes, cleaned up {} dead, half-made or "
        "older ones (killed {} stray processes)",
        root, adopted.size(), dead.size(), killed);
  }
  return adopted;
}

}  // namespace sbx::runtime::local
