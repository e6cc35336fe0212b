// `sbx shell`, `sbx attach`, `sbx ps`, `sbx kill`: the processes of a sandbox
// (SandboxService StartProcess, ConnectProcess, ListProcesses, SendProcessInput,
// ResizeProcess, SignalProcess).
//
// A terminal session (shell, or attach to a PTY process) puts the user's terminal in raw
// mode, so every key (Ctrl-C included) goes to the sandbox's terminal, and restores it on
// every way out (the process's exit, a detach with Ctrl-], an error, SIGTERM/SIGINT/SIGHUP
// to sbx). Threads: the main thread reads the keyboard, window-size changes and signals
// (poll on stdin and a self-pipe) and sends them as unary calls; one thread reads the
// process's output stream and writes it to stdout. The main thread joins it before it
// prints anything or returns.

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "src/cmd/sbx_cli_commands.h"
#include "src/common/errno_text.h"

namespace sbx::cli {
namespace {

// Ctrl-]: ends a terminal session and leaves the process running (as telnet's escape).
constexpr char kDetachKey = 0x1d;
constexpr size_t kInputChunk = 4096;

// The user's terminal in raw mode while this object lives (and until Restore).
class RawMode {
 public:
  RawMode() = default;
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;
  ~RawMode() { Restore(); }

  // Raw mode on `fd`: no echo, no line editing, no signals from keys (Ctrl-C, Ctrl-Z and
  // Ctrl-\ become bytes for the sandbox), no output processing (the sandbox's terminal
  // does it). False, with nothing changed, when `fd` is not a terminal.
  bool Enter(int fd) {
    if (::tcgetattr(fd, &saved_) != 0) return false;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    if (::tcsetattr(fd, TCSADRAIN, &raw) != 0) return false;
    fd_ = fd;
    return true;
  }

  // Back to the saved mode. Idempotent.
  void Restore() {
    if (fd_ < 0) return;
    ::tcsetattr(fd_, TCSADRAIN, &saved_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  termios saved_{};
};

// SIGWINCH and SIGHUP arrive on any thread; their handler writes the signal's number to a
// pipe that the main loop polls (write(2) is async-signal-safe). Installed for one session.
int g_signal_pipe_write = -1;

void OnSessionSignal(int sig) {
  const int saved = errno;
  const char byte = static_cast<char>(sig);
  if (g_signal_pipe_write >= 0) (void)!::write(g_signal_pipe_write, &byte, 1);
  errno = saved;
}

class SessionSignals {
 public:
  SessionSignals() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
      fds_[0] = fds_[1] = -1;
      return;
    }
    g_signal_pipe_write = fds_[1];
    struct sigaction sa = {};
    sa.sa_handler = OnSessionSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGWINCH, &sa, &old_winch_);
    ::sigaction(SIGHUP, &sa, &old_hup_);
  }
  ~SessionSignals() {
    if (fds_[0] < 0) return;
    ::sigaction(SIGWINCH, &old_winch_, nullptr);
    ::sigaction(SIGHUP, &old_hup_, nullptr);
    g_signal_pipe_write = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  SessionSignals(const SessionSignals&) = delete;
  SessionSignals& operator=(const SessionSignals&) = delete;

  int read_fd() const { return fds_[0]; }
  // Another thread's wake-up (SIGINT/SIGTERM from the SignalRouter, the stream's end).
  void Post(int sig) { OnSessionSignal(sig); }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_winch_ = {};
  struct sigaction old_hup_ = {};
};

// The pipe byte the output thread posts when the stream is over (not a signal number).
constexpr int kStreamEnded = 0;

std::optional<v1::PtySize> TerminalSize(int fd) {
  winsize ws = {};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0 || ws.ws_row == 0) return std::nullopt;
  v1::PtySize size;
  size.set_cols(std::min<unsigned>(ws.ws_col, 1000));
  size.set_rows(std::min<unsigned>(ws.ws_row, 1000));
  return size;
}

v1::ProcessSelector Selector(const std::string& pid_or_tag) {
  v1::ProcessSelector s;
  int pid = 0;
  if (!pid_or_tag.empty() && absl::ascii_isdigit(pid_or_tag[0]) &&
      absl::SimpleAtoi(pid_or_tag, &pid)) {
    s.set_pid(pid);
  } else {
    s.set_tag(pid_or_tag);
  }
  return s;
}

std::string ExitText(const v1::ProcessExit& exit) {
  if (exit.status_case() == v1::ProcessExit::kSignal) {
    return absl::StrCat("killed by signal ", exit.signal());
  }
  return absl::StrCat("exit ", exit.exit_code());
}

int ExitCode(const v1::ProcessExit& exit) {
  if (exit.status_case() == v1::ProcessExit::kSignal) return 128 + exit.signal();
  return exit.exit_code();
}

using ProcessStream = grpc::ClientReader<v1::ProcessEvent>;

// How a session ends.
struct SessionEnd {
  // The process ended (its exit), or the session was left (detached) while it runs.
  std::optional<v1::ProcessExit> exit;
  bool detached = false;
  // What sbx got that ended it: 0, or SIGINT/SIGTERM/SIGHUP.
  int signal = 0;
  absl::Status status;
  int64_t dropped = 0;
  // sbx's stdout or stderr went away (a closed pipe): the session was left.
  bool output_failed = false;
};

// One process session: `stream` is a started StartProcess or ConnectProcess call whose
// first event (`started`) was read. Copies output to stdout/stderr (a PTY's raw; pipes'
// escaped on a terminal, as exec does); with `input`, sends stdin (in raw mode when
// `terminal`); forwards window sizes when `terminal`. A signal to sbx ends the session;
// with `hang_up` the process then gets SIGHUP (a terminal closing), else it is left
// running.
SessionEnd RunSession(Context& ctx, Client& client, const std::string& claim_id,
                      const v1::ProcessStarted& started, grpc::ClientContext* call,
                      ProcessStream* stream, bool pty, bool input, bool terminal, bool hang_up) {
  SessionEnd end;
  SessionSignals signals;
  if (signals.read_fd() < 0) {
    end.status = ErrnoStatus(errno, "pipe");
    call->TryCancel();
    return end;
  }
  ctx.signals->SetHandler([&signals](int sig) { signals.Post(sig); });

  v1::ProcessSelector self;
  self.set_pid(started.pid());
  auto resize = [&] {
    std::optional<v1::PtySize> size = TerminalSize(STDIN_FILENO);
    if (!size) return;
    v1::ResizeProcessRequest req;
    req.set_claim_id(claim_id);
    *req.mutable_process() = self;
    *req.mutable_size() = *size;
    v1::ResizeProcessResponse resp;
    absl::Status resized = client.Call(
        [&](grpc::ClientContext* c) { return client.sandboxes().ResizeProcess(c, req, &resp); });
    resized.IgnoreError();  // dropped: best effort; the process may just have ended
  };

  std::optional<v1::ProcessExit> exit;
  int64_t dropped = 0;
  grpc::Status stream_status;
  // Set by the output thread (read after the join): stdout or stderr went away.
  bool output_failed = false;
  std::thread output([&] {
    OutputSink out(STDOUT_FILENO, !pty && ctx.stdout_tty);
    OutputSink err(STDERR_FILENO, !pty && ctx.stderr_tty);
    v1::ProcessEvent event;
    while (!output_failed && stream->Read(&event)) {
      absl::Status written;
      switch (event.kind_case()) {
        case v1::ProcessEvent::kPty:
          written = WriteAll(STDOUT_FILENO, event.pty());
          break;
        case v1::ProcessEvent::kStdout:
          written = out.Write(event.stdout());
          break;
        case v1::ProcessEvent::kStderr:
          written = err.Write(event.stderr());
          break;
        case v1::ProcessEvent::kDropped:
          dropped += event.dropped().bytes();
          break;
        case v1::ProcessEvent::kExit:
          exit = event.exit();
          break;
        default:
          break;
      }
      if (!written.ok()) {
        // Nobody reads sbx's output any more (`sbx attach ... | head`): leave the process
        // running and end the session.
        output_failed = true;
        call->TryCancel();
      }
    }
    if (!output_failed) {
      absl::Status finished = out.Finish();
      finished.Update(err.Finish());
      finished.IgnoreError();  // dropped: the tail of an escape sequence; the stream is over
    }
    stream_status = stream->Finish();
    signals.Post(kStreamEnded);
  });

  if (terminal && pty) resize();  // attaching from a terminal of another size
  bool stdin_open = input;
  bool stream_over = false;
  std::string buf(kInputChunk, '\0');
  while (!stream_over && end.signal == 0 && !end.detached) {
    pollfd fds[2] = {{signals.read_fd(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    if (::poll(fds, stdin_open ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      end.status = ErrnoStatus(errno, "poll");
      break;
    }
    if ((fds[0].revents & POLLIN) != 0) {
      unsigned char sigs[64];  // signal numbers (1..64), one byte each
      const ssize_t n = ::read(signals.read_fd(), sigs, sizeof(sigs));
      for (ssize_t i = 0; i < n; ++i) {
        if (sigs[i] == kStreamEnded) {
          stream_over = true;
        } else if (sigs[i] == SIGWINCH) {
          if (terminal && pty) resize();
        } else {
          end.signal = sigs[i];
        }
      }
      continue;
    }
    if (!stdin_open || fds[1].revents == 0) continue;
    const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    std::string data;
    bool close_input = false;
    if (n > 0) {
      data.assign(buf.data(), static_cast<size_t>(n));
      if (terminal) {
        const size_t key = data.find(kDetachKey);
        if (key != std::string::npos) {
          data.resize(key);
          end.detached = true;
        }
      }
    } else {
      // End of input: a PTY gets its end-of-file character, a pipe is closed.
      stdin_open = false;
      if (pty) {
        data = "\x04";
      } else {
        close_input = true;
      }
    }
    absl::Status sent;
    if (!data.empty()) {
      v1::SendProcessInputRequest req;
      req.set_claim_id(claim_id);
      *req.mutable_process() = self;
      req.set_data(std::move(data));
      v1::SendProcessInputResponse resp;
      sent = client.Call([&](grpc::ClientContext* c) {
        return client.sandboxes().SendProcessInput(c, req, &resp);
      });
    }
    if (close_input && sent.ok()) {
      v1::CloseProcessInputRequest req;
      req.set_claim_id(claim_id);
      *req.mutable_process() = self;
      v1::CloseProcessInputResponse resp;
      sent = client.Call([&](grpc::ClientContext* c) {
        return client.sandboxes().CloseProcessInput(c, req, &resp);
      });
    }
    // The process ended or closed its input: its exit comes on the stream.
    if (!sent.ok()) stdin_open = false;
  }

  if (end.signal != 0 && hang_up) {
    // sbx is going away as a terminal would: the process gets the hang-up.
    v1::SignalProcessRequest req;
    req.set_claim_id(claim_id);
    *req.mutable_process() = self;
    req.set_signal(v1::SIGNAL_HUP);
    v1::SignalProcessResponse resp;
    absl::Status hung_up = client.Call(
        [&](grpc::ClientContext* c) { return client.sandboxes().SignalProcess(c, req, &resp); });
    hung_up.IgnoreError();  // dropped: best effort; the process may have ended
  }
  if (!stream_over) call->TryCancel();
  output.join();
  ctx.signals->ClearHandler();
  end.exit = exit;
  end.dropped = dropped;
  end.output_failed = output_failed;
  if (end.status.ok() && !exit.has_value() && !end.detached && end.signal == 0 && !output_failed) {
    end.status = stream_status.ok()
                     ? absl::InternalError("the process stream ended without an exit")
                     : FromGrpc(stream_status, *call);
  }
  return end;
}

// Reads the first event of a process stream: `started`, or the call's error.
absl::StatusOr<v1::ProcessStarted> ReadStarted(grpc::ClientContext* call, ProcessStream* stream) {
  v1::ProcessEvent first;
  if (!stream->Read(&first)) return FromGrpc(stream->Finish(), *call);
  if (first.kind_case() != v1::ProcessEvent::kStarted) {
    call->TryCancel();
    stream->Finish();
    return absl::InternalError("the process stream did not begin with `started`");
  }
  return first.started();
}

// How a session's end becomes sbx's exit code, with a note on stderr. `terminal`: the
// session drew on this terminal, whose cursor may be anywhere on a line.
absl::StatusOr<int> Conclude(const SessionEnd& end, const std::string& claim_id, int pid,
                             bool hung_up, bool terminal) {
  // A signal to sbx decides even when the process's exit (of the hang-up) came meanwhile.
  const bool ended_by_process = end.exit.has_value() && end.signal == 0;
  if (terminal && !ended_by_process) std::fputs("\r\n", stderr);
  if (!end.status.ok()) return end.status;
  if (end.output_failed) return 128 + SIGPIPE;  // as exec: nobody reads; the process runs on
  if (end.dropped > 0) {
    std::fprintf(stderr,
                 "sbx: %lld bytes of the process's output were dropped (it wrote more "
                 "than its replay buffer holds while this session was behind)\n",
                 static_cast<long long>(end.dropped));
  }
  if (end.signal != 0) {
    std::fprintf(stderr, "sbx: %s; process %d %s\n", sbx::SignalText(end.signal).c_str(), pid,
                 hung_up ? "was sent SIGHUP" : "keeps running");
    return 128 + end.signal;
  }
  if (end.exit.has_value()) return ExitCode(*end.exit);
  std::fprintf(stderr, "sbx: detached; process %d keeps running (sbx attach %s %d)\n", pid,
               claim_id.c_str(), pid);
  return 0;
}

// ---- shell ------------------------------------------------------------------------------

struct ShellArgs {
  std::string id;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd;
  std::string tag;
  std::string term;
};

absl::StatusOr<int> RunShell(Context& ctx, const ShellArgs& a) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;

  v1::StartProcessRequest req;
  req.set_claim_id(a.id);
  if (a.argv.empty()) {
    // The sandbox's login shell: its $SHELL if that is a program there, else /bin/sh.
    for (const char* arg :
         {"/bin/sh", "-c", "s=\"${SHELL:-/bin/sh}\"; [ -x \"$s\" ] || s=/bin/sh; exec \"$s\" -l"}) {
      req.add_argv(arg);
    }
  } else {
    for (const std::string& arg : a.argv) req.add_argv(arg);
  }
  for (const std::string& kv : a.env) {
    auto [k, v] = SplitKeyValue(kv);
    (*req.mutable_env())[k] = v;
  }
  req.set_cwd(a.cwd);
  req.set_tag(a.tag);
  const bool terminal = ::isatty(STDIN_FILENO) == 1;
  v1::PtySize size;
  size.set_cols(80);
  size.set_rows(24);
  if (std::optional<v1::PtySize> own = TerminalSize(terminal ? STDIN_FILENO : STDOUT_FILENO)) {
    size = *own;
  }
  *req.mutable_pty()->mutable_size() = size;
  std::string term = a.term;
  if (term.empty()) {
    // getenv races only with a change of the environment, and the CLI changes its own only at the
    // top of main (sbx_main.cc), before it gets here.
    const char* own = std::getenv("TERM");  // NOLINT(concurrency-mt-unsafe)
    term = own != nullptr && *own != '\0' ? own : "xterm-256color";
  }
  req.mutable_pty()->set_term(term);

  RawMode raw;
  if (terminal) raw.Enter(STDIN_FILENO);
  // The shell lasts as long as it runs: no deadline.
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(absl::InfiniteDuration());
  std::unique_ptr<ProcessStream> stream = client.sandboxes().StartProcess(call.get(), req);
  absl::StatusOr<v1::ProcessStarted> started = ReadStarted(call.get(), stream.get());
  if (!started.ok()) {
    raw.Restore();
    return started.status();
  }
  SessionEnd end = RunSession(ctx, client, a.id, *started, call.get(), stream.get(),
                              /*pty=*/true, /*input=*/true, terminal, /*hang_up=*/true);
  raw.Restore();
  return Conclude(end, a.id, started->pid(), /*hung_up=*/true, terminal);
}

// ---- attach -----------------------------------------------------------------------------

absl::StatusOr<int> RunAttach(Context& ctx, const std::string& id, const std::string& which,
                              bool forward_stdin) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;

  // Which process, and does it have a PTY? (A PTY gets a raw terminal session.)
  v1::ListProcessesRequest list;
  list.set_claim_id(id);
  v1::ListProcessesResponse procs;
  if (absl::Status s = client.Call([&](grpc::ClientContext* c) {
        return client.sandboxes().ListProcesses(c, list, &procs);
      });
      !s.ok()) {
    return s;
  }
  const v1::ProcessSelector selector = Selector(which);
  const v1::ProcessInfo* info = nullptr;
  for (const v1::ProcessInfo& p : procs.processes()) {
    if (selector.has_tag() ? p.tag() == selector.tag() : p.pid() == selector.pid()) info = &p;
  }
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("no process ", selector.has_tag() ? "tagged \"" : "",
                                            which, selector.has_tag() ? "\"" : "",
                                            " in the sandbox of claim \"", id, "\""));
  }
  const bool pty = info->has_pty();
  const bool terminal = pty && ::isatty(STDIN_FILENO) == 1;

  v1::ConnectProcessRequest req;
  req.set_claim_id(id);
  req.mutable_process()->set_pid(info->pid());
  RawMode raw;
  if (terminal) raw.Enter(STDIN_FILENO);
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(absl::InfiniteDuration());
  std::unique_ptr<ProcessStream> stream = client.sandboxes().ConnectProcess(call.get(), req);
  absl::StatusOr<v1::ProcessStarted> started = ReadStarted(call.get(), stream.get());
  if (!started.ok()) {
    raw.Restore();
    return started.status();
  }
  SessionEnd end = RunSession(ctx, client, id, *started, call.get(), stream.get(), pty,
                              /*input=*/pty || forward_stdin, terminal, /*hang_up=*/false);
  raw.Restore();
  return Conclude(end, id, started->pid(), /*hung_up=*/false, terminal);
}

// ---- ps, kill ---------------------------------------------------------------------------

absl::StatusOr<int> RunPs(Context& ctx, const std::string& id) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::ListProcessesRequest req;
  req.set_claim_id(id);
  v1::ListProcessesResponse resp;
  if (absl::Status s = client.Call(
          [&](grpc::ClientContext* c) { return client.sandboxes().ListProcesses(c, req, &resp); });
      !s.ok()) {
    return s;
  }
  if (ctx.json()) {
    PrintJsonArrayOf(resp.processes());
    return 0;
  }
  Table table({"PID", "TAG", "STATE", "PTY", "READERS", "OUTPUT", "DROPPED", "STARTED", "COMMAND"});
  for (const v1::ProcessInfo& p : resp.processes()) {
    std::string command;
    for (const std::string& arg : p.argv()) {
      absl::StrAppend(&command, command.empty() ? "" : " ", EscapeForTerminal(arg));
    }
    table.AddRow({absl::StrCat(p.pid()), p.tag().empty() ? "-" : p.tag(),
                  p.has_exit() ? ExitText(p.exit()) : "running",
                  p.has_pty() ? absl::StrCat(p.pty().cols(), "x", p.pty().rows()) : "-",
                  absl::StrCat(p.readers()), absl::StrCat(p.output_bytes()),
                  absl::StrCat(p.dropped_bytes()), AbsoluteTime(p.has_started_at(), p.started_at()),
                  command});
  }
  table.Print(stdout);
  return 0;
}

absl::StatusOr<int> RunKill(Context& ctx, const std::string& id, const std::string& which,
                            const std::string& signal_name) {
  std::string name = absl::AsciiStrToUpper(signal_name);
  if (absl::StartsWith(name, "SIG")) name = name.substr(3);
  v1::Signal signal = v1::SIGNAL_UNSPECIFIED;
  int number = 0;
  if (absl::SimpleAtoi(name, &number)) {
    if (v1::Signal_IsValid(number)) signal = static_cast<v1::Signal>(number);
  } else {
    v1::Signal_Parse("SIGNAL_" + name, &signal);
  }
  if (signal == v1::SIGNAL_UNSPECIFIED) {
    return UsageError(absl::StrCat("kill: --signal \"", signal_name,
                                   "\" is not one of HUP INT QUIT KILL USR1 USR2 TERM CONT STOP"));
  }
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::SignalProcessRequest req;
  req.set_claim_id(id);
  *req.mutable_process() = Selector(which);
  req.set_signal(signal);
  v1::SignalProcessResponse resp;
  if (absl::Status s = client.Call(
          [&](grpc::ClientContext* c) { return client.sandboxes().SignalProcess(c, req, &resp); });
      !s.ok()) {
    return s;
  }
  return 0;
}

}  // namespace

absl::StatusOr<int> RunDetachedProcess(Context& ctx, const DetachedStart& start) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::StartProcessRequest req;
  req.set_claim_id(start.id);
  for (const std::string& arg : start.argv) req.add_argv(arg);
  for (const std::string& kv : start.env) {
    auto [k, v] = SplitKeyValue(kv);
    (*req.mutable_env())[k] = v;
  }
  req.set_cwd(start.cwd);
  req.set_tag(start.tag);
  req.set_stdin(start.stdin);
  req.set_detach(true);
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(client.timeout());
  std::unique_ptr<ProcessStream> stream = client.sandboxes().StartProcess(call.get(), req);
  absl::StatusOr<v1::ProcessStarted> started = ReadStarted(call.get(), stream.get());
  if (!started.ok()) return started.status();
  v1::ProcessEvent rest;
  while (stream->Read(&rest)) {
  }
  stream->Finish();  // the process runs on whatever the call says now
  if (ctx.json()) {
    PrintJson(*started);
  } else {
    std::printf("%d\n", started->pid());
  }
  return 0;
}

void AddProcessCommands(CLI::App& app, Context& ctx, Actions& actions) {
  {
    auto a = std::make_shared<ShellArgs>();
    CLI::App* sub = app.add_subcommand(
        "shell",
        "Open an interactive shell in a claimed sandbox: sbx shell ID [flags] [-- ARGV...]\n"
        "Runs on a terminal in the sandbox (default: its login shell) with this terminal in "
        "raw mode: every key, Ctrl-C included, goes to the sandbox; window size changes "
        "follow. Ctrl-] detaches (the shell keeps running: sbx attach). Exits with the "
        "shell's exit code.");
    sub->add_option("id", a->id, "Claim id")->required();
    sub->add_option("argv", a->argv, "Program and arguments instead of the login shell (after --)");
    sub->add_option("--env", a->env, "Environment variable K=V (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    sub->add_option("--cwd", a->cwd, "Working directory, relative to the workspace");
    sub->add_option("--tag", a->tag, "Tag the shell's process (to find it with attach or kill)");
    sub->add_option("--term", a->term, "TERM inside (default: this terminal's $TERM)");
    actions[sub] = [&ctx, a] { return RunShell(ctx, *a); };
  }
  {
    auto id = std::make_shared<std::string>();
    auto which = std::make_shared<std::string>();
    auto forward_stdin = std::make_shared<bool>(false);
    CLI::App* sub = app.add_subcommand(
        "attach",
        "Attach to a process of a sandbox: sbx attach ID PID|TAG\n"
        "Prints what it wrote since the last reader (as much as its replay buffer kept), "
        "then its output as it comes, until it exits (sbx exits with its exit code). A PTY "
        "process gets a raw terminal session as sbx shell does; Ctrl-] detaches. Otherwise "
        "Ctrl-C detaches, and -i forwards stdin.");
    sub->add_option("id", *id, "Claim id")->required();
    sub->add_option("process", *which, "Process id, or tag")->required();
    sub->add_flag("-i,--stdin", *forward_stdin,
                  "Forward this process's standard input (a process started with stdin)");
    actions[sub] = [&ctx, id, which, forward_stdin] {
      return RunAttach(ctx, *id, *which, *forward_stdin);
    };
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = app.add_subcommand(
        "ps", "List the processes of a sandbox (started with exec -d or shell; ended ones too)");
    sub->add_option("id", *id, "Claim id")->required();
    actions[sub] = [&ctx, id] { return RunPs(ctx, *id); };
  }
  {
    auto id = std::make_shared<std::string>();
    auto which = std::make_shared<std::string>();
    auto signal_name = std::make_shared<std::string>("TERM");
    CLI::App* sub =
        app.add_subcommand("kill", "Send a signal to a process of a sandbox: sbx kill ID PID|TAG");
    sub->add_option("id", *id, "Claim id")->required();
    sub->add_option("process", *which, "Process id, or tag")->required();
    sub->add_option("-s,--signal", *signal_name,
                    "HUP, INT, QUIT, KILL, USR1, USR2, TERM, CONT or STOP (or its number)")
        ->capture_default_str();
    actions[sub] = [&ctx, id, which, signal_name] {
      return RunKill(ctx, *id, *which, *signal_name);
    };
  }
}

}  // namespace sbx::cli
