#!/usr/bin/python3
"""Typed errors for each status code sbx gives a meaning, sync and async, against a real
sbx-server (instant runtime, tokens on); and automatic retries that reuse the claim id
across a server restart, so that a lost response never costs a second sandbox."""

import asyncio
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import grpc  # noqa: E402

import sbx  # noqa: E402
from sbx import _common  # noqa: E402

SRV = None
ADMIN, TENANT = harness.ADMIN_TOKEN, harness.TENANT_TOKEN


def setUpModule():
    global SRV
    SRV = harness.Server(config=harness.instant_config(8), runtime="instant", auth=True)
    SRV.wait_warm("default", 4)


def tearDownModule():
    SRV.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SyncErrorsTest(unittest.TestCase):
    def setUp(self):
        self.tenant = sbx.Client(SRV.target, token=TENANT)
        self.admin = sbx.Client(SRV.target, token=ADMIN)

    def tearDown(self):
        self.tenant.close()
        self.admin.close()

    def test_unauthenticated(self):
        with sbx.Client(SRV.target, token="wrong") as c:
            with self.assertRaises(sbx.Unauthenticated) as ctx:
                c.claim("default")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        self.assertTrue(ctx.exception.message)
        with sbx.Client(SRV.target) as c:  # no token at all
            with self.assertRaises(sbx.Unauthenticated):
                c.list_claims()
            self.assertTrue(c.ping().server_version)  # ping needs no token (documented)

    def test_permission_denied(self):
        with self.assertRaises(sbx.PermissionDenied):
            self.tenant.pools()  # AdminService needs an admin token
        with self.assertRaises(sbx.PermissionDenied):
            self.tenant.list_claims(owner="alice")
        self.assertIn("default", [p.name for p in self.admin.pools()])

    def test_not_found(self):
        with self.assertRaises(sbx.NotFound) as ctx:
            self.tenant.claim("no-such-pool")
        self.assertIn('"no-such-pool"', str(ctx.exception))
        self.assertIsInstance(ctx.exception, LookupError)
        with self.assertRaises(sbx.NotFound):
            self.tenant.get_claim("no-such-claim")
        # Another tenant's claim is NOT_FOUND too.
        with self.admin.claim("default") as sb:
            with self.assertRaises(sbx.NotFound):
                self.tenant.get_claim(sb.claim_id)

    def test_invalid_argument(self):
        with self.assertRaises(sbx.InvalidArgument) as ctx:
            self.tenant.claim("default", ttl=48 * 3600)  # above the pool's max_ttl
        self.assertIn("ttl", ctx.exception.message)
        self.assertIsInstance(ctx.exception, ValueError)
        with self.assertRaises(sbx.InvalidArgument):
            self.tenant.claim("Not_A_Name")

    def test_already_exists_and_failed_precondition(self):
        cid = sbx.new_claim_id("err")
        with self.tenant.claim("default", claim_id=cid):
            with self.assertRaises(sbx.AlreadyExists):
                self.tenant.claim("other", claim_id=cid)
        with self.assertRaises(sbx.FailedPrecondition):
            self.tenant.claim("default", claim_id=cid)  # the id is spent
        with self.tenant.claim("default") as sb:
            with self.assertRaises(sbx.FailedPrecondition):
                sb.exec("true")  # an instant-runtime sandbox runs nothing

    def test_pool_exhausted_carries_the_retry_hint(self):
        with self.assertRaises(sbx.PoolExhausted) as ctx:
            self.tenant.claim("empty")
        e = ctx.exception
        self.assertEqual(e.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIsInstance(e.retry_after, float)
        self.assertGreater(e.retry_after, 0)
        self.assertIn("retry after", str(e))
        # A batch larger than the pool's warm sandboxes, all or nothing.
        with self.assertRaises(sbx.PoolExhausted) as ctx:
            self.tenant.claim_batch("other", 50, policy="fail")
        self.assertIn("50", ctx.exception.message)

    def test_deadline_exceeded(self):
        with self.assertRaises(sbx.DeadlineExceeded) as ctx:
            self.tenant.claim("empty", policy="wait", wait=0.3)
        self.assertIsInstance(ctx.exception, TimeoutError)
        # The error names the id the claim was sent with, for a retry with the same id.
        self.assertTrue(ctx.exception.claim_id.startswith("py-"))
        with self.assertRaises(sbx.DeadlineExceeded) as ctx:
            self.tenant.claim("empty", policy="wait", wait=0.3, claim_id="mine-1")
        self.assertEqual(ctx.exception.claim_id, "mine-1")

    def test_unavailable_after_bounded_retries(self):
        with sbx.Client(f"127.0.0.1:{free_port()}", timeout=1.0) as c:
            t0 = time.monotonic()
            with self.assertRaises(sbx.Unavailable) as ctx:
                c.ping()
            elapsed = time.monotonic() - t0
        self.assertIsInstance(ctx.exception, ConnectionError)
        self.assertLess(elapsed, 30, "retries went far beyond the call's deadline")

    def test_ctrl_c_during_a_claim_releases_it(self):
        # Ctrl-C lands after the server granted the claim, before the client heard back:
        # the SDK knows the id it sent and releases it.
        sent = []

        class InterruptAfterGrant(grpc.UnaryUnaryClientInterceptor):
            def intercept_unary_unary(self, continuation, details, request):
                outcome = continuation(details, request)
                if details.method.endswith("/Claim"):
                    sent.append(outcome.result().claim.claim_id)
                    raise KeyboardInterrupt()
                return outcome
        channel = grpc.intercept_channel(grpc.insecure_channel(SRV.target),
                                         InterruptAfterGrant())
        with sbx.Client(SRV.target, token=TENANT, channel=channel) as c:
            with self.assertRaises(KeyboardInterrupt):
                c.claim("default")
        self.assertEqual(len(sent), 1)
        self.assertEqual(self.tenant.get_claim(sent[0]).state, "RELEASED")

    def test_env_defaults(self):
        os.environ["SBX_SERVER"], os.environ["SBX_TOKEN"] = SRV.target, TENANT
        try:
            with sbx.Client() as c:
                self.assertEqual(c.target, SRV.target)
                with c.claim("default") as sb:
                    self.assertEqual(sb.info.owner, "bob")
        finally:
            harness.clean_env()


class AsyncErrorsTest(unittest.IsolatedAsyncioTestCase):
    async def test_typed_errors(self):
        async with sbx.AsyncClient(SRV.target, token="wrong") as c:
            with self.assertRaises(sbx.Unauthenticated):
                await c.claim("default")
        async with sbx.AsyncClient(SRV.target, token=TENANT) as c:
            with self.assertRaises(sbx.PermissionDenied):
                await c.pools()
            with self.assertRaises(sbx.NotFound):
                await c.claim("no-such-pool")
            with self.assertRaises(sbx.InvalidArgument):
                await c.claim("default", ttl=48 * 3600)
            with self.assertRaises(sbx.PoolExhausted) as ctx:
                await c.claim("empty")
            self.assertGreater(ctx.exception.retry_after, 0)
            with self.assertRaises(sbx.DeadlineExceeded):
                await c.claim("empty", policy="wait", wait=0.3)
            cid = sbx.new_claim_id()
            async with c.claim("default", claim_id=cid) as sb:
                with self.assertRaises(sbx.AlreadyExists):
                    await c.claim("other", claim_id=cid)
                with self.assertRaises(sbx.FailedPrecondition):
                    await sb.exec("true")
        async with sbx.AsyncClient(f"127.0.0.1:{free_port()}", timeout=1.0) as c:
            with self.assertRaises(sbx.Unavailable):
                await c.ping()


class _LostResponse(grpc.RpcError):
    """What a client sees when the server dies after granting a claim: UNAVAILABLE."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection lost before the response (test)"

    def trailing_metadata(self):
        return ()

    def result(self, timeout=None):
        raise self


class RestartTest(unittest.TestCase):
    """A server of its own, killed and restarted on the same port and store. Local
    runtime: its sandboxes outlive the server and the next start adopts them with their
    claims (the instant runtime's sandboxes are only names and are lost)."""

    def setUp(self):
        self.srv = harness.Server()
        self.srv.wait_warm("default", 2)

    def tearDown(self):
        self.srv.stop()

    def restart_later(self, delay):
        def run():
            time.sleep(delay)
            self.srv.start()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def active_claims(self):
        with sbx.Client(self.srv.target) as c:
            return c.list_claims(states=["active"]), {p.name: p for p in c.pools()}

    def test_lost_response_and_restart_reuse_the_claim_id(self):
        srv, test = self.srv, self
        seen = []

        class KillAfterGrant(grpc.UnaryUnaryClientInterceptor):
            def intercept_unary_unary(self, continuation, details, request):
                if details.method.endswith("/Claim"):
                    seen.append(request.claim_id)
                outcome = continuation(details, request)
                if details.method.endswith("/Claim") and len(seen) == 1:
                    seen.append(outcome.result().claim.sandbox.id)  # granted...
                    srv.kill()  # ...and the server dies before the client hears it
                    test.restarter = test.restart_later(0.5)
                    return _LostResponse()
                return outcome

        opts = _common.ConnectionSettings.resolve(srv.target, None, False, None, None, None,
                                                  None).options()
        channel = grpc.intercept_channel(grpc.insecure_channel(srv.target, opts),
                                         KillAfterGrant())
        # Retries bounded by the deadline only (a loaded machine may restart slowly).
        patient = sbx.RetryPolicy(max_attempts=1000)
        with sbx.Client(srv.target, channel=channel, timeout=30, retry=patient) as c:
            sb = c.claim("default", ttl=600)
            self.restarter.join(30)
            # Every attempt sent the same id; the one that got through was a replay.
            attempts = [x for i, x in enumerate(seen) if i != 1]
            self.assertGreaterEqual(len(attempts), 2)
            self.assertEqual(set(attempts), {sb.claim_id})
            self.assertTrue(sb.replayed)
            self.assertEqual(sb.sandbox_id, seen[1])
            active, pools = self.active_claims()
            self.assertEqual([a.claim_id for a in active], [sb.claim_id])
            self.assertEqual(pools["default"].claimed, 1, "a second sandbox was taken")
            sb.release()

    def test_claim_waits_out_a_restart(self):
        self.srv.kill()
        restarter = self.restart_later(1.0)
        with sbx.Client(self.srv.target, timeout=30,
                        retry=sbx.RetryPolicy(max_attempts=1000)) as c:
            sb = c.claim("default", claim_id="restart-1")
            restarter.join(30)
            self.assertEqual(sb.claim_id, "restart-1")
            active, pools = self.active_claims()
            self.assertEqual([a.claim_id for a in active], ["restart-1"])
            self.assertEqual(pools["default"].claimed, 1)

    def test_async_claim_waits_out_a_restart(self):
        self.srv.kill()
        restarter = self.restart_later(1.0)

        async def run():
            async with sbx.AsyncClient(self.srv.target, timeout=30,
                                       retry=sbx.RetryPolicy(max_attempts=1000)) as c:
                return await c.claim("default", claim_id="restart-2")
        sb = asyncio.run(run())
        restarter.join(30)
        active, pools = self.active_claims()
        self.assertEqual([a.claim_id for a in active], [sb.claim_id])
        self.assertEqual(pools["default"].claimed, 1)

    def test_no_retry_when_disabled(self):
        self.srv.kill()
        with sbx.Client(self.srv.target, timeout=5, retry=sbx.RetryPolicy(max_attempts=1)) as c:
            with self.assertRaises(sbx.Unavailable):
                c.claim("default")


if __name__ == "__main__":
    harness.main()
