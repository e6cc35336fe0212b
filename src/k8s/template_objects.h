#pragma once
// The extensions.agents.x-k8s.io/v1beta1 SandboxTemplate as data: the NetworkPolicy kept for
// it and the secure defaults of the pods made from it. Pure functions of their inputs, used
// by the SandboxTemplate controller, the warm-pool runtime and the claim controller, and
// tested on their own. Facts from upstream-api.md, checked against upstream's
// extensions/controllers/sandboxtemplate_controller.go and utils.go (2fd412d).

#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "src/k8s/objects_types.h"

namespace sbx::k8s {

using Json = nlohmann::json;

// Appended to a template's name: the name of its NetworkPolicy.
inline constexpr char kNetworkPolicySuffix[] = "-network-policy";

// What the Managed default admits besides upstream's router: sbx-server's own pods, to
// every port of a sandbox (sbx-sandboxd's, and the ports its port proxy reaches), only for
// templates that declare sbx-sandboxd's port.
struct NetworkPolicyOptions {
  // Labels of sbx-server's pods. Empty: no rule for sbx-server.
  std::map<std::string, std::string> server_pod_labels;
  // Namespace of sbx-server's pods (matched by its kubernetes.io/metadata.name label).
  // Empty: the template's own namespace.
  std::string server_namespace;
  // The container port name of sbx-sandboxd in a template's pod.
  std::string sandboxd_port_name = "sbx-sandboxd";
};

// "<template>-network-policy".
std::string NetworkPolicyName(const std::string& template_name);

// True unless spec.networkPolicyManagement is "Unmanaged" (absent means Managed).
bool NetworkPolicyManaged(const types::SandboxTemplate& sandbox_template);

// True when the template relies on the secure default: Managed and no spec.networkPolicy.
bool SecureByDefault(const types::SandboxTemplate& sandbox_template);

// The NetworkPolicy of `sandbox_template` (call only when it is Managed): named
// NetworkPolicyName, in its namespace, owned by it (controller reference), selecting its
// pods by agents.x-k8s.io/sandbox-template-ref-hash, Ingress and Egress. Its rules are the
// template's spec.networkPolicy ingress/egress when that is given (absent lists deny all),
// else the secure default: ingress from upstream's sandbox-router (and sbx-server to the
// sandboxd port, per `options`), egress to every address but the private, link-local and
// unique-local ranges (cluster DNS included: pods get public resolvers instead, see
// ApplyPodSecureDefaults). The spec is in NormalizedNetworkPolicySpec form.
types::NetworkPolicy DesiredNetworkPolicy(const types::SandboxTemplate& sandbox_template,
                                          const NetworkPolicyOptions& options);

// `spec` as the API server keeps it, so that a stored policy compares equal to what was
// written: nulls and empty lists dropped (Go's omitempty), empty matchLabels dropped, and
// the protocol of rule ports defaulted to TCP.
Json NormalizedNetworkPolicySpec(const Json& spec);

// Upstream's secure defaults for the PodSpec of a Sandbox made from `sandbox_template`:
// automountServiceAccountToken false unless set; with SecureByDefault and no dnsPolicy,
// dnsPolicy None with the public resolvers 8.8.8.8 and 1.1.1.1 (the default policy blocks
// the cluster DNS). `pod_spec` must be an object.
void ApplyPodSecureDefaults(const types::SandboxTemplate& sandbox_template, Json* pod_spec);
// The same for a template still held as JSON (the callers that read templates from the
// informer's JSON cache), decoded first. A template that does not decode (only a store
// that skips the CRD's validation can hold one) gets the defaults of the secure default.
void ApplyPodSecureDefaults(const Json& sandbox_template, Json* pod_spec);

}  // namespace sbx::k8s
