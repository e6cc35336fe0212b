#include "src/sandboxd/service.h"

#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"
#include "spdlog/spdlog.h"
#include "src/sandboxd/sandboxd.h"

namespace sbx::sandboxd {
namespace {

absl::Status ValidateEnv(absl::string_view what,
                         const google::protobuf::Map<std::string, std::string>& env) {
  for (const auto& [name, value] : env) {
    if (name.empty() || name.find('=') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " name \"", name, "\" is invalid: it must be non-empty, without '=' or NUL"));
    }
    if (value.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " value of \"", name, "\" contains a NUL byte"));
    }
  }
  return absl::OkStatus();
}

const char* KindName(v1::ExecRequest::KindCase kind) {
  switch (kind) {
    case v1::ExecRequest::kStart:
      return "start";
    case v1::ExecRequest::kStdinChunk:
      return "stdin_chunk";
    case v1::ExecRequest::kCloseStdin:
      return "close_stdin";
    case v1::ExecRequest::kSignal:
      return "signal";
    default:
      return "an empty message";
  }
}

// An Exec call refused before it started (no or wrong secret): ends at once.
class RefusedExec final : public grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse> {
 public:
  explicit RefusedExec(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// One Exec call. The stream's writes are sequenced here: at most one write is in flight
// (`writing_`); messages produced meanwhile wait in `queue_` and the next one starts from
// OnWriteDone. The runner thread produces messages (ExecSink); gRPC threads deliver reads,
// write completions and the cancel. Finish is called exactly once, when the runner has
// made its last call and no write is in flight; nothing touches the reactor after Finish
// (OnDone deletes it).
class ExecReactor final : public grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse>,
                          public ExecSink {
 public:
  explicit ExecReactor(SandboxdService* service) : service_(service) { StartRead(&request_); }

  void OnDone() override { delete this; }

  void OnReadDone(bool ok) override {
    if (!ok) {
      EndOfInput();
      return;
    }
    bool started = false;
    std::shared_ptr<ExecRunner> runner;
    {
      absl::MutexLock lock(&mu_);
      started = started_;
      runner = runner_;
    }
    if (!started) {
      HandleStart();
      return;
    }
    switch (request_.kind_case()) {
      case v1::ExecRequest::kStdinChunk: {
        if (!attach_stdin_) {
          return FailRunning(absl::InvalidArgumentError(
              "stdin_chunk sent, but start.attach_stdin was false (stdin is /dev/null)"));
        }
        if (stdin_closed_) {
          return FailRunning(absl::InvalidArgumentError("stdin_chunk sent after close_stdin"));
        }
        if (request_.stdin_chunk().size() > kMaxStdinChunkBytes) {
          return FailRunning(absl::InvalidArgumentError(
              absl::StrCat("stdin_chunk of ", request_.stdin_chunk().size(),
                           " bytes is larger than the limit of ", kMaxStdinChunkBytes)));
        }
        bool read_more = false;
        {
          // Under mu_ so that OnStdinWritable cannot slip in between "full" and the pause.
          absl::MutexLock lock(&mu_);
          read_more = runner->WriteStdin(std::move(*request_.mutable_stdin_chunk()));
          if (!read_more) read_paused_ = true;
        }
        if (read_more) StartRead(&request_);
        return;
      }
      case v1::ExecRequest::kCloseStdin:
        stdin_closed_ = true;
        runner->CloseStdin();
        StartRead(&request_);
        return;
      case v1::ExecRequest::kSignal: {
        const int signal = request_.signal().signal();
        if (signal < 1 || signal > 64) {
          return FailRunning(absl::InvalidArgumentError(
              absl::StrCat("signal ", signal, " is not a signal number from 1 to 64")));
        }
        runner->Signal(signal);
        StartRead(&request_);
        return;
      }
      case v1::ExecRequest::kStart:
        return FailRunning(absl::InvalidArgumentError("a second start message"));
      default:
        return FailRunning(absl::InvalidArgumentError("an empty ExecRequest (no kind set)"));
    }
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<ExecRunner> runner;
    int64_t consumed = 0;
    bool start_next = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      runner = runner_;
      consumed = writing_bytes_;
      writing_bytes_ = 0;
      if (!ok) {
        // The client is gone (cancelled, or the connection broke): stop the command.
        if (!final_status_) final_status_ = absl::CancelledError("the client went away");
      }
      if (final_status_) {
        consumed += DropQueueLocked();
      } else if (!queue_.empty()) {
        StartNextLocked();
        start_next = true;
      }
      finish = TakeFinishLocked();
    }
    if (runner != nullptr) {
      if (consumed > 0) runner->OutputConsumed(consumed);
      if (!ok) runner->Kill();
    }
    if (start_next) {
      StartWrite(&writing_);
    } else if (finish) {
      Finish(*finish);
    }
  }

  void OnCancel() override {
    std::shared_ptr<ExecRunner> runner;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!final_status_) final_status_ = absl::CancelledError("the call was cancelled");
      runner = runner_;
      if (!started_) runner_done_ = true;  // no command will ever report
      finish = TakeFinishLocked();
    }
    if (runner != nullptr) runner->Kill();
    if (finish) Finish(*finish);
  }

  // ExecSink, on the runner thread.
  void OnStarted(pid_t pid, absl::Time started_at) override {
    v1::ExecResponse msg;
    msg.mutable_started()->set_pid(pid);
    SetTimestamp(started_at, msg.mutable_started()->mutable_started_at());
    Send(std::move(msg), 0);
  }

  void OnOutput(bool is_stderr, std::string data) override {
    const int64_t bytes = static_cast<int64_t>(data.size());
    v1::ExecResponse msg;
    if (is_stderr) {
      msg.set_stderr_chunk(std::move(data));
    } else {
      msg.set_stdout_chunk(std::move(data));
    }
    Send(std::move(msg), bytes);
  }

  void OnStdinWritable() override {
    bool resume = false;
    {
      absl::MutexLock lock(&mu_);
      resume = read_paused_ && !finished_;
      read_paused_ = false;
    }
    if (resume) StartRead(&request_);
  }

  void OnExit(const ExecResult& result) override {
    v1::ExecResponse msg;
    v1::ExecExit* exit = msg.mutable_exit();
    if (result.signal > 0) {
      exit->set_signal(result.signal);
    } else {
      exit->set_exit_code(result.exit_code);
    }
    exit->set_timed_out(result.timed_out);
    exit->set_truncated(result.truncated);
    exit->set_stdout_bytes(result.stdout_bytes);
    exit->set_stderr_bytes(result.stderr_bytes);
    SetDuration(result.duration, exit->mutable_duration());
    bool start_write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      runner_done_ = true;
      if (!final_status_) {
        queue_.push_back({std::move(msg), 0});
        if (!write_in_flight_) {
          StartNextLocked();
          start_write = true;
        }
      }
      finish = TakeFinishLocked();
    }
    if (start_write) {
      StartWrite(&writing_);
    } else if (finish) {
      Finish(*finish);
    }
  }

  void OnStartFailed(absl::Status status) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      runner_done_ = true;
      if (!final_status_) final_status_ = std::move(status);
      finish = TakeFinishLocked();
    }
    if (finish) Finish(*finish);
  }

 private:
  struct Pending {
    v1::ExecResponse msg;
    // Output bytes in msg, reported to the runner once written.
    int64_t bytes = 0;
  };

  void HandleStart() {
    if (request_.kind_case() != v1::ExecRequest::kStart) {
      return FailBeforeStart(absl::InvalidArgumentError(
          absl::StrCat("the first message must be start, got ", KindName(request_.kind_case()))));
    }
    auto spec = service_->MakeSpec(request_.start());
    if (!spec.ok()) return FailBeforeStart(spec.status());
    attach_stdin_ = spec->attach_stdin;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // cancelled meanwhile
      started_ = true;
    }
    auto runner = service_->execs().Start(std::move(*spec), this);
    if (!runner.ok()) {
      std::optional<grpc::Status> finish;
      {
        absl::MutexLock lock(&mu_);
        runner_done_ = true;
        if (!final_status_) final_status_ = runner.status();
        finish = TakeFinishLocked();
      }
      if (finish) Finish(*finish);
      return;
    }
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      runner_ = *runner;
      cancelled = cancelled_;
    }
    if (cancelled) (*runner)->Kill();
    StartRead(&request_);
  }

  // The client finished sending (half-close), or reading failed because the call ended.
  void EndOfInput() {
    std::shared_ptr<ExecRunner> runner;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      runner = runner_;
      if (!started_) {
        if (!final_status_) {
          final_status_ = absl::InvalidArgumentError("the stream ended before a start message");
        }
        runner_done_ = true;
        finish = TakeFinishLocked();
      }
    }
    if (runner != nullptr) runner->CloseStdin();
    if (finish) Finish(*finish);
  }

  void FailBeforeStart(absl::Status status) {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!final_status_) final_status_ = std::move(status);
      runner_done_ = true;
      finish = TakeFinishLocked();
    }
    if (finish) Finish(*finish);
  }

  // A protocol error while the command runs: kill it; the call ends with `status` once
  // the runner has reported. No more reads.
  void FailRunning(absl::Status status) {
    std::shared_ptr<ExecRunner> runner;
    int64_t dropped = 0;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!final_status_) final_status_ = std::move(status);
      dropped = DropQueueLocked();
      runner = runner_;
      finish = TakeFinishLocked();
    }
    if (dropped > 0) runner->OutputConsumed(dropped);
    runner->Kill();
    if (finish) Finish(*finish);
  }

  void Send(v1::ExecResponse msg, int64_t bytes) {
    std::shared_ptr<ExecRunner> runner;
    bool start_write = false;
    {
      absl::MutexLock lock(&mu_);
      if (final_status_) {
        runner = runner_;  // the call ends with an error: the output goes nowhere
      } else {
        queue_.push_back({std::move(msg), bytes});
        if (!write_in_flight_) {
          StartNextLocked();
          start_write = true;
        }
      }
    }
    if (runner != nullptr && bytes > 0) runner->OutputConsumed(bytes);
    if (start_write) StartWrite(&writing_);
  }

  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = std::move(queue_.front().msg);
    writing_bytes_ = queue_.front().bytes;
    queue_.pop_front();
    write_in_flight_ = true;
  }

  int64_t DropQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t bytes = 0;
    for (const Pending& p : queue_) bytes += p.bytes;
    queue_.clear();
    return bytes;
  }

  // The status to Finish with, once: when the runner is done, no write is in flight and
  // either everything was written or the call ends with an error.
  std::optional<grpc::Status> TakeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !runner_done_ || write_in_flight_) return std::nullopt;
    if (!final_status_ && !queue_.empty()) return std::nullopt;
    finished_ = true;
    return final_status_ ? ToGrpcStatus(*final_status_) : grpc::Status::OK;
  }

  SandboxdService* const service_;
  // The read buffer; one read at a time, touched only in OnReadDone and before StartRead.
  v1::ExecRequest request_;
  // Set in HandleStart, read by later OnReadDone calls (reads are sequential).
  bool attach_stdin_ = false;
  bool stdin_closed_ = false;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ExecRunner> runner_ ABSL_GUARDED_BY(mu_);
  // The runner has made its last call (or there will be none).
  bool runner_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Set: the call ends with this status and without an exit message.
  std::optional<absl::Status> final_status_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  // The message being written; owned by the write in flight until OnWriteDone.
  v1::ExecResponse writing_;
  int64_t writing_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

void FillEntry(const Workspace::Entry& e, v1::FileEntry* out) {
  out->set_path(e.path);
  out->set_size(e.size);
  out->set_mode(e.mode);
  out->set_is_dir(e.kind == Workspace::Kind::kDirectory);
  SetTimestamp(e.mtime, out->mutable_mtime());
  switch (e.kind) {
    case Workspace::Kind::kRegular:
      out->set_type(v1::FILE_TYPE_REGULAR);
      break;
    case Workspace::Kind::kDirectory:
      out->set_type(v1::FILE_TYPE_DIRECTORY);
      break;
    case Workspace::Kind::kSymlink:
      out->set_type(v1::FILE_TYPE_SYMLINK);
      break;
    case Workspace::Kind::kOther:
      out->set_type(v1::FILE_TYPE_UNSPECIFIED);
      break;
  }
}

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t nanos = absl::ToUnixNanos(t);
  out->set_seconds(nanos / 1'000'000'000);
  out->set_nanos(static_cast<int32_t>(nanos % 1'000'000'000));
}

void SetDuration(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t nanos = absl::ToInt64Nanoseconds(d);
  out->set_seconds(nanos / 1'000'000'000);
  out->set_nanos(static_cast<int32_t>(nanos % 1'000'000'000));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode both follow google.rpc.Code, value for value.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

SandboxdService::SandboxdService(const Workspace* workspace, ExecManager* execs,
                                 ProcessTable* processes,
                                 std::map<std::string, std::string> base_env, std::string secret,
                                 std::string default_cwd)
    : workspace_(workspace),
      execs_(execs),
      processes_(processes),
      base_env_(std::move(base_env)),
      secret_(std::move(secret)),
      default_cwd_(std::move(default_cwd)) {}

absl::Status SandboxdService::CheckCaller(const grpc::CallbackServerContext& context) const {
  if (secret_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kSecretMetadata);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat("no sandbox secret: the call carries no \"", kSecretMetadata, "\" entry"));
  }
  // Constant time in the secret's bytes: a wrong guess says nothing about how much of it
  // was right. (Only the length is public.)
  const grpc::string_ref given = it->second;
  unsigned char diff = given.size() == secret_.size() ? 0 : 1;
  for (size_t i = 0; i < secret_.size(); ++i) {
    diff |= static_cast<unsigned char>(secret_[i]) ^
            static_cast<unsigned char>(i < given.size() ? given.data()[i] : 0);
  }
  if (diff != 0) return absl::UnauthenticatedError("wrong sandbox secret");
  return absl::OkStatus();
}

absl::StatusOr<ExecSpec> SandboxdService::MakeSpec(const v1::ExecStart& start) const {
  ExecSpec spec;
  if (start.argv().empty()) return absl::InvalidArgumentError("argv is empty");
  if (start.argv(0).empty()) return absl::InvalidArgumentError("argv[0] is empty");
  for (int i = 0; i < start.argv_size(); ++i) {
    if (start.argv(i).find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("argv[", i, "] contains a NUL byte"));
    }
    spec.argv.push_back(start.argv(i));
  }
  if (absl::Status s = ValidateEnv("env", start.env()); !s.ok()) return s;
  if (auto parts = workspace_->ParsePath("cwd", start.cwd(), true); !parts.ok()) {
    return parts.status();
  }
  spec.cwd = start.cwd();
  if (spec.cwd.empty()) spec.default_cwd = default_cwd_;
  if (start.timeout().seconds() < 0 || start.timeout().nanos() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout ", start.timeout().seconds(), "s ",
                                                   start.timeout().nanos(), "ns is negative"));
  }
  spec.timeout =
      absl::Seconds(start.timeout().seconds()) + absl::Nanoseconds(start.timeout().nanos());
  if (start.max_output_bytes() < 0 || start.max_output_bytes() > kMaxMaxOutputBytes) {
    return absl::InvalidArgumentError(absl::StrCat("max_output_bytes ", start.max_output_bytes(),
                                                   " is outside 0..", kMaxMaxOutputBytes));
  }
  spec.max_output_bytes =
      start.max_output_bytes() == 0 ? kDefaultMaxOutputBytes : start.max_output_bytes();
  spec.attach_stdin = start.attach_stdin();
  spec.env = MergedEnv(start.env());
  return spec;
}

absl::StatusOr<ProcessSpec> SandboxdService::MakeProcessSpec(
    const v1::StartProcessRequest& request) const {
  ProcessSpec spec;
  if (request.argv().empty()) return absl::InvalidArgumentError("argv is empty");
  if (request.argv(0).empty()) return absl::InvalidArgumentError("argv[0] is empty");
  for (int i = 0; i < request.argv_size(); ++i) {
    if (request.argv(i).find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("argv[", i, "] contains a NUL byte"));
    }
    spec.argv.push_back(request.argv(i));
  }
  if (absl::Status s = ValidateEnv("env", request.env()); !s.ok()) return s;
  if (auto parts = workspace_->ParsePath("cwd", request.cwd(), true); !parts.ok()) {
    return parts.status();
  }
  spec.cwd = request.cwd();
  if (spec.cwd.empty()) spec.default_cwd = default_cwd_;
  if (absl::Status s = ValidateTag("tag", request.tag(), true); !s.ok()) return s;
  spec.tag = request.tag();
  if (request.replay_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay_bytes ", request.replay_bytes(), " is negative"));
  }
  spec.replay_bytes = request.replay_bytes() == 0 ? kDefaultReplayBytes : request.replay_bytes();
  spec.stdin = request.stdin();
  spec.env = MergedEnv(request.env());
  if (request.has_pty()) {
    if (absl::Status s = ValidatePtySize("pty.size", request.pty().size()); !s.ok()) return s;
    const std::string& term = request.pty().term();
    if (term.size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("pty.term is ", term.size(), " bytes long; at most 64"));
    }
    for (char c : term) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError(absl::StrCat(
            "pty.term \"", term, "\" has a byte that is not printable ASCII (or a space)"));
      }
    }
    spec.pty = true;
    spec.cols = static_cast<uint16_t>(request.pty().size().cols());
    spec.rows = static_cast<uint16_t>(request.pty().size().rows());
    spec.env["TERM"] = term.empty() ? "xterm" : term;
  }
  return spec;
}

absl::Status ValidateTag(absl::string_view field, const std::string& tag, bool may_be_empty) {
  if (tag.empty()) {
    if (may_be_empty) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  bool ok = tag.size() <= 64;
  for (char c : tag) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", tag.substr(0, 80), "\" is not 1 to 64 bytes of [A-Za-z0-9._-]"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePtySize(absl::string_view field, const v1::PtySize& size) {
  if (size.cols() < 1 || size.cols() > kMaxPtySide || size.rows() < 1 ||
      size.rows() > kMaxPtySide) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", size.cols(), "x", size.rows(),
                                                   " is not 1 to ", kMaxPtySide,
                                                   " columns by 1 to ", kMaxPtySide, " rows"));
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> SandboxdService::MergedEnv(
    const google::protobuf::Map<std::string, std::string>& env) const {
  std::map<std::string, std::string> merged = base_env_;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, value] : configured_env_) merged[name] = value;
  }
  for (const auto& [name, value] : env) merged[name] = value;
  return merged;
}

grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse>* SandboxdService::Exec(
    grpc::CallbackServerContext* context) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedExec(ToGrpcStatus(s));
  return new ExecReactor(this);
}

absl::Status SandboxdService::DoConfigure(const v1::ConfigureRequest& request) {
  if (absl::Status s = ValidateEnv("env", request.env()); !s.ok()) return s;
  for (const v1::ConfigureFile& file : request.files()) {
    Workspace::WriteOptions options;
    options.mode = file.mode();
    options.create_parents = true;
    auto written = workspace_->WriteFile(file.path(), file.content(), options);
    if (!written.ok()) return written.status();
  }
  std::map<std::string, std::string> env(request.env().begin(), request.env().end());
  absl::MutexLock lock(&mu_);
  configured_env_ = std::move(env);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* SandboxdService::Configure(grpc::CallbackServerContext* context,
                                                     const v1::ConfigureRequest* request,
                                                     v1::ConfigureResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCaller(*context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  absl::Status status = DoConfigure(*request);
  spdlog::info("configure: {} env variables, {} files: {}", request->env_size(),
               request->files_size(), status.ToString());
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* SandboxdService::WriteFile(grpc::CallbackServerContext* context,
                                                     const v1::WriteFileRequest* request,
                                                     v1::WriteFileResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCaller(*context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  Workspace::WriteOptions options;
  options.mode = request->mode();
  options.append = request->append();
  options.create_parents = request->create_parents();
  auto size = workspace_->WriteFile(request->path(), request->content(), options);
  if (size.ok()) response->set_size(*size);
  reactor->Finish(ToGrpcStatus(size.status()));
  return reactor;
}

grpc::ServerUnaryReactor* SandboxdService::ReadFile(grpc::CallbackServerContext* context,
                                                    const v1::ReadFileRequest* request,
                                                    v1::ReadFileResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCaller(*context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  auto result = workspace_->ReadFile(request->path(), request->offset(), request->limit());
  if (result.ok()) {
    response->set_content(std::move(result->content));
    response->set_size(result->size);
    response->set_eof(result->eof);
    response->set_mode(result->mode);
  }
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* SandboxdService::ListFiles(grpc::CallbackServerContext* context,
                                                     const v1::ListFilesRequest* request,
                                                     v1::ListFilesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckCaller(*context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  auto result = workspace_->List(request->path(), request->recursive());
  if (result.ok()) {
    for (const Workspace::Entry& e : result->entries) {
      FillEntry(e, response->add_entries());
    }
    response->set_truncated(result->truncated);
  }
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

}  // namespace sbx::sandboxd
