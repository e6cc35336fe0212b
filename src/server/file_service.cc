// The streamed file calls of SandboxService (UploadFile, UploadTar, DownloadFile,
// DownloadTar) and Stat, MakeDir, Move, Remove: checked here, relayed to the sandbox's
// daemon.
//
// Streams are relayed with one message in flight: an upload reads the client's next
// message only once the previous one was written to the daemon; a download reads the
// daemon's next chunk only once the previous one was written to the client. So a
// transfer of any size holds one chunk in the server (and gRPC's flow-control windows),
// and the slower side paces the other.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/server/call.h"
#include "src/server/daemon_call.h"
#include "src/server/sandbox_service.h"

namespace sbx::server {
namespace {

namespace sd = ::sbx::sandboxd::v1;
using Stub = sd::Sandboxd::Stub;
using OpenFn = std::function<absl::StatusOr<std::pair<store::ClaimRecord, std::shared_ptr<Stub>>>(
    const std::string& claim_id)>;

// Largest upload chunk relayed (the server's default receive limit is 4 MiB per message).
constexpr size_t kMaxUploadChunk = 4 << 20;

absl::Status CheckUploadStart(const v1::UploadStart& in, bool tar) {
  if (!tar && in.path().empty()) return absl::InvalidArgumentError("start.path is required");
  if (in.mode() > 07777) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.mode ", in.mode(), " is above 07777 (4095)"));
  }
  if (in.max_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.max_bytes ", in.max_bytes(), " is negative"));
  }
  if (in.max_entries() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.max_entries ", in.max_entries(), " is negative"));
  }
  return absl::OkStatus();
}

// One UploadFile or UploadTar call: a server read reactor towards the client joined to a
// client write reactor towards the daemon, one message in flight:
//   client --read--> [translate] --write--> daemon   (the next read after the write)
// The daemon call starts with the client's first message (it names the claim). The call
// finishes with the daemon's status and response. The daemon reactor is held while a
// write may still be started; the hold goes when the client half-closed (after
// WritesDone), when a write failed, or when the client's stream broke the rules (the
// daemon call is then cancelled and the call ends with that error).
class UploadRelay final : public grpc::ServerReadReactor<v1::UploadRequest> {
 public:
  UploadRelay(grpc::CallbackServerContext* ctx, v1::UploadResponse* response, bool tar, OpenFn open)
      : ctx_(ctx), response_(response), tar_(tar), open_(std::move(open)), daemon_(this) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!started_) {
      started_ = true;
      StartDaemon(ok);
      return;
    }
    if (!ok) {
      if (ctx_->IsCancelled()) {
        // The client went away: the daemon must not take this for the end of the file.
        daemon_ctx_->TryCancel();
      } else {
        // The client half-closed: end the daemon's stream (the upload commits if the
        // client sent `finish`; a server cannot tell a half-close from a broken
        // connection for sure, hence the explicit `finish`).
        daemon_.StartWritesDone();
      }
      ReleaseDaemon();
      return;
    }
    if (in_.has_start()) return Abort(absl::InvalidArgumentError("a second `start` message"));
    if (in_.chunk().size() > kMaxUploadChunk) {
      return Abort(absl::InvalidArgumentError(
          absl::StrCat("a chunk of ", in_.chunk().size(), " bytes is above ", kMaxUploadChunk)));
    }
    out_.Clear();
    if (in_.kind_case() == v1::UploadRequest::kFinish) {
      out_.set_finish(true);
    } else {
      out_.mutable_chunk()->swap(*in_.mutable_chunk());
    }
    daemon_.StartWrite(&out_);
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (daemon_started_) daemon_ctx_->TryCancel();
  }

  void OnDone() override { Unref(); }

 private:
  class Daemon final : public grpc::ClientWriteReactor<sd::UploadRequest> {
   public:
    explicit Daemon(UploadRelay* relay) : relay_(relay) {}
    void OnWriteDone(bool ok) override { relay_->DaemonWrote(ok); }
    void OnDone(const grpc::Status& s) override { relay_->DaemonDone(s); }

   private:
    UploadRelay* const relay_;
  };

  void Refuse(const absl::Status& status) {
    AddErrorMetadata(ctx_, status);
    Finish(ToGrpcStatus(status));
  }

  void StartDaemon(bool ok) {
    if (!ok || !in_.has_start()) {
      return Refuse(absl::InvalidArgumentError("the first message must be `start`"));
    }
    const v1::UploadStart& start = in_.start();
    if (absl::Status s = CheckUploadStart(start, tar_); !s.ok()) return Refuse(s);
    auto sandbox = open_(start.claim_id());
    if (!sandbox.ok()) return Refuse(sandbox.status());
    claim_ = std::move(sandbox->first);
    stub_ = std::move(sandbox->second);
    sd::UploadStart* d = out_.mutable_start();
    d->set_path(start.path());
    d->set_mode(start.mode());
    d->set_create_parents(start.create_parents());
    d->set_max_bytes(start.max_bytes());
    d->set_max_entries(start.max_entries());
    {
      absl::MutexLock lock(&mu_);
      daemon_ctx_ = DaemonContext(ctx_, std::nullopt);
      daemon_started_ = true;
      refs_ = 2;
    }
    if (tar_) {
      stub_->async()->UploadTar(daemon_ctx_.get(), &daemon_response_, &daemon_);
    } else {
      stub_->async()->UploadFile(daemon_ctx_.get(), &daemon_response_, &daemon_);
    }
    daemon_.AddHold();  // after the call is bound to the reactor
    daemon_.StartWrite(&out_);
    daemon_.StartCall();
  }

  void DaemonWrote(bool ok) {
    if (!ok) {
      // The daemon's side ended (an error, or the sandbox went away): DaemonDone says how.
      ReleaseDaemon();
      return;
    }
    StartRead(&in_);
  }

  // The client broke the stream's rules: cancel the daemon call, end with `status`.
  void Abort(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      error_ = status;
    }
    daemon_ctx_->TryCancel();
    ReleaseDaemon();
  }

  void ReleaseDaemon() {
    if (released_) return;
    released_ = true;
    daemon_.RemoveHold();
  }

  void DaemonDone(const grpc::Status& s) {
    absl::Status status = FromDaemon(s, claim_);
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) status = error_;
    }
    if (status.ok()) {
      response_->set_bytes(daemon_response_.bytes());
      response_->set_entries(daemon_response_.entries());
      response_->set_skipped(daemon_response_.skipped());
    }
    AddErrorMetadata(ctx_, status);
    Finish(ToGrpcStatus(status));
    Unref();
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  grpc::CallbackServerContext* const ctx_;
  v1::UploadResponse* const response_;
  const bool tar_;
  const OpenFn open_;
  Daemon daemon_;
  // Reactor callbacks below alternate (read, then write, then read), so these need no
  // lock.
  bool started_ = false;
  bool released_ = false;
  store::ClaimRecord claim_;
  std::shared_ptr<Stub> stub_;
  v1::UploadRequest in_;
  sd::UploadRequest out_;
  sd::UploadResponse daemon_response_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::ClientContext> daemon_ctx_;  // set once, before daemon_started_
  bool daemon_started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // The server side's OnDone, and the daemon side's OnDone once its call started.
  int refs_ ABSL_GUARDED_BY(mu_) = 1;
};

using DownloadRelay = ReadRelay<sd::DownloadRequest, sd::DownloadChunk, v1::DownloadChunk>;

void TranslateChunk(sd::DownloadChunk& in, v1::DownloadChunk* out) {
  out->mutable_data()->swap(*in.mutable_data());
  out->set_size(in.size());
  out->set_mode(in.mode());
}

using RefusedDownload = RefusedStream<v1::DownloadChunk>;

void ToClient(const sd::FileEntry& in, v1::FileInfo* out) {
  out->set_path(in.path());
  out->set_type(static_cast<v1::FileType>(in.type()));
  out->set_size(in.size());
  out->set_mode(in.mode());
  *out->mutable_modified_at() = in.mtime();
}

}  // namespace

grpc::ServerReadReactor<v1::UploadRequest>* SandboxService::UploadFile(
    grpc::CallbackServerContext* ctx, v1::UploadResponse* resp) {
  return new UploadRelay(ctx, resp, /*tar=*/false, [this, ctx](const std::string& claim_id) {
    return OpenSandbox(ctx, claim_id, "UploadFile");
  });
}

grpc::ServerReadReactor<v1::UploadRequest>* SandboxService::UploadTar(
    grpc::CallbackServerContext* ctx, v1::UploadResponse* resp) {
  return new UploadRelay(ctx, resp, /*tar=*/true, [this, ctx](const std::string& claim_id) {
    return OpenSandbox(ctx, claim_id, "UploadTar");
  });
}

grpc::ServerWriteReactor<v1::DownloadChunk>* SandboxService::DownloadFile(
    grpc::CallbackServerContext* ctx, const v1::DownloadRequest* req) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "DownloadFile");
  if (!sandbox.ok()) return new RefusedDownload(ctx, sandbox.status());
  if (req->path().empty()) {
    return new RefusedDownload(ctx, absl::InvalidArgumentError("path is required"));
  }
  sd::DownloadRequest r;
  r.set_path(req->path());
  return new DownloadRelay(
      ctx, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::DownloadRequest* q,
         grpc::ClientReadReactor<sd::DownloadChunk>* r) { s->async()->DownloadFile(c, q, r); },
      TranslateChunk);
}

grpc::ServerWriteReactor<v1::DownloadChunk>* SandboxService::DownloadTar(
    grpc::CallbackServerContext* ctx, const v1::DownloadRequest* req) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "DownloadTar");
  if (!sandbox.ok()) return new RefusedDownload(ctx, sandbox.status());
  sd::DownloadRequest r;
  r.set_path(req->path());
  return new DownloadRelay(
      ctx, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::DownloadRequest* q,
         grpc::ClientReadReactor<sd::DownloadChunk>* r) { s->async()->DownloadTar(c, q, r); },
      TranslateChunk);
}

grpc::ServerWriteReactor<v1::WatchDirEvent>* SandboxService::WatchDir(
    grpc::CallbackServerContext* ctx, const v1::WatchDirRequest* req) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "WatchDir");
  if (!sandbox.ok()) return new RefusedStream<v1::WatchDirEvent>(ctx, sandbox.status());
  sd::WatchDirRequest r;
  r.set_path(req->path());
  r.set_recursive(req->recursive());
  return new ReadRelay<sd::WatchDirRequest, sd::WatchDirEvent, v1::WatchDirEvent>(
      ctx, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::WatchDirRequest* q,
         grpc::ClientReadReactor<sd::WatchDirEvent>* r) { s->async()->WatchDir(c, q, r); },
      [](sd::WatchDirEvent& in, v1::WatchDirEvent* out) {
        out->set_type(static_cast<v1::FileEventType>(in.type()));
        out->mutable_path()->swap(*in.mutable_path());
        out->set_is_dir(in.is_dir());
        out->set_ready(in.ready());
        out->set_overflow(in.overflow());
      });
}

grpc::ServerUnaryReactor* SandboxService::Stat(grpc::CallbackServerContext* ctx,
                                               const v1::StatRequest* req, v1::StatResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "Stat");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  sd::StatRequest r;
  r.set_path(req->path());
  return Forward<v1::StatResponse, sd::StatRequest, sd::StatResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::StatRequest* q, sd::StatResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->Stat(c, q, p, std::move(f)); },
      [](const sd::StatResponse& in, v1::StatResponse* out) {
        ToClient(in.entry(), out->mutable_file());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* SandboxService::MakeDir(grpc::CallbackServerContext* ctx,
                                                  const v1::MakeDirRequest* req,
                                                  v1::MakeDirResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "MakeDir");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  if (req->mode() > 07777) {
    return FinishNow(ctx, absl::InvalidArgumentError(
                              absl::StrCat("mode ", req->mode(), " is above 07777 (4095)")));
  }
  sd::MakeDirRequest r;
  r.set_path(req->path());
  r.set_mode(req->mode());
  r.set_parents(req->parents());
  return Forward<v1::MakeDirResponse, sd::MakeDirRequest, sd::MakeDirResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::MakeDirRequest* q, sd::MakeDirResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->MakeDir(c, q, p, std::move(f)); },
      [](const sd::MakeDirResponse&, v1::MakeDirResponse*) { return absl::OkStatus(); });
}

grpc::ServerUnaryReactor* SandboxService::Move(grpc::CallbackServerContext* ctx,
                                               const v1::MoveRequest* req, v1::MoveResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "Move");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  sd::MoveRequest r;
  r.set_from(req->from());
  r.set_to(req->to());
  r.set_overwrite(req->overwrite());
  r.set_create_parents(req->create_parents());
  return Forward<v1::MoveResponse, sd::MoveRequest, sd::MoveResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::MoveRequest* q, sd::MoveResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->Move(c, q, p, std::move(f)); },
      [](const sd::MoveResponse&, v1::MoveResponse*) { return absl::OkStatus(); });
}

grpc::ServerUnaryReactor* SandboxService::Remove(grpc::CallbackServerContext* ctx,
                                                 const v1::RemoveRequest* req,
                                                 v1::RemoveResponse* resp) {
  auto sandbox = OpenSandbox(ctx, req->claim_id(), "Remove");
  if (!sandbox.ok()) return FinishNow(ctx, sandbox.status());
  sd::RemoveRequest r;
  r.set_path(req->path());
  r.set_recursive(req->recursive());
  return Forward<v1::RemoveResponse, sd::RemoveRequest, sd::RemoveResponse>(
      ctx, resp, std::move(sandbox->second), std::move(sandbox->first), std::move(r),
      [](Stub* s, grpc::ClientContext* c, const sd::RemoveRequest* q, sd::RemoveResponse* p,
         std::function<void(grpc::Status)> f) { s->async()->Remove(c, q, p, std::move(f)); },
      [](const sd::RemoveResponse&, v1::RemoveResponse*) { return absl::OkStatus(); });
}

}  // namespace sbx::server
