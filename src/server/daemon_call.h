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

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/server/call.h"
#include "src/server/sandboxd_client.h"

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

}  // namespace daemon_call_internal

using daemon_call_internal::Forward;

}  // namespace sbx::server
