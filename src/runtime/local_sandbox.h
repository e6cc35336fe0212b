#pragma once
// The local runtime's record of one sandbox (Sandbox), what Make() found out about
// isolation (Isolation), and the names every room agrees on: the files of a sandbox's
// host folder and the descriptors its first process gets. The rooms that deal with
// sandboxes include this header, and it includes no room but proc.h (for Fd), so the rooms
// have no cycle.
//
// Thread-safety: a Sandbox's fields are fixed once it is in the runtime's table, except
// those guarded by its op_mu or log_mu and its atomics (each says why). An Isolation is
// fixed after Make() and read from any thread.
// Lifetime: a Sandbox is shared (SandboxPtr) by the runtime's table, the worker doing an
// operation on it and the reaper; it closes its descriptors when the last one lets go.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {

// A sandbox's id is kIdPrefix and 16 random characters; its host folder is root_dir/<id>.
inline constexpr char kIdPrefix[] = "lb-";
// The files of a sandbox's host folder.
inline constexpr char kSocketName[] = "sandboxd.sock";
inline constexpr char kStateName[] = "state.json";
inline constexpr char kLogName[] = "sandboxd.log";
// The log's previous part, kept when the log reaches its cap (see DrainOutput).
inline constexpr char kOldLogName[] = "sandboxd.log.1";
// A FIFO: the standard output and error of bwrap (the sandbox's pid 1 holds them) and of
// the daemon. The runtime reads it into the log; see DrainOutput.
inline constexpr char kOutputName[] = "output";

// The descriptors the sandbox's first process gets (see SpawnPlan::fds).
inline constexpr int kInfoFd = 3;      // bwrap's --info-fd: the host pid of the sandbox's pid 1
inline constexpr int kListenFd = 4;    // the daemon's listening socket
inline constexpr int kSecretFd = 5;    // a pipe holding the daemon's secret
inline constexpr int kReadyFd = 6;     // the daemon writes a byte here once serving
inline constexpr int kSeccompFd = 7;   // bwrap's --seccomp: the filter's BPF program
inline constexpr int kSandboxdFd = 8;  // bwrap's --ro-bind-fd: the daemon's binary (O_PATH)

// What the sandbox's first process finds in its environment (bwrap, or the daemon in the
// plain fallback): nothing of sbx's own.
inline constexpr char kPathEnv[] =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// How long a kill, freeze or thaw may take before the runtime gives up waiting.
inline constexpr absl::Duration kSettleTimeout = absl::Seconds(10);

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
  // The digest of its image (held in the image cache while it lives); empty: the host's
  // root.
  std::string image_digest;
  // The snapshot it started at (a fork, a reset, a member of a snapshot's pool), whose files
  // it shares read-only under its own layers (an image sandbox only; held by the runtime
  // while it lives); empty: none. In the state file.
  std::string snapshot;
  // The template it was started from (CreateRequest's name and spec), kept so that Reset
  // can start it again, also in the state file (a sandbox adopted from a run that did not
  // keep it, or whose spec was too long to keep, has none).
  std::string template_name;
  std::string template_spec;
  bool has_template = false;
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
  // The daemon's loader ("ld.so") and shared libraries as (host path, file name)
  // (DaemonLibraries); empty for a static daemon. Copied into daemon_lib_dir, which image
  // sandboxes see at /run/sbx/lib.
  std::vector<std::pair<std::string, std::string>> daemon_libs;
  std::string daemon_lib_dir;
};

}  // namespace sbx::runtime::local
