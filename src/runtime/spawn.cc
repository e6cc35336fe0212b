#include "src/runtime/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "src/common/errno_text.h"
#include "src/runtime/reaper.h"
#include "src/runtime/state_file.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace sbx::runtime::local {
namespace {

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
  // Into the sandbox's cgroups through `tasks`, not `cgroup.procs`: moving the calling
  // thread alone (the whole of this process, which has no other) spares the global
  // threadgroup lock whose write side waits for an RCU grace period, 6-15 ms per create
  // on a machine that has not moved a process for a while (0.1-0.7 ms this way; measured
  // on Linux 6.18, cgroup v1; older kernels take that lock either way).
  for (const std::string& p : *plan.cgroup_tasks) {
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
  // sigprocmask is unspecified with threads, but this is the forked child before exec: one thread.
  sigprocmask(SIG_SETMASK, &none, nullptr);  // NOLINT(concurrency-mt-unsafe)
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

std::string Tail(const std::string& path) {
  std::string all = ReadSmallFile(path);
  if (all.size() > 400) all = "..." + all.substr(all.size() - 400);
  while (!all.empty() && all.back() == '\n') all.pop_back();
  return all.empty() ? "(no output)" : all;
}

absl::Status Exited(Sandbox& sb, const std::string& log_path, int status) {
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
bool ReadInfo(Fd& info, std::string* text, Sandbox* sb) {
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

}  // namespace

absl::StatusOr<uid_t> UidPool::Take() {
  absl::MutexLock lock(&mu_);
  absl::BitGen gen;
  const uint32_t start = absl::Uniform<uint32_t>(gen, 0, count_);
  for (uint32_t i = 0; i < count_; ++i) {
    const uid_t uid = base_ + (start + i) % count_;
    if (uids_.insert(uid).second) return uid;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("all ", count_, " sandbox uids from ", base_, " are in use"));
}

void UidPool::Hold(uid_t uid) {
  absl::MutexLock lock(&mu_);
  uids_.insert(uid);
}

void UidPool::GiveBack(uid_t uid) {
  if (!own_uids_) return;
  absl::MutexLock lock(&mu_);
  uids_.erase(uid);
}

// It uses clone(CLONE_VM | CLONE_VFORK), as posix_spawn does, rather than fork: the
// parent's page tables are not copied and its threads take no copy-on-write faults while
// the child starts (both cost milliseconds for a big, multi-threaded sbx).
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

// The content must fit the pipe's buffer.
absl::StatusOr<Fd> PipeWith(const std::string& content) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", sbx::ErrnoText(errno)));
  }
  Fd r(fds[0]), w(fds[1]);
  if (content.size() > 65536) return absl::InternalError("pipe content above 64 KiB");
  if (write(w.get(), content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
    return absl::UnavailableError(absl::StrCat("pipe write: ", sbx::ErrnoText(errno)));
  }
  return r;
}

absl::Status SpawnSandbox(Sandbox& sb, const LocalSpec& spec, const std::vector<std::string>& argv,
                          const BubblewrapRuntimeOptions& options, const Isolation& iso,
                          const Cgroups& cgroups, std::atomic<uint64_t>* output_dropped) {
  const std::string& id = sb.id;
  const std::string socket_path = absl::StrCat(sb.dir, "/", kSocketName);
  sb.endpoint = absl::StrCat("unix:", socket_path);
  // The host folder: only sbx may enter it. In the plain fallback the workspace lies in it.
  if (mkdir(sb.dir.c_str(), 0700) != 0 ||
      (!iso.isolated && mkdir((sb.dir + "/workspace").c_str(), 0700) != 0)) {
    return absl::UnavailableError(
        absl::StrCat("cannot create \"", sb.dir, "\": ", sbx::ErrnoText(errno)));
  }
  auto fail = [&](absl::Status s) {
    KillSandbox(sb);
    return s;
  };
  // An image sandbox's bubblewrap runs as the sandbox's host uid and resolves the path of
  // its root (sbx-rootfs mounts it in this folder): the folder is searchable (not readable)
  // by others then; its files are each the runtime's alone (the socket included).
  if (iso.own_uids && !sb.image_digest.empty() && chmod(sb.dir.c_str(), 0711) != 0) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot chmod \"", sb.dir, "\": ", sbx::ErrnoText(errno))));
  }
  // The daemon's socket, bound and listening here, outside the sandbox: connections
  // queue from now on and are served once the daemon runs.
  Fd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (!listener.valid() ||
      bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(socket_path.c_str(), 0600) != 0 || listen(listener.get(), 128) != 0) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot listen on \"", socket_path, "\": ", sbx::ErrnoText(errno))));
  }
  sb.cgroup_dirs = MakeCgroups(cgroups, id, spec, &sb.freezer);

  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  char* envp[] = {const_cast<char*>(kPathEnv), nullptr};
  std::vector<std::string> tasks;
  for (const std::string& cg : sb.cgroup_dirs) tasks.push_back(cg + "/tasks");
  const std::string log_path = sb.dir + "/" + kLogName;
  // The sandbox's stdout and stderr: a FIFO in its host folder, held open for reading
  // and writing by the sandbox's first process (so a write never fails for want of a
  // reader while no runtime runs; it waits once the pipe's buffer is full), drained
  // into a bounded log by this runtime and by the next one that adopts the sandbox. No
  // host file is ever open for writing in the sandbox.
  Fd output_w;
  {
    const Fd dfd(open(sb.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dfd.valid() || mkfifoat(dfd.get(), kOutputName, 0600) != 0) {
      return fail(absl::UnavailableError(absl::StrCat("cannot make the output FIFO in \"", sb.dir,
                                                      "\": ", sbx::ErrnoText(errno))));
    }
    // Read end first, non-blocking; then the end the sandbox gets.
    sb.output.Reset(OpenInDir(sb.dir, kOutputName, O_RDONLY | O_NONBLOCK));
    output_w.Reset(OpenInDir(sb.dir, kOutputName, O_RDWR));
    Fd log(OpenInDir(sb.dir, kLogName, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600));
    if (!sb.output.valid() || !output_w.valid() || !log.valid()) {
      return fail(absl::UnavailableError(absl::StrCat("cannot open the output FIFO or log in \"",
                                                      sb.dir, "\": ", sbx::ErrnoText(errno))));
    }
    absl::MutexLock lock(&sb.log_mu);
    sb.log = std::move(log);
  }
  Fd null(open("/dev/null", O_RDONLY | O_CLOEXEC));
  absl::StatusOr<Fd> secret = PipeWith(options.secret_for(id));
  if (!secret.ok()) return fail(secret.status());
  absl::StatusOr<Fd> seccomp = iso.isolated ? PipeWith(iso.seccomp) : absl::StatusOr<Fd>(Fd());
  if (!seccomp.ok()) return fail(seccomp.status());
  int info[2] = {-1, -1}, ready[2] = {-1, -1};
  if ((iso.isolated && pipe2(info, O_CLOEXEC) != 0) || pipe2(ready, O_CLOEXEC) != 0) {
    return fail(absl::UnavailableError(absl::StrCat("pipe failed: ", sbx::ErrnoText(errno))));
  }
  Fd info_r(info[0]), info_w(info[1]), ready_r(ready[0]), ready_w(ready[1]);
  if (info_r.valid()) fcntl(info_r.get(), F_SETFL, O_NONBLOCK);
  fcntl(ready_r.get(), F_SETFL, O_NONBLOCK);

  SpawnPlan plan;
  plan.argv = cargv.data();
  plan.envp = envp;
  plan.cgroup_tasks = &tasks;
  plan.cwd = sb.dir.c_str();
  plan.Give(STDIN_FILENO, null.get());
  plan.Give(STDOUT_FILENO, output_w.get());
  plan.Give(STDERR_FILENO, output_w.get());
  plan.Give(kListenFd, listener.get());
  plan.Give(kSecretFd, secret->get());
  plan.Give(kReadyFd, ready_w.get());
  if (iso.isolated) {
    plan.Give(kInfoFd, info_w.get());
    plan.Give(kSeccompFd, seccomp->get());
    plan.Give(kSandboxdFd, iso.sandboxd.get());
  }
  // An image sandbox's sbx-rootfs mounts its root as root, then becomes the host uid.
  plan.switch_user = iso.own_uids && sb.image_digest.empty();
  plan.uid = sb.host_uid;
  plan.gid = sb.host_uid;
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
        absl::UnavailableError(absl::StrCat("cannot start \"", argv[0], "\" for sandbox ", id, " (",
                                            plan.failed_step, "): ", sbx::ErrnoText(err))));
  }
  sb.pid = pid;
  sb.start_time = StartTime(pid);
  sb.pidfd.Reset(PidfdOpen(pid));

  // Ready when the daemon says so on the ready pipe. Wait on it, the info pipe (bwrap
  // names the sandbox's pid 1) and the pidfd (an early exit).
  const absl::Time deadline = absl::Now() + options.ready_timeout;
  std::string info_text;
  absl::Status failed;
  while (true) {
    const absl::Time now = absl::Now();
    if (now > deadline) {
      DrainOutput(sb, output_dropped);
      failed = absl::DeadlineExceededError(absl::StrCat("sandbox ", id, " was not serving within ",
                                                        absl::FormatDuration(options.ready_timeout),
                                                        ": ", Tail(log_path)));
      break;
    }
    if (!sb.pidfd.valid()) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        DrainOutput(sb, output_dropped);
        failed = Exited(sb, log_path, status);
        break;
      }
    }
    pollfd fds[4];
    nfds_t n = 0;
    int info_at = -1, pidfd_at = -1;
    fds[n++] = {ready_r.get(), POLLIN, 0};
    const int output_at = static_cast<int>(n);
    fds[n++] = {sb.output.get(), POLLIN, 0};
    if (info_r.valid()) {
      info_at = static_cast<int>(n);
      fds[n++] = {info_r.get(), POLLIN, 0};
    }
    if (sb.pidfd.valid()) {
      pidfd_at = static_cast<int>(n);
      fds[n++] = {sb.pidfd.get(), POLLIN, 0};
    }
    absl::Duration wait = std::min(deadline - now, absl::Seconds(1));
    if (!sb.pidfd.valid()) wait = std::min(wait, absl::Milliseconds(2));
    const timespec ts = absl::ToTimespec(std::max(wait, absl::ZeroDuration()));
    if (ppoll(fds, n, &ts, nullptr) < 0 && errno != EINTR) {
      failed = absl::InternalError(absl::StrCat("poll: ", sbx::ErrnoText(errno)));
      break;
    }
    if (info_at >= 0 && fds[info_at].revents != 0) ReadInfo(info_r, &info_text, &sb);
    if (fds[output_at].revents != 0) DrainOutput(sb, output_dropped);
    if (fds[0].revents != 0) {
      char byte;
      if (read(ready_r.get(), &byte, 1) == 1) break;
      // The write end closed without a byte: the daemon ended; the pidfd tells how.
    }
    if (pidfd_at >= 0 && fds[pidfd_at].revents != 0) {
      DrainOutput(sb, output_dropped);
      failed = Exited(sb, log_path, ReapIfChild(sb, /*block=*/false));
      break;
    }
  }
  // bwrap has written the info pipe before the daemon started.
  while (failed.ok() && info_r.valid() && ReadInfo(info_r, &info_text, &sb)) {
  }
  if (failed.ok() && iso.isolated && sb.init_pid <= 0) {
    failed = absl::InternalError(
        absl::StrCat("sandbox ", id, ": bubblewrap did not name the sandbox's pid 1"));
  }
  if (failed.ok() && !WriteState(sb)) {
    failed = absl::UnavailableError(
        absl::StrCat("sandbox ", id, ": cannot write its state file in ", sb.dir));
  }
  if (!failed.ok()) return fail(failed);
  return absl::OkStatus();
}

}  // namespace sbx::runtime::local
