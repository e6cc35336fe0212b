#include "src/server/claim_service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/server/call.h"
#include "src/server/convert.h"
#include "src/server/pending_services.h"

namespace sbx::server {
namespace {

using allocator::ClaimResult;

constexpr size_t kMaxBatchIdLength = 120;
constexpr int kMaxBatchCount = 1000;

bool HasConfig(const v1::SandboxConfig& c) { return c.env_size() > 0 || c.files_size() > 0; }

absl::Status RejectConfig(const v1::SandboxConfig& c) {
  if (!HasConfig(c)) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("late-bound config is not applied by this server yet (config has ", c.env_size(),
                   " env entries and ", c.files_size(), " files); claim without config"));
}

absl::StatusOr<absl::Duration> WaitTimeout(const google::protobuf::Duration& d) {
  ASSIGN_OR_RETURN(absl::Duration wait, FromProto("wait_timeout", d));
  if (wait > kMaxWait) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait_timeout ", absl::FormatDuration(wait), " is above 1h"));
  }
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

absl::StatusOr<allocator::ClaimRequest> ToClaimRequest(const allocator::Allocator& a,
                                                       const v1::ClaimRequest& req,
                                                       const Caller& caller) {
  allocator::ClaimRequest r;
  r.owner = caller.tenant;
  if (!req.claim_id().empty()) RETURN_IF_ERROR(ValidateKey("claim_id", req.claim_id()));
  r.claim_id = req.claim_id();
  RETURN_IF_ERROR(ValidateName("pool", req.pool()));
  r.pool = req.pool();
  ASSIGN_OR_RETURN(r.policy, FromProto("empty_pool_policy", req.empty_pool_policy()));
  ASSIGN_OR_RETURN(r.wait, WaitTimeout(req.wait_timeout()));
  ASSIGN_OR_RETURN(r.ttl, FromProto("ttl", req.ttl()));
  ASSIGN_OR_RETURN(r.labels, LabelsFromProto("labels", req.labels()));
  RETURN_IF_ERROR(CheckTtl(a, r.pool, r.ttl));
  RETURN_IF_ERROR(RejectConfig(req.config()));
  return r;
}

absl::StatusOr<allocator::BatchRequest> ToBatchRequest(const allocator::Allocator& a,
                                                       const v1::ClaimBatchRequest& req,
                                                       const Caller& caller) {
  allocator::BatchRequest r;
  r.owner = caller.tenant;
  if (!req.batch_id().empty()) {
    RETURN_IF_ERROR(ValidateKey("batch_id", req.batch_id()));
    if (req.batch_id().size() > kMaxBatchIdLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch_id \"", req.batch_id(), "\" is longer than ", kMaxBatchIdLength, " characters"));
    }
  }
  r.batch_id = req.batch_id();
  RETURN_IF_ERROR(ValidateName("pool", req.pool()));
  r.pool = req.pool();
  if (req.count() < 1 || req.count() > kMaxBatchCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("count ", req.count(), " is outside 1..", kMaxBatchCount));
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
  // Validated for the contract; the allocator's batches take warm sandboxes only and
  // answer RESOURCE_EXHAUSTED at once when there are too few (docs/architecture.md).
  RETURN_IF_ERROR(FromProto("empty_pool_policy", req.empty_pool_policy()).status());
  RETURN_IF_ERROR(WaitTimeout(req.wait_timeout()).status());
  ASSIGN_OR_RETURN(r.ttl, FromProto("ttl", req.ttl()));
  ASSIGN_OR_RETURN(r.labels, LabelsFromProto("labels", req.labels()));
  RETURN_IF_ERROR(CheckTtl(a, r.pool, r.ttl));
  RETURN_IF_ERROR(RejectConfig(req.config()));
  return r;
}

// A claim id as Get/Release/Renew accept it: a client's key, or "<batch_id>#<i>" of a
// ClaimBatch member.
absl::Status RequireClaimId(const std::string& id) {
  const size_t hash = id.rfind('#');
  if (hash == std::string::npos) return ValidateKey("claim_id", id);
  const absl::string_view index = absl::string_view(id).substr(hash + 1);
  const bool digits =
      !index.empty() && index.size() <= 4 &&
      std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim_id \"", id, "\" is neither a claim id nor \"<batch_id>#<index>\""));
  }
  return ValidateKey("claim_id", absl::string_view(id).substr(0, hash));
}

}  // namespace

grpc::ServerUnaryReactor* ClaimService::Claim(grpc::CallbackServerContext* ctx,
                                              const v1::ClaimRequest* req,
                                              v1::ClaimResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Claim");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<allocator::ClaimRequest> request = ToClaimRequest(*allocator_, *req, *caller);
  if (!request.ok()) return FinishNow(ctx, request.status());
  auto call = AsyncUnary<v1::ClaimResponse>::Create(ctx, resp);
  allocator_->Claim(std::move(*request), [call](absl::StatusOr<ClaimResult> result) {
    call->Complete(result.status(), [&](v1::ClaimResponse* out) {
      ToProto(result->claim, out->mutable_claim());
      out->set_replayed(result->replayed);
      return absl::OkStatus();
    });
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* ClaimService::ClaimBatch(grpc::CallbackServerContext* ctx,
                                                   const v1::ClaimBatchRequest* req,
                                                   v1::ClaimBatchResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "ClaimBatch");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<allocator::BatchRequest> request = ToBatchRequest(*allocator_, *req, *caller);
  if (!request.ok()) return FinishNow(ctx, request.status());
  auto call = AsyncUnary<v1::ClaimBatchResponse>::Create(ctx, resp);
  allocator_->ClaimBatch(std::move(*request),
                         [call](absl::StatusOr<std::vector<ClaimResult>> results) {
                           call->Complete(results.status(), [&](v1::ClaimBatchResponse* out) {
                             bool replayed = !results->empty();
                             for (const ClaimResult& r : *results) {
                               ToProto(r.claim, out->add_claims());
                               replayed = replayed && r.replayed;
                             }
                             // The batch id (possibly generated) is the claims' common prefix
                             // "<id>#".
                             if (!out->claims().empty())
                               out->set_batch_id(out->claims(0).batch_id());
                             out->set_replayed(replayed);
                             return absl::OkStatus();
                           });
                         });
  return call->reactor();
}

grpc::ServerUnaryReactor* ClaimService::Release(grpc::CallbackServerContext* ctx,
                                                const v1::ReleaseRequest* req,
                                                v1::ReleaseResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Release");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (absl::Status s = RequireClaimId(req->claim_id()); !s.ok()) return FinishNow(ctx, s);
  // Release is idempotent on the wire (claims.proto): an ended claim is OK with its final
  // state, answered here without asking the allocator (which says FAILED_PRECONDITION).
  absl::StatusOr<store::ClaimRecord> before = allocator_->GetClaim(caller->tenant, req->claim_id());
  if (!before.ok()) return FinishNow(ctx, before.status());
  if (before->state != store::ClaimState::kActive) {
    ToProto(*before, resp->mutable_claim());
    return FinishNow(ctx, absl::OkStatus());
  }
  auto call = AsyncUnary<v1::ReleaseResponse>::Create(ctx, resp);
  allocator_->Release(
      caller->tenant, req->claim_id(),
      [call, a = allocator_, owner = caller->tenant, id = req->claim_id()](absl::Status s) {
        if (s.code() == absl::StatusCode::kFailedPrecondition) {
          // It ended between the read above and the release (expiry, loss, a concurrent
          // release). The allocator may run this callback under the claim's lock, so the
          // final state is not read here: a retry answers it from the branch above.
          return call->Fail(absl::AbortedError(
              absl::StrCat("claim \"", id, "\" ended while being released; retry")));
        }
        if (!s.ok()) return call->Fail(s);
        // Success runs outside the allocator's locks: read the ended claim.
        absl::StatusOr<store::ClaimRecord> claim = a->GetClaim(owner, id);
        call->Complete(claim.status(), [&](v1::ReleaseResponse* out) {
          ToProto(*claim, out->mutable_claim());
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
  absl::StatusOr<absl::Duration> ttl = FromProto("ttl", req->ttl());
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
      *ttl =
          pool->default_ttl > absl::ZeroDuration() ? pool->default_ttl : absl::InfiniteDuration();
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
    allocator::ClaimFilter f;
    f.owner = caller->tenant;
    if (!filter.owner().empty() && filter.owner() != caller->tenant) {
      if (!caller->admin) {
        return absl::PermissionDeniedError(
            absl::StrCat("tenant \"", caller->tenant, "\" may not list claims of owner \"",
                         filter.owner(), "\" (only its own, unless it is an admin)"));
      }
      RETURN_IF_ERROR(ValidateKey("filter.owner", filter.owner()));
      f.owner = filter.owner();
    }
    if (!filter.pool().empty()) RETURN_IF_ERROR(ValidateName("filter.pool", filter.pool()));
    f.pool = filter.pool();
    ASSIGN_OR_RETURN(f.labels, LabelsFromProto("filter.match_labels", filter.match_labels()));
    ASSIGN_OR_RETURN(std::vector<LabelRequirement> selector,
                     ParseLabelSelector(filter.label_selector()));
    std::vector<store::ClaimState> states;
    for (int s : filter.states()) {
      switch (s) {
        case v1::CLAIM_STATE_UNSPECIFIED:
          break;  // "any state"
        case v1::CLAIM_STATE_ACTIVE:
          states.push_back(store::ClaimState::kActive);
          break;
        case v1::CLAIM_STATE_RELEASED:
          states.push_back(store::ClaimState::kReleased);
          break;
        case v1::CLAIM_STATE_EXPIRED:
          states.push_back(store::ClaimState::kExpired);
          break;
        case v1::CLAIM_STATE_LOST:
          states.push_back(store::ClaimState::kLost);
          break;
        default:
          return absl::InvalidArgumentError(
              absl::StrCat("filter.states: ", s, " is not a known ClaimState"));
      }
    }
    f.include_ended = states.empty() || std::any_of(states.begin(), states.end(), [](auto s) {
                        return s != store::ClaimState::kActive;
                      });

    std::vector<std::string> parts = {f.owner, f.pool, filter.label_selector()};
    for (const auto& [k, v] : f.labels) parts.push_back(absl::StrCat(k, "=", v));
    std::vector<int> state_numbers(filter.states().begin(), filter.states().end());
    std::sort(state_numbers.begin(), state_numbers.end());
    parts.push_back(absl::StrJoin(state_numbers, ","));
    const uint64_t fingerprint = Fingerprint(parts);
    ASSIGN_OR_RETURN(f.after, DecodePageToken("claims", fingerprint, req->page_token()));

    // The allocator filters by owner, pool, equality labels and "ended or not"; the
    // selector and exact states are applied here, so then every candidate is fetched.
    const bool filter_here = !selector.empty() || !states.empty();
    f.limit = filter_here ? 0 : page_size + 1;
    std::vector<store::ClaimRecord> records = allocator_->ListClaims(f);
    std::string last;
    for (const store::ClaimRecord& r : records) {
      if (!Matches(selector, r.labels)) continue;
      if (!states.empty() && std::find(states.begin(), states.end(), r.state) == states.end()) {
        continue;
      }
      if (resp->claims_size() == page_size) {
        resp->set_next_page_token(EncodePageToken("claims", fingerprint, last));
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
    grpc::CallbackServerContext* ctx, const v1::WatchClaimsRequest*) {
  return PendingWatchClaims(ctx);
}

}  // namespace sbx::server
