#pragma once
// Starting a local sandbox: the host uids of sandboxes (UidPool, when sbx is root), the
// raw spawn of a detached process (SpawnDetached: clone(CLONE_VM | CLONE_VFORK), its own
// session, no_new_privs, the host uid, exactly the descriptors it is given), and
// SpawnSandbox, which makes the sandbox's host folder, socket, output FIFO, cgroups and
// pipes, starts it and waits until its daemon serves.
//
// Thread-safety: UidPool is thread-safe. SpawnDetached and SpawnSandbox may run on any
// thread, each on its own plan and sandbox (the runtime's workers start sandboxes side by
// side).
// Lifetime: a spawned sandbox is detached from sbx: it outlives the caller, the runtime and
// the process; its record (Sandbox) goes to the runtime's table.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/runtime/cgroups.h"
#include "src/runtime/local_sandbox.h"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {

// The host uids of running sandboxes and of those being made, from
// [base, base + count) (own_uids: sbx is root; otherwise every sandbox has sbx's uid and
// GiveBack does nothing).
class UidPool {
 public:
  UidPool(uint32_t base, uint32_t count, bool own_uids)
      : base_(base), count_(count), own_uids_(own_uids) {}

  // A host uid no running sandbox has, or RESOURCE_EXHAUSTED when all are taken.
  [[nodiscard]] absl::StatusOr<uid_t> Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `uid` as taken (an adopted sandbox's).
  void Hold(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives `uid` back once its sandbox is gone.
  void GiveBack(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint32_t base_;
  const uint32_t count_;
  const bool own_uids_;
  absl::Mutex mu_;
  absl::flat_hash_set<uid_t> uids_ ABSL_GUARDED_BY(mu_);
};

// What the child of SpawnDetached does between clone and exec, prepared by the parent
// (the child may not allocate).
struct SpawnPlan {
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  // The cgroups to join: each one's `tasks` file (cgroup v1), written with "0" by the
  // child, a single thread then (see SpawnChild).
  const std::vector<std::string>* cgroup_tasks = nullptr;
  const char* cwd = "/";  // the sandbox's host folder
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

// Starts plan.argv as a new process in its own session, detached from sbx. Returns the pid
// (check plan.error: the child could not exec, plan.failed_step says where) or -1 with
// errno.
pid_t SpawnDetached(SpawnPlan& plan);

// A pipe whose read end holds `content` (the write end is closed): what bwrap and the
// daemon read to its end. UNAVAILABLE when the pipe cannot be made or written, INTERNAL
// when the content does not fit its buffer (64 KiB).
[[nodiscard]] absl::StatusOr<Fd> PipeWith(const std::string& content);

// Starts sandbox `sb` (id, pool, dir and host_uid set) as `argv` (SandboxArgv) and waits
// until its daemon serves: makes its host folder (mode 0700), binds the daemon's socket
// there, makes its cgroups (MakeCgroups) and output FIFO, spawns it with its secret
// (options.secret_for) and seccomp filter, and writes its state file. On success `sb`
// holds its endpoint, processes, cgroups and output. On failure whatever was made is
// killed and removed (KillSandbox), and the error says why: UNAVAILABLE (a file, socket or
// pipe could not be made, or the sandbox exited while starting, with its last output),
// DEADLINE_EXCEEDED (not serving within options.ready_timeout), INTERNAL.
[[nodiscard]] absl::Status SpawnSandbox(Sandbox& sb, const LocalSpec& spec,
                                        const std::vector<std::string>& argv,
                                        const BubblewrapRuntimeOptions& options,
                                        const Isolation& iso, const Cgroups& cgroups,
                                        std::atomic<uint64_t>* output_dropped);

}  // namespace sbx::runtime::local
