"""Reinforcement-learning environments from one prepared sandbox: claim one sandbox of a
pool, prepare it with a command, snapshot it, fork N environments from the snapshot, and
run episodes in each (one command per step), resetting the environment to the snapshot
between episodes. Prints episodes per second. Everything claimed is released at the end,
on an error, or on Ctrl-C (the snapshot is deleted too unless --keep-snapshot).

    python3 rl_fork.py img --prepare 'echo 0 > /tmp/score' \\
        --step 'echo $STEP >> /tmp/score' --envs 64 --episodes 10 --steps 5

The server and token come from $SBX_SERVER and $SBX_TOKEN (as the `sbx` CLI). Each step
sees ENV_INDEX, EPISODE and STEP in its environment. Snapshots need a local server
(bubblewrap runtime).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import List, Optional

import sbx


def run_env(index: int, env: sbx.Sandbox, snapshot: sbx.Snapshot, args: argparse.Namespace,
            stop: threading.Event, done: List[int]) -> None:
    """Episodes in one environment: `args.steps` commands, then a reset to the snapshot."""
    for episode in range(args.episodes):
        if stop.is_set():
            return
        for step in range(args.steps):
            r = env.exec(args.step, env={"ENV_INDEX": str(index), "EPISODE": str(episode),
                                         "STEP": str(step)}, timeout=args.step_timeout)
            if r.exit_code != 0 and not stop.is_set():
                raise RuntimeError(f"env {index} episode {episode} step {step}: exit "
                                   f"{r.exit_code}: {r.stderr.strip()[-500:]}")
        done[index] += 1
        if stop.is_set():
            return
        env.reset(snapshot)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pool", help="the pool to claim the environment from")
    p.add_argument("--prepare", default="true", help="command preparing the environment")
    p.add_argument("--step", default="true", help="command of one step of an episode")
    p.add_argument("--envs", type=int, default=64, help="environments forked (default 64)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per environment")
    p.add_argument("--steps", type=int, default=1, help="steps per episode")
    p.add_argument("--step-timeout", type=float, default=60.0, help="seconds per step")
    p.add_argument("--keep-snapshot", action="store_true",
                   help="do not delete the snapshot at the end")
    args = p.parse_args(argv)
    if args.envs < 1 or args.episodes < 1 or args.steps < 1:
        p.error("--envs, --episodes and --steps must be at least 1")

    stop = threading.Event()
    client = sbx.Client(timeout=120)
    source: Optional[sbx.Sandbox] = None
    forks: Optional[sbx.SandboxGroup] = None
    snapshot: Optional[sbx.Snapshot] = None
    interrupted = False
    try:
        source = client.claim(args.pool, ttl=3600)
        print(f"claimed {source.claim_id} from {source.pool}", flush=True)
        r = source.exec(args.prepare, timeout=args.step_timeout)
        if r.exit_code != 0:
            raise RuntimeError(f"--prepare exited {r.exit_code}: {r.stderr.strip()[-500:]}")
        snapshot = source.snapshot(name="rl_fork", labels={"example": "rl_fork"})
        print(f"snapshot {snapshot.id} ({snapshot.size_bytes} bytes)", flush=True)
        # The source is not needed any more: only its snapshot is.
        source.release()
        forks = client.fork(snapshot, args.envs, ttl=3600, labels={"example": "rl_fork"})
        print(f"forked {len(forks)} environments (batch {forks.batch_id})", flush=True)

        done = [0] * len(forks)
        start = time.monotonic()
        print("running episodes", flush=True)
        with ThreadPoolExecutor(len(forks)) as pool:
            futures = [pool.submit(run_env, i, env, snapshot, args, stop, done)
                       for i, env in enumerate(forks)]
            try:
                while True:  # short waits, so that Ctrl-C is seen at once
                    finished, pending = wait(futures, timeout=0.5,
                                             return_when=FIRST_EXCEPTION)
                    if not pending or any(f.exception() for f in finished):
                        break
                for f in futures:
                    if f.done() and f.exception():
                        raise f.exception()  # type: ignore[misc]
            except BaseException:
                stop.set()
                # Release now: the calls in flight end with the claims, so the threads
                # stop instead of finishing their step.
                _release(forks)
                raise
        elapsed = time.monotonic() - start
        total = sum(done)
        print(f"{total} episodes in {elapsed:.2f} s: {total / elapsed:.2f} episodes/s",
              flush=True)
        return 0
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: releasing everything", file=sys.stderr, flush=True)
        return 130
    finally:
        stop.set()
        _release(forks)
        if source is not None:
            _release(source)
        if snapshot is not None and not args.keep_snapshot:
            try:
                client.snapshots.delete(snapshot)
            except sbx.SbxError as e:
                print(f"deleting snapshot {snapshot.id}: {e}", file=sys.stderr)
        client.close()
        if not interrupted:
            print("released", flush=True)


def _release(what) -> None:
    if what is None:
        return
    try:
        what.release()
    except sbx.SbxError as e:
        print(f"release: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
