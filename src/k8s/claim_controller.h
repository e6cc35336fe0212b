#pragma once
// ClaimController: extensions.agents.x-k8s.io SandboxClaims of every namespace (or of one),
// served by the same allocator as gRPC claims, so that no sandbox is ever held by two claims.
//
// A claim made with kubectl or a client library (one without sbx's own annotations) is
// claimed in the allocator under owner "k8s-<namespace>" with the claim's uid as its id
// (the allocator's store makes the choice durable; a retry gets the same sandbox). With a
// warm member it is bound: the Sandbox's controller owner becomes the claim, the warm-pool
// labels go, agents.x-k8s.io/claim-uid and launch-type: warm are set (one patch), and the
// claim's status says Ready with the sandbox's name and pod IPs (one status write). With
// none warm, or with env to inject (a running pod cannot take new env), a Sandbox named
// like the claim is made for it (launch-type: cold). Lifecycle (shutdownTime with Retain,
// Delete or DeleteForeground; ttlSecondsAfterFinished), the template's env policy and
// additionalPodMetadata follow upstream-api.md. Deleting a claim releases its allocator
// claim; owner references delete its Sandbox. What each step decides is a pure function
// of claim_objects.h; every write goes through a ClaimWriter (claim_writer.h), which sends
// each binding and status once per change.
//
// gRPC claims on Kubernetes-backed pools are made visible as SandboxClaims by a
// GrpcClaimMirror (grpc_claim_mirror.h) that the controller owns and wires: it shares the
// controller's SandboxClaim informer (whose events for gRPC claims go to it), its work
// queue and workers, and its ClaimWriter.
//
// A claim that waits for its SandboxWarmPool (WarmPoolNotFound) or the pool's
// SandboxTemplate (TemplateNotFound) is looked at again as soon as that object is added or
// its spec changes (the controller's handlers on the pool and template informers), not at
// the next resync: the claims not yet bound that name the pool are re-queued.
//
// Thread-safety: Start/Stop from one thread; workers reconcile different claims at once.
// Lifetime: construct before the informers start, Start once the allocator exists, Stop
// before the allocator and the informers go.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/allocator.h"
#include "src/common/clock.h"
#include "src/k8s/claim_objects.h"
#include "src/k8s/claim_writer.h"
#include "src/k8s/client.h"
#include "src/k8s/grpc_claim_mirror.h"
#include "src/k8s/informer.h"
#include "src/k8s/namespaces.h"
#include "src/k8s/work_queue.h"
#include "src/k8s/write_scheduler.h"

namespace prometheus {
class Registry;
}

namespace sbx::k8s {

class PeriodicPass;

struct ClaimControllerOptions {
  // The namespaces served and the allocator's names of their pools and sandboxes.
  Namespaces namespaces;
  int workers = 8;
  // Every claim is looked at again this often.
  absl::Duration resync = absl::Seconds(30);
  // When set and false, this replica does not act (leader election).
  std::function<bool()> is_leader;
  // Metrics: agent_sandbox_claim_startup_latency_ms,
  // agent_sandbox_claim_controller_startup_latency_ms, agent_sandbox_claim_creation_total,
  // sbx_k8s_claim_reconciles_total{kind} (docs/metrics.md). Null: a private registry.
  std::shared_ptr<prometheus::Registry> registry;
  // Time of lifecycle decisions (shutdownTime, ttlSecondsAfterFinished), of the work
  // queue's delayed looks at them, and of conditions' lastTransitionTime; the real clock
  // when null. Must outlive the controller.
  const Clock* clock = nullptr;
  // Upstream's claim annotations: agents.x-k8s.io/controller-first-observed-at (when this
  // controller first saw the claim, RFC 3339 with nanoseconds) and
  // agents.x-k8s.io/sandbox-name (its Sandbox once bound). Each claim then gets one or two
  // metadata patches more (a status write cannot carry metadata). On by default, as
  // upstream has them; false saves those writes (upstream's
  // --disable-claim-observability-annotations; docs/kubernetes.md).
  bool claim_annotations = true;

  [[nodiscard]] absl::Status Validate() const;
};

// The allocator owner of kubectl-made claims in namespace `ns` is sbx::KubeClaimOwner(ns)
// (src/common/ids.h), "k8s-<ns>": that owner space is reserved for this controller.

class ClaimControllerMetrics;

class ClaimController {
 public:
  // Adds handlers to `sandboxes`, `pools` and `templates`: construct before they start.
  ClaimController(Client* client, WriteScheduler* writes, Informer* sandboxes, Informer* pools,
                  Informer* templates, ClaimControllerOptions options);
  ~ClaimController();

  const Informer& claims() const { return claims_; }
  // True when no claim is queued or being reconciled (delayed looks do not count).
  bool Idle() const { return queue_.Idle(); }
  [[nodiscard]] absl::Status StartInformers(absl::Duration sync_timeout);
  // Starts the workers and the gRPC claim mirror. UNAVAILABLE if the mirror's allocator
  // watch cannot start.
  [[nodiscard]] absl::Status Start(allocator::Allocator* allocator);
  void Stop();

  // Reconciles one work key now ("c/<namespace>/<claim name>" or
  // "g/<namespace>/<owner>/<id>"; tests).
  [[nodiscard]] absl::Status Reconcile(const std::string& key);

 private:
  // Where a kubectl claim's sandbox is, as far as this reconcile found out.
  struct Placement {
    std::string sandbox;  // "" while it has none
    bool cold = false;    // the claim's own Sandbox, named like it
    // Set when the claim cannot have one now: its Ready condition says why.
    std::optional<ClaimRefusal> refusal;
  };

  // The informer handlers that queue claims: for the claim's own changes (and its
  // deletion, which releases its allocator claim), for its Sandbox's, and for the pool or
  // template a waiting claim needs.
  void WatchClaims();
  void WatchSandboxes();
  void WatchPoolsAndTemplates(Informer* pools, Informer* templates);
  void Worker();
  [[nodiscard]] absl::Status ReconcileKube(const std::string& ns, const std::string& name);
  // Carries out `end` (from ShutdownVerdict) for `claim` whose status is `status`.
  [[nodiscard]] absl::Status EndClaim(const types::SandboxClaim& claim, const Json& status,
                                      ClaimEnd end);
  // The sandbox chosen before: the allocator's (durable), else the claim's cold Sandbox.
  // A refusal when the claim was bound and its sandbox is gone.
  Placement PlacedBefore(const types::SandboxClaim& claim, const Json& status);
  // A sandbox for a claim that has none: a warm member of its pool when the template's
  // policies allow the claim and none of its own is needed, else a new cold Sandbox.
  [[nodiscard]] absl::StatusOr<Placement> PlaceNew(const types::SandboxClaim& claim);
  // Writes upstream's claim annotations (options.claim_annotations) for `placement`.
  [[nodiscard]] absl::Status Annotate(const types::SandboxClaim& claim, const Placement& placement,
                                      std::optional<types::SandboxClaim>* patched)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Claims a warm member of `pool` for `claim`; "" when the pool has none warm.
  [[nodiscard]] absl::StatusOr<std::string> ClaimWarm(const types::SandboxClaim& claim,
                                                      const std::string& pool);
  // The claim's status for its placed sandbox, the ttlSecondsAfterFinished deletion, and
  // the startup metrics when it turns Ready.
  [[nodiscard]] absl::Status FollowSandbox(const types::SandboxClaim& claim, const Json& status,
                                           const Placement& placement, absl::Time now);
  // Ready=False for `refusal` (claim errors the user must fix).
  [[nodiscard]] absl::Status Refuse(const types::SandboxClaim& claim, const Json& status,
                                    const ClaimRefusal& refusal);
  void RecordReady(const types::SandboxClaim& claim, const Placement& placement, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Looks at kubectl claim `claim` again at `at` (nothing when it is InfiniteFuture).
  void LookAgainAt(const types::SandboxClaim& claim, absl::Time at, absl::Time now);
  void Enqueue(const std::string& key, absl::Duration delay = absl::ZeroDuration());
  // Re-queues the kubectl claims of namespace `ns` not yet bound (no status.sandbox.name,
  // not being deleted) whose spec.warmPoolRef.name is one of `pools`.
  void EnqueueWaitingClaims(const std::string& ns, const absl::flat_hash_set<std::string>& pools);

  Informer* const sandboxes_;
  const Informer* const pools_;
  const Informer* const templates_;
  const ClaimControllerOptions options_;
  const Clock* const clock_;
  std::unique_ptr<ClaimControllerMetrics> metrics_;
  WorkQueue queue_;
  Informer claims_;
  // The claims typed, as claims_ holds them (what the reconcile reads).
  TypedCache<types::SandboxClaim> typed_claims_;
  ClaimWriter writer_;
  GrpcClaimMirror mirror_;
  // Set by Start before the workers run; read by informer handlers, which may run before.
  std::atomic<allocator::Allocator*> allocator_{nullptr};
  std::vector<std::thread> workers_;
  // The resync: every kubectl claim looked at again each options.resync of the clock.
  std::unique_ptr<PeriodicPass> resync_;
  // Set once by Stop; read by every thread between passes.
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  // When the controller first saw each kubectl claim (uid), for the startup metric.
  absl::flat_hash_map<std::string, absl::Time> first_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s
