#pragma once
// The seccomp filter of every local sandbox, made with libseccomp (the only file that sees
// it is seccomp_filter.cc) and exported as the BPF program bwrap loads (--seccomp) just
// before it starts the daemon: everything the daemon and the workload run is under it.
//
// Thread-safety: SeccompProgram keeps no state; it may run on any thread.
// Lifetime: the program is plain bytes, made once by Make() and kept in its Isolation.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <string>

#include "absl/status/statusor.h"

namespace sbx::runtime::local {

// The filter refuses (EPERM) what a sandboxed workload never needs and what has given
// kernels their escapes: mounts, ptrace and reading other processes' memory, keyrings,
// bpf, perf, kexec, modules, userfaultfd, file handles, io_uring, clocks, swap, reboot, new
// user namespaces (also refused by bwrap's --disable-userns), and TIOCSTI. clone3 answers
// ENOSYS (its flags cannot be inspected), so libc falls back to clone, whose flags can.
// Other architectures' system calls (e.g. int 0x80) kill the process.
// FAILED_PRECONDITION naming the libseccomp step that failed.
[[nodiscard]] absl::StatusOr<std::string> SeccompProgram();

}  // namespace sbx::runtime::local
