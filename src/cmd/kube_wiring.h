#pragma once
// The Kubernetes side of sbx-server: flags, the API client and the controllers it runs
// when a cluster is configured (--kubeconfig PATH or --kubeconfig in-cluster).

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "src/k8s/client.h"
#include "src/k8s/sandbox_controller.h"

namespace sbx::cmd {

struct KubeFlags {
  std::string kubeconfig;  // "" = no cluster; "in-cluster" = the service account
  std::string context;
  std::string ns;  // "" = every namespace
  double qps = 1000;
  int burst = 2000;
  int workers = 16;
  bool leader_election = false;
  std::string lease_namespace = "default";
  std::string identity;  // default: hostname + pid
  // Where the client and the controllers register their metrics (the registry sbx-server
  // serves on /metrics); null: a private one, not served.
  std::shared_ptr<prometheus::Registry> registry;
};

void AddKubeFlags(CLI::App& app, KubeFlags* flags);

// The client and the Sandbox controller; stops them (controller first) when destroyed.
class KubeControllers {
 public:
  KubeControllers(std::unique_ptr<k8s::Client> client,
                  std::unique_ptr<k8s::SandboxController> sandboxes)
      : client_(std::move(client)), sandboxes_(std::move(sandboxes)) {}
  ~KubeControllers() {
    sandboxes_.reset();
    client_.reset();
  }

 private:
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<k8s::SandboxController> sandboxes_;
};

// Connects to the cluster and starts the controllers once their caches are in sync.
// Errors name what is wrong (unreadable kubeconfig, unreachable server, missing CRDs).
absl::StatusOr<std::unique_ptr<KubeControllers>> StartKube(const KubeFlags& flags);

}  // namespace sbx::cmd
