#pragma once
// The extensions.agents.x-k8s.io SandboxClaim as data: what a claim's template allows,
// the Sandbox a claim gets when no warm member will do, the patch that binds a Sandbox to
// a claim, the status a claim shows for its Sandbox, when its lifecycle ends it, and the
// SandboxClaim that makes a gRPC claim visible. Pure functions of their inputs (time is
// passed in), used by the ClaimController and the GrpcClaimMirror and tested on their
// own. Facts from upstream-api.md. Claims are typed (objects_types.h: decoded once, at the
// edge, from the informer's copy); what they build (Sandboxes, patches, statuses) and the
// Sandboxes and templates they read are still JSON (issue 39's next kinds).

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "src/common/ids.h"
#include "src/k8s/objects_types.h"
#include "src/store/records.h"

namespace sbx::k8s {

using Json = nlohmann::json;

inline constexpr char kSandboxNameAnnotation[] = "agents.x-k8s.io/sandbox-name";
inline constexpr char kControllerFirstObservedAnnotation[] =
    "agents.x-k8s.io/controller-first-observed-at";
inline constexpr char kSbxOwnerAnnotation[] = "sbx.dev/owner";
inline constexpr char kSbxClaimIdAnnotation[] = "sbx.dev/claim-id";
inline constexpr char kClientRequestedAtAnnotation[] = "agents.x-k8s.io/client-first-requested-at";

// Why a claim cannot go on now: its Ready condition says False with this reason and
// message until the claim or its pool or template changes.
struct ClaimRefusal {
  std::string reason;
  std::string message;

  bool operator==(const ClaimRefusal&) const = default;
};

// The controller owner reference of a SandboxClaim `claim` (blockOwnerDeletion set).
Json ClaimRef(const types::SandboxClaim& claim);

// Whether `claim` must get a Sandbox of its own (a cold one) rather than a warm member:
// env or volumeClaimTemplates of its own, which a running pod cannot take.
bool NeedsOwnSandbox(const types::SandboxClaim& claim);

// What `sandbox_template` (the SandboxTemplate of the claim's pool) says of `claim`'s env
// and volumeClaimTemplates: nothing (nullopt) when it allows them, else the refusal.
// envVarsInjectionPolicy: Disallowed (the default) refuses any env; Allowed refuses env
// that a container of the template already sets; Overrides allows all.
// volumeClaimTemplatesPolicy: Disallowed (the default) refuses any. Messages name the
// template, and for Allowed the variable.
std::optional<ClaimRefusal> CheckClaimAgainstTemplate(const types::SandboxClaim& claim,
                                                      const Json& sandbox_template);

// The cold Sandbox of `claim` in namespace `ns`: named like the claim, controlled by it,
// labelled launch-type cold with the claim's uid, the template's name and name hash and
// the claim's created-by label when it has one;
// the template's podTemplate (with upstream's secure defaults) and service, the claim's
// volumeClaimTemplates (else the template's), the claim's env appended to each container
// it targets (replacing a template variable of the same name) and its
// additionalPodMetadata merged into the pod's metadata.
Json ColdSandbox(const types::SandboxClaim& claim, const Json& sandbox_template,
                 const std::string& ns);

// Whether Sandbox `sandbox` is bound to the claim with uid `claim_uid`: the claim is its
// controller and its claim-uid label says so.
bool BoundTo(const Json& sandbox, const std::string& claim_uid);

// The merge patch that binds a warm Sandbox to `claim`: the claim becomes its controller
// owner, the warm-pool label goes, claim-uid and launch-type (`launch_type`) are set. The
// sandbox-template-ref-hash label stays (the template's NetworkPolicy selects by it); the
// pod-name annotation records the pod the claim gets (named like Sandbox `sandbox`). The
// created-by label becomes the claim's, or is removed when the claim has none (upstream).
Json BindingPatch(const types::SandboxClaim& claim, const std::string& sandbox,
                  const std::string& launch_type);

// The merge patch of a Sandbox's pod for a claim's spec.additionalPodMetadata (its labels
// and annotations), or null when it has none.
Json PodMetadataPatch(const Json& additional_pod_metadata);

// A condition of `type` with `status`, `reason` and `message`, whose lastTransitionTime is
// kept from the condition of that type in `old_status` when its status is the same, else
// `now`.
Json ClaimCondition(const std::string& type, bool status, const std::string& reason,
                    const std::string& message, const Json& old_status, absl::Time now);

// `old_status` with its conditions replaced by Ready=False for `refusal`.
Json RefusedStatus(const Json& old_status, const ClaimRefusal& refusal, absl::Time now);

// The status of a claim bound to Sandbox `sandbox_name`, given `sandbox` (the Sandbox
// object, or null while the cache does not have it) and whether it is the claim's cold
// Sandbox. A missing cold Sandbox says Ready=False SandboxCreatePending; a missing warm
// one keeps the old conditions (the binding is being written). Otherwise Ready follows the
// Sandbox's Ready condition (SandboxNotReady when it has none), its Finished condition is
// copied, and status.sandbox holds the name and the Sandbox's podIPs. Other fields of
// `old_status` are kept.
Json BoundClaimStatus(const Json& old_status, const std::string& sandbox_name, bool cold,
                      const Json* sandbox, absl::Time now);

// Whether a claim whose status is `old_status` already shows `next`: every field of `next`
// is there with the same value (so writing `next` would change nothing).
bool StatusShows(const Json& old_status, const Json& next);

// Whether an update of a SandboxClaim from `before` to `after` can change what its
// reconcile does: anything but its status and the fields every write changes
// (resourceVersion, managedFields). A status-only update is the echo of the controller's
// own status write (it is the only writer of a claim's status); the writer's memo and the
// periodic resync cover one written by anyone else.
bool ClaimChangeNeedsReconcile(const Json& before, const Json& after);

// Whether an update of a Sandbox from `before` to `after` concerns the claim that owns it:
// its status (which the claim's status shows and its ttlSecondsAfterFinished reads), its
// deletion, or another object under its name. Not its labels and owner references, which
// only the binding the claim's own reconcile wrote changes.
bool SandboxChangeConcernsClaim(const Json& before, const Json& after);

// How a claim's lifecycle ends it.
enum class ClaimEnd {
  kNone,              // not yet
  kDelete,            // delete the claim (the API server's default propagation)
  kDeleteBackground,  // shutdownPolicy Delete
  kDeleteForeground,  // shutdownPolicy DeleteForeground
  kRetain,            // shutdownPolicy Retain (or none): release it, keep the claim
};
struct LifecycleVerdict {
  ClaimEnd end = ClaimEnd::kNone;
  // With kNone: when to look again (the deadline); InfiniteFuture when nothing is due.
  absl::Time look_again = absl::InfiniteFuture();
};

// spec.lifecycle.shutdownTime of `claim` at `now`: its shutdownPolicy once the time has
// come, else kNone until then. A shutdownTime that is not RFC 3339 never comes.
LifecycleVerdict ShutdownVerdict(const types::SandboxClaim& claim, absl::Time now);

// spec.lifecycle.ttlSecondsAfterFinished of `claim` whose Sandbox's status is
// `sandbox_status`, at `now`: kDelete that long after the Sandbox's Finished condition
// turned True (from `now` when its time is unreadable), else kNone until then.
LifecycleVerdict TtlVerdict(const types::SandboxClaim& claim, const Json& sandbox_status,
                            absl::Time now);

// When `claim` was made (its creationTimestamp), else `fallback`.
absl::Time ClaimCreatedAt(const types::SandboxClaim& claim, absl::Time fallback);
// When the claim's client first asked for it (the client-first-requested-at annotation
// that upstream's client libraries set), when it says so in RFC 3339.
std::optional<absl::Time> ClientRequestedAt(const types::SandboxClaim& claim);

// The SandboxClaim named `name` in `where.ns` that shows active gRPC claim `claim` of
// pool `where.name` (the SandboxWarmPool's own name): label sbx.dev/source grpc,
// annotations naming its owner, id and Sandbox `sandbox` (its object name),
// spec.warmPoolRef the pool.
types::SandboxClaim GrpcSandboxClaim(const store::ClaimRecord& claim, const std::string& name,
                                     const NamespacedName& where, const std::string& sandbox);

// The status of a gRPC claim's SandboxClaim: Ready=True DependenciesReady, the name of its
// Sandbox and, when `sandbox` (that object, or null) has them, its podIPs.
Json GrpcClaimStatus(const std::string& sandbox_name, const Json* sandbox, const Json& old_status,
                     absl::Time now);

}  // namespace sbx::k8s
