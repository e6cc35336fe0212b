#include "src/cmd/kube_wiring.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/common/status_macros.h"
#include "src/k8s/config.h"

namespace sbx::cmd {

void AddKubeFlags(CLI::App& app, KubeFlags* flags) {
  app.add_option("--kubeconfig", flags->kubeconfig,
                 "run the Kubernetes controllers against this cluster: a kubeconfig file, or "
                 "\"in-cluster\" for the pod's service account");
  app.add_option("--kube_context", flags->context, "kubeconfig context (default: current)");
  app.add_option("--kube_namespace", flags->ns, "namespace to act in (default: all)");
  app.add_option("--kube_qps", flags->qps, "API requests per second (client-side limit)")
      ->capture_default_str();
  app.add_option("--kube_burst", flags->burst, "API request burst")->capture_default_str();
  app.add_option("--kube_workers", flags->workers, "reconcile workers per controller")
      ->capture_default_str();
  app.add_flag("--kube_leader_election", flags->leader_election,
               "reconcile only while holding the sbx-controller Lease (for several replicas)");
  app.add_option("--kube_lease_namespace", flags->lease_namespace, "namespace of the Lease")
      ->capture_default_str();
  app.add_option("--kube_identity", flags->identity,
                 "this replica's name in the Lease (default: hostname-pid)");
}

absl::StatusOr<std::unique_ptr<KubeControllers>> StartKube(const KubeFlags& flags) {
  absl::StatusOr<k8s::ClusterConfig> cluster =
      flags.kubeconfig == "in-cluster" ? k8s::LoadInCluster()
                                       : k8s::LoadKubeconfig(flags.kubeconfig, flags.context);
  if (!cluster.ok()) return cluster.status();
  k8s::ClientOptions client_options;
  client_options.qps = flags.qps;
  client_options.burst = flags.burst;
  client_options.registry = flags.registry;
  ASSIGN_OR_RETURN(std::unique_ptr<k8s::Client> client,
                   k8s::Client::Create(*cluster, client_options));

  k8s::SandboxControllerOptions options;
  options.ns = flags.ns;
  options.workers = flags.workers;
  options.registry = flags.registry;
  options.leader_election = flags.leader_election;
  options.election.lease_namespace = flags.lease_namespace;
  options.election.lease_name = "sbx-controller";
  options.election.identity = flags.identity;
  if (options.election.identity.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.election.identity = absl::StrCat(host, "-", getpid());
  }
  auto sandboxes = std::make_unique<k8s::SandboxController>(client.get(), options);
  RETURN_IF_ERROR(sandboxes->Start());
  spdlog::info("kubernetes: {} at {}; Sandbox controller running ({} workers{}, namespace {})",
               cluster->source, cluster->server, flags.workers,
               flags.leader_election ? ", leader election as " + options.election.identity : "",
               flags.ns.empty() ? "all" : flags.ns);
  return std::make_unique<KubeControllers>(std::move(client), std::move(sandboxes));
}

}  // namespace sbx::cmd
