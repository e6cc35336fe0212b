#include "src/runtime/proc.h"

#include <fcntl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sbx::runtime::local {

namespace fs = std::filesystem;

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

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

// Not std::ifstream: libstdc++'s filebuf throws when read(2) fails, as it does with ESRCH
// for /proc/<pid>/ files of a process that exits while it is read.
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

int OpenInDir(const std::string& dir, const char* name, int flags, mode_t mode) {
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return -1;
  const int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
  const int err = errno;
  close(dfd);
  errno = err;
  return fd;
}

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

std::string ProcessCwd(pid_t pid) {
  std::error_code ec;
  const fs::path cwd = fs::read_symlink(absl::StrCat("/proc/", pid, "/cwd"), ec);
  return ec ? std::string() : cwd.string();
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return "unknown status";
}

}  // namespace sbx::runtime::local
