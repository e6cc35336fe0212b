"""Runs the real kubectl (/usr/bin/kubectl) against kube-emulator.

Usage: python3 kubectl_test.py KUBE_EMULATOR_BINARY PROJECT_SOURCE_DIR
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emu_harness import (ConversionWebhook, Emulator, WEBHOOK_DNS, ca_bundle,  # noqa: E402
                         make_ca, make_serving_cert, make_tls, wait_until,
                         widget_conversion_crd)

BINARY = None
SOURCE_DIR = None
KUBECTL = shutil.which("kubectl", path="/usr/bin:/usr/local/bin") or "kubectl"

POD_YAML = """apiVersion: v1
kind: Pod
metadata:
  name: %(name)s
  labels: {app: %(app)s}
spec:
  containers:
  - name: main
    image: %(image)s
  - name: side
    image: busybox
"""

TEMPLATE_YAML = """apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: python, namespace: default}
spec:
  podTemplate:
    spec:
      containers:
      - name: main
        image: python:3.12-slim
        command: ["sleep", "infinity"]
"""

POOL_YAML = """apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: python-pool, namespace: default}
spec:
  replicas: %(replicas)d
  sandboxTemplateRef: {name: python}
"""

CLAIM_YAML = """apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: job-42, namespace: default}
spec:
  warmPoolRef: {name: python-pool}
  lifecycle: {shutdownPolicy: Delete}
"""

BAD_POOL_YAML = """apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: bad-pool, namespace: default}
spec:
  replicas: 1
"""


def write_kubeconfig(path, server, ca=None, token="t"):
    cluster = {"server": server}
    if ca:
        cluster["certificate-authority"] = ca
    cfg = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "emu", "cluster": cluster}],
           "users": [{"name": "emu", "user": {"token": token}}],
           "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu",
                                                     "namespace": "default"}}],
           "current-context": "emu"}
    with open(path, "w") as f:
        json.dump(cfg, f)


class Kubectl:
    def __init__(self, tmp, kubeconfig):
        self.tmp = tmp
        self.kubeconfig = kubeconfig

    def run(self, *args, input=None, check=True, timeout=40):
        env = dict(os.environ, HOME=self.tmp, KUBECONFIG=self.kubeconfig)
        env.pop("KUBECTL_KUBERC", None)
        p = subprocess.run([KUBECTL, "--cache-dir", os.path.join(self.tmp, "cache"), *args],
                           input=input, capture_output=True, text=True, env=env,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("kubectl %s failed (%d):\n%s%s" % (
                " ".join(args), p.returncode, p.stdout, p.stderr))
        return p

    def json(self, *args):
        return json.loads(self.run(*args, "-o", "json").stdout)


class KubectlHttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="emu-kubectl-")
        cls.emu = Emulator(BINARY, "--pod_ready_delay_ms", "100").__enter__()
        kc = os.path.join(cls.tmp, "kubeconfig")
        write_kubeconfig(kc, cls.emu.url)
        cls.k = Kubectl(cls.tmp, kc)

    @classmethod
    def tearDownClass(cls):
        cls.emu.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_pod_workflow(self):
        k = self.k
        f = self.write("pod.yaml", POD_YAML % {"name": "web", "app": "web", "image": "nginx:1"})
        self.assertIn("pod/web created", k.run("create", "-f", f).stdout)
        got = k.json("get", "pod", "web")
        self.assertEqual(got["metadata"]["labels"], {"app": "web"})
        p = k.run("wait", "--for=condition=Ready", "pod/web", "--timeout=20s")
        self.assertIn("condition met", p.stdout)
        self.assertRegex(k.run("get", "pod", "web", "-o", "jsonpath={.status.podIP}").stdout,
                         r"^10\.\d+\.\d+\.\d+$")
        # Table output: kubectl prints the server's columns.
        out = k.run("get", "pods").stdout
        self.assertRegex(out, r"NAME\s+READY\s+STATUS\s+RESTARTS\s+AGE")
        self.assertRegex(out, r"web\s+2/2\s+Running")
        # apply: create another, then change it.
        f2 = self.write("pod2.yaml", POD_YAML % {"name": "api", "app": "api", "image": "img:1"})
        self.assertIn("pod/api created", k.run("apply", "-f", f2).stdout)
        self.assertIn("pod/api unchanged", k.run("apply", "-f", f2).stdout)
        gen = k.json("get", "pod", "api")["metadata"]["generation"]
        self.write("pod2.yaml", POD_YAML % {"name": "api", "app": "api", "image": "img:2"})
        self.assertIn("pod/api configured", k.run("apply", "-f", f2).stdout)
        got = k.json("get", "pod", "api")
        self.assertEqual([c["image"] for c in got["spec"]["containers"]], ["img:2", "busybox"])
        self.assertGreater(got["metadata"]["generation"], gen)
        # patch: merge, json, strategic (containers merged by name).
        k.run("patch", "pod", "api", "--type", "merge", "-p", '{"metadata":{"labels":{"m":"1"}}}')
        k.run("patch", "pod", "api", "--type", "json",
              "-p", '[{"op":"add","path":"/metadata/labels/j","value":"2"}]')
        k.run("patch", "pod", "api", "-p",
              '{"spec":{"containers":[{"name":"side","image":"busybox:2"}]}}')
        got = k.json("get", "pod", "api")
        self.assertEqual(got["metadata"]["labels"], {"app": "api", "m": "1", "j": "2"})
        self.assertEqual({c["name"]: c["image"] for c in got["spec"]["containers"]},
                         {"main": "img:2", "side": "busybox:2"})
        # label selectors
        out = k.run("get", "pods", "-l", "app=api", "-o", "name").stdout.split()
        self.assertEqual(out, ["pod/api"])
        out = k.run("get", "pods", "-l", "app in (web,api),m!=1", "-o", "name").stdout.split()
        self.assertEqual(out, ["pod/web"])
        # errors as kubectl prints them
        p = k.run("get", "pod", "nope", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('Error from server (NotFound): pods "nope" not found', p.stderr)
        bad = self.write("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\n"
                         "spec:\n  containers: []\n")
        p = k.run("create", "-f", bad, check=False)
        self.assertIn('The Pod "bad" is invalid: spec.containers: Required value', p.stderr)
        # delete waits until the object is gone
        p = k.run("delete", "pod", "api", "--cascade=background")
        self.assertIn('pod "api" deleted', p.stdout)
        self.assertNotEqual(k.run("get", "pod", "api", check=False).returncode, 0)

    def test_list_is_validated_and_applied(self):
        # kubectl validates a List on the client against /openapi/v2 (protobuf).
        k = self.k
        path = self.write("list.yaml", """apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: listed-a}, data: {x: "1"}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: listed-b}}
""")
        out = k.run("apply", "-f", path).stdout
        self.assertIn("configmap/listed-a created", out)
        self.assertIn("configmap/listed-b created", out)

    def test_node_labels_steer_the_scheduler(self):
        k = self.k
        k.run("label", "node", "emu-node-2", "sbx.test/pool=gpu")
        path = self.write("steered.yaml", """apiVersion: v1
kind: Pod
metadata: {name: steered}
spec:
  nodeSelector: {sbx.test/pool: gpu}
  containers: [{name: main, image: busybox}]
""")
        k.run("apply", "-f", path)
        self.assertTrue(wait_until(
            lambda: k.json("get", "pod", "steered")["spec"].get("nodeName") == "emu-node-2"))
        k.run("label", "node", "emu-node-2", "sbx.test/pool-")

    def test_protobuf_bodies_are_refused_naming_the_workaround(self):
        # Built-in kinds created by kubectl's typed commands go as protobuf, which the
        # emulator does not decode: the error says what to do instead, and that works.
        k = self.k
        p = k.run("create", "namespace", "made-by-create", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--dry-run=client -o yaml | kubectl apply -f -", p.stderr)
        manifest = k.run("create", "namespace", "made-by-create", "--dry-run=client",
                         "-o", "yaml").stdout
        self.assertIn("namespace/made-by-create created",
                      k.run("apply", "-f", "-", input=manifest).stdout)

    def test_project_crds(self):
        k = self.k
        crd_dir = os.path.join(SOURCE_DIR, "charts", "sbx", "crds")
        files = sorted(glob.glob(os.path.join(crd_dir, "*.yaml")))
        self.assertEqual(len(files), 4, files)
        out = k.run("apply", "-f", crd_dir).stdout
        self.assertEqual(out.count("created"), 4, out)
        for f in files:
            name = os.path.basename(f).split("_", 1)[1][:-len(".yaml")] + "." + \
                os.path.basename(f).split("_", 1)[0]
            k.run("wait", "--for=condition=Established", "crd/" + name, "--timeout=20s")
        t = self.write("template.yaml", TEMPLATE_YAML)
        pool = self.write("pool.yaml", POOL_YAML % {"replicas": 2})
        claim = self.write("claim.yaml", CLAIM_YAML)
        for f, what in [(t, "sandboxtemplate.extensions.agents.x-k8s.io/python created"),
                        (pool, "sandboxwarmpool.extensions.agents.x-k8s.io/python-pool created"),
                        (claim, "sandboxclaim.extensions.agents.x-k8s.io/job-42 created")]:
            self.assertIn(what, k.run("apply", "-f", f).stdout)
        got = k.json("get", "swp", "python-pool")
        self.assertEqual(got["metadata"]["generation"], 1)
        self.assertEqual(got["spec"]["updateStrategy"], {"type": "OnReplenish"})  # defaulted
        # apply a change: configured, generation bumped
        self.write("pool.yaml", POOL_YAML % {"replicas": 4})
        self.assertIn("configured", k.run("apply", "-f", pool).stdout)
        got = k.json("get", "sandboxwarmpool", "python-pool")
        self.assertEqual((got["spec"]["replicas"], got["metadata"]["generation"]), (4, 2))
        # scale through the scale subresource
        self.assertIn("scaled", k.run("scale", "swp/python-pool", "--replicas=7").stdout)
        self.assertEqual(k.json("get", "swp", "python-pool")["spec"]["replicas"], 7)
        out = k.run("get", "swp").stdout
        self.assertRegex(out, r"NAME\s+READY\s+DESIRED\s+AGE")
        self.assertRegex(out, r"python-pool\s+7\s+")
        # status written by a controller shows in the printer columns
        k.run("patch", "swp", "python-pool", "--subresource=status", "--type=merge",
              "-p", '{"status":{"replicas":7,"readyReplicas":5}}')
        self.assertRegex(k.run("get", "swp").stdout, r"python-pool\s+5\s+7")
        p = k.run("apply", "-f", self.write("bad-pool.yaml", BAD_POOL_YAML), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('The SandboxWarmPool "bad-pool" is invalid: spec.sandboxTemplateRef: '
                      'Required value', p.stderr)
        # kubectl validates strictly on the server by default: unknown fields are rejected.
        typo = self.write("typo.yaml", (POOL_YAML % {"replicas": 1}).replace(
            "python-pool", "typo-pool") + "  replcas: 3\n")
        p = k.run("apply", "-f", typo, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('strict decoding error: unknown field "spec.replcas"', p.stderr)
        p = k.run("apply", "-f", typo, "--validate=warn")
        self.assertIn('unknown field "spec.replcas"', p.stderr)
        self.assertNotIn("replcas", k.json("get", "swp", "typo-pool")["spec"])  # pruned
        p = k.run("patch", "swp", "python-pool", "--type=strategic", "-p",
                  '{"spec":{"replicas":1}}', check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("application/strategic-merge-patch+json is not supported", p.stderr)
        self.assertIn("job-42", k.run("get", "sandboxclaims").stdout)
        # volumeClaimTemplates is immutable, by upstream's CEL rule on spec (has()): a
        # Sandbox made without any cannot get one later (before: the PVC was made, never
        # mounted, and the Sandbox stayed Ready), nor lose or change those it has.
        vct = [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}]
        plain = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                 "metadata": {"name": "plain", "namespace": "default"},
                 "spec": {"podTemplate": {"spec": {"containers": [
                     {"name": "main", "image": "busybox"}]}}}}
        k.run("create", "-f", "-", input=json.dumps(plain))
        p = k.run("patch", "sandbox", "plain", "--type=merge", "-p",
                  json.dumps({"spec": {"volumeClaimTemplates": vct}}), check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn('The Sandbox "plain" is invalid: spec: Invalid value: "object": '
                      'volumeClaimTemplates is immutable', p.stderr)
        self.assertNotIn("volumeClaimTemplates", k.json("get", "sandbox", "plain")["spec"])
        disk = dict(plain, metadata={"name": "disk", "namespace": "default"})
        disk["spec"] = dict(plain["spec"], volumeClaimTemplates=vct)
        k.run("create", "-f", "-", input=json.dumps(disk))
        for patch in ([{"op": "remove", "path": "/spec/volumeClaimTemplates"}],
                      [{"op": "replace", "path": "/spec/volumeClaimTemplates/0/metadata/name",
                        "value": "other"}]):
            p = k.run("patch", "sandbox", "disk", "--type=json", "-p", json.dumps(patch),
                      check=False)
            self.assertNotEqual(p.returncode, 0, (patch, p.stdout))
            self.assertIn("volumeClaimTemplates is immutable", p.stderr)
        # The rest of the spec may change.
        k.run("patch", "sandbox", "disk", "--type=merge", "-p",
              '{"spec":{"operatingMode":"Suspended"}}')
        k.run("delete", "sandbox", "plain", "disk")
        # Foreground cascade: a Sandbox owned by the claim goes first, then the claim.
        claim_uid = k.json("get", "sandboxclaim", "job-42")["metadata"]["uid"]
        sandbox = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                   "metadata": {"name": "job-42", "namespace": "default", "ownerReferences": [
                       {"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                        "kind": "SandboxClaim", "name": "job-42", "uid": claim_uid,
                        "controller": True, "blockOwnerDeletion": True}]},
                   "spec": {"podTemplate": {"spec": {"containers": [
                       {"name": "main", "image": "python:3.12-slim"}]}}}}
        p = k.run("create", "-f", "-", input=json.dumps(sandbox))
        self.assertIn("sandbox.agents.x-k8s.io/job-42 created", p.stdout)
        p = k.run("delete", "sandboxclaim", "job-42", "--cascade=foreground")
        self.assertIn('deleted', p.stdout)
        self.assertNotEqual(k.run("get", "sandbox", "job-42", check=False).returncode, 0)
        self.assertNotEqual(k.run("get", "sandboxclaim", "job-42", check=False).returncode, 0)
        # Background cascade from a pool to an owned member.
        pool_uid = k.json("get", "swp", "python-pool")["metadata"]["uid"]
        sandbox["metadata"]["name"] = "python-pool-abcde"
        sandbox["metadata"]["ownerReferences"] = [{
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "name": "python-pool", "uid": pool_uid, "controller": True}]
        k.run("create", "-f", "-", input=json.dumps(sandbox))
        k.run("delete", "swp", "python-pool")
        self.assertTrue(wait_until(lambda: k.run("get", "sandbox", "python-pool-abcde",
                                                 check=False).returncode != 0, timeout=10))
        # Deleting the CRDs deletes their objects.
        k.run("delete", "-f", crd_dir)
        p = k.run("get", "sandboxtemplates", check=False)
        self.assertNotEqual(p.returncode, 0)


class KubectlHttpsTest(unittest.TestCase):
    def test_https_with_ca_and_token(self):
        tmp = tempfile.mkdtemp(prefix="emu-kubectl-tls-")
        try:
            ca, crt, key = make_tls(tmp)
            tok = os.path.join(tmp, "token")
            with open(tok, "w") as f:
                f.write("s3cret\n")
            with Emulator(BINARY, "--tls_cert_file", crt, "--tls_key_file", key,
                          "--token_file", tok) as emu:
                kc = os.path.join(tmp, "kubeconfig")
                write_kubeconfig(kc, emu.url, ca=ca, token="s3cret")
                k = Kubectl(tmp, kc)
                self.assertIn("default", k.run("get", "namespaces").stdout)
                cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tls-cm"},
                      "data": {"a": "b"}}
                k.run("create", "-f", "-", input=json.dumps(cm))
                self.assertEqual(k.json("get", "configmap", "tls-cm")["data"], {"a": "b"})
                write_kubeconfig(kc, emu.url, ca=ca, token="wrong")
                p = k.run("get", "configmaps", check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("Unauthorized", p.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class KubectlConversionTest(unittest.TestCase):
    """kubectl against a CRD served in several versions, converted by a webhook."""

    def test_versions_and_conversion(self):
        tmp = tempfile.mkdtemp(prefix="emu-kubectl-conv-")
        try:
            ca = make_ca(tmp, "conv-ca")
            cert = make_serving_cert(tmp, "conv-webhook", ca, ["DNS:" + WEBHOOK_DNS])
            with ConversionWebhook(cert) as hook, Emulator(
                    BINARY, "--service_address",
                    "test-ns/conv-webhook=127.0.0.1:%d" % hook.port) as emu:
                kc = os.path.join(tmp, "kubeconfig")
                write_kubeconfig(kc, emu.url)
                k = Kubectl(tmp, kc)
                crd = widget_conversion_crd({"service": {"namespace": "test-ns",
                                                         "name": "conv-webhook",
                                                         "path": "/convert"},
                                             "caBundle": ca_bundle(ca)})
                k.run("apply", "-f", "-", input=json.dumps(crd))
                k.run("wait", "--for=condition=Established",
                      "crd/widgets.conv.example.com", "--timeout=20s")
                w = {"apiVersion": "conv.example.com/v1", "kind": "Widget",
                     "metadata": {"name": "w1"}, "spec": {"size": "L"}}
                self.assertIn("widget.conv.example.com/w1 created",
                              k.run("apply", "-f", "-", input=json.dumps(w)).stdout)
                # Resource.version.group picks the version; the printer columns are its own.
                out = k.run("get", "widgets.v2.conv.example.com").stdout
                self.assertRegex(out, r"NAME\s+SIZE\s+AGE\s*\n\s*w1\s+L\s")
                got = k.json("get", "widgets.v2.conv.example.com", "w1")
                self.assertEqual((got["apiVersion"], got["spec"]),
                                 ("conv.example.com/v2", {"dimensions": {"size": "L"}}))
                # A bare kind is served in the preferred version (v2 > v1 > v1beta1).
                got = k.json("get", "widget", "w1")
                self.assertEqual(got["apiVersion"], "conv.example.com/v2")
                k.run("patch", "widgets.v2.conv.example.com", "w1", "--type=merge",
                      "-p", '{"spec":{"dimensions":{"size":"S"}}}')
                self.assertEqual(k.json("get", "widgets.v1.conv.example.com", "w1")["spec"],
                                 {"size": "S"})
                p = k.run("get", "widgets.v1beta1.conv.example.com")
                self.assertIn("Warning: conv.example.com/v1beta1 Widget is deprecated", p.stderr)
                self.assertIn("w1", p.stdout)
                hook.mode = "fail"
                p = k.run("get", "widgets.v2.conv.example.com", "w1", check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("Error from server: conversion webhook for conv.example.com/v1, "
                              "Kind=Widget failed: widgets cannot be converted today", p.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: kubectl_test.py KUBE_EMULATOR_BINARY PROJECT_SOURCE_DIR")
    BINARY, SOURCE_DIR = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
