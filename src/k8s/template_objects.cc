#include "src/k8s/template_objects.h"

#include <initializer_list>
#include <utility>

#include "src/k8s/json_fields.h"
#include "src/k8s/sandbox_objects.h"

namespace sbx::k8s {
namespace {

using json_fields::Field;
using json_fields::Str;

// Upstream's router: the only peer its default policy admits.
constexpr char kRouterNamespace[] = "agent-sandbox-system";
constexpr char kRouterApp[] = "sandbox-router";
// Upstream's public resolvers for pods under the default policy.
constexpr const char* kPublicNameservers[] = {"8.8.8.8", "1.1.1.1"};

// True when a container of the template's pod declares a port named `port_name` (read
// from the pod template's spec, a PodSpec kept as JSON).
bool DeclaresPort(const types::SandboxTemplate& sandbox_template, const std::string& port_name) {
  const std::optional<Json>& pod_spec = sandbox_template.spec.pod_template.spec;
  if (!pod_spec.has_value()) return false;
  const Json& containers = Field(*pod_spec, "containers");
  if (!containers.is_array()) return false;
  for (const Json& c : containers) {
    const Json& ports = Field(c, "ports");
    if (!ports.is_array()) continue;
    for (const Json& p : ports) {
      if (Str(p, "name") == port_name) return true;
    }
  }
  return false;
}

Json MatchLabels(Json labels) { return {{"matchLabels", std::move(labels)}}; }

Json NamespaceNamed(const std::string& ns) {
  return MatchLabels({{"kubernetes.io/metadata.name", ns}});
}

Json DefaultIngress(const types::SandboxTemplate& sandbox_template,
                    const NetworkPolicyOptions& options) {
  Json router = Json::object();
  router["namespaceSelector"] = NamespaceNamed(kRouterNamespace);
  router["podSelector"] = MatchLabels({{"app", kRouterApp}});
  Json ingress = Json::array();
  ingress.push_back({{"from", Json::array({router})}});
  if (!options.server_pod_labels.empty() && !options.sandboxd_port_name.empty() &&
      DeclaresPort(sandbox_template, options.sandboxd_port_name)) {
    Json labels = Json::object();
    for (const auto& [key, value] : options.server_pod_labels) labels[key] = value;
    Json server = Json::object();
    if (!options.server_namespace.empty()) {
      server["namespaceSelector"] = NamespaceNamed(options.server_namespace);
    }
    server["podSelector"] = MatchLabels(std::move(labels));
    // Every port: sbx-sandboxd's, and those the port proxy reaches for the claim's tenant
    // (src/gateway/gateway.h). Nothing new beyond sbx-server is admitted.
    ingress.push_back({{"from", Json::array({server})}});
  }
  return ingress;
}

Json IpBlock(const std::string& cidr, std::initializer_list<const char*> except) {
  Json list = Json::array();
  for (const char* e : except) list.push_back(e);
  return {{"ipBlock", {{"cidr", cidr}, {"except", std::move(list)}}}};
}

Json DefaultEgress() {
  // Every port to public addresses; private (RFC 1918), link-local (the metadata server)
  // and IPv6 unique-local and link-local ranges blocked.
  Json to = Json::array(
      {IpBlock("0.0.0.0/0", {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"}),
       IpBlock("::/0", {"fc00::/7", "fe80::/10"})});
  Json egress = Json::array();
  egress.push_back({{"to", std::move(to)}});
  return egress;
}

// Drops nulls and empty lists everywhere, and empty matchLabels maps.
Json Compact(const Json& value) {
  if (value.is_array()) {
    Json out = Json::array();
    for (const Json& v : value) out.push_back(Compact(v));
    return out;
  }
  if (!value.is_object()) return value;
  Json out = Json::object();
  for (const auto& [key, v] : value.items()) {
    if (v.is_null() || (v.is_array() && v.empty())) continue;
    if (key == "matchLabels" && v.is_object() && v.empty()) continue;
    out[key] = Compact(v);
  }
  return out;
}

// Whether the template gives spec.networkPolicy (an empty one included: it denies all).
bool Given(const types::TemplateNetworkPolicy& policy) {
  return policy.present || policy.ingress.has_value() || policy.egress.has_value() ||
         !policy.unknown.empty();
}

}  // namespace

std::string NetworkPolicyName(const std::string& template_name) {
  return template_name + kNetworkPolicySuffix;
}

bool NetworkPolicyManaged(const types::SandboxTemplate& sandbox_template) {
  return sandbox_template.spec.network_policy_management != "Unmanaged";
}

bool SecureByDefault(const types::SandboxTemplate& sandbox_template) {
  return NetworkPolicyManaged(sandbox_template) && !Given(sandbox_template.spec.network_policy);
}

Json NormalizedNetworkPolicySpec(const Json& spec) {
  Json out = Compact(spec);
  for (const char* direction : {"ingress", "egress"}) {
    if (!Field(out, direction).is_array()) continue;
    for (Json& rule : out[direction]) {
      if (!Field(rule, "ports").is_array()) continue;
      for (Json& port : rule["ports"]) {
        if (port.is_object() && !port.contains("protocol")) port["protocol"] = "TCP";
      }
    }
  }
  return out;
}

types::NetworkPolicy DesiredNetworkPolicy(const types::SandboxTemplate& sandbox_template,
                                          const NetworkPolicyOptions& options) {
  const types::ObjectMeta& meta = sandbox_template.metadata;
  const std::string& name = meta.Name();
  Json spec = {{"podSelector", {{"matchLabels", {{kTemplateRefHashLabel, NameHash(name)}}}}},
               {"policyTypes", {"Ingress", "Egress"}}};
  const types::TemplateNetworkPolicy& custom = sandbox_template.spec.network_policy;
  if (!Given(custom)) {
    spec["ingress"] = DefaultIngress(sandbox_template, options);
    spec["egress"] = DefaultEgress();
  } else {
    // The template's rules as they are: a list it leaves out denies that direction.
    if (custom.ingress.has_value()) spec["ingress"] = *custom.ingress;
    if (custom.egress.has_value()) spec["egress"] = *custom.egress;
  }
  types::NetworkPolicy policy;
  policy.api_version = "networking.k8s.io/v1";
  policy.kind = "NetworkPolicy";
  policy.metadata.name = NetworkPolicyName(name);
  policy.metadata.ns = meta.Namespace();
  types::OwnerReference& owner = policy.metadata.owner_references.emplace().emplace_back();
  owner.api_version = "extensions.agents.x-k8s.io/v1beta1";
  owner.kind = "SandboxTemplate";
  owner.name = name;
  owner.uid = meta.Uid();
  owner.controller = true;
  owner.block_owner_deletion = true;
  policy.spec = NormalizedNetworkPolicySpec(spec);
  return policy;
}

void ApplyPodSecureDefaults(const Json& sandbox_template, Json* pod_spec) {
  absl::StatusOr<types::SandboxTemplate> typed = types::DecodeSandboxTemplate(sandbox_template);
  ApplyPodSecureDefaults(typed.ok() ? *typed : types::SandboxTemplate(), pod_spec);
}

void ApplyPodSecureDefaults(const types::SandboxTemplate& sandbox_template, Json* pod_spec) {
  Json& spec = *pod_spec;
  if (Field(spec, "automountServiceAccountToken").is_null()) {
    spec["automountServiceAccountToken"] = false;
  }
  // The default policy blocks the cluster DNS (so that a sandbox cannot enumerate the
  // cluster's services); public names still resolve through public resolvers. Custom rules
  // and Unmanaged templates keep the pod's DNS as it is (air-gapped or proxied clusters).
  if (SecureByDefault(sandbox_template) && Str(spec, "dnsPolicy").empty()) {
    spec["dnsPolicy"] = "None";
    Json nameservers = Json::array();
    for (const char* ns : kPublicNameservers) nameservers.push_back(ns);
    spec["dnsConfig"] = {{"nameservers", std::move(nameservers)}};
  }
}

}  // namespace sbx::k8s
