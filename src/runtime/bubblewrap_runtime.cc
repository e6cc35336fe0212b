#include "src/runtime/bubblewrap_runtime.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/common/ids.h"
#include "src/common/paths.h"
#include "src/common/status_macros.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDefaultWorkspaceBytes = int64_t{256} << 20;
constexpr char kWorkspaceInside[] = "/run/sbx/workspace";
constexpr char kSandboxdInside[] = "/run/sbx/bin/sbx-sandboxd";
constexpr char kSocketName[] = "sandboxd.sock";
constexpr char kStateName[] = "state.json";
constexpr char kLogName[] = "sandboxd.log";
// The log's previous part, kept when the log reaches kLogCapBytes.
constexpr char kOldLogName[] = "sandboxd.log.1";
// A FIFO: the standard output and error of bwrap (the sandbox's pid 1 holds them) and of
// the daemon. The runtime reads it into the log; see DrainOutput.
constexpr char kOutputName[] = "output";
// Bytes of a sandbox's output kept in each of its two log files.
constexpr int64_t kLogCapBytes = int64_t{1} << 20;
constexpr char kIdPrefix[] = "lb-";
// The state file's version; files of other versions are not trusted (version 1 lived in a
// folder the sandbox could write).
constexpr int kStateVersion = 2;
// The uid and gid of the workload inside its user namespace.
constexpr int kUidInside = 1000;
// The descriptors the sandbox's first process gets (see SpawnPlan::fds).
constexpr int kInfoFd = 3;      // bwrap's --info-fd: the host pid of the sandbox's pid 1
constexpr int kListenFd = 4;    // the daemon's listening socket
constexpr int kSecretFd = 5;    // a pipe holding the daemon's secret
constexpr int kReadyFd = 6;     // the daemon writes a byte here once serving
constexpr int kSeccompFd = 7;   // bwrap's --seccomp: the filter's BPF program
constexpr int kSandboxdFd = 8;  // bwrap's --ro-bind-fd: the daemon's binary (O_PATH)
// What the sandbox's first process finds in its environment (bwrap, or the daemon in the
// plain fallback): nothing of sbx's own.
constexpr char kPathEnv[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
// Files of /etc that hold secrets of the host, masked in every sandbox (besides being
// unreadable to the sandbox's unprivileged uid).
constexpr const char* kEtcSecrets[] = {
    "/etc/shadow",  "/etc/shadow-",     "/etc/gshadow",     "/etc/gshadow-",
    "/etc/sudoers", "/etc/sudoers.d",   "/etc/ssl/private", "/etc/security/opasswd",
    "/etc/ssh",     "/etc/krb5.keytab", "/etc/machine-id",  "/etc/kubernetes",
};
// How long a kill, freeze or thaw may take before the runtime gives up waiting.
constexpr absl::Duration kSettleTimeout = absl::Seconds(10);
// waitid()'s P_PIDFD (Linux 5.4); glibc 2.36's idtype_t does not name it.
constexpr idtype_t kPidfdIdType = static_cast<idtype_t>(3);

// One file descriptor, closed when destroyed.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) Reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// What /proc/<pid>/stat says about a process.
struct ProcStat {
  char state = '?';
  pid_t ppid = 0;
  // Field 22: clock ticks after boot when the process started. With the pid it names one
  // process for the machine's uptime (a recycled pid has another start time).
  uint64_t start_time = 0;
};

std::optional<ProcStat> ReadStat(pid_t pid) {
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields 3.. follow the
  // last ')'.
  const char* rest = std::strrchr(buf, ')');
  if (rest == nullptr) return std::nullopt;
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(rest + 1), ' ', absl::SkipEmpty());
  if (f.size() < 20) return std::nullopt;
  ProcStat st;
  st.state = f[0].empty() ? '?' : f[0][0];
  if (!absl::SimpleAtoi(f[1], &st.ppid) || !absl::SimpleAtoi(f[19], &st.start_time)) {
    return std::nullopt;
  }
  return st;
}

// Whether `pid` is still the process that started at `start_time` and has not exited.
bool Alive(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  const std::optional<ProcStat> st = ReadStat(pid);
  return st && st->start_time == start_time && st->state != 'Z' && st->state != 'X';
}

uint64_t StartTime(pid_t pid) {
  const std::optional<ProcStat> st = ReadStat(pid);
  return st ? st->start_time : 0;
}

bool WriteFile(const std::string& path, const std::string& value) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  return close(fd) == 0 && ok;
}

// The content of `path`, or what was read before an error. Not std::ifstream: libstdc++'s
// filebuf throws when read(2) fails, as it does with ESRCH for /proc/<pid>/ files of a
// process that exits while it is read.
std::string ReadSmallFile(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fd);
  return out;
}

// The pids in a cgroup (v1 cgroup.procs), empty if it is gone.
std::vector<pid_t> CgroupProcs(const std::string& dir) {
  std::vector<pid_t> out;
  for (absl::string_view line :
       absl::StrSplit(ReadSmallFile(dir + "/cgroup.procs"), '\n', absl::SkipEmpty())) {
    pid_t pid = 0;
    if (absl::SimpleAtoi(line, &pid) && pid > 0) out.push_back(pid);
  }
  return out;
}

// `root` and every process below it (by parent pid, from one scan of /proc).
std::vector<pid_t> ProcessTree(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    if (auto st = ReadStat(pid)) parent_of.emplace_back(pid, st->ppid);
  }
  std::vector<pid_t> tree = {root};
  for (size_t i = 0; i < tree.size(); ++i) {
    for (const auto& [pid, ppid] : parent_of) {
      if (ppid == tree[i]) tree.push_back(pid);
    }
  }
  return tree;
}

// cgroup v1 controllers this runtime uses, when the machine has them.
struct Cgroups {
  std::string memory;  // e.g. /sys/fs/cgroup/memory/sbx, empty if unusable
  std::string pids;
  std::string freezer;  // suspension; empty: SIGSTOP/SIGCONT

  static Cgroups Detect(bool use_freezer) {
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

  // The folders a sandbox `id` may have (whether made or not).
  std::vector<std::string> DirsOf(const std::string& id) const {
    std::vector<std::string> dirs;
    for (const std::string* base : {&memory, &pids, &freezer}) {
      if (!base->empty()) dirs.push_back(*base + "/" + id);
    }
    return dirs;
  }
};

// One sandbox, started here or adopted. Everything but the marked fields is fixed once
// the sandbox is in the runtime's table.
struct Sandbox {
  std::string id;
  std::string pool;
  std::string endpoint;
  std::string dir;  // root_dir/<id>, absolute: the host folder, never seen by the sandbox
  // The top process (bwrap, or sbx-sandboxd without isolation), its start time, and a
  // pidfd on it (invalid where the kernel has no pidfd_open).
  pid_t pid = -1;
  uint64_t start_time = 0;
  Fd pidfd;
  // Whether it is a child of this process (reaped by waitid), not adopted.
  bool child = false;
  // Pid 1 of the sandbox's pid namespace (bwrap's init), as the host sees it: killing it
  // kills every process of the namespace. -1 without isolation.
  pid_t init_pid = -1;
  uint64_t init_start_time = 0;
  // The host uid its processes run as (sbx's own when sbx is not root).
  uid_t host_uid = 0;
  // Every cgroup made for it (limits and freezer), and the freezer one (or empty).
  std::vector<std::string> cgroup_dirs;
  std::string freezer;

  // Serializes Suspend, Resume and the kill, which do I/O on the sandbox.
  absl::Mutex op_mu;
  // Killed: later Suspend/Resume answer NOT_FOUND.
  bool ended ABSL_GUARDED_BY(op_mu) = false;
  // Frozen by Suspend. Atomic because List reads it without op_mu (a suspend in progress
  // may be reported either way); relaxed: it orders nothing else.
  std::atomic<bool> suspended{false};

  // The read end of the output FIFO (non-blocking), fixed once the sandbox is in the
  // runtime's table; invalid for a sandbox adopted from a version without one. Closed
  // with the Sandbox, never before: the reaper may be polling it.
  Fd output;
  // Serializes DrainOutput (the reaper, or Spawn before the table) with KillSandbox.
  absl::Mutex log_mu;
  bool log_closed ABSL_GUARDED_BY(log_mu) = false;
  // The FIFO reached its end (every writer is gone): not polled any more. Atomic because
  // the reaper reads it without log_mu to build its poll set; relaxed: a stale value
  // costs one more poll.
  std::atomic<bool> output_ended{false};
  Fd log ABSL_GUARDED_BY(log_mu);  // the current log file, O_APPEND
  int64_t log_size ABSL_GUARDED_BY(log_mu) = 0;
};
using SandboxPtr = std::shared_ptr<Sandbox>;

// The state file: what a later runtime needs to adopt the sandbox or clean it up. Paths
// (socket, cgroups) are not in it: they follow from the id.
std::string EncodeState(const Sandbox& sb) {
  nlohmann::json j;
  j["version"] = kStateVersion;
  j["id"] = sb.id;
  j["pool"] = sb.pool;
  j["pid"] = sb.pid;
  j["start_time"] = sb.start_time;
  j["init_pid"] = sb.init_pid;
  j["init_start_time"] = sb.init_start_time;
  j["suspended"] = sb.suspended.load(std::memory_order_relaxed);
  return j.dump();
}

// Fills `sb` from a state file; false if it is missing, unreadable or of another version.
bool DecodeState(const std::string& text, Sandbox* sb) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("version", 0) != kStateVersion) return false;
    sb->id = j.at("id").get<std::string>();
    sb->pool = j.at("pool").get<std::string>();
    sb->pid = j.at("pid").get<pid_t>();
    sb->start_time = j.at("start_time").get<uint64_t>();
    sb->init_pid = j.value("init_pid", -1);
    sb->init_start_time = j.value("init_start_time", uint64_t{0});
    sb->suspended.store(j.value("suspended", false), std::memory_order_relaxed);
    return sb->pid > 0;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// Opens `name` in the folder `dir` without following a symbolic link at either step;
// -1 with errno otherwise.
int OpenInDir(const std::string& dir, const char* name, int flags, mode_t mode = 0) {
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return -1;
  const int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
  const int err = errno;
  close(dfd);
  errno = err;
  return fd;
}

// Reads a file of ours in `dir`: a regular file owned by this process's user, reached
// without symbolic links. Empty when it is anything else.
std::string ReadOwnFile(const std::string& dir, const char* name) {
  Fd fd(OpenInDir(dir, name, O_RDONLY));
  struct stat st;
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      st.st_size > (1 << 20)) {
    return "";
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  const ssize_t n = read(fd.get(), text.data(), text.size());
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

// Writes the state file atomically (a reader sees the old file or the new one), in the
// sandbox's host folder, following no symbolic link.
bool WriteState(const Sandbox& sb) {
  const Fd dfd(open(sb.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dfd.valid()) return false;
  const std::string tmp = absl::StrCat(kStateName, ".tmp");
  const std::string text = EncodeState(sb);
  const int fd =
      openat(dfd.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (close(fd) != 0 || !ok) return false;
  return renameat(dfd.get(), tmp.c_str(), dfd.get(), kStateName) == 0;
}

// Moves what the sandbox's output FIFO holds into its log: sandboxd.log, which at
// kLogCapBytes becomes sandboxd.log.1 (replacing the previous one) and starts again. So
// the host keeps at most 2 * kLogCapBytes of a sandbox's output however much it writes;
// what is dropped is counted in `dropped`. Reads at most 1 MiB per call (the reaper
// serves every sandbox in turn); a closed FIFO (every writer gone) sets output_ended.
void DrainOutput(Sandbox& sb, std::atomic<uint64_t>* dropped) {
  if (!sb.output.valid()) return;
  absl::MutexLock lock(&sb.log_mu);
  if (sb.log_closed) return;
  char buf[65536];
  for (int round = 0; round < 16; ++round) {
    const ssize_t n = read(sb.output.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) sb.output_ended.store(true, std::memory_order_relaxed);
    if (n <= 0) return;
    absl::string_view chunk(buf, static_cast<size_t>(n));
    if (sb.log_size + n > kLogCapBytes) {
      // Rotate: the older part goes, the current one becomes it.
      struct stat old_st;
      const Fd dfd(open(sb.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (dfd.valid() && fstatat(dfd.get(), kOldLogName, &old_st, AT_SYMLINK_NOFOLLOW) == 0) {
        dropped->fetch_add(static_cast<uint64_t>(old_st.st_size), std::memory_order_relaxed);
      }
      sb.log.Reset();
      if (!dfd.valid() || renameat(dfd.get(), kLogName, dfd.get(), kOldLogName) != 0) {
        // Cannot keep the older part: start the log again in place.
        dropped->fetch_add(static_cast<uint64_t>(sb.log_size), std::memory_order_relaxed);
        if (dfd.valid()) unlinkat(dfd.get(), kLogName, 0);
      }
      sb.log.Reset(OpenInDir(sb.dir, kLogName, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600));
      sb.log_size = 0;
    }
    if (static_cast<int64_t>(chunk.size()) > kLogCapBytes) {
      dropped->fetch_add(chunk.size() - kLogCapBytes, std::memory_order_relaxed);
      chunk.remove_prefix(chunk.size() - kLogCapBytes);
    }
    const ssize_t w = sb.log.valid() ? write(sb.log.get(), chunk.data(), chunk.size()) : -1;
    if (w > 0) sb.log_size += w;
    if (w < static_cast<ssize_t>(chunk.size())) {
      dropped->fetch_add(chunk.size() - static_cast<size_t>(std::max<ssize_t>(w, 0)),
                         std::memory_order_relaxed);
    }
  }
}

// Opens the log of a sandbox found running (adopted): its output FIFO and the current log
// file, both reached without symbolic links and made by this user. Logs when the sandbox
// has no FIFO (started by a version that wrote its output to the log file directly).
void OpenOutput(Sandbox& sb) {
  Fd fifo(OpenInDir(sb.dir, kOutputName, O_RDONLY | O_NONBLOCK));
  struct stat st;
  if (!fifo.valid() || fstat(fifo.get(), &st) != 0 || !S_ISFIFO(st.st_mode) ||
      st.st_uid != geteuid()) {
    spdlog::warn(
        "sandbox {}: no output FIFO (made by an older sbx): its output goes to {}/{} unbounded "
        "until it ends",
        sb.id, sb.dir, kLogName);
    return;
  }
  absl::MutexLock lock(&sb.log_mu);
  sb.log.Reset(OpenInDir(sb.dir, kLogName, O_WRONLY | O_CREAT | O_APPEND, 0600));
  if (sb.log.valid() && fstat(sb.log.get(), &st) == 0 && S_ISREG(st.st_mode)) {
    sb.log_size = st.st_size;
  }
  sb.output = std::move(fifo);
}

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

std::string Tail(const std::string& path) {
  std::string all = ReadSmallFile(path);
  if (all.size() > 400) all = "..." + all.substr(all.size() - 400);
  while (!all.empty() && all.back() == '\n') all.pop_back();
  return all.empty() ? "(no output)" : all;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return "unknown status";
}

// Reaps the top process if it is a child of this process (started here, or adopted by
// this process's second runtime); returns its wait status, or -1.
int ReapIfChild(Sandbox& sb, bool block) {
  siginfo_t info{};
  const int flags = WEXITED | (block ? 0 : WNOHANG);
  int rc;
  if (sb.pidfd.valid()) {
    do {
      rc = waitid(kPidfdIdType, static_cast<id_t>(sb.pidfd.get()), &info, flags);
    } while (rc < 0 && errno == EINTR);
  } else if (sb.child) {
    do {
      rc = waitid(P_PID, static_cast<id_t>(sb.pid), &info, flags);
    } while (rc < 0 && errno == EINTR);
  } else {
    return -1;
  }
  if (rc != 0 || info.si_pid == 0) return -1;
  if (info.si_code == CLD_EXITED) return W_EXITCODE(info.si_status, 0);
  return info.si_status;  // killed: the signal number is the raw wait status
}

// Waits until the top process has exited (and reaps it if it is our child).
void WaitTop(Sandbox& sb, absl::Duration timeout) {
  if (sb.pid <= 0) return;
  if (sb.pidfd.valid()) {
    pollfd p = {sb.pidfd.get(), POLLIN, 0};
    int rc;
    do {
      rc = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    } while (rc < 0 && errno == EINTR);
    ReapIfChild(sb, /*block=*/false);
    return;
  }
  if (sb.child) {
    ReapIfChild(sb, /*block=*/true);
    return;
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (Alive(sb.pid, sb.start_time) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
}

// Sends `sig` to the top process (through its pidfd where possible: no recycled pid can
// be hit) and its process group.
void SignalTop(Sandbox& sb, int sig) {
  if (sb.pid <= 0) return;
  bool alive = false;
  if (sb.pidfd.valid()) {
    alive = syscall(SYS_pidfd_send_signal, sb.pidfd.get(), sig, nullptr, 0) == 0;
  } else if (Alive(sb.pid, sb.start_time) || sb.child) {
    alive = kill(sb.pid, sig) == 0;
  }
  // The top process leads its own session and group; while it is unreaped the group id
  // cannot be reused.
  if (alive) kill(-sb.pid, sig);
}

// Kills every process of the sandbox, reaps its top process and removes its cgroups and
// folder. Safe on a half-started sandbox and on one frozen by Suspend.
void KillSandbox(Sandbox& sb) {
  // Pid 1 of the sandbox's pid namespace first: the kernel kills the whole namespace
  // with it. Then the top process, and whatever the cgroups hold (the plain-process
  // fallback has no namespace; a process could have left bwrap's group).
  Fd init;
  if (Alive(sb.init_pid, sb.init_start_time)) {
    init.Reset(PidfdOpen(sb.init_pid));
    if (!Alive(sb.init_pid, sb.init_start_time)) init.Reset();
    if (init.valid()) syscall(SYS_pidfd_send_signal, init.get(), SIGKILL, nullptr, 0);
  }
  SignalTop(sb, SIGKILL);
  for (const std::string& cg : sb.cgroup_dirs) {
    for (pid_t p : CgroupProcs(cg)) kill(p, SIGKILL);
  }
  if (sb.init_pid <= 0 && sb.cgroup_dirs.empty() && sb.pid > 0) {
    // No namespace, no cgroup: the daemon's commands run in sessions of their own.
    for (pid_t p : ProcessTree(sb.pid)) kill(p, SIGKILL);
  }
  // A frozen task (cgroup v1) acts on SIGKILL only once thawed.
  if (!sb.freezer.empty()) WriteFile(sb.freezer + "/freezer.state", "THAWED");
  WaitTop(sb, kSettleTimeout);
  if (init.valid()) {
    // The namespace's pid 1 exits once every other process of it is gone.
    pollfd p = {init.get(), POLLIN, 0};
    while (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kSettleTimeout))) < 0 &&
           errno == EINTR) {
    }
  }
  for (const std::string& cg : sb.cgroup_dirs) {
    // The cgroup empties as the killed processes exit.
    const absl::Time deadline = absl::Now() + kSettleTimeout;
    while (rmdir(cg.c_str()) != 0 && errno == EBUSY && absl::Now() < deadline) {
      for (pid_t p : CgroupProcs(cg)) kill(p, SIGKILL);
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (errno == EBUSY && fs::exists(cg))
      spdlog::warn("sandbox {}: cgroup {} stays busy", sb.id, cg);
  }
  {
    // No log write may recreate a file in the folder being removed.
    absl::MutexLock lock(&sb.log_mu);
    sb.log_closed = true;
    sb.log.Reset();
  }
  std::error_code ec;
  if (!sb.dir.empty()) fs::remove_all(sb.dir, ec);
}

// What the child of SpawnDetached does between clone and exec, prepared by the parent
// (the child may not allocate).
struct SpawnPlan {
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const std::vector<std::string>* cgroup_procs = nullptr;  // cgroup.procs files to join
  const char* cwd = "/";                                   // the sandbox's host folder
  // Descriptors the new process gets: fds[i].second becomes descriptor fds[i].first
  // (stdout and stderr included); every other descriptor is closed at exec.
  std::pair<int, int> fds[10];
  int nfds = 0;
  // When set (sbx is root): the host uid and gid to run as, with no supplementary groups.
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
  int error = 0;  // set by the child when it cannot exec
  const char* failed_step = "";

  void Give(int target, int fd) { fds[nfds++] = {target, fd}; }
};

// The child's side: only raw system calls (it shares the parent's memory until exec; in
// particular glibc's setresuid would signal the parent's threads, so the raw system calls
// are used).
int SpawnChild(void* arg) {
  SpawnPlan& plan = *static_cast<SpawnPlan*>(arg);
  auto fail = [&plan](const char* step) {
    plan.error = errno;
    plan.failed_step = step;
    _exit(127);
  };
  // Its own session: a signal to sbx's terminal or process group does not reach the
  // sandbox; nor does sbx's death.
  setsid();
  for (const std::string& p : *plan.cgroup_procs) {
    const int fd = open(p.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      (void)!write(fd, "0", 1);
      close(fd);
    }
  }
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Out of the way first (a source may be another one's target), then into place.
  int moved[10];
  for (int i = 0; i < plan.nfds; ++i) {
    moved[i] = fcntl(plan.fds[i].second, F_DUPFD_CLOEXEC, 64);
    if (moved[i] < 0) fail("dup");
  }
  for (int i = 0; i < plan.nfds; ++i) {
    if (dup2(moved[i], plan.fds[i].first) < 0) fail("dup2");
  }
  // Nothing else of sbx (its sockets, its store's files) may live on in the sandbox,
  // which outlives sbx.
  syscall(SYS_close_range, 3 + 0U, ~0U, CLOSE_RANGE_CLOEXEC);
  for (int i = 0; i < plan.nfds; ++i) {
    if (plan.fds[i].first >= 3) fcntl(plan.fds[i].first, F_SETFD, 0);
  }
  if (chdir(plan.cwd) != 0) fail("chdir");
  if (syscall(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("no_new_privs");
  if (plan.switch_user) {
    if (syscall(SYS_setgroups, 0, nullptr) != 0) fail("setgroups");
    if (syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid) != 0) fail("setresgid");
    if (syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) != 0) fail("setresuid");
  }
  execve(plan.argv[0], plan.argv, plan.envp);
  fail("exec");
  return 127;
}

// Starts plan.argv as a new process, detached from sbx (see SpawnChild). It uses
// clone(CLONE_VM | CLONE_VFORK), as posix_spawn does, rather than fork: the parent's page
// tables are not copied and its threads take no copy-on-write faults while the child
// starts (both cost milliseconds for a big, multi-threaded sbx). Returns the pid (check
// plan.error: the child could not exec) or -1 with errno.
pid_t SpawnDetached(SpawnPlan& plan) {
  constexpr size_t kStackBytes = 64 << 10;
  auto stack = std::make_unique<char[]>(kStackBytes);
  // No handler of sbx may run in the child on the shared memory: block everything until
  // the child has reset its dispositions.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid =
      clone(SpawnChild, stack.get() + kStackBytes, CLONE_VM | CLONE_VFORK | SIGCHLD, &plan);
  const int err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return pid;
}

// The processes of a sandbox: the members of its cgroups where it has one, else its top
// process and everything below it.
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

// Freezer cgroup: asks for `state` (FROZEN or THAWED) and waits until the cgroup is in
// it (freezing passes through FREEZING while tasks reach the refrigerator).
absl::Status SetFreezer(const Sandbox& sb, const std::string& state) {
  const std::string file = sb.freezer + "/freezer.state";
  const absl::Time deadline = absl::Now() + kSettleTimeout;
  for (int i = 0;; ++i) {
    // Rewriting FROZEN retries tasks that could not be frozen yet.
    if (i % 16 == 0 && !WriteFile(file, state)) {
      return absl::UnavailableError(absl::StrCat("sandbox ", sb.id, ": cannot write ", state,
                                                 " to ", file, ": ", std::strerror(errno)));
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

// The fallback without a freezer: SIGSTOP every process of the sandbox (again for those
// forked meanwhile) and wait until each one has stopped.
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

// The seccomp filter of every sandbox, as the BPF program bwrap loads (--seccomp) just
// before it starts the daemon: everything the daemon and the workload run is under it.
// It refuses (EPERM) what a sandboxed workload never needs and what has given kernels
// their escapes: mounts, ptrace and reading other processes' memory, keyrings, bpf,
// perf, kexec, modules, userfaultfd, file handles, io_uring, clocks, swap, reboot, new
// user namespaces (also refused by bwrap's --disable-userns), and TIOCSTI. clone3 answers
// ENOSYS (its flags cannot be inspected), so libc falls back to clone, whose flags can.
// Other architectures' system calls (e.g. int 0x80) kill the process.
absl::StatusOr<std::string> SeccompProgram() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return absl::FailedPreconditionError("libseccomp: seccomp_init failed");
  auto release = absl::MakeCleanup([ctx] { seccomp_release(ctx); });
  static constexpr const char* kDenied[] = {"mount",
                                            "umount",
                                            "umount2",
                                            "pivot_root",
                                            "chroot",
                                            "move_mount",
                                            "open_tree",
                                            "fsopen",
                                            "fsconfig",
                                            "fsmount",
                                            "fspick",
                                            "mount_setattr",
                                            "ptrace",
                                            "process_vm_readv",
                                            "process_vm_writev",
                                            "pidfd_getfd",
                                            "kcmp",
                                            "keyctl",
                                            "add_key",
                                            "request_key",
                                            "bpf",
                                            "perf_event_open",
                                            "userfaultfd",
                                            "open_by_handle_at",
                                            "name_to_handle_at",
                                            "kexec_load",
                                            "kexec_file_load",
                                            "init_module",
                                            "finit_module",
                                            "delete_module",
                                            "create_module",
                                            "query_module",
                                            "get_kernel_syms",
                                            "reboot",
                                            "swapon",
                                            "swapoff",
                                            "acct",
                                            "syslog",
                                            "iopl",
                                            "ioperm",
                                            "quotactl",
                                            "quotactl_fd",
                                            "lookup_dcookie",
                                            "setns",
                                            "vhangup",
                                            "nfsservctl",
                                            "uselib",
                                            "settimeofday",
                                            "clock_settime",
                                            "clock_adjtime",
                                            "adjtimex",
                                            "fanotify_init",
                                            "io_uring_setup",
                                            "io_uring_enter",
                                            "io_uring_register"};
  for (const char* name : kDenied) {
    const int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not a system call of this architecture
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0); rc != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("libseccomp: cannot add a rule for ", name, ": ", std::strerror(-rc)));
    }
  }
  const uint64_t newuser = CLONE_NEWUSER;
  int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                            SCMP_A0(SCMP_CMP_MASKED_EQ, newuser, newuser));
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, newuser, newuser));
  }
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffU, TIOCSTI));
  }
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("libseccomp: cannot add an argument rule: ", std::strerror(-rc)));
  }
  Fd mem(static_cast<int>(syscall(SYS_memfd_create, "sbx-seccomp", MFD_CLOEXEC)));
  if (!mem.valid()) {
    return absl::FailedPreconditionError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  if (rc = seccomp_export_bpf(ctx, mem.get()); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("libseccomp: cannot export the filter: ", std::strerror(-rc)));
  }
  std::string program;
  char buf[4096];
  ssize_t n;
  lseek(mem.get(), 0, SEEK_SET);
  while ((n = read(mem.get(), buf, sizeof(buf))) > 0) program.append(buf, static_cast<size_t>(n));
  if (program.empty()) return absl::FailedPreconditionError("libseccomp: an empty filter");
  return program;
}

// A pipe whose read end holds `content` (the write end is closed): what bwrap and the
// daemon read to its end. The content must fit the pipe's buffer.
absl::StatusOr<Fd> PipeWith(const std::string& content) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  Fd r(fds[0]), w(fds[1]);
  if (content.size() > 65536) return absl::InternalError("pipe content above 64 KiB");
  if (write(w.get(), content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
    return absl::UnavailableError(absl::StrCat("pipe write: ", std::strerror(errno)));
  }
  return r;
}

// The real uid of process `pid` (from the kernel's /proc), or -1.
int64_t ProcessUid(pid_t pid) {
  const std::string status = ReadSmallFile(absl::StrCat("/proc/", pid, "/status"));
  const size_t at = status.find("\nUid:");
  if (at == std::string::npos) return -1;
  std::vector<absl::string_view> f = absl::StrSplit(absl::string_view(status).substr(at + 5, 64),
                                                    absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  int64_t uid = -1;
  if (f.empty() || !absl::SimpleAtoi(f[0], &uid)) return -1;
  return uid;
}

// The working directory of process `pid`, or empty.
std::string ProcessCwd(pid_t pid) {
  std::error_code ec;
  const fs::path cwd = fs::read_symlink(absl::StrCat("/proc/", pid, "/cwd"), ec);
  return ec ? std::string() : cwd.string();
}

// Masks the host path `host`, seen in the sandbox at `inside`: an empty read-only tmpfs
// over a folder, /dev/null over anything else.
void AppendMask(const std::string& host, const std::string& inside, std::vector<std::string>* a) {
  struct stat st;
  if (lstat(host.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    a->insert(a->end(), {"--tmpfs", inside, "--remount-ro", inside});
  } else {
    a->insert(a->end(), {"--ro-bind", "/dev/null", inside});
  }
}

// The folders of the host every sandbox sees (read-only), where they are folders.
std::vector<std::string> SystemFolders() {
  std::vector<std::string> out;
  for (const char* top : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}) {
    struct stat st;
    if (lstat(top, &st) == 0 && S_ISDIR(st.st_mode)) out.emplace_back(top);
  }
  return out;
}

// Whether a sandbox's process may search (pass through) the host folder `dir`: with a
// host uid of its own and no groups (own_uids), only the bits for others count; else it
// has sbx's own uid and groups.
bool SandboxMaySearch(const std::string& dir, bool own_uids) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return false;
  return own_uids ? (st.st_mode & S_IXOTH) != 0 : access(dir.c_str(), X_OK) == 0;
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// Where the masks of the hidden paths go in the system folders. A mask on a file would
// not survive the file's replacement by rename (the mount goes with the old file: a
// tokens reload, a renewed key, an editor's save), so a hidden file is masked by masking
// its folder; a hidden folder is masked itself. The mask moves up to the first folder on
// the way that the sandbox may not search (bubblewrap mounts as the sandbox's user and
// could not reach further). A mask inside another one is dropped (the outer one hides it,
// and bubblewrap cannot make a mount point in the read-only outer mask). FAILED_PRECONDITION
// naming the path when a hidden file lies right in a system folder (masking that folder
// would hide the system) or a hidden folder holds one.
absl::StatusOr<std::vector<std::string>> SystemMasks(const std::vector<std::string>& hidden,
                                                     bool own_uids) {
  const std::vector<std::string> tops = SystemFolders();
  std::vector<std::string> masks;
  for (const char* secret : kEtcSecrets) {
    struct stat st;
    if (lstat(secret, &st) == 0) masks.emplace_back(secret);
  }
  for (const std::string& h : hidden) {
    for (const std::string& top : tops) {
      if (PathIsWithin(top, h)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "\"", h, "\" (one of the server's own files, which no sandbox may see) holds ", top,
            ", which every sandbox needs: keep the server's data dir, key, tokens file, TLS key "
            "and sandbox root out of the system folders' ancestors"));
      }
      if (!PathIsWithin(h, top)) continue;
      struct stat st;
      std::string point = lstat(h.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? h : Parent(h);
      if (point == top) {
        return absl::FailedPreconditionError(absl::StrCat(
            "\"", h,
            "\" (one of the server's own files, which no sandbox may see) lies directly in ", top,
            ", which every sandbox sees: a mask of the file alone would not survive its "
            "replacement by rename (a tokens reload, a renewed key), and masking ",
            top, " would hide it from the sandboxes. Move it into a folder of its own (e.g. ", top,
            "/sbx/", h.substr(h.rfind('/') + 1), ")"));
      }
      // The shallowest folder below `top` on the way to `point` that the sandbox may not
      // pass through.
      for (size_t at = top.size() + 1; at < point.size(); ++at) {
        if (point[at] != '/') continue;
        const std::string dir = point.substr(0, at);
        if (!SandboxMaySearch(dir, own_uids)) {
          point = dir;
          break;
        }
      }
      masks.push_back(point);
    }
  }
  std::sort(masks.begin(), masks.end());
  masks.erase(std::unique(masks.begin(), masks.end()), masks.end());
  std::vector<std::string> out;
  for (const std::string& m : masks) {
    // Sorted: an enclosing mask comes before what lies in it.
    if (!out.empty() && std::any_of(out.begin(), out.end(),
                                    [&m](const std::string& o) { return PathIsWithin(m, o); })) {
      continue;
    }
    out.push_back(m);
  }
  return out;
}

// The system part of every sandbox's root: /usr, /etc and the top-level /bin, /sbin,
// /lib* (as the host has them: folders bound read-only, symbolic links recreated), the
// masks (SystemMasks) in them, and fresh /dev, /proc, /tmp, /var/tmp and /run.
std::vector<std::string> SystemArgs(const std::vector<std::string>& masks) {
  std::vector<std::string> a;
  for (const char* top : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}) {
    struct stat st;
    if (lstat(top, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(top, ec);
      if (!ec) a.insert(a.end(), {"--symlink", target.string(), top});
    } else if (S_ISDIR(st.st_mode)) {
      a.insert(a.end(), {"--ro-bind", top, top});
    }
  }
  for (const std::string& m : masks) AppendMask(m, m, &a);
  for (const char* x : {"--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--dir", "/var",
                        "--tmpfs", "/var/tmp", "--tmpfs", "/run"}) {
    a.emplace_back(x);
  }
  return a;
}

// OK, or INVALID_ARGUMENT naming the server's file when a template mount's source holds
// one of the hidden paths or lies in one: no sandbox may see them, and a mask under a
// mount would be one more mount to get right (and would not survive a rename). The
// source's symbolic links are resolved as bubblewrap will.
absl::Status CheckMounts(const LocalSpec& spec, const std::vector<std::string>& hidden) {
  for (const auto& m : spec.mounts) {
    std::error_code ec;
    const std::string resolved = fs::weakly_canonical(m.source, ec).string();
    for (const std::string& source : {m.source, resolved}) {
      if (source.empty()) continue;
      for (const std::string& h : hidden) {
        if (PathIsWithin(source, h)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mount source \"", m.source, "\" lies in \"", h,
              "\", one of the server's own files (data dir, key, tokens file, TLS key, sandbox "
              "root), which no sandbox may see"));
        }
        if (PathIsWithin(h, source)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mount source \"", m.source, "\" holds \"", h,
              "\", one of the server's own files (data dir, key, tokens file, TLS key, sandbox "
              "root), which no sandbox may see: mount a folder that does not hold it"));
        }
      }
    }
  }
  return absl::OkStatus();
}

// The bubblewrap options of every sandbox: a user namespace in which the workload is uid
// 1000 with no capability (and which cannot nest another), new pid/ipc/uts/cgroup
// namespaces, its own session, and the seccomp filter (on kSeccompFd).
std::vector<std::string> IsolationArgs(const std::string& bwrap) {
  return {bwrap,
          "--unshare-user",
          "--uid",
          std::to_string(kUidInside),
          "--gid",
          std::to_string(kUidInside),
          "--disable-userns",
          "--unshare-pid",
          "--unshare-ipc",
          "--unshare-uts",
          "--unshare-cgroup-try",
          "--new-session",
          "--cap-drop",
          "ALL",
          "--seccomp",
          std::to_string(kSeccompFd)};
}

// What Make() found out about isolation on this machine, for every sandbox to use.
struct Isolation {
  // bubblewrap with a user namespace works; false: the plain-process fallback.
  bool isolated = false;
  // The seccomp filter's BPF program (isolated only).
  std::string seccomp;
  // The daemon's binary, opened as root may (O_PATH): bwrap binds it by descriptor, so
  // the sandbox's unprivileged uid needs no access to the folders it lives in.
  Fd sandboxd;
  // Hidden host paths, absolute and normalized, each as given and with its symbolic
  // links resolved.
  std::vector<std::string> hidden;
  // Where they are masked in the system folders (SystemMasks), with /etc's secrets.
  std::vector<std::string> masks;
  // Whether each sandbox gets a host uid of its own (sbx is root).
  bool own_uids = false;
};

class BubblewrapRuntimeImpl final : public BubblewrapRuntime {
 public:
  BubblewrapRuntimeImpl(BubblewrapRuntimeOptions options, std::string root, Fd lock,
                        Isolation isolation, Cgroups cgroups, std::vector<SandboxPtr> adopted)
      : options_(std::move(options)),
        root_(std::move(root)),
        lock_(std::move(lock)),
        iso_(std::move(isolation)),
        isolated_(iso_.isolated),
        cgroups_(std::move(cgroups)),
        system_args_(SystemArgs(iso_.masks)),
        adopted_(adopted.size()),
        wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    {
      absl::MutexLock lock(&mu_);
      for (SandboxPtr& sb : adopted) {
        uids_.insert(sb->host_uid);
        running_.emplace(sb->id, std::move(sb));
      }
    }
    for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { Work(); });
    reaper_ = std::thread([this] { Reap(); });
  }

  ~BubblewrapRuntimeImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    WakeReaper();
    for (auto& t : workers_) t.join();
    reaper_.join();
    // Tasks never started get CANCELLED.
    std::deque<Task> left;
    {
      absl::MutexLock lock(&mu_);
      left.swap(tasks_);
    }
    for (Task& t : left) std::move(t)(/*cancelled=*/true);
    absl::flat_hash_map<std::string, SandboxPtr> all;
    {
      absl::MutexLock lock(&mu_);
      all.swap(running_);
    }
    if (!options_.delete_on_exit) {
      // Detach: the sandboxes keep running for the next runtime on this root.
      if (!all.empty()) {
        spdlog::info("local runtime: leaving {} sandboxes running under {}", all.size(), root_);
      }
      return;
    }
    for (auto& [id, sb] : all) {
      absl::MutexLock lock(&sb->op_mu);
      sb->ended = true;
      KillSandbox(*sb);
    }
  }

  bool isolated() const override { return isolated_; }
  size_t running() const override {
    absl::MutexLock lock(&mu_);
    return running_.size();
  }
  size_t adopted() const override { return adopted_; }
  absl::Status CheckSpec(const LocalSpec& spec) const override {
    return CheckMounts(spec, iso_.hidden);
  }
  uint64_t output_dropped_bytes() const override {
    return output_dropped_.load(std::memory_order_relaxed);
  }

  void Create(CreateRequest request, CreateCallback done) override {
    Enqueue([this, request = std::move(request), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(Start(request));
    });
  }

  void Delete(std::string id, DeleteCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      SandboxPtr sb;
      {
        absl::MutexLock lock(&mu_);
        auto it = running_.find(id);
        if (it == running_.end()) return std::move(done)(NotHere(id));
        sb = std::move(it->second);
        running_.erase(it);
      }
      WakeReaper();
      {
        absl::MutexLock lock(&sb->op_mu);
        sb->ended = true;
        KillSandbox(*sb);
      }
      GiveBackUid(sb->host_uid);
      std::move(done)(absl::OkStatus());
    });
  }

  void Suspend(std::string id, DoneCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(SetSuspended(id, true));
    });
  }

  void Resume(std::string id, ResumeCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      if (absl::Status s = SetSuspended(id, false); !s.ok()) return std::move(done)(s);
      std::move(done)(Running(id));  // thawed in place: where it was
    });
  }

  absl::StatusOr<std::vector<SandboxInfo>> List() override {
    std::vector<SandboxInfo> out;
    absl::MutexLock lock(&mu_);
    out.reserve(running_.size());
    for (const auto& [id, sb] : running_) {
      SandboxInfo info;
      info.id = id;
      info.pool = sb->pool;
      info.endpoint = sb->endpoint;
      info.suspended = sb->suspended.load(std::memory_order_relaxed);
      out.push_back(std::move(info));
    }
    return out;
  }

 private:
  using Task = absl::AnyInvocable<void(bool cancelled) &&>;

  static absl::Status NotHere(const std::string& id) {
    return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" is not running here"));
  }

  void Enqueue(Task t) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(t));
  }

  void Work() {
    while (true) {
      Task t;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !tasks_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::move(t)(false);
    }
  }

  void WakeReaper() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
  }

  // Where running sandbox `id` is reached, or NOT_FOUND.
  absl::StatusOr<SandboxInfo> Running(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(id);
    if (it == running_.end()) return NotHere(id);
    SandboxInfo info;
    info.id = id;
    info.pool = it->second->pool;
    info.endpoint = it->second->endpoint;
    return info;
  }

  absl::Status SetSuspended(const std::string& id, bool suspend) {
    SandboxPtr sb;
    {
      absl::MutexLock lock(&mu_);
      auto it = running_.find(id);
      if (it == running_.end()) return NotHere(id);
      sb = it->second;
    }
    absl::MutexLock lock(&sb->op_mu);
    if (sb->ended) return NotHere(id);
    if (sb->suspended.load(std::memory_order_relaxed) == suspend) return absl::OkStatus();
    absl::Status s;
    if (!sb->freezer.empty()) {
      s = SetFreezer(*sb, suspend ? "FROZEN" : "THAWED");
      if (!s.ok() && suspend) SetFreezer(*sb, "THAWED").IgnoreError();  // all or nothing
    } else if (suspend) {
      s = StopAll(*sb);
      if (!s.ok()) ContinueAll(*sb);
    } else {
      ContinueAll(*sb);
    }
    if (!s.ok()) return s;
    sb->suspended.store(suspend, std::memory_order_relaxed);
    // A later runtime reads it back when it adopts the sandbox.
    if (!WriteState(*sb)) spdlog::warn("sandbox {}: cannot rewrite its state file", id);
    spdlog::debug("sandbox {} {}", id, suspend ? "suspended" : "resumed");
    return absl::OkStatus();
  }

  // The daemon's arguments (after its path).
  static std::vector<std::string> DaemonArgs(const std::string& id, const std::string& workspace) {
    return {"--listen_fd", std::to_string(kListenFd),
            "--secret_fd", std::to_string(kSecretFd),
            "--ready_fd",  std::to_string(kReadyFd),
            "--id",        id,
            "--workspace", workspace};
  }

  // The template's mounts, or INVALID_ARGUMENT when one would show the server's files
  // (CheckMounts).
  absl::StatusOr<std::vector<std::string>> MountArgs(const LocalSpec& spec) const {
    RETURN_IF_ERROR(CheckMounts(spec, iso_.hidden));
    std::vector<std::string> a;
    for (const auto& m : spec.mounts) {
      a.insert(a.end(), {m.read_only ? "--ro-bind" : "--bind", m.source, m.target});
    }
    return a;
  }

  // The sandbox's command line: bwrap with the daemon inside, or (plain fallback) the
  // daemon alone.
  absl::StatusOr<std::vector<std::string>> Argv(const std::string& id, const std::string& dir,
                                                const LocalSpec& spec) const {
    if (!isolated_) {
      std::vector<std::string> a = {options_.sandboxd_path};
      for (std::string& x : DaemonArgs(id, dir + "/workspace")) a.push_back(std::move(x));
      return a;
    }
    // The isolation options, a root of bubblewrap's own tmpfs holding only the system
    // folders (read-only), fresh /dev, /proc, /tmp and /run, the workspace, the daemon and
    // the template's mounts. No --die-with-parent: the sandbox must outlive sbx (and that
    // option ties bwrap to the thread that forked it).
    std::vector<std::string> a = IsolationArgs(options_.bwrap_path);
    a.insert(a.end(), {"--info-fd", std::to_string(kInfoFd), "--hostname", id});
    if (!spec.network) a.push_back("--unshare-net");
    a.insert(a.end(), system_args_.begin(), system_args_.end());
    const int64_t ws =
        spec.workspace_size_bytes > 0 ? spec.workspace_size_bytes : kDefaultWorkspaceBytes;
    a.insert(a.end(), {"--size", std::to_string(ws), "--tmpfs", kWorkspaceInside});
    a.insert(a.end(), {"--ro-bind-fd", std::to_string(kSandboxdFd), kSandboxdInside});
    ASSIGN_OR_RETURN(std::vector<std::string> mounts, MountArgs(spec));
    a.insert(a.end(), mounts.begin(), mounts.end());
    a.insert(a.end(), {"--setenv", "HOME", kWorkspaceInside});
    for (const auto& [k, v] : spec.env) a.insert(a.end(), {"--setenv", k, v});
    a.insert(a.end(), {"--chdir", kWorkspaceInside, kSandboxdInside});
    for (std::string& x : DaemonArgs(id, kWorkspaceInside)) a.push_back(std::move(x));
    return a;
  }

  // A host uid no running sandbox has (sbx is root), or NotFound when all are taken.
  absl::StatusOr<uid_t> TakeUid() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint32_t count = options_.sandbox_uid_count;
    absl::BitGen gen;
    const uint32_t start = absl::Uniform<uint32_t>(gen, 0, count);
    for (uint32_t i = 0; i < count; ++i) {
      const uid_t uid = options_.sandbox_uid_base + (start + i) % count;
      if (uids_.insert(uid).second) return uid;
    }
    return absl::ResourceExhaustedError(absl::StrCat("all ", count, " sandbox uids from ",
                                                     options_.sandbox_uid_base, " are in use"));
  }

  void GiveBackUid(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!iso_.own_uids) return;
    absl::MutexLock lock(&mu_);
    uids_.erase(uid);
  }

  // Makes the sandbox's cgroups: the freezer one (for Suspend) and those that carry its
  // limits. Returns the folders made. What cannot be applied is logged, not fatal (the
  // machine may not delegate cgroups).
  std::vector<std::string> MakeCgroups(const std::string& id, const LocalSpec& spec,
                                       std::string* freezer) const {
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
                     file, std::strerror(errno));
        rmdir(dir.c_str());
        return false;
      }
      dirs.push_back(dir);
      return true;
    };
    if (spec.memory_limit_bytes > 0) {
      make(cgroups_.memory, "memory.limit_in_bytes", spec.memory_limit_bytes, "memory");
    }
    if (spec.pids_limit > 0) make(cgroups_.pids, "pids.max", spec.pids_limit, "pids");
    if (!cgroups_.freezer.empty() && make(cgroups_.freezer, "", 0, "freezer")) {
      *freezer = dirs.back();
    }
    return dirs;
  }

  absl::StatusOr<SandboxInfo> Start(const CreateRequest& request) {
    LocalSpec spec;
    if (!request.template_spec.empty()) {
      absl::StatusOr<LocalSpec> parsed = ParseLocalSpec(request.template_spec);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("template \"", request.template_name, "\": ", parsed.status().message()));
      }
      spec = std::move(*parsed);
    }
    auto sb = std::make_shared<Sandbox>();
    sb->id = absl::StrCat(kIdPrefix, IdGenerator::Random().Next().substr(0, 16));
    sb->pool = request.pool;
    sb->dir = absl::StrCat(root_, "/", sb->id);
    sb->child = true;
    const std::string& id = sb->id;
    absl::StatusOr<std::vector<std::string>> argv = Argv(id, sb->dir, spec);
    if (!argv.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("template \"", request.template_name, "\": ", argv.status().message()));
    }
    sb->host_uid = geteuid();
    if (iso_.own_uids) {
      ASSIGN_OR_RETURN(sb->host_uid, TakeUid());
    }
    absl::StatusOr<SandboxInfo> out = Spawn(sb, request, spec, *argv);
    if (!out.ok()) GiveBackUid(sb->host_uid);
    return out;
  }

  absl::StatusOr<SandboxInfo> Spawn(SandboxPtr sb, const CreateRequest& request,
                                    const LocalSpec& spec, const std::vector<std::string>& argv) {
    const std::string& id = sb->id;
    const std::string socket_path = absl::StrCat(sb->dir, "/", kSocketName);
    sb->endpoint = absl::StrCat("unix:", socket_path);
    // The host folder: only sbx may enter it. In the plain fallback the workspace lies in it.
    if (mkdir(sb->dir.c_str(), 0700) != 0 ||
        (!isolated_ && mkdir((sb->dir + "/workspace").c_str(), 0700) != 0)) {
      return absl::UnavailableError(
          absl::StrCat("cannot create \"", sb->dir, "\": ", std::strerror(errno)));
    }
    auto fail = [&](absl::Status s) {
      KillSandbox(*sb);
      return s;
    };
    // The daemon's socket, bound and listening here, outside the sandbox: connections
    // queue from now on and are served once the daemon runs.
    Fd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
    if (!listener.valid() ||
        bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listener.get(), 128) != 0) {
      return fail(absl::UnavailableError(
          absl::StrCat("cannot listen on \"", socket_path, "\": ", std::strerror(errno))));
    }
    sb->cgroup_dirs = MakeCgroups(id, spec, &sb->freezer);

    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    char* envp[] = {const_cast<char*>(kPathEnv), nullptr};
    std::vector<std::string> procs;
    for (const std::string& cg : sb->cgroup_dirs) procs.push_back(cg + "/cgroup.procs");
    const std::string log_path = sb->dir + "/" + kLogName;
    // The sandbox's stdout and stderr: a FIFO in its host folder, held open for reading
    // and writing by the sandbox's first process (so a write never fails for want of a
    // reader while no runtime runs; it waits once the pipe's buffer is full), drained
    // into a bounded log by this runtime and by the next one that adopts the sandbox. No
    // host file is ever open for writing in the sandbox.
    Fd output_w;
    {
      const Fd dfd(open(sb->dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!dfd.valid() || mkfifoat(dfd.get(), kOutputName, 0600) != 0) {
        return fail(absl::UnavailableError(absl::StrCat("cannot make the output FIFO in \"",
                                                        sb->dir, "\": ", std::strerror(errno))));
      }
      // Read end first, non-blocking; then the end the sandbox gets.
      sb->output.Reset(OpenInDir(sb->dir, kOutputName, O_RDONLY | O_NONBLOCK));
      output_w.Reset(OpenInDir(sb->dir, kOutputName, O_RDWR));
      Fd log(OpenInDir(sb->dir, kLogName, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600));
      if (!sb->output.valid() || !output_w.valid() || !log.valid()) {
        return fail(absl::UnavailableError(absl::StrCat("cannot open the output FIFO or log in \"",
                                                        sb->dir, "\": ", std::strerror(errno))));
      }
      absl::MutexLock lock(&sb->log_mu);
      sb->log = std::move(log);
    }
    Fd null(open("/dev/null", O_RDONLY | O_CLOEXEC));
    absl::StatusOr<Fd> secret = PipeWith(options_.secret_for(id));
    if (!secret.ok()) return fail(secret.status());
    absl::StatusOr<Fd> seccomp = isolated_ ? PipeWith(iso_.seccomp) : absl::StatusOr<Fd>(Fd());
    if (!seccomp.ok()) return fail(seccomp.status());
    int info[2] = {-1, -1}, ready[2] = {-1, -1};
    if ((isolated_ && pipe2(info, O_CLOEXEC) != 0) || pipe2(ready, O_CLOEXEC) != 0) {
      return fail(absl::UnavailableError(absl::StrCat("pipe failed: ", std::strerror(errno))));
    }
    Fd info_r(info[0]), info_w(info[1]), ready_r(ready[0]), ready_w(ready[1]);
    if (info_r.valid()) fcntl(info_r.get(), F_SETFL, O_NONBLOCK);
    fcntl(ready_r.get(), F_SETFL, O_NONBLOCK);

    SpawnPlan plan;
    plan.argv = cargv.data();
    plan.envp = envp;
    plan.cgroup_procs = &procs;
    plan.cwd = sb->dir.c_str();
    plan.Give(STDIN_FILENO, null.get());
    plan.Give(STDOUT_FILENO, output_w.get());
    plan.Give(STDERR_FILENO, output_w.get());
    plan.Give(kListenFd, listener.get());
    plan.Give(kSecretFd, secret->get());
    plan.Give(kReadyFd, ready_w.get());
    if (isolated_) {
      plan.Give(kInfoFd, info_w.get());
      plan.Give(kSeccompFd, seccomp->get());
      plan.Give(kSandboxdFd, iso_.sandboxd.get());
    }
    plan.switch_user = iso_.own_uids;
    plan.uid = sb->host_uid;
    plan.gid = sb->host_uid;
    const pid_t pid = SpawnDetached(plan);
    output_w.Reset();
    info_w.Reset();
    ready_w.Reset();
    listener.Reset();
    secret->Reset();
    if (pid < 0 || plan.error != 0) {
      const int err = pid < 0 ? errno : plan.error;
      if (pid > 0) {
        while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      return fail(
          absl::UnavailableError(absl::StrCat("cannot start \"", argv[0], "\" for sandbox ", id,
                                              " (", plan.failed_step, "): ", std::strerror(err))));
    }
    sb->pid = pid;
    sb->start_time = StartTime(pid);
    sb->pidfd.Reset(PidfdOpen(pid));

    // Ready when the daemon says so on the ready pipe. Wait on it, the info pipe (bwrap
    // names the sandbox's pid 1) and the pidfd (an early exit).
    const absl::Time deadline = absl::Now() + options_.ready_timeout;
    std::string info_text;
    absl::Status failed;
    while (true) {
      const absl::Time now = absl::Now();
      if (now > deadline) {
        DrainOutput(*sb, &output_dropped_);
        failed = absl::DeadlineExceededError(
            absl::StrCat("sandbox ", id, " was not serving within ",
                         absl::FormatDuration(options_.ready_timeout), ": ", Tail(log_path)));
        break;
      }
      if (!sb->pidfd.valid()) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) {
          DrainOutput(*sb, &output_dropped_);
          failed = Exited(*sb, log_path, status);
          break;
        }
      }
      pollfd fds[4];
      nfds_t n = 0;
      int info_at = -1, pidfd_at = -1;
      fds[n++] = {ready_r.get(), POLLIN, 0};
      const int output_at = static_cast<int>(n);
      fds[n++] = {sb->output.get(), POLLIN, 0};
      if (info_r.valid()) {
        info_at = static_cast<int>(n);
        fds[n++] = {info_r.get(), POLLIN, 0};
      }
      if (sb->pidfd.valid()) {
        pidfd_at = static_cast<int>(n);
        fds[n++] = {sb->pidfd.get(), POLLIN, 0};
      }
      absl::Duration wait = std::min(deadline - now, absl::Seconds(1));
      if (!sb->pidfd.valid()) wait = std::min(wait, absl::Milliseconds(2));
      const timespec ts = absl::ToTimespec(std::max(wait, absl::ZeroDuration()));
      if (ppoll(fds, n, &ts, nullptr) < 0 && errno != EINTR) {
        failed = absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
        break;
      }
      if (info_at >= 0 && fds[info_at].revents != 0) ReadInfo(info_r, &info_text, sb.get());
      if (fds[output_at].revents != 0) DrainOutput(*sb, &output_dropped_);
      if (fds[0].revents != 0) {
        char byte;
        if (read(ready_r.get(), &byte, 1) == 1) break;
        // The write end closed without a byte: the daemon ended; the pidfd tells how.
      }
      if (pidfd_at >= 0 && fds[pidfd_at].revents != 0) {
        DrainOutput(*sb, &output_dropped_);
        failed = Exited(*sb, log_path, ReapIfChild(*sb, /*block=*/false));
        break;
      }
    }
    // bwrap has written the info pipe before the daemon started.
    while (failed.ok() && info_r.valid() && ReadInfo(info_r, &info_text, sb.get())) {
    }
    if (failed.ok() && isolated_ && sb->init_pid <= 0) {
      failed = absl::InternalError(
          absl::StrCat("sandbox ", id, ": bubblewrap did not name the sandbox's pid 1"));
    }
    if (failed.ok() && !WriteState(*sb)) {
      failed = absl::UnavailableError(
          absl::StrCat("sandbox ", id, ": cannot write its state file in ", sb->dir));
    }
    if (!failed.ok()) return fail(failed);
    SandboxInfo out;
    out.id = id;
    out.pool = request.pool;
    out.endpoint = sb->endpoint;
    {
      absl::MutexLock lock(&mu_);
      running_.emplace(id, std::move(sb));
    }
    WakeReaper();
    return out;
  }

  static absl::Status Exited(Sandbox& sb, const std::string& log_path, int status) {
    // Reaped already (or not our child): the pid must not be signalled any more.
    sb.pid = -1;
    sb.pidfd.Reset();
    return absl::UnavailableError(
        absl::StrCat("sandbox ", sb.id, " exited while starting (",
                     status >= 0 ? DescribeExit(status) : std::string("exit status unknown"),
                     "): ", Tail(log_path)));
  }

  // Reads bwrap's --info-fd pipe (non-blocking) and takes the sandbox's pid 1 from the
  // text once it is complete ({"child-pid": N, ...}). Returns whether more may be read
  // now; closes the pipe at its end.
  static bool ReadInfo(Fd& info, std::string* text, Sandbox* sb) {
    char buf[256];
    const ssize_t len = read(info.get(), buf, sizeof(buf));
    if (len < 0 && (errno == EAGAIN || errno == EINTR)) return errno == EINTR;
    if (len <= 0) {
      info.Reset();
      return false;
    }
    text->append(buf, static_cast<size_t>(len));
    try {
      sb->init_pid = nlohmann::json::parse(*text).value("child-pid", -1);
      if (sb->init_pid > 0) sb->init_start_time = StartTime(sb->init_pid);
    } catch (const nlohmann::json::exception&) {
      // Not complete yet.
    }
    return true;
  }

  // Notices sandboxes whose top process ended by itself: a pidfd per sandbox polled
  // together with an eventfd that says the table changed (a 50 ms scan where the kernel
  // has no pidfd).
  void Reap() {
    while (true) {
      std::vector<SandboxPtr> watched;
      std::vector<SandboxPtr> outputs;
      std::vector<pollfd> fds;
      bool scan = false;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        for (const auto& [id, sb] : running_) {
          if (sb->pidfd.valid()) {
            fds.push_back({sb->pidfd.get(), POLLIN, 0});
            watched.push_back(sb);
          } else {
            scan = true;
          }
        }
        if (scan) {
          for (const auto& [id, sb] : running_) {
            if (!sb->pidfd.valid()) watched.push_back(sb);
          }
        }
        for (const auto& [id, sb] : running_) {
          if (sb->output.valid() && !sb->output_ended.load(std::memory_order_relaxed)) {
            outputs.push_back(sb);
          }
        }
      }
      const size_t first_output = fds.size();
      for (const SandboxPtr& sb : outputs) fds.push_back({sb->output.get(), POLLIN, 0});
      fds.push_back({wake_fd_.get(), POLLIN, 0});
      if (poll(fds.data(), fds.size(), scan ? 50 : -1) < 0 && errno != EINTR) {
        spdlog::error("local runtime reaper: poll: {}", std::strerror(errno));
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (fds.back().revents != 0) {
        uint64_t count;
        [[maybe_unused]] ssize_t n = read(wake_fd_.get(), &count, sizeof(count));
      }
      for (size_t i = 0; i < outputs.size(); ++i) {
        if (fds[first_output + i].revents != 0) DrainOutput(*outputs[i], &output_dropped_);
      }
      std::vector<SandboxPtr> gone;
      for (size_t i = 0; i < watched.size(); ++i) {
        Sandbox& sb = *watched[i];
        const bool ended = i < first_output && sb.pidfd.valid()
                               ? fds[i].revents != 0
                               : !sb.pidfd.valid() && !Alive(sb.pid, sb.start_time);
        if (ended) gone.push_back(watched[i]);
      }
      for (SandboxPtr& sb : gone) {
        {
          absl::MutexLock lock(&mu_);
          auto it = running_.find(sb->id);
          if (it == running_.end() || it->second != sb) continue;  // being deleted
          running_.erase(it);
        }
        DrainOutput(*sb, &output_dropped_);  // its last words, for the log line below
        absl::MutexLock lock(&sb->op_mu);
        sb->ended = true;
        const int status = ReapIfChild(*sb, /*block=*/false);
        spdlog::warn("sandbox {} ended by itself ({})", sb->id,
                     status >= 0 ? DescribeExit(status) : std::string("not our child"));
        KillSandbox(*sb);
        GiveBackUid(sb->host_uid);
        if (options_.on_gone) options_.on_gone(sb->id);
      }
    }
  }

  const BubblewrapRuntimeOptions options_;
  const std::string root_;  // options_.root_dir, absolute
  // Held (flock) while the runtime exists.
  const Fd lock_;
  const Isolation iso_;
  const bool isolated_;
  const Cgroups cgroups_;
  // SystemArgs(): the same for every sandbox.
  const std::vector<std::string> system_args_;
  const size_t adopted_;
  // Tells the reaper that the table changed or that the runtime stops.
  const Fd wake_fd_;
  // Bytes of sandboxes' output not kept in their logs (DrainOutput). Atomic: added to by
  // the reaper and the workers, read by metrics; relaxed, a statistic.
  std::atomic<uint64_t> output_dropped_{0};
  std::vector<std::thread> workers_;
  std::thread reaper_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, SandboxPtr> running_ ABSL_GUARDED_BY(mu_);
  // The host uids of running sandboxes and of those being made (own_uids only).
  absl::flat_hash_set<uid_t> uids_ ABSL_GUARDED_BY(mu_);
};

// The sandbox id whose host folder (root/lb-...) a working directory lies in, or empty:
// every sandbox's top process (bwrap, or the plain daemon) works in its host folder.
std::string IdOfCwd(const std::string& cwd, const std::string& root) {
  const std::string marker = absl::StrCat(root, "/", kIdPrefix);
  if (!absl::StartsWith(cwd, marker)) return "";
  const size_t end = cwd.find('/', root.size() + 1);
  return cwd.substr(root.size() + 1,
                    end == std::string::npos ? std::string::npos : end - root.size() - 1);
}

// Removes the empty sandbox cgroups older than a minute, whatever root they came from: a
// runtime on another root that was killed leaves them behind, and nothing else would ever
// remove them. A live sandbox's cgroups hold its processes (rmdir fails on them), and a
// sandbox being made fills its cgroups within its ready timeout.
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

// Adopts the live sandboxes under `root` and cleans up everything else there: what a
// runtime finds when it starts (see the header's Lifetime section). Only what the kernel
// says and what this runtime wrote in folders no sandbox reaches is believed: the state
// file must be a regular file of ours in a real folder of ours; the top process must be
// the same process and work in that folder; the socket and cgroups follow from the id.
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
          sb->suspended.store(state.rfind("FROZEN", 0) == 0, std::memory_order_relaxed);
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

}  // namespace

std::string EncodeLocalSpec(const LocalSpec& spec) {
  nlohmann::json j;
  j["env"] = spec.env;
  j["mounts"] = nlohmann::json::array();
  for (const auto& m : spec.mounts) {
    j["mounts"].push_back({{"source", m.source}, {"target", m.target}, {"read_only", m.read_only}});
  }
  j["network"] = spec.network;
  j["memory_limit_bytes"] = spec.memory_limit_bytes;
  j["pids_limit"] = spec.pids_limit;
  j["workspace_size_bytes"] = spec.workspace_size_bytes;
  return j.dump();
}

absl::StatusOr<LocalSpec> ParseLocalSpec(const std::string& json) {
  // nlohmann throws on bad input; the exception stops here and becomes a Status.
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    if (!j.is_object()) return absl::InvalidArgumentError("local spec is not a JSON object");
    LocalSpec s;
    if (j.contains("env")) s.env = j.at("env").get<std::map<std::string, std::string>>();
    if (j.contains("mounts")) {
      for (const auto& m : j.at("mounts")) {
        LocalSpec::Mount mount;
        mount.source = m.at("source").get<std::string>();
        mount.target = m.at("target").get<std::string>();
        mount.read_only = m.value("read_only", true);
        RETURN_IF_ERROR(CheckNormalAbsolutePath("mount source", mount.source));
        RETURN_IF_ERROR(CheckSandboxMountTarget("mount target", mount.target));
        s.mounts.push_back(std::move(mount));
      }
    }
    s.network = j.value("network", false);
    s.memory_limit_bytes = j.value("memory_limit_bytes", int64_t{0});
    s.pids_limit = j.value("pids_limit", int64_t{0});
    s.workspace_size_bytes = j.value("workspace_size_bytes", int64_t{0});
    if (s.memory_limit_bytes < 0 || s.pids_limit < 0 || s.workspace_size_bytes < 0) {
      return absl::InvalidArgumentError("local spec limits must not be negative");
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("local spec: ", e.what()));
  }
}

absl::Status BubblewrapRuntimeOptions::Validate() const {
  if (root_dir.empty()) return absl::InvalidArgumentError("runtime root_dir is empty");
  if (sandboxd_path.empty() || sandboxd_path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("sandboxd_path \"", sandboxd_path, "\" must be an absolute path"));
  }
  if (workers < 1) return absl::InvalidArgumentError(absl::StrCat("workers ", workers, " < 1"));
  if (ready_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ready_timeout must be positive");
  }
  if (!secret_for) {
    return absl::InvalidArgumentError("secret_for is required (the sandboxes' daemon secrets)");
  }
  if (sandbox_uid_base == 0 || sandbox_uid_count == 0 ||
      uint64_t{sandbox_uid_base} + sandbox_uid_count > uint64_t{1} << 32) {
    return absl::InvalidArgumentError(absl::StrCat("sandbox uids ", sandbox_uid_base, " + ",
                                                   sandbox_uid_count,
                                                   " are not a range of "
                                                   "non-root uids"));
  }
  for (const std::string& h : hidden_paths) {
    if (h.empty() || h[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden path \"", h, "\" must be an absolute path"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Runs `argv` once as a sandbox would be run (same user, descriptors, no_new_privs) and
// waits for it: OK when it exits 0, else FAILED_PRECONDITION with its output.
absl::Status Probe(const std::vector<std::string>& argv, const Isolation& iso, uid_t uid) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  char* envp[] = {const_cast<char*>(kPathEnv), nullptr};
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  Fd out_r(out[0]), out_w(out[1]);
  Fd null(open("/dev/null", O_RDONLY | O_CLOEXEC));
  absl::StatusOr<Fd> seccomp = PipeWith(iso.seccomp);
  if (!seccomp.ok()) return seccomp.status();
  const std::vector<std::string> no_cgroups;
  SpawnPlan plan;
  plan.argv = cargv.data();
  plan.envp = envp;
  plan.cgroup_procs = &no_cgroups;
  plan.Give(STDIN_FILENO, null.get());
  plan.Give(STDOUT_FILENO, out_w.get());
  plan.Give(STDERR_FILENO, out_w.get());
  plan.Give(kSeccompFd, seccomp->get());
  plan.Give(kSandboxdFd, iso.sandboxd.get());
  plan.switch_user = iso.own_uids;
  plan.uid = uid;
  plan.gid = uid;
  const pid_t pid = SpawnDetached(plan);
  out_w.Reset();
  if (pid < 0) return absl::FailedPreconditionError(absl::StrCat("spawn: ", std::strerror(errno)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(out_r.get(), buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  if (plan.error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(plan.failed_step, ": ", std::strerror(plan.error)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return absl::FailedPreconditionError(
      absl::StrCat(DescribeExit(status), ": ", text.empty() ? "(no output)" : text));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BubblewrapRuntime>> BubblewrapRuntime::Make(
    BubblewrapRuntimeOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (access(options.sandboxd_path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandboxd \"", options.sandboxd_path, "\" is not an executable file"));
  }
  std::error_code ec;
  fs::create_directories(options.root_dir, ec);
  if (ec || access(options.root_dir.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("runtime root \"", options.root_dir, "\" is not a writable folder"));
  }
  const std::string longest =
      (fs::absolute(options.root_dir) / "lb-0123456789abcdef" / "sandboxd.sock").string();
  if (longest.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("runtime root \"", options.root_dir, "\" is too long for unix socket paths (",
                     longest.size(), " of at most ", sizeof(sockaddr_un::sun_path) - 1, " bytes)"));
  }
  Isolation iso;
  iso.sandboxd.Reset(open(options.sandboxd_path.c_str(), O_PATH | O_CLOEXEC));
  if (!iso.sandboxd.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sandboxd \"", options.sandboxd_path, "\" cannot be opened: ", std::strerror(errno)));
  }
  std::string root = fs::absolute(options.root_dir).lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  for (const std::string& h : options.hidden_paths) {
    iso.hidden.push_back(fs::absolute(h).lexically_normal().string());
    while (iso.hidden.back().size() > 1 && iso.hidden.back().back() == '/') {
      iso.hidden.back().pop_back();
    }
    iso.hidden.push_back(fs::weakly_canonical(h, ec).string());
  }
  iso.hidden.push_back(root);
  iso.hidden.push_back(fs::weakly_canonical(root, ec).string());
  std::sort(iso.hidden.begin(), iso.hidden.end());
  iso.hidden.erase(std::unique(iso.hidden.begin(), iso.hidden.end()), iso.hidden.end());
  iso.own_uids = geteuid() == 0;
  // Where the server's files are masked, or why they cannot be: the true reason, before
  // any probe (whose failure would otherwise read as missing bubblewrap).
  ASSIGN_OR_RETURN(iso.masks, SystemMasks(iso.hidden, iso.own_uids));
  absl::Status why;
  if (options.bwrap_path.empty()) {
    why = absl::FailedPreconditionError("no bubblewrap given");
  } else if (access(options.bwrap_path.c_str(), X_OK) != 0) {
    why = absl::FailedPreconditionError(absl::StrCat("not installed: ", std::strerror(errno)));
  } else if (absl::StatusOr<std::string> program = SeccompProgram(); !program.ok()) {
    why = program.status();
  } else {
    iso.seccomp = *std::move(program);
    // bubblewrap may be installed yet unusable (no user namespaces for this uid, seccomp
    // refused): run the daemon's --version in a sandbox made as the real ones are.
    iso.isolated = true;
    auto probe = [&](const std::vector<std::string>& masks) {
      std::vector<std::string> argv = IsolationArgs(options.bwrap_path);
      argv.push_back("--unshare-net");
      for (std::string& x : SystemArgs(masks)) argv.push_back(std::move(x));
      argv.insert(argv.end(), {"--ro-bind-fd", std::to_string(kSandboxdFd), kSandboxdInside,
                               kSandboxdInside, "--version"});
      return Probe(argv, iso, options.sandbox_uid_base);
    };
    why = probe(iso.masks);
    if (!why.ok() && probe({}).ok()) {
      // bubblewrap isolates; it is the masks of the server's files that it cannot make.
      return absl::FailedPreconditionError(absl::StrCat(
          "bubblewrap works here, but cannot mask the server's own files in the folders "
          "every sandbox sees (masks: ",
          absl::StrJoin(iso.masks, ", "), "): ", why.message(),
          ". Move the data dir, key, tokens file and TLS key out of /usr, /etc and /lib*, or "
          "into folders of their own there"));
    }
    iso.isolated = why.ok();
  }
  if (!iso.isolated) {
    if (!options.allow_unisolated) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bubblewrap (\"", options.bwrap_path, "\") cannot isolate sandboxes here (",
          why.message(),
          "). Install it (apt-get install bubblewrap) and allow user namespaces "
          "(sysctl user.max_user_namespaces > 0, and kernel.unprivileged_userns_clone=1 or "
          "kernel.apparmor_restrict_unprivileged_userns=0 where those exist); or, for "
          "development only, run sandboxes as plain processes with "
          "--insecure_local_no_isolation"));
    }
    iso.own_uids = false;
    spdlog::error(
        "*** bubblewrap (\"{}\") cannot isolate sandboxes here ({}): sandboxes are PLAIN "
        "PROCESSES with NO ISOLATION (same user, filesystem and network as sbx), as "
        "--insecure_local_no_isolation asked ***",
        options.bwrap_path, std::string(why.message()));
  }
  // Only sbx may enter the root and the sandboxes' host folders.
  struct stat root_st;
  if (lstat(root.c_str(), &root_st) != 0 || !S_ISDIR(root_st.st_mode) ||
      root_st.st_uid != geteuid() || chmod(root.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("runtime root \"", root,
                     "\" must be a folder (not a symbolic link) owned by uid ", geteuid()));
  }
  // One runtime per root: a second one would adopt, or clean up as half-made, the
  // sandboxes the first is starting.
  Fd lock(OpenInDir(root, ".lock", O_RDWR | O_CREAT, 0600));
  if (!lock.valid() || flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "runtime root \"", root, "\" is in use by another runtime (", root, "/.lock is locked)"));
  }
  Cgroups cgroups = Cgroups::Detect(options.use_freezer);
  spdlog::info("local runtime: root \"{}\", {}, memory limits {}, pids limits {}, suspend with {}",
               root,
               !iso.isolated ? "NO isolation"
               : iso.own_uids
                   ? absl::StrCat("bubblewrap isolation (user namespace, seccomp; host uids from ",
                                  options.sandbox_uid_base, ")")
                   : absl::StrCat("bubblewrap isolation (user namespace, seccomp; host uid ",
                                  geteuid(), ", sbx's own)"),
               cgroups.memory.empty() ? "unavailable" : "cgroup v1",
               cgroups.pids.empty() ? "unavailable" : "cgroup v1",
               cgroups.freezer.empty() ? "SIGSTOP/SIGCONT (no writable freezer cgroup)"
                                       : "the freezer cgroup");
  std::vector<SandboxPtr> adopted = AdoptOrCleanUp(root, cgroups);
  PruneEmptyCgroups(cgroups);
  return std::unique_ptr<BubblewrapRuntime>(
      new BubblewrapRuntimeImpl(std::move(options), std::move(root), std::move(lock),
                                std::move(iso), std::move(cgroups), std::move(adopted)));
}

}  // namespace sbx::runtime
