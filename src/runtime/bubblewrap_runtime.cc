#include "src/runtime/bubblewrap_runtime.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/common/ids.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDefaultWorkspaceBytes = int64_t{256} << 20;
constexpr char kSockDirInside[] = "/run/sbx/sock";
constexpr char kWorkspaceInside[] = "/run/sbx/workspace";
constexpr char kSandboxdInside[] = "/run/sbx/bin/sbx-sandboxd";
constexpr char kSocketName[] = "sandboxd.sock";
constexpr char kStateName[] = "state.json";
constexpr char kIdPrefix[] = "lb-";
// The fd on which bwrap tells the host pid of the sandbox's pid 1 (--info-fd).
constexpr int kInfoFd = 3;
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

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
  std::string dir;  // root_dir/<id>, absolute
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
};
using SandboxPtr = std::shared_ptr<Sandbox>;

// The state file: what a later runtime needs to adopt the sandbox or clean it up.
std::string EncodeState(const Sandbox& sb) {
  nlohmann::json j;
  j["version"] = 1;
  j["id"] = sb.id;
  j["pool"] = sb.pool;
  j["endpoint"] = sb.endpoint;
  j["pid"] = sb.pid;
  j["start_time"] = sb.start_time;
  j["init_pid"] = sb.init_pid;
  j["init_start_time"] = sb.init_start_time;
  j["cgroups"] = sb.cgroup_dirs;
  j["freezer"] = sb.freezer;
  j["suspended"] = sb.suspended.load(std::memory_order_relaxed);
  return j.dump();
}

// Fills `sb` from a state file; false if it is missing or unreadable.
bool DecodeState(const std::string& text, Sandbox* sb) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("version", 0) != 1) return false;
    sb->id = j.at("id").get<std::string>();
    sb->pool = j.at("pool").get<std::string>();
    sb->endpoint = j.at("endpoint").get<std::string>();
    sb->pid = j.at("pid").get<pid_t>();
    sb->start_time = j.at("start_time").get<uint64_t>();
    sb->init_pid = j.value("init_pid", -1);
    sb->init_start_time = j.value("init_start_time", uint64_t{0});
    sb->cgroup_dirs = j.value("cgroups", std::vector<std::string>());
    sb->freezer = j.value("freezer", std::string());
    sb->suspended.store(j.value("suspended", false), std::memory_order_relaxed);
    return sb->pid > 0;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// Writes the state file atomically (a reader sees the old file or the new one).
bool WriteState(const Sandbox& sb) {
  const std::string path = sb.dir + "/" + kStateName;
  const std::string tmp = path + ".tmp";
  const std::string text = EncodeState(sb);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (close(fd) != 0 || !ok) return false;
  return rename(tmp.c_str(), path.c_str()) == 0;
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
  std::error_code ec;
  if (!sb.dir.empty()) fs::remove_all(sb.dir, ec);
}

// What the child of SpawnDetached does between clone and exec, prepared by the parent
// (the child may not allocate).
struct SpawnPlan {
  char* const* argv = nullptr;
  const std::vector<std::string>* cgroup_procs = nullptr;  // cgroup.procs files to join
  int log_fd = -1;                                         // stdout and stderr; -1: inherited
  int info_fd = -1;  // becomes kInfoFd (bwrap's --info-fd); -1: none
  int error = 0;     // set by the child when it cannot exec
};

// The child's side: only raw system calls (it shares the parent's memory until exec).
int SpawnChild(void* arg) {
  SpawnPlan& plan = *static_cast<SpawnPlan*>(arg);
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
  if (plan.log_fd >= 0) {
    dup2(plan.log_fd, STDOUT_FILENO);
    dup2(plan.log_fd, STDERR_FILENO);
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  if (plan.info_fd >= 0) {
    // dup2 onto itself would keep close-on-exec.
    if (plan.info_fd == kInfoFd) {
      fcntl(kInfoFd, F_SETFD, 0);
    } else {
      dup2(plan.info_fd, kInfoFd);
    }
  }
  // Nothing else of sbx (its sockets, its store's files) may live on in the sandbox,
  // which outlives sbx.
  syscall(SYS_close_range, plan.info_fd >= 0 ? kInfoFd + 1 : kInfoFd, ~0U, CLOSE_RANGE_CLOEXEC);
  if (chdir("/") == 0) execv(plan.argv[0], plan.argv);
  plan.error = errno;
  _exit(127);
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

class BubblewrapRuntimeImpl final : public BubblewrapRuntime {
 public:
  BubblewrapRuntimeImpl(BubblewrapRuntimeOptions options, std::string root, Fd lock, bool isolated,
                        Cgroups cgroups, std::vector<SandboxPtr> adopted)
      : options_(std::move(options)),
        root_(std::move(root)),
        lock_(std::move(lock)),
        isolated_(isolated),
        cgroups_(std::move(cgroups)),
        root_args_(RootArgs()),
        adopted_(adopted.size()),
        wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    {
      absl::MutexLock lock(&mu_);
      for (SandboxPtr& sb : adopted) running_.emplace(sb->id, std::move(sb));
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
      std::move(done)(absl::OkStatus());
    });
  }

  void Suspend(std::string id, DoneCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(SetSuspended(id, true));
    });
  }

  void Resume(std::string id, DoneCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(SetSuspended(id, false));
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

  std::vector<std::string> Argv(const std::string& id, const std::string& dir,
                                const LocalSpec& spec) const {
    const std::string socket_inside = absl::StrCat(kSockDirInside, "/", kSocketName);
    if (!isolated_) {
      return {options_.sandboxd_path, "--socket", absl::StrCat(dir, "/", kSocketName),
              "--workspace", dir + "/workspace"};
    }
    // The root is bubblewrap's own tmpfs with every top-level entry of the host bound
    // read-only onto it (symlinks recreated), so that template mounts can add new
    // top-level paths while the host stays read-only. No --die-with-parent: the sandbox
    // must outlive sbx (and that option ties bwrap to the thread that forked it).
    std::vector<std::string> a = {options_.bwrap_path,     "--unshare-pid", "--unshare-ipc",
                                  "--unshare-uts",         "--new-session", "--info-fd",
                                  std::to_string(kInfoFd), "--hostname",    id};
    a.insert(a.end(), root_args_.begin(), root_args_.end());
    for (const char* x :
         {"--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run"}) {
      a.emplace_back(x);
    }
    if (!spec.network) a.push_back("--unshare-net");
    const int64_t ws =
        spec.workspace_size_bytes > 0 ? spec.workspace_size_bytes : kDefaultWorkspaceBytes;
    a.insert(a.end(), {"--size", std::to_string(ws), "--tmpfs", kWorkspaceInside});
    a.insert(a.end(), {"--bind", dir, kSockDirInside});
    for (const auto& m : spec.mounts) {
      a.push_back(m.read_only ? "--ro-bind" : "--bind");
      a.push_back(m.source);
      a.push_back(m.target);
    }
    for (const auto& [k, v] : spec.env) a.insert(a.end(), {"--setenv", k, v});
    a.insert(a.end(), {"--chdir", kWorkspaceInside});
    // The daemon is bound in at a fixed path: its host path may be under /tmp, which the
    // sandbox replaces with its own tmpfs.
    a.insert(a.end(), {"--ro-bind", options_.sandboxd_path, kSandboxdInside});
    a.insert(a.end(), {kSandboxdInside, "--socket", socket_inside, "--workspace",
                       std::string(kWorkspaceInside)});
    return a;
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
    const std::string socket = absl::StrCat(sb->dir, "/", kSocketName);
    sb->endpoint = absl::StrCat("unix:", socket);
    if (mkdir(sb->dir.c_str(), 0755) != 0 ||
        (!isolated_ && mkdir((sb->dir + "/workspace").c_str(), 0755) != 0)) {
      return absl::UnavailableError(
          absl::StrCat("cannot create \"", sb->dir, "\": ", std::strerror(errno)));
    }
    // Watch the folder before the daemon can create its socket there.
    Fd inotify(inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
    if (inotify.valid()) inotify_add_watch(inotify.get(), sb->dir.c_str(), IN_CREATE);
    sb->cgroup_dirs = MakeCgroups(id, spec, &sb->freezer);

    const std::vector<std::string> argv = Argv(id, sb->dir, spec);
    std::vector<char*> cargv;
    for (const std::string& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
    cargv.push_back(nullptr);
    std::vector<std::string> procs;
    for (const std::string& cg : sb->cgroup_dirs) procs.push_back(cg + "/cgroup.procs");
    const std::string log_path = sb->dir + "/sandboxd.log";
    Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    int info[2] = {-1, -1};
    if (isolated_ && pipe2(info, O_CLOEXEC) != 0) {
      const int err = errno;
      KillSandbox(*sb);
      return absl::UnavailableError(absl::StrCat("pipe failed: ", std::strerror(err)));
    }
    Fd info_r(info[0]), info_w(info[1]);
    if (info_r.valid()) fcntl(info_r.get(), F_SETFL, O_NONBLOCK);

    SpawnPlan plan;
    plan.argv = cargv.data();
    plan.cgroup_procs = &procs;
    plan.log_fd = log.get();
    plan.info_fd = info_w.get();
    const pid_t pid = SpawnDetached(plan);
    log.Reset();
    info_w.Reset();
    if (pid < 0 || plan.error != 0) {
      const int err = pid < 0 ? errno : plan.error;
      if (pid > 0) {
        while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      KillSandbox(*sb);
      return absl::UnavailableError(absl::StrCat("cannot start \"", argv[0], "\" for sandbox ", id,
                                                 ": ", std::strerror(err)));
    }
    sb->pid = pid;
    sb->start_time = StartTime(pid);
    sb->pidfd.Reset(PidfdOpen(pid));

    // Ready when the daemon accepts connections on its socket. Wait on the folder (the
    // socket's creation), the info pipe (bwrap names the sandbox's pid 1) and the pidfd
    // (an early exit); try to connect only once the socket exists.
    const absl::Time deadline = absl::Now() + options_.ready_timeout;
    std::string info_text;
    bool socket_seen = !inotify.valid();
    absl::Status failed;
    while (true) {
      if (socket_seen && Connects(socket)) break;
      const absl::Time now = absl::Now();
      if (now > deadline) {
        failed = absl::DeadlineExceededError(
            absl::StrCat("sandbox ", id, " did not listen on ", socket, " within ",
                         absl::FormatDuration(options_.ready_timeout), ": ", Tail(log_path)));
        break;
      }
      if (!sb->pidfd.valid()) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) {
          failed = Exited(*sb, log_path, status);
          break;
        }
      }
      pollfd fds[3];
      nfds_t n = 0;
      int inotify_at = -1, info_at = -1, pidfd_at = -1;
      if (!socket_seen) {
        inotify_at = static_cast<int>(n);
        fds[n++] = {inotify.get(), POLLIN, 0};
      }
      if (info_r.valid()) {
        info_at = static_cast<int>(n);
        fds[n++] = {info_r.get(), POLLIN, 0};
      }
      if (sb->pidfd.valid()) {
        pidfd_at = static_cast<int>(n);
        fds[n++] = {sb->pidfd.get(), POLLIN, 0};
      }
      // Between the daemon's bind() and listen() the socket exists but refuses: retry
      // soon. Without a pidfd, look for an early exit every 2 ms.
      absl::Duration wait = std::min(deadline - now, absl::Seconds(1));
      if (socket_seen) {
        wait = absl::Microseconds(200);
      } else if (!sb->pidfd.valid()) {
        wait = std::min(wait, absl::Milliseconds(2));
      }
      const timespec ts = absl::ToTimespec(std::max(wait, absl::ZeroDuration()));
      if (ppoll(fds, n, &ts, nullptr) < 0 && errno != EINTR) {
        failed = absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
        break;
      }
      if (inotify_at >= 0 && fds[inotify_at].revents != 0) {
        alignas(inotify_event) char buf[4096];
        ssize_t len;
        while ((len = read(inotify.get(), buf, sizeof(buf))) > 0) {
          for (char* p = buf; p < buf + len;) {
            auto* ev = reinterpret_cast<inotify_event*>(p);
            if (ev->len > 0 && std::strcmp(ev->name, kSocketName) == 0) socket_seen = true;
            p += sizeof(inotify_event) + ev->len;
          }
        }
      }
      if (info_at >= 0 && fds[info_at].revents != 0) ReadInfo(info_r, &info_text, sb.get());
      if (pidfd_at >= 0 && fds[pidfd_at].revents != 0) {
        failed = Exited(*sb, log_path, ReapIfChild(*sb, /*block=*/false));
        break;
      }
    }
    // bwrap has written the info pipe before the daemon started.
    while (failed.ok() && info_r.valid() && ReadInfo(info_r, &info_text, sb.get())) {
    }
    if (failed.ok() && !WriteState(*sb)) {
      failed = absl::UnavailableError(
          absl::StrCat("sandbox ", id, ": cannot write its state file in ", sb->dir));
    }
    if (!failed.ok()) {
      KillSandbox(*sb);
      return failed;
    }
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
      }
      fds.push_back({wake_fd_.get(), POLLIN, 0});
      if (poll(fds.data(), fds.size(), scan ? 50 : -1) < 0 && errno != EINTR) {
        spdlog::error("local runtime reaper: poll: {}", std::strerror(errno));
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (fds.back().revents != 0) {
        uint64_t count;
        [[maybe_unused]] ssize_t n = read(wake_fd_.get(), &count, sizeof(count));
      }
      std::vector<SandboxPtr> gone;
      for (size_t i = 0; i < watched.size(); ++i) {
        Sandbox& sb = *watched[i];
        const bool ended = i < fds.size() - 1 && sb.pidfd.valid()
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
        absl::MutexLock lock(&sb->op_mu);
        sb->ended = true;
        const int status = ReapIfChild(*sb, /*block=*/false);
        spdlog::warn("sandbox {} ended by itself ({})", sb->id,
                     status >= 0 ? DescribeExit(status) : std::string("not our child"));
        KillSandbox(*sb);
        if (options_.on_gone) options_.on_gone(sb->id);
      }
    }
  }

  // bwrap arguments that rebuild the host's top level read-only.
  static std::vector<std::string> RootArgs() {
    std::vector<std::string> args;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/", ec)) {
      const std::string path = entry.path().string();
      if (path == "/proc" || path == "/dev" || path == "/tmp" || path == "/run") continue;
      if (entry.is_symlink(ec)) {
        const fs::path target = fs::read_symlink(entry.path(), ec);
        if (ec) continue;
        args.insert(args.end(), {"--symlink", target.string(), path});
      } else if (entry.is_directory(ec)) {
        args.insert(args.end(), {"--ro-bind", path, path});
      }
    }
    return args;
  }

  const BubblewrapRuntimeOptions options_;
  const std::string root_;  // options_.root_dir, absolute
  // Held (flock) while the runtime exists.
  const Fd lock_;
  const bool isolated_;
  const Cgroups cgroups_;
  const std::vector<std::string> root_args_;
  const size_t adopted_;
  // Tells the reaper that the table changed or that the runtime stops.
  const Fd wake_fd_;
  std::vector<std::thread> workers_;
  std::thread reaper_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, SandboxPtr> running_ ABSL_GUARDED_BY(mu_);
};

// The sandbox id a process's command line names, if it names a folder under `root`
// (bwrap binds the sandbox's folder; the plain fallback passes its socket path).
std::string IdInCmdline(const std::string& cmdline, const std::string& marker) {
  const size_t at = cmdline.find(marker);
  if (at == std::string::npos) return "";
  const size_t from = at + marker.size() - std::strlen(kIdPrefix);
  const size_t end = cmdline.find_first_of(std::string("/\0", 2), from);
  return cmdline.substr(from, end == std::string::npos ? std::string::npos : end - from);
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
// runtime finds when it starts (see the header's Lifetime section).
std::vector<SandboxPtr> AdoptOrCleanUp(const std::string& root, const Cgroups& cgroups) {
  std::vector<SandboxPtr> adopted;
  std::vector<SandboxPtr> dead;
  absl::flat_hash_set<std::string> keep;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kIdPrefix, 0) != 0) continue;
    auto sb = std::make_shared<Sandbox>();
    const bool has_state = DecodeState(ReadSmallFile(entry.path() / kStateName), sb.get());
    sb->dir = entry.path().string();
    if (has_state && sb->id == name && Alive(sb->pid, sb->start_time)) {
      // The pidfd names the process for good; the start time is checked again after
      // opening it, in case the pid was recycled in between.
      sb->pidfd.Reset(PidfdOpen(sb->pid));
      if (Alive(sb->pid, sb->start_time) && Connects(sb->endpoint.substr(std::strlen("unix:")))) {
        if (!sb->freezer.empty()) {
          std::string state = ReadSmallFile(sb->freezer + "/freezer.state");
          sb->suspended.store(state.rfind("FROZEN", 0) == 0, std::memory_order_relaxed);
        }
        keep.insert(name);
        adopted.push_back(std::move(sb));
        continue;
      }
    }
    if (!has_state) sb->pid = -1;  // nothing known; found below by command line
    sb->id = name;
    sb->pidfd.Reset(sb->pid > 0 && Alive(sb->pid, sb->start_time) ? PidfdOpen(sb->pid) : -1);
    if (sb->pidfd.valid() && !Alive(sb->pid, sb->start_time)) sb->pidfd.Reset();
    if (!sb->pidfd.valid() && !Alive(sb->pid, sb->start_time)) sb->pid = -1;
    // Whatever cgroups a half-created sandbox got before its state file was written.
    for (const std::string& cg : cgroups.DirsOf(name)) {
      if (std::find(sb->cgroup_dirs.begin(), sb->cgroup_dirs.end(), cg) == sb->cgroup_dirs.end() &&
          fs::exists(cg)) {
        sb->cgroup_dirs.push_back(cg);
        if (cg.rfind(cgroups.freezer, 0) == 0 && !cgroups.freezer.empty()) sb->freezer = cg;
      }
    }
    dead.push_back(std::move(sb));
  }
  // Processes of the dead ones (or of folders already removed) found by command line:
  // a bwrap still starting when its sbx was killed has no state file yet.
  const std::string marker = absl::StrCat(root, "/", kIdPrefix);
  int killed = 0;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid) || pid == getpid()) continue;
    const std::string cmd = ReadSmallFile(entry.path() / "cmdline");
    const std::string id = IdInCmdline(cmd, marker);
    if (!id.empty() && !keep.contains(id) && kill(pid, SIGKILL) == 0) ++killed;
  }
  for (SandboxPtr& sb : dead) {
    absl::MutexLock lock(&sb->op_mu);
    KillSandbox(*sb);
  }
  if (!adopted.empty() || !dead.empty() || killed > 0) {
    spdlog::warn(
        "local runtime: under {}: adopted {} running sandboxes, cleaned up {} dead or half-made "
        "ones (killed {} stray processes)",
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
        if (mount.source.empty() || mount.source[0] != '/' || mount.target.empty() ||
            mount.target[0] != '/') {
          return absl::InvalidArgumentError(absl::StrCat("mount \"", mount.source, "\" -> \"",
                                                         mount.target,
                                                         "\": both paths must be absolute"));
        }
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
  return absl::OkStatus();
}

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
  bool isolated = !options.bwrap_path.empty() && access(options.bwrap_path.c_str(), X_OK) == 0;
  if (isolated) {
    // bubblewrap may be installed yet unusable (no user namespaces, seccomp): try it.
    const std::string probe =
        absl::StrCat(options.bwrap_path,
                     " --unshare-pid --unshare-net --ro-bind / / --dev /dev --proc /proc "
                     "/bin/true >/dev/null 2>&1");
    isolated = std::system(probe.c_str()) == 0;
  }
  if (!isolated) {
    spdlog::error(
        "*** bubblewrap (\"{}\") is missing or cannot run here: sandboxes will be PLAIN "
        "PROCESSES with NO ISOLATION (same user, filesystem and network as sbx) ***",
        options.bwrap_path);
  }
  std::string root = fs::absolute(options.root_dir).lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  // One runtime per root: a second one would adopt, or clean up as half-made, the
  // sandboxes the first is starting.
  Fd lock(open((root + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid() || flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "runtime root \"", root, "\" is in use by another runtime (", root, "/.lock is locked)"));
  }
  Cgroups cgroups = Cgroups::Detect(options.use_freezer);
  spdlog::info("local runtime: root \"{}\", {}, memory limits {}, pids limits {}, suspend with {}",
               root, isolated ? "bubblewrap isolation" : "NO isolation",
               cgroups.memory.empty() ? "unavailable" : "cgroup v1",
               cgroups.pids.empty() ? "unavailable" : "cgroup v1",
               cgroups.freezer.empty() ? "SIGSTOP/SIGCONT (no writable freezer cgroup)"
                                       : "the freezer cgroup");
  std::vector<SandboxPtr> adopted = AdoptOrCleanUp(root, cgroups);
  PruneEmptyCgroups(cgroups);
  return std::unique_ptr<BubblewrapRuntime>(
      new BubblewrapRuntimeImpl(std::move(options), std::move(root), std::move(lock), isolated,
                                std::move(cgroups), std::move(adopted)));
}

}  // namespace sbx::runtime
