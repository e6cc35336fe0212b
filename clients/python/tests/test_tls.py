#!/usr/bin/python3
"""TLS and mutual TLS, sync and async, the CLI's way (ca, cert/key, server_name), against
real sbx-servers (instant runtime) with test certificates made by openssl."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import asyncio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import sbx  # noqa: E402

CERTS = TLS = MTLS = None


def make_certificates(d):
    """A CA, a server certificate for 127.0.0.1 / sbx.test and a client certificate."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "1", "-subj", "/CN=sbx-py-test-ca")
    with open(os.path.join(d, "san.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:sbx.test\n")
    for name, ext in (("server", ["-extfile", "san.cnf"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext)


def setUpModule():
    global CERTS, TLS, MTLS
    if shutil.which("openssl") is None:
        raise unittest.SkipTest("no openssl to make test certificates")
    CERTS = tempfile.mkdtemp(prefix="sbxpy-certs-")
    make_certificates(CERTS)
    c = CERTS
    tls = [f"--tls_cert_file={c}/server.pem", f"--tls_key_file={c}/server.key"]
    TLS = harness.Server(config=harness.instant_config(4), runtime="instant", extra=tls)
    MTLS = harness.Server(config=harness.instant_config(4), runtime="instant",
                          extra=tls + [f"--tls_client_ca_file={c}/ca.pem"])


def tearDownModule():
    for s in (TLS, MTLS):
        if s is not None:
            s.stop()
    if CERTS:
        shutil.rmtree(CERTS, ignore_errors=True)


def p(name):
    return os.path.join(CERTS, name)


class TlsTest(unittest.TestCase):
    def test_tls_with_ca(self):
        with sbx.Client(TLS.target, ca=p("ca.pem")) as c:
            self.assertIn("tls", repr(c))
            self.assertTrue(c.ping().server_version)
            with c.claim("default") as sb:
                self.assertEqual(sb.info.state, "ACTIVE")
        # The name in the certificate rather than the address.
        with sbx.Client(TLS.target, ca=p("ca.pem"), server_name="sbx.test") as c:
            c.ping()
        for kwargs in ({}, {"tls": True}, {"ca": p("ca.pem"), "server_name": "other.test"}):
            with self.subTest(kwargs=kwargs):
                with sbx.Client(TLS.target, timeout=2, **kwargs) as c:
                    with self.assertRaises(sbx.Unavailable):
                        c.ping()

    def test_mutual_tls(self):
        with sbx.Client(MTLS.target, ca=p("ca.pem"), cert=p("client.pem"),
                        key=p("client.key")) as c:
            with c.claim("default") as sb:
                self.assertTrue(sb.sandbox_id)
        with sbx.Client(MTLS.target, ca=p("ca.pem"), timeout=2) as c:
            with self.assertRaises(sbx.Unavailable):
                c.ping()
        with self.assertRaises(ValueError):
            sbx.Client(MTLS.target, cert=p("client.pem"))  # a cert needs its key
        with self.assertRaises(FileNotFoundError):
            sbx.Client(MTLS.target, ca=p("nope.pem"))

    def test_async_tls_and_mtls(self):
        async def run():
            async with sbx.AsyncClient(TLS.target, ca=p("ca.pem")) as c:
                await c.ping()
            async with sbx.AsyncClient(MTLS.target, ca=p("ca.pem"), cert=p("client.pem"),
                                       key=p("client.key"), server_name="sbx.test") as c:
                async with c.claim("default") as sb:
                    return sb.info.state
        self.assertEqual(asyncio.run(run()), "ACTIVE")


if __name__ == "__main__":
    harness.main()
