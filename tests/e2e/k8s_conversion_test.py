#!/usr/bin/python3
"""agents.x-k8s.io v1alpha1 through sbx-server's conversion webhook, end to end.

- The webhook alone (real HTTPS from Python's ssl): a ConversionReview is answered; what
  is not one, too large, nested too deep, or not TLS gets a refusal and the server stays up.
- With kube-emulator calling the webhook as the API server does (CRDs from charts/sbx/crds,
  the webhook's Service mapped to its port, caBundle written by sbx-server at start) and
  the real kubectl: v1alpha1 manifests of upstream's shapes (a Sandbox with replicas, a
  template, a warm pool, a claim with sandboxTemplateRef + warmpool) are served by sbx's
  controllers and read back as written; v1beta1 readers see the converted objects.

Certificates are made at test time with the openssl command.

Usage: python3 k8s_conversion_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR
"""

import base64
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_pool_test as pools  # noqa: E402  (PoolCluster, manifests)
import k8s_sandbox_test as base  # noqa: E402
import sbx_e2e  # noqa: E402

NS = base.NS
SERVICE = "sbx-webhook"
SERVICE_NS = "sbx-system"
DNS = "%s.%s.svc" % (SERVICE, SERVICE_NS)
CORE_ALPHA = "agents.x-k8s.io/v1alpha1"
EXT_ALPHA = "extensions.agents.x-k8s.io/v1alpha1"
STATE = "api.agents.x-k8s.io/v1alpha1-sandbox-state"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_pki(d):
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=sbx webhook test ca", "-keyout", "ca.key", "-out", "ca.pem")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:%s,DNS:%s.%s,IP:127.0.0.1\n" % (DNS, SERVICE, SERVICE_NS))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + DNS, "-keyout",
            "webhook.key", "-out", "webhook.csr")
    openssl("x509", "-req", "-in", "webhook.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "webhook.pem")


def peak_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for pid %d" % pid)


def flood(c, size, send_body=True):
    """POSTs `size` bytes to the webhook in 1 MiB writes; the server's first answer line."""
    sock = c.tls().wrap_socket(socket.create_connection(("127.0.0.1", c.webhook_port)),
                               server_hostname="127.0.0.1")
    with sock:
        sock.settimeout(20)
        sock.sendall(b"POST /convert HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % size)
        chunk = b" " * (1 << 20)
        try:
            for _ in range((size >> 20) if send_body else 0):
                sock.sendall(chunk)
        except (OSError, ssl.SSLError):
            pass  # the server closed the connection: what a refusal should do
        try:
            return sock.recv(200)
        except (OSError, ssl.SSLError) as e:
            return ("(no answer: %s)" % e).encode()


def review(objects, desired, uid="u-1"):
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects}}


def alpha_sandbox(name, replicas=None):
    spec = {"podTemplate": {"spec": {"containers": [
        {"name": "main", "image": "python:3.12-slim", "command": ["sleep", "infinity"]}]}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": CORE_ALPHA, "kind": "Sandbox",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


class ConversionCluster(pools.PoolCluster):
    def __init__(self, test):
        self.webhook_port = free_port()
        super().__init__(test, "--service_address",
                         "%s/%s=127.0.0.1:%d" % (SERVICE_NS, SERVICE, self.webhook_port))
        make_pki(self.dir)

    def webhook_flags(self, *extra):
        return ("--conversion_webhook_listen", "127.0.0.1:%d" % self.webhook_port,
                "--conversion_webhook_cert_file", os.path.join(self.dir, "webhook.pem"),
                "--conversion_webhook_key_file", os.path.join(self.dir, "webhook.key"), *extra)

    def tls(self):
        ctx = ssl.create_default_context(cafile=os.path.join(self.dir, "ca.pem"))
        return ctx

    def post(self, body, path="/convert", method="POST", headers=None, raw=None):
        conn = http.client.HTTPSConnection("127.0.0.1", self.webhook_port, context=self.tls(),
                                           timeout=20)
        try:
            data = raw if raw is not None else json.dumps(body).encode()
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            conn.close()


class ConversionTest(unittest.TestCase):
    def test_01_the_webhook_answers_reviews_and_refuses_the_rest(self):
        c = ConversionCluster(self)
        server = c.start_server(*c.webhook_flags("--conversion_webhook_max_body_bytes", "200000"))
        code, text = c.post(review([alpha_sandbox("a", 0)], "agents.x-k8s.io/v1beta1"))
        self.assertEqual(code, 200, text)
        answer = json.loads(text)
        self.assertEqual(answer["response"]["uid"], "u-1")
        self.assertEqual(answer["response"]["result"], {"status": "Success"})
        self.assertEqual(answer["response"]["convertedObjects"][0]["spec"]["operatingMode"],
                         "Suspended")

        code, text = c.post(review([{"apiVersion": "apps/v1", "kind": "Deployment"}],
                                   "apps/v2"))
        self.assertEqual(code, 200, text)
        self.assertEqual(json.loads(text)["response"]["result"]["status"], "Failure")

        code, text = c.post(None, raw=b"{not json")
        self.assertEqual(code, 400, text)
        self.assertIn("not a JSON ConversionReview", text)
        code, text = c.post(None, path="/convert", method="GET", raw=b"")
        self.assertEqual(code, 405, text)
        code, text = c.post(review([], CORE_ALPHA), path="/metrics")
        self.assertEqual(code, 404, text)
        code, text = c.post(None, raw=b"{}", headers={"Content-Type": "text/plain"})
        self.assertEqual(code, 415, text)

        # The attacks: any pod of the cluster can reach this port, not only the API server.
        # A body larger than the limit is refused from its Content-Length, and not read:
        # sending 200 MB must not grow the server by more than a few MB (cpprestsdk's
        # listener, tried first, grew it by the whole body even after answering 413).
        self.assertIn(b" 413 ", flood(c, 300000, send_body=False))
        before = peak_rss_kb(server["proc"].pid)
        flood(c, 200 << 20)  # the answer may be lost to the reset of the unread rest
        grown = peak_rss_kb(server["proc"].pid) - before
        base.note("a 200 MB body refused; the server's peak RSS grew by %d kB", grown)
        self.assertLess(grown, 50 * 1024)
        # Nesting fifty thousand deep (would overflow the stack when copied or printed).
        deep = b"[" * 50000 + b"]" * 50000
        body = json.dumps(review([alpha_sandbox("deep")], "agents.x-k8s.io/v1beta1"))
        body = body.replace('"containers": [', '"containers": [' + deep.decode() + ",", 1)
        code, text = c.post(None, raw=body.encode())
        self.assertEqual(code, 400, text)
        self.assertIn("nests deeper than", text)
        # Plain HTTP on the TLS port gets no answer.
        plain = http.client.HTTPConnection("127.0.0.1", c.webhook_port, timeout=10)
        with self.assertRaises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("POST", "/convert", body=json.dumps(review([], CORE_ALPHA)))
            r = plain.getresponse()
            raise AssertionError("plain HTTP answered %d: %r" % (r.status, r.read()[:200]))
        plain.close()
        # Still serving, and counted.
        code, text = c.post(review([alpha_sandbox("b")], "agents.x-k8s.io/v1beta1", uid="u-2"))
        self.assertEqual(code, 200, text)
        self.assertIsNone(server["proc"].poll())

    def test_02_a_bad_certificate_stops_the_server_at_start(self):
        c = ConversionCluster(self)
        flags = list(c.webhook_flags())
        flags[flags.index("--conversion_webhook_key_file") + 1] = os.path.join(c.dir, "ca.pem")
        server = c.start_server(*flags, wait_running=False)
        c.wait_for(lambda: server["proc"].poll() is not None, 20, "sbx-server to stop")
        self.assertNotEqual(server["proc"].returncode, 0)
        self.assertIn("conversion webhook: certificate", c.read_log(server))

    def start_converting(self, c):
        """sbx-server serving pools with the webhook; the CRDs pointed at it."""
        server = c.start_pools(*c.webhook_flags(
            "--conversion_webhook_service", "%s/%s:%d" % (SERVICE_NS, SERVICE, c.webhook_port),
            "--conversion_webhook_ca_file", os.path.join(c.dir, "ca.pem")))
        crd = c.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                    "sandboxes.agents.x-k8s.io")
        client = crd["spec"]["conversion"]["webhook"]["clientConfig"]
        with open(os.path.join(c.dir, "ca.pem"), "rb") as f:
            self.assertEqual(base64.b64decode(client["caBundle"]), f.read())
        self.assertEqual(client["service"], {"namespace": SERVICE_NS, "name": SERVICE,
                                             "path": "/convert", "port": c.webhook_port})
        return server

    def test_03_a_v1alpha1_sandbox_runs_suspends_and_reads_back(self):
        c = ConversionCluster(self)
        self.start_converting(c)
        r = c.kubectl("apply", "-f", "-", input=json.dumps(alpha_sandbox("alpha-sb")))
        self.assertIn("deprecated", r.stderr, "kubectl shows the deprecation warning")
        sb = base.Cluster.wait_ready(c, "alpha-sb")
        self.assertEqual(sb["apiVersion"], "agents.x-k8s.io/v1beta1")
        self.assertEqual(sb["spec"]["operatingMode"], "Running")
        self.assertIn(STATE, sb["metadata"]["annotations"])
        self.assertIsNotNone(c.pod("alpha-sb"))

        got = json.loads(c.kubectl("get", "sandboxes.v1alpha1.agents.x-k8s.io", "alpha-sb",
                                   "-o", "json").stdout)
        self.assertEqual(got["apiVersion"], CORE_ALPHA)
        self.assertNotIn("operatingMode", got["spec"])
        self.assertNotIn(STATE, got["metadata"].get("annotations") or {})
        self.assertEqual(got["status"].get("replicas"), 1)
        self.assertTrue(base.is_ready(got), got)

        # Suspend the v1alpha1 way: replicas 0 (here through the scale subresource).
        c.kubectl("scale", "sandboxes.v1alpha1.agents.x-k8s.io/alpha-sb", "--replicas=0")
        c.wait_sandbox("alpha-sb", lambda s: s["spec"].get("operatingMode") == "Suspended",
                       "Suspended")
        c.wait_for(lambda: c.pod("alpha-sb") is None, 20, "the pod to be deleted")
        got = json.loads(c.kubectl("get", "sandboxes.v1alpha1.agents.x-k8s.io", "alpha-sb",
                                   "-o", "json").stdout)
        self.assertEqual(got["spec"]["replicas"], 0)
        # Resumed in v1beta1, read in v1alpha1: running again.
        c.kubectl("patch", "sandboxes.v1beta1.agents.x-k8s.io", "alpha-sb", "--type=merge",
                  "-p", json.dumps({"spec": {"operatingMode": "Running"}}))
        base.Cluster.wait_ready(c, "alpha-sb")
        got = json.loads(c.kubectl("get", "sandboxes.v1alpha1.agents.x-k8s.io", "alpha-sb",
                                   "-o", "json").stdout)
        self.assertEqual(got["spec"]["replicas"], 1)

    def test_04_a_v1alpha1_claim_takes_from_a_v1alpha1_pool(self):
        c = ConversionCluster(self)
        server = self.start_converting(c)
        tmpl = pools.template()
        tmpl["apiVersion"] = EXT_ALPHA
        tmpl["metadata"]["annotations"] = {
            "api.agents.x-k8s.io/v1beta1-volume-claim-templates-policy": "Allowed"}
        pool = pools.pool("python-pool", 2)
        pool["apiVersion"] = EXT_ALPHA
        c.apply(tmpl, pool)
        stored = c.get("/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/%s/"
                       "sandboxtemplates/python" % NS)
        self.assertEqual(stored["spec"]["volumeClaimTemplatesPolicy"], "Allowed")
        c.wait_for(lambda: (c.swp("python-pool") or {}).get("status", {}).get("readyReplicas")
                   == 2, 60, "the pool to have 2 ready")
        claim = {"apiVersion": EXT_ALPHA, "kind": "SandboxClaim",
                 "metadata": {"name": "alpha-claim", "namespace": NS},
                 "spec": {"sandboxTemplateRef": {"name": "python"}, "warmpool": "python-pool"}}
        c.apply(claim)
        c.wait_ready("alpha-claim")
        beta = c.claim_obj("alpha-claim")
        self.assertEqual(beta["spec"]["warmPoolRef"], {"name": "python-pool"})
        bound = beta["status"]["sandbox"]["name"]
        self.assertTrue(bound.startswith("python-pool-"), bound)
        got = json.loads(c.kubectl("get", "sandboxclaims.v1alpha1.extensions.agents.x-k8s.io",
                                   "alpha-claim", "-o", "json").stdout)
        self.assertEqual(got["spec"]["sandboxTemplateRef"], {"name": "python"})
        self.assertEqual(got["spec"]["warmpool"], "python-pool")
        self.assertEqual(got["status"]["sandbox"]["name"], bound)
        pool_alpha = json.loads(c.kubectl("get", "sandboxwarmpools.v1alpha1.extensions.agents."
                                          "x-k8s.io", "python-pool", "-o", "json").stdout)
        self.assertEqual(pool_alpha["spec"]["replicas"], 2)
        self.assertNotIn("observedGeneration", pool_alpha.get("status", {}))
        metrics = c.metrics(server)
        success = [line for line in metrics.splitlines()
                   if line.startswith('sbx_conversion_reviews_total{result="success"}')]
        self.assertTrue(success and float(success[0].split()[-1]) > 0, success)


if __name__ == "__main__":
    base.SBX_SERVER, base.KUBE_EMULATOR, base.SOURCE_DIR = sys.argv[1:4]
    sbx_e2e.generate_stubs(os.path.join(base.SOURCE_DIR, "proto"))
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
