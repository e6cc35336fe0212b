#pragma once
// The streaming RPCs of sbx.v1: ClaimService.WatchClaims and AdminService.WatchPools, as
// gRPC callback write reactors. The services' handlers return what these functions return.
//
// WatchClaims streams an allocator watch (Allocator::Watch): the caller's own claims, or
// another owner's for an admin, filtered like ListClaims (the allocator applies owner,
// pool and equality labels; the label selector and states are applied here, to each
// claim after its change). One write is in flight at a time; events wait in the
// allocator's bounded queue meanwhile, and a client that reads too slowly gets ABORTED.
//
// WatchPools polls the allocator's pools with a grpc::Alarm once per min_interval and
// sends ADDED (initial state, new pools), MODIFIED (spec or status changed; the status's
// updated_at alone does not count) and DELETED, so at most one event per pool per
// interval. While the client has not taken the previous events, the next poll waits.
//
// Both end when the client cancels, when a write fails, and at server shutdown (when the
// grace period cancels them; WatchClaims ends at once with UNAVAILABLE if the server calls
// Allocator::CloseWatches first). Each reactor deletes itself in OnDone, after making
// sure no allocator callback or alarm can still reach it.
//
// Thread-safety: reactions run on gRPC's threads, the allocator's (WatchClaims) and the
// alarm's (WatchPools); each reactor serializes them with its own mutex, which it never
// holds while calling into gRPC's Start*/Finish or cancelling the watch.
// Lifetime: the Allocator and Authenticator must outlive every call.

#include "grpcpp/grpcpp.h"
#include "sbx/v1/admin.pb.h"
#include "sbx/v1/claims.pb.h"
#include "src/allocator/allocator.h"
#include "src/images/images.h"
#include "src/server/auth.h"

namespace sbx::server {

// The body of ClaimService::WatchClaims. Errors (as the stream's status):
// UNAUTHENTICATED, INVALID_ARGUMENT and PERMISSION_DENIED as for ListClaims (and a
// negative start_revision), OUT_OF_RANGE (start_revision no longer kept, or in the
// future), ABORTED (the client read too slowly), UNAVAILABLE (shutdown).
grpc::ServerWriteReactor<v1::ClaimEvent>* WatchClaims(grpc::CallbackServerContext* ctx,
                                                      const v1::WatchClaimsRequest* req,
                                                      allocator::Allocator* allocator,
                                                      const Authenticator* auth);

// The body of AdminService::WatchPools. Errors: UNAUTHENTICATED, PERMISSION_DENIED (not
// an admin), INVALID_ARGUMENT (a bad pool name; min_interval below 100 ms or above 1 min).
// `images` (may be null): where the pools' images stand (PoolStatus.image_state).
grpc::ServerWriteReactor<v1::PoolEvent>* WatchPools(grpc::CallbackServerContext* ctx,
                                                    const v1::WatchPoolsRequest* req,
                                                    allocator::Allocator* allocator,
                                                    const Authenticator* auth,
                                                    const images::Images* images = nullptr);

}  // namespace sbx::server
