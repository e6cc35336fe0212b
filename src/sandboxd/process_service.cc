// The process RPCs of SandboxdService (sandboxd.proto, "Processes"): streams that follow a
// process (ProcessStream), waits (WaitCall) and the unary calls, on top of ProcessTable.

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/sandboxd/service.h"

namespace sbx::sandboxd {
namespace {

// Output events carry at most this much.
constexpr size_t kEventBytes = 64 << 10;

void ToProto(const ProcessExitInfo& in, v1::ProcessExit* out) {
  if (in.signal > 0) {
    out->set_signal(in.signal);
  } else {
    out->set_exit_code(in.exit_code);
  }
  SetTimestamp(in.ended_at, out->mutable_ended_at());
  SetDuration(in.duration, out->mutable_duration());
  out->set_output_bytes(in.output_bytes);
  out->set_dropped_bytes(in.dropped_bytes);
}

void ToProto(const Process& process, v1::ProcessStarted* out) {
  out->set_pid(process.pid());
  out->set_tag(process.tag());
  SetTimestamp(process.started_at(), out->mutable_started_at());
}

// A stream refused before it started (no or wrong secret, a bad request): ends at once.
class RefusedStream final : public grpc::ServerWriteReactor<v1::ProcessEvent> {
 public:
  explicit RefusedStream(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// One StartProcess or ConnectProcess call: writes `started`, then (when following) pulls
// events from the process (Process::Next) one write at a time, to the exit. The process
// thread only signals (OnProcessUpdate); the message in flight is the only buffer, so a
// slow client costs the daemon nothing beyond the process's ring.
//
// At most one write is in flight (`writing_`, also held while Pump decides what to write);
// Finish is called once (End), never with a write in flight. The object keeps itself alive
// (self_) until OnDone; the process holds it while it is attached, until End detaches it.
class ProcessStream final : public grpc::ServerWriteReactor<v1::ProcessEvent>,
                            public ProcessReader {
 public:
  static std::shared_ptr<ProcessStream> Create() {
    std::shared_ptr<ProcessStream> stream(new ProcessStream());
    stream->self_ = stream;
    return stream;
  }

  // Writes `started` for `process`, then follows it (attaching now unless `attached`)
  // or, without `follow`, finishes OK. `self` is this stream (its caller's reference:
  // the call may end meanwhile).
  void Begin(const std::shared_ptr<ProcessStream>& self, std::shared_ptr<Process> process,
             bool follow, bool attached) {
    v1::ProcessEvent started;
    ToProto(*process, started.mutable_started());
    bool gone = false;
    {
      absl::MutexLock lock(&mu_);
      gone = finished_;  // cancelled while the process was starting
      if (!gone) {
        process_ = process;
        follow_ = follow;
        attached_ = follow;
        writing_ = true;
      }
    }
    if (gone) {
      if (attached) process->Detach(this);
      return;
    }
    out_ = std::move(started);
    StartWrite(&out_);
    if (follow && !attached) process->Attach(self);
  }

  // Ends the call with `status` (the process could not start).
  void Fail(const absl::Status& status) { End(ToGrpcStatus(status)); }

  void OnProcessUpdate() override {
    {
      absl::MutexLock lock(&mu_);
      dirty_ = true;
      if (writing_ || finished_ || !follow_ || process_ == nullptr) return;
      writing_ = true;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      {
        absl::MutexLock lock(&mu_);
        writing_ = false;
      }
      End(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    bool end = false;
    std::shared_ptr<Process> process;
    int64_t delivered = 0;
    {
      absl::MutexLock lock(&mu_);
      end = exit_written_ || !follow_;
      if (end) writing_ = false;
      process = process_;
      delivered = std::exchange(writing_end_, 0);
    }
    // The output in that message has reached the client: the ring may let it go.
    if (delivered > 0) process->Delivered(this, delivered);
    if (end) {
      End(grpc::Status::OK);
      return;
    }
    Pump();
  }

  void OnCancel() override {
    bool end = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      end = !writing_;
    }
    if (end) End(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  }

  void OnDone() override {
    std::shared_ptr<ProcessStream> keep = std::move(self_);  // may be the last reference
  }

 private:
  ProcessStream() = default;

  // Called owning the write slot (writing_ set): writes the next event, or gives the slot
  // up when there is none (a later OnProcessUpdate takes it again).
  void Pump() {
    std::shared_ptr<Process> process;
    int64_t end = 0;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (finished_) {
          writing_ = false;
          return;
        }
        if (cancelled_) {
          writing_ = false;
          break;
        }
        dirty_ = false;
        process = process_;
      }
      ProcessOutput next = process->Next(this, kEventBytes);
      if (next.kind == ProcessOutput::Kind::kNone) {
        absl::MutexLock lock(&mu_);
        if (dirty_ && !cancelled_) continue;
        writing_ = false;
        if (!cancelled_) return;
        break;
      }
      v1::ProcessEvent event;
      switch (next.kind) {
        case ProcessOutput::Kind::kData:
          switch (next.stream) {
            case OutputStream::kStdout:
              event.set_stdout(std::move(next.data));
              break;
            case OutputStream::kStderr:
              event.set_stderr(std::move(next.data));
              break;
            case OutputStream::kPty:
              event.set_pty(std::move(next.data));
              break;
          }
          end = next.end;
          break;
        case ProcessOutput::Kind::kDropped:
          event.mutable_dropped()->set_bytes(next.dropped);
          break;
        case ProcessOutput::Kind::kExit: {
          ToProto(next.exit, event.mutable_exit());
          absl::MutexLock lock(&mu_);
          exit_written_ = true;
          break;
        }
        case ProcessOutput::Kind::kNone:
          break;
      }
      {
        absl::MutexLock lock(&mu_);
        writing_end_ = end;
      }
      out_ = std::move(event);
      StartWrite(&out_);
      return;
    }
    End(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  }

  // Detaches from the process and finishes the call, once. No write may be in flight.
  void End(const grpc::Status& status) {
    std::shared_ptr<Process> process;
    bool detach = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      process = process_;
      detach = attached_;
    }
    if (detach) process->Detach(this);
    Finish(status);
  }

  absl::Mutex mu_;
  // Set by Create, cleared by OnDone (gRPC's last call).
  std::shared_ptr<ProcessStream> self_;
  std::shared_ptr<Process> process_ ABSL_GUARDED_BY(mu_);
  bool follow_ ABSL_GUARDED_BY(mu_) = false;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  // The write slot: a write is in flight or Pump is choosing one.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Set by OnProcessUpdate; Pump looks again before giving the slot up.
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool exit_written_ ABSL_GUARDED_BY(mu_) = false;
  // Set while a message of output is in flight: the offset it ends at (0: none).
  int64_t writing_end_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // The message in flight; owned by the write slot.
  v1::ProcessEvent out_;
};

// One WaitProcess call: answered by the process's waiter callback, or CANCELLED (then the
// waiter is forgotten, so that abandoned waits do not pile up on a long-lived process).
class WaitCall final : public grpc::ServerUnaryReactor {
 public:
  static void Start(std::shared_ptr<Process> process, v1::WaitProcessResponse* response,
                    grpc::ServerUnaryReactor** reactor) {
    std::shared_ptr<WaitCall> call(new WaitCall(process, response));
    call->self_ = call;
    *reactor = call.get();
    const uint64_t id =
        process->Wait([call](const ProcessExitInfo& exit) { call->Complete(exit); });
    bool cancel = false;
    {
      absl::MutexLock lock(&call->mu_);
      call->waiter_ = id;
      cancel = call->cancelled_ && id != 0;
    }
    if (cancel) process->CancelWait(id);
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (done_) return;
      done_ = true;
      id = waiter_;
    }
    if (id != 0) process_->CancelWait(id);
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  }

  void OnDone() override {
    std::shared_ptr<WaitCall> keep = std::move(self_);  // may be the last reference
  }

 private:
  WaitCall(std::shared_ptr<Process> process, v1::WaitProcessResponse* response)
      : process_(std::move(process)), response_(response) {}

  void Complete(const ProcessExitInfo& exit) {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      done_ = true;
    }
    ToProto(*process_, response_->mutable_process());
    ToProto(exit, response_->mutable_exit());
    Finish(grpc::Status::OK);
  }

  const std::shared_ptr<Process> process_;
  v1::WaitProcessResponse* const response_;
  absl::Mutex mu_;
  // Set by Start, cleared by OnDone (gRPC's last call).
  std::shared_ptr<WaitCall> self_;
  uint64_t waiter_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Process>> SandboxdService::FindProcess(
    const v1::ProcessSelector& selector) const {
  switch (selector.selector_case()) {
    case v1::ProcessSelector::kPid:
      if (selector.pid() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("process.pid ", selector.pid(), " is not a process id (1 or more)"));
      }
      return processes_->FindPid(selector.pid());
    case v1::ProcessSelector::kTag:
      if (absl::Status s = ValidateTag("process.tag", selector.tag(), false); !s.ok()) return s;
      return processes_->FindTag(selector.tag());
    case v1::ProcessSelector::SELECTOR_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("process: give a pid or a tag");
}

grpc::ServerWriteReactor<v1::ProcessEvent>* SandboxdService::StartProcess(
    grpc::CallbackServerContext* context, const v1::StartProcessRequest* request) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedStream(s);
  absl::StatusOr<ProcessSpec> spec = MakeProcessSpec(*request);
  if (!spec.ok()) return new RefusedStream(spec.status());
  ProcessLimits limits;
  limits.max_processes = request->limits().max_processes();
  limits.max_ptys = request->limits().max_ptys();
  limits.max_replay_bytes = request->limits().max_replay_bytes();
  const bool follow = !request->detach();
  std::shared_ptr<ProcessStream> stream = ProcessStream::Create();
  absl::Status started =
      processes_->Start(std::move(*spec), limits, follow ? stream : nullptr,
                        [stream, follow](absl::StatusOr<std::shared_ptr<Process>> process) {
                          if (!process.ok()) return stream->Fail(process.status());
                          stream->Begin(stream, std::move(*process), follow, /*attached=*/true);
                        });
  if (!started.ok()) stream->Fail(started);
  return stream.get();
}

grpc::ServerWriteReactor<v1::ProcessEvent>* SandboxdService::ConnectProcess(
    grpc::CallbackServerContext* context, const v1::ConnectProcessRequest* request) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedStream(s);
  absl::StatusOr<std::shared_ptr<Process>> process = FindProcess(request->process());
  if (!process.ok()) return new RefusedStream(process.status());
  std::shared_ptr<ProcessStream> stream = ProcessStream::Create();
  stream->Begin(stream, std::move(*process), /*follow=*/true, /*attached=*/false);
  return stream.get();
}

grpc::ServerUnaryReactor* SandboxdService::ListProcesses(grpc::CallbackServerContext* context,
                                                         const v1::ListProcessesRequest* request,
                                                         v1::ListProcessesResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return FinishWith(context, s);
  for (const std::shared_ptr<Process>& process : processes_->List()) {
    const ProcessStatus s = process->Status();
    v1::ProcessInfo* info = response->add_processes();
    info->set_pid(s.pid);
    info->set_tag(s.tag);
    for (const std::string& a : s.argv) info->add_argv(a);
    info->set_cwd(s.cwd);
    if (s.pty) {
      info->mutable_pty()->set_cols(s.cols);
      info->mutable_pty()->set_rows(s.rows);
    }
    info->set_stdin_open(s.stdin_open);
    SetTimestamp(s.started_at, info->mutable_started_at());
    if (s.exit.has_value()) ToProto(*s.exit, info->mutable_exit());
    info->set_readers(s.readers);
    info->set_output_bytes(s.output_bytes);
    info->set_dropped_bytes(s.dropped_bytes);
    info->set_buffered_bytes(s.buffered_bytes);
    info->set_replay_bytes(s.replay_bytes);
  }
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SandboxdService::SendProcessInput(
    grpc::CallbackServerContext* context, const v1::SendProcessInputRequest* request,
    v1::SendProcessInputResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return FinishWith(context, s);
  if (request->data().size() > kMaxInputBytes) {
    return FinishWith(context, absl::InvalidArgumentError(absl::StrCat(
                                   "data of ", request->data().size(),
                                   " bytes is larger than the limit of ", kMaxInputBytes)));
  }
  absl::StatusOr<std::shared_ptr<Process>> process = FindProcess(request->process());
  if (!process.ok()) return FinishWith(context, process.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Finished once the process has taken the bytes (on its thread), even if the client
  // has gone meanwhile: gRPC keeps the call until then.
  absl::Status queued = (*process)->WriteInput(
      request->data(), [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  if (!queued.ok()) reactor->Finish(ToGrpcStatus(queued));
  return reactor;
}

grpc::ServerUnaryReactor* SandboxdService::CloseProcessInput(
    grpc::CallbackServerContext* context, const v1::CloseProcessInputRequest* request,
    v1::CloseProcessInputResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return FinishWith(context, s);
  absl::StatusOr<std::shared_ptr<Process>> process = FindProcess(request->process());
  if (!process.ok()) return FinishWith(context, process.status());
  return FinishWith(context, (*process)->CloseInput());
}

grpc::ServerUnaryReactor* SandboxdService::SignalProcess(grpc::CallbackServerContext* context,
                                                         const v1::SignalProcessRequest* request,
                                                         v1::SignalProcessResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return FinishWith(context, s);
  if (request->signal() < 1 || request->signal() > 64) {
    return FinishWith(
        context, absl::InvalidArgumentError(absl::StrCat("signal ", request->signal(),
                                                         " is not a signal number from 1 to 64")));
  }
  absl::StatusOr<std::shared_ptr<Process>> process = FindProcess(request->process());
  if (!process.ok()) return FinishWith(context, process.status());
  return FinishWith(context, (*process)->Signal(request->signal()));
}

grpc::ServerUnaryReactor* SandboxdService::ResizeProcess(grpc::CallbackServerContext* context,
                                                         const v1::ResizeProcessRequest* request,
                                                         v1::ResizeProcessResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return FinishWith(context, s);
  if (absl::Status s = ValidatePtySize("size", request->size()); !s.ok()) {
    return FinishWith(context, s);
  }
  absl::StatusOr<std::shared_ptr<Process>> process = FindProcess(request->process());
  if (!process.ok()) return FinishWith(context, process.status());
  return FinishWith(context, (*process)->Resize(static_cast<uint16_t>(request->size().cols()),
                                                static_cast<uint16_t>(request->size().rows())));
}

grpc::ServerUnaryReactor* SandboxdService::WaitProcess(grpc::CallbackServerContext* context,
                                                       const v1::WaitProcessRequest* request,
                                                       v1::WaitProcessResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return FinishWith(context, s);
  absl::StatusOr<std::shared_ptr<Process>> process = FindProcess(request->process());
  if (!process.ok()) return FinishWith(context, process.status());
  grpc::ServerUnaryReactor* reactor = nullptr;
  WaitCall::Start(std::move(*process), response, &reactor);
  return reactor;
}

}  // namespace sbx::sandboxd
