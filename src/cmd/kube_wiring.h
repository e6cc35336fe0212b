#pragma once
// The Kubernetes side of sbx-server: flags, the API client and the controllers it runs
// when a cluster is configured (--kubeconfig PATH or --kubeconfig in-cluster): Sandboxes,
// and the NetworkPolicy of each SandboxTemplate. With
// --runtime kubernetes it also serves the SandboxWarmPools and SandboxClaims of one
// namespace from the allocator, whose sandboxes it makes (KubeRuntime). With
// --sandbox_key_secret it keeps the key of the sandboxes' daemon secrets in a Secret that
// every replica shares.
//
// With --cluster NAME=KUBECONFIG[,key=value...] (repeated) it serves a fleet
// (docs/kubernetes.md, "Fleet"): the cluster of --kubeconfig is the home cluster (the Lease,
// the key Secret, the SandboxWarmPool controller), each --cluster a member cluster with its
// own client, Sandbox and template controllers, informers, write scheduler and
// KubeRuntime, and runtime() is a k8s::FleetRuntime in front of all of them.
//
// Order of use: ConnectKube, then (optionally) LoadSandboxKey, then StartKube.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "src/allocator/allocator.h"
#include "src/k8s/claim_controller.h"
#include "src/k8s/client.h"
#include "src/k8s/fleet_config.h"
#include "src/k8s/fleet_health.h"
#include "src/k8s/fleet_runtime.h"
#include "src/k8s/informer.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/leader_election.h"
#include "src/k8s/sandbox_controller.h"
#include "src/k8s/template_controller.h"
#include "src/k8s/warm_pool_controller.h"
#include "src/k8s/write_scheduler.h"

namespace sbx::cmd {

struct KubeFlags {
  std::string kubeconfig;  // "" = no cluster; "in-cluster" = the service account
  std::string context;
  std::string ns;  // "" = every namespace
  double qps = 1000;
  int burst = 2000;
  std::string http_transport = "socket";
  int workers = 16;
  bool leader_election = false;
  std::string lease_namespace = "default";
  std::string identity;  // default: hostname + pid (DefaultIdentity)
  // With leader_election: this replica's gRPC address for the others (written into the
  // Lease while it leads), and what to do when it stops leading (lost Lease or Stop).
  std::string advertise_address;
  std::function<void()> on_stopped_leading;
  // LeaderElectionOptions::may_lead and leader_unreachable (store replication:
  // replication_wiring.h).
  std::function<bool(const k8s::LeaseTerm&)> may_lead;
  std::function<bool()> leader_unreachable;
  // The election's timing (LeaderElectionOptions): the Lease's duration, the leader's
  // renew deadline (its write window) and the retry period (also each election request's
  // timeout). A standby that cannot reach a dead leader takes over about renew_deadline +
  // 0.5 s after its last renewal; others after lease_duration.
  double lease_duration_s = 15;
  double renew_deadline_s = 3;
  double retry_period_s = 1;
  // Warm pools and claims (with --runtime kubernetes) are served in `ns` (every namespace
  // when empty). pool_namespace is the default namespace, whose pools the allocator and
  // gRPC name without one (DefaultNamespace); then the write workers and write budget.
  std::string pool_namespace;
  int write_workers = 32;
  double write_qps = 2000;
  int write_burst = 200;
  int claim_workers = 8;
  bool claim_annotations = true;
  // Watch the cluster's Nodes (list and watch, cluster-wide) so that warm-pool members
  // carry their node's labels, which claims' node_preference matches.
  bool node_labels = true;
  double ready_timeout_s = 300;
  // sbx-server's own pods, admitted to sbx-sandboxd's port by the default NetworkPolicy of
  // each SandboxTemplate: their labels ("k=v,k2=v2"; "" admits none) and namespace (""
  // = the namespace of the kubeconfig context, or in-cluster the pod's own).
  std::string server_pod_labels = "app.kubernetes.io/name=sbx";
  std::string server_namespace;
  // Where the client and the controllers register their metrics (the registry sbx-server
  // serves on /metrics); null: a private one, not served.
  std::shared_ptr<prometheus::Registry> registry;
  // The secret of a Sandbox's daemon (by its namespace and name), put into its pod (see
  // SandboxControllerOptions::sandboxd_secret).
  std::function<std::string(const std::string& ns, const std::string& name)> sandboxd_secret;
  // The Secret (in the server's namespace, as for server_namespace above) that holds the
  // key of those secrets; "" = the key file (the flags of sbx_server_main.cc).
  std::string sandbox_key_secret;
  // The fleet (docs/kubernetes.md, "Fleet"): member clusters (--cluster, each
  // "NAME=KUBECONFIG[,key=value...]", k8s::ParseClusterSpec), the home cluster's name in
  // the fleet (--kube_cluster_name) and the placement of creates (--fleet_placement).
  std::vector<std::string> clusters;
  std::string cluster_name = "home";
  std::string fleet_placement = "spread";
  // A cluster of the fleet whose API has not answered for this long is excluded: no
  // creates, its warm members retired (never handed out) (--fleet_cluster_timeout_seconds).
  double fleet_cluster_timeout_s = 15;
};

void AddKubeFlags(CLI::App& app, KubeFlags* flags);

// The default namespace (AllocatorOptions::default_namespace): --kube_pool_namespace, else
// --kube_namespace, else "default".
std::string DefaultNamespace(const KubeFlags& flags);

// This replica's name in the Lease when --kube_identity is not given: "<hostname>-<pid>".
std::string DefaultIdentity();
// The address other replicas reach this one's gRPC port at: `advertise` ("host:port",
// checked) when given, else the host of `listen` with `bound_port`. INVALID_ARGUMENT when
// that host is a wildcard (0.0.0.0, [::], empty): --advertise_address is needed then.
[[nodiscard]] absl::StatusOr<std::string> AdvertisedAddress(const std::string& advertise,
                                                            const std::string& listen,
                                                            int bound_port);
// `listen` ("host:port") with its port replaced by `port`.
std::string WithPort(const std::string& listen, int port);

// The client and the controllers; stops them (controllers first) when destroyed.
class KubeControllers {
 public:
  KubeControllers() = default;
  ~KubeControllers();

  // The API client.
  k8s::Client* client() { return client_.get(); }
  // The runtime of warm-pool members (nullptr unless pools are served): the fleet's when
  // member clusters are configured, else the cluster's KubeRuntime.
  runtime::Runtime* runtime() {
    return fleet_ != nullptr ? static_cast<runtime::Runtime*>(fleet_.get()) : runtime_.get();
  }
  // The fleet runtime, or nullptr without --cluster.
  const k8s::FleetRuntime* fleet() const { return fleet_.get(); }
  // The same as the Kubernetes runtime (its SandboxTemplate lookups), or nullptr.
  const k8s::KubeRuntime* kube_runtime() const { return runtime_.get(); }
  // The leader elector once StartKube has run with --kube_leader_election; else null.
  k8s::LeaderElector* elector() const {
    return sandboxes_ != nullptr ? sandboxes_->elector() : nullptr;
  }
  // The Sandboxes in the Sandbox controller's cache that sbx made for a pool or that a
  // SandboxClaim holds (labels sbx.dev/pool, agents.x-k8s.io/claim-uid); 0 before
  // StartKube.
  size_t ClusterSandboxes() const;
  // Starts the warm-pool and claim controllers on `allocator`.
  [[nodiscard]] absl::Status StartPools(allocator::Allocator* allocator);
  // Stops the pool and claim controllers, then the writes and the runtime: queued writes
  // are dropped and creates still pending (or asked later) fail with CANCELLED, so the
  // refill reconciler can stop. The runtime stays (answering CANCELLED) until destruction.
  // Idempotent.
  void StopPools();
  // The key of the sandboxes' daemon secrets (SandboxSecrets::kKeyBytes raw bytes) from
  // the Secret flags.sandbox_key_secret in the server's namespace, made there when it does
  // not exist (k8s::LoadOrCreateSandboxKey); within 30 s. Errors name the Secret.
  [[nodiscard]] absl::StatusOr<std::string> LoadSandboxKey(const KubeFlags& flags);

 private:
  friend absl::StatusOr<std::unique_ptr<KubeControllers>> ConnectKube(const KubeFlags&);
  friend absl::Status StartKube(KubeControllers&, const KubeFlags&, bool,
                                std::function<void(const std::string&)>);
  // What a KubeControllers is in a fleet: a cluster alone, the home cluster, or a member.
  enum class Role { kAlone, kHome, kMember };
  friend absl::Status StartCluster(KubeControllers&, const KubeFlags&, bool, Role,
                                   std::function<void(const std::string&)>);
  std::unique_ptr<k8s::Client> client_;
  // The elector's: each request bounded by the retry period, none retried.
  std::unique_ptr<k8s::Client> election_client_;
  std::unique_ptr<k8s::SandboxController> sandboxes_;
  std::unique_ptr<k8s::TemplateController> templates_;
  std::unique_ptr<k8s::WriteScheduler> writes_;
  std::unique_ptr<k8s::WarmPoolController> pools_;
  std::unique_ptr<k8s::ClaimController> claims_;
  // A member cluster's SandboxWarmPools and SandboxTemplates (the home cluster's are the
  // warm-pool controller's); before runtime_, which reads them.
  std::unique_ptr<k8s::Informer> member_pools_;
  std::unique_ptr<k8s::Informer> member_templates_;
  // Before runtime_, which reads it.
  std::unique_ptr<k8s::Informer> nodes_;
  std::unique_ptr<k8s::KubeRuntime> runtime_;
  // The fleet: the member clusters (in --cluster order) and the runtime in front of this
  // (home) cluster's and theirs; destroyed first.
  std::vector<k8s::ClusterSpec> member_specs_;
  std::vector<std::unique_ptr<KubeControllers>> members_;
  std::unique_ptr<k8s::FleetRuntime> fleet_;
  // In a fleet, each cluster's (home's and members'): the client of the health probe (one
  // short request, no retries, no rate limit) and the prober; stopped by StopPools.
  std::unique_ptr<k8s::Client> probe_client_;
  std::unique_ptr<k8s::FleetHealth> health_;
  // The allocator from StartPools (home only): the lost clusters' warm members are retired
  // from it. Null before StartPools and after StopPools.
  std::atomic<allocator::Allocator*> allocator_{nullptr};
  // Read by the clusters' gone reports, which may come from their informers' threads.
  std::atomic<k8s::FleetRuntime*> fleet_for_reports_{nullptr};
};

// Reads the cluster's configuration (kubeconfig or in-cluster) and makes the API client;
// asks nothing of the API server yet. Errors name what is wrong (unreadable kubeconfig,
// bad client options).
[[nodiscard]] absl::StatusOr<std::unique_ptr<KubeControllers>> ConnectKube(const KubeFlags& flags);

// Starts the controllers of `kube` (from ConnectKube) once their caches are in sync; with
// `serve_pools`, also builds the runtime and the pool/claim controllers (started by
// StartPools). `on_gone` hears of members that disappear. Errors name what is wrong (bad
// flags, unreachable server, missing CRDs). Called once.
[[nodiscard]] absl::Status StartKube(KubeControllers& kube, const KubeFlags& flags,
                                     bool serve_pools,
                                     std::function<void(const std::string&)> on_gone);

}  // namespace sbx::cmd
