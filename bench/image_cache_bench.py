#!/usr/bin/env python3
"""The image cache through sbx-server: first use (fetch + unpack) of an image against a use
the cache answers, in the same run, for a small image (busybox) and a large one (SIZE MiB
of incompressible bytes in one layer). Prints one table; asserts nothing.

  bench/image_cache_bench.py --server build/clang/src/cmd/sbx-server [--size_mib 100] [--runs 3]

Each run writes the images offline (tests/images/make_oci.py) into a fresh folder, starts
sbx-server (instant runtime, loopback) with --image_cache_bytes and that import folder, and
times PullImage over gRPC: the first call (a miss), then the same reference again (a hit),
then `rm` and a pull again (a miss on a warm page cache). Loopback only; bounded by the
runs and a 10-minute deadline per call.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
MAKE_OCI = os.path.join(SOURCE, "tests", "images", "make_oci.py")
sys.path.insert(0, os.path.join(SOURCE, "tests", "e2e"))
import sbx_e2e  # noqa: E402


def make_images(folder, size_mib):
    bb = {"layers": [[{"name": "bin", "type": "dir"},
                      {"name": "bin/busybox", "type": "file", "from": "/bin/busybox",
                       "mode": 0o755}]]}
    subprocess.run([sys.executable, MAKE_OCI, os.path.join(folder, "bb"), "v1", json.dumps(bb)],
                   check=True, capture_output=True)
    blob = os.path.join(folder, "random.bin")
    with open(blob, "wb") as f:
        for _ in range(size_mib):
            f.write(os.urandom(1 << 20))
    big = {"layers": [[{"name": "data", "type": "dir"},
                       {"name": "data/blob", "type": "file", "from": blob, "mode": 0o644}]]}
    subprocess.run([sys.executable, MAKE_OCI, os.path.join(folder, "big"), "v1", json.dumps(big)],
                   check=True, capture_output=True)
    os.unlink(blob)
    return ("oci:%s/bb:v1" % folder, "oci:%s/big:v1" % folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--size_mib", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sbx_e2e.generate_stubs(os.path.join(SOURCE, "proto"))
    import grpc
    from sbx.v1 import images_pb2, images_pb2_grpc
    results = {}  # (image, kind) -> [seconds]
    for run in range(args.runs):
        work = tempfile.mkdtemp(prefix="sbx-image-bench-", dir="/tmp")
        proc = None
        try:
            imports = os.path.join(work, "import")
            os.makedirs(imports)
            refs = make_images(imports, args.size_mib)
            port_file = os.path.join(work, "port")
            log = open(os.path.join(work, "server.log"), "w")
            proc = subprocess.Popen(
                [args.server, "--listen=127.0.0.1:0", "--port_file=" + port_file,
                 "--data_dir=" + os.path.join(work, "data"), "--runtime=instant",
                 "--metrics_listen=off", "--image_cache_bytes=%d" % (4 << 30),
                 "--image_import_dir=" + imports],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            deadline = time.time() + 30
            while not os.path.exists(port_file) or not open(port_file).read().strip():
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit("sbx-server did not start: see " + log.name)
                time.sleep(0.05)
            channel = grpc.insecure_channel("127.0.0.1:" + open(port_file).read().strip())
            stub = images_pb2_grpc.ImageServiceStub(channel)

            def pull(ref):
                t = time.perf_counter()
                image = stub.PullImage(images_pb2.PullImageRequest(ref=ref), timeout=600).image
                return time.perf_counter() - t, image

            for name, ref in zip(("busybox (2 MB)", "random (%d MiB)" % args.size_mib), refs):
                miss, image = pull(ref)
                hit, _ = pull(ref)
                stub.RemoveImage(images_pb2.RemoveImageRequest(digest=image.digest), timeout=60)
                again, _ = pull(ref)
                for kind, secs in (("first use (miss)", miss), ("cached (hit)", hit),
                                   ("again after rm (miss, warm page cache)", again)):
                    results.setdefault((name, kind), []).append(secs)
                print("run %d %s: miss %.3f s, hit %.3f s, again %.3f s, %d bytes unpacked" % (
                    run + 1, name, miss, hit, again, image.bytes), flush=True)
            channel.close()
        finally:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
            shutil.rmtree(work, ignore_errors=True)
    print("\n| image | use | runs | median | min | max |\n|---|---|---:|---:|---:|---:|")
    for (name, kind), xs in results.items():
        print("| %s | %s | %d | %.3f s | %.3f s | %.3f s |" % (
            name, kind, len(xs), statistics.median(xs), min(xs), max(xs)))


if __name__ == "__main__":
    main()
