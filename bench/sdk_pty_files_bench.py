#!/usr/bin/python3
"""Two numbers of issue 35 through the Python SDK, each with its baseline in the same run.

    /usr/bin/python3 bench/sdk_pty_files_bench.py [--keystrokes 1000] [--mib 1024]
                                                  [--rounds 2] [--skip pty|files]

(a) PTY keystroke echo: `sb.pty(cmd=ECHO)` where ECHO puts its terminal in raw mode
    without echo and runs `cat`, so every byte comes back from the program, as a shell's
    line editor echoes a keystroke. One byte is sent (send_input), the time until it comes
    back on the PTY's output stream is one sample; p50/p99 over --keystrokes. Baseline:
    the same command on a local pseudo-terminal (Python's pty.fork on the host), the same
    loop on its master descriptor.

(b) --mib MiB up and down through the Python SDK (sb.files.upload from a local file,
    sb.files.download into a local file), throughput and sbx-server's resident memory
    (VmRSS of /proc/PID/status, sampled every 10 ms) before, peak during each transfer,
    after. Baselines with the same file in the same run: `sbx cp` (the CLI, C++ client,
    same RPCs) both ways, and a plain local copy of the file (shutil.copyfile).

Starts build/clang/src/cmd/sbx-server (or $SBX_TEST_SERVER_BIN) with the local runtime
(bubblewrap) on 127.0.0.1:0, one pool whose workspace holds the file. Prints tables; does
not pass or fail. Everything it starts is stopped at the end.
"""

import argparse
import os
import pty
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402,F401  (puts clients/python on sys.path)

import sbx  # noqa: E402
import sbx_e2e  # noqa: E402
from files_bench import Sampler, rss  # noqa: E402

# The program on the terminal: raw mode, no terminal echo, then cat echoes each byte.
ECHO = ["sh", "-c", "stty raw -echo; printf ready; exec cat"]
KEY = b"k"


def pct(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def sdk_pty_echo(sb, n):
    """Latencies (s) of n keystrokes echoed through sb.pty."""
    p = sb.pty(cols=80, rows=24, cmd=ECHO)
    it = iter(p)
    seen = b""
    while b"ready" not in seen:
        seen += next(it).data
    out = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            p.send_input(KEY)
            got = b""
            while KEY not in got:
                got += next(it).data
            out.append(time.perf_counter() - t0)
    finally:
        p.kill()
        p.detach()
    return out


def local_pty_echo(n):
    """The same on a local pseudo-terminal (pty.fork), reading its master descriptor."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(ECHO[0], ECHO)
    try:
        seen = b""
        while b"ready" not in seen:
            select.select([fd], [], [], 10)
            seen += os.read(fd, 4096)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, KEY)
            got = b""
            while KEY not in got:
                got += os.read(fd, 4096)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)


def timed(server_pid, fn):
    """(seconds, peak RSS during) of fn()."""
    s = Sampler(server_pid)
    t0 = time.monotonic()
    fn()
    took = time.monotonic() - t0
    return took, s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keystrokes", type=int, default=1000)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", choices=["pty", "files"])
    args = ap.parse_args()
    size = args.mib << 20
    bindir = os.path.join(ROOT, "build", "clang", "src", "cmd")
    server_bin = os.environ.get("SBX_TEST_SERVER_BIN", os.path.join(bindir, "sbx-server"))
    cli = os.environ.get("SBX_CLI_BIN", os.path.join(bindir, "sbx"))
    work = tempfile.mkdtemp(prefix="sbx-sdk35-bench-", dir="/tmp")
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
    max_warm: 2
    empty_pool_policy: wait
    default_wait: 60s
""")
    server = sbx_e2e.Server(server_bin, work, config)
    try:
        with sbx.Client(server.target, timeout=60) as client, client.claim("big") as sb:
            print(f"sdk_pty_files_bench: sbx-server {server.target}, load average "
                  f"{os.getloadavg()[0]:.1f}")
            if args.skip != "pty":
                pty_part(sb, args)
            if args.skip != "files":
                files_part(sb, server, cli, work, size, args)
    finally:
        server.stop()
        sbx_e2e.kill_all_with(work)
        shutil.rmtree(work, ignore_errors=True)


def pty_part(sb, args):
    print(f"\n(a) PTY keystroke echo, {args.keystrokes} keystrokes per round, µs")
    print("| round | sb.pty p50 | sb.pty p99 | local pty p50 | local pty p99 |")
    print("|---|---|---|---|---|")
    every_sdk, every_local = [], []
    for r in range(args.rounds):
        local = local_pty_echo(args.keystrokes)
        remote = sdk_pty_echo(sb, args.keystrokes)
        every_sdk += remote
        every_local += local
        print(f"| {r + 1} | {pct(remote, 50) * 1e6:.0f} | {pct(remote, 99) * 1e6:.0f} | "
              f"{pct(local, 50) * 1e6:.0f} | {pct(local, 99) * 1e6:.0f} |")
    print(f"| all | {pct(every_sdk, 50) * 1e6:.0f} | {pct(every_sdk, 99) * 1e6:.0f} | "
          f"{pct(every_local, 50) * 1e6:.0f} | {pct(every_local, 99) * 1e6:.0f} |")
    print(f"  mean: sb.pty {statistics.mean(every_sdk) * 1e6:.0f} µs, "
          f"local {statistics.mean(every_local) * 1e6:.0f} µs")


def files_part(sb, server, cli, work, size, args):
    mib = size >> 20
    src = os.path.join(work, "src.bin")
    with open(src, "wb") as f:  # incompressible, written once
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    pid = server.proc.pid
    env = dict(os.environ, SBX_SERVER=server.target)
    env.pop("SBX_TOKEN", None)

    def cp(a, b):
        subprocess.run([cli, "cp", a, b], env=env, check=True, stdout=subprocess.DEVNULL)

    dst = os.path.join(work, "dst.bin")
    print(f"\n(b) {mib} MiB up and down, MiB/s (sbx-server RSS: before → peak during → after, MiB)")
    print("| round | what | up MiB/s | down MiB/s | RSS up | RSS down |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        for what in ("Python SDK", "sbx cp", "local copy"):
            for p in (dst,):
                if os.path.exists(p):
                    os.unlink(p)
            before = rss(pid)
            if what == "Python SDK":
                up, up_peak = timed(pid, lambda: sb.files.upload("big.bin", src, timeout=3600))
                mid = rss(pid)
                down, down_peak = timed(pid, lambda: sb.files.download("big.bin", dst,
                                                                       timeout=3600))
            elif what == "sbx cp":
                up, up_peak = timed(pid, lambda: cp(src, f"{sb.claim_id}:big.bin"))
                mid = rss(pid)
                down, down_peak = timed(pid, lambda: cp(f"{sb.claim_id}:big.bin", dst))
            else:
                mid_file = os.path.join(work, "mid.bin")
                up, up_peak = timed(pid, lambda: shutil.copyfile(src, mid_file))
                mid = rss(pid)
                down, down_peak = timed(pid, lambda: shutil.copyfile(mid_file, dst))
                os.unlink(mid_file)
            after = rss(pid)
            if subprocess.run(["cmp", "-s", src, dst]).returncode != 0:
                raise SystemExit(f"{what}: what came back differs from the source")
            if what != "local copy":
                sb.files.remove("big.bin")  # the workspace holds one copy
            rss_cols = (f"{before >> 20} → {up_peak >> 20} → {mid >> 20} | "
                        f"{mid >> 20} → {down_peak >> 20} → {after >> 20}")
            if what == "local copy":
                rss_cols = "(not through sbx) | "
            print(f"| {r + 1} | {what} | {mib / up:.0f} | {mib / down:.0f} | {rss_cols} |")


if __name__ == "__main__":
    main()
