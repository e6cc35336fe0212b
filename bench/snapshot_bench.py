#!/usr/bin/env python3
"""Snapshots through sbx-server (issue 37), in one run: CreateSnapshot of a sandbox of an
image with 2 MB and with 200 MB written (half in its root's layer, half in its workspace),
against a Suspend + Resume of the same sandbox (the freeze and thaw alone, the floor under
a snapshot) and a host `cp -a` of the same snapshot's files (the copy alone, no freeze, no
sync, no record). Prints a table; asserts nothing.

  bench/snapshot_bench.py --server build/clang/src/cmd/sbx-server [--rounds 10]

Runs as root (snapshots of image sandboxes need a root server) on loopback, with the image
written offline (tests/images/test_images.py, busybox-static). Each snapshot is deleted
before the next round, so the page cache and the data disk see the same work each time.
Bounded: every call has a deadline and the sandboxes end with the server.
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "e2e"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "images"))
import sbx_e2e  # noqa: E402
import test_images  # noqa: E402

CONFIG = """
templates:
  - name: img
    runtime: local
    local:
      image: "{ref}"
      layer_size_bytes: 536870912
      workspace_size_bytes: 536870912
pools:
  - name: img
    template: img
    min_warm: 1
    max_warm: 2
    empty_pool_policy: wait
    default_wait: 60s
"""
WS = "/run/sbx/workspace"


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def ms(x):
    return f"{x * 1000:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: snapshots of image sandboxes need a root server")
    work = tempfile.mkdtemp(prefix="sbx-snapbench-", dir="/tmp")
    os.chmod(work, 0o755)
    server = None
    try:
        ref = test_images.busybox_image(os.path.join(work, "images", "plain"),
                                        config={"Env": ["PATH=/bin"]})
        config = os.path.join(work, "config.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.format(ref=ref))
        sbx_e2e.generate_stubs(os.path.join(SOURCE, "proto"))
        from sbx.v1 import (claims_pb2, claims_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc,
                            snapshots_pb2, snapshots_pb2_grpc)
        server = sbx_e2e.Server(os.path.abspath(args.server), work, config,
                                extra=["--image_cache_bytes=1000000000",
                                       f"--image_import_dir={work}/images",
                                       "--snapshot_quota_bytes=0", "--log_level=warn"])
        claims = claims_pb2_grpc.ClaimServiceStub(server.channel)
        sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(server.channel)
        snaps = snapshots_pb2_grpc.SnapshotsStub(server.channel)
        rows = []
        for mb in (2, 200):
            c = claims.Claim(claims_pb2.ClaimRequest(pool="img"), timeout=60).claim
            half = mb // 2
            code, out = sbx_e2e.sh(sandboxes, c.claim_id,
                                   f"dd if=/dev/urandom of=/blob bs=1M count={half} "
                                   f"2>/dev/null && dd if=/dev/urandom of={WS}/blob bs=1M "
                                   f"count={mb - half} 2>/dev/null && echo OK", timeout=120)
            assert code == 0, out
            snap_t, freeze_t, cp_t = [], [], []
            size = 0
            for _ in range(args.rounds):
                t = time.perf_counter()
                claims_req = sandboxes_pb2.SuspendRequest(claim_id=c.claim_id)
                sandboxes.Suspend(claims_req, timeout=60)
                sandboxes.Resume(sandboxes_pb2.ResumeRequest(claim_id=c.claim_id), timeout=60)
                freeze_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                s = snaps.CreateSnapshot(snapshots_pb2.CreateSnapshotRequest(
                    claim_id=c.claim_id), timeout=300).snapshot
                snap_t.append(time.perf_counter() - t)
                size = s.size_bytes
                files = os.path.join(work, "data", "snapshots", s.id)
                copy = os.path.join(work, "copy")
                t = time.perf_counter()
                subprocess.run(["cp", "-a", files, copy], check=True)
                cp_t.append(time.perf_counter() - t)
                shutil.rmtree(copy)
                snaps.DeleteSnapshot(snapshots_pb2.DeleteSnapshotRequest(snapshot_id=s.id),
                                     timeout=60)
            claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id), timeout=30)
            rows.append((mb, size, snap_t, freeze_t, cp_t))
        print(f"rounds per size: {args.rounds}; times in ms (p50 / p90 / max)")
        print(f"{'written':>8} {'bytes':>11} | {'CreateSnapshot':>24} | "
              f"{'Suspend+Resume':>22} | {'host cp -a of its files':>24}")
        for mb, size, snap_t, freeze_t, cp_t in rows:
            def cell(v):
                return f"{ms(statistics.median(v))} / {ms(pct(v, 0.9))} / {ms(max(v))}"
            print(f"{mb:>6}MB {size:>11} | {cell(snap_t):>24} | {cell(freeze_t):>22} | "
                  f"{cell(cp_t):>24}")
    finally:
        if server is not None:
            server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
