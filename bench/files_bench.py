#!/usr/bin/python3
"""A 1 GiB upload and download through the Python SDK and sbx-server (issue 35), with the
server's resident memory sampled before, during and after.

    /usr/bin/python3 bench/files_bench.py [--mib 1024]

Starts build/clang/src/cmd/sbx-server (or $SBX_TEST_SERVER_BIN) with the local runtime
(bubblewrap) on 127.0.0.1:0, a template whose workspace holds the file (a tmpfs of
mib + 256 MiB, memory limit mib + 1 GiB: tmpfs pages count against it), claims one
sandbox and, in one run:

1. sb.files.upload of `mib` MiB (generated as it is read: the client holds no copy);
2. sb.files.download of it into a counting, hashing sink;
3. for scale, a local read of the same file inside the sandbox (exec `cat f > /dev/null`).

It prints throughput and sbx-server's RSS (sampled every 10 ms): before, peak during the
upload, peak during the download, after. It does not pass or fail.
"""

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import harness  # noqa: E402,F401  (puts clients/python on sys.path)

import sbx  # noqa: E402
import sbx_e2e  # noqa: E402

CHUNK = 1 << 20


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()
        self.start()

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.01)

    def stop(self):
        self.done.set()
        self.join()
        return self.peak


class Source:
    """`size` bytes of a repeating pattern, made as they are read."""

    def __init__(self, size):
        self.left = size
        self.block = hashlib.sha256(b"sbx").digest() * (CHUNK // 32)
        self.hash = hashlib.sha256()

    def read(self, n):
        n = min(n, self.left, CHUNK)
        self.left -= n
        data = self.block[:n]
        self.hash.update(data)
        return data


class Sink:
    def __init__(self):
        self.n = 0
        self.hash = hashlib.sha256()

    def write(self, data):
        self.n += len(data)
        self.hash.update(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()
    size = args.mib << 20
    server_bin = os.environ.get("SBX_TEST_SERVER_BIN",
                                os.path.join(ROOT, "build", "clang", "src", "cmd", "sbx-server"))
    work = tempfile.mkdtemp(prefix="sbx-files-bench-", dir="/tmp")
    config = os.path.join(work, "config.yaml")
    with open(config, "w") as f:
        f.write(f"""
templates:
  - name: big
    runtime: local
    local:
      network: false
      workspace_size_bytes: {size + (256 << 20)}
      memory_limit_bytes: {size + (1 << 30)}
pools:
  - name: big
    template: big
    min_warm: 1
    max_warm: 1
    empty_pool_policy: wait
    default_wait: 60s
""")
    server = sbx_e2e.Server(server_bin, work, config)
    try:
        with sbx.Client(server.target, timeout=60) as client, client.claim("big") as sb:
            pid = server.proc.pid
            before = rss(pid)
            s = Sampler(pid)
            src = Source(size)
            t0 = time.monotonic()
            sb.files.upload("big.bin", src, timeout=3600)
            up = time.monotonic() - t0
            up_peak = s.stop()
            mid = rss(pid)
            s = Sampler(pid)
            sink = Sink()
            t0 = time.monotonic()
            sb.files.download("big.bin", sink, timeout=3600)
            down = time.monotonic() - t0
            down_peak = s.stop()
            after = rss(pid)
            assert sink.n == size and sink.hash.hexdigest() == src.hash.hexdigest(), \
                "the download differs from the upload"
            t0 = time.monotonic()
            r = sb.exec("cat big.bin > /dev/null", timeout=600)
            local = time.monotonic() - t0
            assert r.exit_code == 0, r
            mib = size / 2**20
            print(f"files_bench: {args.mib} MiB through the Python SDK and sbx-server")
            print(f"  upload   {up:6.2f} s  {mib / up:7.0f} MiB/s")
            print(f"  download {down:6.2f} s  {mib / down:7.0f} MiB/s")
            print(f"  for scale, cat inside the sandbox: {local:6.2f} s  {mib / local:7.0f} MiB/s "
                  "(includes the exec round trip)")
            print(f"  sbx-server RSS: before {before >> 20} MiB, peak during upload "
                  f"{up_peak >> 20} MiB, between {mid >> 20} MiB, peak during download "
                  f"{down_peak >> 20} MiB, after {after >> 20} MiB")
    finally:
        server.stop()
        sbx_e2e.kill_all_with(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
