#pragma once
// TemplateController: the network isolation of extensions.agents.x-k8s.io SandboxTemplates,
// as upstream's SandboxTemplate controller does it. Each template with
// networkPolicyManagement Managed (the default) gets a NetworkPolicy named
// "<template>-network-policy" in its namespace, controlled by the template (so garbage
// collection deletes it with the template), selecting the template's pods by
// agents.x-k8s.io/sandbox-template-ref-hash: the template's own networkPolicy rules when
// it gives them, else the secure default (template_objects.h). A policy that drifts from
// that is updated; Unmanaged deletes ours and makes none. A NetworkPolicy of that name that
// the template does not control is never touched (said once in the log; its deletion lets
// the template have its own).
//
// Level-triggered: informers on SandboxTemplates and NetworkPolicies feed a work queue
// keyed "namespace/name" of the template; workers reconcile from the caches. Only the
// leader writes (`is_leader`); every template is looked at again every `resync`, which is
// also how a new leader picks up work the previous one left.
//
// Thread-safety: Start/Stop from one thread; workers reconcile different templates at once.
// Lifetime: the client must outlive the controller; Stop joins every thread.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "src/k8s/client.h"
#include "src/k8s/controller_metrics.h"
#include "src/k8s/informer.h"
#include "src/k8s/template_objects.h"
#include "src/k8s/thread_priority.h"
#include "src/k8s/work_queue.h"

namespace sbx::k8s {

struct TemplateControllerOptions {
  // "" watches every namespace.
  std::string ns;
  int workers = 2;
  // What the secure default admits besides upstream's router.
  NetworkPolicyOptions network_policy;
  // Every template is looked at again this often.
  absl::Duration resync = absl::Seconds(30);
  WorkQueueOptions queue;
  // When set and false, this replica does not write (leader election).
  std::function<bool()> is_leader;
  // Time of the resync and the expectations' timeout; the real clock when null. Also the
  // clock of the work queue (unless `queue.clock` names another) and the informers. Must
  // outlive the controller.
  const Clock* clock = nullptr;

  // Where controller_runtime_reconcile_total{controller="sandboxtemplate"} and
  // workqueue_depth{name="sandboxtemplate"} go (controller_metrics.h); a private registry
  // when null.
  std::shared_ptr<prometheus::Registry> registry;

  [[nodiscard]] absl::Status Validate() const;
};

class TemplateController {
 public:
  TemplateController(Client* client, TemplateControllerOptions options);
  ~TemplateController();

  // Starts the informers, waits until they have synced (DEADLINE_EXCEEDED, naming the
  // likely cause, when `sync_timeout` passes first), then the workers.
  [[nodiscard]] absl::Status Start(absl::Duration sync_timeout = absl::Seconds(30));
  void Stop();

  // Reconciles the template "namespace/name" now, from the caches. INVALID_ARGUMENT for a
  // bad key; FAILED_PRECONDITION when a NetworkPolicy of its policy's name belongs to
  // someone else; the API server's error when a write fails (rules the API server refuses
  // are logged and not retried until the template changes or the next resync).
  [[nodiscard]] absl::Status Reconcile(const std::string& key);

  // For tests, which wait for these instead of sleeping. Resync passes done (each queues
  // every template), and when the next is due (InfinitePast before Start, or while one
  // runs).
  int64_t resyncs() const { return resync_ != nullptr ? resync_->passes() : 0; }
  absl::Time NextResync() const {
    return resync_ != nullptr ? resync_->SleepingUntil() : absl::InfinitePast();
  }
  // True when no template is queued or being reconciled (backoffs do not count).
  bool Idle() const { return queue_.Idle(); }
  // The informers (for tests that wait until one has handled a write).
  const Informer& template_informer() const { return templates_; }
  const Informer& policy_informer() const { return policies_; }

 private:
  void Worker();
  InformerOptions InformerOn(const Resource& resource) const;
  // Queues the template a NetworkPolicy belongs to (by owner, and by name); `policy` is
  // the informer's event.
  void EnqueueFor(const Json& policy);

  // Expectations: policies this controller wrote that its informer has not shown yet, by
  // "namespace/name", with what was written and when, so that a reconcile running before
  // the watch event neither creates the policy again nor updates it from a stale copy.
  ObjectPtr Expected(const std::string& id) ABSL_LOCKS_EXCLUDED(expect_mu_);
  // Before a write of policy `id`: from now on an event for it ends the expectation.
  void BeginWrite(const std::string& id) ABSL_LOCKS_EXCLUDED(expect_mu_);
  // After it: records `written` (null when the write failed) as expected, unless an event
  // for `id` came during the write. That event may be the write's own echo, or a later
  // change (a deletion): recording after it would hide what the cache shows until the
  // expectation timed out. (An older event makes this skip an expectation it could have
  // kept: the next write then meets a conflict or AlreadyExists and is retried.)
  void EndWrite(const std::string& id, ObjectPtr written) ABSL_LOCKS_EXCLUDED(expect_mu_);
  void Seen(const std::string& id) ABSL_LOCKS_EXCLUDED(expect_mu_);

  Client* const client_;
  const TemplateControllerOptions options_;
  const Clock* const clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  ReconcileMetrics reconciles_;
  WorkQueue queue_;
  Informer templates_;
  Informer policies_;
  // The templates, typed (each version decoded once, when first read).
  TypedCache<types::SandboxTemplate> typed_templates_;
  std::vector<std::thread> workers_;
  std::unique_ptr<PeriodicPass> resync_;
  // Set once by Stop (which may run while another thread reads it).
  std::atomic<bool> stopping_{false};

  struct Expectation {
    absl::Time written;
    ObjectPtr policy;  // null while the write is in flight
  };
  // Templates whose policy name is taken by someone else's policy, said once.
  absl::Mutex warned_mu_;
  absl::flat_hash_set<std::string> warned_ ABSL_GUARDED_BY(warned_mu_);

  absl::Mutex expect_mu_;
  absl::flat_hash_map<std::string, Expectation> expected_ ABSL_GUARDED_BY(expect_mu_);
};

}  // namespace sbx::k8s
