#pragma once
// The sbx.v1 services on a server without an allocator (ServerOptions::allocator): they
// are registered so that reflection lists the whole API, and each RPC answers
// UNIMPLEMENTED with a message naming the method.

#include "grpcpp/grpcpp.h"
#include "sbx/v1/admin.grpc.pb.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "sbx/v1/sandboxes.grpc.pb.h"

namespace sbx::server {

class PendingClaimService final : public sbx::v1::ClaimService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Claim(grpc::CallbackServerContext* ctx, const v1::ClaimRequest*,
                                  v1::ClaimResponse*) override;
  grpc::ServerUnaryReactor* ClaimBatch(grpc::CallbackServerContext* ctx,
                                       const v1::ClaimBatchRequest*,
                                       v1::ClaimBatchResponse*) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest*,
                                    v1::ReleaseResponse*) override;
  grpc::ServerUnaryReactor* Renew(grpc::CallbackServerContext* ctx, const v1::RenewRequest*,
                                  v1::RenewResponse*) override;
  grpc::ServerUnaryReactor* GetClaim(grpc::CallbackServerContext* ctx, const v1::GetClaimRequest*,
                                     v1::GetClaimResponse*) override;
  grpc::ServerUnaryReactor* ListClaims(grpc::CallbackServerContext* ctx,
                                       const v1::ListClaimsRequest*,
                                       v1::ListClaimsResponse*) override;
  grpc::ServerWriteReactor<v1::ClaimEvent>* WatchClaims(grpc::CallbackServerContext* ctx,
                                                        const v1::WatchClaimsRequest*) override;
};

class PendingSandboxService final : public sbx::v1::SandboxService::CallbackService {
 public:
  grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse>* Exec(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* WriteFile(grpc::CallbackServerContext* ctx, const v1::WriteFileRequest*,
                                      v1::WriteFileResponse*) override;
  grpc::ServerUnaryReactor* ReadFile(grpc::CallbackServerContext* ctx, const v1::ReadFileRequest*,
                                     v1::ReadFileResponse*) override;
  grpc::ServerUnaryReactor* ListFiles(grpc::CallbackServerContext* ctx, const v1::ListFilesRequest*,
                                      v1::ListFilesResponse*) override;
  grpc::ServerUnaryReactor* Suspend(grpc::CallbackServerContext* ctx, const v1::SuspendRequest*,
                                    v1::SuspendResponse*) override;
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* ctx, const v1::ResumeRequest*,
                                   v1::ResumeResponse*) override;
  grpc::ServerWriteReactor<v1::ProcessEvent>* StartProcess(grpc::CallbackServerContext* ctx,
                                                           const v1::StartProcessRequest*) override;
  grpc::ServerWriteReactor<v1::ProcessEvent>* ConnectProcess(
      grpc::CallbackServerContext* ctx, const v1::ConnectProcessRequest*) override;
  grpc::ServerUnaryReactor* ListProcesses(grpc::CallbackServerContext* ctx,
                                          const v1::ListProcessesRequest*,
                                          v1::ListProcessesResponse*) override;
  grpc::ServerUnaryReactor* SendProcessInput(grpc::CallbackServerContext* ctx,
                                             const v1::SendProcessInputRequest*,
                                             v1::SendProcessInputResponse*) override;
  grpc::ServerUnaryReactor* CloseProcessInput(grpc::CallbackServerContext* ctx,
                                              const v1::CloseProcessInputRequest*,
                                              v1::CloseProcessInputResponse*) override;
  grpc::ServerUnaryReactor* SignalProcess(grpc::CallbackServerContext* ctx,
                                          const v1::SignalProcessRequest*,
                                          v1::SignalProcessResponse*) override;
  grpc::ServerUnaryReactor* ResizeProcess(grpc::CallbackServerContext* ctx,
                                          const v1::ResizeProcessRequest*,
                                          v1::ResizeProcessResponse*) override;
  grpc::ServerUnaryReactor* WaitProcess(grpc::CallbackServerContext* ctx,
                                        const v1::WaitProcessRequest*,
                                        v1::WaitProcessResponse*) override;
};

class PendingAdminService final : public sbx::v1::AdminService::CallbackService {
 public:
  grpc::ServerUnaryReactor* PutTemplate(grpc::CallbackServerContext* ctx,
                                        const v1::PutTemplateRequest*,
                                        v1::PutTemplateResponse*) override;
  grpc::ServerUnaryReactor* GetTemplate(grpc::CallbackServerContext* ctx,
                                        const v1::GetTemplateRequest*,
                                        v1::GetTemplateResponse*) override;
  grpc::ServerUnaryReactor* ListTemplates(grpc::CallbackServerContext* ctx,
                                          const v1::ListTemplatesRequest*,
                                          v1::ListTemplatesResponse*) override;
  grpc::ServerUnaryReactor* DeleteTemplate(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteTemplateRequest*,
                                           v1::DeleteTemplateResponse*) override;
  grpc::ServerUnaryReactor* PutPool(grpc::CallbackServerContext* ctx, const v1::PutPoolRequest*,
                                    v1::PutPoolResponse*) override;
  grpc::ServerUnaryReactor* GetPool(grpc::CallbackServerContext* ctx, const v1::GetPoolRequest*,
                                    v1::GetPoolResponse*) override;
  grpc::ServerUnaryReactor* ListPools(grpc::CallbackServerContext* ctx, const v1::ListPoolsRequest*,
                                      v1::ListPoolsResponse*) override;
  grpc::ServerUnaryReactor* DeletePool(grpc::CallbackServerContext* ctx,
                                       const v1::DeletePoolRequest*,
                                       v1::DeletePoolResponse*) override;
  grpc::ServerUnaryReactor* ScalePool(grpc::CallbackServerContext* ctx, const v1::ScalePoolRequest*,
                                      v1::ScalePoolResponse*) override;
  grpc::ServerWriteReactor<v1::PoolEvent>* WatchPools(grpc::CallbackServerContext* ctx,
                                                      const v1::WatchPoolsRequest*) override;
};

}  // namespace sbx::server
