"""Measures kube-emulator create throughput (prints numbers, asserts nothing).

Usage: python3 bench_creates.py KUBE_EMULATOR_BINARY [PROCESSES] [CREATES_PER_PROCESS] [WATCHERS]
Each process creates ConfigMaps over one keep-alive connection; WATCHERS
watch streams on the namespace are kept open and must see every event.
"""
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emu_harness import Emulator, Watch  # noqa: E402


class _Target:
    def __init__(self, host, port):
        self.host, self.port, self.scheme = host, port, "http"


def worker(args):
    host, port, idx, n = args
    from emu_harness import Client
    c = Client(_Target(host, port))
    t0 = time.time()
    for i in range(n):
        r = c.post("/api/v1/namespaces/default/configmaps",
                   {"metadata": {"name": "b-%d-%06d" % (idx, i), "labels": {"w": str(idx)}},
                    "data": {"k": "v" * 64}})
        assert r.status == 201, r
    c.close()
    return time.time() - t0


def main():
    binary = sys.argv[1]
    procs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    per = int(sys.argv[3]) if len(sys.argv) > 3 else 2500
    watchers = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    with Emulator(binary) as emu:
        ws = [Watch(emu, "/api/v1/namespaces/default/configmaps?watch=true")
              for _ in range(watchers)]
        t0 = time.time()
        with multiprocessing.Pool(procs) as pool:
            pool.map(worker, [(emu.host, emu.port, i, per) for i in range(procs)])
        dt = time.time() - t0
        total = procs * per
        ok = all(w.wait_for(lambda ev: len(ev) >= total, timeout=60) for w in ws)
        dt_watch = time.time() - t0
        c = emu.client()
        t1 = time.time()
        lists = 0
        while time.time() - t1 < 2:
            r = c.get("/api/v1/namespaces/default/configmaps?labelSelector=w%3D0&limit=100")
            assert r.status == 200
            lists += 1
        list_rate = lists / (time.time() - t1)
        print("creates: %d in %.2fs = %.0f/s (%d processes, %d watchers, all events seen: %s, "
              "last event after %.2fs)" % (total, dt, total / dt, procs, watchers, ok, dt_watch))
        print("paged label-selector lists over %d objects: %.0f/s" % (total, list_rate))
        for w in ws:
            w.close()
        c.close()


if __name__ == "__main__":
    main()
