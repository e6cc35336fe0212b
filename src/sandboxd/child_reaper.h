#pragma once
// ChildReaper: the one waitpid loop of sandboxd. Every child of the process (commands of
// ExecRunner, children of spawn.h, orphans re-parented to sandboxd when it is a subreaper)
// is reaped by its thread, so no zombie is left behind; it assumes no other code of the
// process waits for children.
//
// Thread-safety: Spawn may be called from any thread. Lifetime: one per process, started
// on first use and never destroyed (its thread never ends).

#include <sys/types.h>

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace sbx::sandboxd {

// The process-wide reaper: a thread blocked in waitpid(-1) that hands each child's exit
// status to the callback registered at its spawn (children nobody registered, i.e.
// re-parented orphans, are just reaped).
class ChildReaper {
 public:
  // The reaper, started on first use; never destroyed.
  static ChildReaper& Get();

  // Calls `spawn_fn` (which starts a child, with posix_spawn or fork, and returns its pid
  // or -1) with the reaper's lock held, so the child is registered before it can be
  // reaped. A forked child must only exec or _exit. `on_exit(wait_status)` runs on the
  // reaper thread once the child has been reaped; it must be quick.
  pid_t Spawn(const std::function<pid_t()>& spawn_fn, std::function<void(int)> on_exit)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ChildReaper();
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::CondVar spawned_;
  absl::flat_hash_map<pid_t, std::function<void(int)>> waiting_ ABSL_GUARDED_BY(mu_);
  // Bumped by every Spawn so that the loop, finding no children, knows when to retry.
  uint64_t spawns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sbx::sandboxd
