#include "src/server/claim_service.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/server/call.h"
#include "src/server/convert.h"
#include "src/server/fork_pools.h"
#include "src/server/request_id.h"
#include "src/server/sandboxd_client.h"
#include "src/server/watch_service.h"

namespace sbx::server {
namespace {

using allocator::ClaimResult;

// How long applying a claim's late-bound config to its sandbox may take.
constexpr absl::Duration kConfigureTimeout = absl::Seconds(10);

// Applies `config` to the sandboxes of `claims` (in parallel); `done` gets the first
// error, or OK when all were configured. Runs `done` on a gRPC thread.
void ConfigureAll(SandboxdClients* daemons, const std::vector<store::ClaimRecord>& claims,
                  const v1::SandboxConfig& config, absl::AnyInvocable<void(absl::Status) &&> done) {
  struct Join {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu);
    absl::Status first ABSL_GUARDED_BY(mu);
    absl::AnyInvocable<void(absl::Status) &&> done;
  };
  auto join = std::make_shared<Join>();
  {
    absl::MutexLock lock(&join->mu);
    join->left = claims.size();
  }
  join->done = std::move(done);
  for (const store::ClaimRecord& claim : claims) {
    daemons->Configure(claim, config, kConfigureTimeout, [join, id = claim.id](absl::Status s) {
      absl::Status result;
      {
        absl::MutexLock lock(&join->mu);
        if (!s.ok() && join->first.ok()) {
          join->first = absl::Status(
              s.code(), absl::StrCat("late-bound config of claim \"", id, "\": ", s.message()));
        }
        if (--join->left > 0) return;
        result = join->first;
      }
      std::move(join->done)(result);
    });
  }
}

// Releases `claims` (their config could not be applied) and then reports `error`, saying
// so.
void ReleaseAfterConfigError(allocator::Allocator* a, const std::vector<store::ClaimRecord>& claims,
                             const absl::Status& error,
                             absl::AnyInvocable<void(absl::Status) &&> done) {
  auto left = std::make_shared<std::atomic<size_t>>(claims.size());
  auto shared_done = std::make_shared<absl::AnyInvocable<void(absl::Status) &&>>(std::move(done));
  const absl::Status final_error(
      error.code(),
      absl::StrCat(error.message(), "; the claim was released (retry with a new id)"));
  for (const store::ClaimRecord& c : claims) {
    a->Release(c.owner, c.id, [left, shared_done, final_error](absl::StatusOr<store::ClaimRecord>) {
      if (left->fetch_sub(1) == 1) std::move (*shared_done)(final_error);
    });
  }
}

absl::StatusOr<absl::Duration> WaitTimeout(const google::protobuf::Duration& d) {
  ASSIGN_OR_RETURN(absl::Duration wait, FromProto("wait_timeout", d));
  RETURN_IF_ERROR(allocator::CheckWait("wait_timeout", wait));  // the allocator's limit
  return wait;
}

// A ttl above the pool's max_ttl is INVALID_ARGUMENT (claims.proto); the allocator would
// cap it instead. An unknown pool is left to the allocator (NOT_FOUND).
absl::Status CheckTtl(const allocator::Allocator& a, const std::string& pool, absl::Duration ttl) {
  if (ttl == absl::ZeroDuration()) return absl::OkStatus();
  absl::StatusOr<store::PoolRecord> p = a.GetPool(pool);
  if (p.ok() && p->max_ttl > absl::ZeroDuration() && ttl > p->max_ttl) {
    return absl::InvalidArgumentError(
        absl::StrCat("ttl ", absl::FormatDuration(ttl), " is above max_ttl ",
                     absl::FormatDuration(p->max_ttl), " of pool \"", pool, "\""));
  }
  return absl::OkStatus();
}

// The canonical name of the pool a claim names (src/common/ids.h), if the caller may claim
// from its namespace: PERMISSION_DENIED naming the tenant and the namespace otherwise.
absl::StatusOr<std::string> ClaimablePool(const allocator::Allocator& a, const std::string& pool,
                                          const Caller& caller) {
  ASSIGN_OR_RETURN(std::string canonical,
                   CanonicalQualifiedName("pool", pool, a.default_namespace()));
  const NamespacedName where = SplitQualifiedName(canonical, a.default_namespace());
  const std::string& ns = where.ns;
  if (ForkPools::IsForkName(where.name)) {
    // Whether or not it exists: only Snapshots.Fork, which checks the snapshot's owner,
    // takes from a fork pool.
    return absl::NotFoundError(
        absl::StrCat("pool \"", pool,
                     "\" is not claimable: names \"fork-\" and 16 hex digits are the fork pools of "
                     "snapshots, claimed only through Snapshots.Fork by the snapshot's owner"));
  }
  if (!MayClaimFrom(caller, ns)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tenant \"", caller.tenant, "\" may not claim from namespace \"", ns, "\" (pool \"", pool,
        "\"): its token allows ", absl::StrJoin(caller.limits.namespaces, ", ")));
  }
  return canonical;
}

// Exactly one of a claim's pool and image (claims.proto).
absl::Status CheckPoolOrImage(const std::string& pool, const std::string& image) {
  if (!pool.empty() && !image.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool \"", pool, "\" and image \"", absl::CEscape(image),
                     "\" are both set; a claim names one of them (a pool to take from, or an "
                     "image to run)"));
  }
  if (pool.empty() && image.empty()) {
    return absl::InvalidArgumentError(
        "pool and image are both empty; a claim names one of them (a pool to take from, or an "
        "image to run)");
  }
  return absl::OkStatus();
}

// The request as the allocator takes it. A claim by image gets its pool (and the pool's
// checks, CheckTtl) once the image is resolved.
absl::StatusOr<allocator::ClaimRequest> ToClaimRequest(const allocator::Allocator& a,
                                                       const v1::ClaimRequest& req,
                                                       const Caller& caller) {
  allocator::ClaimRequest r;
  r.owner = caller.tenant;
  if (!req.claim_id().empty()) RETURN_IF_ERROR(ValidateKey("claim_id", req.claim_id()));
  r.claim_id = req.claim_id();
  RETURN_IF_ERROR(CheckPoolOrImage(req.pool(), req.image()));
  if (req.image().empty()) {
    ASSIGN_OR_RETURN(r.pool, ClaimablePool(a, req.pool(), caller));
  }
  ASSIGN_OR_RETURN(r.policy, FromProto("empty_pool_policy", req.empty_pool_policy()));
  ASSIGN_OR_RETURN(r.wait, WaitTimeout(req.wait_timeout()));
  ASSIGN_OR_RETURN(r.ttl, TtlFromProto("ttl", req.ttl()));
  ASSIGN_OR_RETURN(r.labels, LabelsFromProto("labels", req.labels()));
  ASSIGN_OR_RETURN(r.node_preference, LabelsFromProto("node_preference", req.node_preference()));
  if (!r.pool.empty()) RETURN_IF_ERROR(CheckTtl(a, r.pool, r.ttl));
  RETURN_IF_ERROR(ValidateSandboxConfig("config", req.config()));
  r.env.insert(req.config().env().begin(), req.config().env().end());
  ASSIGN_OR_RETURN(r.priority, FromProto("priority", req.priority()));
  r.weight = caller.limits.weight;
  r.max_claims = caller.limits.max_claims;
  return r;
}

// `resolved_pool`: the pool chosen by the server (a fork pool), which neither the
// request's pool nor its image then names.
absl::StatusOr<allocator::BatchRequest> ToBatchRequest(const allocator::Allocator& a,
                                                       const v1::ClaimBatchRequest& req,
                                                       const Caller& caller,
                                                       const std::string* resolved_pool = nullptr) {
  allocator::BatchRequest r;
  r.owner = caller.tenant;
  if (!req.batch_id().empty()) {
    RETURN_IF_ERROR(ValidateKey("batch_id", req.batch_id()));
    if (req.batch_id().size() > allocator::kMaxBatchIdLength) {
      return absl::InvalidArgumentError(absl::StrCat("batch_id \"", req.batch_id(),
                                                     "\" is longer than ",
                                                     allocator::kMaxBatchIdLength, " characters"));
    }
  }
  r.batch_id = req.batch_id();
  if (resolved_pool != nullptr) {
    r.pool = *resolved_pool;
  } else {
    RETURN_IF_ERROR(CheckPoolOrImage(req.pool(), req.image()));
    if (req.image().empty()) {
      ASSIGN_OR_RETURN(r.pool, ClaimablePool(a, req.pool(), caller));
    }
  }
  // The allocator owns the limit (AllocatorOptions::max_batch).
  if (req.count() < 1 || req.count() > a.max_batch()) {
    return absl::InvalidArgumentError(
        absl::StrCat("count ", req.count(), " is outside 1..", a.max_batch()));
  }
  r.count = req.count();
  switch (req.mode()) {
    case v1::BATCH_MODE_UNSPECIFIED:
    case v1::BATCH_MODE_ALL_OR_NOTHING:
      r.mode = allocator::BatchMode::kAllOrNothing;
      break;
    case v1::BATCH_MODE_BEST_EFFORT:
      r.mode = allocator::BatchMode::kBestEffort;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode ", static_cast<int>(req.mode()), " is not a known BatchMode"));
  }
  ASSIGN_OR_RETURN(r.policy, FromProto("empty_pool_policy", req.empty_pool_policy()));
  ASSIGN_OR_RETURN(r.wait, WaitTimeout(req.wait_timeout()));
  ASSIGN_OR_RETURN(r.ttl, TtlFromProto("ttl", req.ttl()));
  ASSIGN_OR_RETURN(r.labels, LabelsFromProto("labels", req.labels()));
  ASSIGN_OR_RETURN(r.node_preference, LabelsFromProto("node_preference", req.node_preference()));
  if (!r.pool.empty()) RETURN_IF_ERROR(CheckTtl(a, r.pool, r.ttl));
  RETURN_IF_ERROR(ValidateSandboxConfig("config", req.config()));
  r.env.insert(req.config().env().begin(), req.config().env().end());
  ASSIGN_OR_RETURN(r.priority, FromProto("priority", req.priority()));
  r.weight = caller.limits.weight;
  r.max_claims = caller.limits.max_claims;
  return r;
}

// Finishes a claim-method call now, counting and logging it.
grpc::ServerUnaryReactor* FinishCall(grpc::CallbackServerContext* ctx, const CallRecord& record,
                                     const absl::Status& status) {
  record.Done(status);
  return FinishNow(ctx, status);
}

std::string ClaimWhat(absl::string_view pool, absl::string_view image, absl::string_view id,
                      absl::string_view id_kind) {
  std::string what = image.empty() || !pool.empty()
                         ? absl::StrCat("pool \"", pool, "\"")
                         : absl::StrCat("image \"", absl::CEscape(image), "\"");
  if (!id.empty()) absl::StrAppend(&what, " ", id_kind, " \"", id, "\"");
  return what;
}

}  // namespace

absl::Status ClaimService::TakeFromRate(const Caller& caller, const std::string& existing_id,
                                        int claims) {
  if (caller.limits.claim_rate <= 0) return absl::OkStatus();
  // A retry of a claim (or batch) already granted is answered from it and takes nothing.
  if (!existing_id.empty() && allocator_->GetClaim(caller.tenant, existing_id).ok()) {
    return absl::OkStatus();
  }
  return limiter_->TakeClaims(caller, claims);
}

void ClaimService::ResolveImage(const Caller& caller, const std::string& image,
                                const std::string& existing_id, int claims,
                                ImagePools::Callback done) {
  // A retry of a claim (or batch) made before goes where it went, whichever pool is best
  // now, and takes nothing of the image limits again (nor is counted again). Its route
  // does not matter: the allocator answers it from the claim.
  if (!existing_id.empty()) {
    if (absl::StatusOr<store::ClaimRecord> c = allocator_->GetClaim(caller.tenant, existing_id);
        c.ok()) {
      return std::move(done)(ImagePool{c->pool, ImageRoute::kDeclaredPool});
    }
  }
  image_pools_->Resolve(
      caller, image, claims,
      [counters = counters_, done = std::move(done)](absl::StatusOr<ImagePool> pool) mutable {
        if (counters != nullptr) {
          counters->CountImageClaim(!pool.ok() ? ImageClaimRoute::kRefused
                                    : pool->route == ImageRoute::kOnDemandPool
                                        ? ImageClaimRoute::kOnDemandPool
                                        : ImageClaimRoute::kDeclaredPool);
        }
        std::move(done)(std::move(pool));
      });
}

grpc::ServerUnaryReactor* ClaimService::Claim(grpc::CallbackServerContext* ctx,
                                              const v1::ClaimRequest* req,
                                              v1::ClaimResponse* resp) {
  CallRecord record{counters_, CountedMethod::kClaim, RequestId(ctx),
                    ClaimWhat(req->pool(), req->image(), req->claim_id(), "claim")};
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Claim");
  if (!caller.ok()) return FinishCall(ctx, record, caller.status());
  absl::StatusOr<allocator::ClaimRequest> request = ToClaimRequest(*allocator_, *req, *caller);
  if (!request.ok()) return FinishCall(ctx, record, request.status());
  if (absl::Status s = TakeFromRate(*caller, req->claim_id(), 1); !s.ok()) {
    return FinishCall(ctx, record, s);
  }
  auto call = AsyncUnary<v1::ClaimResponse>::Create(ctx, resp);
  call->set_on_finish([record = std::move(record)](const absl::Status& s) { record.Done(s); });
  // A caller that gives up while the claim waits takes the wait with it.
  request->cancellation = std::make_shared<allocator::WaitCancellation>();
  call->set_on_cancel([c = request->cancellation] { c->Cancel(); });
  auto reply = [call](const ClaimResult& result) {
    call->Complete(absl::OkStatus(), [&](v1::ClaimResponse* out) {
      ToProto(result.claim, out->mutable_claim());
      out->set_replayed(result.replayed);
      return absl::OkStatus();
    });
  };
  auto claim = [call, reply, a = allocator_, daemons = daemons_,
                config = HasConfig(req->config()) ? std::optional<v1::SandboxConfig>(req->config())
                                                  : std::nullopt](allocator::ClaimRequest r) {
    if (!config.has_value()) {
      a->Claim(std::move(r), [call, reply](absl::StatusOr<ClaimResult> result) {
        if (!result.ok()) return call->Fail(result.status());
        reply(*result);
      });
      return;
    }
    // Late binding: the config goes to the sandbox before the claim returns (again on a
    // retry: Configure is idempotent). If it cannot be applied the claim is released.
    a->Claim(std::move(r), [call, reply, a, daemons,
                            config = *config](absl::StatusOr<ClaimResult> result) {
      if (!result.ok()) return call->Fail(result.status());
      std::vector<store::ClaimRecord> claims = {result->claim};
      ConfigureAll(
          daemons, claims, config, [call, reply, a, claims, result = *result](absl::Status s) {
            if (s.ok()) return reply(result);
            ReleaseAfterConfigError(a, claims, s, [call](absl::Status e) { call->Fail(e); });
          });
    });
  };
  if (req->image().empty()) {
    claim(std::move(*request));
    return call->reactor();
  }
  ResolveImage(*caller, req->image(), req->claim_id(), 1,
               [call, claim, a = allocator_,
                r = std::move(*request)](absl::StatusOr<ImagePool> pool) mutable {
                 if (!pool.ok()) return call->Fail(pool.status());
                 r.pool = pool->pool;
                 // COLD unless the caller asked otherwise: the pool keeps none warm.
                 if (pool->route == ImageRoute::kOnDemandPool && !r.policy.has_value()) {
                   r.policy = store::EmptyPoolPolicy::kCold;
                 }
                 if (absl::Status s = CheckTtl(*a, r.pool, r.ttl); !s.ok()) return call->Fail(s);
                 claim(std::move(r));
               });
  return call->reactor();
}

grpc::ServerUnaryReactor* ClaimService::ClaimBatch(grpc::CallbackServerContext* ctx,
                                                   const v1::ClaimBatchRequest* req,
                                                   v1::ClaimBatchResponse* resp) {
  CallRecord record{counters_, CountedMethod::kClaimBatch, RequestId(ctx),
                    ClaimWhat(req->pool(), req->image(), req->batch_id(), "batch")};
  absl::StrAppend(&record.what, " count ", req->count());
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "ClaimBatch");
  if (!caller.ok()) return FinishCall(ctx, record, caller.status());
  absl::StatusOr<allocator::BatchRequest> request = ToBatchRequest(*allocator_, *req, *caller);
  if (!request.ok()) return FinishCall(ctx, record, request.status());
  const std::string first_of_batch = req->batch_id().empty() ? "" : req->batch_id() + "#0";
  if (absl::Status s = TakeFromRate(*caller, first_of_batch, req->count()); !s.ok()) {
    return FinishCall(ctx, record, s);
  }
  auto call = AsyncUnary<v1::ClaimBatchResponse>::Create(ctx, resp);
  call->set_on_finish([record = std::move(record)](const absl::Status& s) { record.Done(s); });
  request->cancellation = std::make_shared<allocator::WaitCancellation>();
  call->set_on_cancel([c = request->cancellation] { c->Cancel(); });
  auto reply = [call](const std::vector<ClaimResult>& results) {
    call->Complete(absl::OkStatus(), [&](v1::ClaimBatchResponse* out) {
      bool replayed = !results.empty();
      for (const ClaimResult& r : results) {
        ToProto(r.claim, out->add_claims());
        replayed = replayed && r.replayed;
      }
      // The batch id (possibly generated) is the claims' common prefix "<id>#".
      if (!out->claims().empty()) out->set_batch_id(out->claims(0).batch_id());
      out->set_replayed(replayed);
      return absl::OkStatus();
    });
  };
  auto claim = [this, call, reply,
                config = HasConfig(req->config()) ? std::optional<v1::SandboxConfig>(req->config())
                                                  : std::nullopt](allocator::BatchRequest r) {
    RunBatch(std::move(r), config, [call, reply](absl::StatusOr<std::vector<ClaimResult>> results) {
      if (!results.ok()) return call->Fail(results.status());
      reply(*results);
    });
  };
  if (req->image().empty()) {
    claim(std::move(*request));
    return call->reactor();
  }
  ResolveImage(*caller, req->image(), first_of_batch, req->count(),
               [call, claim, a = allocator_,
                r = std::move(*request)](absl::StatusOr<ImagePool> pool) mutable {
                 if (!pool.ok()) return call->Fail(pool.status());
                 r.pool = pool->pool;
                 if (pool->route == ImageRoute::kOnDemandPool && !r.policy.has_value()) {
                   r.policy = store::EmptyPoolPolicy::kCold;
                 }
                 if (absl::Status s = CheckTtl(*a, r.pool, r.ttl); !s.ok()) return call->Fail(s);
                 claim(std::move(r));
               });
  return call->reactor();
}

void ClaimService::RunBatch(allocator::BatchRequest r, std::optional<v1::SandboxConfig> config,
                            allocator::BatchCallback done) {
  allocator_->ClaimBatch(
      std::move(r),
      [a = allocator_, daemons = daemons_, config = std::move(config),
       done = std::move(done)](absl::StatusOr<std::vector<ClaimResult>> results) mutable {
        if (!results.ok() || !config.has_value()) return std::move(done)(std::move(results));
        // Late binding for every member; if one fails, the whole batch is released.
        std::vector<store::ClaimRecord> claims;
        for (const ClaimResult& r : *results) claims.push_back(r.claim);
        auto shared_done = std::make_shared<allocator::BatchCallback>(std::move(done));
        ConfigureAll(daemons, claims, *config,
                     [a, claims, shared_done, results = *std::move(results)](absl::Status s) {
                       if (s.ok()) return std::move(*shared_done)(results);
                       ReleaseAfterConfigError(a, claims, s, [shared_done](absl::Status e) {
                         std::move (*shared_done)(e);
                       });
                     });
      });
}

void ClaimService::ForkBatch(const Caller& caller, const v1::ClaimBatchRequest& req,
                             const std::string& pool,
                             std::shared_ptr<allocator::WaitCancellation> cancellation,
                             allocator::BatchCallback done) {
  absl::StatusOr<allocator::BatchRequest> r = ToBatchRequest(*allocator_, req, caller, &pool);
  if (!r.ok()) return std::move(done)(r.status());
  const std::string first_of_batch = req.batch_id().empty() ? "" : req.batch_id() + "#0";
  if (absl::Status s = TakeFromRate(caller, first_of_batch, req.count()); !s.ok()) {
    return std::move(done)(s);
  }
  r->cancellation = std::move(cancellation);
  RunBatch(*std::move(r),
           HasConfig(req.config()) ? std::optional<v1::SandboxConfig>(req.config()) : std::nullopt,
           std::move(done));
}

grpc::ServerUnaryReactor* ClaimService::Release(grpc::CallbackServerContext* ctx,
                                                const v1::ReleaseRequest* req,
                                                v1::ReleaseResponse* resp) {
  CallRecord record{counters_, CountedMethod::kRelease, RequestId(ctx),
                    absl::StrCat("claim \"", req->claim_id(), "\"")};
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Release");
  if (!caller.ok()) return FinishCall(ctx, record, caller.status());
  if (absl::Status s = RequireClaimId(req->claim_id()); !s.ok()) {
    return FinishCall(ctx, record, s);
  }
  // Release is idempotent on the wire (claims.proto): the allocator answers an ended claim
  // (or one whose expiry is being committed) with its final record.
  auto call = AsyncUnary<v1::ReleaseResponse>::Create(ctx, resp);
  call->set_on_finish([record = std::move(record)](const absl::Status& s) { record.Done(s); });
  allocator_->Release(caller->tenant, req->claim_id(),
                      [call](absl::StatusOr<store::ClaimRecord> ended) {
                        call->Complete(ended.status(), [&](v1::ReleaseResponse* out) {
                          ToProto(*ended, out->mutable_claim());
                          return absl::OkStatus();
                        });
                      });
  return call->reactor();
}

grpc::ServerUnaryReactor* ClaimService::Renew(grpc::CallbackServerContext* ctx,
                                              const v1::RenewRequest* req,
                                              v1::RenewResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Renew");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (absl::Status s = RequireClaimId(req->claim_id()); !s.ok()) return FinishNow(ctx, s);
  absl::StatusOr<absl::Duration> ttl = TtlFromProto("ttl", req->ttl());
  if (!ttl.ok()) return FinishNow(ctx, ttl.status());
  absl::StatusOr<store::ClaimRecord> claim = allocator_->GetClaim(caller->tenant, req->claim_id());
  if (!claim.ok()) return FinishNow(ctx, claim.status());
  if (absl::StatusOr<store::PoolRecord> pool = allocator_->GetPool(claim->pool); pool.ok()) {
    if (absl::Status s = CheckTtl(*allocator_, claim->pool, *ttl); !s.ok()) {
      return FinishNow(ctx, s);
    }
    // Unset: the pool's default_ttl; if that is 0 too, the claim no longer expires (an
    // infinite ttl, which the allocator caps at max_ttl like any other).
    if (*ttl == absl::ZeroDuration()) {
      // min: a pool stored before TTLs were bounded may have a longer default_ttl.
      *ttl = pool->default_ttl > absl::ZeroDuration()
                 ? std::min(pool->default_ttl, allocator::kMaxTtl)
                 : absl::InfiniteDuration();
    }
  } else if (*ttl == absl::ZeroDuration()) {
    *ttl = absl::InfiniteDuration();  // the pool was deleted: no default to take
  }
  auto call = AsyncUnary<v1::RenewResponse>::Create(ctx, resp);
  allocator_->Renew(caller->tenant, req->claim_id(), *ttl,
                    [call](absl::StatusOr<ClaimResult> result) {
                      call->Complete(result.status(), [&](v1::RenewResponse* out) {
                        ToProto(result->claim, out->mutable_claim());
                        return absl::OkStatus();
                      });
                    });
  return call->reactor();
}

grpc::ServerUnaryReactor* ClaimService::GetClaim(grpc::CallbackServerContext* ctx,
                                                 const v1::GetClaimRequest* req,
                                                 v1::GetClaimResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "GetClaim");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (absl::Status s = RequireClaimId(req->claim_id()); !s.ok()) return FinishNow(ctx, s);
  absl::StatusOr<store::ClaimRecord> claim = allocator_->GetClaim(caller->tenant, req->claim_id());
  if (!claim.ok()) return FinishNow(ctx, claim.status());
  ToProto(*claim, resp->mutable_claim());
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ClaimService::ListClaims(grpc::CallbackServerContext* ctx,
                                                   const v1::ListClaimsRequest* req,
                                                   v1::ListClaimsResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "ListClaims");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  auto list = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const int page_size, PageSize(req->page_size()));
    const v1::ClaimFilter& filter = req->filter();
    ASSIGN_OR_RETURN(ClaimQuery query,
                     ClaimQueryFromProto(filter, *caller, "list", allocator_->default_namespace()));
    allocator::ClaimFilter& f = query.filter;

    std::vector<std::string> parts = {f.owner, f.pool, filter.label_selector()};
    for (const auto& [k, v] : f.labels) parts.push_back(absl::StrCat(k, "=", v));
    std::vector<int> state_numbers(filter.states().begin(), filter.states().end());
    std::sort(state_numbers.begin(), state_numbers.end());
    parts.push_back(absl::StrJoin(state_numbers, ","));
    const uint64_t fingerprint = Fingerprint(parts);
    // The token carries "<revision of the first page>:<last claim id>": every page reports
    // the revision read before the first one (claims.proto).
    ASSIGN_OR_RETURN(const std::string token,
                     DecodePageToken("claims", fingerprint, req->page_token()));
    uint64_t revision = 0;
    if (token.empty()) {
      // Read before the claims: every change up to it is in the list (Allocator::revision).
      revision = allocator_->revision();
    } else {
      const size_t colon = token.find(':');
      if (colon == std::string::npos || colon + 1 == token.size() ||
          !absl::SimpleAtoi(absl::string_view(token).substr(0, colon), &revision)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "page_token \"", req->page_token(), "\" is malformed; start over with an empty one"));
      }
      f.after = token.substr(colon + 1);
    }
    resp->set_revision(static_cast<int64_t>(revision));

    // The allocator filters by owner, pool, equality labels and "ended or not"; the
    // selector and exact states are applied here, so then every candidate is fetched.
    const bool filter_here = !query.selector.empty() || !query.states.empty();
    f.limit = filter_here ? 0 : page_size + 1;
    std::vector<store::ClaimRecord> records = allocator_->ListClaims(f);
    std::string last;
    for (const store::ClaimRecord& r : records) {
      if (!query.Matches(r)) continue;
      if (resp->claims_size() == page_size) {
        resp->set_next_page_token(
            EncodePageToken("claims", fingerprint, absl::StrCat(revision, ":", last)));
        break;
      }
      ToProto(r, resp->add_claims());
      last = r.id;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = list(); !s.ok()) {
    resp->Clear();
    return FinishNow(ctx, s);
  }
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::ClaimEvent>* ClaimService::WatchClaims(
    grpc::CallbackServerContext* ctx, const v1::WatchClaimsRequest* req) {
  return server::WatchClaims(ctx, req, allocator_, auth_);
}

}  // namespace sbx::server
