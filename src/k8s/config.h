#pragma once
// Where the Kubernetes API server is and how to authenticate to it: from a kubeconfig
// file (the current or a named context) or from the in-cluster service account.
//
// Thread-safety: the loaders are pure functions of their inputs and the files they read.

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace sbx::k8s {

struct ClusterConfig {
  // "https://host:port" (no path).
  std::string server;
  // PEM data (file contents and base64 *-data fields are both resolved to PEM here).
  std::string ca_pem;
  bool insecure_skip_tls_verify = false;
  std::string client_cert_pem;
  std::string client_key_pem;
  // A static bearer token, or a file holding one that is re-read when it changes
  // (token_file wins when both are set, as for service-account tokens).
  std::string token;
  std::string token_file;
  // The context's namespace ("default" when unset).
  std::string default_namespace = "default";
  // Where this came from, for messages: "kubeconfig /x context y" or "in-cluster".
  std::string source;
};

// Reads a kubeconfig file. `context` "" uses current-context. Relative file paths in it
// are relative to the kubeconfig's folder. INVALID_ARGUMENT naming the field when the
// file is malformed or the context, cluster or user it names does not exist; NOT_FOUND
// when the file (or a file it names) cannot be read. Exec and auth-provider plugins are
// not supported (INVALID_ARGUMENT says so).
[[nodiscard]] absl::StatusOr<ClusterConfig> LoadKubeconfig(const std::string& path,
                                                           const std::string& context = "");

// In-cluster config: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT from `getenv`
// and token, ca.crt and namespace from `account_dir`. FAILED_PRECONDITION when not in
// a cluster (the variables are unset).
[[nodiscard]] absl::StatusOr<ClusterConfig> LoadInCluster(
    const std::function<const char*(const char*)>& getenv = nullptr,
    const std::string& account_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

// What kubectl would use: `kubeconfig` if given, else $KUBECONFIG (first entry), else
// ~/.kube/config if it exists, else in-cluster.
[[nodiscard]] absl::StatusOr<ClusterConfig> LoadDefault(const std::string& kubeconfig = "",
                                                        const std::string& context = "");

}  // namespace sbx::k8s
