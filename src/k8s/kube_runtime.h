#pragma once
// KubeRuntime: the Runtime whose sandboxes are agents.x-k8s.io Sandboxes (and their pods)
// of the namespaces it serves (every one, or one). A sandbox of allocator pool "N/P" is a
// warm member of the SandboxWarmPool P of namespace N: a Sandbox "P-xxxxx" of N, the
// allocator's sandbox "N/P-xxxxx" ("P" and "P-xxxxx" in the default namespace:
// namespaces.h), owned by the pool, labelled as
// upstream-api.md says (warm-pool-sandbox, sandbox-template-ref-hash, launch-type: warm)
// plus sbx's own `sbx.dev/pool` (kept for the Sandbox's whole life, so a restart finds the
// claimed ones) and `sbx.dev/template-hash` (what the member was made from).
//
// Create writes the Sandbox through the WriteScheduler (refill priority) and completes
// when the Sandbox informer shows it Ready with a pod IP; the Sandbox controller makes the
// pod. Members that never become Ready within `ready_timeout` are deleted and reported
// failed (the reconciler makes another), unless their pod is unschedulable, which waits
// for capacity instead. A Sandbox that is deleted, or whose pod ends, after it was
// reported ready is reported through `on_gone`. Sandboxes are read typed
// (objects_types.h): the Sandbox controller's TypedCache over the informer (one decode per
// version, shared with the controller's reconcile); pools and templates are still JSON.
//
// Thread-safety: every method may be called from any thread; OnSandbox/OnSandboxDeleted
// come from the Sandbox informer's thread. Callbacks run on the informer's thread, a
// write worker or the timeout thread, never under the runtime's lock.
// Lifetime: the client, scheduler and informers must outlive it; the destructor fails
// the creates still pending with CANCELLED.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/k8s/client.h"
#include "src/k8s/informer.h"
#include "src/k8s/namespaces.h"
#include "src/k8s/objects_types.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/write_scheduler.h"
#include "src/runtime/runtime.h"

namespace prometheus {
class Histogram;
class Registry;
}  // namespace prometheus

namespace sbx::k8s {

inline constexpr char kWarmPoolLabel[] = "agents.x-k8s.io/warm-pool-sandbox";
inline constexpr char kClaimUidLabel[] = "agents.x-k8s.io/claim-uid";
inline constexpr char kSbxPoolLabel[] = "sbx.dev/pool";
inline constexpr char kSbxTemplateHashLabel[] = "sbx.dev/template-hash";
// Upstream's template-hash labels of warm members (the first deprecated upstream, both
// still written by it): see PodTemplateHash and BlueprintHash.
inline constexpr char kPodTemplateHashLabel[] = "agents.x-k8s.io/sandbox-pod-template-hash";
inline constexpr char kBlueprintHashLabel[] = "agents.x-k8s.io/sandbox-template-hash";

struct KubeRuntimeOptions {
  // The namespaces of the warm pools, their templates and members, and their names in
  // the allocator. The informers given to the runtime must cover namespaces.watch.
  Namespaces namespaces;
  // A member not Ready after this long is replaced (unless its pod is unschedulable).
  absl::Duration ready_timeout = absl::Minutes(5);
  // How often pending creates are checked against ready_timeout.
  absl::Duration check_interval = absl::Seconds(1);
  // The container port with this name is where sbx-sandboxd listens in the pod; the
  // endpoint is "podIP:port" (just "podIP" when no container has it).
  std::string sandboxd_port_name = "sbx-sandboxd";
  // List waits this long for the Sandbox informer's first complete list, then fails.
  absl::Duration list_sync_timeout = absl::Seconds(30);
  // Time of ready_timeout, check_interval and the ready-to-warm metric; the real clock
  // when null. Must outlive the runtime.
  const Clock* clock = nullptr;
  // A Resume not answered within this long fails with DEADLINE_EXCEEDED.
  absl::Duration resume_timeout = absl::Minutes(2);
  // A member reported ready (or listed) and later gone (deleted, pod ended).
  std::function<void(const std::string& id)> on_gone;
  // An informer (started elsewhere) on the cluster's Nodes: when set, each sandbox comes
  // with the labels of its pod's node (SandboxInfo::node_labels, for claims' node
  // preference); when null, with none. Must outlive the runtime.
  const Informer* nodes = nullptr;
  // Metrics: sbx_k8s_member_ready_to_warm_seconds (from a new member's Ready condition,
  // its lastTransitionTime, until the runtime hands it to the allocator, which holds it
  // warm at once). A private registry when null.
  std::shared_ptr<prometheus::Registry> registry;

  [[nodiscard]] absl::Status Validate() const;
};

// A member's identity as a hash of its template's spec (stale when it differs).
std::string TemplateSpecHash(const Json& sandbox_template);
// Upstream's two template-hash labels of a warm member: FNV-1a 32-bit (NameHash) of the
// template's podTemplate, and of its blueprint (podTemplate, volumeClaimTemplates,
// service), each as JSON. Upstream hashes Go's encoding of its typed structs (fields in
// declaration order, Go's defaults and Quantity forms), which a JSON object cannot
// reproduce: the values differ from upstream's for the same template, but change exactly
// when the part they hash changes, which is what a selector or a staleness check needs.
std::string PodTemplateHash(const Json& sandbox_template);
std::string BlueprintHash(const Json& sandbox_template);
// The Sandbox of a new warm member of `pool` made from `sandbox_template`.
Json WarmMember(const Json& pool, const Json& sandbox_template);
// The endpoint of a ready Sandbox ("" when it has no pod IP): its first pod IP, with the
// containerPort of the template's port named `port_name` when there is one.
std::string SandboxEndpoint(const types::Sandbox& sandbox, const Json& sandbox_template,
                            const std::string& port_name);
// The `image` of every container (spec.containers, not init containers) of a core/v1
// PodTemplateSpec, in order, without empty ones; none when it has no such shape. What a
// claim by image matches a pool's pod template against.
std::vector<std::string> ContainerImages(const Json& pod_template);

class KubeRuntime final : public runtime::Runtime {
 public:
  // `sandboxes`, `pools`, `templates`: informers (started elsewhere) on Sandboxes,
  // SandboxWarmPools and SandboxTemplates of options.namespaces.watch.
  KubeRuntime(Client* client, WriteScheduler* writes, const Informer* sandboxes,
              const Informer* pools, const Informer* templates, KubeRuntimeOptions options);
  ~KubeRuntime() override;

  // Fails the creates still pending with CANCELLED and every later one at once (so that
  // the refill reconciler, which waits for its creates, can stop). Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  void Create(runtime::CreateRequest request, runtime::CreateCallback done) override;
  void Delete(std::string id, runtime::DeleteCallback done) override;
  // Upstream's suspension: the Sandbox's spec.operatingMode becomes Suspended (the Sandbox
  // controller deletes its pod, its PVCs stay), written at claim priority; answers once
  // the write is accepted. Memory is not kept: a pod cannot be frozen through the API.
  void Suspend(std::string id, runtime::DoneCallback done) override;
  // Writes operatingMode Running and answers once the Sandbox is Ready again for that
  // write (its Ready condition observed the generation the write made) with its new pod's
  // endpoint and node. DEADLINE_EXCEEDED after options.resume_timeout (the Sandbox stays
  // Running; a retry waits again), NOT_FOUND if the Sandbox is gone or goes meanwhile.
  void Resume(std::string id, runtime::ResumeCallback done) override;
  // The Sandboxes labelled sbx.dev/pool (warm or claimed) that exist, Ready or not, from
  // the informer cache once it holds a complete list (a list cut short by a fault never
  // replaces the cache; see Informer::Relist). Left out, as ended for good: Sandboxes
  // being deleted and those whose pod has finished (Finished=True), the same ends that
  // on_gone reports. A Sandbox that is not Ready (a status write lost to a fault, a pod
  // being replaced) is listed with ready = false (and an empty endpoint when it has no
  // pod IP). UNAVAILABLE
  // when the cache has not completed a list within options.list_sync_timeout: absence
  // cannot be told then, and a caller must not take the empty cache for it.
  [[nodiscard]] absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override;

  // From the Sandbox informer's handlers.
  void OnSandbox(const ObjectPtr& object) ABSL_LOCKS_EXCLUDED(mu_);
  void OnSandboxDeleted(const ObjectPtr& object) ABSL_LOCKS_EXCLUDED(mu_);

  // Sandbox ids below are the allocator's (Namespaces::Qualify), pools the allocator's
  // pool names.
  // Whether a create of sandbox `id` is waiting for it to become Ready.
  bool IsPending(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);
  // Creates of `pool` waiting for their Sandbox to become Ready.
  int64_t PendingIn(const std::string& pool) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether sandbox `id` is pending or being handed to the allocator right now. Once
  // this is false for a member of ours, the allocator already tracks it (or refused it).
  bool InPassage(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Creates of `pool` sent (or queued) whose answer has not come back. A member of `pool`
  // seen before this returned 0 whose id is not InPassage afterwards is nobody's: its
  // create failed (an answer lost to a fault) or was made by a process that is gone.
  int64_t CreatesInFlight(const std::string& pool) const ABSL_LOCKS_EXCLUDED(mu_);

  // The container images (ContainerImages) of the pod template of SandboxTemplate
  // `sandbox_template` in the namespace of allocator name `name` (a pool's, or its
  // template's), from the informer's cache; none when it is not there. For claims by
  // image (src/server/image_pools.h).
  std::vector<std::string> SandboxTemplateImages(const std::string& name,
                                                 const std::string& sandbox_template) const;

 private:
  using SandboxPtr = std::shared_ptr<const types::Sandbox>;
  struct Pending {
    std::string pool;
    absl::Time created;
    runtime::CreateCallback done;
  };
  struct Resuming {
    // The Sandbox's metadata.generation made by the write of operatingMode Running.
    int64_t generation = 0;
    absl::Time since;
    runtime::ResumeCallback done;
  };
  void CreateAnsweredLocked(const std::string& pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `object` (the Sandbox informer's) typed: the Sandbox controller's decoded copy when a
  // TypedCache over the informer exists, else decoded now. INVALID_ARGUMENT (naming the
  // object and field) when it does not decode.
  [[nodiscard]] absl::StatusOr<SandboxPtr> Typed(const ObjectPtr& object) const;
  // Whether the runtime waits for anything of Sandbox `object` (a watch event's): a create
  // or resume pending, or a member reported ready (for on_gone).
  bool Concerns(const Json& object) const ABSL_LOCKS_EXCLUDED(mu_);
  // The Sandbox ns/name of the informer's cache, typed; null when it is not there or does
  // not decode (logged).
  SandboxPtr Cached(const std::string& ns, const std::string& name) const;
  // Answers the Resume of `sandbox` if it is Ready for the resuming write, with a pod IP.
  void MaybeResumed(const types::Sandbox& sandbox) ABSL_LOCKS_EXCLUDED(mu_);
  // Completes the pending create of `sandbox` if it is Ready with a pod IP.
  void MaybeReady(const types::Sandbox& sandbox) ABSL_LOCKS_EXCLUDED(mu_);
  // `sandbox` is deleted, or its pod has finished: fails its create or resume, or reports
  // it gone.
  void Gone(const types::Sandbox& sandbox) ABSL_LOCKS_EXCLUDED(mu_);
  void CheckTimeouts() ABSL_LOCKS_EXCLUDED(mu_);
  std::string EndpointOf(const types::Sandbox& sandbox) const;
  // The labels of Node `node` from options_.nodes (none when it is unknown).
  std::map<std::string, std::string> NodeLabelsOf(const std::string& node) const;

  Client* const client_;
  WriteScheduler* const writes_;
  const Informer* const sandboxes_;
  // The typed cache over `sandboxes_` that its owner (the Sandbox controller, which outlives
  // the runtime as it owns the informer) made, or null.
  const TypedCache<types::Sandbox>* const typed_sandboxes_;
  const Informer* const pools_;
  const Informer* const templates_;
  const KubeRuntimeOptions options_;
  const Clock* const clock_;
  const std::shared_ptr<prometheus::Registry> registry_;
  // The one series of sbx_k8s_member_ready_to_warm_seconds, looked up once (Observe is
  // thread-safe).
  prometheus::Histogram* const ready_to_warm_;
  std::thread checker_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Per pool, creates not answered yet (an answer moves its member into pending_ under
  // the same lock).
  absl::flat_hash_map<std::string, int64_t> in_flight_ ABSL_GUARDED_BY(mu_);
  // Members between pending_ and the allocator: their create callback is running.
  absl::flat_hash_set<std::string> handing_ ABSL_GUARDED_BY(mu_);
  // Resumes waiting for their Sandbox to be Ready again, by sandbox id. (Every map here is
  // keyed by the allocator's sandbox id, so that Sandboxes of one name in two namespaces
  // are never taken for each other.)
  absl::flat_hash_map<std::string, Resuming> resuming_ ABSL_GUARDED_BY(mu_);
  // Members reported ready (and not yet gone), for on_gone.
  absl::flat_hash_map<std::string, std::string> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s
