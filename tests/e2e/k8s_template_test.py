"""End-to-end test of the NetworkPolicy sbx keeps for each SandboxTemplate, and of the pods
that policy selects.

sbx-server runs with --kubeconfig against kube-emulator; the real kubectl makes, changes and
deletes SandboxTemplates as a user would and reads the NetworkPolicies back. The expected
policies are written out here from upstream's sandboxtemplate_controller.go (2fd412d), not
computed by sbx's code. Every test fails on 660dada, which made no NetworkPolicy, gave pods
no sandbox-template-ref-hash label and left dnsPolicy alone.

Usage: python3 k8s_template_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR
"""
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_sandbox_test as base  # noqa: E402  (Cluster, helpers)
import k8s_pool_test as pools  # noqa: E402  (PoolCluster, object builders)
import sbx_e2e  # noqa: E402

NS = base.NS
TEMPLATE_HASH = "agents.x-k8s.io/sandbox-template-ref-hash"
SERVER_LABELS = {"app.kubernetes.io/name": "sbx", "app.kubernetes.io/instance": "e2e"}
SERVER_FLAGS = ("--kube_server_pod_labels",
                ",".join("%s=%s" % kv for kv in sorted(SERVER_LABELS.items())),
                "--kube_server_namespace", "sbx-system")
note = base.note


def template(name, policy=None, management=None, sandboxd_port=None):
    container = {"name": "main", "image": "python:3.12-slim", "command": ["sleep", "infinity"]}
    if sandboxd_port:
        container["ports"] = [{"name": "sbx-sandboxd", "containerPort": sandboxd_port}]
    spec = {"podTemplate": {"spec": {"containers": [container]}}}
    if policy is not None:
        spec["networkPolicy"] = policy
    if management:
        spec["networkPolicyManagement"] = management
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def selector(name):
    return {"matchLabels": {TEMPLATE_HASH: base.name_hash(name)}}


def upstream_default(name):
    """Upstream's buildDefaultNetworkPolicySpec: ingress only from its router, egress to
    public addresses only (no cluster DNS)."""
    return {
        "podSelector": selector(name),
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [{
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "agent-sandbox-system"}},
            "podSelector": {"matchLabels": {"app": "sandbox-router"}}}]}],
        "egress": [{"to": [
            {"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]}},
            {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}}]}],
    }


class TemplateCluster(base.Cluster):
    def netpol(self, template_name):
        return self.get("/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies/%s-network-policy"
                        % (NS, template_name))

    def template_obj(self, name):
        return self.get("/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/%s/sandboxtemplates/%s"
                        % (NS, name))

    def wait_netpol(self, name, spec, timeout=20):
        def check():
            p = self.netpol(name)
            return p if p and p.get("spec") == spec else None
        return self.wait_for(check, timeout, "NetworkPolicy %s-network-policy to be %s"
                             % (name, json.dumps(spec)), state=lambda: self.netpol(name))

    def wait_netpol_gone(self, name, timeout=20):
        self.wait_for(lambda: self.netpol(name) is None, timeout,
                      "NetworkPolicy %s-network-policy to go" % name,
                      state=lambda: self.netpol(name))


class TemplateNetworkPolicyTest(unittest.TestCase):

    def test_01_policy_per_template_default_custom_unmanaged_deleted(self):
        c = TemplateCluster(self)
        c.start_server(*SERVER_FLAGS)
        custom_rules = {
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "gateway"}}}],
                         "ports": [{"port": 8080, "protocol": "TCP"}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                        "ports": [{"port": 443, "protocol": "TCP"}]}]}
        c.apply(template("python"), template("agent", sandboxd_port=7070),
                template("custom", policy=custom_rules),
                template("byhand", management="Unmanaged"))

        # No rules: upstream's secure default, controlled by the template (garbage collection).
        policy = c.wait_netpol("python", upstream_default("python"))
        owner = [r for r in policy["metadata"]["ownerReferences"] if r.get("controller")]
        self.assertEqual([(r["kind"], r["name"], r["uid"], r.get("blockOwnerDeletion"))
                          for r in owner],
                         [("SandboxTemplate", "python",
                           c.template_obj("python")["metadata"]["uid"], True)])
        # A pod running sbx-sandboxd on its named port: sbx-server's pods may reach it, on
        # every port (the daemon's and those of its port proxy).
        with_server = upstream_default("agent")
        with_server["ingress"].append({
            "from": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": "sbx-system"}},
                      "podSelector": {"matchLabels": SERVER_LABELS}}]})
        c.wait_netpol("agent", with_server)
        # Custom rules: exactly those.
        c.wait_netpol("custom", dict(custom_rules, podSelector=selector("custom"),
                                     policyTypes=["Ingress", "Egress"]))
        # Unmanaged from the start: none.
        self.assertIsNone(c.netpol("byhand"))
        listed = c.kubectl("get", "networkpolicies", "-o", "name").stdout.split()
        self.assertEqual(sorted(listed), ["networkpolicy.networking.k8s.io/%s-network-policy" % n
                                          for n in ("agent", "custom", "python")])

        # Changed rules: the same policy object, updated.
        uid = c.netpol("custom")["metadata"]["uid"]
        c.kubectl("patch", "sandboxtemplate/custom", "--type", "merge", "-p", json.dumps(
            {"spec": {"networkPolicy": {"ingress": [], "egress": custom_rules["egress"]}}}))
        c.wait_netpol("custom", {"podSelector": selector("custom"),
                                 "policyTypes": ["Ingress", "Egress"],
                                 "egress": custom_rules["egress"]})
        self.assertEqual(c.netpol("custom")["metadata"]["uid"], uid)

        # Unmanaged: ours is deleted, and stays deleted.
        c.kubectl("patch", "sandboxtemplate/python", "--type", "merge", "-p",
                  '{"spec":{"networkPolicyManagement":"Unmanaged"}}')
        c.wait_netpol_gone("python")
        time.sleep(1)
        self.assertIsNone(c.netpol("python"))

        # The template deleted: its policy goes with it.
        c.kubectl("delete", "sandboxtemplate", "custom", "--wait=true")
        c.wait_netpol_gone("custom")
        # A policy deleted behind sbx's back is made again.
        c.kubectl("delete", "networkpolicy", "agent-network-policy", "--wait=true")
        c.wait_netpol("agent", with_server)


class TemplatePodsTest(unittest.TestCase):

    def test_02_pods_of_warm_and_cold_sandboxes_are_selected_and_get_secure_defaults(self):
        c = pools.PoolCluster(self)
        c.start_pools(*SERVER_FLAGS)
        c.apply(pools.template("python"), pools.pool("py", 2), pools.pool("empty", 0))
        c.wait_pool("py", 2)
        policy = c.wait_for(lambda: c.get(
            "/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies/python-network-policy"
            % NS), 20, "the template's NetworkPolicy")
        want = policy["spec"]["podSelector"]["matchLabels"]
        self.assertEqual(want, {TEMPLATE_HASH: base.name_hash("python")})

        def check_pod(name, how):
            pod = c.pod(name)
            self.assertIsNotNone(pod, how)
            labels = pod["metadata"].get("labels") or {}
            self.assertEqual(labels.get(TEMPLATE_HASH), want[TEMPLATE_HASH],
                             "%s: the policy does not select its pod" % how)
            spec = pod["spec"]
            self.assertIs(spec.get("automountServiceAccountToken"), False, how)
            # The default policy blocks the cluster DNS: public resolvers instead.
            self.assertEqual(spec.get("dnsPolicy"), "None", how)
            self.assertEqual(spec.get("dnsConfig"), {"nameservers": ["8.8.8.8", "1.1.1.1"]}, how)

        for m in c.members("py"):
            check_pod(m["metadata"]["name"], "warm member %s" % m["metadata"]["name"])
        # A claim binding a warm member: the Sandbox keeps the label, the pod keeps running.
        c.apply(pools.claim("warm-1", "py"))
        c.wait_ready("warm-1")
        bound = c.claim_obj("warm-1")["status"]["sandbox"]["name"]
        self.assertEqual(c.sandbox(bound)["metadata"]["labels"].get(TEMPLATE_HASH),
                         want[TEMPLATE_HASH])
        check_pod(bound, "claimed member %s" % bound)
        # A cold claim: a Sandbox named like the claim, labelled, and its pod selected.
        c.apply(pools.claim("cold-1", "empty"))
        c.wait_ready("cold-1")
        self.assertEqual(c.sandbox("cold-1")["metadata"]["labels"].get(TEMPLATE_HASH),
                         want[TEMPLATE_HASH])
        check_pod("cold-1", "cold claim")
        # A Sandbox a user makes is no template's: no label, DNS untouched.
        plain = base.sandbox_manifest("plain")
        plain["metadata"]["labels"] = {TEMPLATE_HASH: want[TEMPLATE_HASH]}
        c.apply(plain)
        c.wait_sandbox("plain", base.is_ready, "Ready")
        pod = c.pod("plain")
        self.assertNotIn(TEMPLATE_HASH, pod["metadata"].get("labels") or {})
        self.assertEqual(pod["spec"].get("dnsPolicy"), "ClusterFirst")  # the API default
        self.assertNotIn("dnsConfig", pod["spec"])



class SchemaTest(unittest.TestCase):
    """Issue 20 item 4: the CRDs carry Kubernetes' own PodSpec, PersistentVolumeClaimSpec
    and NetworkPolicy rule schemas (scripts/gen_crds.py), so what could never make a pod is
    refused by kubectl apply, naming the field, as upstream's CRDs refuse it. Before, the
    template was stored and failed later (ReconcilerError ... 422 spec.containers)."""

    def refused(self, c, obj, *fields):
        r = c.apply(obj, check=False)
        self.assertNotEqual(r.returncode, 0, "stored: %s" % json.dumps(obj))
        for field in fields:
            self.assertIn(field, r.stderr)
        return r.stderr

    def test_03_what_cannot_make_a_pod_is_refused_on_apply(self):
        c = TemplateCluster(self)
        no_containers = template("empty")
        no_containers["spec"]["podTemplate"]["spec"] = {"restartPolicy": "Never"}
        self.refused(c, no_containers, "spec.podTemplate.spec.containers", "Required value")
        wrong_type = template("wrongtype")
        wrong_type["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = [
            {"containerPort": "http"}]
        self.refused(c, wrong_type, "spec.podTemplate.spec.containers[0].ports[0].containerPort")
        bad_quantity = template("badqty")
        bad_quantity["spec"]["podTemplate"]["spec"]["containers"][0]["resources"] = {
            "limits": {"memory": "lots"}}
        self.refused(c, bad_quantity, "spec.podTemplate.spec.containers[0].resources.limits.memory")
        no_pvc_spec = template("nopvcspec")
        no_pvc_spec["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "data"}}]
        self.refused(c, no_pvc_spec, "spec.volumeClaimTemplates[0].spec", "Required value")
        bad_rule = template("badrule", policy={"ingress": [{"ports": [{"port": [1]}]}]})
        self.refused(c, bad_rule, "spec.networkPolicy.ingress[0].ports[0].port")
        sandbox = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                   "metadata": {"name": "nocontainers", "namespace": NS},
                   "spec": {"podTemplate": {"spec": {}}}}
        self.refused(c, sandbox, "spec.podTemplate.spec.containers")
        claim = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
                 "metadata": {"name": "novalue", "namespace": NS},
                 "spec": {"warmPoolRef": {"name": "py"}, "env": [{"name": "A"}]}}
        self.refused(c, claim, "spec.env[0].value", "Required value")

        # What is valid is stored, with the defaults the Go types declare (a port's
        # protocol, which is a key of the ports list).
        good = template("good")
        good["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = [{"containerPort": 7000}]
        good["spec"]["podTemplate"]["spec"]["containers"][0]["resources"] = {
            "limits": {"memory": "512Mi", "cpu": 1}}
        good["spec"]["volumeClaimTemplates"] = [
            {"metadata": {"name": "data"},
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "1Gi"}}}}]
        c.apply(good)
        stored = c.template_obj("good")
        container = stored["spec"]["podTemplate"]["spec"]["containers"][0]
        self.assertEqual(container["ports"], [{"containerPort": 7000, "protocol": "TCP"}])
        self.assertEqual(container["resources"]["limits"], {"memory": "512Mi", "cpu": 1})
        self.assertEqual(stored["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"],
                         ["ReadWriteOnce"])

if __name__ == "__main__":
    base.SBX_SERVER, base.KUBE_EMULATOR, base.SOURCE_DIR = sys.argv[1:4]
    sbx_e2e.generate_stubs(os.path.join(base.SOURCE_DIR, "proto"))
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
