#pragma once
// WarmPoolController: serves extensions.agents.x-k8s.io SandboxWarmPools of every namespace
// (or of one) from the allocator. Each pool gets an allocator pool (named like its
// SandboxWarmPool, qualified by its namespace outside the default one: namespaces.h)
// whose warm target is spec.replicas; the allocator's refill reconciler then fills it
// through the KubeRuntime, which makes the members. This controller does what the
// allocator cannot know about Kubernetes:
//
// - scale-down: removes members beyond spec.replicas, unready ones first, then the newest
//   warm ones (taken out of the allocator with RetireWarm, so a claim never races it);
// - updateStrategy Recreate: replaces unclaimed members made from an older template spec
//   (OnReplenish, the default, leaves them until they are claimed);
// - clean-up: deletes members that nobody tracks (left by a crash between the create and
//   the store commit, or by an answer-less create), after a grace period;
//
// Its deletes (surplus unready members, stale ones under Recreate, untracked ones) go
// through the WriteScheduler at clean-up priority, behind the claims' writes and the
// refills, like every write of the runtime and the claim controller;
// - status: replicas, readyReplicas, selector, observedGeneration (merge patch of the
//   status subresource, only when it changes);
// - deletion: the allocator pool goes when its SandboxWarmPool does (after its claims);
// - demand sizing, opted into with annotations (kSizingAnnotation, kMaxWarmAnnotation):
//   spec.replicas stays the floor and the scale subresource keeps working; the target
//   follows demand up to the ceiling, and the refill retires the warm surplus itself, so
//   the controller's scale-down leaves warm members of such pools alone.
// - selection policy: the annotation sbx.dev/selection-policy (fifo, spread, pack) sets
//   the allocator pool's, so the CRD keeps upstream's fields (an unknown value is logged
//   and the pool keeps its policy).
//
// Thread-safety: Start/Stop from one thread; workers reconcile different pools at once.
// Lifetime: construct before the informers start (it adds handlers), Start after the
// allocator exists, Stop before the allocator, runtime and informers go.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/allocator/allocator.h"
#include "src/k8s/client.h"
#include "src/k8s/controller_metrics.h"
#include "src/k8s/informer.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/namespaces.h"
#include "src/k8s/objects_types.h"
#include "src/k8s/thread_priority.h"
#include "src/k8s/work_queue.h"
#include "src/k8s/write_scheduler.h"

namespace sbx::k8s {

// Annotations of a SandboxWarmPool (docs/kubernetes.md): "demand" sizes the pool from the
// claims it sees (src/allocator/demand.h) instead of holding spec.replicas...
inline constexpr char kSizingAnnotation[] = "sbx.dev/sizing";
// ...up to this many warm members (a count; without it the ceiling is spec.replicas).
inline constexpr char kMaxWarmAnnotation[] = "sbx.dev/max-warm";
inline constexpr char kSelectionPolicyAnnotation[] = "sbx.dev/selection-policy";

struct WarmPoolControllerOptions {
  // The namespaces served and the allocator's names of their pools.
  Namespaces namespaces;
  int workers = 2;
  // Every pool is looked at again this often.
  absl::Duration resync = absl::Seconds(10);
  // Untracked members younger than this are left alone (their create may still answer).
  absl::Duration orphan_grace = absl::Seconds(30);
  // Sandbox events reconcile their pool after this delay, so a burst of them makes one pass.
  absl::Duration coalesce = absl::Milliseconds(100);
  // When set and false, this replica does not act (leader election).
  std::function<bool()> is_leader;
  // Time of the resync, the coalescing delay and orphan_grace; the real clock when null.
  // Also the clock of the work queue and the informers. Must outlive the controller.
  const Clock* clock = nullptr;

  // Test hook (a sync point), nullptr in production: runs in a full pass after it has
  // read which sandboxes the allocator tracks and before it looks at the members.
  std::function<void()> after_tracked_snapshot;
  // Where controller_runtime_reconcile_total{controller="sandboxwarmpool"} and
  // workqueue_depth{name="sandboxwarmpool"} go (controller_metrics.h); a private registry
  // when null.
  std::shared_ptr<prometheus::Registry> registry;

  [[nodiscard]] absl::Status Validate() const;
};

class WarmPoolController {
 public:
  // `writes` carries the deletes; it must outlive the controller (Stop the controller
  // first: a delete still queued when the scheduler stops fails with CANCELLED).
  WarmPoolController(Client* client, WriteScheduler* writes, Informer* sandboxes,
                     WarmPoolControllerOptions options);
  ~WarmPoolController();

  // The SandboxWarmPool and SandboxTemplate informers (the runtime reads their caches; the
  // claim controller also adds handlers, before StartInformers).
  const Informer& pools() const { return pools_; }
  const Informer& templates() const { return templates_; }
  Informer& pools() { return pools_; }
  Informer& templates() { return templates_; }

  // Starts the pool and template informers and waits for their first list.
  [[nodiscard]] absl::Status StartInformers(absl::Duration sync_timeout);
  // Starts reconciling into `allocator`, whose sandboxes `runtime` makes.
  void Start(allocator::Allocator* allocator, KubeRuntime* runtime);
  void Stop();

  // Reconciles pool `key` now: a pool name (a full pass), or "~" and a pool name (status,
  // and a full pass only if the counts show a surplus).
  [[nodiscard]] absl::Status Reconcile(const std::string& key);

  // Resync passes done (for tests, which move a FakeClock and wait for one).
  int64_t resyncs() const { return resync_ != nullptr ? resync_->passes() : 0; }

 private:
  void Worker();
  void EnqueueMember(const ObjectPtr& sandbox, absl::Duration delay);
  // `pool` is the allocator's name of a pool.
  [[nodiscard]] absl::Status RemovePool(const std::string& pool);
  // A SandboxWarmPool that does not decode: logged, OK (it waits for its next change).
  [[nodiscard]] static absl::Status NotDecoded(const NamespacedName& where,
                                               const absl::Status& status);
  // `sandbox_template` as the informer holds it (its spec hash is KubeRuntime's, on JSON).
  [[nodiscard]] absl::Status TrimMembers(const types::SandboxWarmPool& pool,
                                         const Json& sandbox_template);
  [[nodiscard]] absl::Status WriteStatus(const types::SandboxWarmPool& pool);
  // Deletes the member `judged` (as this pass read it from the cache; background
  // propagation) through the scheduler, guarded by its uid and resourceVersion: NOT_FOUND
  // is success, and so is a 409 (it changed since: the next pass judges it again).
  [[nodiscard]] absl::Status DeleteMember(const types::Sandbox& judged);
  // The typed copy of `object` from `cache` (the informer's current version of it), or
  // null when the informer no longer holds it or it does not decode (logged).
  template <class T>
  typename TypedCache<T>::Ptr TypedOf(const TypedCache<T>& cache, const ObjectPtr& object) const;
  InformerOptions InformerOn(const Resource& resource) const;

  Client* const client_;
  WriteScheduler* const writes_;
  Informer* const sandboxes_;
  const WarmPoolControllerOptions options_;
  const Clock* const clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  ReconcileMetrics reconciles_;
  WorkQueue queue_;
  Informer pools_;
  Informer templates_;
  // The pools and the member Sandboxes, typed (each version decoded once, when first read).
  TypedCache<types::SandboxWarmPool> typed_pools_;
  TypedCache<types::Sandbox> typed_members_;
  allocator::Allocator* allocator_ = nullptr;  // set by Start, before any worker runs
  KubeRuntime* runtime_ = nullptr;
  std::vector<std::thread> workers_;
  std::unique_ptr<PeriodicPass> resync_;
  // Set once by Stop (which may run while another thread reads it).
  std::atomic<bool> stopping_{false};
};

}  // namespace sbx::k8s
