#include "src/k8s/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "src/common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace sbx::k8s {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot read \"", path, "\""));
  std::stringstream data;
  data << in.rdbuf();
  return data.str();
}

std::string Resolve(const std::filesystem::path& base, const std::string& file) {
  std::filesystem::path p(file);
  return p.is_absolute() ? file : (base / p).string();
}

// Finds the entry `name` in a kubeconfig list (clusters, users, contexts) and returns its
// inner map (the "cluster", "user" or "context" field).
absl::StatusOr<YAML::Node> FindNamed(const YAML::Node& root, const std::string& list,
                                     const std::string& inner, const std::string& name,
                                     const std::string& where) {
  const YAML::Node entries = root[list];
  if (entries && entries.IsSequence()) {
    for (const YAML::Node& entry : entries) {
      if (entry["name"] && entry["name"].as<std::string>() == name) {
        YAML::Node value = entry[inner];
        if (!value || !value.IsMap()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": ", list, " entry \"", name, "\" has no ", inner, " map"));
        }
        return value;
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": no ", inner, " named \"", name, "\" in ", list));
}

std::string Str(const YAML::Node& node, const char* key) {
  const YAML::Node value = node[key];
  return value && value.IsScalar() ? value.as<std::string>() : "";
}

// PEM from either "<key>-data" (base64) or "<key>" (a file path).
absl::StatusOr<std::string> PemOf(const YAML::Node& node, const std::string& key,
                                  const std::filesystem::path& base, const std::string& where) {
  std::string data = Str(node, (key + "-data").c_str());
  if (!data.empty()) {
    std::string pem;
    if (!absl::Base64Unescape(data, &pem)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, "-data is not base64"));
    }
    return pem;
  }
  std::string file = Str(node, key.c_str());
  if (file.empty()) return std::string();
  return ReadFile(Resolve(base, file), absl::StrCat(where, ": ", key));
}

absl::StatusOr<ClusterConfig> Parse(const YAML::Node& root, const std::string& path,
                                    const std::string& wanted_context) {
  const std::string where = absl::StrCat("kubeconfig ", path);
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  std::string context_name = wanted_context.empty() ? Str(root, "current-context") : wanted_context;
  if (context_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no current-context and none given"));
  }
  ASSIGN_OR_RETURN(YAML::Node context, FindNamed(root, "contexts", "context", context_name, where));
  ClusterConfig config;
  config.source = absl::StrCat(where, " context ", context_name);
  const std::string cluster_name = Str(context, "cluster");
  ASSIGN_OR_RETURN(YAML::Node cluster, FindNamed(root, "clusters", "cluster", cluster_name, where));
  config.server = std::string(absl::StripSuffix(Str(cluster, "server"), "/"));
  if (config.server.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cluster \"", cluster_name, "\" has no server"));
  }
  config.insecure_skip_tls_verify = Str(cluster, "insecure-skip-tls-verify") == "true";
  ASSIGN_OR_RETURN(config.ca_pem, PemOf(cluster, "certificate-authority", base, where));
  if (!Str(context, "namespace").empty()) config.default_namespace = Str(context, "namespace");

  const std::string user_name = Str(context, "user");
  if (!user_name.empty()) {
    ASSIGN_OR_RETURN(YAML::Node user, FindNamed(root, "users", "user", user_name, where));
    if (user["exec"] || user["auth-provider"]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": user \"", user_name,
                       "\" uses an exec or auth-provider plugin, which sbx does not run; "
                       "use a token, tokenFile or client certificate"));
    }
    config.token = Str(user, "token");
    if (!Str(user, "tokenFile").empty()) config.token_file = Resolve(base, Str(user, "tokenFile"));
    ASSIGN_OR_RETURN(config.client_cert_pem, PemOf(user, "client-certificate", base, where));
    ASSIGN_OR_RETURN(config.client_key_pem, PemOf(user, "client-key", base, where));
    if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": user \"", user_name, "\" has a client certificate or key but not both"));
    }
  }
  return config;
}

}  // namespace

absl::StatusOr<ClusterConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, "kubeconfig"));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, ": ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, ": not a YAML map"));
  }
  try {
    return Parse(root, path, context);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, ": ", e.what()));
  }
}

absl::StatusOr<ClusterConfig> LoadInCluster(const std::function<const char*(const char*)>& getenv,
                                            const std::string& account_dir) {
  auto env = [&](const char* name) -> std::string {
    // getenv races only with a change of the environment, and sbx-server never changes its own (it
    // calls no setenv or putenv).
    const char* value = getenv ? getenv(name) : std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
    return value ? value : "";
  };
  const std::string host = env("KUBERNETES_SERVICE_HOST");
  const std::string port = env("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    return absl::FailedPreconditionError(
        "not in a Kubernetes cluster: KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is "
        "unset (give a kubeconfig)");
  }
  ClusterConfig config;
  config.source = "in-cluster service account";
  // IPv6 service hosts need brackets in a URL.
  config.server = absl::StrCat("https://", host.find(':') != std::string::npos ? "[" : "", host,
                               host.find(':') != std::string::npos ? "]" : "", ":", port);
  config.token_file = account_dir + "/token";
  ASSIGN_OR_RETURN(std::string token, ReadFile(config.token_file, "service-account token"));
  (void)token;
  ASSIGN_OR_RETURN(config.ca_pem, ReadFile(account_dir + "/ca.crt", "service-account CA"));
  absl::StatusOr<std::string> ns = ReadFile(account_dir + "/namespace", "namespace");
  if (ns.ok() && !absl::StripAsciiWhitespace(*ns).empty()) {
    config.default_namespace = std::string(absl::StripAsciiWhitespace(*ns));
  }
  return config;
}

absl::StatusOr<ClusterConfig> LoadDefault(const std::string& kubeconfig,
                                          const std::string& context) {
  if (!kubeconfig.empty()) return LoadKubeconfig(kubeconfig, context);
  // getenv races only with a change of the environment, and sbx-server never changes its own (it
  // calls no setenv or putenv).
  const char* env = std::getenv("KUBECONFIG");  // NOLINT(concurrency-mt-unsafe)
  if (env != nullptr && *env != '\0') {
    std::vector<std::string> paths = absl::StrSplit(env, ':', absl::SkipEmpty());
    if (!paths.empty()) return LoadKubeconfig(paths.front(), context);
  }
  // getenv races only with a change of the environment, and sbx-server never changes its own (it
  // calls no setenv or putenv).
  const char* home = std::getenv("HOME");  // NOLINT(concurrency-mt-unsafe)
  if (home != nullptr) {
    std::string path = std::string(home) + "/.kube/config";
    if (std::filesystem::exists(path)) return LoadKubeconfig(path, context);
  }
  return LoadInCluster();
}

}  // namespace sbx::k8s
