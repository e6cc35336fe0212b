#!/usr/bin/python3
"""sbx-loadgen against a real sbx-server with the instant runtime.

Runs each workload briefly (open and closed loop, --json) and checks the structure of the
output and that operations completed without errors; checks that bad flags and an
unreachable server are refused with a message. Never asserts on timing.

Usage: loadgen_test.py PATH_TO_SBX_LOADGEN PATH_TO_SBX_SERVER
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

LOADGEN = None
SERVER = None

CONFIG = """\
templates:
  - name: lg
    runtime: local
    local:
      network: false
pools:
  - name: lg
    template: lg
    min_warm: 200
    max_warm: 200
    empty_pool_policy: wait
    default_wait: 20s
"""

LATENCY_KEYS = {"count", "min", "mean", "p50", "p90", "p99", "p99_9", "max"}
RESULT_KEYS = {"workload", "started", "ok", "failed", "warmup_ok", "warmup_failed", "elapsed_s",
               "throughput_ops_per_s", "started_per_s", "latency_us", "errors", "cleanup"}


class LoadgenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-loadgen-test-")
        config = os.path.join(cls.dir, "config.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)
        port_file = os.path.join(cls.dir, "port")
        cls.log = open(os.path.join(cls.dir, "server.log"), "w+")
        cls.server = subprocess.Popen(
            [SERVER, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", f"--port_file={port_file}",
             f"--data_dir={os.path.join(cls.dir, 'data')}", "--runtime=instant",
             f"--config={config}", "--refill_qps=100000"],
            cwd=cls.dir, stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline and not os.path.exists(port_file):
            if cls.server.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(port_file):
            cls.tearDownClass()
            raise RuntimeError("sbx-server did not start")
        with open(port_file) as f:
            cls.address = f"127.0.0.1:{int(f.read().strip())}"

    @classmethod
    def tearDownClass(cls):
        if cls.server.poll() is None:
            cls.server.send_signal(signal.SIGTERM)
            try:
                cls.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                cls.server.kill()
                cls.server.wait()
        cls.log.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def loadgen(self, *args, timeout=40):
        return subprocess.run([LOADGEN, f"--server={self.address}", *args], cwd=self.dir,
                              capture_output=True, text=True, timeout=timeout)

    def run_json(self, *args):
        r = self.loadgen("--json", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stdout)
        return json.loads(lines[0])

    def check_result(self, result, workload):
        self.assertEqual(RESULT_KEYS - set(result), set(), result)
        self.assertEqual(result["workload"], workload)
        self.assertEqual(result["errors"], [], result["errors"])
        self.assertEqual(result["failed"], 0)
        self.assertEqual(result["warmup_failed"], 0)
        self.assertGreater(result["ok"], 0)
        self.assertEqual(result["started"], result["ok"] + result["failed"])
        lat = result["latency_us"]
        self.assertEqual(set(lat), LATENCY_KEYS)
        self.assertEqual(lat["count"], result["ok"])
        self.assertTrue(0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"]
                        <= lat["max"], lat)
        self.assertGreater(result["throughput_ops_per_s"], 0)
        self.assertEqual(result["cleanup"]["errors"], [])

    def test_ping_closed_loop(self):
        out = self.run_json("--workload=ping", "--concurrency=4", "--connections=2",
                            "--duration=1s", "--warmup=200ms", "--timeline")
        self.assertEqual(set(out), {"settings", "result", "baseline", "ratio"})
        s = out["settings"]
        self.assertEqual((s["mode"], s["workload"], s["concurrency"], s["connections"]),
                         ("closed", "ping", 4, 2))
        self.assertEqual(s["duration_s"], 1.0)
        self.assertIsNone(out["baseline"])
        self.assertIsNone(out["ratio"])
        self.check_result(out["result"], "ping")
        self.assertNotIn("send_lag_us", out["result"])
        # --timeline: the measured operations, second by second.
        timeline = out["result"]["timeline"]
        self.assertGreaterEqual(len(timeline), 1)
        self.assertEqual([t["second"] for t in timeline], list(range(len(timeline))))
        self.assertEqual(sum(t["ok"] for t in timeline), out["result"]["ok"])

    def test_claim_open_loop_releases_every_claim(self):
        out = self.run_json("--workload=claim", "--pool=lg", "--rate=100", "--duration=1s",
                            "--warmup=200ms", "--arrival=poisson")
        self.assertEqual((out["settings"]["mode"], out["settings"]["arrival"]),
                         ("open", "poisson"))
        r = out["result"]
        self.check_result(r, "claim")
        # Every claim, warm-up included, was released afterwards, outside the measured time.
        self.assertEqual(r["cleanup"]["releases"], r["ok"] + r["warmup_ok"])
        self.assertEqual(set(r["send_lag_us"]), LATENCY_KEYS)
        self.assertEqual(r["throttled"], 0)

    def test_keep_claims_releases_nothing(self):
        out = self.run_json("--workload=claim", "--pool=lg", "--concurrency=2", "--requests=20",
                            "--warmup=0", "--keep_claims")
        self.check_result(out["result"], "claim")
        self.assertEqual(out["result"]["ok"], 20)
        self.assertEqual(out["result"]["cleanup"]["releases"], 0)
        self.assertFalse(out["settings"]["release_claims"])

    def test_claim_release_closed_loop_with_baseline_stops_at_requests(self):
        out = self.run_json("--workload=claim-release", "--pool=lg", "--concurrency=4",
                            "--requests=200", "--warmup=0", "--baseline")
        self.check_result(out["baseline"], "ping")
        self.check_result(out["result"], "claim-release")
        self.assertEqual(out["baseline"]["started"], 200)
        self.assertEqual(out["result"]["started"], 200)
        self.assertEqual(out["result"]["cleanup"]["releases"], 0)
        ratio = out["ratio"]
        self.assertEqual(ratio["kind"], "throughput")
        self.assertGreater(ratio["throughput"], 0)

    def test_requests_that_run_out_before_the_duration_end_the_window(self):
        # 50 pings take far less than 30 s: the throughput is over the time they took, not
        # over the whole --duration (which would report under 2 ops/s).
        out = self.run_json("--workload=ping", "--concurrency=2", "--requests=50",
                            "--duration=30s", "--warmup=0")
        r = out["result"]
        self.assertEqual(r["ok"], 50)
        self.assertLess(r["elapsed_s"], 30)
        self.assertAlmostEqual(r["throughput_ops_per_s"], r["ok"] / r["elapsed_s"], delta=1e-6 *
                               r["throughput_ops_per_s"])

    def test_claim_release_open_loop_with_baseline(self):
        out = self.run_json("--workload=claim-release", "--pool=lg", "--rate=100",
                            "--connections=2", "--duration=1s", "--warmup=100ms", "--baseline")
        self.check_result(out["baseline"], "ping")
        self.check_result(out["result"], "claim-release")
        self.assertEqual(out["ratio"]["kind"], "latency")
        self.assertGreater(out["ratio"]["p50"], 0)

    def test_claim_exec_counts_every_operation(self):
        # SandboxService may refuse Exec on instant sandboxes (or not exist yet): whatever
        # happens, every operation is either OK or counted under an error code.
        out = self.run_json("--workload=claim-exec", "--pool=lg", "--concurrency=2",
                            "--requests=10", "--warmup=0")
        r = out["result"]
        self.assertEqual(r["started"], 10)
        self.assertEqual(r["ok"] + r["failed"], 10)
        self.assertEqual(sum(e["count"] for e in r["errors"]), r["failed"])
        for e in r["errors"]:
            self.assertEqual(set(e), {"rpc", "code", "count", "example"})
            self.assertIn(e["rpc"], {"Claim", "Exec"})
        # Each successful claim was released, whether its Exec worked or not.
        claim_errors = sum(e["count"] for e in r["errors"] if e["rpc"] == "Claim")
        self.assertEqual(r["cleanup"]["releases"], 10 - claim_errors)

    def test_unknown_pool_is_counted_by_code(self):
        out = self.run_json("--workload=claim", "--pool=nosuch", "--concurrency=1",
                            "--requests=5", "--warmup=0")
        r = out["result"]
        self.assertEqual((r["ok"], r["failed"]), (0, 5))
        self.assertEqual(len(r["errors"]), 1)
        e = r["errors"][0]
        self.assertEqual((e["rpc"], e["code"], e["count"]), ("Claim", "NOT_FOUND", 5))
        self.assertIn("nosuch", e["example"])

    def test_text_output(self):
        r = self.loadgen("--workload=ping", "--rate=50", "--duration=500ms", "--warmup=0",
                         "--baseline")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok ops/s", r.stdout)
        self.assertIn("p99.9", r.stdout)
        self.assertIn("ratio ping / ping (open loop, latency)", r.stdout)

    def test_bad_flags_are_refused(self):
        cases = [
            (["--workload=nope", "--rate=1"], '"nope"'),
            (["--rate=5", "--concurrency=3"], "exactly one of --rate"),
            (["--duration=1s"], "exactly one of --rate"),
            (["--rate=5", "--duration=soon"], '"soon"'),
            (["--rate=5", "--arrival=bursty"], '"bursty"'),
            (["--concurrency=2", "--connections=0"], "connections 0"),
            (["--no_such_flag"], "--no_such_flag"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                r = self.loadgen(*args, timeout=20)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(message, r.stderr + r.stdout)

    def test_unreachable_server(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        r = subprocess.run([LOADGEN, f"--server=127.0.0.1:{port}", "--rate=10",
                            "--connect_timeout=500ms"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"127.0.0.1:{port}", r.stderr)


if __name__ == "__main__":
    LOADGEN = os.path.abspath(sys.argv.pop(1))
    SERVER = os.path.abspath(sys.argv.pop(1))
    unittest.main()
