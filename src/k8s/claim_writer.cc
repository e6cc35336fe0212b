#include "src/k8s/claim_writer.h"

#include "absl/strings/str_cat.h"
#include "src/k8s/claim_objects.h"
#include "src/k8s/json_fields.h"

namespace sbx::k8s {

using json_fields::Field;
using json_fields::Str;

namespace {

// Memos of objects that went without an event we saw (a relist that missed a deletion)
// would grow without end; past this many a memo map starts over, which costs at most one
// repeated write each.
constexpr size_t kMaxMemos = 65536;

std::string Version(const Json& object) {
  return Str(Field(object, "metadata"), "resourceVersion");
}

const std::string& Version(const types::SandboxClaim& claim) {
  static const std::string* const kNone = new std::string();
  return claim.metadata.resource_version ? *claim.metadata.resource_version : *kNone;
}

absl::Status OkIfNotFound(absl::Status s) {
  return s.ok() || absl::IsNotFound(s) ? absl::OkStatus() : s;
}

}  // namespace

ClaimWriter::ClaimWriter(Client* client, WriteScheduler* writes, const Informer* sandboxes)
    : client_(client), writes_(writes), sandboxes_(sandboxes) {}

absl::Status ClaimWriter::Bind(const types::SandboxClaim& claim, const std::string& sandbox,
                               const std::string& launch_type) {
  const std::string& uid = claim.metadata.Uid();
  const std::string& ns = claim.metadata.Namespace();
  const std::string key = absl::StrCat(ns, "/", sandbox);
  std::string seen_version;
  if (ObjectPtr seen = sandboxes_->Get(ns, sandbox)) {
    if (BoundTo(*seen, uid)) {
      absl::MutexLock lock(&mu_);
      bound_.erase(key);
      return absl::OkStatus();
    }
    seen_version = Version(*seen);
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = bound_.find(key);
    if (it != bound_.end() && it->second.first == uid && it->second.second == seen_version) {
      return absl::OkStatus();  // patched already; the cache has not caught up
    }
  }
  const Json patch = BindingPatch(claim, sandbox, launch_type);
  absl::Status patched = writes_->Run(WritePriority::kClaim, [&] {
    return client_->PatchNoResult(kSandboxes, ns, sandbox, PatchType::kMerge, patch);
  });
  if (patched.ok()) {
    absl::MutexLock lock(&mu_);
    if (bound_.size() >= kMaxMemos) bound_.clear();
    bound_[key] = {uid, seen_version};
  }
  return patched;
}

absl::Status ClaimWriter::PatchPodMetadata(const std::string& ns, const std::string& sandbox,
                                           const Json& additional_pod_metadata) {
  const Json patch = PodMetadataPatch(additional_pod_metadata);
  if (patch.is_null()) return absl::OkStatus();
  // Sent again only when the patch or the Sandbox changed since (a pod made again by the
  // Sandbox controller changes the Sandbox's status), not on every reconcile and resync.
  std::string version;
  if (ObjectPtr seen = sandboxes_->Get(ns, sandbox)) version = Version(*seen);
  const std::string memo = absl::StrCat(version, " ", patch.dump());
  const std::string key = absl::StrCat(ns, "/", sandbox);
  {
    absl::MutexLock lock(&mu_);
    auto it = pod_metadata_sent_.find(key);
    if (it != pod_metadata_sent_.end() && it->second == memo) return absl::OkStatus();
  }
  absl::Status s = writes_->Run(WritePriority::kClaim, [&] {
    return client_->PatchNoResult(kPods, ns, sandbox, PatchType::kMerge, patch);
  });
  if (absl::IsNotFound(s)) return absl::OkStatus();  // no pod yet; the Sandbox will change
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    if (pod_metadata_sent_.size() >= kMaxMemos) pod_metadata_sent_.clear();
    pod_metadata_sent_[key] = memo;
  }
  return s;
}

Json ClaimWriter::LastStatus(const types::SandboxClaim& claim) {
  absl::MutexLock lock(&mu_);
  auto it = status_.find(claim.metadata.Uid());
  if (it != status_.end()) {
    if (it->second.version == Version(claim)) return it->second.status;
    // Another version is our write's echo or a later change: the copy shows at least what
    // we wrote. The memo goes here, when a reconcile reads such a copy, and not when the
    // informer's event arrives: a reconcile that read the copy before the echo may still
    // be on its way to WriteStatus, and must find the memo. (A copy from the API server's
    // answer, newer than the cache, drops it too; the cache's older copy then writes the
    // same status once more: only on the gRPC path's retry of a create.)
    status_.erase(it);
  }
  // The copy's own status as it was read (null when it has none).
  return claim.status.present ? types::Encode(claim.status) : Json();
}

absl::Status ClaimWriter::WriteStatus(const types::SandboxClaim& claim, Json status, bool guarded) {
  if (StatusShows(LastStatus(claim), status)) return absl::OkStatus();
  const types::ObjectMeta& meta = claim.metadata;
  Json patch = {{"status", status}};
  if (guarded) patch["metadata"] = {{"resourceVersion", Version(claim)}};
  absl::Status s = writes_->Run(WritePriority::kClaim, [&] {
    return client_->PatchNoResult(kSandboxClaims, meta.Namespace(), meta.Name(), PatchType::kMerge,
                                  patch, "status");
  });
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    if (status_.size() >= kMaxMemos) status_.clear();
    status_[meta.Uid()] = Written{Version(claim), std::move(status)};
  }
  return OkIfNotFound(s);
}

absl::Status ClaimWriter::Annotate(const types::SandboxClaim& claim, const Json& annotations,
                                   std::optional<types::SandboxClaim>* patched) {
  const types::ObjectMeta& meta = claim.metadata;
  Json missing = Json::object();
  for (const auto& [key, value] : annotations.items()) {
    const bool have = meta.annotations.has_value() && meta.annotations->contains(key) &&
                      value.is_string() && meta.Annotation(key) == value.get<std::string>();
    if (!have) missing[key] = value;
  }
  if (missing.empty()) return absl::OkStatus();
  const std::string& uid = meta.Uid();
  const std::string memo = absl::StrCat(Version(claim), " ", missing.dump());
  {
    absl::MutexLock lock(&mu_);
    auto it = annotated_.find(uid);
    if (it != annotated_.end() && it->second == memo) return absl::OkStatus();
  }
  absl::Status s = writes_->Run(WritePriority::kClaim, [&]() -> absl::Status {
    absl::StatusOr<Json> out =
        client_->Patch(kSandboxClaims, meta.Namespace(), meta.Name(), PatchType::kMerge,
                       Json{{"metadata", {{"annotations", missing}}}});
    if (!out.ok()) return out.status();
    absl::StatusOr<types::SandboxClaim> decoded = types::DecodeSandboxClaim(*out);
    if (!decoded.ok()) return decoded.status();
    *patched = *std::move(decoded);
    return absl::OkStatus();
  });
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    if (annotated_.size() >= kMaxMemos) annotated_.clear();
    annotated_[uid] = memo;
  }
  return OkIfNotFound(s);
}

void ClaimWriter::ForgetClaim(const std::string& claim_uid) {
  absl::MutexLock lock(&mu_);
  status_.erase(claim_uid);
  annotated_.erase(claim_uid);
  deleted_.erase(claim_uid);
}

absl::StatusOr<types::SandboxClaim> ClaimWriter::CreateClaim(const types::SandboxClaim& claim) {
  const std::string& ns = claim.metadata.Namespace();
  const std::string& name = claim.metadata.Name();
  const Json object = types::Encode(claim);
  absl::StatusOr<Json> created;
  absl::Status s = writes_->Run(WritePriority::kClaim, [&] {
    created = client_->Create(kSandboxClaims, ns, object);
    if (absl::IsAlreadyExists(created.status())) {
      created = client_->Get(kSandboxClaims, ns, name);
    }
    return created.status();
  });
  if (!s.ok()) return s;
  return types::DecodeSandboxClaim(*created);
}

absl::StatusOr<bool> ClaimWriter::CreateSandbox(const Json& sandbox) {
  const std::string ns = Str(Field(sandbox, "metadata"), "namespace");
  absl::Status s = writes_->Run(WritePriority::kClaim,
                                [&] { return client_->Create(kSandboxes, ns, sandbox).status(); });
  if (absl::IsAlreadyExists(s)) return false;
  if (!s.ok()) return s;
  return true;
}

absl::Status ClaimWriter::DeleteSandbox(const std::string& ns, const std::string& name) {
  return OkIfNotFound(writes_->Run(WritePriority::kCleanup,
                                   [&] { return client_->Delete(kSandboxes, ns, name, {}); }));
}

absl::Status ClaimWriter::DeleteClaim(const types::SandboxClaim& claim,
                                      const std::string& propagation) {
  const types::ObjectMeta& meta = claim.metadata;
  const std::string& uid = meta.Uid();
  if (uid.empty() || meta.Name().empty()) {
    return absl::InvalidArgumentError("DeleteClaim: the claim object has no name or uid");
  }
  {
    absl::MutexLock lock(&mu_);
    if (deleted_.contains(uid)) return absl::OkStatus();
  }
  DeleteOptions options;
  options.propagation_policy = propagation;
  options.precondition_uid = uid;
  absl::Status s = writes_->Run(WritePriority::kCleanup, [&] {
    return client_->Delete(kSandboxClaims, meta.Namespace(), meta.Name(), options);
  });
  // A 409 Conflict of the precondition: the name holds another claim now; this one is gone.
  if (s.ok() || absl::IsNotFound(s) || absl::IsAborted(s)) {
    absl::MutexLock lock(&mu_);
    if (deleted_.size() >= kMaxMemos) deleted_.clear();
    deleted_.insert(uid);
    return absl::OkStatus();
  }
  return s;
}

}  // namespace sbx::k8s
