#!/usr/bin/python3
"""Ports of sandboxes through sbx-server's port proxy (issue 35) end to end: a real
sbx-server with the local runtime and real bubblewrap, two tenants. A sandbox without
network runs `python3 -m http.server` and a WebSocket/raw echo server in the background;
clients reach them through the proxy with the tenant's token, with a signed URL, as a
WebSocket and through CONNECT. The attacks: tenant B reading A's port; A's signed URL
reused for another port or claim; forged and expired tokens; request smuggling
(Content-Length with Transfer-Encoding, two Content-Lengths); slowloris; a sandbox's own
process reaching the proxy (no network: not at all; with network: only with credentials);
2,000 idle WebSockets at bounded server memory.

Usage: ports_test.py PATH_TO_SBX_SERVER PROTO_DIR CONFIG_YAML PATH_TO_SBX_CLI
"""

import base64
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

import sbx_e2e

SERVER = PROTO = CONFIG = CLI = None
TENANT_A = (("authorization", "Bearer tok-a"),)
TENANT_B = (("authorization", "Bearer tok-b"),)
DOMAIN = "sbx.test"
HTTP_PORT, ECHO_PORT = 8000, 9000
HERE = os.path.dirname(os.path.abspath(__file__))


def resident_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def recv_until(s, marker, limit=1 << 20):
    data = b""
    while marker not in data and len(data) < limit:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def proxy_metrics(metrics_file):
    """The sbx_proxy_* series of the server's /metrics, by series name."""
    import urllib.request
    with open(metrics_file) as f:
        port = int(f.read())
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("sbx_proxy_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def ws_handshake(s, host, path="/", headers=""):
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\n{headers}\r\n").encode())
    return recv_until(s, b"\r\n\r\n")


def ws_frame(payload):
    mask = os.urandom(4)
    masked = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
    assert len(payload) < 126
    return bytes([0x82, 0x80 | len(payload)]) + mask + masked


def ws_read(s, n):
    """An unmasked server frame with an n-byte payload (n < 126)."""
    data = b""
    while len(data) < 2 + n:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data[2:]


class Ports(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-ports-", dir="/tmp")
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write("tok-a tenant-a\ntok-b tenant-b\n")
        port_file = os.path.join(cls.dir, "proxy_port")
        cls.metrics_file = os.path.join(cls.dir, "metrics_port")
        cls.server = sbx_e2e.Server(SERVER, cls.dir, CONFIG, (
            "--proxy_listen=127.0.0.1:0", f"--proxy_port_file={port_file}",
            f"--metrics_port_file={cls.metrics_file}", f"--proxy_domain={DOMAIN}", "--proxy_header_timeout_s=1",
            "--proxy_max_connections_per_sandbox=2100",
            "--proxy_max_connections_per_tenant=2200"), auth_tokens=cls.tokens)
        with open(port_file) as f:
            cls.proxy_port = int(f.read())
        from sbx.v1 import claims_pb2_grpc, sandboxes_pb2_grpc
        cls.claims = claims_pb2_grpc.ClaimServiceStub(cls.server.channel)
        cls.sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(cls.server.channel)
        cls.a = cls.claim("web-a", TENANT_A)
        cls.a2 = cls.claim("web-a2", TENANT_A)
        cls.b = cls.claim("web-b", TENANT_B)
        for c, md in ((cls.a, TENANT_A), (cls.a2, TENANT_A), (cls.b, TENANT_B)):
            cls.serve(c, md)

    @classmethod
    def tearDownClass(cls):
        if cls.server.proc.poll() is not None:
            print("sbx-server exited:", cls.server.proc.returncode, cls.server.logtext(),
                  file=sys.stderr)
        cls.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def claim(cls, claim_id, md, pool="default"):
        from sbx.v1 import claims_pb2
        return cls.claims.Claim(claims_pb2.ClaimRequest(pool=pool, claim_id=claim_id),
                                metadata=md, timeout=60).claim.claim_id

    @classmethod
    def serve(cls, claim_id, md):
        """hello.txt and both servers in the claim's sandbox, listening when it returns."""
        from sbx.v1 import sandboxes_pb2
        with open(os.path.join(HERE, "port_echo_server.py"), "rb") as f:
            echo = f.read()
        for path, content in (("echo.py", echo), ("hello.txt", f"hello from {claim_id}\n".encode())):
            cls.sandboxes.WriteFile(sandboxes_pb2.WriteFileRequest(
                claim_id=claim_id, path=path, content=content), metadata=md, timeout=30)
        for argv in (["python3", "-m", "http.server", str(HTTP_PORT), "--bind", "127.0.0.1"],
                     ["python3", "echo.py", str(ECHO_PORT)]):
            list(cls.sandboxes.StartProcess(sandboxes_pb2.StartProcessRequest(
                claim_id=claim_id, argv=argv, detach=True), metadata=md, timeout=30))
        probe = ("import socket,time\nfor p in (%d,%d):\n  for i in range(200):\n"
                 "    try: socket.create_connection(('127.0.0.1',p)).close(); break\n"
                 "    except OSError: time.sleep(0.05)\n" % (HTTP_PORT, ECHO_PORT))
        cls.exec(claim_id, ["python3", "-c", probe], md)

    @classmethod
    def exec(cls, claim_id, argv, md):
        """Runs argv in the sandbox; returns (exit code, stdout+stderr)."""
        from sbx.v1 import sandboxes_pb2
        start = sandboxes_pb2.ExecRequest(start=sandboxes_pb2.ExecStart(claim_id=claim_id,
                                                                        argv=argv))
        out, code = b"", None
        for r in cls.sandboxes.Exec(iter([start]), metadata=md, timeout=60):
            kind = r.WhichOneof("kind")
            if kind in ("stdout_chunk", "stderr_chunk"):
                out += getattr(r, kind)
            elif kind == "exit":
                code = r.exit.exit_code
        return code, out

    def get(self, path, host=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy_port, timeout=10)
        conn.request("GET", path, headers={"Host": host or "localhost", **(headers or {})})
        r = conn.getresponse()
        body = r.read()
        conn.close()
        return r.status, body

    def url_token(self, claim_id, port, md=TENANT_A, ttl=None):
        from google.protobuf import duration_pb2
        from sbx.v1 import sandboxes_pb2
        req = sandboxes_pb2.GetPortUrlRequest(claim_id=claim_id, port=port)
        if ttl is not None:
            req.ttl.CopyFrom(duration_pb2.Duration(seconds=ttl))
        return self.sandboxes.GetPortUrl(req, metadata=md, timeout=10)

    def raw(self, request, timeout=5):
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=timeout)
        s.sendall(request)
        data = recv_until(s, b"\r\n\r\n")
        s.close()
        return data

    # --- the tenant and signed URLs -------------------------------------------------------

    def test_tenant_token_host_and_path_form(self):
        st, body = self.get("/hello.txt", host=f"{HTTP_PORT}-{self.a}.{DOMAIN}",
                            headers={"Authorization": "Bearer tok-a"})
        self.assertEqual((st, body), (200, b"hello from web-a\n"))
        st, body = self.get(f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt",
                            headers={"Authorization": "Bearer tok-a"})
        self.assertEqual((st, body), (200, b"hello from web-a\n"))

    def test_keep_alive_requests_on_one_connection(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy_port, timeout=10)
        for _ in range(3):
            conn.request("GET", f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt",
                         headers={"Authorization": "Bearer tok-a"})
            r = conn.getresponse()
            self.assertEqual((r.status, r.read()), (200, b"hello from web-a\n"))
        conn.close()

    def test_signed_url_path_and_host_form(self):
        u = self.url_token(self.a, HTTP_PORT)
        self.assertIn(f"/_sbx/{self.a}/{HTTP_PORT}/?sbx_token=", u.url)
        self.assertTrue(u.host_url.startswith(f"http://{HTTP_PORT}-{self.a}.{DOMAIN}:"), u.host_url)
        st, body = self.get(f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt?sbx_token={u.token}")
        self.assertEqual((st, body), (200, b"hello from web-a\n"))
        st, body = self.get(f"/hello.txt?sbx_token={u.token}", host=f"{HTTP_PORT}-{self.a}.{DOMAIN}")
        self.assertEqual((st, body), (200, b"hello from web-a\n"))
        st, body = self.get("/hello.txt", host=f"{HTTP_PORT}-{self.a}.{DOMAIN}",
                            headers={"X-Sbx-Token": u.token})
        self.assertEqual((st, body), (200, b"hello from web-a\n"))

    def test_cli_url_is_a_working_signed_url(self):
        env = {**os.environ, "SBX_SERVER": self.server.target, "SBX_TOKEN": "tok-a"}
        out = subprocess.run([CLI, "url", "--ttl", "5m", self.a, str(HTTP_PORT)], env=env,
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        url = out.stdout.strip()
        prefix = f"http://127.0.0.1:{self.proxy_port}"
        self.assertTrue(url.startswith(prefix + f"/_sbx/{self.a}/{HTTP_PORT}/?sbx_token="), url)
        path, _, query = url[len(prefix):].partition("?")
        st, body = self.get(path + "hello.txt?" + query)  # a browser's fetch, no token header
        self.assertEqual((st, body), (200, b"hello from web-a\n"))
        out = subprocess.run([CLI, "url", "--host", self.a, str(HTTP_PORT)], env=env,
                             capture_output=True, text=True, timeout=30)
        self.assertTrue(out.stdout.startswith(f"http://{HTTP_PORT}-{self.a}.{DOMAIN}:"), out)
        env["SBX_TOKEN"] = "tok-b"
        out = subprocess.run([CLI, "url", self.a, str(HTTP_PORT)], env=env,
                             capture_output=True, text=True, timeout=30)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("NOT_FOUND", out.stderr)

    def test_cli_port_forward(self):
        env = {**os.environ, "SBX_SERVER": self.server.target, "SBX_TOKEN": "tok-a"}
        proc = subprocess.Popen([CLI, "port-forward", self.a, f"0:{HTTP_PORT}"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            self.assertTrue(line.startswith("Forwarding from 127.0.0.1:"), line)
            local = int(line.split()[2].rsplit(":", 1)[1])
            for _ in range(3):  # three connections, each its own tunnel
                conn = http.client.HTTPConnection("127.0.0.1", local, timeout=10)
                conn.request("GET", "/hello.txt")
                r = conn.getresponse()
                self.assertEqual((r.status, r.read()), (200, b"hello from web-a\n"))
                conn.close()
        finally:
            proc.kill()
            proc.wait(10)
            proc.stdout.close()
            proc.stderr.close()
        env["SBX_TOKEN"] = "tok-b"
        out = subprocess.run([CLI, "port-forward", self.a, f"0:{HTTP_PORT}"], env=env,
                             capture_output=True, text=True, timeout=30)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("NOT_FOUND", out.stderr)

    # --- attacks ---------------------------------------------------------------------------

    def test_no_credential_or_unknown_claim_is_refused(self):
        st, body = self.get(f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt")
        self.assertEqual(st, 401, body)
        st, body = self.get(f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt",
                            headers={"Authorization": "Bearer not-a-token"})
        self.assertEqual(st, 401, body)
        st, body = self.get(f"/_sbx/no-such-claim/{HTTP_PORT}/hello.txt",
                            headers={"Authorization": "Bearer tok-a"})
        self.assertEqual(st, 404, body)

    def forwarded(self):
        return proxy_metrics(self.metrics_file).get("sbx_proxy_forwarded_total", 0)

    def test_tenant_b_cannot_read_a_port(self):
        before = self.forwarded()
        for path, host in ((f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt", None),
                           ("/hello.txt", f"{HTTP_PORT}-{self.a}.{DOMAIN}")):
            st, body = self.get(path, host=host, headers={"Authorization": "Bearer tok-b"})
            self.assertEqual(st, 404, body)
            self.assertNotIn(b"hello from", body)
        with self.assertRaises(grpc.RpcError) as e:
            self.url_token(self.a, HTTP_PORT, md=TENANT_B)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(self.forwarded(), before, "a refused request reached a sandbox")
        # B's own claim still works for B.
        st, body = self.get(f"/_sbx/{self.b}/{HTTP_PORT}/hello.txt",
                            headers={"Authorization": "Bearer tok-b"})
        self.assertEqual((st, body), (200, b"hello from web-b\n"))

    def test_signed_url_is_only_for_its_claim_and_port(self):
        token = self.url_token(self.a, HTTP_PORT).token
        before = self.forwarded()
        for claim_id, port in ((self.a, ECHO_PORT), (self.a2, HTTP_PORT), (self.b, HTTP_PORT)):
            st, body = self.get(f"/_sbx/{claim_id}/{port}/hello.txt?sbx_token={token}")
            self.assertEqual(st, 403, (claim_id, port, body))
            self.assertNotIn(b"hello from", body)
        self.assertEqual(self.forwarded(), before, "a refused request reached a sandbox")

    def test_forged_and_expired_tokens_are_refused(self):
        token = self.url_token(self.a, HTTP_PORT).token
        payload, mac = token.split(".")
        # Another port in the payload, the old signature.
        forged = base64.urlsafe_b64encode(
            base64.urlsafe_b64decode(payload + "==").replace(b"|8000|", b"|9000|")).decode()
        raw_mac = base64.urlsafe_b64decode(mac + "==")
        flipped = base64.urlsafe_b64encode(bytes([raw_mac[0] ^ 1]) + raw_mac[1:]).decode()
        for bad, port in ((f"{forged}.{mac}", ECHO_PORT), (f"{payload}.{flipped}", HTTP_PORT),
                          ("garbage", HTTP_PORT), (f"{payload}.", HTTP_PORT)):
            st, body = self.get(f"/_sbx/{self.a}/{port}/hello.txt?sbx_token={bad}")
            self.assertEqual(st, 401, (bad, body))
        short = self.url_token(self.a, HTTP_PORT, ttl=1).token
        st, _ = self.get(f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt?sbx_token={short}")
        self.assertEqual(st, 200)
        time.sleep(2.1)
        st, body = self.get(f"/_sbx/{self.a}/{HTTP_PORT}/hello.txt?sbx_token={short}")
        self.assertEqual(st, 401, body)
        self.assertIn(b"expired", body)

    def test_smuggling_content_length_with_transfer_encoding_is_refused(self):
        data = self.raw((f"POST /_sbx/{self.a}/{HTTP_PORT}/ HTTP/1.1\r\nHost: x\r\n"
                         "Authorization: Bearer tok-a\r\nContent-Length: 4\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode())
        self.assertTrue(data.startswith(b"HTTP/1.1 400"), data)
        data = self.raw((f"POST /_sbx/{self.a}/{HTTP_PORT}/ HTTP/1.1\r\nHost: x\r\n"
                         "Authorization: Bearer tok-a\r\nTransfer-Encoding: chunked\r\n"
                         "Content-Length: 4\r\n\r\n0\r\n\r\n").encode())
        self.assertTrue(data.startswith(b"HTTP/1.1 400"), data)

    def test_smuggling_two_content_lengths_is_refused(self):
        for a, b in ((4, 10), (4, 4)):
            data = self.raw((f"POST /_sbx/{self.a}/{HTTP_PORT}/ HTTP/1.1\r\nHost: x\r\n"
                             f"Authorization: Bearer tok-a\r\nContent-Length: {a}\r\n"
                             f"Content-Length: {b}\r\n\r\nabcd").encode())
            self.assertTrue(data.startswith(b"HTTP/1.1 400"), data)

    def test_smuggling_other_transfer_encodings_are_refused(self):
        for te in ("xchunked", "chunked\r\nTransfer-Encoding: chunked", "identity"):
            data = self.raw((f"POST /_sbx/{self.a}/{HTTP_PORT}/ HTTP/1.1\r\nHost: x\r\n"
                             f"Authorization: Bearer tok-a\r\nTransfer-Encoding: {te}\r\n"
                             "\r\n0\r\n\r\n").encode())
            self.assertTrue(data.startswith(b"HTTP/1.1 400"), (te, data))

    def test_smuggling_on_a_kept_alive_connection_closes_it(self):
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=5)
        s.sendall((f"GET /_sbx/{self.a}/{HTTP_PORT}/hello.txt HTTP/1.1\r\nHost: x\r\n"
                   "Authorization: Bearer tok-a\r\n\r\n").encode())
        first = recv_until(s, b"hello from web-a\n")
        self.assertIn(b"200", first.split(b"\r\n")[0])
        s.sendall((f"POST /_sbx/{self.a}/{HTTP_PORT}/ HTTP/1.1\r\nHost: x\r\n"
                   "Content-Length: 4\r\nContent-Length: 9\r\n\r\nabcd").encode())
        try:
            rest = recv_until(s, b"\r\n\r\n")
        except ConnectionResetError:
            rest = b""  # closed with the refused request unread: a reset
        self.assertNotIn(b"HTTP/1.0 501", rest)  # http.server never saw the POST
        self.assertNotIn(b"HTTP/1.0 200", rest)
        s.close()

    def test_slowloris_is_cut_by_the_header_timeout(self):
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        start = time.time()
        s.sendall(f"GET /_sbx/{self.a}/{HTTP_PORT}/ HTTP/1.1\r\n".encode())
        got = b""
        try:
            for i in range(100):  # one header byte every 0.1 s: 10 s if never cut
                s.sendall(b"X")
                time.sleep(0.1)
        except OSError:
            pass
        try:
            got = s.recv(4096)
        except OSError:
            pass
        elapsed = time.time() - start
        s.close()
        self.assertLess(elapsed, 5, "the slow header was not cut by --proxy_header_timeout_s=1")
        self.assertTrue(got == b"" or got.startswith(b"HTTP/1.1 408"), got)

    def test_header_too_large(self):
        data = self.raw((f"GET /_sbx/{self.a}/{HTTP_PORT}/ HTTP/1.1\r\nHost: x\r\n"
                         f"X-Big: {'a' * 20000}\r\n\r\n").encode())
        self.assertTrue(data.startswith(b"HTTP/1.1 431"), data[:100])

    def test_sandbox_without_network_cannot_reach_the_proxy(self):
        probe = ("import socket\ntry:\n socket.create_connection(('127.0.0.1',%d),timeout=2)\n"
                 " print('REACHED')\nexcept OSError as e:\n print('REFUSED', e)\n" % self.proxy_port)
        code, out = self.exec(self.a, ["python3", "-c", probe], TENANT_A)
        self.assertIn(b"REFUSED", out)

    def test_sandbox_with_network_reaches_no_other_sandbox_through_the_proxy(self):
        net = self.claim("net-b", TENANT_B, pool="net")
        self.addCleanup(self.release, net, TENANT_B)
        probe = (
            "import socket,sys\n"
            "def get(path, extra=''):\n"
            " s=socket.create_connection(('127.0.0.1',%d),timeout=5)\n"
            " s.sendall(('GET '+path+' HTTP/1.1\\r\\nHost: x\\r\\n'+extra+'\\r\\n').encode())\n"
            " print(s.recv(200).split(b'\\r\\n')[0].decode())\n"
            "get('/_sbx/%s/%d/hello.txt')\n"
            "get('/_sbx/%s/%d/hello.txt', 'Authorization: Bearer guessed\\r\\n')\n"
            % (self.proxy_port, self.a, HTTP_PORT, self.a, HTTP_PORT))
        code, out = self.exec(net, ["python3", "-c", probe], TENANT_B)
        lines = out.decode().split("\n")
        self.assertTrue(lines[0].startswith("HTTP/1.1 401"), out)
        self.assertTrue(lines[1].startswith("HTTP/1.1 401"), out)

    def release(self, claim_id, md):
        from sbx.v1 import claims_pb2
        try:
            self.claims.Release(claims_pb2.ReleaseRequest(claim_id=claim_id), metadata=md,
                                timeout=30)
        except grpc.RpcError:
            pass

    # --- WebSocket, CONNECT, many idle WebSockets -----------------------------------------

    def test_websocket_echo(self):
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        head = ws_handshake(s, f"{ECHO_PORT}-{self.a}.{DOMAIN}",
                            headers="Authorization: Bearer tok-a\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        for msg in (b"ping", b"x" * 100):
            s.sendall(ws_frame(msg))
            self.assertEqual(ws_read(s, len(msg)), msg)
        s.close()
        # As a browser opens it: the signed URL's token in the query, no header.
        token = self.url_token(self.a, ECHO_PORT).token
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        head = ws_handshake(s, "x", path=f"/_sbx/{self.a}/{ECHO_PORT}/ws?sbx_token={token}")
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        s.sendall(ws_frame(b"by url"))
        self.assertEqual(ws_read(s, 6), b"by url")
        s.close()
        # ... and that token does not open the HTTP port.
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        head = ws_handshake(s, "x", path=f"/_sbx/{self.a}/{HTTP_PORT}/ws?sbx_token={token}")
        s.close()
        self.assertTrue(head.startswith(b"HTTP/1.1 403"), head)

    def test_connect_tunnel(self):
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        s.sendall((f"CONNECT {self.a}:{ECHO_PORT} HTTP/1.1\r\nHost: {self.a}:{ECHO_PORT}\r\n"
                   "Proxy-Authorization: Bearer tok-a\r\n\r\n").encode())
        head = recv_until(s, b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        s.sendall(b"raw bytes\n")
        self.assertEqual(recv_until(s, b"\n"), b"raw bytes\n")
        s.close()
        # The host form, as an HTTPS client through a proxy would send it.
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        s.sendall((f"CONNECT {ECHO_PORT}-{self.a}.{DOMAIN}:443 HTTP/1.1\r\nHost: x\r\n"
                   "Proxy-Authorization: Bearer tok-a\r\n\r\n").encode())
        self.assertTrue(recv_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 200"))
        s.sendall(b"host form\n")
        self.assertEqual(recv_until(s, b"\n"), b"host form\n")
        s.close()
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        s.sendall((f"CONNECT {self.a}:{ECHO_PORT} HTTP/1.1\r\nHost: x\r\n"
                   "Proxy-Authorization: Bearer tok-b\r\n\r\n").encode())
        self.assertTrue(recv_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 404"))
        s.close()

    def test_client_leaving_ends_a_connection_close_request_whose_upstream_stays(self):
        # The echo server answers a GET with 101 and never closes: the proxy must still let
        # the session go when the client does, not hold it until the idle timeout.
        fds = lambda: len(os.listdir(f"/proc/{self.server.proc.pid}/fd"))
        before = fds()
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
            s.sendall((f"GET /_sbx/{self.a}/{ECHO_PORT}/ HTTP/1.1\r\nHost: x\r\n"
                       "Connection: close\r\nAuthorization: Bearer tok-a\r\n\r\n").encode())
            self.assertTrue(recv_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 101"))
            s.close()
        sbx_e2e.wait_for(lambda: fds() <= before + 5, 10,
                         f"the server's descriptors back near {before} (now {fds()})")

    def forwarded_request(self, request, done):
        """Sends `request` to the raw echo server through the proxy; returns what it got
        (what the sandbox received) once done(got) is true or the stream ends."""
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=20)
        s.sendall(request)
        got = b""
        while not done(got):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        s.close()
        return got

    def test_request_bodies_reach_the_sandbox_intact_without_the_tenant_token(self):
        body = os.urandom(100_000)  # several of the proxy's 16 KiB pieces
        head = (f"POST /_sbx/{self.a}/{ECHO_PORT}/upload?x=1&sbx_token=abc HTTP/1.1\r\n"
                f"Host: x\r\nAuthorization: Bearer tok-a\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        got = self.forwarded_request(
            head + body, lambda g: b"\r\n\r\n" in g and
            len(g.partition(b"\r\n\r\n")[2]) >= len(body))
        seen_head, _, seen_body = got.partition(b"\r\n\r\n")
        self.assertTrue(seen_head.startswith(b"POST /upload?x=1 HTTP/1.1\r\n"), seen_head)
        self.assertNotIn(b"tok-a", seen_head)
        self.assertNotIn(b"sbx_token", seen_head)
        self.assertEqual(seen_body, body)
        # Chunked: decoded by Beast's parser and chunked again by its serializer.
        parts = [os.urandom(n) for n in (10, 40_000, 1)]
        chunked = b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
        head = (f"POST /_sbx/{self.a}/{ECHO_PORT}/c HTTP/1.1\r\nHost: x\r\n"
                "Authorization: Bearer tok-a\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        got = self.forwarded_request(head + chunked, lambda g: g.endswith(b"\r\n0\r\n\r\n"))
        seen_head, _, rest = got.partition(b"\r\n\r\n")
        self.assertIn(b"transfer-encoding: chunked", seen_head.lower())
        decoded = b""
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";")[0], 16)
            if n == 0:
                break
            decoded += rest[:n]
            rest = rest[n + 2:]
        self.assertEqual(decoded, b"".join(parts))

    def test_large_download_and_tunnel_are_byte_exact(self):
        # Bulk transfers go through splice(2) after the first full read: both paths checked.
        code, out = self.exec(self.a, ["python3", "-c",
                                       "open('big.bin','wb').write(bytes(range(256))*32768)"],
                              TENANT_A)
        self.assertEqual(code, 0, out)
        st, body = self.get(f"/_sbx/{self.a}/{HTTP_PORT}/big.bin",
                            headers={"Authorization": "Bearer tok-a"})
        self.assertEqual(st, 200)
        self.assertEqual(body, bytes(range(256)) * 32768)
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=30)
        s.sendall((f"CONNECT {self.a}:{ECHO_PORT} HTTP/1.1\r\nHost: x\r\n"
                   "Proxy-Authorization: Bearer tok-a\r\n\r\n").encode())
        self.assertTrue(recv_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 200"))
        data = os.urandom(6 << 20)
        got = bytearray()

        def reader():
            while len(got) < len(data):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                got.extend(chunk)
        import threading
        t = threading.Thread(target=reader)
        t.start()
        s.sendall(data)
        t.join(30)
        s.close()
        self.assertEqual(len(got), len(data))
        self.assertTrue(bytes(got) == data, "the tunnel changed bytes")

    def test_zz_two_thousand_idle_websockets_cost_bounded_memory(self):
        n = 2000
        before = resident_bytes(self.server.proc.pid)
        socks = []
        start = time.time()
        try:
            for i in range(n):
                s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
                head = ws_handshake(s, f"{ECHO_PORT}-{self.b}.{DOMAIN}",
                                    headers="Authorization: Bearer tok-b\r\n")
                self.assertTrue(head.startswith(b"HTTP/1.1 101"), (i, head))
                socks.append(s)
            opened = time.time() - start
            time.sleep(0.5)
            during = resident_bytes(self.server.proc.pid)
            per = (during - before) / n
            print(f"\n{n} idle WebSockets opened in {opened:.2f} s; server RSS {before >> 20} -> "
                  f"{during >> 20} MiB ({per:.0f} B per connection)", file=sys.stderr)
            # Each is two sockets, a timer and a session: far below the 64 KiB pump buffer
            # a connection would hold if buffers were per connection.
            self.assertLess(per, 16 * 1024)
            for s in (socks[0], socks[-1]):
                s.sendall(ws_frame(b"still here"))
                self.assertEqual(ws_read(s, 10), b"still here")
        finally:
            for s in socks:
                s.close()


class PortLimits(unittest.TestCase):
    """A server of its own with small limits: 2 connections per sandbox, 3 per tenant, idle
    connections closed after 1 s."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sbx-portlimits-", dir="/tmp")
        tokens = os.path.join(cls.dir, "tokens")
        with open(tokens, "w") as f:
            f.write("tok-a tenant-a\n")
        port_file = os.path.join(cls.dir, "proxy_port")
        cls.metrics_file = os.path.join(cls.dir, "metrics_port")
        cls.server = sbx_e2e.Server(SERVER, cls.dir, CONFIG, (
            "--proxy_listen=127.0.0.1:0", f"--proxy_port_file={port_file}",
            f"--metrics_port_file={cls.metrics_file}",
            "--proxy_max_connections_per_sandbox=2", "--proxy_max_connections_per_tenant=3",
            "--proxy_idle_timeout_s=1", f"--proxy_max_bytes_per_second={RATE}"),
            auth_tokens=tokens)
        with open(port_file) as f:
            cls.proxy_port = int(f.read())
        from sbx.v1 import claims_pb2_grpc, sandboxes_pb2_grpc
        Ports.claims = claims_pb2_grpc.ClaimServiceStub(cls.server.channel)
        Ports.sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(cls.server.channel)
        cls.c1 = Ports.claim("lim-1", TENANT_A)
        cls.c2 = Ports.claim("lim-2", TENANT_A)
        for c in (cls.c1, cls.c2):
            Ports.serve(c, TENANT_A)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(cls.dir)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def ws(self, claim_id):
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        head = ws_handshake(s, "x", path=f"/_sbx/{claim_id}/{ECHO_PORT}/",
                            headers="Authorization: Bearer tok-a\r\n")
        return s, head

    def test_connections_per_sandbox_and_per_tenant_and_idle_timeout(self):
        held = []
        try:
            for _ in range(2):
                s, head = self.ws(self.c1)
                self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
                held.append(s)
            s, head = self.ws(self.c1)
            s.close()
            self.assertTrue(head.startswith(b"HTTP/1.1 429"), head)
            s, head = self.ws(self.c2)  # another sandbox: the tenant's third
            self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
            held.append(s)
            s, head = self.ws(self.c2)  # the tenant's fourth
            s.close()
            self.assertTrue(head.startswith(b"HTTP/1.1 429"), head)
            # Idle for more than --proxy_idle_timeout_s=1: closed by the proxy, and the
            # slots are free again.
            start = time.time()
            self.assertEqual(held[0].recv(10), b"")
            self.assertLess(time.time() - start, 5)
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        s, head = self.ws(self.c1)
        s.close()
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        # The refusals are counted by reason on /metrics.
        metrics = proxy_metrics(self.metrics_file)
        self.assertEqual(metrics.get('sbx_proxy_refused_total{reason="limit"}'), 2, metrics)
        self.assertGreaterEqual(metrics.get("sbx_proxy_forwarded_total", 0), 4, metrics)
        self.assertGreaterEqual(metrics.get("sbx_proxy_accepted_total", 0), 6, metrics)


    def test_bytes_per_second_slow_a_connection_each_way(self):
        """--proxy_max_bytes_per_second: a download and a tunnel's upload through one
        connection each cannot beat the limit (a burst of one second's worth, then the rate),
        arrive byte-exact, and are slowed, not cut by the 1 s idle timeout. The bound is a
        lower one only: a loaded machine makes them slower, never faster."""
        code, out = Ports.exec(self.c2, ["python3", "-c",
                                         "open('mib.bin','wb').write(bytes(range(256))*4096)"],
                               TENANT_A)
        self.assertEqual(code, 0, out)
        floor = (len(bytes(range(256)) * 4096) - RATE) / RATE  # 3 s for 1 MiB at 256 KiB/s
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.proxy_port, timeout=30)
        conn.request("GET", f"/_sbx/{self.c2}/{HTTP_PORT}/mib.bin",
                     headers={"Authorization": "Bearer tok-a"})
        r = conn.getresponse()
        body = r.read()
        conn.close()
        took = time.monotonic() - start
        self.assertEqual(r.status, 200)
        self.assertEqual(body, bytes(range(256)) * 4096)
        self.assertGreaterEqual(took, floor * 0.9, "1 MiB in %.2f s: faster than the limit" % took)
        # Upwards: 768 KiB into a tunnel to the echo server (the echo comes back slowed too).
        data = os.urandom(3 * RATE)
        s = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=30)
        try:
            s.sendall((f"CONNECT {self.c2}:{ECHO_PORT} HTTP/1.1\r\nHost: x\r\n"
                       "Proxy-Authorization: Bearer tok-a\r\n\r\n").encode())
            self.assertTrue(recv_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 200"))
            got = bytearray()
            import threading

            def reader():
                while len(got) < len(data):
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        break
                    got.extend(chunk)
            t = threading.Thread(target=reader)
            start = time.monotonic()
            t.start()
            s.sendall(data)
            t.join(60)
            took = time.monotonic() - start
        finally:
            s.close()
        self.assertEqual(bytes(got), data)
        self.assertGreaterEqual(took, (len(data) - RATE) / RATE * 0.9,
                                "768 KiB up in %.2f s: faster than the limit" % took)


RATE = 256 * 1024  # --proxy_max_bytes_per_second of the Limits server

if __name__ == "__main__":
    SERVER, PROTO, CONFIG, CLI = sys.argv[1:5]
    sbx_e2e.generate_stubs(PROTO)
    unittest.main(argv=[sys.argv[0]], verbosity=2)
