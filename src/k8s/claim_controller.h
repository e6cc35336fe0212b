#pragma once
// ClaimController: extensions.agents.x-k8s.io SandboxClaims of one namespace, served by the
// same allocator as gRPC claims, so that no sandbox is ever held by two claims.
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
// claim; owner references delete its Sandbox.
//
// A gRPC claim on a Kubernetes-backed pool is answered from memory with no API write.
// The controller hears of it afterwards (an all-owners allocator watch) and makes it
// visible: a SandboxClaim named "grpc-<16 hex of owner/id>" carrying the sandbox name,
// the same binding patch of the Sandbox, and a Ready status — idempotent writes at claim
// priority, so a retry after a conflict or a crash never binds another sandbox. When the
// gRPC claim ends, its SandboxClaim is deleted.
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
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/allocator.h"
#include "src/k8s/client.h"
#include "src/k8s/informer.h"
#include "src/k8s/work_queue.h"
#include "src/k8s/write_scheduler.h"

namespace prometheus {
class Registry;
}

namespace sbx::k8s {

inline constexpr char kSandboxNameAnnotation[] = "agents.x-k8s.io/sandbox-name";
inline constexpr char kSbxOwnerAnnotation[] = "sbx.dev/owner";
inline constexpr char kSbxClaimIdAnnotation[] = "sbx.dev/claim-id";

struct ClaimControllerOptions {
  std::string ns = "default";
  int workers = 8;
  // Every claim is looked at again this often.
  absl::Duration resync = absl::Seconds(30);
  // When set and false, this replica does not act (leader election).
  std::function<bool()> is_leader;
  // Metrics: agent_sandbox_claim_startup_latency_ms,
  // agent_sandbox_claim_controller_startup_latency_ms, agent_sandbox_claim_creation_total.
  std::shared_ptr<prometheus::Registry> registry;

  absl::Status Validate() const;
};

// The allocator owner of kubectl-made claims in namespace `ns` is sbx::KubeClaimOwner(ns)
// (src/common/ids.h), "k8s-<ns>": that owner space is reserved for this controller.

// The SandboxClaim name of gRPC claim (owner, id).
std::string GrpcClaimName(const std::string& owner, const std::string& id);

class ClaimControllerMetrics;

class ClaimController {
 public:
  // Adds handlers to `sandboxes`, `pools` and `templates`: construct before they start.
  ClaimController(Client* client, WriteScheduler* writes, Informer* sandboxes, Informer* pools,
                  Informer* templates, ClaimControllerOptions options);
  ~ClaimController();

  const Informer& claims() const { return claims_; }
  absl::Status StartInformers(absl::Duration sync_timeout);
  // Starts the workers and the allocator watch. UNAVAILABLE if the watch cannot start.
  absl::Status Start(allocator::Allocator* allocator);
  void Stop();

  // Reconciles one work key now ("c/<claim name>" or "g/<owner>/<id>"; tests).
  absl::Status Reconcile(const std::string& key);

 private:
  void Worker();
  void WatchLoop();
  absl::Status ReconcileKube(const std::string& name);
  absl::Status ReconcileGrpc(const std::string& owner, const std::string& id);
  // Patches the Sandbox to belong to `claim` (skipped when it already does).
  absl::Status BindSandbox(const Json& claim, const std::string& sandbox, const char* launch_type);
  // Applies a claim's additionalPodMetadata (labels, annotations) to its Sandbox's pod.
  absl::Status PatchPodMetadata(const std::string& sandbox, const Json& extra);
  // Writes the claim's status when it differs from what it has.
  absl::Status WriteStatus(const Json& claim, Json status);
  // The claim's status as this controller last wrote it (else as the informer has it).
  Json LastStatus(const Json& claim) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CreateColdSandbox(const Json& claim, const Json& sandbox_template);
  // Ready=False with `reason` and `message` (claim errors the user must fix).
  absl::Status NotReady(const Json& claim, const std::string& reason, const std::string& message);
  void Enqueue(const std::string& key, absl::Duration delay = absl::ZeroDuration());
  // Re-queues the kubectl claims not yet bound (no status.sandbox.name, not being deleted)
  // whose spec.warmPoolRef.name is one of `pools`.
  void EnqueueWaitingClaims(const absl::flat_hash_set<std::string>& pools);

  Client* const client_;
  WriteScheduler* const writes_;
  Informer* const sandboxes_;
  const Informer* const pools_;
  const Informer* const templates_;
  const ClaimControllerOptions options_;
  std::unique_ptr<ClaimControllerMetrics> metrics_;
  WorkQueue queue_;
  Informer claims_;
  // Set by Start before the workers run; read by informer handlers, which may run before.
  std::atomic<allocator::Allocator*> allocator_{nullptr};
  std::unique_ptr<allocator::ClaimWatch> watch_;
  std::thread watcher_;
  std::vector<std::thread> workers_;
  std::thread resync_;
  // Set once by Stop; read by every thread between passes.
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  bool watch_ready_ ABSL_GUARDED_BY(mu_) = false;
  // When the controller first saw each kubectl claim (uid), for the startup metric.
  absl::flat_hash_map<std::string, absl::Time> first_seen_ ABSL_GUARDED_BY(mu_);
  // The status this controller last wrote to each claim (by uid): the informer's copy may
  // lag behind our own write, and comparing with it would write the same status twice.
  absl::flat_hash_map<std::string, Json> written_ ABSL_GUARDED_BY(mu_);
  // The bindings this controller patched whose echo the Sandbox informer has not shown
  // yet: sandbox name -> (claim uid, the Sandbox's resourceVersion in the cache when the
  // patch went out). While the cache still holds that version, the patch is not sent
  // again (a second reconcile of the same claim used to repeat it).
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> bound_ ABSL_GUARDED_BY(mu_);
  // The claim's additionalPodMetadata patch last sent to each Sandbox's pod, with the
  // Sandbox's resourceVersion then: "<version> <patch>".
  absl::flat_hash_map<std::string, std::string> pod_metadata_sent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s
