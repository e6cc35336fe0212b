#include "src/server/sandbox_service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"
#include "src/server/call.h"
#include "src/server/convert.h"
#include "src/server/daemon_call.h"

namespace sbx::server {
namespace {

namespace sd = ::sbx::sandboxd::v1;
using Stub = sd::Sandboxd::Stub;

constexpr int kMaxArgv = 4096;
constexpr size_t kMaxArgvBytes = 256 * 1024;
constexpr size_t kMaxStdinChunk = 1024 * 1024;
constexpr int64_t kDefaultOutputBytes = 16 * 1024 * 1024;
constexpr int64_t kMaxRequestedOutputBytes = int64_t{1} << 30;
constexpr int64_t kDaemonMaxOutputBytes = 64 * 1024 * 1024;
constexpr absl::Duration kDefaultExecTimeout = absl::Minutes(10);
constexpr absl::Duration kMaxExecTimeout = absl::Hours(24);
constexpr size_t kMaxFileChunk = 1024 * 1024;
constexpr int kDefaultListPage = 100;
constexpr int kMaxListPage = 1000;

absl::Status CheckSignal(int signal) {
  switch (signal) {
    case v1::SIGNAL_HUP:
    case v1::SIGNAL_INT:
    case v1::SIGNAL_QUIT:
    case v1::SIGNAL_KILL:
    case v1::SIGNAL_USR1:
    case v1::SIGNAL_USR2:
    case v1::SIGNAL_TERM:
    case v1::SIGNAL_CONT:
    case v1::SIGNAL_STOP:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("signal.signal ", signal, " is not a Signal sbx forwards"));
  }
}

// Checks ExecStart and builds the daemon's ExecStart (without the claim).
absl::Status ToDaemonStart(const v1::ExecStart& in, const SandboxLimits& limits,
                           sd::ExecStart* out) {
  if (in.argv_size() == 0) {
    return absl::InvalidArgumentError("start.argv is empty; give the program and its arguments");
  }
  if (in.argv_size() > kMaxArgv) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.argv has ", in.argv_size(), " entries; at most ", kMaxArgv));
  }
  if (in.argv(0).empty()) return absl::InvalidArgumentError("start.argv[0] is empty");
  size_t bytes = 0;
  for (const std::string& a : in.argv()) bytes += a.size();
  if (bytes > kMaxArgvBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.argv holds ", bytes, " bytes; at most ", kMaxArgvBytes));
  }
  RETURN_IF_ERROR(ValidateEnv("start.env", in.env()));
  ASSIGN_OR_RETURN(absl::Duration timeout, FromProto("start.timeout", in.timeout()));
  if (timeout > kMaxExecTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.timeout ", absl::FormatDuration(timeout), " is above 24h"));
  }
  if (timeout == absl::ZeroDuration()) timeout = kDefaultExecTimeout;
  int64_t max_output = in.max_output_bytes();
  if (max_output < 0 || max_output > kMaxRequestedOutputBytes) {
    return absl::InvalidArgumentError(absl::StrCat("start.max_output_bytes ", max_output,
                                                   " is outside 0..", kMaxRequestedOutputBytes));
  }
  if (max_output == 0) max_output = kDefaultOutputBytes;
  max_output = std::min(max_output, limits.max_exec_output_bytes);

  *out->mutable_argv() = in.argv();
  *out->mutable_env() = in.env();
  out->set_cwd(in.cwd());
  ToProto(timeout, out->mutable_timeout());
  out->set_max_output_bytes(max_output);
  out->set_attach_stdin(in.attach_stdin());
  return absl::OkStatus();
}

void ToClient(const sd::ExecResponse& in, v1::ExecResponse* out) {
  out->Clear();
  switch (in.kind_case()) {
    case sd::ExecResponse::kStarted:
      out->mutable_started()->set_pid(in.started().pid());
      *out->mutable_started()->mutable_started_at() = in.started().started_at();
      break;
    case sd::ExecResponse::kStdoutChunk:
      out->set_stdout_chunk(in.stdout_chunk());
      break;
    case sd::ExecResponse::kStderrChunk:
      out->set_stderr_chunk(in.stderr_chunk());
      break;
    case sd::ExecResponse::kExit: {
      const sd::ExecExit& e = in.exit();
      v1::ExecExit* x = out->mutable_exit();
      if (e.status_case() == sd::ExecExit::kSignal) {
        x->set_signal(e.signal());
      } else {
        x->set_exit_code(e.exit_code());
      }
      x->set_timed_out(e.timed_out());
      x->set_truncated(e.truncated());
      x->set_stdout_bytes(e.stdout_bytes());
      x->set_stderr_bytes(e.stderr_bytes());
      *x->mutable_duration() = e.duration();
      break;
    }
    case sd::ExecResponse::KIND_NOT_SET:
      break;
  }
}

}  // namespace

absl::Status SandboxLimits::Validate() const {
  if (max_concurrent_execs < 1 || max_concurrent_execs > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent_execs ", max_concurrent_execs, " is outside 1..1024"));
  }
  if (max_exec_output_bytes < 1 || max_exec_output_bytes > kDaemonMaxOutputBytes) {
    return absl::InvalidArgumentError(absl::StrCat("max_exec_output_bytes ", max_exec_output_bytes,
                                                   " is outside 1..", kDaemonMaxOutputBytes));
  }
  if (max_processes < 1 || max_processes > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_processes ", max_processes, " is outside 1..4096"));
  }
  if (max_ptys < 0 || max_ptys > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("max_ptys ", max_ptys, " is outside 0..1024"));
  }
  if (max_replay_bytes < (64 << 10) || max_replay_bytes > (int64_t{4} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_replay_bytes ", max_replay_bytes, " is outside 65536..4294967296"));
  }
  return absl::OkStatus();
}

absl::Status ExecSlots::Acquire(const std::string& sandbox) {
  absl::MutexLock lock(&mu_);
  int& n = running_[sandbox];
  if (n >= limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sandbox \"", sandbox, "\" already runs ", n,
                     " Exec calls, the server's limit (--max_concurrent_execs); retry when one "
                     "ends"));
  }
  ++n;
  return absl::OkStatus();
}

void ExecSlots::Release(const std::string& sandbox) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(sandbox);
  if (it != running_.end() && --it->second <= 0) running_.erase(it);
}

absl::StatusOr<store::ClaimRecord> SandboxService::ActiveClaim(const Caller& caller,
                                                               const std::string& claim_id) const {
  RETURN_IF_ERROR(RequireClaimId(claim_id));
  ASSIGN_OR_RETURN(store::ClaimRecord claim, allocator_->GetClaim(caller.tenant, claim_id));
  if (claim.state != store::ClaimState::kActive) {
    v1::ClaimState state = ToProto(claim.state);
    return absl::FailedPreconditionError(absl::StrCat("claim \"", claim_id, "\" is ",
                                                      v1::ClaimState_Name(state),
                                                      ", not ACTIVE; its sandbox is gone"));
  }
  if (claim.suspended) {
    return absl::FailedPreconditionError(
        absl::StrCat("the sandbox of claim \"", claim_id, "\" is suspended; Resume it first"));
  }
  return claim;
}

// ---------------------------------------------------------------------------------------
// Exec: a server reactor (client side) joined to a client reactor (daemon side).
//
// Two chains, one message in flight on each:
//   client --read--> [validate, translate] --write--> daemon   (next read after the write)
//   daemon --read--> [translate] --write--> client             (next read after the write)
// The call finishes with the daemon's final status (after the last write to the client),
// or with an error found here (then the daemon call is cancelled).
//
// The daemon reactor is held (AddHold) so that its OnDone cannot run while one of the
// chains may still start an operation on it; the hold goes once the daemon side is closed
// (its output ended, the call finished, or the client vanished) and no start is under way.
class ExecCall final : public grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse> {
 public:
  ExecCall(SandboxService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx), started_(absl::Now()) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override { Unref(); }  // the server side's reference

 private:
  class Daemon final : public grpc::ClientBidiReactor<sd::ExecRequest, sd::ExecResponse> {
   public:
    explicit Daemon(ExecCall* call) : call_(call) {}
    void OnWriteDone(bool ok) override { call_->DaemonWriteDone(ok); }
    void OnReadDone(bool ok) override { call_->DaemonReadDone(ok); }
    void OnDone(const grpc::Status& s) override { call_->DaemonDone(s); }

    std::unique_ptr<grpc::ClientContext> ctx;
    sd::ExecRequest out;
    sd::ExecResponse in;

   private:
    ExecCall* const call_;
  };

  absl::Status Begin();
  // Translates the client's message in_ into daemon_->out.
  absl::Status ToDaemon();
  void DaemonWriteDone(bool ok);
  void DaemonReadDone(bool ok);
  void DaemonDone(const grpc::Status& s);
  // Finishes the call with `status` (once; after the client write in flight, if any) and
  // cancels the daemon call if it still runs.
  void FinishWith(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Gate for starting operations on the daemon reactor: Enter() is false once it is
  // closed; every true Enter() is followed by Leave() after the Start* call.
  bool EnterDaemon() ABSL_LOCKS_EXCLUDED(mu_);
  void LeaveDaemon() ABSL_LOCKS_EXCLUDED(mu_);
  void CloseDaemon() ABSL_LOCKS_EXCLUDED(mu_);
  // True (once) when the hold on the daemon reactor may go: closed, no start under way.
  bool ShouldReleaseDaemon() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unref() ABSL_LOCKS_EXCLUDED(mu_);

  SandboxService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const absl::Time started_;  // for the exec duration metric
  v1::ExecRequest in_;
  v1::ExecResponse out_;
  // Set by Begin (on the first read, before any daemon callback); then constant.
  std::unique_ptr<Daemon> daemon_;
  uint64_t reset_generation_ = 0;  // SandboxdClients::ResetGeneration at Begin
  store::ClaimRecord claim_;
  bool attach_stdin_ = false;
  // Touched only by the client-read chain.
  bool stdin_closed_ = false;
  bool writes_done_ = false;

  absl::Mutex mu_;
  int refs_ ABSL_GUARDED_BY(mu_) = 1;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool client_write_pending_ ABSL_GUARDED_BY(mu_) = false;
  // A Finish held back until the client write in flight is done.
  std::optional<absl::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);
  bool daemon_closed_ ABSL_GUARDED_BY(mu_) = false;
  int daemon_starting_ ABSL_GUARDED_BY(mu_) = 0;
  bool daemon_released_ ABSL_GUARDED_BY(mu_) = false;
  bool holds_slot_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status ExecCall::Begin() {
  if (in_.kind_case() != v1::ExecRequest::kStart) {
    return absl::InvalidArgumentError("the first Exec message must be `start`");
  }
  const v1::ExecStart& start = in_.start();
  ASSIGN_OR_RETURN(Caller caller, Authorize(*service_->auth_, ctx_, false, "Exec"));
  ASSIGN_OR_RETURN(claim_, service_->ActiveClaim(caller, start.claim_id()));
  // Noted before the daemon call starts: a reset that begins later ends it with ABORTED.
  reset_generation_ = service_->daemons_->ResetGeneration(claim_.id);
  auto daemon = std::make_unique<Daemon>(this);
  RETURN_IF_ERROR(ToDaemonStart(start, service_->limits_, daemon->out.mutable_start()));
  ASSIGN_OR_RETURN(std::shared_ptr<Stub> stub, service_->daemons_->Stub(claim_));
  RETURN_IF_ERROR(service_->slots_.Acquire(claim_.sandbox_id));
  attach_stdin_ = start.attach_stdin();
  daemon->ctx = DaemonContext(ctx_, std::nullopt);
  daemon_ = std::move(daemon);
  {
    absl::MutexLock lock(&mu_);
    holds_slot_ = true;
    ++refs_;  // the daemon side's reference, dropped in DaemonDone
  }
  stub->async()->Exec(daemon_->ctx.get(), daemon_.get());
  daemon_->AddHold();
  daemon_->StartWrite(&daemon_->out);
  daemon_->StartRead(&daemon_->in);
  daemon_->StartCall();
  return absl::OkStatus();
}

absl::Status ExecCall::ToDaemon() {
  sd::ExecRequest& out = daemon_->out;
  out.Clear();
  switch (in_.kind_case()) {
    case v1::ExecRequest::kStart:
      return absl::InvalidArgumentError("a second `start` message; Exec runs one command");
    case v1::ExecRequest::kStdinChunk:
      if (!attach_stdin_) {
        return absl::InvalidArgumentError(
            "stdin_chunk without start.attach_stdin (the command's stdin is /dev/null)");
      }
      if (stdin_closed_) return absl::InvalidArgumentError("stdin_chunk after close_stdin");
      if (in_.stdin_chunk().size() > kMaxStdinChunk) {
        return absl::InvalidArgumentError(
            absl::StrCat("stdin_chunk of ", in_.stdin_chunk().size(), " bytes is above 1 MiB"));
      }
      out.set_stdin_chunk(in_.stdin_chunk());
      return absl::OkStatus();
    case v1::ExecRequest::kCloseStdin:
      if (!attach_stdin_) {
        return absl::InvalidArgumentError("close_stdin without start.attach_stdin");
      }
      if (stdin_closed_) return absl::InvalidArgumentError("a second close_stdin");
      stdin_closed_ = true;
      out.mutable_close_stdin();
      return absl::OkStatus();
    case v1::ExecRequest::kSignal:
      RETURN_IF_ERROR(CheckSignal(in_.signal().signal()));
      out.mutable_signal()->set_signal(in_.signal().signal());
      return absl::OkStatus();
    case v1::ExecRequest::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("an Exec message with no field set");
}

void ExecCall::OnReadDone(bool ok) {
  if (daemon_ == nullptr) {
    if (!ok) {
      return FinishWith(
          absl::InvalidArgumentError("the Exec stream ended before its first message (`start`)"));
    }
    if (absl::Status s = Begin(); !s.ok()) FinishWith(s);
    return;
  }
  if (!ok) {
    // The client half-closed (or the call ended): so does the daemon side, which closes
    // the command's stdin.
    if (writes_done_ || !EnterDaemon()) return;
    writes_done_ = true;
    daemon_->StartWritesDone();
    LeaveDaemon();
    return;
  }
  if (absl::Status s = ToDaemon(); !s.ok()) return FinishWith(s);
  if (!EnterDaemon()) return;
  daemon_->StartWrite(&daemon_->out);
  LeaveDaemon();
}

void ExecCall::DaemonWriteDone(bool ok) {
  // A failed write means the daemon call is ending; DaemonDone reports why.
  if (!ok) return;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
  }
  StartRead(&in_);
}

void ExecCall::DaemonReadDone(bool ok) {
  if (!ok) {
    // The daemon's stream is over; DaemonDone follows once the hold is gone.
    CloseDaemon();
    return;
  }
  ToClient(daemon_->in, &out_);
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    client_write_pending_ = true;
  }
  StartWrite(&out_);
}

void ExecCall::OnWriteDone(bool ok) {
  std::optional<absl::Status> deferred;
  {
    absl::MutexLock lock(&mu_);
    client_write_pending_ = false;
    deferred.swap(deferred_finish_);
  }
  if (deferred.has_value()) {
    AddErrorMetadata(ctx_, *deferred);
    Finish(ToGrpcStatus(*deferred));
    return;
  }
  if (!ok) {
    // The client is gone: stop the command.
    daemon_->ctx->TryCancel();
    CloseDaemon();
    return;
  }
  if (!EnterDaemon()) return;
  daemon_->StartRead(&daemon_->in);
  LeaveDaemon();
}

void ExecCall::DaemonDone(const grpc::Status& s) {
  bool release_slot;
  {
    absl::MutexLock lock(&mu_);
    release_slot = holds_slot_;
    holds_slot_ = false;
  }
  if (release_slot) service_->slots_.Release(claim_.sandbox_id);
  FinishWith(service_->daemons_->FromDaemonSince(s, claim_, reset_generation_));
  Unref();
}

void ExecCall::FinishWith(const absl::Status& status) {
  bool defer;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    defer = client_write_pending_;
    if (defer) deferred_finish_ = status;
  }
  if (service_->counters_ != nullptr) {
    service_->counters_->CountExec(status.code(), absl::Now() - started_);
  }
  if (daemon_ != nullptr) {
    daemon_->ctx->TryCancel();  // a no-op once the daemon call has ended
    CloseDaemon();
  }
  if (defer) return;  // OnWriteDone finishes
  AddErrorMetadata(ctx_, status);
  Finish(ToGrpcStatus(status));
}

bool ExecCall::EnterDaemon() {
  absl::MutexLock lock(&mu_);
  if (daemon_closed_) return false;
  ++daemon_starting_;
  return true;
}

void ExecCall::LeaveDaemon() {
  bool release;
  {
    absl::MutexLock lock(&mu_);
    --daemon_starting_;
    release = ShouldReleaseDaemon();
  }
  if (release) daemon_->RemoveHold();
}

void ExecCall::CloseDaemon() {
  bool release;
  {
    absl::MutexLock lock(&mu_);
    daemon_closed_ = true;
    release = ShouldReleaseDaemon();
  }
  if (release) daemon_->RemoveHold();
}

bool ExecCall::ShouldReleaseDaemon() {
  if (!daemon_closed_ || daemon_starting_ > 0 || daemon_released_) return false;
  daemon_released_ = true;
  return true;
}

void ExecCall::Unref() {
  bool last;
  {
    absl::MutexLock lock(&mu_);
    last = --refs_ == 0;
  }
  if (last) delete this;
}

grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse>* SandboxService::Exec(
    grpc::CallbackServerContext* ctx) {
  return new ExecCall(this, ctx);
}

// ---------------------------------------------------------------------------------------
// Unary file calls: checked here, forwarded to the daemon, answered from its callback.
namespace {}  // namespace

grpc::ServerUnaryReactor* SandboxService::WriteFile(grpc::CallbackServerContext* ctx,
                                                    const v1::WriteFileRequest* req,
                                                    v1::WriteFileResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "WriteFile");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<store::ClaimRecord> claim = ActiveClaim(*caller, req->claim_id());
  if (!claim.ok()) return FinishNow(ctx, claim.status());
  if (req->content().size() > kMaxFileChunk) {
    return FinishNow(ctx, absl::InvalidArgumentError(absl::StrCat(
                              "content of ", req->content().size(),
                              " bytes is above 1 MiB; write larger files in chunks with append")));
  }
  if (req->mode() > 07777) {
    return FinishNow(ctx, absl::InvalidArgumentError(
                              absl::StrCat("mode ", req->mode(), " is above 07777 (4095)")));
  }
  absl::StatusOr<std::shared_ptr<Stub>> stub = daemons_->Stub(*claim);
  if (!stub.ok()) return FinishNow(ctx, stub.status());
  sd::WriteFileRequest r;
  r.set_path(req->path());
  r.set_content(req->content());
  r.set_mode(req->mode());
  r.set_append(req->append());
  r.set_create_parents(req->create_parents());
  return Forward<v1::WriteFileResponse, sd::WriteFileRequest, sd::WriteFileResponse>(
      ctx, resp, std::move(*stub), std::move(*claim), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::WriteFileRequest* q, sd::WriteFileResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->WriteFile(c, q, p, std::move(f)); },
      [](const sd::WriteFileResponse& in, v1::WriteFileResponse* out) {
        out->set_size(in.size());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::ReadFile(grpc::CallbackServerContext* ctx,
                                                   const v1::ReadFileRequest* req,
                                                   v1::ReadFileResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "ReadFile");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<store::ClaimRecord> claim = ActiveClaim(*caller, req->claim_id());
  if (!claim.ok()) return FinishNow(ctx, claim.status());
  if (req->offset() < 0) {
    return FinishNow(
        ctx, absl::InvalidArgumentError(absl::StrCat("offset ", req->offset(), " is negative")));
  }
  if (req->limit() < 0 || req->limit() > static_cast<int64_t>(kMaxFileChunk)) {
    return FinishNow(ctx, absl::InvalidArgumentError(absl::StrCat(
                              "limit ", req->limit(), " is outside 0..1048576 (1 MiB)")));
  }
  absl::StatusOr<std::shared_ptr<Stub>> stub = daemons_->Stub(*claim);
  if (!stub.ok()) return FinishNow(ctx, stub.status());
  sd::ReadFileRequest r;
  r.set_path(req->path());
  r.set_offset(req->offset());
  r.set_limit(req->limit() == 0 ? static_cast<int64_t>(kMaxFileChunk) : req->limit());
  return Forward<v1::ReadFileResponse, sd::ReadFileRequest, sd::ReadFileResponse>(
      ctx, resp, std::move(*stub), std::move(*claim), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::ReadFileRequest* q, sd::ReadFileResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->ReadFile(c, q, p, std::move(f)); },
      [](const sd::ReadFileResponse& in, v1::ReadFileResponse* out) {
        out->set_content(in.content());
        out->set_size(in.size());
        out->set_eof(in.eof());
        out->set_mode(in.mode());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::ListFiles(grpc::CallbackServerContext* ctx,
                                                    const v1::ListFilesRequest* req,
                                                    v1::ListFilesResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "ListFiles");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<store::ClaimRecord> claim = ActiveClaim(*caller, req->claim_id());
  if (!claim.ok()) return FinishNow(ctx, claim.status());
  if (req->page_size() < 0 || req->page_size() > kMaxListPage) {
    return FinishNow(ctx, absl::InvalidArgumentError(absl::StrCat(
                              "page_size ", req->page_size(), " is outside 0..", kMaxListPage)));
  }
  const int page_size = req->page_size() == 0 ? kDefaultListPage : req->page_size();
  const uint64_t fingerprint =
      Fingerprint({req->claim_id(), req->path(), req->recursive() ? "r" : "-"});
  absl::StatusOr<std::string> after = DecodePageToken("files", fingerprint, req->page_token());
  if (!after.ok()) return FinishNow(ctx, after.status());
  absl::StatusOr<std::shared_ptr<Stub>> stub = daemons_->Stub(*claim);
  if (!stub.ok()) return FinishNow(ctx, stub.status());
  sd::ListFilesRequest r;
  r.set_path(req->path());
  r.set_recursive(req->recursive());
  // The daemon lists the whole directory (ordered by path, capped at 10,000 entries);
  // this page is the part after the token's path.
  return Forward<v1::ListFilesResponse, sd::ListFilesRequest, sd::ListFilesResponse>(
      ctx, resp, std::move(*stub), std::move(*claim), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::ListFilesRequest* q, sd::ListFilesResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->ListFiles(c, q, p, std::move(f)); },
      [page_size, fingerprint, after = *after, path = req->path()](
          const sd::ListFilesResponse& in, v1::ListFilesResponse* out) -> absl::Status {
        auto it = std::upper_bound(
            in.entries().begin(), in.entries().end(), after,
            [](const std::string& a, const sd::FileEntry& e) { return a < e.path(); });
        if (after.empty()) it = in.entries().begin();
        for (; it != in.entries().end(); ++it) {
          if (out->files_size() == page_size) {
            out->set_next_page_token(
                EncodePageToken("files", fingerprint, out->files(page_size - 1).path()));
            return absl::OkStatus();
          }
          v1::FileInfo* f = out->add_files();
          f->set_path(it->path());
          f->set_type(static_cast<v1::FileType>(it->type()));
          f->set_size(it->size());
          f->set_mode(it->mode());
          *f->mutable_modified_at() = it->mtime();
        }
        if (in.truncated()) {
          out->Clear();
          return absl::OutOfRangeError(absl::StrCat(
              "\"", path, "\" holds more than 10000 entries; list its subdirectories instead"));
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::Suspend(grpc::CallbackServerContext* ctx,
                                                  const v1::SuspendRequest* req,
                                                  v1::SuspendResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Suspend");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (absl::Status s = RequireClaimId(req->claim_id()); !s.ok()) return FinishNow(ctx, s);
  auto call = AsyncUnary<v1::SuspendResponse>::Create(ctx, resp);
  allocator_->Suspend(caller->tenant, req->claim_id(),
                      [call](absl::StatusOr<allocator::ClaimResult> result) {
                        call->Complete(result.status(), [&](v1::SuspendResponse* out) {
                          v1::Claim claim;
                          ToProto(result->claim, &claim);
                          *out->mutable_sandbox() = claim.sandbox();
                          return absl::OkStatus();
                        });
                      });
  return call->reactor();
}

grpc::ServerUnaryReactor* SandboxService::Resume(grpc::CallbackServerContext* ctx,
                                                 const v1::ResumeRequest* req,
                                                 v1::ResumeResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Resume");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (absl::Status s = RequireClaimId(req->claim_id()); !s.ok()) return FinishNow(ctx, s);
  auto call = AsyncUnary<v1::ResumeResponse>::Create(ctx, resp);
  allocator_->Resume(caller->tenant, req->claim_id(),
                     [call](absl::StatusOr<allocator::ClaimResult> result) {
                       call->Complete(result.status(), [&](v1::ResumeResponse* out) {
                         v1::Claim claim;
                         ToProto(result->claim, &claim);
                         *out->mutable_sandbox() = claim.sandbox();
                         return absl::OkStatus();
                       });
                     });
  return call->reactor();
}

// ---------------------------------------------------------------------------------------
// Processes.

absl::StatusOr<std::pair<store::ClaimRecord, std::shared_ptr<Stub>>> SandboxService::OpenSandbox(
    grpc::CallbackServerContext* ctx, const std::string& claim_id, absl::string_view method) const {
  ASSIGN_OR_RETURN(Caller caller, Authorize(*auth_, ctx, false, method));
  ASSIGN_OR_RETURN(store::ClaimRecord claim, ActiveClaim(caller, claim_id));
  ASSIGN_OR_RETURN(std::shared_ptr<Stub> stub, daemons_->Stub(claim));
  return std::make_pair(std::move(claim), std::move(stub));
}

namespace {

absl::Status ToDaemon(const v1::ProcessSelector& in, sd::ProcessSelector* out) {
  switch (in.selector_case()) {
    case v1::ProcessSelector::kPid:
      out->set_pid(in.pid());
      return absl::OkStatus();
    case v1::ProcessSelector::kTag:
      out->set_tag(in.tag());
      return absl::OkStatus();
    case v1::ProcessSelector::SELECTOR_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("process: give a pid or a tag");
}

void ToClient(const sd::ProcessStarted& in, v1::ProcessStarted* out) {
  out->set_pid(in.pid());
  out->set_tag(in.tag());
  *out->mutable_started_at() = in.started_at();
}

void ToClient(const sd::ProcessExit& in, v1::ProcessExit* out) {
  if (in.status_case() == sd::ProcessExit::kSignal) {
    out->set_signal(in.signal());
  } else {
    out->set_exit_code(in.exit_code());
  }
  *out->mutable_ended_at() = in.ended_at();
  *out->mutable_duration() = in.duration();
  out->set_output_bytes(in.output_bytes());
  out->set_dropped_bytes(in.dropped_bytes());
}

void ToClient(const sd::ProcessEvent& in, v1::ProcessEvent* out) {
  out->Clear();
  switch (in.kind_case()) {
    case sd::ProcessEvent::kStarted:
      ToClient(in.started(), out->mutable_started());
      break;
    case sd::ProcessEvent::kStdout:
      out->set_stdout(in.stdout());
      break;
    case sd::ProcessEvent::kStderr:
      out->set_stderr(in.stderr());
      break;
    case sd::ProcessEvent::kPty:
      out->set_pty(in.pty());
      break;
    case sd::ProcessEvent::kDropped:
      out->mutable_dropped()->set_bytes(in.dropped().bytes());
      break;
    case sd::ProcessEvent::kExit:
      ToClient(in.exit(), out->mutable_exit());
      break;
    case sd::ProcessEvent::KIND_NOT_SET:
      break;
  }
}

// Checks StartProcessRequest and builds the daemon's (without the claim, with the limits).
absl::Status ToDaemonStart(const v1::StartProcessRequest& in, const SandboxLimits& limits,
                           sd::StartProcessRequest* out) {
  if (in.argv_size() == 0) {
    return absl::InvalidArgumentError("argv is empty; give the program and its arguments");
  }
  if (in.argv_size() > kMaxArgv) {
    return absl::InvalidArgumentError(
        absl::StrCat("argv has ", in.argv_size(), " entries; at most ", kMaxArgv));
  }
  if (in.argv(0).empty()) return absl::InvalidArgumentError("argv[0] is empty");
  size_t bytes = 0;
  for (const std::string& a : in.argv()) bytes += a.size();
  if (bytes > kMaxArgvBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("argv holds ", bytes, " bytes; at most ", kMaxArgvBytes));
  }
  RETURN_IF_ERROR(ValidateEnv("env", in.env()));
  if (in.replay_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay_bytes ", in.replay_bytes(), " is negative"));
  }
  *out->mutable_argv() = in.argv();
  *out->mutable_env() = in.env();
  out->set_cwd(in.cwd());
  out->set_tag(in.tag());
  if (in.has_pty()) {
    out->mutable_pty()->mutable_size()->set_cols(in.pty().size().cols());
    out->mutable_pty()->mutable_size()->set_rows(in.pty().size().rows());
    out->mutable_pty()->set_term(in.pty().term());
  }
  out->set_stdin(in.stdin());
  out->set_detach(in.detach());
  out->set_replay_bytes(in.replay_bytes());
  if (in.has_pty() && limits.max_ptys == 0) {
    // The daemon reads 0 as "its own limit": refused here instead.
    return absl::ResourceExhaustedError(
        "this server runs no PTY processes: its limit (max_ptys) is 0");
  }
  out->mutable_limits()->set_max_processes(limits.max_processes);
  out->mutable_limits()->set_max_ptys(limits.max_ptys);
  out->mutable_limits()->set_max_replay_bytes(limits.max_replay_bytes);
  return absl::OkStatus();
}

// A process stream (StartProcess, ConnectProcess) is a ReadRelay (daemon_call.h): one
// message in flight, so a process's flood reaches the server one message at a time.
// Cancelling or leaving the call cancels the daemon call, which detaches from the process
// without stopping it.
using ProcessRelay = ReadRelay<sd::StartProcessRequest, sd::ProcessEvent, v1::ProcessEvent>;
using ConnectRelay = ReadRelay<sd::ConnectProcessRequest, sd::ProcessEvent, v1::ProcessEvent>;
using RefusedProcessStream = RefusedStream<v1::ProcessEvent>;

void ProcessToClient(sd::ProcessEvent& in, v1::ProcessEvent* out) { ToClient(in, out); }

}  // namespace

grpc::ServerWriteReactor<v1::ProcessEvent>* SandboxService::StartProcess(
    grpc::CallbackServerContext* ctx, const v1::StartProcessRequest* req) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "StartProcess");
  if (!sandbox.ok()) return new RefusedProcessStream(ctx, sandbox.status());
  sd::StartProcessRequest r;
  if (absl::Status s = ToDaemonStart(*req, limits_, &r); !s.ok()) {
    return new RefusedProcessStream(ctx, s);
  }
  return new ProcessRelay(
      ctx, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::StartProcessRequest* q,
         grpc::ClientReadReactor<sd::ProcessEvent>* r) { s->async()->StartProcess(c, q, r); },
      ProcessToClient, daemons_);
}

grpc::ServerWriteReactor<v1::ProcessEvent>* SandboxService::ConnectProcess(
    grpc::CallbackServerContext* ctx, const v1::ConnectProcessRequest* req) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "ConnectProcess");
  if (!sandbox.ok()) return new RefusedProcessStream(ctx, sandbox.status());
  sd::ConnectProcessRequest r;
  if (absl::Status s = ToDaemon(req->process(), r.mutable_process()); !s.ok()) {
    return new RefusedProcessStream(ctx, s);
  }
  return new ConnectRelay(
      ctx, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::ConnectProcessRequest* q,
         grpc::ClientReadReactor<sd::ProcessEvent>* r) { s->async()->ConnectProcess(c, q, r); },
      ProcessToClient, daemons_);
}

grpc::ServerUnaryReactor* SandboxService::ListProcesses(grpc::CallbackServerContext* ctx,
                                                        const v1::ListProcessesRequest* req,
                                                        v1::ListProcessesResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "ListProcesses");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  return Forward<v1::ListProcessesResponse, sd::ListProcessesRequest, sd::ListProcessesResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), sd::ListProcessesRequest(),
      [](Stub* s, grpc::ClientContext* c, const sd::ListProcessesRequest* q,
         sd::ListProcessesResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->ListProcesses(c, q, p, std::move(f)); },
      [](const sd::ListProcessesResponse& in, v1::ListProcessesResponse* out) {
        for (const sd::ProcessInfo& p : in.processes()) {
          v1::ProcessInfo* info = out->add_processes();
          info->set_pid(p.pid());
          info->set_tag(p.tag());
          *info->mutable_argv() = p.argv();
          info->set_cwd(p.cwd());
          if (p.has_pty()) {
            info->mutable_pty()->set_cols(p.pty().cols());
            info->mutable_pty()->set_rows(p.pty().rows());
          }
          info->set_stdin_open(p.stdin_open());
          *info->mutable_started_at() = p.started_at();
          if (p.has_exit()) ToClient(p.exit(), info->mutable_exit());
          info->set_readers(p.readers());
          info->set_output_bytes(p.output_bytes());
          info->set_dropped_bytes(p.dropped_bytes());
          info->set_buffered_bytes(p.buffered_bytes());
          info->set_replay_bytes(p.replay_bytes());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::SendProcessInput(grpc::CallbackServerContext* ctx,
                                                           const v1::SendProcessInputRequest* req,
                                                           v1::SendProcessInputResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "SendProcessInput");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  if (req->data().size() > kMaxStdinChunk) {
    return FinishNow(ctx, absl::InvalidArgumentError(absl::StrCat("data of ", req->data().size(),
                                                                  " bytes is above 1 MiB")));
  }
  sd::SendProcessInputRequest r;
  if (absl::Status s = ToDaemon(req->process(), r.mutable_process()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  r.set_data(req->data());
  return Forward<v1::SendProcessInputResponse, sd::SendProcessInputRequest,
                 sd::SendProcessInputResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::SendProcessInputRequest* q,
         sd::SendProcessInputResponse* p, std::function<void(grpc::Status)> f) {
        s->async()->SendProcessInput(c, q, p, std::move(f));
      },
      [](const sd::SendProcessInputResponse&, v1::SendProcessInputResponse*) {
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::CloseProcessInput(grpc::CallbackServerContext* ctx,
                                                            const v1::CloseProcessInputRequest* req,
                                                            v1::CloseProcessInputResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "CloseProcessInput");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  sd::CloseProcessInputRequest r;
  if (absl::Status s = ToDaemon(req->process(), r.mutable_process()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  return Forward<v1::CloseProcessInputResponse, sd::CloseProcessInputRequest,
                 sd::CloseProcessInputResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::CloseProcessInputRequest* q,
         sd::CloseProcessInputResponse* p, std::function<void(grpc::Status)> f) {
        s->async()->CloseProcessInput(c, q, p, std::move(f));
      },
      [](const sd::CloseProcessInputResponse&, v1::CloseProcessInputResponse*) {
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::SignalProcess(grpc::CallbackServerContext* ctx,
                                                        const v1::SignalProcessRequest* req,
                                                        v1::SignalProcessResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "SignalProcess");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  sd::SignalProcessRequest r;
  if (absl::Status s = ToDaemon(req->process(), r.mutable_process()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  if (absl::Status s = CheckSignal(req->signal()); !s.ok()) {
    return FinishNow(ctx, absl::InvalidArgumentError(absl::StrCat("signal ", req->signal(),
                                                                  " is not a Signal sbx "
                                                                  "forwards")));
  }
  r.set_signal(req->signal());
  return Forward<v1::SignalProcessResponse, sd::SignalProcessRequest, sd::SignalProcessResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::SignalProcessRequest* q,
         sd::SignalProcessResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->SignalProcess(c, q, p, std::move(f)); },
      [](const sd::SignalProcessResponse&, v1::SignalProcessResponse*) {
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::ResizeProcess(grpc::CallbackServerContext* ctx,
                                                        const v1::ResizeProcessRequest* req,
                                                        v1::ResizeProcessResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "ResizeProcess");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  sd::ResizeProcessRequest r;
  if (absl::Status s = ToDaemon(req->process(), r.mutable_process()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  r.mutable_size()->set_cols(req->size().cols());
  r.mutable_size()->set_rows(req->size().rows());
  return Forward<v1::ResizeProcessResponse, sd::ResizeProcessRequest, sd::ResizeProcessResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::ResizeProcessRequest* q,
         sd::ResizeProcessResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->ResizeProcess(c, q, p, std::move(f)); },
      [](const sd::ResizeProcessResponse&, v1::ResizeProcessResponse*) {
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::WaitProcess(grpc::CallbackServerContext* ctx,
                                                      const v1::WaitProcessRequest* req,
                                                      v1::WaitProcessResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "WaitProcess");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  sd::WaitProcessRequest r;
  if (absl::Status s = ToDaemon(req->process(), r.mutable_process()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  // No cap of its own: the wait lasts as long as the client's deadline allows.
  return Forward<v1::WaitProcessResponse, sd::WaitProcessRequest, sd::WaitProcessResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::WaitProcessRequest* q,
         sd::WaitProcessResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->WaitProcess(c, q, p, std::move(f)); },
      [](const sd::WaitProcessResponse& in, v1::WaitProcessResponse* out) {
        ToClient(in.process(), out->mutable_process());
        ToClient(in.exit(), out->mutable_exit());
        return absl::OkStatus();
      },
      std::nullopt);
}

}  // namespace sbx::server
