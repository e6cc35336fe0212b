#include "src/server/pending_services.h"

#include <string>

namespace sbx::server {
namespace {

grpc::Status NotYet(const char* method) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      std::string(method) + " is not implemented by this sbx-server yet");
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const char* method) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(NotYet(method));
  return reactor;
}

// A server-streaming reactor that ends the call at once and deletes itself when done.
template <typename Resp>
class FinishedWriter final : public grpc::ServerWriteReactor<Resp> {
 public:
  explicit FinishedWriter(const char* method) { this->Finish(NotYet(method)); }
  void OnDone() override { delete this; }
};

class FinishedExec final : public grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse> {
 public:
  FinishedExec() { Finish(NotYet("sbx.v1.SandboxService/Exec")); }
  void OnDone() override { delete this; }
};

}  // namespace

#define SBX_PENDING_UNARY(Service, Method)                                                   \
  grpc::ServerUnaryReactor* Pending##Service::Method(                                        \
      grpc::CallbackServerContext* ctx, const v1::Method##Request*, v1::Method##Response*) { \
    return FinishUnary(ctx, "sbx.v1." #Service "/" #Method);                                 \
  }

SBX_PENDING_UNARY(ClaimService, Claim)
SBX_PENDING_UNARY(ClaimService, ClaimBatch)
SBX_PENDING_UNARY(ClaimService, Release)
SBX_PENDING_UNARY(ClaimService, Renew)
SBX_PENDING_UNARY(ClaimService, GetClaim)
SBX_PENDING_UNARY(ClaimService, ListClaims)
SBX_PENDING_UNARY(SandboxService, WriteFile)
SBX_PENDING_UNARY(SandboxService, ReadFile)
SBX_PENDING_UNARY(SandboxService, ListFiles)
SBX_PENDING_UNARY(SandboxService, Suspend)
SBX_PENDING_UNARY(SandboxService, Resume)
SBX_PENDING_UNARY(SandboxService, ListProcesses)
SBX_PENDING_UNARY(SandboxService, SendProcessInput)
SBX_PENDING_UNARY(SandboxService, CloseProcessInput)
SBX_PENDING_UNARY(SandboxService, SignalProcess)
SBX_PENDING_UNARY(SandboxService, ResizeProcess)
SBX_PENDING_UNARY(SandboxService, WaitProcess)
SBX_PENDING_UNARY(AdminService, PutTemplate)
SBX_PENDING_UNARY(AdminService, GetTemplate)
SBX_PENDING_UNARY(AdminService, ListTemplates)
SBX_PENDING_UNARY(AdminService, DeleteTemplate)
SBX_PENDING_UNARY(AdminService, PutPool)
SBX_PENDING_UNARY(AdminService, GetPool)
SBX_PENDING_UNARY(AdminService, ListPools)
SBX_PENDING_UNARY(AdminService, DeletePool)
SBX_PENDING_UNARY(AdminService, ScalePool)
#undef SBX_PENDING_UNARY

namespace {
grpc::ServerWriteReactor<v1::ClaimEvent>* PendingWatchClaims(grpc::CallbackServerContext*) {
  return new FinishedWriter<v1::ClaimEvent>("sbx.v1.ClaimService/WatchClaims");
}

grpc::ServerWriteReactor<v1::PoolEvent>* PendingWatchPools(grpc::CallbackServerContext*) {
  return new FinishedWriter<v1::PoolEvent>("sbx.v1.AdminService/WatchPools");
}
}  // namespace

grpc::ServerWriteReactor<v1::ClaimEvent>* PendingClaimService::WatchClaims(
    grpc::CallbackServerContext* ctx, const v1::WatchClaimsRequest*) {
  return PendingWatchClaims(ctx);
}

grpc::ServerWriteReactor<v1::PoolEvent>* PendingAdminService::WatchPools(
    grpc::CallbackServerContext* ctx, const v1::WatchPoolsRequest*) {
  return PendingWatchPools(ctx);
}

grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse>* PendingSandboxService::Exec(
    grpc::CallbackServerContext*) {
  return new FinishedExec();
}

grpc::ServerWriteReactor<v1::ProcessEvent>* PendingSandboxService::StartProcess(
    grpc::CallbackServerContext*, const v1::StartProcessRequest*) {
  return new FinishedWriter<v1::ProcessEvent>("sbx.v1.SandboxService/StartProcess");
}

grpc::ServerWriteReactor<v1::ProcessEvent>* PendingSandboxService::ConnectProcess(
    grpc::CallbackServerContext*, const v1::ConnectProcessRequest*) {
  return new FinishedWriter<v1::ProcessEvent>("sbx.v1.SandboxService/ConnectProcess");
}

}  // namespace sbx::server
