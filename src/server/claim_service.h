#pragma once

#include <memory>
#include <optional>
#include <string>
// sbx.v1.ClaimService over the allocator: Claim, ClaimBatch, Release, Renew, GetClaim and
// ListClaims. The owner of every claim is the authenticated tenant, never a request field.
// Handlers never block: allocator calls complete through callbacks, which finish the call.
//
// Claims by image (ClaimRequest.image): the pool comes from ImagePools (image_pools.h),
// which may first write an on-demand pool; the claim then goes on as one of that pool.
// Counted by how they were served in RequestCounters (sbx_image_claims_total).
//
// Late binding: a claim's `config` (env, files) is applied to its sandbox through the
// sandbox's daemon (sbx-sandboxd Configure) before the claim returns; if that fails the
// claim is released and the call fails with the daemon's error.
//
// Claim, ClaimBatch and Release carry a request id (request_id.h) and are counted by
// final status in RequestCounters.
//
// Thread-safety: handlers run concurrently on gRPC's threads.
// Lifetime: the Allocator and Authenticator must outlive the service and every call in
// flight (shut the gRPC server down before destroying them); ImagePools is shared with
// the calls in flight.

#include "grpcpp/grpcpp.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "src/allocator/allocator.h"
#include "src/server/auth.h"
#include "src/server/image_pools.h"
#include "src/server/metrics.h"
#include "src/server/sandboxd_client.h"
#include "src/server/tenant_limits.h"

namespace sbx::server {

class ClaimService final : public sbx::v1::ClaimService::CallbackService {
 public:
  // `counters` may be null (calls are then not counted); `limiter` null: the service
  // keeps its own. `image_pools` serves claims by image; null: they are NOT_FOUND (no pool
  // runs an image the server knows of).
  ClaimService(allocator::Allocator* allocator, const Authenticator* auth, SandboxdClients* daemons,
               RequestCounters* counters = nullptr, TenantLimiter* limiter = nullptr,
               std::shared_ptr<ImagePools> image_pools = nullptr)
      : allocator_(allocator),
        auth_(auth),
        daemons_(daemons),
        counters_(counters),
        own_limiter_(limiter == nullptr ? std::make_unique<TenantLimiter>() : nullptr),
        limiter_(limiter != nullptr ? limiter : own_limiter_.get()),
        image_pools_(image_pools != nullptr
                         ? std::move(image_pools)
                         : ImagePools::Create(allocator, nullptr, limiter_, ImageClaimOptions{})) {}

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

  // A batch of `caller` from `pool`, chosen by the server (Snapshots.Fork: the snapshot's
  // fork pool, which no claim may name), as ClaimBatch runs one: the request's fields are
  // checked (but pool and image, which it must leave empty), the tenant's claim rate is
  // taken, the allocator grants the batch and its config is applied to every member.
  // `done` runs on an allocator or daemon thread.
  void ForkBatch(const Caller& caller, const v1::ClaimBatchRequest& req, const std::string& pool,
                 std::shared_ptr<allocator::WaitCancellation> cancellation,
                 allocator::BatchCallback done);

 private:
  // The allocator's batch, then late binding (released as a whole if it fails).
  void RunBatch(allocator::BatchRequest r, std::optional<v1::SandboxConfig> config,
                allocator::BatchCallback done);
  // `claims` claims of `caller` from its claim rate (TenantLimiter), unless `existing_id`
  // names a claim of the caller that exists (a retry, answered from it).
  [[nodiscard]] absl::Status TakeFromRate(const Caller& caller, const std::string& existing_id,
                                          int claims);
  // The pool of `claims` claims of `image` (ImagePools::Resolve), counted by route; or,
  // when `existing_id` names a claim of the caller (a retry), that claim's pool.
  void ResolveImage(const Caller& caller, const std::string& image, const std::string& existing_id,
                    int claims, ImagePools::Callback done);

  allocator::Allocator* const allocator_;
  const Authenticator* const auth_;
  SandboxdClients* const daemons_;
  RequestCounters* const counters_;
  const std::unique_ptr<TenantLimiter> own_limiter_;
  TenantLimiter* const limiter_;
  const std::shared_ptr<ImagePools> image_pools_;
};

}  // namespace sbx::server
