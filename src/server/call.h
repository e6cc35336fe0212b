#pragma once
// Helpers shared by the sbx.v1 service implementations: finishing unary calls (always
// through ToGrpcStatus, with the retry hint on RESOURCE_EXHAUSTED), authenticating the
// caller, and AsyncUnary, a reactor for calls that complete from an allocator callback.
//
// Thread-safety: AsyncUnary::Complete may be called from any thread, once or more (only
// the first completion, or the client's cancellation, wins).
// Lifetime: AsyncUnary keeps itself alive until gRPC is done with it (OnDone) and as long
// as a callback holds it; after OnDone, Complete does nothing.

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "src/server/auth.h"
#include "src/server/status.h"
#include "src/server/tenant_limits.h"

namespace sbx::server {

// Trailing metadata key of the retry hint on RESOURCE_EXHAUSTED (types.proto).
inline constexpr char kRetryAfterKey[] = "sbx-retry-after-ms";
// The hint: the allocator's own messages suggest about 1 s.
inline constexpr char kRetryAfterMs[] = "1000";

// Adds what an error needs besides its status (the retry hint).
// A refusal that knows how long to wait says so in its payload kRetryAfterPayload
// (tenant_limits.h); the others get the allocator's about 1 s.
inline void AddErrorMetadata(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    absl::optional<absl::Cord> wait = status.GetPayload(kRetryAfterPayload);
    ctx->AddTrailingMetadata(kRetryAfterKey, wait ? std::string(*wait) : kRetryAfterMs);
  }
}

// Finishes a unary call now with `status`.
inline grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* ctx,
                                           const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  AddErrorMetadata(ctx, status);
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The caller of this call. UNAUTHENTICATED without a valid token; PERMISSION_DENIED for
// a non-admin when `need_admin`.
[[nodiscard]] inline absl::StatusOr<Caller> Authorize(const Authenticator& auth,
                                                      grpc::CallbackServerContext* ctx,
                                                      bool need_admin, absl::string_view method) {
  std::optional<absl::string_view> authorization;
  const auto& md = ctx->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  absl::StatusOr<Caller> caller = auth.Authenticate(authorization);
  if (!caller.ok()) return caller.status();
  if (need_admin && !caller->admin) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tenant \"", caller->tenant, "\" is not an admin; ", method, " needs an admin token"));
  }
  return caller;
}

// A unary call answered later, from another thread. Create() it in the handler, return
// reactor(), and hand the shared pointer to the callback, which calls Complete(). If the
// client cancels first, the call ends CANCELLED at once and the later Complete is a no-op
// (the allocator's operation still runs to its end).
template <typename Response>
class AsyncUnary final : public grpc::ServerUnaryReactor {
 public:
  static std::shared_ptr<AsyncUnary> Create(grpc::CallbackServerContext* ctx, Response* response) {
    std::shared_ptr<AsyncUnary> call(new AsyncUnary(ctx, response));
    call->self_ = call;
    return call;
  }

  grpc::ServerUnaryReactor* reactor() { return this; }

  // Runs once with the status the call finishes with (including CANCELLED when the client
  // cancels first), on the finishing thread, before Finish. Set it before the call can
  // complete (right after Create).
  void set_on_finish(absl::AnyInvocable<void(const absl::Status&)> on_finish) {
    on_finish_ = std::move(on_finish);
  }

  // Runs once if the client cancels the call before it completes, after it finished
  // CANCELLED (to give up what the call was waiting for). Set it right after Create.
  void set_on_cancel(absl::AnyInvocable<void() &&> on_cancel) { on_cancel_ = std::move(on_cancel); }

  // On OK runs fill(response) and finishes OK; otherwise finishes with `status`. `fill`
  // may return a non-OK status to finish with that instead.
  template <typename Fill>
  void Complete(const absl::Status& status, Fill&& fill) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!Claim()) return;
    absl::Status final_status = status;
    // The response and context stay valid until Finish: gRPC calls OnDone only after it.
    if (final_status.ok()) final_status = std::forward<Fill>(fill)(response_);
    if (on_finish_) on_finish_(final_status);
    AddErrorMetadata(ctx_, final_status);
    Finish(ToGrpcStatus(final_status));
  }
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    Complete(status, [](Response*) { return absl::OkStatus(); });
  }

  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!Claim()) return;
    // Taken first: after Finish this object may go (OnDone) while the action still runs.
    absl::AnyInvocable<void()&&> on_cancel = std::move(on_cancel_);
    if (on_finish_) on_finish_(absl::CancelledError("the client cancelled the call"));
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call"));
    if (on_cancel) std::move(on_cancel)();
  }

  void OnDone() override {
    // Drops the self-reference; a callback may still hold the object (Complete is then a
    // no-op because `finished_` is set).
    std::shared_ptr<AsyncUnary> keep = std::move(self_);
  }
  // Lets gRPC run OnDone and OnCancel on the thread that completes the call instead of
  // handing them to its executor thread (a context switch per call: 27 us of CPU per
  // claim+release cycle on the benchmark VM, docs/benchmarks.md). gRPC 1.51 marks this
  // hook internal; it is safe here because both reactions are short and never block:
  // OnDone drops a reference, OnCancel finishes the call and tells the allocator, which
  // takes its own locks only briefly and runs its callbacks after releasing them. gRPC
  // runs inlined reactions from its application-callback queue, outside its own locks,
  // so OnCancel's Finish is not re-entrant into a call in progress.
  bool InternalInlineable() override { return true; }

 private:
  AsyncUnary(grpc::CallbackServerContext* ctx, Response* response)
      : ctx_(ctx), response_(response) {}

  // True for the one caller that gets to finish the call.
  bool Claim() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    finished_ = true;
    return true;
  }

  grpc::CallbackServerContext* const ctx_;
  Response* const response_;
  // Set before the call can complete; run by the one caller that finishes (Claim()).
  absl::AnyInvocable<void(const absl::Status&)> on_finish_;
  absl::AnyInvocable<void() &&> on_cancel_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Set by Create, cleared by OnDone (only gRPC's thread touches it after Create).
  std::shared_ptr<AsyncUnary> self_;
};

}  // namespace sbx::server
