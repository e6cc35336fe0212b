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
  auto call = AsyncUnary<v1::DeleteSnapshotResponse>::Create(ctx, resp);
  snapshots_->Delete(caller->tenant, req->snapshot_id(), [call](absl::Status s) { call->Fail(s); });
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
        std::optional<v1::SandboxConfig> config = daemons_->AppliedConfig(claim->sandbox_id);
        if (!config.has_value() || config->env().empty()) return call->Fail(absl::OkStatus());
        // The claim's late-bound env, given again to the new daemon (it lives in the old
        // daemon's memory). Its files are not written again: the workspace is the
        // snapshot's, which is what a reset asks for.
        config->clear_files();
        daemons_->Configure(
            *claim, *config, kResetConfigureTimeout, [call, id = claim->id](absl::Status s) {
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

}  // namespace sbx::server
