#!/usr/bin/python3
"""Claims by image (issue 34) through the SDK, sync and asyncio, against a real sbx-server
with local bubblewrap sandboxes and an image cache, on busybox images built here offline
(tests/images/test_images.py): claim(image=...) is served from the image's on-demand pool
(cold, pulled on first use) and runs the image; claim_batch(n=..., image=...) takes all
from one pool; a reference the server does not take is InvalidArgument; pool and image
together, or neither, are a ValueError before any call."""

import asyncio
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

sys.path.insert(0, os.path.join(harness.ROOT, "tests", "images"))
import test_images  # noqa: E402

import sbx  # noqa: E402

SRV = None
IMAGES = None
REFS = {}


def setUpModule():
    global SRV, IMAGES
    IMAGES = tempfile.mkdtemp(prefix="sbxpy-img-", dir="/tmp")
    os.chmod(IMAGES, 0o755)
    for name in ("sync", "aio", "batch"):
        REFS[name] = test_images.busybox_image(
            os.path.join(IMAGES, name), "v1",
            extra=[{"name": "etc", "type": "dir"},
                   {"name": "etc/os-release", "type": "file", "data": f"ID=sdk-{name}\n"}])
    SRV = harness.Server(extra=["--image_cache_bytes=1000000000",
                                f"--image_import_dir={IMAGES}"])
    os.chmod(SRV.dir, 0o755)  # image sandboxes run as uids of their own, below it


def tearDownModule():
    SRV.stop()
    import shutil
    shutil.rmtree(IMAGES, ignore_errors=True)


ON_DEMAND = re.compile(r"image-[0-9a-f]{12}")


class SyncImageClaimTest(unittest.TestCase):
    def setUp(self):
        self.client = sbx.Client(SRV.target)

    def tearDown(self):
        self.client.close()

    def test_claim_by_image_runs_the_image_from_its_on_demand_pool(self):
        with self.client.claim(image=REFS["sync"], ttl=600) as sb:
            self.assertRegex(sb.pool, ON_DEMAND)
            self.assertEqual(sb.info.launch_type, "COLD")
            r = sb.exec("cat /etc/os-release")
            self.assertEqual((r.exit_code, r.stdout), (0, "ID=sdk-sync\n"))
            pool = sb.pool
        with self.client.claim(image=REFS["sync"]) as again:
            self.assertEqual(again.pool, pool)

    def test_claim_batch_by_image(self):
        with self.client.claim_batch(n=2, image=REFS["batch"]) as group:
            self.assertEqual(len(group), 2)
            pools = {sb.pool for sb in group}
            self.assertEqual(len(pools), 1)
            self.assertRegex(pools.pop(), ON_DEMAND)
            self.assertEqual(group[1].exec("cat /etc/os-release").stdout, "ID=sdk-batch\n")

    def test_a_reference_the_server_does_not_take(self):
        with self.assertRaises(sbx.InvalidArgument) as e:
            self.client.claim(image="bogus:thing")
        self.assertIn("bogus:thing", e.exception.message)

    def test_pool_and_image_are_one_or_the_other(self):
        with self.assertRaisesRegex(ValueError, "not both"):
            self.client.claim("default", image=REFS["sync"])
        with self.assertRaisesRegex(ValueError, "give a pool, or an image"):
            self.client.claim()
        with self.assertRaisesRegex(TypeError, "needs n"):
            self.client.claim_batch(image=REFS["sync"])


class AsyncImageClaimTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.client = sbx.AsyncClient(SRV.target)

    async def asyncTearDown(self):
        await self.client.close()

    async def test_claim_by_image(self):
        async with self.client.claim(image=REFS["aio"]) as sb:
            self.assertRegex(sb.pool, ON_DEMAND)
            self.assertEqual((await sb.exec("cat /etc/os-release")).stdout, "ID=sdk-aio\n")
        async with self.client.claim_batch(None, 2, image=REFS["aio"]) as group:
            self.assertEqual({s.pool for s in group}, {sb.pool})
        with self.assertRaisesRegex(ValueError, "not both"):
            self.client.claim("default", image=REFS["aio"])


if __name__ == "__main__":
    harness.main()
