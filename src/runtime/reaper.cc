#include "src/runtime/reaper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/runtime/cgroups.h"
#include "src/runtime/image_root.h"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {
namespace {

namespace fs = std::filesystem;

// Bytes of a sandbox's output kept in each of its two log files.
constexpr int64_t kLogCapBytes = int64_t{1} << 20;

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

}  // namespace

std::vector<SandboxPtr> WaitForEnds(const std::vector<SandboxPtr>& sandboxes, int wake_fd,
                                    std::atomic<uint64_t>* dropped) {
  // A pidfd per sandbox, polled together with the output FIFOs and the wake fd (a 50 ms
  // scan of the start times where the kernel has no pidfd).
  std::vector<SandboxPtr> watched;
  std::vector<SandboxPtr> outputs;
  std::vector<pollfd> fds;
  bool scan = false;
  for (const SandboxPtr& sb : sandboxes) {
    if (sb->pidfd.valid()) {
      fds.push_back({sb->pidfd.get(), POLLIN, 0});
      watched.push_back(sb);
    } else {
      scan = true;
    }
  }
  if (scan) {
    for (const SandboxPtr& sb : sandboxes) {
      if (!sb->pidfd.valid()) watched.push_back(sb);
    }
  }
  for (const SandboxPtr& sb : sandboxes) {
    if (sb->output.valid() && !sb->output_ended.load(std::memory_order_relaxed)) {
      outputs.push_back(sb);
    }
  }
  const size_t first_output = fds.size();
  for (const SandboxPtr& sb : outputs) fds.push_back({sb->output.get(), POLLIN, 0});
  fds.push_back({wake_fd, POLLIN, 0});
  if (poll(fds.data(), fds.size(), scan ? 50 : -1) < 0 && errno != EINTR) {
    spdlog::error("local runtime reaper: poll: {}", sbx::ErrnoText(errno));
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (fds.back().revents != 0) {
    uint64_t count;
    [[maybe_unused]] ssize_t n = read(wake_fd, &count, sizeof(count));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (fds[first_output + i].revents != 0) DrainOutput(*outputs[i], dropped);
  }
  std::vector<SandboxPtr> gone;
  for (size_t i = 0; i < watched.size(); ++i) {
    Sandbox& sb = *watched[i];
    const bool ended = i < first_output && sb.pidfd.valid()
                           ? fds[i].revents != 0
                           : !sb.pidfd.valid() && !Alive(sb.pid, sb.start_time);
    if (ended) gone.push_back(watched[i]);
  }
  return gone;
}

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
  // An image sandbox's layer may hold folders it made unreadable (and overlayfs's work
  // folder is mode 0): RemoveTree opens them up first.
  if (!sb.dir.empty() && !RemoveTree(sb.dir)) {
    spdlog::warn("sandbox {}: its host folder {} could not be removed entirely", sb.id, sb.dir);
  }
}

}  // namespace sbx::runtime::local
