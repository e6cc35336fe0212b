#pragma once
// Whether another thread of this process is blocked in a waiting system call, from Linux's
// /proc/self/task/<tid>/syscall: for tests that must act only once a thread waits (a Cancel
// of a blocked read) and have no other marker of it. Instead of "sleep and hope it blocked
// by then".

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <initializer_list>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sbx::k8s::testing {

// The calling thread's id, for AwaitBlocked from another thread.
inline pid_t ThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Polls (at most `timeout`) until thread `tid` sits in one of `calls` (system call
// numbers); false if it never did.
inline bool AwaitBlocked(pid_t tid, std::initializer_list<long> calls,
                         absl::Duration timeout = absl::Seconds(20)) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/syscall";
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream file(path);
    long number = -1;
    if (file >> number) {  // "running" does not parse: not in a system call
      for (long call : calls) {
        if (number == call) return true;
      }
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// The system calls a read waits in: the socket transport's poll, and the futex of a
// condition variable (cpprest's tasks).
inline constexpr std::initializer_list<long> kPollCalls = {SYS_poll, SYS_ppoll};
inline constexpr std::initializer_list<long> kWaitCalls = {SYS_poll, SYS_ppoll, SYS_futex,
                                                           SYS_epoll_wait, SYS_epoll_pwait};

}  // namespace sbx::k8s::testing
