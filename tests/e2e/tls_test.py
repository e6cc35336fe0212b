#!/usr/bin/python3
"""TLS and mTLS of sbx-server, from Python's grpcio: certificates are made at test time
with the openssl command in a temporary folder (a CA, a server certificate for 127.0.0.1
and localhost, a client certificate, and a client certificate from another CA).

Usage: tls_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import grpc

import sbx_e2e

SERVER = PROTO = CONFIG = None


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                f"/CN=sbx test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ca in (("server", "ca"), ("client", "ca"), ("intruder", "other-ca")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
                f"{name}.key", "-out", f"{name}.csr", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", f"{name}.pem",
                cwd=d)


def read(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-tls-", dir="/tmp")
        make_pki(cls.dir)

    @classmethod
    def tearDownClass(cls):
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def start(self, *flags):
        server = sbx_e2e.Server(SERVER, self.dir, CONFIG, ("--runtime=none", *flags))
        self.addCleanup(server.stop, signal.SIGTERM)
        return server

    def ping(self, target, creds):
        from sbx.v1 import diagnostics_pb2, diagnostics_pb2_grpc
        options = (("grpc.ssl_target_name_override", "localhost"),)
        channel = (grpc.secure_channel(target, creds, options) if creds is not None
                   else grpc.insecure_channel(target))
        with channel:
            stub = diagnostics_pb2_grpc.DiagnosticsServiceStub(channel)
            return stub.Ping(diagnostics_pb2.PingRequest(payload=b"tls"), timeout=5)

    def test_tls(self):
        d = self.dir
        server = self.start(f"--tls_cert_file={d}/server.pem", f"--tls_key_file={d}/server.key")
        ok = grpc.ssl_channel_credentials(root_certificates=read(d, "ca.pem"))
        self.assertEqual(self.ping(server.target, ok).payload, b"tls")
        with self.assertRaises(grpc.RpcError) as e:
            self.ping(server.target, None)  # plaintext to a TLS port
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        wrong_ca = grpc.ssl_channel_credentials(root_certificates=read(d, "other-ca.pem"))
        with self.assertRaises(grpc.RpcError) as e:
            self.ping(server.target, wrong_ca)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_mtls_requires_a_client_certificate_from_the_ca(self):
        d = self.dir
        server = self.start(f"--tls_cert_file={d}/server.pem", f"--tls_key_file={d}/server.key",
                            f"--tls_client_ca_file={d}/ca.pem")
        with_cert = grpc.ssl_channel_credentials(read(d, "ca.pem"), read(d, "client.key"),
                                                 read(d, "client.pem"))
        self.assertEqual(self.ping(server.target, with_cert).payload, b"tls")
        for creds in (grpc.ssl_channel_credentials(read(d, "ca.pem")),
                      grpc.ssl_channel_credentials(read(d, "ca.pem"), read(d, "intruder.key"),
                                                   read(d, "intruder.pem"))):
            with self.assertRaises(grpc.RpcError) as e:
                self.ping(server.target, creds)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_bad_tls_flags_fail_at_start(self):
        d = self.dir
        cases = [
            ([f"--tls_cert_file={d}/server.pem"], "go together"),
            ([f"--tls_cert_file={d}/missing.pem", f"--tls_key_file={d}/server.key"],
             "missing.pem"),
            ([f"--tls_cert_file={d}/san.ext", f"--tls_key_file={d}/server.key"], "not PEM"),
            ([f"--tls_client_ca_file={d}/ca.pem"], "needs tls_cert_file"),
        ]
        for flags, message in cases:
            proc = subprocess.run(
                [SERVER, "--listen=127.0.0.1:0", "--metrics_listen=off", "--runtime=none",
                 f"--data_dir={d}/data-bad",
                 "--insecure_no_auth", *flags], capture_output=True, text=True, timeout=30)
            self.assertNotEqual(proc.returncode, 0, flags)
            self.assertIn(message, proc.stderr, flags)


if __name__ == "__main__":
    SERVER, PROTO, CONFIG = (os.path.abspath(a) for a in sys.argv[1:4])
    del sys.argv[1:4]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main()
