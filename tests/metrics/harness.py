"""Shared helpers of the metrics tests: an sbx-server with the instant runtime and its
metrics endpoint on loopback, a scrape parser, and the sbx.v1 stubs.

Every process a test starts is stopped by the test (by its own handle); every folder it
makes is removed.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import sbx_e2e  # noqa: E402  (generate_stubs: the project's sbx.v1 Python stubs)

POOL_CONFIG = """\
templates:
  - name: metrics
    runtime: local
    local:
      network: false
pools:
  - name: {pool}
    template: metrics
    min_warm: {warm}
    max_warm: {warm}
    empty_pool_policy: wait
    default_wait: 20s
"""


def generate_stubs(proto_dir):
    sbx_e2e.generate_stubs(proto_dir)


wait_for = sbx_e2e.wait_for


def stop(proc, sig=signal.SIGTERM, wait=20):
    """Stops a process this test started; SIGKILL if it does not exit in `wait` seconds."""
    if proc is None or proc.poll() is not None:
        return proc.returncode if proc is not None else None
    try:
        proc.send_signal(sig)
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.returncode


class SbxServer:
    """sbx-server on 127.0.0.1 (gRPC and metrics on free ports), instant runtime, one pool."""

    def __init__(self, binary, pool="metrics", warm=20, extra=()):
        self.dir = tempfile.mkdtemp(prefix="sbx-metrics-test-")
        self.pool = pool
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as f:
            f.write(POOL_CONFIG.format(pool=pool, warm=warm))
        self.port_file = os.path.join(self.dir, "port")
        self.metrics_port_file = os.path.join(self.dir, "metrics-port")
        self.stderr_path = os.path.join(self.dir, "server.stderr")
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", f"--port_file={self.port_file}",
             "--metrics_listen=127.0.0.1:0", f"--metrics_port_file={self.metrics_port_file}",
             f"--data_dir={self.dir}/data", "--runtime=instant", f"--config={config}",
             "--refill_qps=100000", "--insecure_no_auth", *extra],
            cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr)
        wait_for(lambda: (os.path.exists(self.port_file) and os.path.exists(self.metrics_port_file))
                 or self.proc.poll() is not None, 60, "sbx-server to serve")
        if self.proc.poll() is not None:
            raise AssertionError("sbx-server exited with %s:\n%s" % (self.proc.returncode,
                                                                     self.stderr_text()))
        with open(self.port_file) as f:
            self.target = "127.0.0.1:" + f.read().strip()
        with open(self.metrics_port_file) as f:
            self.metrics_port = int(f.read().strip())

    def stderr_text(self):
        if not self._stderr.closed:
            self._stderr.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def scrape(self):
        url = "http://127.0.0.1:%d/metrics" % self.metrics_port
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    def stop(self):
        rc = stop(self.proc)
        self._stderr.close()
        return rc

    def cleanup(self):
        self.stop()
        if not os.environ.get("SBX_KEEP_TEST_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text format → ({family: type}, [(sample name, {labels}, value)])."""
    types = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise AssertionError("unparsable metrics line: %r" % line)
        labels = dict(_LABEL.findall(m.group(3) or ""))
        samples.append((m.group(1), labels, float(m.group(4))))
    return types, samples


def value(samples, name, **labels):
    """Sum of the samples named `name` whose labels include `labels`; None if there is none."""
    found = [v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items())]
    return sum(found) if found else None
