#!/usr/bin/python3
"""The Grafana dashboard and the alert rules use only metrics sbx-server really exports.

Extracts every metric name from the PromQL of charts/sbx/dashboards/sbx.json (panel
targets and template variable queries) and of charts/sbx/files/alerts.yaml, then checks
each against the live /metrics of sbx-server after some claims, releases and a failed
claim (so that the labelled series exist). sbx-server runs with the instant runtime and
against the Kubernetes API emulator (--kubeconfig), so that the Kubernetes families are
there too. A histogram's _bucket, _sum and _count samples count as its family. The alert
rules are also checked with `promtool check rules`.

Usage: dashboard_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc
import yaml

import harness

SERVER = None
EMULATOR = None
SOURCE = None
PROMTOOL = "/usr/bin/promtool"
KUBECTL = "/usr/bin/kubectl"

# Words of PromQL that look like identifiers but are not metric names.
KEYWORDS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
}
SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr):
    """Metric names used in the PromQL expression `expr` (Grafana variables allowed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)        # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                      # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                      # range and subquery durations
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)                    # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in KEYWORDS:
            continue  # a function or aggregation, or a keyword
        names.add(word)
    return names


def dashboard_exprs(path):
    with open(path) as f:
        dash = json.load(f)
    exprs = []

    def panels(ps):
        for p in ps:
            for t in p.get("targets", []):
                if t.get("expr"):
                    exprs.append(t["expr"])
            panels(p.get("panels", []))  # rows
    panels(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if var.get("type") == "query" and q:
            m = re.match(r"\s*label_values\((.*),\s*\w+\)\s*$", q)
            exprs.append(m.group(1) if m else q)
    return exprs


def alert_exprs(path):
    with open(path) as f:
        groups = yaml.safe_load(f)
    return [r["expr"] for g in groups for r in g["rules"]]


class Emulator:
    """kube-emulator on loopback with the sbx CRDs applied, and a kubeconfig for it."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sbx-metrics-k8s-")
        self._log = open(os.path.join(self.dir, "emulator.log"), "w")
        self.proc = subprocess.Popen([EMULATOR, "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().strip()
        prefix = "kube-emulator: serving on "
        if not line.startswith(prefix):
            self.cleanup()
            raise AssertionError("kube-emulator did not start: %r" % line)
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config",
                       "clusters": [{"name": "emu", "cluster": {"server": line[len(prefix):]}}],
                       "users": [{"name": "emu", "user": {"token": "dummy"}}],
                       "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu",
                                                                "namespace": "default"}}],
                       "current-context": "emu"}, f)
        self.kubectl("apply", "-f", os.path.join(SOURCE, "charts", "sbx", "crds"))
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=30s")

    def kubectl(self, *args):
        r = subprocess.run([KUBECTL, "--kubeconfig", self.kubeconfig, *args],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError("kubectl %s: %s" % (" ".join(args), r.stderr))
        return r.stdout

    def cleanup(self):
        harness.stop(self.proc, wait=5)
        self.proc.stdout.close()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class ExtractionTest(unittest.TestCase):
    def test_metric_names(self):
        self.assertEqual(
            metric_names('histogram_quantile(0.99, sum by (pool, le) '
                         '(rate(a_seconds_bucket{pool=~"$pool",x="y(z)"}[$__rate_interval])))'
                         ' > 0.01 and on (pool) b_total offset 5m'),
            {"a_seconds_bucket", "b_total"})
        self.assertEqual(metric_names("sum(rate(x_sum[5m])) / sum(rate(x_count[5m]))"),
                         {"x_sum", "x_count"})
        self.assertEqual(metric_names("sum without (job) (x) or on () vector(1) unless bool y"),
                         {"x", "y"})


class DashboardMetricsTest(unittest.TestCase):
    def test_every_metric_of_dashboard_and_alerts_exists(self):
        emulator = Emulator()
        self.addCleanup(emulator.cleanup)
        server = harness.SbxServer(SERVER, pool="dash", warm=5,
                                   extra=["--kubeconfig", emulator.kubeconfig])
        self.addCleanup(server.cleanup)
        channel = grpc.insecure_channel(server.target)
        self.addCleanup(channel.close)
        from sbx.v1 import claims_pb2, claims_pb2_grpc
        claims = claims_pb2_grpc.ClaimServiceStub(channel)
        harness.wait_for(lambda: harness.value(harness.parse_metrics(server.scrape())[1],
                                               "sbx_pool_warm_sandboxes", pool="dash") == 5,
                         60, "the pool to fill")
        for i in range(10):
            c = claims.Claim(claims_pb2.ClaimRequest(pool="dash"), timeout=30).claim
            claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id), timeout=30)
        with self.assertRaises(grpc.RpcError):
            claims.Claim(claims_pb2.ClaimRequest(pool="missing"), timeout=30)
        # The Sandbox controller has listed and watched through the client by now.
        types, samples = harness.wait_for(
            lambda: (lambda t: t if any(n == "sbx_k8s_requests_total" for n, _, _ in t[1])
                     else None)(harness.parse_metrics(server.scrape())),
            60, "Kubernetes client metrics")

        def exists(name):
            if name in types:
                return True
            for suffix in SUFFIXES:
                base = name[:-len(suffix)]
                if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
                    return True
            return False

        dash = os.path.join(SOURCE, "charts", "sbx", "dashboards", "sbx.json")
        alerts = os.path.join(SOURCE, "charts", "sbx", "files", "alerts.yaml")
        used = {}
        for source, exprs in (("dashboard", dashboard_exprs(dash)),
                              ("alerts", alert_exprs(alerts))):
            self.assertTrue(exprs, "no expressions found in the " + source)
            for expr in exprs:
                for name in metric_names(expr):
                    used.setdefault(name, set()).add(source)
        self.assertGreaterEqual(len(used), 10)
        missing = sorted("%s (%s)" % (n, ", ".join(sorted(s))) for n, s in used.items()
                         if not exists(n))
        self.assertEqual(missing, [], "metrics used but not exported by sbx-server")
        # The families the panels are about are there with samples, not only declared.
        for name in ("sbx_claims_total", "sbx_claim_latency_seconds_bucket",
                     "sbx_pool_warm_sandboxes", "sbx_store_commit_duration_seconds_bucket",
                     "sbx_k8s_requests_total", "sbx_build_info"):
            self.assertIsNotNone(harness.value(samples, name), name)
        sys.stderr.write("  %d metric names checked: %s\n" % (len(used), " ".join(sorted(used))))


class AlertRulesTest(unittest.TestCase):
    def test_promtool_accepts_the_rules(self):
        with open(os.path.join(SOURCE, "charts", "sbx", "files", "alerts.yaml")) as f:
            groups = yaml.safe_load(f)
        self.assertIsInstance(groups, list)
        names = {r["alert"] for g in groups for r in g["rules"]}
        self.assertEqual(names, {"SbxPoolExhausted", "SbxPoolCeilingHoldsClaims",
                                 "SbxClaimLatencyHigh",
                                 "SbxKubernetesApiErrors", "SbxStoreCommitSlow",
                                 "SbxStoreNotWritable", "SbxStoreDiskLow"})
        for g in groups:
            for r in g["rules"]:
                self.assertIn(r["labels"].get("severity"), ("warning", "critical"), r["alert"])
                self.assertTrue(r["annotations"].get("summary"), r["alert"])
                self.assertTrue(r["annotations"].get("description"), r["alert"])
        d = tempfile.mkdtemp(prefix="sbx-rules-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "rules.yaml")
        with open(path, "w") as f:
            yaml.safe_dump({"groups": groups}, f)
        r = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("7 rules found", r.stdout + r.stderr)

    def test_ceiling_alert_fires_only_while_claims_wait(self):
        # promtool's rule unit tests: pool a is held at its ceiling with claims waiting,
        # pool b is at its ceiling with none waiting, pool c has claims waiting below it.
        with open(os.path.join(SOURCE, "charts", "sbx", "files", "alerts.yaml")) as f:
            groups = yaml.safe_load(f)
        d = tempfile.mkdtemp(prefix="sbx-rules-")
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(d, "rules.yaml"), "w") as f:
            yaml.safe_dump({"groups": groups}, f)
        series = []
        for pool, ceiling, waiting in (("a", 1, 7), ("b", 1, 0), ("c", 0, 7)):
            series.append({"series": 'sbx_pool_target_reason{pool="%s",reason="ceiling"}' % pool,
                           "values": "%dx10" % ceiling})
            series.append({"series": 'sbx_pool_waiting_claims{pool="%s"}' % pool,
                           "values": "%dx10" % waiting})
        tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "input_series": series,
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "SbxPoolCeilingHoldsClaims", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "SbxPoolCeilingHoldsClaims", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "pool": "a"},
                    "exp_annotations": {
                        "summary": "sbx pool a is held at its ceiling while claims wait",
                        "description": None}}]}]}]}
        # The description is long prose; compare it as the rule renders it.
        rule = next(r for g in groups for r in g["rules"]
                    if r["alert"] == "SbxPoolCeilingHoldsClaims")
        desc = rule["annotations"]["description"].replace("{{ $labels.pool }}", "a")
        desc = desc.replace("{{ $value | humanize }}", "7")
        tests["tests"][0]["alert_rule_test"][1]["exp_alerts"][0]["exp_annotations"][
            "description"] = desc
        with open(os.path.join(d, "tests.yaml"), "w") as f:
            yaml.safe_dump(tests, f)
        r = subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], capture_output=True,
                           text=True, timeout=60, cwd=d)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: dashboard_test.py SBX_SERVER KUBE_EMULATOR PROJECT_SOURCE_DIR")
    SERVER, EMULATOR, SOURCE = sys.argv[1], sys.argv[2], sys.argv[3]
    harness.generate_stubs(os.path.join(SOURCE, "proto"))
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:])
