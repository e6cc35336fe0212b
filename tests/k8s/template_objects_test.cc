// The NetworkPolicy of a SandboxTemplate and the secure pod defaults, as pure functions.
// The expected objects are written out from upstream's sandboxtemplate_controller.go and
// utils.go (2fd412d). Every test here fails on 660dada, which had none of this.

#include "src/k8s/template_objects.h"

#include "gtest/gtest.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/sandbox_objects.h"

namespace sbx::k8s {
namespace {

Json Template(const std::string& extra_spec = "") {
  return Json::parse(R"({
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
    "metadata": {"name": "python", "namespace": "team", "uid": "t-1"},
    "spec": {)" + extra_spec +
                     R"( "podTemplate": {"spec": {"containers": [{"name": "main", "image": "py"}]}}}
  })");
}

// A template whose pod runs sbx-sandboxd on the named port.
Json SandboxdTemplate() {
  Json t = Template();
  t["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = {
      {{"name", "sbx-sandboxd"}, {"containerPort", 7070}}};
  return t;
}

// The template decoded, as the controllers hold it.
types::SandboxTemplate Typed(const Json& sandbox_template) {
  absl::StatusOr<types::SandboxTemplate> typed = types::DecodeSandboxTemplate(sandbox_template);
  EXPECT_TRUE(typed.ok()) << typed.status();
  return typed.ok() ? *std::move(typed) : types::SandboxTemplate();
}

// The NetworkPolicy of `sandbox_template` as it is sent.
Json Desired(const Json& sandbox_template, const NetworkPolicyOptions& options) {
  return types::Encode(DesiredNetworkPolicy(Typed(sandbox_template), options));
}

NetworkPolicyOptions ServerOptions() {
  NetworkPolicyOptions o;
  o.server_pod_labels = {{"app.kubernetes.io/name", "sbx"}, {"app.kubernetes.io/instance", "r"}};
  o.server_namespace = "sbx-system";
  return o;
}

// Upstream's buildDefaultNetworkPolicySpec for template "python".
const char kUpstreamDefaultSpec[] = R"({
  "podSelector": {"matchLabels": {"agents.x-k8s.io/sandbox-template-ref-hash": "%HASH%"}},
  "policyTypes": ["Ingress", "Egress"],
  "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
                         "podSelector": {"matchLabels": {"app": "sandbox-router"}}}]}],
  "egress": [{"to": [
    {"ipBlock": {"cidr": "0.0.0.0/0",
                 "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]}},
    {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}}]}]
})";

Json UpstreamDefaultSpec() {
  std::string text = kUpstreamDefaultSpec;
  text.replace(text.find("%HASH%"), 6, NameHash("python"));
  return Json::parse(text);
}

TEST(TemplateObjectsTest, DefaultPolicyIsUpstreamsSecureDefault) {
  Json policy = Desired(Template(), ServerOptions());
  EXPECT_EQ(policy["apiVersion"], "networking.k8s.io/v1");
  EXPECT_EQ(policy["kind"], "NetworkPolicy");
  EXPECT_EQ(policy["metadata"]["name"], "python-network-policy");
  EXPECT_EQ(policy["metadata"]["namespace"], "team");
  const Json& owner = policy["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
  EXPECT_EQ(owner["kind"], "SandboxTemplate");
  EXPECT_EQ(owner["name"], "python");
  EXPECT_EQ(owner["uid"], "t-1");
  EXPECT_EQ(owner["controller"], true);
  EXPECT_EQ(ControllerUid(policy), "t-1");
  // The pod runs no sbx-sandboxd: exactly upstream's policy, no DNS egress.
  EXPECT_EQ(policy["spec"], UpstreamDefaultSpec()) << policy["spec"].dump(2);
  // Explicitly Managed is the same.
  EXPECT_EQ(Desired(Template(R"("networkPolicyManagement": "Managed",)"), ServerOptions())["spec"],
            UpstreamDefaultSpec());
}

TEST(TemplateObjectsTest, DefaultPolicyAdmitsSbxServerToEveryPort) {
  Json spec = Desired(SandboxdTemplate(), ServerOptions())["spec"];
  Json expected = UpstreamDefaultSpec();
  expected["ingress"].push_back(Json::parse(R"({
    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "sbx-system"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "r",
                                              "app.kubernetes.io/name": "sbx"}}}]})"));
  EXPECT_EQ(spec, expected) << spec.dump(2);
  // No server namespace: the peer is in the template's namespace (no namespaceSelector).
  NetworkPolicyOptions same_ns = ServerOptions();
  same_ns.server_namespace.clear();
  spec = Desired(SandboxdTemplate(), same_ns)["spec"];
  ASSERT_EQ(spec["ingress"].size(), 2u);
  EXPECT_FALSE(spec["ingress"][1]["from"][0].contains("namespaceSelector"));
  // No server labels: upstream's policy only.
  EXPECT_EQ(Desired(SandboxdTemplate(), NetworkPolicyOptions())["spec"], UpstreamDefaultSpec());
}

TEST(TemplateObjectsTest, CustomRulesReplaceTheDefault) {
  Json t = SandboxdTemplate();
  t["spec"]["networkPolicy"] = Json::parse(R"({
    "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "agent-gateway"}}}],
                 "ports": [{"port": 8080}]}],
    "egress": [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                "ports": [{"port": 443, "protocol": "TCP"}]}]})");
  Json spec = Desired(t, ServerOptions())["spec"];
  // Exactly the template's rules (the port protocol defaulted as the API server does);
  // nothing of the default, not even the sbx-server rule.
  EXPECT_EQ(spec, Json::parse(R"({
    "podSelector": {"matchLabels": {"agents.x-k8s.io/sandbox-template-ref-hash": ")" +
                              NameHash("python") + R"("}},
    "policyTypes": ["Ingress", "Egress"],
    "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "agent-gateway"}}}],
                 "ports": [{"port": 8080, "protocol": "TCP"}]}],
    "egress": [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                "ports": [{"port": 443, "protocol": "TCP"}]}]})"))
      << spec.dump(2);
  // Rules for one direction only: the other is denied (no rules, both policy types).
  t["spec"]["networkPolicy"] = Json::parse(R"({"egress": []})");
  spec = Desired(t, ServerOptions())["spec"];
  EXPECT_FALSE(spec.contains("ingress"));
  EXPECT_FALSE(spec.contains("egress"));
  EXPECT_EQ(spec["policyTypes"], Json::parse(R"(["Ingress", "Egress"])"));
}

TEST(TemplateObjectsTest, ManagementAndSecureByDefault) {
  EXPECT_TRUE(NetworkPolicyManaged(Typed(Template())));
  EXPECT_TRUE(SecureByDefault(Typed(Template())));
  EXPECT_FALSE(NetworkPolicyManaged(Typed(Template(R"("networkPolicyManagement": "Unmanaged",)"))));
  EXPECT_FALSE(SecureByDefault(Typed(Template(R"("networkPolicyManagement": "Unmanaged",)"))));
  EXPECT_TRUE(NetworkPolicyManaged(Typed(Template(R"("networkPolicy": {},)"))));
  EXPECT_FALSE(SecureByDefault(Typed(Template(R"("networkPolicy": {},)"))));
}

TEST(TemplateObjectsTest, NormalizedSpecIsWhatTheApiServerKeeps) {
  Json stored = Json::parse(R"({
    "podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress"],
    "ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {"matchLabels": {}}}],
                 "ports": [{"port": 80, "protocol": "UDP"}, {"port": "http"}]}],
    "egress": [], "extra": null})");
  EXPECT_EQ(NormalizedNetworkPolicySpec(stored), Json::parse(R"({
    "podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress"],
    "ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {}}],
                 "ports": [{"port": 80, "protocol": "UDP"}, {"port": "http", "protocol": "TCP"}]}]})"));
}

TEST(TemplateObjectsTest, PodSecureDefaults) {
  // The default policy: no service-account token, public resolvers (cluster DNS is blocked).
  Json spec = Json::object();
  ApplyPodSecureDefaults(Typed(Template()), &spec);
  EXPECT_EQ(spec, Json::parse(R"({"automountServiceAccountToken": false, "dnsPolicy": "None",
                                  "dnsConfig": {"nameservers": ["8.8.8.8", "1.1.1.1"]}})"));
  // What the template sets stays.
  spec = Json::parse(R"({"automountServiceAccountToken": true, "dnsPolicy": "ClusterFirst"})");
  ApplyPodSecureDefaults(Typed(Template()), &spec);
  EXPECT_EQ(spec, Json::parse(R"({"automountServiceAccountToken": true,
                                  "dnsPolicy": "ClusterFirst"})"));
  // Custom rules or Unmanaged: DNS left alone (air-gapped or proxied clusters).
  for (const char* extra :
       {R"("networkPolicy": {"egress": []},)", R"("networkPolicyManagement": "Unmanaged",)"}) {
    spec = Json::object();
    ApplyPodSecureDefaults(Typed(Template(extra)), &spec);
    EXPECT_EQ(spec, Json::parse(R"({"automountServiceAccountToken": false})")) << extra;
  }
  // A template still held as JSON is decoded first; one that does not decode (a field of
  // another type) gets the secure default.
  spec = Json::object();
  ApplyPodSecureDefaults(Template(R"("networkPolicyManagement": "Unmanaged",)"), &spec);
  EXPECT_EQ(spec, Json::parse(R"({"automountServiceAccountToken": false})"));
  spec = Json::object();
  ApplyPodSecureDefaults(Template(R"("networkPolicyManagement": "Unmanaged", "service": "yes",)"),
                         &spec);
  EXPECT_EQ(spec, Json::parse(R"({"automountServiceAccountToken": false, "dnsPolicy": "None",
                                  "dnsConfig": {"nameservers": ["8.8.8.8", "1.1.1.1"]}})"));
}

TEST(TemplateObjectsTest, WarmMembersAreMadeWithTheDefaultsAndTheTemplateHash) {
  Json pool = Json::parse(R"({"metadata": {"name": "py", "namespace": "team", "uid": "p-1"},
                              "spec": {"sandboxTemplateRef": {"name": "python"}}})");
  Json member = WarmMember(pool, Template());
  EXPECT_EQ(member["metadata"]["labels"][kTemplateRefHashLabel], NameHash("python"));
  const Json& pod_spec = member["spec"]["podTemplate"]["spec"];
  EXPECT_EQ(pod_spec["automountServiceAccountToken"], false);
  EXPECT_EQ(pod_spec["dnsPolicy"], "None");
  // Its pod carries the label the policy selects (the member is owned by its pool).
  member["metadata"]["name"] = "py-abcde";
  EXPECT_EQ(DesiredPod(member)["metadata"]["labels"][kTemplateRefHashLabel], NameHash("python"));
}

// Upstream's two template-hash labels on warm members: one of the template's podTemplate
// (deprecated upstream, still written), one of its blueprint (podTemplate,
// volumeClaimTemplates, service).
TEST(TemplateObjectsTest, WarmMembersCarryUpstreamsTwoTemplateHashLabels) {
  Json pool = Json::parse(R"({"metadata": {"name": "py", "namespace": "team", "uid": "p-1"},
                              "spec": {"sandboxTemplateRef": {"name": "python"}}})");
  const Json tmpl = Template();
  const Json labels = WarmMember(pool, tmpl)["metadata"]["labels"];
  EXPECT_EQ(labels.value("agents.x-k8s.io/sandbox-pod-template-hash", ""),
            NameHash(tmpl["spec"]["podTemplate"].dump()));
  Json blueprint = {{"podTemplate", tmpl["spec"]["podTemplate"]}};
  EXPECT_EQ(labels.value("agents.x-k8s.io/sandbox-template-hash", ""), NameHash(blueprint.dump()));
  // A Service asked for changes the blueprint's hash, not the pod template's; a change of
  // the pod template changes both; a NetworkPolicy (not in the blueprint) neither.
  Json with_service = tmpl;
  with_service["spec"]["service"] = true;
  const Json s = WarmMember(pool, with_service)["metadata"]["labels"];
  EXPECT_EQ(s["agents.x-k8s.io/sandbox-pod-template-hash"],
            labels["agents.x-k8s.io/sandbox-pod-template-hash"]);
  EXPECT_NE(s["agents.x-k8s.io/sandbox-template-hash"],
            labels["agents.x-k8s.io/sandbox-template-hash"]);
  Json other_image = tmpl;
  other_image["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "python:3.13";
  const Json o = WarmMember(pool, other_image)["metadata"]["labels"];
  EXPECT_NE(o["agents.x-k8s.io/sandbox-pod-template-hash"],
            labels["agents.x-k8s.io/sandbox-pod-template-hash"]);
  EXPECT_NE(o["agents.x-k8s.io/sandbox-template-hash"],
            labels["agents.x-k8s.io/sandbox-template-hash"]);
  Json policy = tmpl;
  policy["spec"]["networkPolicyManagement"] = "Unmanaged";
  EXPECT_EQ(WarmMember(pool, policy)["metadata"]["labels"]["agents.x-k8s.io/sandbox-template-hash"],
            labels["agents.x-k8s.io/sandbox-template-hash"]);
}

}  // namespace
}  // namespace sbx::k8s
