#pragma once
// The Kubernetes resources sbx touches, by group/version/resource. A Resource is plain
// data; the constants below are the ones the controllers and the runtime use.

#include <string>

namespace sbx::k8s {

struct Resource {
  std::string group;  // "" for the core group
  std::string version;
  std::string resource;  // the plural name in URLs
  std::string kind;
  bool namespaced = true;

  // "v1" or "group/version".
  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
  // "/api/v1" or "/apis/group/version".
  std::string Prefix() const {
    return group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  }
};

inline const Resource kNamespaces{"", "v1", "namespaces", "Namespace", false};
inline const Resource kPods{"", "v1", "pods", "Pod", true};
inline const Resource kNodes{"", "v1", "nodes", "Node", false};
inline const Resource kServices{"", "v1", "services", "Service", true};
inline const Resource kPersistentVolumeClaims{"", "v1", "persistentvolumeclaims",
                                              "PersistentVolumeClaim", true};
inline const Resource kSecrets{"", "v1", "secrets", "Secret", true};
inline const Resource kEvents{"", "v1", "events", "Event", true};
inline const Resource kLeases{"coordination.k8s.io", "v1", "leases", "Lease", true};
inline const Resource kNetworkPolicies{"networking.k8s.io", "v1", "networkpolicies",
                                       "NetworkPolicy", true};
inline const Resource kCustomResourceDefinitions{
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", false};
inline const Resource kSandboxes{"agents.x-k8s.io", "v1beta1", "sandboxes", "Sandbox", true};
inline const Resource kSandboxTemplates{"extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates",
                                        "SandboxTemplate", true};
inline const Resource kSandboxWarmPools{"extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools",
                                        "SandboxWarmPool", true};
inline const Resource kSandboxClaims{"extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims",
                                     "SandboxClaim", true};

}  // namespace sbx::k8s
