#include "src/sandboxd/child_reaper.h"

#include <sys/wait.h>

#include <cerrno>
#include <thread>
#include <utility>

namespace sbx::sandboxd {

ChildReaper& ChildReaper::Get() {
  static ChildReaper* reaper = new ChildReaper();  // never destroyed: its thread never ends
  return *reaper;
}

ChildReaper::ChildReaper() {
  std::thread([this] { Loop(); }).detach();
}

pid_t ChildReaper::Spawn(const std::function<pid_t()>& spawn_fn, std::function<void(int)> on_exit) {
  absl::MutexLock lock(&mu_);
  const pid_t pid = spawn_fn();
  if (pid > 0) {
    waiting_[pid] = std::move(on_exit);
    ++spawns_;
    spawned_.SignalAll();
  }
  return pid;
}

void ChildReaper::Loop() {
  for (;;) {
    uint64_t seen = 0;
    {
      absl::MutexLock lock(&mu_);
      seen = spawns_;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, __WALL);
    if (pid > 0) {
      std::function<void(int)> on_exit;
      {
        absl::MutexLock lock(&mu_);
        auto it = waiting_.find(pid);
        if (it != waiting_.end()) {
          on_exit = std::move(it->second);
          waiting_.erase(it);
        }
      }
      if (on_exit) on_exit(status);
      continue;
    }
    if (errno == EINTR) continue;
    // ECHILD: no children at all; sleep until the next spawn.
    absl::MutexLock lock(&mu_);
    while (spawns_ == seen) spawned_.Wait(&mu_);
  }
}

}  // namespace sbx::sandboxd
