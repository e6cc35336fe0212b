#pragma once
// The agents.x-k8s.io/v1beta1 Sandbox as data: what its pod, PVCs and Service must look
// like, and what its status says given what exists. Pure functions of their inputs, used
// by the Sandbox controller and tested on their own. Facts from upstream-api.md.
// They read typed objects (objects_types.h, decoded once at the edge by the informers'
// TypedCaches) and build JSON only for what is sent: the bodies of creates and the merge
// patches. The pod template's spec is pass-through JSON in the types, so the pod's volumes,
// its containers' ports and the daemon's secret are JSON edits of that part.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "src/k8s/objects_types.h"

namespace sbx::k8s {

using Json = nlohmann::json;

inline constexpr char kNameHashLabel[] = "agents.x-k8s.io/sandbox-name-hash";
inline constexpr char kReservedPrefix[] = "agents.x-k8s.io/";
inline constexpr char kReservedExtensionsPrefix[] = "extensions.agents.x-k8s.io/";
inline constexpr char kLaunchTypeLabel[] = "agents.x-k8s.io/launch-type";
// FNV-1a 32-bit (NameHash) of the SandboxTemplate a Sandbox was made from; its template's
// NetworkPolicy selects the pods by it.
inline constexpr char kTemplateRefHashLabel[] = "agents.x-k8s.io/sandbox-template-ref-hash";
inline constexpr char kExtensionsGroup[] = "extensions.agents.x-k8s.io";
// The SandboxTemplate a warm member or a claim's cold Sandbox was made from (its name).
inline constexpr char kTemplateRefAnnotation[] = "agents.x-k8s.io/sandbox-template-ref";
// The pod a claim's adopted warm Sandbox runs (named like the Sandbox).
inline constexpr char kPodNameAnnotation[] = "agents.x-k8s.io/pod-name";
// The keys of the pod template's labels and annotations the pod was given, sorted and
// comma-separated.
inline constexpr char kPropagatedLabelsAnnotation[] = "agents.x-k8s.io/propagated-labels";
inline constexpr char kPropagatedAnnotationsAnnotation[] = "agents.x-k8s.io/propagated-annotations";

// Who made an object (upstream's client libraries say go-client or python-client, its
// controllers controller).
inline constexpr char kCreatedByLabel[] = "agents.x-k8s.io/created-by";

// The created-by label of an object as upstream's metrics show it: go-client,
// python-client, controller, or unknown (anything else, to bound the series).
std::string CreatedBy(const types::ObjectMeta& metadata);
// The same of an object held as JSON (an edge: informer handlers, which read a few fields
// of each watch event on the informer's one thread instead of decoding it there, and
// callers that hold JSON).
std::string CreatedBy(const Json& object);
// The kind of the extensions.agents.x-k8s.io object that controls the object of
// `metadata` (SandboxClaim or SandboxWarmPool), else "None": agent_sandboxes' owned_by.
std::string ExtensionsControllerKind(const types::ObjectMeta& metadata);
// The same of an object held as JSON (an edge, as CreatedBy's).
std::string ExtensionsControllerKind(const Json& object);

// FNV-1a 32-bit of `name` as 8 lower-case hex digits.
std::string NameHash(const std::string& name);

// The controller owner reference of Sandbox `owner`, as sent in an object's ownerReferences.
Json ControllerRef(const types::Sandbox& owner);
// The uid of the controller owner reference of the object of `metadata`, or "" when it has
// none.
std::string ControllerUid(const types::ObjectMeta& metadata);
// The same of an object held as JSON (an edge, as CreatedBy's).
std::string ControllerUid(const Json& object);

// The pod of `sandbox`, as sent to create it: named like it, in its namespace, owned by
// it, labelled with the name hash, the podTemplate's labels and annotations without
// reserved prefixes, and PVC volumes for volumeClaimTemplates. The Sandbox's launch-type
// label is passed on; its sandbox-template-ref-hash label only when an
// extensions.agents.x-k8s.io object (a SandboxWarmPool or SandboxClaim) controls it, as
// upstream does, so that a Sandbox anyone else made cannot place its pod under a
// template's NetworkPolicy. The pod's spec is the template's (pass-through JSON).
Json DesiredPod(const types::Sandbox& sandbox);
// The same for a Sandbox held as JSON (an edge for callers that hold JSON); null, logged,
// when it does not decode.
Json DesiredPod(const Json& sandbox);

// The environment variable that carries a sandbox daemon's secret into its pod.
inline constexpr char kSandboxdSecretEnv[] = "SBX_SANDBOXD_SECRET";
// The container port through which sbx-server reaches a pod's daemon.
inline constexpr char kSandboxdPortName[] = "sbx-sandboxd";
// Gives `secret` (as kSandboxdSecretEnv) to every container of `pod` (a body DesiredPod
// made, before it is sent) that declares the port named `port_name`, replacing a value the
// template set.
void SetSandboxdSecret(Json* pod, const std::string& port_name, const std::string& secret);
// The PVCs of `sandbox`'s volumeClaimTemplates, as sent to create them: named
// "<entry>-<sandbox>", owned by it, labelled with the entry's labels (without reserved
// prefixes) and the Sandbox's name hash (the controller's PVC informer watches by it).
// One per entry with a name, in the entries' order.
std::vector<Json> DesiredPvcs(const types::Sandbox& sandbox);
// Whether an existing PVC of one of `sandbox`'s PVC names can serve its pod.
enum class PvcFit {
  kUsable,        // controlled by the Sandbox (its uid), not being deleted
  kBeingDeleted,  // deletionTimestamp set (an earlier Sandbox's, or ours): wait until it is gone
  kRefused,       // anyone else's, or no one's: upstream refuses it (ReconcilerError)
};
// How `pvc` fits `sandbox`; for kBeingDeleted and kRefused, `why` (when given) says so,
// naming the PVC and its controller.
PvcFit FitOfPvc(const types::PersistentVolumeClaim& pvc, const types::Sandbox& sandbox,
                std::string* why);
// The headless Service of `sandbox`, as sent to create it (selector: its name hash; ports
// from its containers).
Json DesiredService(const types::Sandbox& sandbox);

// The label with which an unowned object authorizes any Sandbox of its name to adopt it.
inline constexpr char kAdoptableLabel[] = "agents.x-k8s.io/adoptable";
// Whether `sandbox` may adopt its pod or Service (named like it), as upstream's controller
// does after `kubectl delete --cascade=orphan` of a Sandbox and a re-apply: the object has
// no controller, is not being deleted, and carries the tracking label (sandbox-name-hash
// of the Sandbox's name) or `agents.x-k8s.io/adoptable: "true"`; a Service must also be
// headless (clusterIP None or unset, which cannot change).
bool MayAdopt(const types::Sandbox& sandbox, const types::Pod& pod);
bool MayAdopt(const types::Sandbox& sandbox, const types::Service& service);
// The merge patch by which `sandbox` adopts its pod or Service (MayAdopt): its owner
// references with the Sandbox's controller reference added, its tracking label, and for a
// Service the selector and ports DesiredService has; guarded by the object's
// resourceVersion.
Json AdoptionPatch(const types::Sandbox& sandbox, const types::Pod& pod);
Json AdoptionPatch(const types::Sandbox& sandbox, const types::Service& service);

// What the controller saw while reconciling a Sandbox.
struct Observed {
  // Pods controlled by the Sandbox (normally zero or one), shared with the typed cache of
  // the pod informer (never copied on the reconcile path).
  std::vector<std::shared_ptr<const types::Pod>> pods;
  // The Service, when one named like the Sandbox is owned by it; null when none.
  std::shared_ptr<const types::Service> service;
  bool service_wanted = false;
  bool suspended = false;
  bool expired = false;
  // A problem the controller hit (ReconcilerError), "" when none.
  std::string error;
  // Why the pod is not made yet although it should be: a PVC of the Sandbox does not exist
  // (yet), or an old one of its name is being deleted. "" when every PVC is there.
  std::string pvcs_missing;
};

// The Sandbox's status for what was observed. Conditions keep their lastTransitionTime
// from `old_status` when their status did not change (so an unchanged world gives an
// equal status, and no write).
types::SandboxStatus ComputeStatus(const types::Sandbox& sandbox, const Observed& observed,
                                   const types::SandboxStatus& old_status, absl::Time now);

// True when the Ready condition of `status` is True.
bool IsReady(const types::SandboxStatus& status);
// The same of a status held as JSON (an edge for callers that hold JSON: any kind whose
// status has conditions).
bool IsReady(const Json& status);

}  // namespace sbx::k8s
