#include "src/server/snapshot_service.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/server/call.h"
#include "src/server/convert.h"

namespace sbx::server {
namespace {

// How long the new daemon may take to take the claim's config again after a reset.
constexpr absl::Duration kResetConfigureTimeout = absl::Seconds(10);

void ToProto(const store::SnapshotRecord& r, v1::Snapshot* out) {
  out->set_id(r.id);
  out->set_name(r.name);
  for (const auto& [k, v] : r.labels) (*out->mutable_labels())[k] = v;
  out->set_owner(r.owner);
  out->set_source_claim_id(r.source_claim);
  out->set_parent_image_digest(r.parent_image_digest);
  out->set_parent_snapshot_id(r.parent_snapshot);
  out->set_size_bytes(r.size_bytes);
  server::ToProto(r.created, out->mutable_create_time());
}

// The snapshot the sandbox of the owner's claim started from (its template's
// local.snapshot: a fork, or a member of a pool of a snapshot); empty when none or unknown.
std::string StartedFrom(const allocator::Allocator* allocator, const std::string& owner,
                        const std::string& claim_id) {
  if (allocator == nullptr) return "";
  absl::StatusOr<store::ClaimRecord> claim = allocator->GetClaim(owner, claim_id);
  if (!claim.ok()) return "";
  absl::StatusOr<store::PoolRecord> pool = allocator->GetPool(claim->pool);
  if (!pool.ok()) return "";
  absl::StatusOr<store::TemplateRecord> t = allocator->GetTemplate(pool->template_name);
  v1::LocalSpec spec;
  if (!t.ok() || t->runtime != "local" || !spec.ParseFromString(t->spec)) return "";
  return spec.snapshot();
}

absl::Status RequireId(absl::string_view field, const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is required"));
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* SnapshotService::CreateSnapshot(grpc::CallbackServerContext* ctx,
                                                          const v1::CreateSnapshotRequest* req,
                                                          v1::CreateSnapshotResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "CreateSnapshot");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (snapshots_ == nullptr) return FinishNow(ctx, runtime::NoSnapshots());
  if (absl::Status s = RequireId("claim_id", req->claim_id()); !s.ok()) return FinishNow(ctx, s);
  absl::StatusOr<std::map<std::string, std::string>> labels =
      LabelsFromProto("labels", req->labels());
  if (!labels.ok()) return FinishNow(ctx, labels.status());
  allocator::SnapshotCreateRequest r;
  r.owner = caller->tenant;
  r.claim_id = req->claim_id();
  r.name = req->name();
  r.labels = *std::move(labels);
  r.parent_snapshot = StartedFrom(allocator_, r.owner, r.claim_id);
  auto call = AsyncUnary<v1::CreateSnapshotResponse>::Create(ctx, resp);
  snapshots_->Create(std::move(r), [call](absl::StatusOr<allocator::SnapshotCreated> made) {
    call->Complete(made.status(), [&](v1::CreateSnapshotResponse* out) {
      ToProto(made->snapshot, out->mutable_snapshot());
      out->set_dropped_entries(made->dropped_entries);
      return absl::OkStatus();
    });
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* SnapshotService::GetSnapshot(grpc::CallbackServerContext* ctx,
                                                       const v1::GetSnapshotRequest* req,
                                                       v1::GetSnapshotResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "GetSnapshot");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (snapshots_ == nullptr) return FinishNow(ctx, runtime::NoSnapshots());
  if (absl::Status s = RequireId("snapshot_id", req->snapshot_id()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  absl::StatusOr<store::SnapshotRecord> r = snapshots_->Get(caller->tenant, req->snapshot_id());
  if (!r.ok()) return FinishNow(ctx, r.status());
  ToProto(*r, resp->mutable_snapshot());
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* SnapshotService::ListSnapshots(grpc::CallbackServerContext* ctx,
                                                         const v1::ListSnapshotsRequest* req,
                                                         v1::ListSnapshotsResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "ListSnapshots");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (snapshots_ == nullptr) return FinishNow(ctx, runtime::NoSnapshots());
  absl::StatusOr<std::map<std::string, std::string>> labels =
      LabelsFromProto("label_selector", req->label_selector());
  if (!labels.ok()) return FinishNow(ctx, labels.status());
  for (const store::SnapshotRecord& r : snapshots_->List(caller->tenant, *labels)) {
    ToProto(r, resp->add_snapshots());
  }
  resp->set_used_bytes(snapshots_->used_bytes(caller->tenant));
  resp->set_quota_bytes(snapshots_->quota_bytes());
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* SnapshotService::DeleteSnapshot(grpc::CallbackServerContext* ctx,
                                                          const v1::DeleteSnapshotRequest* req,
                                                          v1::DeleteSnapshotResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "DeleteSnapshot");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (snapshots_ == nullptr) return FinishNow(ctx, runtime::NoSnapshots());
  if (absl::Status s = RequireId("snapshot_id", req->snapshot_id()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  const std::string id = req->snapshot_id();
  // The owner's, before anything is retired: another tenant's is NOT_FOUND.
  if (absl::StatusOr<store::SnapshotRecord> r = snapshots_->Get(caller->tenant, id); !r.ok()) {
    return FinishNow(ctx, r.status());
  }
  auto call = AsyncUnary<v1::DeleteSnapshotResponse>::Create(ctx, resp);
  auto remove = [this, call, tenant = caller->tenant, id](absl::Status s) {
    if (!s.ok()) return call->Fail(s);
    snapshots_->Delete(tenant, id, [call](absl::Status s) { call->Fail(s); });
  };
  if (allocator_ == nullptr || fork_pools_ == nullptr) {
    remove(absl::OkStatus());
    return call->reactor();
  }
  // A template of an admin's that starts sandboxes from it keeps it.
  const std::string fork_pool = ForkPools::PoolName(id);
  for (const store::TemplateRecord& t : allocator_->ListTemplates()) {
    v1::LocalSpec spec;
    if (t.runtime != "local" || !spec.ParseFromString(t.spec) || spec.snapshot() != id ||
        SplitQualifiedName(t.name, allocator_->default_namespace()).name == fork_pool) {
      continue;
    }
    call->Fail(absl::FailedPreconditionError(
        absl::StrCat("snapshot ", id, " is used by template \"", t.name,
                     "\" (local.snapshot): an admin must change or delete it first")));
    return call->reactor();
  }
  // Its fork pool goes first (refused while forks of it are claimed: they came from it).
  fork_pools_->Retire(id, [remove, id](absl::Status s) mutable {
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("snapshot ", id, ": its fork pool cannot go (",
                                              s.message(), "); release its forks first"));
    }
    remove(s);
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* SnapshotService::Reset(grpc::CallbackServerContext* ctx,
                                                 const v1::ResetRequest* req,
                                                 v1::ResetResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Reset");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (snapshots_ == nullptr) return FinishNow(ctx, runtime::NoSnapshots());
  if (absl::Status s = RequireId("claim_id", req->claim_id()); !s.ok()) return FinishNow(ctx, s);
  if (absl::Status s = RequireId("snapshot_id", req->snapshot_id()); !s.ok()) {
    return FinishNow(ctx, s);
  }
  auto call = AsyncUnary<v1::ResetResponse>::Create(ctx, resp);
  snapshots_->Reset(
      caller->tenant, req->claim_id(), req->snapshot_id(),
      [this, snapshot_id = req->snapshot_id()](const store::ClaimRecord& claim) {
        daemons_->BeginReset(claim.id, snapshot_id);
      },
      [this, call](absl::StatusOr<store::ClaimRecord> claim) {
        if (!claim.ok()) return call->Fail(claim.status());
        daemons_->ForgetChannel(claim->sandbox_id);
        if (claim->env.empty()) return call->Fail(absl::OkStatus());
        // The claim's late-bound env (recorded with the claim), given again to the new
        // daemon: it lived in the old daemon's memory. Its files are not written again: the
        // workspace is the snapshot's, which is what a reset asks for.
        v1::SandboxConfig config;
        config.mutable_env()->insert(claim->env.begin(), claim->env.end());
        daemons_->Configure(
            *claim, config, kResetConfigureTimeout, [call, id = claim->id](absl::Status s) {
              if (!s.ok()) {
                s = absl::Status(s.code(), absl::StrCat("claim \"", id,
                                                        "\" was reset but its late-bound env "
                                                        "could not be given again: ",
                                                        s.message()));
              }
              call->Fail(s);
            });
      });
  return call->reactor();
}

grpc::ServerUnaryReactor* SnapshotService::Fork(grpc::CallbackServerContext* ctx,
                                                const v1::ForkRequest* req,
                                                v1::ForkResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, false, "Fork");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (snapshots_ == nullptr || claims_ == nullptr || fork_pools_ == nullptr ||
      allocator_ == nullptr) {
    return FinishNow(ctx, runtime::NoSnapshots());
  }
  if (req->snapshot_id().empty() == req->claim_id().empty()) {
    return FinishNow(
        ctx, absl::InvalidArgumentError(absl::StrCat(
                 "snapshot_id \"", req->snapshot_id(), "\" and claim_id \"", req->claim_id(),
                 "\": a fork names exactly one source (a snapshot, or a claim to "
                 "snapshot first)")));
  }
  v1::ClaimBatchRequest batch;
  batch.set_batch_id(req->batch_id());
  batch.set_count(req->count());
  batch.set_mode(v1::BATCH_MODE_ALL_OR_NOTHING);
  batch.set_empty_pool_policy(v1::EMPTY_POOL_POLICY_COLD);
  if (req->has_ttl()) *batch.mutable_ttl() = req->ttl();
  if (req->has_wait_timeout()) *batch.mutable_wait_timeout() = req->wait_timeout();
  *batch.mutable_labels() = req->labels();
  if (req->has_config()) *batch.mutable_config() = req->config();
  auto call = AsyncUnary<v1::ForkResponse>::Create(ctx, resp);
  call->set_on_finish(
      [snapshots = snapshots_, start = absl::Now(), count = req->count()](const absl::Status& s) {
        snapshots->RecordFork(s.ok(), count, absl::Now() - start);
      });
  auto cancellation = std::make_shared<allocator::WaitCancellation>();
  call->set_on_cancel([cancellation] { cancellation->Cancel(); });
  auto fork = [this, call, caller = *caller, batch = std::move(batch),
               cancellation](const std::string& snapshot_id) {
    absl::StatusOr<store::SnapshotRecord> snapshot = snapshots_->Get(caller.tenant, snapshot_id);
    if (!snapshot.ok()) return call->Fail(snapshot.status());
    fork_pools_->Resolve(
        caller, *snapshot,
        [this, call, caller, batch, cancellation,
         snapshot_id](absl::StatusOr<std::string> pool) mutable {
          if (!pool.ok()) return call->Fail(pool.status());
          claims_->ForkBatch(
              caller, batch, *pool, std::move(cancellation),
              [call, snapshot_id](absl::StatusOr<std::vector<allocator::ClaimResult>> results) {
                call->Complete(results.status(), [&](v1::ForkResponse* out) {
                  out->set_snapshot_id(snapshot_id);
                  bool replayed = !results->empty();
                  for (const allocator::ClaimResult& r : *results) {
                    ToProto(r.claim, out->add_claims());
                    replayed = replayed && r.replayed;
                  }
                  if (!out->claims().empty()) out->set_batch_id(out->claims(0).batch_id());
                  out->set_replayed(replayed);
                  return absl::OkStatus();
                });
              });
        });
  };
  // A retry of an earlier Fork goes to the snapshot its forks came from, with no new
  // snapshot of a claim source.
  if (!req->batch_id().empty()) {
    if (absl::StatusOr<store::ClaimRecord> first =
            allocator_->GetClaim(caller->tenant, req->batch_id() + "#0");
        first.ok()) {
      const std::string snapshot_id = ForkPools::SnapshotOf(first->pool);
      if (snapshot_id.empty()) {
        call->Fail(absl::AlreadyExistsError(
            absl::StrCat("batch_id \"", req->batch_id(), "\" names claims of pool \"", first->pool,
                         "\" (a ClaimBatch), not forks: choose another")));
      } else {
        fork(snapshot_id);
      }
      return call->reactor();
    }
  }
  if (!req->snapshot_id().empty()) {
    fork(req->snapshot_id());
    return call->reactor();
  }
  allocator::SnapshotCreateRequest r;
  r.owner = caller->tenant;
  r.claim_id = req->claim_id();
  r.name = absl::StrCat("fork of ", req->claim_id());
  r.parent_snapshot = StartedFrom(allocator_, r.owner, r.claim_id);
  if (r.name.size() > allocator::kMaxSnapshotName) r.name.resize(allocator::kMaxSnapshotName);
  snapshots_->Create(std::move(r),
                     [call, fork](absl::StatusOr<allocator::SnapshotCreated> made) mutable {
                       if (!made.ok()) return call->Fail(made.status());
                       fork(made->snapshot.id);
                     });
  return call->reactor();
}

}  // namespace sbx::server
