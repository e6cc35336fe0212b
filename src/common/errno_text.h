#pragma once
// The text of an errno value or a signal number, safe to call from any thread: what
// strerror(3) and strsignal(3) give, without their shared buffer (which another thread's
// call may overwrite while this one reads it; clang-tidy's concurrency-mt-unsafe).
//
// Thread-safety: free functions without shared state. Not async-signal-safe (they
// allocate): a forked child before exec must not call them.
//
// Header-only, so that every binary may use it, also the ones that link nothing of
// sbx::common (sbx-rootfs, sbx::sandbox_secret).

#include <string.h>

#include <string>
#include <type_traits>

namespace sbx {

// "No such file or directory" for ENOENT; "Unknown error N" for a number the C library
// does not know.
inline std::string ErrnoText(int errnum) {
  // glibc's GNU strerror_r (g++ and clang++ define _GNU_SOURCE): it returns the message,
  // either a static string or written into `buf`. The XSI form returns an int instead.
  static_assert(std::is_same_v<decltype(::strerror_r(0, nullptr, 0)), char*>,
                "sbx needs the GNU strerror_r (glibc with _GNU_SOURCE)");
  char buf[256];
  return std::string(::strerror_r(errnum, buf, sizeof(buf)));
}

// "Killed" for SIGKILL; "Unknown signal N" for a number the C library does not know.
inline std::string SignalText(int signal) {
  // glibc 2.32's sigdescr_np reads a constant table (strsignal formats unknown numbers
  // into a buffer shared by the threads).
  const char* text = ::sigdescr_np(signal);
  return text != nullptr ? std::string(text) : "Unknown signal " + std::to_string(signal);
}

}  // namespace sbx
