#!/usr/bin/env python3
"""Snapshots through sbx-server (issue 37), in one run: CreateSnapshot of a sandbox of an
image with 2 MB and with 200 MB written (half in its root's layer, half in its workspace),
against a Suspend + Resume of the same sandbox (the freeze and thaw alone, the floor under
a snapshot) and a host `cp -a` of the same snapshot's files (the copy alone, no freeze, no
sync, no record). Then Reset (slice 2) of a sandbox to a small snapshot (a few files in
its layer and workspace), next to a Release + warm Claim (what an agent does instead when
it only needs a clean sandbox) and a cold Claim (a sandbox created for the claim), all of
the same image in the same run. Prints tables; asserts nothing.

  bench/snapshot_bench.py --server build/clang/src/cmd/sbx-server [--rounds 10]
      [--reset_rounds 50] [--reset_only]

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
  - name: warm
    template: img
    min_warm: 2
    max_warm: 3
    empty_pool_policy: wait
    default_wait: 60s
  - name: cold
    template: img
    min_warm: 0
    max_warm: 0
    empty_pool_policy: cold
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
    ap.add_argument("--reset_rounds", type=int, default=50)
    ap.add_argument("--reset_only", action="store_true", help="skip the snapshot sizes")
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
        for mb in (() if args.reset_only else (2, 200)):
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
        reset_bench(args, claims, sandboxes, snaps, claims_pb2, snapshots_pb2)
    finally:
        if server is not None:
            server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(work)
        shutil.rmtree(work, ignore_errors=True)


def reset_bench(args, claims, sandboxes, snaps, claims_pb2, snapshots_pb2):
    """Reset to a small snapshot vs. Release + warm Claim vs. a cold Claim, interleaved
    round by round so that the machine's load falls on each alike."""
    c = claims.Claim(claims_pb2.ClaimRequest(pool="warm"), timeout=60).claim
    code, out = sbx_e2e.sh(sandboxes, c.claim_id,
                           f"mkdir -p /opt/app && for i in 1 2 3 4 5 6 7 8; do "
                           f"echo file $i > /opt/app/f$i; echo ws $i > {WS}/f$i; done && "
                           f"dd if=/dev/urandom of={WS}/data bs=1K count=64 2>/dev/null && "
                           f"echo OK", timeout=60)
    assert code == 0, out
    snap = snaps.CreateSnapshot(snapshots_pb2.CreateSnapshotRequest(claim_id=c.claim_id),
                                timeout=120).snapshot
    reset_t, warm_t, cold_t = [], [], []
    for _ in range(args.reset_rounds):
        # The sandbox changed since the snapshot, as an agent's would be.
        sbx_e2e.sh(sandboxes, c.claim_id, f"rm -r /opt/app {WS}/f1; echo x > {WS}/new",
                   timeout=60)
        t = time.perf_counter()
        snaps.Reset(snapshots_pb2.ResetRequest(claim_id=c.claim_id, snapshot_id=snap.id),
                    timeout=60)
        reset_t.append(time.perf_counter() - t)
        w = claims.Claim(claims_pb2.ClaimRequest(pool="warm"), timeout=60).claim
        t = time.perf_counter()
        claims.Release(claims_pb2.ReleaseRequest(claim_id=w.claim_id), timeout=30)
        w = claims.Claim(claims_pb2.ClaimRequest(pool="warm"), timeout=60).claim
        warm_t.append(time.perf_counter() - t)
        claims.Release(claims_pb2.ReleaseRequest(claim_id=w.claim_id), timeout=30)
        t = time.perf_counter()
        k = claims.Claim(claims_pb2.ClaimRequest(pool="cold"), timeout=60).claim
        cold_t.append(time.perf_counter() - t)
        claims.Release(claims_pb2.ReleaseRequest(claim_id=k.claim_id), timeout=30)
        # The warm pool refills between rounds (its refill is not what is measured).
        time.sleep(0.2)
    code, out = sbx_e2e.sh(sandboxes, c.claim_id, f"cat /opt/app/f1 {WS}/f1", timeout=60)
    assert (code, out) == (0, "file 1\nws 1\n"), (code, out)
    claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id), timeout=30)
    snaps.DeleteSnapshot(snapshots_pb2.DeleteSnapshotRequest(snapshot_id=snap.id), timeout=60)
    print(f"\nreset of a sandbox to a snapshot of {snap.size_bytes} bytes, "
          f"{args.reset_rounds} rounds; times in ms (p50 / p99 / max)")
    for name, v in (("Reset", reset_t), ("Release + warm Claim", warm_t),
                    ("cold Claim", cold_t)):
        print(f"{name:>22} | {ms(statistics.median(v))} / {ms(pct(v, 0.99))} / {ms(max(v))}")


if __name__ == "__main__":
    main()
