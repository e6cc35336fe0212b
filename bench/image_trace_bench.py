#!/usr/bin/env python3
"""A trace of claims by image over many distinct images, Zipf-distributed, through
sbx-server and a bounded image cache: the cache's hit rate and the claim latency (p50,
p99, and split by hit and miss). Prints a table; asserts nothing.

  bench/image_trace_bench.py --server build/clang/src/cmd/sbx-server [--images 2000]
                             [--claims 3000] [--zipf 1.1] [--cache_mib 2048] [--seed 1]

The images are written offline into one import folder: each is busybox (one layer, the
same blob in every image, hard-linked) plus a layer of its own (a marker file and, with
--extra_mib, that many MiB of zeros), so every image has its own manifest digest and
unpacks to about 2 MB plus the extra. Each claim names an image
drawn from a Zipf law (rank r with weight 1/r^s), claims it (policy COLD: on first use the
image's on-demand pool is made and its image pulled), and releases it; one claim at a
time, so the latency is the claim's own. Loopback only; bounded by the claim count.
"""
import argparse
import bisect
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "e2e"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "images"))
import make_oci  # noqa: E402
import sbx_e2e  # noqa: E402
import test_images  # noqa: E402


def write_blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    folder = os.path.join(layout, "blobs", "sha256")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest


def make_images(folder, count, extra_mib=0):
    """`count` OCI layouts under `folder` sharing the busybox layer, each with a layer of
    its own (a marker, and `extra_mib` MiB of zeros: small on disk, that much unpacked);
    their references."""
    base_raw, base_gz = make_oci.layer_tar(test_images.busybox_entries() +
                                           test_images.base_entries(), None, 1)
    base_digest = "sha256:" + hashlib.sha256(base_gz).hexdigest()
    base_path = os.path.join(folder, "base-layer")
    os.makedirs(folder, exist_ok=True)
    with open(base_path, "wb") as f:
        f.write(base_gz)
    refs = []
    for i in range(count):
        layout = os.path.join(folder, f"img{i}")
        blobs = os.path.join(layout, "blobs", "sha256")
        os.makedirs(blobs, exist_ok=True)
        os.link(base_path, os.path.join(blobs, base_digest.split(":")[1]))
        raw, gz = make_oci.layer_tar(
            [{"name": "marker", "type": "file", "data": f"image {i}\n"}],
            {"name": "payload", "bytes": extra_mib << 20} if extra_mib else None, 1)
        layer_digest = write_blob(layout, gz)
        config = json.dumps({
            "architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [
                "sha256:" + hashlib.sha256(base_raw).hexdigest(),
                "sha256:" + hashlib.sha256(raw).hexdigest()]}}).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": write_blob(layout, config), "size": len(config)},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                 "digest": base_digest, "size": len(base_gz)},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                 "digest": layer_digest, "size": len(gz)}]}).encode()
        with open(os.path.join(layout, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        with open(os.path.join(layout, "index.json"), "w") as f:
            json.dump({"schemaVersion": 2, "manifests": [
                {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                 "digest": write_blob(layout, manifest), "size": len(manifest),
                 "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}, f)
        refs.append(f"oci:{layout}:v1")
    return refs


def metric(server, name):
    import urllib.request
    with open(os.path.join(server.workdir, "metrics-port")) as f:
        port = f.read().strip()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--claims", type=int, default=3000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--cache_mib", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--extra_mib", type=int, default=0,
                    help="MiB of zeros in each image's own layer (its unpacked size grows by it)")
    args = ap.parse_args()
    args.server = os.path.abspath(args.server)
    sbx_e2e.generate_stubs(os.path.join(SOURCE, "proto"))
    from sbx.v1 import claims_pb2, claims_pb2_grpc, images_pb2, images_pb2_grpc

    work = tempfile.mkdtemp(prefix="sbx-trace-", dir="/tmp")
    os.chmod(work, 0o755)
    server = None
    try:
        t0 = time.time()
        refs = make_images(os.path.join(work, "images"), args.images, args.extra_mib)
        print(f"{args.images} images written in {time.time() - t0:.1f} s", flush=True)
        config = os.path.join(work, "config.yaml")
        with open(config, "w") as f:
            f.write("templates: []\npools: []\n")
        server = sbx_e2e.Server(args.server, work, config, extra=[
            f"--image_cache_bytes={args.cache_mib << 20}", f"--image_import_dir={work}/images",
            f"--metrics_port_file={work}/metrics-port", "--refill_qps=1000"])
        claims = claims_pb2_grpc.ClaimServiceStub(server.channel)
        images = images_pb2_grpc.ImageServiceStub(server.channel)
        rng = random.Random(args.seed)
        weights = [1.0 / (r ** args.zipf) for r in range(1, args.images + 1)]
        cumulative = []
        total = 0.0
        for w in weights:
            total += w
            cumulative.append(total)
        seen = set()
        hits, misses = [], []
        misses_before = metric(server, "sbx_image_cache_misses_total")
        start = time.time()
        for i in range(args.claims):
            rank = bisect.bisect_left(cumulative, rng.random() * total)
            ref = refs[rank]
            listed_before = metric(server, "sbx_image_cache_misses_total")
            t = time.perf_counter()
            c = claims.Claim(claims_pb2.ClaimRequest(image=ref), timeout=600).claim
            ms = (time.perf_counter() - t) * 1e3
            claims.Release(claims_pb2.ReleaseRequest(claim_id=c.claim_id), timeout=60)
            missed = metric(server, "sbx_image_cache_misses_total") > listed_before
            (misses if missed else hits).append(ms)
            seen.add(rank)
            if (i + 1) % 500 == 0:
                print(f"  {i + 1} claims, {time.time() - start:.0f} s", flush=True)
        listed = images.ListImages(images_pb2.ListImagesRequest(), timeout=30)
        evictions = metric(server, "sbx_image_cache_evictions_total")
        n = len(hits) + len(misses)
        everything = hits + misses
        print(f"\n{args.claims} claims by image, Zipf s={args.zipf} over {args.images} images "
              f"({len(seen)} distinct claimed), cache {args.cache_mib} MiB, one at a time")
        print("| claims | cache hit rate | claim p50 | claim p99 | hit p50 | hit p99 | miss p50 "
              "| miss p99 | pulls | evictions | cached at end |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(f"| {n} | {len(hits) / n:.1%} | {pct(everything, 0.5):.1f} ms | "
              f"{pct(everything, 0.99):.1f} ms | {pct(hits, 0.5):.1f} ms | {pct(hits, 0.99):.1f} ms "
              f"| {pct(misses, 0.5):.1f} ms | {pct(misses, 0.99):.1f} ms | "
              f"{metric(server, 'sbx_image_cache_misses_total') - misses_before:.0f} | "
              f"{evictions:.0f} | {len(listed.images)} images, {listed.bytes / 2**20:.0f} MiB |")
    finally:
        if server is not None:
            server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
