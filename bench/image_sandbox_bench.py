#!/usr/bin/env python3
"""Sandboxes of an OCI image against sandboxes on the host's root, through sbx-server, in one
run: warm claim + exec + release from an image pool and from a host-root pool (alternating),
and the disk and memory of N warm members of each. Prints tables; asserts nothing.

  bench/image_sandbox_bench.py --server build/clang/src/cmd/sbx-server [--claims 200]
                               [--members 500]

The image is written offline (tests/images/test_images.py): busybox, this machine's python3
with its libraries, and its /usr/bin/true, so that `exec /usr/bin/true` runs the same
binary on both roots. The server runs as this user (root: a host uid per sandbox) on
loopback, with --image_cache_bytes and the image's folder as import folder. Memory is the
sum of Pss (/proc/PID/smaps_rollup) of every process in a sandbox's freezer cgroup, and of
the bubblewrap parent processes; disk is `du` of the sandboxes' host folders (their layers)
and the image cache. Bounded: each wait has a deadline, the sandboxes end with the server.
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
  - name: host
    runtime: local
    local: {{}}
  - name: img
    runtime: local
    local:
      image: "{ref}"
pools:
  - name: host
    template: host
    min_warm: 4
    max_warm: {max_warm}
    empty_pool_policy: wait
    default_wait: 60s
  - name: img
    template: img
    min_warm: 4
    max_warm: {max_warm}
    empty_pool_policy: wait
    default_wait: 60s
"""


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def du_bytes(paths):
    paths = [p for p in paths if os.path.exists(p)]
    if not paths:
        return 0
    out = subprocess.run(["du", "-sbc", *paths], capture_output=True, text=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def sandbox_pss(sandbox_root):
    """Pss in bytes of the processes of the sandboxes under `sandbox_root`: those in the
    freezer cgroup of one of its sandboxes, and bubblewrap's parent (working in a sandbox's
    folder). Sandboxes of other servers on the machine do not count."""
    ids = {d for d in os.listdir(sandbox_root) if d.startswith("lb-")}
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                groups = {line.rstrip("\n").rsplit("/", 1)[-1] for line in f}
            mine = bool(groups & ids)
            if not mine:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                mine = cwd.startswith(sandbox_root + "/") and \
                    cwd[len(sandbox_root) + 1:].split("/")[0] in ids
            if not mine:
                continue
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--claims", type=int, default=200, help="claims per pool")
    ap.add_argument("--members", type=int, default=500, help="warm members per pool")
    args = ap.parse_args()
    args.server = os.path.abspath(args.server)
    sbx_e2e.generate_stubs(os.path.join(SOURCE, "proto"))
    from sbx.v1 import (admin_pb2, admin_pb2_grpc, claims_pb2, claims_pb2_grpc, images_pb2,
                        images_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc)

    work = tempfile.mkdtemp(prefix="sbx-imgbench-", dir="/tmp")
    os.chmod(work, 0o755)
    server = None
    try:
        ref = test_images.make_image(
            os.path.join(work, "images", "bench"), "bench",
            [test_images.busybox_entries() + test_images.base_entries(),
             test_images.python_entries() +
             [{"name": "usr/bin/true", "type": "file", "from": "/usr/bin/true", "mode": 0o755}]],
            {"Env": ["PATH=/usr/bin:/bin"]})
        config = os.path.join(work, "config.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.format(ref=ref, max_warm=args.members + 8))
        server = sbx_e2e.Server(args.server, work, config, extra=[
            "--image_cache_bytes=4000000000", f"--image_import_dir={work}/images",
            "--refill_qps=200"])
        ch = server.channel
        claims = claims_pb2_grpc.ClaimServiceStub(ch)
        sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(ch)
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        images = images_pb2_grpc.ImageServiceStub(ch)

        def pool(name):
            return admin.GetPool(admin_pb2.GetPoolRequest(name=name), timeout=10).pool

        def set_warm(name, n, deadline_s=600):
            p = pool(name)
            p.min_warm = n
            p.ClearField("status")
            start = time.time()
            admin.PutPool(admin_pb2.PutPoolRequest(pool=p), timeout=30)
            while pool(name).status.warm < n:
                if time.time() - start > deadline_s:
                    raise SystemExit(f"pool {name}: {pool(name).status} after {deadline_s} s")
                time.sleep(0.2)
            return time.time() - start

        for name in ("host", "img"):
            set_warm(name, 4, 120)

        def claim_exec(name):
            t0 = time.perf_counter()
            c = claims.Claim(claims_pb2.ClaimRequest(pool=name), timeout=60).claim
            t1 = time.perf_counter()
            start = sandboxes_pb2.ExecStart(claim_id=c.claim_id, argv=["/usr/bin/true"])
            code = None
            for r in sandboxes.Exec(iter([sandboxes_pb2.ExecRequest(start=start)]), timeout=60):
                if r.WhichOneof("kind") == "exit":
                    code = r.exit.exit_code
            t2 = time.perf_counter()
            if code != 0:
                raise SystemExit(f"exec in pool {name} ended {code}")
            claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id), timeout=60)
            # The pool refills before the next claim (a warm claim, not a wait).
            deadline = time.time() + 60
            while pool(name).status.warm < 4 and time.time() < deadline:
                time.sleep(0.01)
            return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t2 - t0) * 1e3

        samples = {"host": [], "img": []}
        for i in range(args.claims):
            for name in (("host", "img") if i % 2 == 0 else ("img", "host")):
                samples[name].append(claim_exec(name))
        print(f"warm claim + exec /usr/bin/true + release, {args.claims} per pool, alternating "
              "(ms)")
        print("| pool | claim p50 | claim p99 | exec p50 | exec p99 | claim+exec p50 | "
              "claim+exec p99 |")
        print("|---|---|---|---|---|---|---|")
        for name, label in (("host", "host root"), ("img", "image")):
            cols = list(zip(*samples[name]))
            print(f"| {label} | " + " | ".join(
                f"{pct(c, q):.2f}" for c in cols for q in (0.5, 0.99)) + " |")

        root = os.path.join(work, "sb")
        cache = os.path.join(work, "data", "images")

        def live_sandboxes():
            return [os.path.join(root, d) for d in os.listdir(root) if d.startswith("lb-")]

        # The claim pools end first (their warm members are deleted with them), so that
        # only the members measured run.
        for name in ("host", "img"):
            admin.DeletePool(admin_pb2.DeletePoolRequest(name=name), timeout=30)
        deadline = time.time() + 120
        while live_sandboxes() and time.time() < deadline:
            time.sleep(0.2)
        print(f"\n{args.members} warm members of one pool, one pool at a time")
        print("| pool | fill time (s) | sandboxes' folders (du) | per member | image cache (du) "
              "| memory (Pss) | per member |")
        print("|---|---|---|---|---|---|---|")
        for template, label in (("img", "image"), ("host", "host root")):
            name = f"many-{template}"
            p = admin_pb2.Pool(name=name, template=template, min_warm=args.members,
                               max_warm=args.members)
            start = time.time()
            admin.PutPool(admin_pb2.PutPoolRequest(pool=p), timeout=30)
            while pool(name).status.warm < args.members:
                if time.time() - start > 900:
                    raise SystemExit(f"pool {name}: {pool(name).status} after 900 s")
                time.sleep(0.2)
            fill = time.time() - start
            time.sleep(2)  # the last members' daemons settle
            disk = du_bytes(live_sandboxes())
            cache_bytes = du_bytes([cache])
            pss = sandbox_pss(root)
            n = max(1, pool(name).status.warm)
            print(f"| {label} | {fill:.1f} | {disk / 1e6:.1f} MB | {disk / n / 1e3:.1f} kB | "
                  f"{cache_bytes / 1e6:.1f} MB | {pss / 1e6:.0f} MB | {pss / n / 1e6:.2f} MB |")
            admin.DeletePool(admin_pb2.DeletePoolRequest(name=name), timeout=60)
            deadline = time.time() + 300
            while live_sandboxes() and time.time() < deadline:
                time.sleep(0.5)
        listed = images.ListImages(images_pb2.ListImagesRequest(), timeout=10)
        print(f"\nimage cache: {len(listed.images)} image(s), {listed.bytes / 1e6:.1f} MB "
              "(the image unpacked once, shared by every member)")
    finally:
        if server is not None:
            server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
