#!/usr/bin/env python3
"""Fork through sbx-server (issue 37), in one run: Fork of N (default 100) from a snapshot
of a sandbox of an image with 2 MB written (half in its root's layer, half in its
workspace), timed until every fork has answered an exec, against N cold creates of the same
image (a ClaimBatch of N from a pool that keeps none warm, policy COLD: the same refill path
the fork pool takes) timed the same way. Rounds alternate fork and cold, everything
released between them. Also: the data dir's bytes before and after the forks (`du`), the
host's tmpfs pages (Shmem in /proc/meminfo) per fork (a fork's own layers: the snapshot's
files are shared, not copied), and the CPU time the server and everything it starts
(sbx-rootfs, bubblewrap, the daemons) spent per sandbox, from a cpuacct cgroup of the
server's own: on a shared machine that, not the wall time, is what the other jobs cannot
change, and N times it over the CPUs is the floor under the wall time. Prints a table;
asserts nothing.

  bench/fork_bench.py --server build/clang/src/cmd/sbx-server [--count 100] [--rounds 3]
                      [--snapshot_mb 2]

Runs as root (sandboxes of an image need a root server) on loopback, with the image written
offline (tests/images/test_images.py, busybox-static). Bounded: every call has a deadline
and the sandboxes end with the server.
"""
import argparse
import concurrent.futures
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
      layer_size_bytes: 268435456
      workspace_size_bytes: 268435456
pools:
  - name: img
    template: img
    min_warm: 1
    max_warm: 1
    empty_pool_policy: wait
    default_wait: 60s
  - name: cold
    template: img
    min_warm: 0
    max_warm: 1000
    empty_pool_policy: cold
    default_wait: 300s
"""
WS = "/run/sbx/workspace"


def shmem_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


CPUACCT = "/sys/fs/cgroup/cpuacct"


class CpuAccount:
    """A cpuacct cgroup (v1) for the server: its processes and what they start stay in it
    (the runtime moves sandboxes into memory, pids and freezer cgroups only)."""

    def __init__(self, name):
        self.dir = os.path.join(CPUACCT, name) if os.path.isdir(CPUACCT) else None
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)

    def add(self, pid):
        if self.dir:
            with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    def seconds(self):
        if not self.dir:
            return float("nan")
        with open(os.path.join(self.dir, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9

    def remove(self):
        if not self.dir:
            return
        deadline = time.monotonic() + 10
        while True:  # processes that are still ending keep the folder busy for a moment
            try:
                with open(os.path.join(self.dir, "cgroup.procs")) as f:
                    pids = f.read().split()
                for pid in pids:  # back to the root group, so the folder can go
                    with open(os.path.join(CPUACCT, "cgroup.procs"), "w") as f:
                        f.write(pid)
                os.rmdir(self.dir)
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    print(f"cpuacct cgroup {self.dir} left: {e}", file=sys.stderr)
                    return
                time.sleep(0.1)


def du_bytes(path):
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--snapshot_mb", type=int, default=2,
                    help="MiB written before the snapshot, half in the root, half in the workspace")
    args = ap.parse_args()
    half = max(args.snapshot_mb // 2, 1)
    if os.geteuid() != 0:
        sys.exit("run as root: sandboxes of an image need a root server")
    work = tempfile.mkdtemp(prefix="sbx-forkbench-", dir="/tmp")
    os.chmod(work, 0o755)
    server = None
    cpu = CpuAccount(f"sbx-forkbench-{os.getpid()}")
    try:
        ref = test_images.busybox_image(os.path.join(work, "images", "plain"),
                                        config={"Env": ["PATH=/bin"]})
        config = os.path.join(work, "config.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.format(ref=ref))
        sbx_e2e.generate_stubs(os.path.join(SOURCE, "proto"))
        from sbx.v1 import (claims_pb2, claims_pb2_grpc, sandboxes_pb2_grpc, snapshots_pb2,
                            snapshots_pb2_grpc)
        server = sbx_e2e.Server(os.path.abspath(args.server), work, config,
                                extra=["--image_cache_bytes=1000000000",
                                       f"--image_import_dir={work}/images",
                                       "--snapshot_quota_bytes=0", "--log_level=warn"])
        cpu.add(server.proc.pid)
        claims = claims_pb2_grpc.ClaimServiceStub(server.channel)
        sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(server.channel)
        snaps = snapshots_pb2_grpc.SnapshotsStub(server.channel)
        src = claims.Claim(claims_pb2.ClaimRequest(pool="img"), timeout=120).claim
        code, out = sbx_e2e.sh(sandboxes, src.claim_id,
                               f"dd if=/dev/urandom of=/blob bs=1M count={half} 2>/dev/null && "
                               f"dd if=/dev/urandom of={WS}/blob bs=1M count={half} 2>/dev/null && "
                               f"echo OK", timeout=120)
        assert code == 0, out
        snap = snaps.CreateSnapshot(snapshots_pb2.CreateSnapshotRequest(claim_id=src.claim_id),
                                    timeout=300).snapshot
        claims.Release(claims_pb2.ReleaseRequest(claim_id=src.claim_id), timeout=30)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=16)

        def exec_all(ids):
            def one(cid):
                code, out = sbx_e2e.sh(sandboxes, cid, "test -e /blob || echo none; echo up",
                                       timeout=120)
                assert code == 0, out
                return out
            return list(pool.map(one, ids))

        def release_all(ids):
            list(pool.map(lambda cid: claims.Release(claims_pb2.ReleaseRequest(claim_id=cid),
                                                     timeout=60), ids))
            # The runtime deletes released sandboxes after the answer: wait for it so the
            # next round starts on an idle machine.
            def settled():
                left = [n for n in os.listdir(os.path.join(work, "sb")) if n.startswith("lb-")]
                return len(left) <= 1 or left
            sbx_e2e.wait_for(settled, 120, "released sandboxes to go (the warm one stays)")

        data = os.path.join(work, "data")
        fork_t, cold_t, answer_t, fork_cpu, cold_cpu = [], [], [], [], []
        disk_per_fork, shm_per_fork = [], []
        for r in range(args.rounds):
            # Fork N.
            du0, shm0 = du_bytes(data), shmem_bytes()
            c0 = cpu.seconds()
            t = time.perf_counter()
            resp = snaps.Fork(snapshots_pb2.ForkRequest(snapshot_id=snap.id, count=args.count,
                                                        batch_id=f"fork-{r}"), timeout=600)
            answered = time.perf_counter() - t
            ids = [c.claim_id for c in resp.claims]
            outs = exec_all(ids)
            fork_t.append(time.perf_counter() - t)
            fork_cpu.append((cpu.seconds() - c0) / args.count)
            answer_t.append(answered)
            assert all(o == "up\n" for o in outs), outs[:3]
            disk_per_fork.append((du_bytes(data) - du0) / args.count)
            shm_per_fork.append((shmem_bytes() - shm0) / args.count)
            release_all(ids)
            # N cold creates.
            c0 = cpu.seconds()
            t = time.perf_counter()
            resp = claims.ClaimBatch(claims_pb2.ClaimBatchRequest(
                pool="cold", count=args.count, batch_id=f"cold-{r}"), timeout=600)
            ids = [c.claim_id for c in resp.claims]
            outs = exec_all(ids)
            cold_t.append(time.perf_counter() - t)
            cold_cpu.append((cpu.seconds() - c0) / args.count)
            assert all(o == "none\nup\n" for o in outs), outs[:3]
            release_all(ids)
        print(f"{args.count} sandboxes of one image per round, {args.rounds} rounds alternating; "
              f"snapshot of {snap.size_bytes} bytes ({half} MiB layer + {half} MiB workspace)")
        print(f"{'':34} {'median':>9} {'min':>9} {'max':>9}")
        for name, v in ((f"Fork {args.count}, until all exec'd (s)", fork_t),
                        ("  of which Fork answered (s)", answer_t),
                        (f"{args.count} cold creates, until all exec'd (s)", cold_t)):
            print(f"{name:34} {statistics.median(v):9.3f} {min(v):9.3f} {max(v):9.3f}")
        for name, v in (("CPU s per fork (server + sandboxes)", fork_cpu),
                        ("CPU s per cold create", cold_cpu)):
            print(f"{name:34} {statistics.median(v):9.4f} {min(v):9.4f} {max(v):9.4f}")
        print(f"data dir bytes per fork: {statistics.median(disk_per_fork):.0f} "
              f"(du -sb before/after; the snapshot itself is {snap.size_bytes})")
        print(f"host tmpfs (Shmem) bytes per fork: {statistics.median(shm_per_fork):.0f} "
              f"(the fork's own layers and tmpfs files; the snapshot's files are shared)")
        snaps.DeleteSnapshot(snapshots_pb2.DeleteSnapshotRequest(snapshot_id=snap.id), timeout=60)
    finally:
        if server is not None:
            server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(work)
        cpu.remove()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
