#pragma once
// Running commands: ExecRunner (one command: spawn, pipes, timeout, signals) and
// ExecManager (the concurrency limit and the runner threads). Their children are reaped by
// the ChildReaper (child_reaper.h).
//
// Threads: every command gets its own runner thread, which spawns the process and then
// polls its stdout/stderr/stdin pipes and an eventfd; all I/O with the process happens
// there, never on a gRPC thread. Results go to an ExecSink, called only from the runner
// thread, one call at a time. Requests from other threads (stdin, signals, kill) are queued
// under the runner's mutex and the eventfd wakes the thread.
//
// Processes: each command runs in a new session and process group (setsid), so signals,
// timeouts and cancels reach everything it started. The ChildReaper thread reaps every
// child of the process (also orphans re-parented to sandboxd when it is a subreaper), so
// no zombie is left behind; it assumes no other code of the process waits for children.
//
// Lifetime: a runner is shared (std::shared_ptr) between the manager, its thread, the
// reaper callback and the caller; ExecManager::JoinAll waits for every runner thread.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/sandboxd/runner_threads.h"
#include "src/sandboxd/unique_fd.h"
#include "src/sandboxd/workspace.h"

namespace sbx::sandboxd {

// What to run. Validated by the caller (the service); the runner checks only what needs
// the filesystem (cwd, argv[0]).
struct ExecSpec {
  std::vector<std::string> argv;
  // The complete environment of the command.
  std::map<std::string, std::string> env;
  // Relative to the workspace; empty: default_cwd, else the workspace.
  std::string cwd;
  // Absolute, as this daemon sees it (a sandbox image's WorkingDir); used when cwd is
  // empty. Empty: the workspace.
  std::string default_cwd;
  // Zero: no limit.
  absl::Duration timeout = absl::ZeroDuration();
  // Per stream.
  int64_t max_output_bytes = 1 << 20;
  // False: stdin is /dev/null.
  bool attach_stdin = false;
};

struct ExecResult {
  // Exactly one of exit_code (>= 0) and signal (> 0) is set; the other is -1 / 0.
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  bool truncated = false;
  int64_t stdout_bytes = 0;
  int64_t stderr_bytes = 0;
  absl::Duration duration;
};

// Receives the events of one command, on its runner thread, in this order: OnStarted,
// then OnOutput / OnStdinWritable any number of times, then OnExit; or only OnStartFailed.
// After OnExit or OnStartFailed the runner never calls the sink again.
class ExecSink {
 public:
  virtual ~ExecSink() = default;
  virtual void OnStarted(pid_t pid, absl::Time started_at) = 0;
  // A chunk (at most 64 KiB) of stdout or stderr. The sink must report the bytes as
  // consumed (ExecRunner::OutputConsumed) once they are on their way, or the runner stops
  // reading the pipes when 256 KiB are outstanding.
  virtual void OnOutput(bool is_stderr, std::string data) = 0;
  // The stdin buffer, which WriteStdin reported full, has room again.
  virtual void OnStdinWritable() = 0;
  virtual void OnExit(const ExecResult& result) = 0;
  // FAILED_PRECONDITION (argv[0] not found or not executable), NOT_FOUND (cwd), ...
  virtual void OnStartFailed(absl::Status status) = 0;
};

class ExecManager;

// One command. Methods other than Run may be called from any thread, before, during or
// after the run (they are ignored once the command has ended).
class ExecRunner : public std::enable_shared_from_this<ExecRunner> {
 public:
  // Above this many bytes of buffered stdin WriteStdin asks the caller to pause.
  static constexpr size_t kMaxBufferedStdin = 1 << 20;
  // The runner stops reading output pipes while this many bytes are not yet consumed.
  static constexpr int64_t kMaxOutstandingOutput = 256 << 10;

  ExecRunner(ExecSpec spec, const Workspace* workspace, ExecSink* sink, absl::Duration drain_grace);
  ~ExecRunner();

  // Buffers `data` for the process's stdin. Returns false when the buffer is now full:
  // the caller should stop producing until ExecSink::OnStdinWritable.
  bool WriteStdin(std::string data) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes stdin once the buffered bytes are written.
  void CloseStdin() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `signal` to the process group.
  void Signal(int signal) ABSL_LOCKS_EXCLUDED(mu_);
  // SIGKILLs the process group (cancel, shutdown).
  void Kill() ABSL_LOCKS_EXCLUDED(mu_);
  // `bytes` of output handed to OnOutput have been sent.
  void OutputConsumed(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class ExecManager;

  // The runner thread's body: spawn, then pump until the command has ended. `on_ended`
  // runs just before the sink's last call (so a slot is free when the client hears).
  void Run(const std::function<void()>& on_ended) ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status Spawn() ABSL_LOCKS_EXCLUDED(mu_);
  ExecResult Pump() ABSL_LOCKS_EXCLUDED(mu_);
  void Wake();
  void OnReaped(int wait_status) ABSL_LOCKS_EXCLUDED(mu_);

  const ExecSpec spec_;
  const Workspace* const workspace_;
  ExecSink* const sink_;
  const absl::Duration drain_grace_;
  // Wakes the runner thread (counter semantics; the runner drains it).
  UniqueFd wake_fd_;

  // Owned by the runner thread.
  pid_t pid_ = -1;
  UniqueFd stdin_fd_, stdout_fd_, stderr_fd_;
  absl::Time started_at_;

  absl::Mutex mu_;
  std::string stdin_buffer_ ABSL_GUARDED_BY(mu_);
  // Bytes accepted by WriteStdin and not yet written to the pipe (or dropped).
  size_t stdin_backlog_ ABSL_GUARDED_BY(mu_) = 0;
  bool stdin_close_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stdin_paused_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> signals_ ABSL_GUARDED_BY(mu_);
  bool kill_requested_ ABSL_GUARDED_BY(mu_) = false;
  int64_t outstanding_output_ ABSL_GUARDED_BY(mu_) = 0;
  bool reaped_ ABSL_GUARDED_BY(mu_) = false;
  int wait_status_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// Starts runners within the concurrency limit and owns their threads.
class ExecManager {
 public:
  ExecManager(const Workspace* workspace, int max_concurrent, absl::Duration drain_grace);
  // Kills and joins whatever still runs.
  ~ExecManager();

  // Starts `spec` on a new runner thread reporting to `sink`. RESOURCE_EXHAUSTED when
  // max_concurrent commands run; UNAVAILABLE after KillAll.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<ExecRunner>> Start(ExecSpec spec, ExecSink* sink)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses new commands and kills the running ones.
  void KillAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every runner thread has ended.
  void JoinAll() ABSL_LOCKS_EXCLUDED(mu_);
  int running() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Finished(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  const Workspace* const workspace_;
  const int max_concurrent_;
  const absl::Duration drain_grace_;
  mutable absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Declared last: destroyed first, after ~ExecManager has joined every thread.
  RunnerThreads<ExecRunner> threads_;
};

}  // namespace sbx::sandboxd
