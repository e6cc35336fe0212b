#pragma once
// SandboxController: makes the cluster follow agents.x-k8s.io/v1beta1 Sandboxes — a pod
// named like each Sandbox and owned by it, PVCs from volumeClaimTemplates (the pod is made
// only once each exists and is the Sandbox's; one of that name it does not own is refused,
// as upstream does), a headless Service when `service: true`, suspension (pod deleted, the
// rest kept), expiry at shutdownTime (Retain or Delete) — and writes the Sandbox's status
// when it changes.
//
// Level-triggered: informers on Sandboxes, pods, Services and PVCs feed a keyed work queue
// (namespace/name of the Sandbox); workers reconcile a key from the informers' caches, so
// the hot path never lists. The reconcile reads the objects typed (objects_types.h)
// through a TypedCache over each informer (each version decoded once, by the first reader,
// on a worker), and JSON is built only for what is sent (sandbox_objects.h). The informer
// handlers, which run on each informer's one thread for every event, read the few fields
// they need from the event's JSON instead. Errors are
// retried with per-key backoff. With leader election on, only the replica holding the Lease
// reconciles (the others keep their caches warm).
//
// Thread-safety: Start/Stop from one thread; Reconcile may run on many workers at once
// (never for the same key).
// Lifetime: the client must outlive the controller; Stop joins every thread.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "src/k8s/client.h"
#include "src/k8s/informer.h"
#include "src/k8s/leader_election.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/work_queue.h"

namespace sbx::k8s {

struct SandboxControllerOptions {
  // "" watches every namespace.
  std::string ns;
  int workers = 4;
  // Leader election (off: this replica always reconciles). With it, every write of the
  // controller's client is fenced by the elector (Client::SetWriteFence) from Start on,
  // and by a closed fence once the controller is destroyed.
  bool leader_election = false;
  LeaderElectionOptions election;
  // The elector's own client, whose requests should be bounded by election.retry_period
  // and not retried (LeaderElector); null: the controller's client.
  Client* election_client = nullptr;
  // Called (on the elector's thread) when this replica stops leading, by losing the Lease
  // or at Stop.
  std::function<void()> on_stopped_leading;
  WorkQueueOptions queue;
  // A new Sandbox's first status, while it only says that the pod is on its way, is
  // written no earlier than this after the Sandbox's creation (creationTimestamp, whole
  // seconds): a member Ready sooner gets one status write, the Ready one. Errors,
  // unschedulable pods, suspension and expiry are written at once. Zero writes at once.
  absl::Duration first_status_hold = absl::Seconds(2);
  // The secret of a Sandbox's daemon, by the Sandbox's namespace and name (so that
  // Sandboxes of one name in two namespaces get different ones): every container of its
  // pod that declares the port named `sbx-sandboxd` gets it as SBX_SANDBOXD_SECRET
  // (sbx-sandboxd takes it out of its environment at start and refuses calls without it).
  // Unset: none.
  std::function<std::string(const std::string& ns, const std::string& name)> sandboxd_secret;
  // Time of the status hold, the expectations' timeout, shutdownTime and the rechecks; the
  // real clock when null. Also the clock of the work queue, the informers and the election
  // unless `queue.clock` or `election.clock` names another. Must outlive the controller.
  const Clock* clock = nullptr;
  // Metrics: sbx_k8s_reconcile_duration_seconds{controller}, sbx_k8s_reconcile_errors_total,
  // sbx_k8s_workqueue_depth, agent_sandbox_creation_latency_ms.
  std::shared_ptr<prometheus::Registry> registry;

  [[nodiscard]] absl::Status Validate() const;
};

class SandboxControllerMetrics;

class SandboxController {
 public:
  SandboxController(Client* client, SandboxControllerOptions options);
  ~SandboxController();

  // Starts the informers, waits until they have synced (or `sync_timeout` passes, which
  // is DEADLINE_EXCEEDED), then the election and the workers.
  [[nodiscard]] absl::Status Start(absl::Duration sync_timeout = absl::Seconds(30));
  void Stop();

  bool IsLeader() const;
  // The elector once Start has run with leader_election; null otherwise.
  LeaderElector* elector() const { return elector_.get(); }
  // Reconciles one Sandbox ("namespace/name") now, from the caches.
  [[nodiscard]] absl::Status Reconcile(const std::string& key);
  size_t QueueDepth() const { return queue_.Depth(); }
  // Keys waiting for a timer (the status hold, shutdownTime, a recheck or a backoff).
  size_t QueueDelayed() const { return queue_.Delayed(); }
  // True when no Sandbox is queued or being reconciled (timers do not count). With an
  // informer's HandledResourceVersion at a write's version, this says that the controller
  // has acted on that write: for tests, which wait for it instead of sleeping.
  bool Idle() const { return queue_.Idle(); }
  // The pod informer (for tests that wait until it has handled a pod's change).
  const Informer& pod_informer() const { return pods_; }
  // The Sandbox informer, shared with the Kubernetes runtime and the warm-pool and claim
  // controllers (they add their handlers before Start, and read its cache).
  Informer& sandbox_informer() { return sandboxes_; }

 private:
  void Worker();
  // The handler of the pod, Service and PVC informers: the object's event ends its
  // expectation and queues its Sandbox (read from the event's JSON, on the informer's
  // thread).
  void OnOwned(const Resource& resource, const ObjectPtr& object);
  [[nodiscard]] absl::Status ReconcileSandbox(const types::Sandbox& sandbox);
  // Creates the PVCs of `sandbox` that do not exist; sets `observed->pvcs_missing` while one
  // is not there for its pod (still to be made, or an old one being deleted) and
  // `observed->error` for one of its names that someone else has. Fails on API errors.
  [[nodiscard]] absl::Status EnsurePvcs(const types::Sandbox& sandbox, Observed* observed);
  // Creates the Service (wanted) or deletes ours (not wanted); what exists afterwards (null:
  // none, or none shown yet).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const types::Service>> EnsureService(
      const types::Sandbox& sandbox, bool wanted);
  // OK when `sandbox` (as cached) still exists on the API server with its uid and is not
  // being deleted, read past the cache; ABORTED otherwise (the cache lags: no adoption).
  [[nodiscard]] absl::Status StillAdopts(const types::Sandbox& sandbox);
  // Writes `status` (encoded) over the Sandbox's, whose encoding is `old_status`.
  [[nodiscard]] absl::Status WriteStatus(const types::Sandbox& sandbox, const Json& old_status,
                                         const Json& status);

  Client* const client_;
  const SandboxControllerOptions options_;
  const Clock* const clock_;
  std::unique_ptr<SandboxControllerMetrics> metrics_;
  WorkQueue queue_;
  Informer sandboxes_;
  Informer pods_;
  Informer services_;
  Informer pvcs_;
  // Typed copies of the four caches (the Sandbox one is shared with the Kubernetes runtime,
  // TypedCache::Over).
  TypedCache<types::Sandbox> typed_sandboxes_;
  TypedCache<types::Pod> typed_pods_;
  TypedCache<types::Service> typed_services_;
  TypedCache<types::PersistentVolumeClaim> typed_pvcs_;
  std::unique_ptr<LeaderElector> elector_;
  std::vector<std::thread> workers_;
  // Set once by Stop; read by workers between keys.
  std::atomic<bool> stopping_{false};

  // Expectations: objects this controller created that its informers have not shown yet,
  // by "resource/namespace/name", with their controller's uid and when (and, for a pod or
  // Service, the object as sent or answered). While one is pending the object counts as
  // existing, so a reconcile that runs before the watch event (say, after our own status
  // write) does not create it again. Cleared by the informer's event for it, or after
  // kExpectationTimeout (then a create meets AlreadyExists and reads it).
  struct Expectation {
    absl::Time created;
    std::string owner_uid;
    std::shared_ptr<const types::Pod> pod;
    std::shared_ptr<const types::Service> service;
  };
  // The object written as `id` for the Sandbox of uid `owner_uid` that the informer has not
  // shown yet, or nullopt (an expectation left by an earlier Sandbox of the same name is
  // not this one's).
  std::optional<Expectation> Expected(const std::string& id, const std::string& owner_uid)
      ABSL_LOCKS_EXCLUDED(expect_mu_);
  // Records `expectation` for `resource`'s object ns/name, just created, unless its
  // informer's cache shows it already (its watch event may come before the create's
  // answer; the cache is updated before the handlers run, so an event after that check
  // still clears the expectation).
  void Expect(const Resource& resource, const std::string& ns, const std::string& name,
              Expectation expectation) ABSL_LOCKS_EXCLUDED(expect_mu_);
  // An event for an object (added, changed or deleted) ends the expectation of the object
  // of its name when both have the same controller: the cache shows it, or it is gone. An
  // event for an earlier Sandbox's object of that name (its pod still terminating, say)
  // leaves the new Sandbox's expectation alone, else a reconcile before the watch shows the
  // new object would create it a second time.
  void EndExpectation(const Resource& resource, const std::string& ns, const std::string& name,
                      const std::string& controller_uid) ABSL_LOCKS_EXCLUDED(expect_mu_);
  absl::Mutex expect_mu_;
  absl::flat_hash_map<std::string, Expectation> expected_ ABSL_GUARDED_BY(expect_mu_);

  // Sandboxes whose first Ready=True was already counted in the creation-latency metric.
  absl::Mutex seen_mu_;
  absl::flat_hash_set<std::string> counted_ready_ ABSL_GUARDED_BY(seen_mu_);
};

}  // namespace sbx::k8s
