#pragma once
// sbx.v1.ClaimService over the allocator: Claim, ClaimBatch, Release, Renew, GetClaim and
// ListClaims. The owner of every claim is the authenticated tenant, never a request field.
// Handlers never block: allocator calls complete through callbacks, which finish the call.
// WatchClaims is not implemented yet (UNIMPLEMENTED, see pending_services.h).
//
// Not applied yet (rejected rather than dropped): late-bound `config` (env, files) is
// UNIMPLEMENTED until the server has a runtime that can deliver it.
//
// Thread-safety: handlers run concurrently on gRPC's threads.
// Lifetime: the Allocator and Authenticator must outlive the service and every call in
// flight (shut the gRPC server down before destroying them).

#include "grpcpp/grpcpp.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "src/allocator/allocator.h"
#include "src/server/auth.h"

namespace sbx::server {

class ClaimService final : public sbx::v1::ClaimService::CallbackService {
 public:
  ClaimService(allocator::Allocator* allocator, const Authenticator* auth)
      : allocator_(allocator), auth_(auth) {}

  grpc::ServerUnaryReactor* Claim(grpc::CallbackServerContext* ctx, const v1::ClaimRequest* req,
                                  v1::ClaimResponse* resp) override;
  grpc::ServerUnaryReactor* ClaimBatch(grpc::CallbackServerContext* ctx,
                                       const v1::ClaimBatchRequest* req,
                                       v1::ClaimBatchResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* Renew(grpc::CallbackServerContext* ctx, const v1::RenewRequest* req,
                                  v1::RenewResponse* resp) override;
  grpc::ServerUnaryReactor* GetClaim(grpc::CallbackServerContext* ctx,
                                     const v1::GetClaimRequest* req,
                                     v1::GetClaimResponse* resp) override;
  grpc::ServerUnaryReactor* ListClaims(grpc::CallbackServerContext* ctx,
                                       const v1::ListClaimsRequest* req,
                                       v1::ListClaimsResponse* resp) override;
  grpc::ServerWriteReactor<v1::ClaimEvent>* WatchClaims(grpc::CallbackServerContext* ctx,
                                                        const v1::WatchClaimsRequest* req) override;

 private:
  allocator::Allocator* const allocator_;
  const Authenticator* const auth_;
};

}  // namespace sbx::server
