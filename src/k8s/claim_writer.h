#pragma once
// ClaimWriter: every API write of the claim paths (the ClaimController's kubectl claims and
// the GrpcClaimMirror's gRPC claims), each through the WriteScheduler at its priority —
// bindings, claim status and cold Sandboxes at claim priority, deletes at clean-up — and
// each idempotent, so that a retry after a conflict or a crash does no harm.
//
// The informers show our own writes only a little later, and a reconcile running in
// between must not send the same write again. So the writer remembers, per object, what it
// wrote together with the resourceVersion the informer's copy had when it wrote: while the
// informer still shows that version, it compares with what it wrote; once the informer
// shows another version (the echo of the write, or a newer change), it forgets and
// compares with the informer's copy. Sandbox bindings and claim status are remembered
// this way; a pod metadata patch is remembered with its Sandbox's version and sent again
// when either changes.
//
// Thread-safety: all methods may be called from any thread, for different claims at once;
// one claim is written by one caller at a time (the work queue sees to it).
// Lifetime: the client, the write scheduler and the Sandbox informer outlive the writer.

#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "src/k8s/client.h"
#include "src/k8s/informer.h"
#include "src/k8s/objects_types.h"
#include "src/k8s/write_scheduler.h"

namespace sbx::k8s {

class ClaimWriter {
 public:
  // Writes each object in its own namespace (a claim's Sandbox is in the claim's);
  // `sandboxes` is the informer of the Sandboxes of those namespaces.
  ClaimWriter(Client* client, WriteScheduler* writes, const Informer* sandboxes);

  // Binds Sandbox `sandbox` to `claim` (BindingPatch) unless the informer shows it bound
  // already or the same patch went out while the informer still shows the version it was
  // sent against. Errors: the API's.
  [[nodiscard]] absl::Status Bind(const types::SandboxClaim& claim, const std::string& sandbox,
                                  const std::string& launch_type) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies a claim's spec.additionalPodMetadata to the pod of Sandbox `ns/sandbox`; sent
  // again only when the patch or the Sandbox changed. OK when the pod does not exist yet
  // (the Sandbox changes when it does). Errors: the API's.
  [[nodiscard]] absl::Status PatchPodMetadata(const std::string& ns, const std::string& sandbox,
                                              const Json& additional_pod_metadata)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The status of `claim` (the informer's copy, or the API server's answer) as last
  // written: what this writer wrote while the copy still has the version it was written
  // against, else the copy's own (and what was written is forgotten).
  Json LastStatus(const types::SandboxClaim& claim) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `status` to `claim` (a merge patch of the status subresource) unless
  // LastStatus(claim) shows it already. OK when the claim is gone. Errors: the API's.
  // `guarded`: the patch names the copy's resourceVersion, so that it fails (ABORTED) when
  // the claim changed since (a status that ends or refuses a claim, judged from the copy).
  [[nodiscard]] absl::Status WriteStatus(const types::SandboxClaim& claim, Json status,
                                         bool guarded = false) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `annotations` to `claim`'s metadata (a merge patch) unless its copy has them all
  // already or the same patch went out against the copy's version. OK when the claim is
  // gone. Errors: the API's. When it wrote, `*patched` is the claim as the API answered (its
  // new resourceVersion: the reconcile goes on with it, so that the status it writes next
  // is remembered against the version the annotations made); else it is left empty.
  [[nodiscard]] absl::Status Annotate(const types::SandboxClaim& claim, const Json& annotations,
                                      std::optional<types::SandboxClaim>* patched)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The claim with uid `claim_uid` is gone.
  void ForgetClaim(const std::string& claim_uid) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes SandboxClaim `claim` and answers the object made; when one of its name exists
  // (ours, made by an earlier try), answers that one. Errors: the API's, and
  // INVALID_ARGUMENT when the answer is not a SandboxClaim.
  [[nodiscard]] absl::StatusOr<types::SandboxClaim> CreateClaim(const types::SandboxClaim& claim);
  // Makes `sandbox` (a claim's cold Sandbox) and answers true; false when it exists.
  // Errors: the API's.
  [[nodiscard]] absl::StatusOr<bool> CreateSandbox(const Json& sandbox);
  // Deletes Sandbox `ns/name`; OK when it is gone. Errors: the API's.
  [[nodiscard]] absl::Status DeleteSandbox(const std::string& ns, const std::string& name);
  // Deletes SandboxClaim `claim` (only that uid: a claim made again under its name stays)
  // with `propagation` ("Background", "Foreground", or "" for the API server's default);
  // sent once until ForgetClaim, however often a lagging informer copy asks again. OK
  // when it is gone. Errors: the API's.
  [[nodiscard]] absl::Status DeleteClaim(const types::SandboxClaim& claim,
                                         const std::string& propagation) ABSL_LOCKS_EXCLUDED(mu_);
  // A name would become a JSON string without a name or uid: pass the claim object.
  [[nodiscard]] absl::Status DeleteClaim(const std::string& name,
                                         const std::string& propagation) = delete;

 private:
  // What was written against which version of the object.
  struct Written {
    std::string version;
    Json status;
  };

  Client* const client_;
  WriteScheduler* const writes_;
  const Informer* const sandboxes_;

  absl::Mutex mu_;
  // Claim uid -> the status written and the claim's version in the informer's copy then.
  absl::flat_hash_map<std::string, Written> status_ ABSL_GUARDED_BY(mu_);
  // The bindings patched whose echo the Sandbox informer has not shown yet: "<namespace>/<sandbox>"
  // -> (claim uid, the Sandbox's resourceVersion in the cache when the patch went out).
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> bound_ ABSL_GUARDED_BY(mu_);
  // The pod metadata patch last sent to each Sandbox's pod ("<namespace>/<sandbox>"), with
  // the Sandbox's resourceVersion then: "<version> <patch>".
  absl::flat_hash_map<std::string, std::string> pod_metadata_sent_ ABSL_GUARDED_BY(mu_);
  // Claim uid -> "<version> <annotations patch>" last sent.
  absl::flat_hash_map<std::string, std::string> annotated_ ABSL_GUARDED_BY(mu_);
  // The uids of the claims deleted whose deletion the informer has not shown yet.
  absl::flat_hash_set<std::string> deleted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s
