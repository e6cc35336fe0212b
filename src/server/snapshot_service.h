#pragma once
// sbx.v1.Snapshots over allocator::Snapshots (issue 37): CreateSnapshot, GetSnapshot,
// ListSnapshots, DeleteSnapshot, Reset, and Fork (a batch of claims from the snapshot's
// fork pool, fork_pools.h, run by ClaimService::ForkBatch). The owner is always the authenticated
// tenant, never a request field; another tenant's snapshot is NOT_FOUND (admins included). Handlers
// never block: CreateSnapshot, DeleteSnapshot and Reset finish from the manager's callbacks.
//
// Thread-safety: handlers run concurrently on gRPC's threads.
// Lifetime: the Snapshots manager and the Authenticator must outlive the service and every
// call in flight. A null manager (no runtime with snapshots): every RPC is UNIMPLEMENTED.

#include "grpcpp/grpcpp.h"
#include "sbx/v1/snapshots.grpc.pb.h"
#include "src/allocator/snapshots.h"
#include "src/server/auth.h"
#include "src/server/claim_service.h"
#include "src/server/fork_pools.h"
#include "src/server/sandboxd_client.h"

namespace sbx::server {

class SnapshotService final : public sbx::v1::Snapshots::CallbackService {
 public:
  // `daemons` (the SandboxService's): Reset notes there that the claim's calls end, drops
  // the channel to the old daemon and applies the claim's late-bound config again.
  // `allocator`, `claims` and `fork_pools` serve Fork and DeleteSnapshot's retirement of
  // the fork pool; all three null: Fork is UNIMPLEMENTED and no template is checked.
  SnapshotService(allocator::Snapshots* snapshots, const Authenticator* auth,
                  SandboxdClients* daemons, allocator::Allocator* allocator = nullptr,
                  ClaimService* claims = nullptr, std::shared_ptr<ForkPools> fork_pools = nullptr)
      : snapshots_(snapshots),
        auth_(auth),
        daemons_(daemons),
        allocator_(allocator),
        claims_(claims),
        fork_pools_(std::move(fork_pools)) {}

  grpc::ServerUnaryReactor* CreateSnapshot(grpc::CallbackServerContext* ctx,
                                           const v1::CreateSnapshotRequest* req,
                                           v1::CreateSnapshotResponse* resp) override;
  grpc::ServerUnaryReactor* GetSnapshot(grpc::CallbackServerContext* ctx,
                                        const v1::GetSnapshotRequest* req,
                                        v1::GetSnapshotResponse* resp) override;
  grpc::ServerUnaryReactor* ListSnapshots(grpc::CallbackServerContext* ctx,
                                          const v1::ListSnapshotsRequest* req,
                                          v1::ListSnapshotsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteSnapshot(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteSnapshotRequest* req,
                                           v1::DeleteSnapshotResponse* resp) override;
  grpc::ServerUnaryReactor* Reset(grpc::CallbackServerContext* ctx, const v1::ResetRequest* req,
                                  v1::ResetResponse* resp) override;
  grpc::ServerUnaryReactor* Fork(grpc::CallbackServerContext* ctx, const v1::ForkRequest* req,
                                 v1::ForkResponse* resp) override;

 private:
  allocator::Snapshots* const snapshots_;
  const Authenticator* const auth_;
  SandboxdClients* const daemons_;
  allocator::Allocator* const allocator_;
  ClaimService* const claims_;
  const std::shared_ptr<ForkPools> fork_pools_;
};

}  // namespace sbx::server
