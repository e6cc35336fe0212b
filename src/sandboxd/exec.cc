#include "src/sandboxd/exec.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/sandboxd/spawn.h"

namespace sbx::sandboxd {
namespace {

constexpr size_t kChunkBytes = 64 << 10;

void SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

// ---- ExecRunner ----

ExecRunner::ExecRunner(ExecSpec spec, const Workspace* workspace, ExecSink* sink,
                       absl::Duration drain_grace)
    : spec_(std::move(spec)),
      workspace_(workspace),
      sink_(sink),
      drain_grace_(drain_grace),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

ExecRunner::~ExecRunner() = default;

void ExecRunner::Wake() {
  const uint64_t one = 1;
  // Cannot fail short of a counter overflow; a lost wake-up is impossible since the
  // counter stays readable until the runner drains it.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

bool ExecRunner::WriteStdin(std::string data) {
  bool full = false;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return true;
    stdin_backlog_ += data.size();
    stdin_buffer_.append(data);
    full = stdin_backlog_ >= kMaxBufferedStdin;
    if (full) stdin_paused_ = true;
  }
  Wake();
  return !full;
}

void ExecRunner::CloseStdin() {
  {
    absl::MutexLock lock(&mu_);
    stdin_close_requested_ = true;
  }
  Wake();
}

void ExecRunner::Signal(int signal) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    signals_.push_back(signal);
  }
  Wake();
}

void ExecRunner::Kill() {
  {
    absl::MutexLock lock(&mu_);
    kill_requested_ = true;
  }
  Wake();
}

void ExecRunner::OutputConsumed(int64_t bytes) {
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    wake = outstanding_output_ >= kMaxOutstandingOutput &&
           outstanding_output_ - bytes < kMaxOutstandingOutput;
    outstanding_output_ -= bytes;
  }
  if (wake) Wake();
}

void ExecRunner::OnReaped(int wait_status) {
  {
    absl::MutexLock lock(&mu_);
    reaped_ = true;
    wait_status_ = wait_status;
  }
  Wake();
}

void ExecRunner::Run(const std::function<void()>& on_ended) {
  absl::Status status = Spawn();
  if (!status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
    }
    on_ended();
    sink_->OnStartFailed(std::move(status));
    return;
  }
  sink_->OnStarted(pid_, started_at_);
  ExecResult result = Pump();
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }
  on_ended();
  sink_->OnExit(result);
}

absl::Status ExecRunner::Spawn() {
  {
    absl::MutexLock lock(&mu_);
    if (kill_requested_) return absl::CancelledError("the command was cancelled before it started");
  }
  if (!wake_fd_.valid()) return OsError("eventfd", errno);
  absl::StatusOr<UniqueFd> cwd = OpenWorkingDirectory(*workspace_, spec_.cwd, spec_.default_cwd);
  if (!cwd.ok()) return cwd.status();
  absl::StatusOr<std::string> program = ResolveProgram(cwd->get(), spec_.argv[0], spec_.env);
  if (!program.ok()) return program.status();

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return OsError("pipe", errno);
  UniqueFd out_r(out[0]), out_w(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return OsError("pipe", errno);
  UniqueFd err_r(err[0]), err_w(err[1]);
  UniqueFd in_r, in_w;
  if (spec_.attach_stdin) {
    int in[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return OsError("pipe", errno);
    in_r.Reset(in[0]);
    in_w.Reset(in[1]);
  } else {
    in_r.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!in_r.valid()) return OsError("open /dev/null", errno);
  }

  ChildStdio stdio;
  stdio.in = in_r.get();
  stdio.out = out_w.get();
  stdio.err = err_w.get();
  std::shared_ptr<ExecRunner> self = shared_from_this();
  absl::StatusOr<pid_t> pid = SpawnChild(*program, spec_.argv, spec_.env, cwd->get(), stdio,
                                         [self](int wait_status) { self->OnReaped(wait_status); });
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  started_at_ = absl::Now();
  in_r.Reset();
  out_w.Reset();
  err_w.Reset();
  stdin_fd_ = std::move(in_w);
  stdout_fd_ = std::move(out_r);
  stderr_fd_ = std::move(err_r);
  spdlog::debug("exec pid {}: {}", pid_, *program);
  return absl::OkStatus();
}

ExecResult ExecRunner::Pump() {
  for (UniqueFd* fd : {&stdin_fd_, &stdout_fd_, &stderr_fd_}) {
    if (fd->valid()) SetNonBlocking(fd->get());
  }
  const absl::Time deadline =
      spec_.timeout > absl::ZeroDuration() ? started_at_ + spec_.timeout : absl::InfiniteFuture();
  absl::Time drain_deadline = absl::InfiniteFuture();
  ExecResult result;
  int64_t sent[2] = {0, 0};
  int64_t* totals[2] = {&result.stdout_bytes, &result.stderr_bytes};
  UniqueFd* outputs[2] = {&stdout_fd_, &stderr_fd_};
  std::string pending_stdin;
  bool killed = false;
  bool reaped = false;
  int wait_status = 0;
  std::vector<char> buf(kChunkBytes);

  for (;;) {
    std::vector<int> signals;
    bool close_stdin = false, kill = false;
    int64_t outstanding = 0;
    {
      absl::MutexLock lock(&mu_);
      pending_stdin.append(stdin_buffer_);
      stdin_buffer_.clear();
      close_stdin = stdin_close_requested_;
      signals.swap(signals_);
      kill = kill_requested_;
      outstanding = outstanding_output_;
      if (reaped_ && !reaped) {
        reaped = true;
        wait_status = wait_status_;
      }
    }
    const absl::Time now = absl::Now();
    if (reaped && drain_deadline == absl::InfiniteFuture()) drain_deadline = now + drain_grace_;
    // The group id stays valid while the leader is unreaped or any member lives, so
    // signalling -pid_ cannot hit an unrelated group while the command runs.
    for (int s : signals) ::kill(-pid_, s);
    if (kill && !killed) {
      ::kill(-pid_, SIGKILL);
      killed = true;
    }
    if (!result.timed_out && now >= deadline) {
      ::kill(-pid_, SIGKILL);
      result.timed_out = true;
      killed = true;
    }
    const bool outputs_open = stdout_fd_.valid() || stderr_fd_.valid();
    if (reaped && (!outputs_open || now >= drain_deadline)) break;

    size_t stdin_consumed = 0;
    if (!stdin_fd_.valid()) {
      stdin_consumed += pending_stdin.size();  // stdin is closed: drop what comes
      pending_stdin.clear();
    } else if (pending_stdin.empty() && close_stdin) {
      stdin_fd_.Reset();
    }

    struct pollfd fds[4];
    int nfds = 0;
    fds[nfds++] = {wake_fd_.get(), POLLIN, 0};
    int output_index[2] = {-1, -1};
    if (outstanding < kMaxOutstandingOutput) {
      for (int i = 0; i < 2; ++i) {
        if (outputs[i]->valid()) {
          output_index[i] = nfds;
          fds[nfds++] = {outputs[i]->get(), POLLIN, 0};
        }
      }
    }
    int stdin_index = -1;
    if (stdin_fd_.valid() && !pending_stdin.empty()) {
      stdin_index = nfds;
      fds[nfds++] = {stdin_fd_.get(), POLLOUT, 0};
    }
    absl::Time next = drain_deadline;
    if (!result.timed_out) next = std::min(next, deadline);
    int timeout_ms = -1;
    if (next != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(next - now, absl::Milliseconds(1))), 0, 1'000'000));
    }
    if (stdin_consumed == 0 && ::poll(fds, nfds, timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("exec pid {}: poll: {}", pid_, sbx::ErrnoText(errno));
      ::kill(-pid_, SIGKILL);
      killed = true;
    }

    if ((fds[0].revents & POLLIN) != 0) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &count, sizeof(count));
    }
    for (int i = 0; i < 2; ++i) {
      if (output_index[i] < 0 || fds[output_index[i]].revents == 0) continue;
      const ssize_t n = ::read(outputs[i]->get(), buf.data(), buf.size());
      if (n > 0) {
        *totals[i] += n;
        const int64_t room = std::max<int64_t>(0, spec_.max_output_bytes - sent[i]);
        const int64_t send = std::min<int64_t>(n, room);
        if (send < n) result.truncated = true;
        if (send > 0) {
          sent[i] += send;
          {
            absl::MutexLock lock(&mu_);
            outstanding_output_ += send;
          }
          sink_->OnOutput(i == 1, std::string(buf.data(), static_cast<size_t>(send)));
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        outputs[i]->Reset();
      }
    }
    if (stdin_index >= 0 && fds[stdin_index].revents != 0) {
      const ssize_t n = ::write(stdin_fd_.get(), pending_stdin.data(),
                                std::min(pending_stdin.size(), kChunkBytes));
      if (n > 0) {
        pending_stdin.erase(0, static_cast<size_t>(n));
        stdin_consumed += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        // EPIPE: the process closed its stdin; what it did not read is dropped.
        stdin_consumed += pending_stdin.size();
        pending_stdin.clear();
        stdin_fd_.Reset();
      }
    }
    if (stdin_consumed > 0) {
      bool resume = false;
      {
        absl::MutexLock lock(&mu_);
        stdin_backlog_ -= stdin_consumed;
        if (stdin_paused_ && stdin_backlog_ < kMaxBufferedStdin) {
          stdin_paused_ = false;
          resume = true;
        }
      }
      if (resume) sink_->OnStdinWritable();
    }
  }

  stdin_fd_.Reset();
  stdout_fd_.Reset();
  stderr_fd_.Reset();
  if (WIFEXITED(wait_status)) {
    result.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    result.signal = WTERMSIG(wait_status);
  }
  result.duration = absl::Now() - started_at_;
  spdlog::debug("exec pid {} ended: exit {} signal {}{}", pid_, result.exit_code, result.signal,
                result.timed_out ? " (timed out)" : "");
  return result;
}

// ---- ExecManager ----

ExecManager::ExecManager(const Workspace* workspace, int max_concurrent, absl::Duration drain_grace)
    : workspace_(workspace), max_concurrent_(max_concurrent), drain_grace_(drain_grace) {}

ExecManager::~ExecManager() {
  KillAll();
  JoinAll();
}

absl::StatusOr<std::shared_ptr<ExecRunner>> ExecManager::Start(ExecSpec spec, ExecSink* sink) {
  std::shared_ptr<ExecRunner> runner;
  {
    absl::MutexLock lock(&mu_);
    if (threads_.stopping()) return absl::UnavailableError("sandboxd is shutting down");
    if (running_ >= max_concurrent_) {
      return absl::ResourceExhaustedError(absl::StrCat(running_,
                                                       " commands are running, the limit "
                                                       "(max_concurrent_execs) is ",
                                                       max_concurrent_));
    }
    const uint64_t id = next_id_++;
    runner = std::make_shared<ExecRunner>(std::move(spec), workspace_, sink, drain_grace_);
    // Finished (the thread's last call) takes mu_: it cannot run before this returns.
    absl::Status started = threads_.Start(
        id, runner, [this, runner, id] { runner->Run([this, id] { Finished(id); }); });
    if (!started.ok()) return started;
    ++running_;
  }
  threads_.ReapFinished();
  return runner;
}

void ExecManager::Finished(uint64_t id) {
  {
    absl::MutexLock lock(&mu_);
    --running_;
  }
  threads_.Finished(id);
}

void ExecManager::KillAll() { threads_.KillAll(); }

void ExecManager::JoinAll() { threads_.JoinAll(); }

int ExecManager::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace sbx::sandboxd
