#pragma once
// sbx-server as an object: made from its flags, activated (at once, or once this replica
// leads), shut down with a deadline. main() (sbx_server_main.cc) parses the flags, waits
// for signals and calls these.
//
//   Create(flags)  opens the store, connects the cluster, makes the runtime, the
//                  replication and the metrics endpoint; a replica that serves at once (no
//                  leader election) also recovers its allocator here. A standby (with
//                  --kube_leader_election) serves its port as a relay to the leader.
//   Start()        activates: reconciles with the runtime, applies --config, starts refill,
//                  the pools of the cluster, snapshots, the port proxy, the gRPC API and
//                  the E2B front. A standby does this on a thread of its own once it leads
//                  (after taking over the replication and recovering its allocator), then
//                  stops its relay.
//   ReloadAuth()   SIGHUP: the tokens file, for every front.
//   Shutdown(g)    the one shutdown order (server_app.cc says why each step is where it
//                  is); calls in flight get `grace`.
//
// Thread-safety: Create, Start, ReloadAuth and Shutdown are called from main's thread;
// the object's own threads (promotion, the elector's callbacks) synchronize inside.
// Lifetime: not movable (callbacks hold `this`). Destroying it without Shutdown shuts it
// down with no grace.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/registry.h"
#include "src/allocator/allocator.h"
#include "src/allocator/refill.h"
#include "src/allocator/snapshots.h"
#include "src/cmd/config.h"
#include "src/cmd/e2b_wiring.h"
#include "src/cmd/kube_wiring.h"
#include "src/cmd/proxy_wiring.h"
#include "src/cmd/replication_wiring.h"
#include "src/cmd/server_flags.h"
#include "src/common/sandbox_secret.h"
#include "src/gateway/gateway.h"
#include "src/images/image_cache.h"
#include "src/k8s/conversion_webhook.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/runtime/runtime.h"
#include "src/server/metrics.h"
#include "src/server/server.h"
#include "src/store/store.h"

namespace sbx::cmd {

class ServerApp {
 public:
  // Everything up to serving (see above). Errors name the flag or the path at fault; the
  // process should stop on them.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ServerApp>> Create(ServerFlags flags);

  ~ServerApp();
  ServerApp(const ServerApp&) = delete;
  ServerApp& operator=(const ServerApp&) = delete;

  // Serves: activates now, or (a standby) starts waiting to lead. An error of an
  // activation now is returned; a standby's is logged and stops the process (SIGTERM).
  [[nodiscard]] absl::Status Start();

  // Reloads the tokens of the API, the port proxy and the E2B front (a standby has none:
  // it logs so). Logs the outcome; a failure keeps the old tokens.
  void ReloadAuth() ABSL_LOCKS_EXCLUDED(server_mu_);

  // Stops everything in order, letting calls in flight finish for `grace`, and closes the
  // store last. Returns the store's Close() status. Once; later calls return OK.
  [[nodiscard]] absl::Status Shutdown(absl::Duration grace);

 private:
  explicit ServerApp(ServerFlags flags);
  // Create's work, step by step (see above).
  [[nodiscard]] absl::Status Init();
  // Recovers the allocator from the store (at Create, or once a standby leads).
  [[nodiscard]] absl::Status OpenAllocator();
  // What a serving replica does; see Start.
  [[nodiscard]] absl::Status Activate() ABSL_LOCKS_EXCLUDED(server_mu_);
  // A standby's thread: waits to lead, then takes over and activates.
  void Promote();
  // Stops what a leader that loses the Lease must stop first (set once they exist).
  void Quiesce() ABSL_LOCKS_EXCLUDED(quiesce_mu_);

  // Members in the order of their making; destroyed in reverse after Shutdown.
  ServerFlags flags_;
  // Outlives the proxy and the metrics endpoint that reads it.
  gateway::ProxyCounters proxy_counters_;
  ServerConfig config_;
  std::unique_ptr<store::Store> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  // The runtime reports sandboxes that die; the allocator exists only later, so the
  // report goes through this pointer (set before any sandbox can exist). Declared before
  // the controllers, which report through it until they are destroyed.
  std::atomic<allocator::Allocator*> allocator_for_reports_{nullptr};
  // The cluster's client, when one is configured.
  std::unique_ptr<KubeControllers> kube_;
  std::unique_ptr<k8s::ConversionWebhook> conversion_;
  std::optional<SandboxSecrets> sandbox_secrets_;
  std::string default_namespace_;
  std::unique_ptr<images::ImageCache> image_cache_;
  std::unique_ptr<runtime::BubblewrapRuntime> local_;
  std::unique_ptr<runtime::Runtime> runtime_;
  server::RequestCounters request_counters_;
  server::TenantLimiter tenant_limiter_;
  runtime::Runtime* active_runtime_ = nullptr;
  // With leader election, this replica serves its port as a standby (relaying sbx.v1
  // calls to the leader) until it leads; everything that acts starts then (Activate).
  bool standby_first_ = false;
  std::unique_ptr<server::Server> standby_;
  std::unique_ptr<Replication> replication_;
  // Set at shutdown; read by the promotion thread and the elector's callback.
  std::atomic<bool> stopping_{false};
  // What a leader that loses the Lease stops first, on the elector's thread, before the
  // server's shutdown (docs/architecture.md, "Fencing"): armed once everything it names
  // exists.
  absl::Mutex quiesce_mu_;
  bool quiesce_armed_ ABSL_GUARDED_BY(quiesce_mu_) = false;
  std::once_flag quiesced_;
  std::unique_ptr<allocator::RefillReconciler> refill_;
  allocator::AllocatorOptions allocator_options_;
  // The allocator recovers from the store when this replica serves: at once, or (a
  // standby) once it leads, from the store it replicated as a standby.
  std::unique_ptr<allocator::Allocator> allocator_;
  std::atomic<const allocator::Allocator*> allocator_for_metrics_{nullptr};
  // Set once the snapshots are made (Activate); read by the metrics endpoint.
  std::atomic<const allocator::Snapshots*> snapshots_for_metrics_{nullptr};
  std::unique_ptr<server::MetricsEndpoint> metrics_;
  // Guards the serving objects that SIGHUP reloads while a standby may be activating.
  absl::Mutex server_mu_;
  std::unique_ptr<allocator::Snapshots> snapshots_;  // outlives the server
  std::unique_ptr<server::Server> server_ ABSL_GUARDED_BY(server_mu_);
  RunningProxy port_proxy_;
  RunningE2b e2b_front_ ABSL_GUARDED_BY(server_mu_);  // after server_: it calls its services
  std::thread promotion_;
  bool shut_down_ = false;
};

}  // namespace sbx::cmd
