#!/usr/bin/python3
"""The RL loop of issue 37 through the Python SDK: E environments, each running episodes
of one short step (an exec), made usable again after every episode in one of two ways,
alternating in blocks in the same run against the same server:

- reset:   Sandbox.reset(snapshot): the environment rewinds to the prepared snapshot
           (the E environments are forks of that snapshot, Client.fork(snapshot, E));
- claim:   Sandbox.release() + Client.claim(pool) of a warm pool of E sandboxes of the
           same image, then the prepare command (the new sandbox is not prepared).

For each arm it prints episodes per second (episodes over the wall time of that arm's
blocks), the sandbox-seconds spent waiting (over all environments, the time between the
end of an episode's step and the environment being usable again: the reset, or release +
claim + prepare), and p50 / p99 of the reset and of release + claim (prepare apart).
It prints numbers; it does not pass or fail.

    sudo nice /usr/bin/python3 bench/rl_reset_bench.py [--envs 64] [--episodes 200]
        [--block 10] [--durability sync]

Starts build/clang/src/cmd/sbx-server (or $SBX_TEST_SERVER_BIN) as root on 127.0.0.1:0
with a pool "img" of a busybox image written offline (tests/images/test_images.py) kept at
E warm, and stops it (and every sandbox) at the end. Every call has a deadline.
"""

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
import harness  # noqa: E402  (puts clients/python on sys.path)

import sbx  # noqa: E402

POOL = "img"
PREPARE = "mkdir -p /opt/env && echo ready > /opt/env/state && echo 0 > /opt/env/score"
STEP = "echo 1 >> /opt/env/score && test $(wc -l < /opt/env/score) -eq 2"


class Arm:
    def __init__(self, name):
        self.name = name
        self.episodes = 0
        self.wall = 0.0
        self.waiting = 0.0  # sandbox-seconds between an episode's end and usable again
        self.renew = []  # the reset, or release + claim, per episode (seconds)
        self.lock = threading.Lock()

    def add(self, waited, renew):
        with self.lock:
            self.episodes += 1
            self.waiting += waited
            self.renew.append(renew)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def step(env):
    r = env.exec(STEP, timeout=60)
    if r.exit_code != 0:
        raise RuntimeError(f"step failed in {env.claim_id} (exit {r.exit_code}): {r.stderr}"
                           " -- the environment was not fresh")


def reset_block(envs, snap, episodes, arm):
    def one(env):
        for _ in range(episodes):
            step(env)
            t0 = time.monotonic()
            env.reset(snap, timeout=120)
            t = time.monotonic() - t0
            arm.add(t, t)
    run_block(envs, one, arm)


def claim_block(client, envs, episodes, arm):
    def one(i):
        for _ in range(episodes):
            step(envs[i])
            t0 = time.monotonic()
            envs[i].release()
            envs[i] = client.claim(POOL, ttl=3600, wait=120)
            t1 = time.monotonic()
            prepare(envs[i])
            arm.add(time.monotonic() - t0, t1 - t0)
    run_block(range(len(envs)), one, arm)


def run_block(items, fn, arm):
    items = list(items)
    start = time.monotonic()
    with ThreadPoolExecutor(len(items)) as pool:
        for f in [pool.submit(fn, x) for x in items]:
            f.result()
    arm.wall += time.monotonic() - start


def prepare(env):
    r = env.exec(PREPARE, timeout=60)
    if r.exit_code != 0:
        raise RuntimeError(f"prepare failed: {r.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--episodes", type=int, default=200, help="episodes per environment "
                    "and per arm")
    ap.add_argument("--block", type=int, default=10, help="episodes per environment in one "
                    "block; the arms alternate block by block")
    ap.add_argument("--durability", default="sync", choices=["sync", "buffered"])
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("rl_reset_bench.py runs as root (snapshots of image sandboxes)")
    E = args.envs
    srv = harness.image_pool_server(min_warm=E, max_warm=E, auth=False,
                                    durability=args.durability)
    try:
        srv.wait_warm(POOL, E, timeout=600)
        client = sbx.Client(srv.target, timeout=120)
        source = client.claim(POOL, ttl=3600)
        prepare(source)
        snap = source.snapshot(name="rl-bench")
        source.release()
        t0 = time.monotonic()
        forks = client.fork(snap, E, ttl=3600)
        fork_s = time.monotonic() - t0
        claimed = list(client.claim_batch(POOL, E, ttl=3600, wait=600))
        for env in claimed:
            prepare(env)
        srv.wait_warm(POOL, E, timeout=600)
        print(f"{E} environments: fork {E} took {fork_s:.2f} s; {E} claimed from a warm "
              f"pool of {E}; server --durability={args.durability}; "
              f"{os.cpu_count()} CPUs", flush=True)

        reset, claim = Arm("reset"), Arm("release + claim")
        done = 0
        while done < args.episodes:
            n = min(args.block, args.episodes - done)
            reset_block(list(forks), snap, n, reset)
            claim_block(client, claimed, n, claim)
            done += n
            print(f"  {done}/{args.episodes} episodes per environment", flush=True)

        print()
        print(f"| loop ({E} envs x {args.episodes} episodes) | episodes | wall s | "
              "episodes/s | sandbox-s waiting | waiting per episode | p50 | p99 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for arm, what in ((reset, "reset"), (claim, "release + claim")):
            print(f"| {arm.name} | {arm.episodes} | {arm.wall:.1f} | "
                  f"{arm.episodes / arm.wall:.1f} | {arm.waiting:.1f} | "
                  f"{arm.waiting / arm.episodes * 1000:.0f} ms | "
                  f"{pct(arm.renew, 50) * 1000:.0f} ms | {pct(arm.renew, 99) * 1000:.0f} ms |")
        print("\np50/p99: the reset call, or release + claim (the prepare exec apart; it "
              "is in the waiting columns)")

        forks.release()
        for env in claimed:
            env.release()
        client.snapshots.delete(snap)
        client.close()
    except BaseException:
        # What the server said last: why a claim waited, why a create failed.
        print(srv.log_tail(8000), file=sys.stderr)
        raise
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
