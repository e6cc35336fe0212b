#!/usr/bin/python3
"""sbx-server scraped by a real Prometheus (Debian's /usr/bin/prometheus).

Starts sbx-server (instant runtime, one pool) and a Prometheus of its own on loopback
(temporary storage, a generated config scraping sbx-server every second), makes a known
number of claims and releases, then asks Prometheus' HTTP API until the data is in
(bounded waits): the claim counters moved by exactly what the test did, the 99th
percentile of claim latency is a finite positive number, and the pool gauges equal what
the server itself reports (AdminService.GetPool). Asserts no timing.

Usage: prometheus_test.py SBX_SERVER PROTO_DIR
"""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.parse
import urllib.request

import grpc

import harness

SERVER = None
PROMETHEUS = "/usr/bin/prometheus"
CLAIMS = 200
POOL = "prom"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server on loopback scraping one target every second."""

    def __init__(self, target_port):
        self.dir = tempfile.mkdtemp(prefix="sbx-prometheus-test-")
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: sbx\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:%d']\n" % target_port)
        self.log_path = os.path.join(self.dir, "prometheus.log")
        self._log = open(self.log_path, "wb")
        # A free port can be taken between the probe and the bind; then try another.
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [PROMETHEUS, "--config.file=" + config,
                 "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
                 "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"],
                cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
            try:
                harness.wait_for(lambda: self.ready() or self.proc.poll() is not None, 60,
                                 "prometheus to be ready")
            except AssertionError:
                harness.stop(self.proc)
                raise
            if self.proc.poll() is None:
                return
        raise AssertionError("prometheus did not start:\n" + self.log_text())

    def ready(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port,
                                        timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def log_text(self):
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-4000:]

    def query(self, expr):
        """The instant vector of `expr` as [(labels, float)]."""
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (
            self.port, urllib.parse.urlencode({"query": expr}))
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise AssertionError("query %r failed: %r" % (expr, body))
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def scalar(self, expr):
        """The one value of `expr`, or None while it has no sample."""
        result = self.query(expr)
        return result[0][1] if len(result) == 1 else None

    def cleanup(self):
        harness.stop(self.proc)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrometheusTest(unittest.TestCase):
    def setUp(self):
        self.server = harness.SbxServer(SERVER, pool=POOL, warm=20)
        self.addCleanup(self.server.cleanup)
        self.prom = Prometheus(self.server.metrics_port)
        self.addCleanup(self.prom.cleanup)
        self.channel = grpc.insecure_channel(self.server.target)
        self.addCleanup(self.channel.close)
        from sbx.v1 import admin_pb2_grpc, claims_pb2_grpc
        self.claims = claims_pb2_grpc.ClaimServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def pool_status(self):
        from sbx.v1 import admin_pb2
        return self.admin.GetPool(admin_pb2.GetPoolRequest(name=POOL), timeout=10).pool.status

    def value_in_prometheus(self, expr, want, what):
        harness.wait_for(lambda: self.prom.scalar(expr) == want, 60,
                         "%s in Prometheus to be %s (query %s)" % (what, want, expr), 0.25)

    def test_claims_latency_and_pool_gauges(self):
        from sbx.v1 import claims_pb2
        # The target is up and every counter of the pool has been scraped before any claim.
        harness.wait_for(lambda: self.prom.scalar('up{job="sbx"}') == 1.0, 60, "sbx to be up")
        harness.wait_for(lambda: self.pool_status().warm == 20, 60, "the pool to fill")
        ok_expr = 'sum(sbx_claims_total{pool="%s",result="ok"})' % POOL
        released_expr = 'sum(sbx_claims_ended_total{pool="%s",reason="released"})' % POOL
        calls_expr = 'sum(sbx_grpc_requests_total{method="Claim",code="OK"})'
        self.value_in_prometheus(ok_expr, 0.0, "granted claims before the test")
        self.value_in_prometheus(released_expr, 0.0, "released claims before the test")

        # A known number of claims and releases, one after the other over a few seconds.
        for i in range(CLAIMS):
            claim = self.claims.Claim(claims_pb2.ClaimRequest(pool=POOL, claim_id="c%d" % i),
                                      timeout=30).claim
            self.claims.Release(claims_pb2.ReleaseRequest(claim_id=claim.claim_id), timeout=30)

        self.value_in_prometheus(ok_expr, float(CLAIMS), "granted claims")
        self.value_in_prometheus(released_expr, float(CLAIMS), "released claims")
        self.value_in_prometheus(calls_expr, float(CLAIMS), "Claim calls with status OK")
        self.value_in_prometheus(
            'sum(sbx_claim_latency_seconds_count{pool="%s"})' % POOL, float(CLAIMS),
            "observations of claim latency")

        p99_expr = ('histogram_quantile(0.99, sum by (le) '
                    '(rate(sbx_claim_latency_seconds_bucket{pool="%s"}[1m])))' % POOL)
        p99 = harness.wait_for(
            lambda: (lambda v: v if v is not None and math.isfinite(v) and v > 0 else None)(
                self.prom.scalar(p99_expr)), 60, "a finite p99 of claim latency", 0.25)
        self.assertGreater(p99, 0.0)
        self.assertTrue(math.isfinite(p99))
        self.assertLessEqual(p99, 5.0)  # within the histogram's finite buckets
        sys.stderr.write("  claim latency p99 from Prometheus: %.6f s\n" % p99)

        # Quiet now: the pool refills to its target; Prometheus must then show what the
        # server says.
        harness.wait_for(lambda: (lambda s: s.warm == s.target and s.claimed == 0)(
            self.pool_status()), 60, "the pool to refill")
        status = self.pool_status()
        for metric, want in [("sbx_pool_warm_sandboxes", status.warm),
                             ("sbx_pool_claimed_sandboxes", status.claimed),
                             ("sbx_pool_target_sandboxes", status.target),
                             ("sbx_pool_waiting_claims", status.waiting_claims)]:
            self.value_in_prometheus('%s{pool="%s"}' % (metric, POOL), float(want), metric)
        # The store and refill families are scraped too.
        self.assertGreater(self.prom.scalar("sbx_store_commits_total"), 0)
        self.assertGreaterEqual(self.prom.scalar("sbx_refill_creates_succeeded_total"),
                                20 + CLAIMS - 1)
        self.assertEqual(self.prom.scalar('sbx_build_info{job="sbx"}'), 1.0)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: prometheus_test.py SBX_SERVER PROTO_DIR")
    SERVER = sys.argv[1]
    harness.generate_stubs(sys.argv[2])
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:])
