#pragma once
// The local runtime's view of the kernel: a descriptor owner (Fd), pidfds, what /proc says
// about a process (state, parent, start time, uid, working folder), process trees, small
// files read and written without exceptions, and files opened in a folder without following
// symbolic links (OpenInDir).
//
// Thread-safety: every function may be called from any thread; none keeps state. An Fd is
// one owner's, like a unique_ptr.
// Lifetime: nothing here outlives the call but the descriptors an Fd owns (closed with it).
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sbx::runtime::local {

// waitid()'s P_PIDFD (Linux 5.4); glibc 2.36's idtype_t does not name it.
inline constexpr idtype_t kPidfdIdType = static_cast<idtype_t>(3);

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

// A pidfd on `pid`, or -1 (where the kernel has no pidfd_open, or the process is gone).
int PidfdOpen(pid_t pid);

// What /proc/<pid>/stat says about a process.
struct ProcStat {
  char state = '?';
  pid_t ppid = 0;
  // Field 22: clock ticks after boot when the process started. With the pid it names one
  // process for the machine's uptime (a recycled pid has another start time).
  uint64_t start_time = 0;
};

// /proc/<pid>/stat, or nullopt when the process is gone or the file is not understood.
std::optional<ProcStat> ReadStat(pid_t pid);

// Whether `pid` is still the process that started at `start_time` and has not exited.
bool Alive(pid_t pid, uint64_t start_time);

// The start time of `pid` (ProcStat::start_time), 0 when it is gone.
uint64_t StartTime(pid_t pid);

// Writes `value` to an existing file (a cgroup's control file); false on any error.
bool WriteFile(const std::string& path, const std::string& value);

// The content of `path`, or what was read before an error.
std::string ReadSmallFile(const std::string& path);

// Opens `name` in the folder `dir` without following a symbolic link at either step;
// -1 with errno otherwise.
int OpenInDir(const std::string& dir, const char* name, int flags, mode_t mode = 0);

// `root` and every process below it (by parent pid, from one scan of /proc).
std::vector<pid_t> ProcessTree(pid_t root);

// The real uid of process `pid` (from the kernel's /proc), or -1.
int64_t ProcessUid(pid_t pid);

// The working directory of process `pid`, or empty.
std::string ProcessCwd(pid_t pid);

// "exit code N", "signal N" or "unknown status", for a wait status.
std::string DescribeExit(int status);

}  // namespace sbx::runtime::local
