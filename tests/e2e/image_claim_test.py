#!/usr/bin/python3
"""Claims by image (issue 34, "Pools and claims by image") against a real sbx-server with
the local runtime, real bubblewrap sandboxes, the real image cache (skopeo, umoci) and
images built here offline (tests/images/test_images.py: busybox, each with an os-release
of its own so that a sandbox shows which image it runs).

What a user sees: a claim by image served warm from a declared pool of it (and no pool
made); a claim of an image no pool runs served cold from its on-demand pool (made from
--image_claim_template, pulled on first use), which later claims and batches reuse; two
tenants racing the first claim of one image (one pull, one pool, both served); the
mistakes (pool and image both, a bad reference) and a server without an image cache; the
tenant limits image_claim_rate and image_cache_bytes; the counts in
sbx_image_claims_total; `sbx claim --image`.

Usage: image_claim_test.py PATH_TO_SBX_SERVER PROTO_DIR PATH_TO_SBX_CLI
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.request

import grpc

import sbx_e2e

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "images"))
import test_images  # noqa: E402

SERVER = PROTO = CLI = None

ADMIN, ALICE, BOB = "tok-admin", "tok-alice", "tok-bob"
CAROL, DAVE = "tok-carol", "tok-dave"
TOKENS = f"""{ADMIN} root admin
{ALICE} alice
{BOB} bob
{CAROL} carol image_claim_rate=0.001 image_claim_burst=1
{DAVE} dave image_cache_bytes=1
"""

CONFIG = """
templates:
  - name: declared
    runtime: local
    local:
      image: "{declared}"
  - name: base
    runtime: local
    local:
      env:
        FROM_BASE: "yes"
      memory_limit_bytes: 268435456
pools:
  - name: declared
    template: declared
    min_warm: 2
    max_warm: 2
    empty_pool_policy: wait
    default_wait: 30s
"""


def os_release_layer(name):
    return [{"name": "etc", "type": "dir"},
            {"name": "etc/os-release", "type": "file", "data": f"ID={name}\nNAME=\"{name}\"\n"}]


def md(token):
    return (("authorization", f"Bearer {token}"),)


class ImageClaims(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-imgc-", dir="/tmp")
        os.chmod(cls.dir, 0o755)  # sandboxes run as uids of their own, below it
        images = os.path.join(cls.dir, "images")
        cls.refs = {name: test_images.busybox_image(os.path.join(images, name), "v1",
                                                    extra=os_release_layer(f"img-{name}"))
                    for name in ("declared", "cold", "race", "rate", "dave1", "dave2",
                                 "batch", "cli")}
        cls.config = os.path.join(cls.dir, "config.yaml")
        with open(cls.config, "w") as f:
            f.write(CONFIG.format(declared=cls.refs["declared"]))
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write(TOKENS)
        cls.server = sbx_e2e.Server(
            SERVER, cls.dir, cls.config, auth_tokens=cls.tokens,
            extra=["--image_cache_bytes=1000000000", f"--image_import_dir={images}",
                   "--image_claim_template=base"])
        from sbx.v1 import (admin_pb2_grpc, claims_pb2_grpc, images_pb2_grpc,
                            sandboxes_pb2_grpc)
        ch = cls.server.channel
        cls.claims = claims_pb2_grpc.ClaimServiceStub(ch)
        cls.sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(ch)
        cls.admin = admin_pb2_grpc.AdminServiceStub(ch)
        cls.images = images_pb2_grpc.ImageServiceStub(ch)
        try:
            sbx_e2e.wait_for(lambda: cls.pool_status("declared").warm >= 2, 60,
                             "pool declared to be warm")
        except AssertionError as e:
            raise AssertionError(f"{e}: {cls.pool_status('declared')}\n{cls.server.logtext()}")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def pool_status(cls, name):
        from sbx.v1 import admin_pb2
        return cls.admin.GetPool(admin_pb2.GetPoolRequest(name=name), timeout=10,
                                 metadata=md(ADMIN)).pool.status

    def pools(self):
        from sbx.v1 import admin_pb2
        return sorted(p.name for p in self.admin.ListPools(
            admin_pb2.ListPoolsRequest(), timeout=10, metadata=md(ADMIN)).pools)

    def claim(self, token=ALICE, **fields):
        from sbx.v1 import claims_pb2
        return self.claims.Claim(claims_pb2.ClaimRequest(**fields), timeout=120,
                                 metadata=md(token)).claim

    def refused(self, code, token=ALICE, **fields):
        with self.assertRaises(grpc.RpcError) as e:
            self.claim(token, **fields)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        return e.exception.details()

    def release(self, claim, token=ALICE):
        from sbx.v1 import claims_pb2
        self.claims.Release(claims_pb2.ReleaseRequest(claim_id=claim.claim_id), timeout=30,
                            metadata=md(token))

    def sh(self, claim, script, token=ALICE):
        return sbx_e2e.sh(self.sandboxes, claim.claim_id, script, md(token))

    def metrics(self):
        self.server.log.flush()
        with open(os.path.join(self.dir, "server.log")) as f:
            port = re.search(r"metrics: serving /metrics on port (\d+)", f.read()).group(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, name, **labels):
        """The value of series `name` with exactly `labels` (0 when absent)."""
        for line in self.metrics().splitlines():
            m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
            if m is None or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if have == labels:
                return float(m.group(3))
        return 0.0

    def cached_refs(self):
        from sbx.v1 import images_pb2
        listed = self.images.ListImages(images_pb2.ListImagesRequest(), timeout=10,
                                        metadata=md(ADMIN))
        return [i.ref for i in listed.images]

    def on_demand_pools(self):
        return [p for p in self.pools() if re.fullmatch(r"image-[0-9a-f]{12}", p)]

    def test_a_declared_pool_of_the_image_serves_it_warm(self):
        from sbx.v1 import types_pb2
        before = self.metric("sbx_image_claims_total", served="declared_pool")
        pools = self.pools()
        c = self.claim(image=self.refs["declared"])
        try:
            self.assertEqual(c.pool, "declared")
            self.assertEqual(c.launch_type, types_pb2.LAUNCH_TYPE_WARM)
            code, out = self.sh(c, "cat /etc/os-release")
            self.assertEqual(code, 0, out)
            self.assertIn("ID=img-declared", out)
            self.assertEqual(self.pools(), pools, "a pool was made for a declared image")
            self.assertEqual(
                self.metric("sbx_image_claims_total", served="declared_pool"), before + 1)
        finally:
            self.release(c)

    def test_an_image_without_a_pool_is_served_cold_and_its_pool_reused(self):
        from sbx.v1 import claims_pb2, types_pb2
        ref = self.refs["cold"]
        self.assertNotIn(ref, self.cached_refs())
        first = self.claim(image=ref)
        second = None
        try:
            self.assertRegex(first.pool, r"^image-[0-9a-f]{12}$")
            self.assertEqual(first.launch_type, types_pb2.LAUNCH_TYPE_COLD)
            code, out = self.sh(first, "cat /etc/os-release; echo base=$FROM_BASE")
            self.assertEqual(code, 0, out)
            self.assertIn("ID=img-cold", out)
            self.assertIn("base=yes", out)  # the template copies --image_claim_template
            self.assertIn(ref, self.cached_refs())  # pulled on first use
            second = self.claim(token=BOB, image=ref)
            self.assertEqual(second.pool, first.pool)
            self.assertEqual(self.sh(second, "cat /etc/os-release", token=BOB)[1].count(
                "ID=img-cold"), 1)
            # The on-demand pool, as an admin sees it: none warm, COLD by default.
            from sbx.v1 import admin_pb2
            pool = self.admin.GetPool(admin_pb2.GetPoolRequest(name=first.pool), timeout=10,
                                      metadata=md(ADMIN)).pool
            self.assertEqual((pool.template, pool.min_warm, pool.max_warm),
                             (first.pool, 0, 4))
            self.assertEqual(pool.empty_pool_policy, types_pb2.EMPTY_POOL_POLICY_COLD)
            self.assertEqual(self.on_demand_pools().count(first.pool), 1)
            # A batch of the image comes from the same pool.
            batch = self.claims.ClaimBatch(
                claims_pb2.ClaimBatchRequest(image=ref, count=2), timeout=120,
                metadata=md(ALICE))
            self.assertEqual([c.pool for c in batch.claims], [first.pool] * 2)
            for c in batch.claims:
                self.release(c)
        finally:
            self.release(first)
            if second is not None:
                self.release(second, BOB)

    def test_two_tenants_racing_the_first_claim_of_an_image_pull_it_once(self):
        ref = self.refs["race"]
        misses = self.metric("sbx_image_cache_misses_total")
        on_demand = set(self.on_demand_pools())
        results = {}
        go = threading.Barrier(2)

        def claim(token):
            go.wait()
            try:
                results[token] = self.claim(token=token, image=ref)
            except grpc.RpcError as e:
                results[token] = e

        threads = [threading.Thread(target=claim, args=(t,)) for t in (ALICE, BOB)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            for token, r in results.items():
                self.assertNotIsInstance(r, grpc.RpcError, f"{token}: {r}")
            self.assertEqual(results[ALICE].pool, results[BOB].pool)
            self.assertEqual(set(self.on_demand_pools()) - on_demand, {results[ALICE].pool})
            self.assertEqual(self.metric("sbx_image_cache_misses_total"), misses + 1)
            self.assertEqual(self.cached_refs().count(ref), 1)
            for token, c in results.items():
                self.assertIn("ID=img-race", self.sh(c, "cat /etc/os-release", token=token)[1])
        finally:
            for token, c in results.items():
                if not isinstance(c, grpc.RpcError):
                    self.release(c, token)

    def test_mistakes_are_invalid_arguments(self):
        pools = self.pools()
        refused_before = self.metric("sbx_image_claims_total", served="refused")
        msg = self.refused(grpc.StatusCode.INVALID_ARGUMENT, pool="declared",
                           image=self.refs["declared"])
        self.assertIn('pool "declared" and image', msg)
        self.assertIn("both set", msg)
        msg = self.refused(grpc.StatusCode.INVALID_ARGUMENT, image="bogus:thing")
        self.assertIn("bogus:thing", msg)
        # A local image outside --image_import_dir is no reference this server takes.
        msg = self.refused(grpc.StatusCode.INVALID_ARGUMENT, image="oci:/etc:v1")
        self.assertIn("oci:/etc:v1", msg)
        self.assertEqual(self.pools(), pools)
        self.assertEqual(self.metric("sbx_image_claims_total", served="refused"),
                         refused_before + 2)

    def test_the_image_claim_rate_of_a_tenant(self):
        ref = self.refs["rate"]
        c = self.claim(token=CAROL, image=ref)
        try:
            msg = self.refused(grpc.StatusCode.RESOURCE_EXHAUSTED, token=CAROL, image=ref)
            self.assertIn('tenant "carol" is above its image claim rate', msg)
            self.assertIn("image_claim_rate", msg)
            # A declared pool's claim is not a claim the limit counts.
            d = self.claim(token=CAROL, image=self.refs["declared"])
            self.release(d, CAROL)
            self.assertEqual(self.metric("sbx_tenant_limited_total", tenant="carol",
                                         limit="image_claim_rate"), 1)
        finally:
            self.release(c, CAROL)

    def test_the_image_cache_bytes_of_a_tenant(self):
        # dave may have 1 byte of the cache: his first pull is allowed (nothing is his
        # yet), the next image he would pull is not; a cached one is.
        c = self.claim(token=DAVE, image=self.refs["dave1"])
        self.release(c, DAVE)
        msg = self.refused(grpc.StatusCode.RESOURCE_EXHAUSTED, token=DAVE,
                           image=self.refs["dave2"])
        self.assertIn('tenant "dave" is at its image_cache_bytes 1', msg)
        self.assertIn(self.refs["dave2"], msg)
        self.assertNotIn(self.refs["dave2"], self.cached_refs())
        c = self.claim(token=DAVE, image=self.refs["dave1"])
        self.release(c, DAVE)
        c = self.claim(token=BOB, image=self.refs["dave2"])  # bob has no limit
        self.release(c, BOB)
        self.assertEqual(self.metric("sbx_tenant_limited_total", tenant="dave",
                                     limit="image_cache_bytes"), 1)

    def test_sbx_claim_image(self):
        env = dict(os.environ, SBX_SERVER=self.server.target, SBX_TOKEN=ALICE)

        def sbx(*args):
            return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=180,
                                  env=env)

        r = sbx("claim", "--image", self.refs["cli"], "-o", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        claim = json.loads(r.stdout)
        self.assertRegex(claim["pool"], r"^image-[0-9a-f]{12}$")
        r = sbx("exec", claim["claimId"], "--", "cat", "/etc/os-release")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ID=img-cli", r.stdout)
        self.assertEqual(sbx("release", claim["claimId"]).returncode, 0)
        r = sbx("claim", "--image", self.refs["declared"], "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sbx("release", r.stdout.strip()).returncode, 0)
        r = sbx("claim", "declared", "--image", self.refs["declared"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("not both", r.stderr)
        r = sbx("claim", "--image", "bogus:thing")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("INVALID_ARGUMENT", r.stderr)


class WithoutAnImageCache(unittest.TestCase):
    """A local server started without --image_cache_bytes: a claim of an image no pool
    runs is FAILED_PRECONDITION naming the flag."""

    def test_a_claim_by_image_is_a_failed_precondition(self):
        from sbx.v1 import claims_pb2, claims_pb2_grpc
        work = tempfile.mkdtemp(prefix="sbx-imgc-nocache-", dir="/tmp")
        config = os.path.join(work, "config.yaml")
        with open(config, "w") as f:
            f.write("templates: []\npools: []\n")
        server = sbx_e2e.Server(SERVER, work, config)
        try:
            stub = claims_pb2_grpc.ClaimServiceStub(server.channel)
            with self.assertRaises(grpc.RpcError) as e:
                stub.Claim(claims_pb2.ClaimRequest(image="oci:/images/x:v1"), timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("--image_cache_bytes", e.exception.details())
            self.assertIn("oci:/images/x:v1", e.exception.details())
        finally:
            server.stop()
            sbx_e2e.kill_all_with(work)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    SERVER, PROTO, CLI = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main(verbosity=2)
