#include "src/sandboxd/process_table.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/sandboxd/exec.h"
#include "src/sandboxd/spawn.h"

namespace sbx::sandboxd {
namespace {

constexpr size_t kChunkBytes = 64 << 10;

void SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void SetWindowSize(int fd, uint16_t cols, uint16_t rows) {
  struct winsize ws = {};
  ws.ws_col = cols;
  ws.ws_row = rows;
  // Cannot fail on a PTY master short of a closed descriptor (the terminal is gone).
  ::ioctl(fd, TIOCSWINSZ, &ws);
}

std::string Describe(const ProcessSpec& spec, pid_t pid) {
  return spec.tag.empty() ? absl::StrCat("process ", pid)
                          : absl::StrCat("process ", pid, " (tag \"", spec.tag, "\")");
}

}  // namespace

// ---- Process ----

Process::Process(ProcessTable* table, uint64_t serial, ProcessSpec spec, const Workspace* workspace,
                 absl::Duration drain_grace)
    : table_(table),
      serial_(serial),
      spec_(std::move(spec)),
      workspace_(workspace),
      drain_grace_(drain_grace),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      ring_(spec_.replay_bytes) {
  absl::MutexLock lock(&mu_);
  cols_ = spec_.cols;
  rows_ = spec_.rows;
}

Process::~Process() = default;

pid_t Process::pid() const {
  absl::MutexLock lock(&mu_);
  return pid_;
}

absl::Time Process::started_at() const {
  absl::MutexLock lock(&mu_);
  return started_at_;
}

void Process::Wake() {
  const uint64_t one = 1;
  // Cannot fail short of a counter overflow; the counter stays readable until drained.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

absl::Status Process::EndedError() const {
  const ProcessExitInfo& e = exit_;
  return absl::FailedPreconditionError(
      absl::StrCat(Describe(spec_, pid_), " has ended (",
                   e.signal > 0 ? absl::StrCat("killed by signal ", e.signal)
                                : absl::StrCat("exit code ", e.exit_code),
                   ")"));
}

void Process::Attach(std::shared_ptr<ProcessReader> reader) {
  ProcessReader* raw = reader.get();
  AttachQuietly(std::move(reader));
  raw->OnProcessUpdate();
}

void Process::AttachQuietly(std::shared_ptr<ProcessReader> reader) {
  absl::MutexLock lock(&mu_);
  int64_t cursor = replay_from_;
  if (!readers_.empty()) {
    cursor = ring_.end();
    for (const ReaderState& r : readers_) cursor = std::min(cursor, r.delivered);
  }
  readers_.push_back({std::move(reader), cursor, cursor, false});
}

void Process::Detach(const ProcessReader* reader) {
  std::shared_ptr<ProcessReader> gone;  // released outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = readers_.begin(); it != readers_.end(); ++it) {
    if (it->reader.get() == reader) {
      gone = std::move(it->reader);
      if (readers_.size() == 1) replay_from_ = it->delivered;
      readers_.erase(it);
      break;
    }
  }
  TrimLocked();
}

void Process::TrimLocked() {
  if (readers_.empty()) return;  // the ring keeps what the last reader was not sent
  int64_t min_delivered = ring_.end();
  for (const ReaderState& r : readers_) min_delivered = std::min(min_delivered, r.delivered);
  ring_.DiscardBefore(min_delivered);
}

ProcessOutput Process::Next(const ProcessReader* reader, size_t max_bytes) {
  ProcessOutput out;
  absl::MutexLock lock(&mu_);
  ReaderState* state = nullptr;
  for (ReaderState& r : readers_) {
    if (r.reader.get() == reader) state = &r;
  }
  if (state == nullptr) return out;
  OutputRing::Read read = ring_.ReadAt(&state->cursor, max_bytes);
  if (read.gap > 0) {
    // Gone for good: nobody is owed those bytes any more.
    state->delivered = std::max(state->delivered, state->cursor);
    out.kind = ProcessOutput::Kind::kDropped;
    out.dropped = read.gap;
    return out;
  }
  if (!read.data.empty()) {
    out.kind = ProcessOutput::Kind::kData;
    out.stream = read.stream;
    out.data = std::move(read.data);
    out.end = state->cursor;
    return out;
  }
  if (ended_ && !state->exit_sent) {
    state->exit_sent = true;
    out.kind = ProcessOutput::Kind::kExit;
    out.exit = exit_;
  }
  return out;
}

void Process::Delivered(const ProcessReader* reader, int64_t offset) {
  absl::MutexLock lock(&mu_);
  for (ReaderState& r : readers_) {
    if (r.reader.get() == reader) r.delivered = std::max(r.delivered, offset);
  }
  TrimLocked();
}

absl::Status Process::WriteInput(std::string data, absl::AnyInvocable<void(absl::Status) &&> done) {
  bool queued = false;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedError();
    if (!spec_.pty && !spec_.stdin) {
      return absl::FailedPreconditionError(absl::StrCat(
          Describe(spec_, pid_), " was started without stdin (start it with stdin = true)"));
    }
    if (!input_open_ || close_input_requested_) {
      return absl::FailedPreconditionError(
          absl::StrCat("the stdin of ", Describe(spec_, pid_), " is closed"));
    }
    const int64_t n = static_cast<int64_t>(data.size());
    if (input_bytes_ + n > kMaxPendingInputBytes || input_.size() >= kMaxPendingInputWrites) {
      return absl::ResourceExhaustedError(absl::StrCat(
          input_bytes_, " bytes in ", input_.size(), " writes are waiting for ",
          Describe(spec_, pid_), " to read its stdin; at most ", kMaxPendingInputBytes,
          " bytes in ", kMaxPendingInputWrites, " writes may wait: wait for earlier writes"));
    }
    if (n > 0) {
      input_bytes_ += n;
      input_.push_back({std::move(data), 0, std::move(done)});
      queued = true;
    }
  }
  if (queued) {
    Wake();
  } else {
    // Not moved: it was taken above only when something was queued.
    std::move(done)(absl::OkStatus());  // NOLINT(bugprone-use-after-move): nothing to write
  }
  return absl::OkStatus();
}

absl::Status Process::CloseInput() {
  {
    absl::MutexLock lock(&mu_);
    if (spec_.pty) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(spec_, pid_),
                       " has a PTY, whose input does not close: send its end-of-file character "
                       "(Ctrl-D, \"\\x04\") instead"));
    }
    if (!spec_.stdin) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(spec_, pid_), " was started without stdin"));
    }
    // Idempotent, also once the process has ended of it.
    if (close_input_requested_) return absl::OkStatus();
    if (ended_) return EndedError();
    close_input_requested_ = true;
  }
  Wake();
  return absl::OkStatus();
}

absl::Status Process::Signal(int signal) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedError();
    signals_.push_back(signal);
  }
  Wake();
  return absl::OkStatus();
}

absl::Status Process::Resize(uint16_t cols, uint16_t rows) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return EndedError();
    if (!spec_.pty) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(spec_, pid_), " has no PTY to resize"));
    }
    cols_ = cols;
    rows_ = rows;
    resize_pending_ = true;
  }
  Wake();
  return absl::OkStatus();
}

void Process::Kill() {
  {
    absl::MutexLock lock(&mu_);
    kill_requested_ = true;
  }
  Wake();
}

uint64_t Process::Wait(absl::AnyInvocable<void(const ProcessExitInfo&) &&> done) {
  ProcessExitInfo exit;
  {
    absl::MutexLock lock(&mu_);
    if (!ended_) {
      const uint64_t id = ++next_waiter_;
      waiters_.emplace(id, std::move(done));
      return id;
    }
    exit = exit_;
  }
  std::move(done)(exit);
  return 0;
}

void Process::CancelWait(uint64_t id) {
  absl::AnyInvocable<void(const ProcessExitInfo&) &&> gone;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  gone = std::move(it->second);
  waiters_.erase(it);
}

bool Process::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

ProcessStatus Process::Status() const {
  ProcessStatus s;
  s.tag = spec_.tag;
  s.argv = spec_.argv;
  s.cwd = spec_.cwd;
  s.pty = spec_.pty;
  s.replay_bytes = spec_.replay_bytes;
  absl::MutexLock lock(&mu_);
  s.pid = pid_;
  s.started_at = started_at_;
  if (spec_.pty) {
    s.cols = cols_;
    s.rows = rows_;
  }
  s.stdin_open = input_open_ && !close_input_requested_;
  if (ended_) s.exit = exit_;
  s.readers = static_cast<int>(readers_.size());
  s.output_bytes = ring_.end();
  s.dropped_bytes = ring_.dropped();
  s.buffered_bytes = ring_.size();
  return s;
}

int64_t Process::ReplayReservation() const {
  absl::MutexLock lock(&mu_);
  // An ended process's ring no longer grows: it holds only what is left in it.
  return ended_ ? ring_.size() : ring_.capacity();
}

void Process::OnReaped(int wait_status) {
  {
    absl::MutexLock lock(&mu_);
    reaped_ = true;
    wait_status_ = wait_status;
  }
  Wake();
}

void Process::Run(
    absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<Process>>) &&> on_started) {
  absl::Status status = Spawn();
  if (!status.ok()) {
    std::vector<std::shared_ptr<ProcessReader>> readers;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      for (ReaderState& r : readers_) readers.push_back(std::move(r.reader));
      readers_.clear();
    }
    table_->StartFailed(serial_);
    std::move(on_started)(std::move(status));
    table_->Finished(serial_);
    return;
  }
  table_->Started(serial_, pid());
  std::move(on_started)(shared_from_this());

  ProcessExitInfo exit = Pump();

  std::vector<absl::AnyInvocable<void(absl::Status) &&>> failed_input;
  std::map<uint64_t, absl::AnyInvocable<void(const ProcessExitInfo&) &&>> waiters;
  std::vector<std::shared_ptr<ProcessReader>> readers;
  {
    absl::MutexLock lock(&mu_);
    exit.output_bytes = ring_.end();
    exit.dropped_bytes = ring_.dropped();
    exit_ = exit;
    ended_ = true;
    failed_input = CloseInputLocked();
    waiters.swap(waiters_);
    for (const ReaderState& r : readers_) readers.push_back(r.reader);
  }
  spdlog::debug("process {} ended: exit {} signal {}, {} bytes of output, {} dropped", pid(),
                exit.exit_code, exit.signal, exit.output_bytes, exit.dropped_bytes);
  const absl::Status ended = absl::FailedPreconditionError(
      absl::StrCat(Describe(spec_, pid()), " ended before it read this input"));
  for (auto& done : failed_input) std::move(done)(ended);
  for (auto& [id, done] : waiters) std::move(done)(exit);
  for (auto& reader : readers) reader->OnProcessUpdate();
  table_->Finished(serial_);
}

std::vector<absl::AnyInvocable<void(absl::Status) &&>> Process::CloseInputLocked() {
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> failed;
  input_open_ = false;
  for (InputWrite& w : input_) failed.push_back(std::move(w.done));
  input_.clear();
  input_bytes_ = 0;
  if (writing_.has_value()) {
    failed.push_back(std::move(writing_->done));
    writing_.reset();
  }
  return failed;
}

absl::Status Process::Spawn() {
  {
    absl::MutexLock lock(&mu_);
    if (kill_requested_) return absl::CancelledError("the process was killed before it started");
  }
  if (!wake_fd_.valid()) return OsError("eventfd", errno);
  absl::StatusOr<UniqueFd> cwd = OpenWorkingDirectory(*workspace_, spec_.cwd, spec_.default_cwd);
  if (!cwd.ok()) return cwd.status();
  absl::StatusOr<std::string> program = ResolveProgram(cwd->get(), spec_.argv[0], spec_.env);
  if (!program.ok()) return program.status();

  ChildStdio stdio;
  UniqueFd in_r, in_w, out_r, out_w, err_r, err_w, master, slave;
  if (spec_.pty) {
    master.Reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master.valid()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open a pseudo-terminal (/dev/ptmx): ", sbx::ErrnoText(errno)));
    }
    char name[128];
    if (::grantpt(master.get()) != 0 || ::unlockpt(master.get()) != 0 ||
        ::ptsname_r(master.get(), name, sizeof(name)) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot set up a pseudo-terminal: ", sbx::ErrnoText(errno)));
    }
    SetWindowSize(master.get(), spec_.cols, spec_.rows);
    // Held open until the child has opened its own: a master whose slave is closed
    // reads EIO, which would look like the end of the process's output.
    slave.Reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!slave.valid()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open the pseudo-terminal \"", name, "\": ", sbx::ErrnoText(errno)));
    }
    stdio.terminal = name;
  } else {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return OsError("pipe", errno);
    out_r.Reset(out[0]);
    out_w.Reset(out[1]);
    if (::pipe2(err, O_CLOEXEC) != 0) return OsError("pipe", errno);
    err_r.Reset(err[0]);
    err_w.Reset(err[1]);
    if (spec_.stdin) {
      int in[2];
      if (::pipe2(in, O_CLOEXEC) != 0) return OsError("pipe", errno);
      in_r.Reset(in[0]);
      in_w.Reset(in[1]);
    } else {
      in_r.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!in_r.valid()) return OsError("open /dev/null", errno);
    }
    stdio.in = in_r.get();
    stdio.out = out_w.get();
    stdio.err = err_w.get();
  }

  std::weak_ptr<Process> weak = weak_from_this();
  absl::StatusOr<pid_t> pid =
      SpawnChild(*program, spec_.argv, spec_.env, cwd->get(), stdio, [weak](int wait_status) {
        if (auto self = weak.lock()) self->OnReaped(wait_status);
      });
  if (!pid.ok()) return pid.status();
  {
    absl::MutexLock lock(&mu_);
    pid_ = *pid;
    started_at_ = absl::Now();
    input_open_ = spec_.pty || spec_.stdin;
  }
  in_fd_ = std::move(in_w);
  out_fd_ = std::move(out_r);
  err_fd_ = std::move(err_r);
  master_fd_ = std::move(master);
  spdlog::debug("process {}{}: {}{}", *pid, spec_.tag.empty() ? "" : " tag " + spec_.tag, *program,
                spec_.pty ? " (pty)" : "");
  return absl::OkStatus();
}

void Process::Output(OutputStream stream, std::string data) {
  std::vector<std::shared_ptr<ProcessReader>> readers;
  {
    absl::MutexLock lock(&mu_);
    ring_.Append(stream, std::move(data));
    readers.reserve(readers_.size());
    for (const ReaderState& r : readers_) readers.push_back(r.reader);
  }
  for (auto& reader : readers) reader->OnProcessUpdate();
}

ProcessExitInfo Process::Pump() {
  for (UniqueFd* fd : {&in_fd_, &out_fd_, &err_fd_, &master_fd_}) {
    if (fd->valid()) SetNonBlocking(fd->get());
  }
  const pid_t pid = this->pid();
  const absl::Time started = started_at();
  // The input side: the pipe, or the PTY master (then also read for output).
  const bool pty = spec_.pty;
  bool master_readable = pty;
  absl::Time drain_deadline = absl::InfiniteFuture();
  bool killed = false;
  bool reaped = false;
  int wait_status = 0;
  std::vector<char> buf(kChunkBytes);

  for (;;) {
    std::vector<int> signals;
    bool kill = false, close_input = false, resize = false;
    uint16_t cols = 0, rows = 0;
    {
      absl::MutexLock lock(&mu_);
      signals.swap(signals_);
      kill = kill_requested_;
      // A write is taken from the queue here, after any resize queued before it.
      resize = resize_pending_;
      resize_pending_ = false;
      cols = cols_;
      rows = rows_;
      if (!writing_.has_value() && !input_.empty()) {
        writing_ = std::move(input_.front());
        input_.pop_front();
      }
      close_input = close_input_requested_ && !writing_.has_value() && input_.empty();
      if (reaped_ && !reaped) {
        reaped = true;
        wait_status = wait_status_;
      }
    }
    if (resize && master_fd_.valid()) SetWindowSize(master_fd_.get(), cols, rows);
    // The group id stays valid while the leader is unreaped or any member lives, so
    // signalling -pid cannot hit an unrelated group while the process runs.
    for (int s : signals) ::kill(-pid, s);
    if (kill && !killed) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
    if (close_input && in_fd_.valid()) {
      in_fd_.Reset();
      absl::MutexLock lock(&mu_);
      input_open_ = false;
    }
    const absl::Time now = absl::Now();
    if (reaped && drain_deadline == absl::InfiniteFuture()) drain_deadline = now + drain_grace_;
    const bool outputs_open = out_fd_.valid() || err_fd_.valid() || master_readable;
    if (reaped && (!outputs_open || now >= drain_deadline)) break;

    const int input_fd = pty ? (master_readable ? master_fd_.get() : -1) : in_fd_.get();
    if (writing_.has_value() && input_fd < 0) {
      // The terminal or pipe is gone: what is queued can never be written.
      std::vector<absl::AnyInvocable<void(absl::Status) &&>> failed;
      {
        absl::MutexLock lock(&mu_);
        failed = CloseInputLocked();
      }
      const absl::Status closed =
          absl::FailedPreconditionError(absl::StrCat(Describe(spec_, pid), " closed its stdin"));
      for (auto& done : failed) std::move(done)(closed);
      continue;
    }

    struct pollfd fds[4];
    int nfds = 0;
    fds[nfds++] = {wake_fd_.get(), POLLIN, 0};
    int out_index = -1, err_index = -1, master_index = -1, in_index = -1;
    if (out_fd_.valid()) {
      out_index = nfds;
      fds[nfds++] = {out_fd_.get(), POLLIN, 0};
    }
    if (err_fd_.valid()) {
      err_index = nfds;
      fds[nfds++] = {err_fd_.get(), POLLIN, 0};
    }
    if (pty && master_readable) {
      master_index = nfds;
      fds[nfds++] = {master_fd_.get(),
                     static_cast<short>(POLLIN | (writing_.has_value() ? POLLOUT : 0)), 0};
    } else if (!pty && in_fd_.valid() && writing_.has_value()) {
      in_index = nfds;
      fds[nfds++] = {in_fd_.get(), POLLOUT, 0};
    }
    int timeout_ms = -1;
    if (drain_deadline != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(drain_deadline - now, absl::Milliseconds(1))), 0,
          1'000'000));
    }
    if (::poll(fds, nfds, timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("process {}: poll: {}", pid, sbx::ErrnoText(errno));
      ::kill(-pid, SIGKILL);
      killed = true;
      continue;
    }
    if ((fds[0].revents & POLLIN) != 0) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &count, sizeof(count));
    }
    auto read_into = [&](UniqueFd& fd, int index, OutputStream stream, bool* readable) {
      if (index < 0 || (fds[index].revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
      const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
      if (n > 0) {
        Output(stream, std::string(buf.data(), static_cast<size_t>(n)));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        // End of a pipe, or EIO: no process holds the terminal any more.
        if (readable != nullptr) {
          *readable = false;
        } else {
          fd.Reset();
        }
      }
    };
    read_into(out_fd_, out_index, OutputStream::kStdout, nullptr);
    read_into(err_fd_, err_index, OutputStream::kStderr, nullptr);
    read_into(master_fd_, master_index, OutputStream::kPty, &master_readable);

    const int write_index = pty ? master_index : in_index;
    if (write_index >= 0 && writing_.has_value() && (fds[write_index].revents & POLLOUT) != 0) {
      InputWrite& w = *writing_;
      const ssize_t n = ::write(fds[write_index].fd, w.data.data() + w.written,
                                std::min(w.data.size() - w.written, kChunkBytes));
      if (n > 0) {
        w.written += static_cast<size_t>(n);
        if (w.written == w.data.size()) {
          absl::AnyInvocable<void(absl::Status)&&> done = std::move(w.done);
          {
            absl::MutexLock lock(&mu_);
            input_bytes_ -= static_cast<int64_t>(w.data.size());
            writing_.reset();
          }
          std::move(done)(absl::OkStatus());
        }
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        // EPIPE: the process closed its stdin (EIO: its terminal is gone).
        std::vector<absl::AnyInvocable<void(absl::Status) &&>> failed;
        {
          absl::MutexLock lock(&mu_);
          failed = CloseInputLocked();
        }
        if (!pty) in_fd_.Reset();
        const absl::Status closed =
            absl::FailedPreconditionError(absl::StrCat(Describe(spec_, pid), " closed its stdin"));
        for (auto& done : failed) std::move(done)(closed);
      }
    }
  }

  in_fd_.Reset();
  out_fd_.Reset();
  err_fd_.Reset();
  master_fd_.Reset();
  ProcessExitInfo exit;
  if (WIFEXITED(wait_status)) {
    exit.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    exit.signal = WTERMSIG(wait_status);
  }
  exit.ended_at = absl::Now();
  exit.duration = exit.ended_at - started;
  return exit;
}

// ---- ProcessTable ----

ProcessTable::ProcessTable(const Workspace* workspace, ProcessLimits ceilings,
                           absl::Duration drain_grace)
    : workspace_(workspace), ceilings_(ceilings), drain_grace_(drain_grace) {}

ProcessTable::~ProcessTable() {
  KillAll();
  JoinAll();
}

absl::Status ProcessTable::Start(
    ProcessSpec spec, const ProcessLimits& requested, std::shared_ptr<ProcessReader> reader,
    absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<Process>>) &&> on_started) {
  auto lower = [](auto ceiling, auto asked) {
    return asked > 0 && asked < ceiling ? asked : ceiling;
  };
  const int max_processes = lower(ceilings_.max_processes, requested.max_processes);
  const int max_ptys = lower(ceilings_.max_ptys, requested.max_ptys);
  const int64_t max_replay = lower(ceilings_.max_replay_bytes, requested.max_replay_bytes);

  std::shared_ptr<Process> process;
  {
    absl::MutexLock lock(&mu_);
    if (threads_.stopping()) return absl::UnavailableError("sandboxd is shutting down");
    if (!spec.tag.empty()) {
      auto it = by_tag_.find(spec.tag);
      if (it != by_tag_.end()) {
        const std::shared_ptr<Process>& holder = entries_.at(it->second);
        if (!holder->ended()) {
          return absl::AlreadyExistsError(absl::StrCat("process ", holder->pid(),
                                                       " runs with tag \"", spec.tag,
                                                       "\"; tags of running processes are "
                                                       "unique"));
        }
        EraseLocked(it->second);  // an ended process gives its tag up
      }
    }
    int running = 0, ptys = 0, ended = 0;
    for (const auto& [serial, p] : entries_) {
      if (p->ended()) {
        ++ended;
      } else {
        ++running;
        if (p->pty()) ++ptys;
      }
    }
    if (running >= max_processes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          running, " processes run in this sandbox; the limit (max_processes) is ", max_processes));
    }
    if (spec.pty && ptys >= max_ptys) {
      return absl::ResourceExhaustedError(
          absl::StrCat(ptys, " PTYs are open in this sandbox; the limit (max_ptys) is ", max_ptys));
    }
    if (spec.replay_bytes > max_replay) {
      return absl::ResourceExhaustedError(
          absl::StrCat("replay_bytes ", spec.replay_bytes,
                       " is above the sandbox's limit (max_replay_bytes) of ", max_replay));
    }
    for (;;) {
      int64_t reserved = 0;
      for (const auto& [serial, p] : entries_) reserved += p->ReplayReservation();
      if (reserved + spec.replay_bytes <= max_replay) break;
      if (!EvictOldestEndedLocked()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the replay rings of ", running, " processes hold ", reserved, " bytes; ",
            spec.replay_bytes, " more would pass the sandbox's limit (max_replay_bytes) of ",
            max_replay));
      }
      --ended;
    }
    while (ended >= max_processes && EvictOldestEndedLocked()) --ended;

    const uint64_t serial = next_serial_++;
    const std::string tag = spec.tag;
    process = std::make_shared<Process>(this, serial, std::move(spec), workspace_, drain_grace_);
    // Quietly: no reader callback under the table's lock (nothing to read yet anyway).
    if (reader != nullptr) process->AttachQuietly(std::move(reader));
    absl::Status started =
        threads_.Start(serial, process, [process, on_started = std::move(on_started)]() mutable {
          process->Run(std::move(on_started));
        });
    if (!started.ok()) return started;
    entries_.emplace(serial, process);
    if (!tag.empty()) by_tag_[tag] = serial;
  }
  threads_.ReapFinished();
  return absl::OkStatus();
}

void ProcessTable::Started(uint64_t serial, pid_t pid) {
  absl::MutexLock lock(&mu_);
  auto old = by_pid_.find(pid);
  if (old != by_pid_.end() && old->second != serial) {
    // The kernel gave an ended entry's pid to a new process: the entry goes.
    EraseLocked(old->second);
  }
  if (entries_.count(serial) != 0) by_pid_[pid] = serial;
}

void ProcessTable::StartFailed(uint64_t serial) {
  absl::MutexLock lock(&mu_);
  EraseLocked(serial);
}

void ProcessTable::Finished(uint64_t serial) { threads_.Finished(serial); }

void ProcessTable::EraseLocked(uint64_t serial) {
  auto it = entries_.find(serial);
  if (it == entries_.end()) return;
  const std::shared_ptr<Process>& p = it->second;
  auto tag = by_tag_.find(p->tag());
  if (tag != by_tag_.end() && tag->second == serial) by_tag_.erase(tag);
  const pid_t pid = p->pid();
  auto by_pid = by_pid_.find(pid);
  if (by_pid != by_pid_.end() && by_pid->second == serial) by_pid_.erase(by_pid);
  entries_.erase(it);
}

bool ProcessTable::EvictOldestEndedLocked() {
  for (const auto& [serial, p] : entries_) {
    if (p->ended()) {
      EraseLocked(serial);
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::shared_ptr<Process>> ProcessTable::FindPid(pid_t pid) const {
  absl::MutexLock lock(&mu_);
  auto it = by_pid_.find(pid);
  if (it == by_pid_.end()) {
    return absl::NotFoundError(absl::StrCat("no process with pid ", pid));
  }
  return entries_.at(it->second);
}

absl::StatusOr<std::shared_ptr<Process>> ProcessTable::FindTag(const std::string& tag) const {
  absl::MutexLock lock(&mu_);
  auto it = by_tag_.find(tag);
  // A process still starting holds its tag but cannot be found until it runs.
  if (it == by_tag_.end() || entries_.at(it->second)->pid() == 0) {
    return absl::NotFoundError(absl::StrCat("no process with tag \"", tag, "\""));
  }
  return entries_.at(it->second);
}

std::vector<std::shared_ptr<Process>> ProcessTable::List() const {
  std::vector<std::shared_ptr<Process>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [serial, p] : entries_) {
    if (p->pid() != 0) out.push_back(p);
  }
  return out;
}

void ProcessTable::KillAll() { threads_.KillAll(); }

void ProcessTable::JoinAll() { threads_.JoinAll(); }

int ProcessTable::running() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [serial, p] : entries_) {
    if (!p->ended()) ++n;
  }
  return n;
}

}  // namespace sbx::sandboxd
