#pragma once
// Processes that outlive the call that starts them (sandboxd.proto, "Processes"):
// ProcessTable (ids, tags, limits, eviction of ended entries) and Process (one command:
// spawn on pipes or a pseudo-terminal, its replay ring, its readers, input, signals,
// window size and waiters).
//
// Threads: every process has its own thread, which spawns it and then polls its output
// (pipes or the PTY master), its input and an eventfd; all I/O with the process happens
// there, never on a gRPC thread. Output is never held back: it goes into the process's
// OutputRing, which drops the oldest bytes beyond its size, so a process is never slowed
// by its readers and the daemon's memory stays bounded by the rings' sizes. Requests from
// other threads (input, signals, resize, kill) are queued under the process's mutex and
// the eventfd wakes its thread. Readers (ProcessReader) and waiters are called on that
// thread, never with a lock held.
//
// Locks: ProcessTable::mu_ may be held while taking a Process's mu_, never the reverse;
// a Process calls into its table only without its own lock.
//
// Lifetime: Process objects are shared (table, thread, readers, RPCs); the table must
// outlive every process thread (its destructor kills and joins them). Readers are held
// by the processes they are attached to until they Detach.

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/sandboxd/output_ring.h"
#include "src/sandboxd/runner_threads.h"
#include "src/sandboxd/unique_fd.h"
#include "src/sandboxd/workspace.h"

namespace sbx::sandboxd {

// What to start. Validated by the caller (the service); the process checks only what
// needs the filesystem (cwd, argv[0]) or the kernel (a PTY).
struct ProcessSpec {
  std::vector<std::string> argv;
  // The complete environment (with TERM for a PTY).
  std::map<std::string, std::string> env;
  // Relative to the workspace; empty: default_cwd, else the workspace.
  std::string cwd;
  // Absolute, as this daemon sees it; used when cwd is empty. Empty: the workspace.
  std::string default_cwd;
  // Empty: none.
  std::string tag;
  // True: a new pseudo-terminal of cols x rows is the process's stdin, stdout, stderr and
  // controlling terminal.
  bool pty = false;
  uint16_t cols = 80;
  uint16_t rows = 24;
  // Without a PTY: true makes stdin a pipe (WriteInput), false /dev/null.
  bool stdin = false;
  // The replay ring's size, 1 or more.
  int64_t replay_bytes = 1 << 20;
};

// The limits of a table; a start beyond one is RESOURCE_EXHAUSTED naming it.
struct ProcessLimits {
  // Processes running or starting at once. Also the number of ended entries kept.
  int max_processes = 64;
  // PTY processes running or starting at once.
  int max_ptys = 16;
  // Bytes the replay rings may hold together: a running process counts its ring's size,
  // an ended one what its ring still holds.
  int64_t max_replay_bytes = int64_t{64} << 20;
};

// How a process ended.
struct ProcessExitInfo {
  // Exactly one of exit_code (>= 0) and signal (> 0) is set; the other is -1 / 0.
  int exit_code = -1;
  int signal = 0;
  absl::Time ended_at;
  absl::Duration duration;
  int64_t output_bytes = 0;
  int64_t dropped_bytes = 0;
};

// A snapshot of one process, for listings.
struct ProcessStatus {
  pid_t pid = 0;
  std::string tag;
  std::vector<std::string> argv;
  std::string cwd;
  bool pty = false;
  uint16_t cols = 0;
  uint16_t rows = 0;
  bool stdin_open = false;
  absl::Time started_at;
  std::optional<ProcessExitInfo> exit;
  int readers = 0;
  int64_t output_bytes = 0;
  int64_t dropped_bytes = 0;
  int64_t buffered_bytes = 0;
  int64_t replay_bytes = 0;
};

// A reader of a process's output (a ConnectProcess stream).
class ProcessReader {
 public:
  virtual ~ProcessReader() = default;
  // There is something new to take with Process::Next (output, or the end). Called on
  // the process's thread (or by Attach), without locks of the process held; must be
  // quick. Spurious calls are allowed.
  virtual void OnProcessUpdate() = 0;
};

// One event for a reader (Process::Next).
struct ProcessOutput {
  enum class Kind { kNone, kData, kDropped, kExit };
  Kind kind = Kind::kNone;
  // kData: 1 byte to max_bytes of one stream, ending at offset `end` of the output.
  OutputStream stream = OutputStream::kStdout;
  std::string data;
  int64_t end = 0;
  // kDropped: bytes the reader missed.
  int64_t dropped = 0;
  // kExit.
  ProcessExitInfo exit;
};

class ProcessTable;

class Process : public std::enable_shared_from_this<Process> {
 public:
  // Bytes of input waiting for the process at most (WriteInput), and writes waiting.
  static constexpr int64_t kMaxPendingInputBytes = 4 << 20;
  static constexpr size_t kMaxPendingInputWrites = 1024;

  Process(ProcessTable* table, uint64_t serial, ProcessSpec spec, const Workspace* workspace,
          absl::Duration drain_grace);
  ~Process();

  // Constant once the process runs (before anyone can find it).
  pid_t pid() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& tag() const { return spec_.tag; }
  bool pty() const { return spec_.pty; }
  absl::Time started_at() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t serial() const { return serial_; }

  // Attaches `reader` where the last reader left (or, while others are attached, where
  // the furthest behind of them is): it first gets the bytes dropped since (a gap) and
  // the ring's bytes from there, then every later byte unless it falls more than the
  // ring's size behind. Then calls reader->OnProcessUpdate().
  void Attach(std::shared_ptr<ProcessReader> reader) ABSL_LOCKS_EXCLUDED(mu_);
  // Detaches `reader` (no more calls to it once this returns, except one already under
  // way). The ring keeps what no remaining reader has been sent.
  void Detach(const ProcessReader* reader) ABSL_LOCKS_EXCLUDED(mu_);
  // The next event for `reader`: a gap (kDropped), output (kData, at most max_bytes),
  // the end (kExit, once, after all output) or nothing now (kNone; OnProcessUpdate
  // follows when there is).
  ProcessOutput Next(const ProcessReader* reader, size_t max_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The output Next gave `reader` up to `offset` (ProcessOutput::end) has reached it (its
  // write completed). Only delivered output leaves the ring; what a reader was given but
  // did not get (it left meanwhile) is replayed to the next one.
  void Delivered(const ProcessReader* reader, int64_t offset) ABSL_LOCKS_EXCLUDED(mu_);

  // Queues `data` for the process's stdin (its pipe, or the terminal); `done(OK)` runs
  // once all of it was written, `done(FAILED_PRECONDITION)` if the process closes its
  // stdin or ends first. Errors (then `done` is not called): FAILED_PRECONDITION
  // (started without stdin, stdin closed, ended), RESOURCE_EXHAUSTED (too much input
  // waiting).
  [[nodiscard]] absl::Status WriteInput(std::string data,
                                        absl::AnyInvocable<void(absl::Status) &&> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Closes stdin once the queued input is written. FAILED_PRECONDITION for a PTY, a
  // process without stdin, or one that has ended. Idempotent otherwise.
  [[nodiscard]] absl::Status CloseInput() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `signal` to the process group. FAILED_PRECONDITION once it has ended.
  [[nodiscard]] absl::Status Signal(int signal) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets a PTY's window size, before any input queued later is written.
  // FAILED_PRECONDITION without a PTY or once ended.
  [[nodiscard]] absl::Status Resize(uint16_t cols, uint16_t rows) ABSL_LOCKS_EXCLUDED(mu_);
  // SIGKILLs the process group (shutdown); before the spawn, prevents it.
  void Kill() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `done(exit)` once the process has ended: at once (on this thread) if it has,
  // else on the process's thread. Returns an id for CancelWait (0 when run at once).
  uint64_t Wait(absl::AnyInvocable<void(const ProcessExitInfo&) &&> done) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a waiter that has not been called yet.
  void CancelWait(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  bool ended() const ABSL_LOCKS_EXCLUDED(mu_);
  ProcessStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);
  // What it counts against the table's max_replay_bytes.
  int64_t ReplayReservation() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class ProcessTable;

  // Attach without the OnProcessUpdate call (for the table, under its lock).
  void AttachQuietly(std::shared_ptr<ProcessReader> reader) ABSL_LOCKS_EXCLUDED(mu_);

  struct ReaderState {
    std::shared_ptr<ProcessReader> reader;
    // Output up to `cursor` was given to the reader, up to `delivered` reached it.
    int64_t cursor = 0;
    int64_t delivered = 0;
    bool exit_sent = false;
  };
  struct InputWrite {
    std::string data;
    size_t written = 0;
    absl::AnyInvocable<void(absl::Status) &&> done;
  };

  // The thread's body: spawn, report (on_started), pump until the process has ended.
  void Run(absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<Process>>) &&> on_started)
      ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status Spawn() ABSL_LOCKS_EXCLUDED(mu_);
  ProcessExitInfo Pump() ABSL_LOCKS_EXCLUDED(mu_);
  void Wake();
  void OnReaped(int wait_status) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends output and tells the readers.
  void Output(OutputStream stream, std::string data) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops from the ring what every attached reader has got.
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the input: fails every queued write with `why` (called outside the lock by the
  // caller: the callbacks are returned).
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> CloseInputLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status EndedError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ProcessTable* const table_;
  const uint64_t serial_;
  const ProcessSpec spec_;
  const Workspace* const workspace_;
  const absl::Duration drain_grace_;
  UniqueFd wake_fd_;

  // Owned by the process's thread.
  UniqueFd in_fd_, out_fd_, err_fd_;
  // The PTY master: read and written by the thread; its window size is set there too.
  UniqueFd master_fd_;
  std::optional<InputWrite> writing_;

  mutable absl::Mutex mu_;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time started_at_ ABSL_GUARDED_BY(mu_);
  OutputRing ring_ ABSL_GUARDED_BY(mu_);
  std::vector<ReaderState> readers_ ABSL_GUARDED_BY(mu_);
  // Where a reader attaching while none is starts: where the last one left (0 before
  // any). Below ring_.start() when output was dropped meanwhile: the reader is told.
  int64_t replay_from_ ABSL_GUARDED_BY(mu_) = 0;
  // Input: open while writes are accepted.
  bool input_open_ ABSL_GUARDED_BY(mu_) = false;
  bool close_input_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<InputWrite> input_ ABSL_GUARDED_BY(mu_);
  // Bytes queued and not yet written (also those of writing_).
  int64_t input_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> signals_ ABSL_GUARDED_BY(mu_);
  uint16_t cols_ ABSL_GUARDED_BY(mu_) = 0;
  uint16_t rows_ ABSL_GUARDED_BY(mu_) = 0;
  bool resize_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool kill_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool reaped_ ABSL_GUARDED_BY(mu_) = false;
  int wait_status_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  ProcessExitInfo exit_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, absl::AnyInvocable<void(const ProcessExitInfo&) &&>> waiters_
      ABSL_GUARDED_BY(mu_);
};

class ProcessTable {
 public:
  // `ceilings`: the table's own limits; a start's limits are lowered to them.
  ProcessTable(const Workspace* workspace, ProcessLimits ceilings, absl::Duration drain_grace);
  // Kills and joins whatever still runs.
  ~ProcessTable();

  // Starts `spec` on a new thread. Checks `limits` (each 0 or above the ceiling: the
  // ceiling), evicting the oldest ended entries when their replay bytes or `spec.tag`
  // are needed. `reader`, if given, is attached before any output is read.
  // `on_started` runs on the process's thread once the process runs, or with the
  // reason it could not start (NOT_FOUND / FAILED_PRECONDITION: cwd, argv[0], PTY).
  // Errors (then `on_started` is not called): ALREADY_EXISTS (a running process has
  // the tag), RESOURCE_EXHAUSTED naming the limit, UNAVAILABLE after KillAll.
  [[nodiscard]] absl::Status Start(
      ProcessSpec spec, const ProcessLimits& limits, std::shared_ptr<ProcessReader> reader,
      absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<Process>>) &&> on_started)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A running or ended process by pid or tag. NOT_FOUND naming it.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Process>> FindPid(pid_t pid) const
      ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Process>> FindTag(const std::string& tag) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every process that has started, oldest first.
  std::vector<std::shared_ptr<Process>> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Refuses new processes and kills the running ones.
  void KillAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every process thread has ended.
  void JoinAll() ABSL_LOCKS_EXCLUDED(mu_);
  // Processes running or starting.
  int running() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Process;

  // From a process's thread: it runs as `pid` (replacing an entry that had the pid).
  void Started(uint64_t serial, pid_t pid) ABSL_LOCKS_EXCLUDED(mu_);
  // From a process's thread: it could not start; forget it.
  void StartFailed(uint64_t serial) ABSL_LOCKS_EXCLUDED(mu_);
  // From a process's thread: its last act (the thread can be joined quickly).
  void Finished(uint64_t serial) ABSL_LOCKS_EXCLUDED(mu_);
  void EraseLocked(uint64_t serial) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the oldest ended entry; false if there is none.
  bool EvictOldestEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Workspace* const workspace_;
  const ProcessLimits ceilings_;
  const absl::Duration drain_grace_;

  mutable absl::Mutex mu_;
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
  // The table, by serial (= age): starting, running and kept ended processes.
  std::map<uint64_t, std::shared_ptr<Process>> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<pid_t, uint64_t> by_pid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> by_tag_ ABSL_GUARDED_BY(mu_);
  // Every process whose thread is not joined yet, by serial (evicted entries too).
  // Declared last: destroyed first, after the owner has joined every thread.
  RunnerThreads<Process> threads_;
};

}  // namespace sbx::sandboxd
