#pragma once
// Calls from SandboxService to a sandbox's daemon (shared by sandbox_service.cc and
// file_service.cc): the client context of a daemon call made for a client's call, and
// Forward, which relays a unary call and answers from the daemon's callback.
//
// Thread-safety and lifetime: as SandboxService (sandbox_service.h).

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/server/call.h"
#include "src/server/sandboxd_client.h"
#include "src/server/status.h"

namespace sbx::server {

// File calls to a daemon that hangs end after this, whatever the client's deadline.
inline constexpr absl::Duration kFileCallTimeout = absl::Seconds(60);

// A client context for a call to the daemon on behalf of `ctx`: the client's cancellation
// and deadline carry over, and the call ends after `cap` at the latest.
inline std::unique_ptr<grpc::ClientContext> DaemonContext(grpc::CallbackServerContext* ctx,
                                                          std::optional<absl::Duration> cap) {
  std::unique_ptr<grpc::ClientContext> c = grpc::ClientContext::FromCallbackServerContext(*ctx);
  if (cap.has_value()) {
    const auto limit = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(*cap);
    if (ctx->deadline() > limit) c->set_deadline(limit);
  }
  return c;
}

namespace daemon_call_internal {
using Stub = ::sbx::sandboxd::v1::Sandboxd::Stub;
template <typename Response, typename DaemonRequest, typename DaemonResponse>
struct FileCall {
  std::shared_ptr<Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx;
  DaemonRequest request;
  DaemonResponse response;
  store::ClaimRecord claim;
  std::shared_ptr<AsyncUnary<Response>> call;
};

// Starts `invoke(stub, ctx, request, response, callback)` and finishes the client's call
// with fill(daemon response, client response) or the daemon's error.
// The daemon call ends after `cap` at the latest (nullopt: the client's deadline only).
template <typename Response, typename DaemonRequest, typename DaemonResponse, typename Invoke,
          typename Fill>
inline grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* ctx, Response* resp,
                                         std::shared_ptr<Stub> stub, store::ClaimRecord claim,
                                         DaemonRequest request, Invoke invoke, Fill fill,
                                         std::optional<absl::Duration> cap = kFileCallTimeout) {
  auto* fc = new FileCall<Response, DaemonRequest, DaemonResponse>;
  fc->stub = std::move(stub);
  fc->ctx = DaemonContext(ctx, cap);
  fc->request = std::move(request);
  fc->claim = std::move(claim);
  fc->call = AsyncUnary<Response>::Create(ctx, resp);
  grpc::ServerUnaryReactor* reactor = fc->call->reactor();
  invoke(fc->stub.get(), fc->ctx.get(), &fc->request, &fc->response,
         [fc, fill = std::move(fill)](grpc::Status s) {
           std::unique_ptr<FileCall<Response, DaemonRequest, DaemonResponse>> owned(fc);
           owned->call->Complete(FromDaemon(s, owned->claim),
                                 [&](Response* out) { return fill(owned->response, out); });
         });
  return reactor;
}

// A server-streamed call relayed from the daemon (DownloadFile, DownloadTar, WatchDir,
// StartProcess, ConnectProcess): a
// server write reactor towards the client joined to a client read reactor towards the
// daemon, one message in flight (StartProcess and ConnectProcess too): the daemon's next
// message is read only once the previous one reached the client. `start(stub, ctx,
// request, reactor)` starts the daemon call; `translate(in, out)` fills the client's
// message (it may take from `in`).
template <typename DaemonRequest, typename DaemonMsg, typename ClientMsg>
class ReadRelay final : public grpc::ServerWriteReactor<ClientMsg> {
 public:
  using StartFn = std::function<void(Stub*, grpc::ClientContext*, const DaemonRequest*,
                                     grpc::ClientReadReactor<DaemonMsg>*)>;
  using TranslateFn = std::function<void(DaemonMsg&, ClientMsg*)>;

  // `daemons` (optional): a reset of the claim that begins while the relay runs ends it
  // with ABORTED naming the snapshot (SandboxdClients::FromDaemonSince).
  ReadRelay(grpc::CallbackServerContext* ctx, std::shared_ptr<Stub> stub, store::ClaimRecord claim,
            DaemonRequest request, const StartFn& start, TranslateFn translate,
            SandboxdClients* daemons = nullptr)
      : ctx_(ctx),
        stub_(std::move(stub)),
        claim_(std::move(claim)),
        request_(std::move(request)),
        translate_(std::move(translate)),
        daemons_(daemons),
        reset_generation_(daemons != nullptr ? daemons->ResetGeneration(claim_.id) : 0),
        daemon_ctx_(DaemonContext(ctx, std::nullopt)),
        daemon_(this) {
    start(stub_.get(), daemon_ctx_.get(), &request_, &daemon_);
    daemon_.AddHold();  // after the call is bound to the reactor
    daemon_.StartRead(&in_);
    daemon_.StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      daemon_ctx_->TryCancel();
      daemon_.RemoveHold();
      return;
    }
    daemon_.StartRead(&in_);
  }

  void OnCancel() override { daemon_ctx_->TryCancel(); }
  void OnDone() override { Unref(); }

 private:
  class Daemon final : public grpc::ClientReadReactor<DaemonMsg> {
   public:
    explicit Daemon(ReadRelay* relay) : relay_(relay) {}
    void OnReadDone(bool ok) override { relay_->DaemonRead(ok); }
    void OnDone(const grpc::Status& s) override { relay_->DaemonDone(s); }

   private:
    ReadRelay* const relay_;
  };

  void DaemonRead(bool ok) {
    if (!ok) {
      daemon_.RemoveHold();  // the stream is over; DaemonDone says how
      return;
    }
    out_.Clear();
    translate_(in_, &out_);
    this->StartWrite(&out_);
  }

  void DaemonDone(const grpc::Status& s) {
    absl::Status status = daemons_ != nullptr
                              ? daemons_->FromDaemonSince(s, claim_, reset_generation_)
                              : FromDaemon(s, claim_);
    AddErrorMetadata(ctx_, status);
    this->Finish(ToGrpcStatus(status));
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
  const std::shared_ptr<Stub> stub_;
  const store::ClaimRecord claim_;
  const DaemonRequest request_;
  const TranslateFn translate_;
  SandboxdClients* const daemons_;
  const uint64_t reset_generation_;
  const std::unique_ptr<grpc::ClientContext> daemon_ctx_;
  Daemon daemon_;
  DaemonMsg in_;
  ClientMsg out_;
  absl::Mutex mu_;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;
};

// A server stream refused before it reached the daemon.
template <typename Msg>
class RefusedStream final : public grpc::ServerWriteReactor<Msg> {
 public:
  RefusedStream(grpc::CallbackServerContext* ctx, const absl::Status& status) {
    AddErrorMetadata(ctx, status);
    this->Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

}  // namespace daemon_call_internal

using daemon_call_internal::Forward;
using daemon_call_internal::ReadRelay;
using daemon_call_internal::RefusedStream;

}  // namespace sbx::server
