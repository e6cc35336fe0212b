// `sbx exec`, `sbx cp`, `sbx ls`, `sbx suspend`, `sbx resume`: SandboxService (exec -d starts a
// background process: sbx_cli_process.cc).

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/cmd/sbx_cli_commands.h"
#include "src/sandboxd/tar.h"
#include "src/sandboxd/unique_fd.h"

namespace sbx::cli {
namespace {

// WriteFile and ReadFile move at most 1 MiB per call (sandboxes.proto); `cp` streams
// (UploadFile, DownloadFile) in 1 MiB chunks instead.
constexpr size_t kFileChunk = 1 << 20;
// A streamed copy ends after this at the latest (a copy of any size may take long).
constexpr absl::Duration kTransferDeadline = absl::Hours(6);
// Stdin is forwarded in chunks of at most this size (the API allows 1 MiB).
constexpr size_t kStdinChunk = 64 << 10;
// Exec's timeout when --timeout-exec is not given (the server's default).
constexpr absl::Duration kDefaultExecTimeout = absl::Minutes(10);
// Files at least this large show a progress bar on a terminal.
constexpr int64_t kProgressBytes = 4 << 20;
constexpr int kPageSize = 500;
// Signals to the CLI before it gives up forwarding and cancels the call (which kills the
// remote command).
constexpr int kSignalsBeforeCancel = 3;

// ---- exec -------------------------------------------------------------------------------

struct ExecArgs {
  std::string id;
  std::vector<std::string> argv;
  bool interactive = false;
  std::vector<std::string> env;
  std::string cwd;
  std::string timeout_exec;
  int64_t max_output = 0;
  // -d: a background process (StartProcess) instead of an Exec.
  bool detach = false;
  std::string tag;
};

using ExecStream = grpc::ClientReaderWriter<v1::ExecRequest, v1::ExecResponse>;

// State shared by the reading thread (main), the writing thread and the signal handler.
class ExecControl {
 public:
  explicit ExecControl(grpc::ClientContext* call) : call_(call) {}

  // From the signal thread: queue the signal for the writer; after kSignalsBeforeCancel
  // signals, cancel the call instead.
  void OnSignal(int sig) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++received_;
    if (received_ >= kSignalsBeforeCancel) {
      cancelled_ = true;
      call_->TryCancel();
      return;
    }
    pending_.push_back(sig);
  }

  // For the writer: waits up to `wait` for a signal or the end; returns false at the end,
  // otherwise the pending signals (possibly none) in `out`.
  bool Next(absl::Duration wait, std::vector<int>* out, int* received) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !pending_.empty(); };
    if (wait > absl::ZeroDuration()) mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
    if (done_) return false;
    out->swap(pending_);
    pending_.clear();
    *received = received_;
    return true;
  }

  void SetDone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  int received() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  grpc::ClientContext* const call_;
  mutable absl::Mutex mu_;
  std::vector<int> pending_ ABSL_GUARDED_BY(mu_);
  int received_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

v1::Signal ToProtoSignal(int sig) {
  switch (sig) {
    case SIGINT:
      return v1::SIGNAL_INT;
    case SIGTERM:
      return v1::SIGNAL_TERM;
    case SIGHUP:
      return v1::SIGNAL_HUP;
    default:
      return v1::SIGNAL_TERM;
  }
}

// The only thread that writes to the stream (gRPC allows one writer at a time): forwards
// signals and, with -i, standard input, until the call ends.
void WriteLoop(ExecStream* stream, ExecControl* control, bool attach_stdin) {
  bool stdin_open = attach_stdin;
  std::string buf(kStdinChunk, '\0');
  std::vector<int> signals;
  int received = 0;
  // While stdin is open, poll() on it does the waiting.
  while (control->Next(stdin_open ? absl::ZeroDuration() : absl::Milliseconds(100), &signals,
                       &received)) {
    for (int sig : signals) {
      v1::ExecRequest req;
      req.mutable_signal()->set_signal(ToProtoSignal(sig));
      if (!stream->Write(req)) return;  // the call is over; the reader sees why
      if (received == kSignalsBeforeCancel - 1) {
        std::fprintf(stderr,
                     "sbx: signal forwarded; once more cancels the call and kills the "
                     "command\n");
      }
    }
    signals.clear();
    if (!stdin_open) continue;
    pollfd p = {STDIN_FILENO, POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    if (ready <= 0) continue;
    const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    v1::ExecRequest req;
    if (n > 0) {
      req.set_stdin_chunk(buf.data(), static_cast<size_t>(n));
    } else {
      // End of input (or a read error, which ends it too).
      req.mutable_close_stdin();
      stdin_open = false;
    }
    if (!stream->Write(req)) return;
  }
}

absl::StatusOr<int> RunExec(Context& ctx, const ExecArgs& a) {
  if (a.argv.empty()) return UsageError("exec: give the command after --, e.g. -- ls -l");
  if (!a.tag.empty() && !a.detach) return UsageError("exec: --tag needs -d (--detach)");
  if (a.detach) {
    if (!a.timeout_exec.empty() || a.max_output != 0) {
      return UsageError(
          "exec -d: --timeout-exec and --max-output are for Exec; a background process runs "
          "until it exits or is killed (sbx kill)");
    }
    DetachedStart start;
    start.id = a.id;
    start.argv = a.argv;
    start.env = a.env;
    start.cwd = a.cwd;
    start.tag = a.tag;
    start.stdin = a.interactive;
    return RunDetachedProcess(ctx, start);
  }
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;

  absl::Duration exec_timeout =
      a.timeout_exec.empty() ? absl::ZeroDuration() : ParseDurationFlag(a.timeout_exec);
  v1::ExecRequest start;
  v1::ExecStart* s = start.mutable_start();
  s->set_claim_id(a.id);
  for (const std::string& arg : a.argv) s->add_argv(arg);
  for (const std::string& kv : a.env) {
    auto [k, v] = SplitKeyValue(kv);
    (*s->mutable_env())[k] = v;
  }
  s->set_cwd(a.cwd);
  if (exec_timeout > absl::ZeroDuration()) ToProto(exec_timeout, s->mutable_timeout());
  s->set_max_output_bytes(a.max_output);
  s->set_attach_stdin(a.interactive);
  if (exec_timeout == absl::ZeroDuration()) exec_timeout = kDefaultExecTimeout;

  // The call may last as long as the command may, plus --timeout for the rest.
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(exec_timeout + client.timeout());
  std::unique_ptr<ExecStream> stream = client.sandboxes().Exec(call.get());
  ExecControl control(call.get());
  std::optional<v1::ExecExit> exit;
  absl::Status local_error;
  if (stream->Write(start)) {
    ctx.signals->SetHandler([&control](int sig) { control.OnSignal(sig); });
    std::thread writer([&] { WriteLoop(stream.get(), &control, a.interactive); });
    // The command's output goes to a pipe or file byte for byte; to a terminal escaped,
    // so that the sandbox cannot drive the operator's terminal.
    OutputSink out(STDOUT_FILENO, ctx.stdout_tty);
    OutputSink err(STDERR_FILENO, ctx.stderr_tty);
    v1::ExecResponse msg;
    while (stream->Read(&msg)) {
      absl::Status written;
      switch (msg.kind_case()) {
        case v1::ExecResponse::kStdoutChunk:
          written = out.Write(msg.stdout_chunk());
          break;
        case v1::ExecResponse::kStderrChunk:
          written = err.Write(msg.stderr_chunk());
          break;
        case v1::ExecResponse::kExit:
          exit = msg.exit();
          break;
        default:
          break;
      }
      if (!written.ok() && local_error.ok()) {
        // Nobody reads our output any more (e.g. `| head`): stop the command.
        local_error = written;
        call->TryCancel();
      }
    }
    if (local_error.ok()) {
      if (absl::Status s = out.Finish(); !s.ok()) local_error = s;
      err.Finish()
          .IgnoreError();  // dropped: stdout's error is the one reported; stderr is best effort
    }
    control.SetDone();
    writer.join();
    ctx.signals->ClearHandler();
  }
  const grpc::Status status = stream->Finish();

  if (!local_error.ok()) {
    if (local_error.code() == absl::StatusCode::kFailedPrecondition) return 128 + SIGPIPE;
    return local_error;
  }
  if (control.cancelled()) {
    std::fprintf(stderr, "sbx: interrupted: the call was cancelled and the command killed\n");
    return 130;
  }
  if (!status.ok()) return FromGrpc(status, *call);
  if (!exit.has_value()) {
    return absl::InternalError("the server ended Exec without an exit message");
  }
  if (exit->truncated()) {
    std::fprintf(stderr,
                 "sbx: note: output truncated: the command wrote %lld bytes to stdout and %lld "
                 "to stderr, more than --max-output allows\n",
                 static_cast<long long>(exit->stdout_bytes()),
                 static_cast<long long>(exit->stderr_bytes()));
  }
  if (exit->timed_out()) {
    std::fprintf(stderr, "sbx: error: the command timed out after %s and was killed\n",
                 absl::FormatDuration(exec_timeout).c_str());
    return 124;
  }
  if (exit->status_case() == v1::ExecExit::kSignal) {
    if (control.received() == 0) {
      std::fprintf(stderr, "sbx: the command was killed by signal %d\n", exit->signal());
    }
    return 128 + exit->signal();
  }
  return exit->exit_code();
}

// ---- cp ---------------------------------------------------------------------------------

struct RemotePath {
  std::string claim_id;
  std::string path;
};

// "ID:PATH" names a file in a sandbox: split at the first ':'. An argument with a '/'
// before its first ':' (e.g. "./a:b") or without a ':' is local; "-" is stdin/stdout.
std::optional<RemotePath> ParseRemote(const std::string& arg) {
  if (arg == "-") return std::nullopt;
  const size_t colon = arg.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  const size_t slash = arg.find('/');
  if (slash != std::string::npos && slash < colon) return std::nullopt;
  return RemotePath{arg.substr(0, colon), arg.substr(colon + 1)};
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// Reads up to `max` bytes, fewer only at the end of the input.
absl::StatusOr<std::string> ReadChunk(int fd, size_t max, const std::string& name) {
  std::string out(max, '\0');
  size_t got = 0;
  while (got < max) {
    const ssize_t n = ::read(fd, out.data() + got, max - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("reading \"", name, "\""));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

absl::StatusOr<int> Upload(Context& ctx, Client& client, const std::string& local,
                           const RemotePath& remote) {
  std::string path = remote.path;
  if (path.empty() || path.back() == '/') {
    if (local == "-") return UsageError("cp from stdin needs a file name: ID:PATH");
    path += BaseName(local);
  }
  const int fd = local == "-" ? STDIN_FILENO : ::open(local.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("\"", local, "\""));
  struct stat st;
  if (::fstat(fd, &st) != 0) st = {};
  if (S_ISDIR(st.st_mode)) {
    if (fd != STDIN_FILENO) ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("\"", local, "\" is a directory; sbx cp copies one file"));
  }
  const bool regular = S_ISREG(st.st_mode);
  const int64_t total = regular ? st.st_size : 0;
  std::optional<Progress> progress;
  if (ctx.stderr_tty && total >= kProgressBytes) {
    progress.emplace(true, absl::StrCat("uploading ", path));
  }
  // One UploadFile stream: `start`, chunks, `finish`; the sandbox renames the file into
  // place only after `finish` (an interrupted copy leaves nothing).
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(kTransferDeadline);
  v1::UploadResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      client.sandboxes().UploadFile(call.get(), &resp);
  v1::UploadRequest first;
  v1::UploadStart* start = first.mutable_start();
  start->set_claim_id(remote.claim_id);
  start->set_path(path);
  start->set_mode(regular ? (st.st_mode & 07777) : 0);
  start->set_create_parents(true);
  absl::Status local_error;
  int64_t sent = 0;
  for (bool ok = writer->Write(first); ok;) {
    absl::StatusOr<std::string> chunk = ReadChunk(fd, kFileChunk, local);
    if (!chunk.ok()) {
      local_error = chunk.status();
      call->TryCancel();  // nothing half-written is kept
      break;
    }
    if (chunk->empty()) break;
    const size_t n = chunk->size();
    v1::UploadRequest msg;
    msg.set_chunk(std::move(*chunk));
    ok = writer->Write(msg);
    sent += static_cast<int64_t>(n);
    if (progress) progress->Set(sent >> 20, total >> 20, "MiB");
  }
  if (local_error.ok()) {
    // The explicit end: the sandbox commits the file only after it.
    v1::UploadRequest finish;
    finish.set_finish(true);
    writer->Write(finish);
    writer->WritesDone();
  }
  const grpc::Status finished = writer->Finish();
  if (fd != STDIN_FILENO) ::close(fd);
  if (progress) progress->Finish("");
  if (!local_error.ok()) return local_error;
  if (absl::Status status = FromGrpc(finished, *call); !status.ok()) return status;
  return 0;
}

absl::StatusOr<int> Download(Context& ctx, Client& client, const RemotePath& remote,
                             const std::string& local) {
  if (remote.path.empty() || remote.path.back() == '/') {
    return UsageError(
        absl::StrCat("cp: \"", remote.claim_id, ":", remote.path, "\" does not name a file"));
  }
  int fd = STDOUT_FILENO;
  std::string target;
  std::string temp;
  if (local != "-") {
    target = local;
    struct stat st;
    if (::stat(local.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      target = absl::StrCat(local, local.back() == '/' ? "" : "/", BaseName(remote.path));
    }
    // Written beside the target and renamed at the end: a failed copy leaves no half file.
    const size_t slash = target.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : target.substr(0, slash + 1);
    temp = absl::StrCat(dir, slash == std::string::npos ? "/" : "", ".", BaseName(target),
                        ".sbx-XXXXXX");
    fd = ::mkstemp(temp.data());
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("creating \"", target, "\""));
  }
  std::optional<Progress> progress;
  OutputSink to_stdout(STDOUT_FILENO, local == "-" && ctx.stdout_tty);
  absl::Status status;
  uint32_t mode = 0;
  int64_t offset = 0;
  int64_t size = 0;
  {
    // One DownloadFile stream: the first chunk carries the size and mode.
    std::unique_ptr<grpc::ClientContext> call = client.NewContext(kTransferDeadline);
    v1::DownloadRequest req;
    req.set_claim_id(remote.claim_id);
    req.set_path(remote.path);
    std::unique_ptr<grpc::ClientReader<v1::DownloadChunk>> reader =
        client.sandboxes().DownloadFile(call.get(), req);
    v1::DownloadChunk chunk;
    for (bool first = true; reader->Read(&chunk); first = false) {
      if (first) {
        mode = chunk.mode();
        size = chunk.size();
        if (ctx.stderr_tty && size >= kProgressBytes) {
          progress.emplace(true, absl::StrCat("downloading ", remote.path));
        }
      }
      status = fd == STDOUT_FILENO ? to_stdout.Write(chunk.data()) : WriteAll(fd, chunk.data());
      if (!status.ok()) {
        status = absl::Status(
            status.code(),
            absl::StrCat("writing \"", local == "-" ? "stdout" : target, "\": ", status.message()));
        call->TryCancel();
        break;
      }
      offset += static_cast<int64_t>(chunk.data().size());
      if (progress) progress->Set(offset >> 20, size >> 20, "MiB");
    }
    const grpc::Status finished = reader->Finish();
    if (status.ok()) status = FromGrpc(finished, *call);
  }
  if (progress) progress->Finish("");
  if (local == "-") {
    if (status.ok()) status = to_stdout.Finish();
    if (!status.ok()) return status;
    return 0;
  }
  // A plain file of this user: the sandbox chose the mode, so only its permission bits are
  // kept (never set-uid, set-gid or sticky), under this process's umask, as a new file
  // of `cp` gets. The owner is whoever runs sbx (mkstemp made the file).
  const mode_t umask_now = ::umask(0);
  ::umask(umask_now);
  const mode_t kept = static_cast<mode_t>(mode == 0 ? 0666 : (mode & 0777)) & ~umask_now;
  if (status.ok() && ::fchmod(fd, kept) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("chmod \"", target, "\""));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = ErrnoStatus(errno, absl::StrCat("writing \"", target, "\""));
  }
  if (status.ok() && ::rename(temp.c_str(), target.c_str()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("renaming to \"", target, "\""));
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return 0;
}

// cp -r: a directory as a tar stream, with the daemon's own tar code (src/sandboxd/tar.h):
// up, WriteTar of the local directory into UploadTar; down, DownloadTar into the same
// confined ExtractTar the daemon uses, since the archive comes from a sandbox (no entry
// outside LOCAL, no link followed, no device, no setuid bit).
absl::StatusOr<int> UploadDir(Client& client, const std::string& local, const RemotePath& remote) {
  sandboxd::UniqueFd dir(::open(local.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoStatus(errno, absl::StrCat("\"", local, "\""));
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(kTransferDeadline);
  v1::UploadResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
      client.sandboxes().UploadTar(call.get(), &resp);
  v1::UploadRequest first;
  first.mutable_start()->set_claim_id(remote.claim_id);
  first.mutable_start()->set_path(remote.path);
  bool ok = writer->Write(first);
  std::string pending;
  auto flush = [&](size_t keep_below) {
    while (ok && pending.size() >= std::max<size_t>(keep_below, 1)) {
      const size_t n = std::min(pending.size(), kFileChunk);
      v1::UploadRequest msg;
      msg.set_chunk(pending.substr(0, n));
      pending.erase(0, n);
      ok = writer->Write(msg);
    }
    return ok;
  };
  absl::Status local_error = sandboxd::WriteTar(dir.get(), [&](absl::string_view data) {
    pending.append(data.data(), data.size());
    return flush(kFileChunk);
  });
  if (local_error.ok() && flush(0)) {
    v1::UploadRequest finish;
    finish.set_finish(true);
    writer->Write(finish);
    writer->WritesDone();
  } else if (!local_error.ok() && !absl::IsCancelled(local_error)) {
    call->TryCancel();
  }
  const grpc::Status finished = writer->Finish();
  if (!local_error.ok() && !absl::IsCancelled(local_error)) return local_error;
  if (absl::Status status = FromGrpc(finished, *call); !status.ok()) return status;
  return 0;
}

absl::StatusOr<int> DownloadDir(Client& client, const RemotePath& remote,
                                const std::string& local) {
  if (::mkdir(local.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("creating \"", local, "\""));
  }
  sandboxd::UniqueFd dir(::open(local.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoStatus(errno, absl::StrCat("\"", local, "\""));
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(kTransferDeadline);
  v1::DownloadRequest req;
  req.set_claim_id(remote.claim_id);
  req.set_path(remote.path);
  std::unique_ptr<grpc::ClientReader<v1::DownloadChunk>> reader =
      client.sandboxes().DownloadTar(call.get(), req);
  absl::StatusOr<sandboxd::TarResult> result = sandboxd::ExtractTar(
      dir.get(),
      [&](std::string& chunk) {
        v1::DownloadChunk c;
        if (!reader->Read(&c)) return false;
        chunk = std::move(*c.mutable_data());
        return true;
      },
      sandboxd::TarLimits{}, /*use_openat2=*/true);
  if (!result.ok()) call->TryCancel();
  v1::DownloadChunk rest;
  while (reader->Read(&rest)) {
  }
  const grpc::Status finished = reader->Finish();
  if (absl::Status status = FromGrpc(finished, *call); !status.ok() && result.ok()) return status;
  if (!result.ok()) {
    return absl::Status(result.status().code(), absl::StrCat("extracting into \"", local,
                                                             "\": ", result.status().message()));
  }
  return 0;
}

absl::StatusOr<int> RunCp(Context& ctx, const std::string& from, const std::string& to,
                          bool recursive) {
  const std::optional<RemotePath> src = ParseRemote(from);
  const std::optional<RemotePath> dst = ParseRemote(to);
  if (src.has_value() == dst.has_value()) {
    return UsageError(
        absl::StrCat("cp copies between this machine and a sandbox: exactly one of \"", from,
                     "\" and \"", to, "\" must be ID:PATH"));
  }
  if (recursive && (from == "-" || to == "-")) {
    return UsageError("cp -r copies directories; '-' (stdin, stdout) is for one file");
  }
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  if (recursive) {
    if (dst.has_value()) return UploadDir(**connected, from, *dst);
    return DownloadDir(**connected, *src, to);
  }
  if (dst.has_value()) return Upload(ctx, **connected, from, *dst);
  return Download(ctx, **connected, *src, to);
}

// ---- ls ---------------------------------------------------------------------------------

absl::StatusOr<int> RunLs(Context& ctx, const std::string& id, const std::string& path,
                          bool recursive) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::ListFilesRequest req;
  req.set_claim_id(id);
  req.set_path(path);
  req.set_recursive(recursive);
  req.set_page_size(kPageSize);
  std::vector<v1::FileInfo> files;
  while (true) {
    v1::ListFilesResponse resp;
    if (absl::Status s = client.Call(
            [&](grpc::ClientContext* c) { return client.sandboxes().ListFiles(c, req, &resp); });
        !s.ok()) {
      return s;
    }
    for (v1::FileInfo& f : *resp.mutable_files()) files.push_back(std::move(f));
    if (resp.next_page_token().empty() || resp.next_page_token() == req.page_token()) break;
    req.set_page_token(resp.next_page_token());
  }
  if (ctx.json()) {
    PrintJsonArrayOf(files);
    return 0;
  }
  Table table({"MODE", "SIZE", "MODIFIED", "PATH"});
  for (const v1::FileInfo& f : files) {
    char type = '-';
    std::string name = f.path();
    if (f.type() == v1::FILE_TYPE_DIRECTORY) {
      type = 'd';
      name += "/";
    } else if (f.type() == v1::FILE_TYPE_SYMLINK) {
      type = 'l';
    } else if (f.type() == v1::FILE_TYPE_UNSPECIFIED) {
      type = '?';
    }
    table.AddRow({std::string(1, type) + ModeString(f.mode()), absl::StrCat(f.size()),
                  AbsoluteTime(f.has_modified_at(), f.modified_at()), name});
  }
  table.Print(stdout);
  return 0;
}

// ---- suspend, resume --------------------------------------------------------------------

absl::StatusOr<int> RunSuspendResume(Context& ctx, const std::string& id, bool suspend) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::Sandbox sandbox;
  absl::Status status;
  if (suspend) {
    v1::SuspendRequest req;
    req.set_claim_id(id);
    v1::SuspendResponse resp;
    status = client.Call(
        [&](grpc::ClientContext* c) { return client.sandboxes().Suspend(c, req, &resp); });
    sandbox = resp.sandbox();
  } else {
    v1::ResumeRequest req;
    req.set_claim_id(id);
    v1::ResumeResponse resp;
    status = client.Call(
        [&](grpc::ClientContext* c) { return client.sandboxes().Resume(c, req, &resp); });
    sandbox = resp.sandbox();
  }
  if (!status.ok()) return status;
  if (ctx.json()) {
    PrintJson(sandbox);
  } else {
    Table table({"CLAIM", "SANDBOX", "STATE"});
    table.AddRow({id, sandbox.id(), sandbox.suspended() ? "suspended" : "running"});
    table.Print(stdout);
  }
  return 0;
}

}  // namespace

void AddSandboxCommands(CLI::App& app, Context& ctx, Actions& actions) {
  {
    auto a = std::make_shared<ExecArgs>();
    CLI::App* sub = app.add_subcommand(
        "exec",
        "Run a command in a claimed sandbox: sbx exec ID [flags] -- ARGV...\n"
        "Streams its stdout/stderr, forwards SIGINT/SIGTERM (the third cancels the call and "
        "kills it) and exits with its exit code (128+N if killed by signal N, 124 on timeout).\n"
        "With -d it starts in the background instead and sbx prints its process id.");
    sub->add_option("id", a->id, "Claim id")->required();
    sub->add_option("argv", a->argv, "Command and arguments (after --; no shell: use sh -c)");
    sub->add_flag("-i,--stdin", a->interactive,
                  "Forward this process's standard input to the command (else it reads "
                  "/dev/null)");
    sub->add_option("--env", a->env, "Environment variable K=V (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    sub->add_option("--cwd", a->cwd, "Working directory, relative to the workspace");
    sub->add_option("--timeout-exec", a->timeout_exec,
                    "Kill the command after this long, e.g. 30s (default 10m, at most 24h)")
        ->check(DurationCheck());
    sub->add_option("--max-output", a->max_output,
                    "Cap on stdout+stderr bytes sent back; the rest is discarded (default 16 "
                    "MiB)")
        ->check(CLI::NonNegativeNumber);
    sub->add_flag("-d,--detach", a->detach,
                  "Start it in the background and print its process id (sbx ps, attach, kill; "
                  "with -i its stdin is a pipe for attach -i)");
    sub->add_option("--tag", a->tag, "With -d: a name to find the process by (attach, kill)");
    actions[sub] = [&ctx, a] { return RunExec(ctx, *a); };
  }
  {
    auto from = std::make_shared<std::string>();
    auto to = std::make_shared<std::string>();
    auto recursive = std::make_shared<bool>(false);
    CLI::App* sub = app.add_subcommand(
        "cp",
        "Copy a file (or with -r a directory) between this machine and a sandbox:\n"
        "  sbx cp LOCAL ID:PATH   (ID:DIR/ or ID: keeps the local name; keeps the file mode)\n"
        "  sbx cp ID:PATH LOCAL   (LOCAL may be a directory)\n"
        "  sbx cp -r DIR ID:DIR   (a tar stream; ID:/abs/path names the sandbox's root)\n"
        "'-' is stdin or stdout. A local path with ':' is written ./a:b.");
    sub->add_option("source", *from, "LOCAL, ID:PATH or -")->required();
    sub->add_option("destination", *to, "ID:PATH, LOCAL or -")->required();
    sub->add_flag("-r,--recursive", *recursive,
                  "Copy a directory (as a tar stream; extracted beneath the destination, links "
                  "never followed, devices skipped, setuid bits cleared)");
    actions[sub] = [&ctx, from, to, recursive] { return RunCp(ctx, *from, *to, *recursive); };
  }
  {
    auto id = std::make_shared<std::string>();
    auto path = std::make_shared<std::string>();
    auto recursive = std::make_shared<bool>(false);
    CLI::App* sub = app.add_subcommand("ls", "List a directory of a sandbox's workspace");
    sub->add_option("id", *id, "Claim id")->required();
    sub->add_option("path", *path, "Directory relative to the workspace (default: the workspace)");
    sub->add_flag("-r,--recursive", *recursive, "Everything below the directory");
    actions[sub] = [&ctx, id, path, recursive] { return RunLs(ctx, *id, *path, *recursive); };
  }
  for (const bool suspend : {true, false}) {
    auto id = std::make_shared<std::string>();
    CLI::App* sub =
        suspend ? app.add_subcommand("suspend",
                                     "Freeze every process of a claimed sandbox (its TTL keeps "
                                     "running)")
                : app.add_subcommand("resume", "Thaw a suspended sandbox");
    sub->add_option("id", *id, "Claim id")->required();
    actions[sub] = [&ctx, id, suspend] { return RunSuspendResume(ctx, *id, suspend); };
  }
}

}  // namespace sbx::cli
