"""Shared helpers for the kube-emulator Python tests (stdlib only).

Starts the emulator binary on a free loopback port, talks raw HTTP/1.1 to it
over keep-alive connections, and always kills the process at the end.
"""
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse


class Emulator:
    """A kube-emulator process; use as a context manager."""

    def __init__(self, binary, *flags):
        self.binary = binary
        self.flags = list(flags)
        self.proc = None
        self.url = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [self.binary, "--listen", "127.0.0.1:0", *self.flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        prefix = "kube-emulator: serving on "
        if not line.startswith(prefix):
            self.proc.kill()
            raise RuntimeError("emulator did not start: %r %s" % (line, self.proc.stderr.read()))
        self.url = line[len(prefix):]
        parsed = urllib.parse.urlparse(self.url)
        self.host, self.port, self.scheme = parsed.hostname, parsed.port, parsed.scheme
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.proc.stdout.close()
            self.proc.stderr.close()

    def client(self, **kw):
        return Client(self, **kw)


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.raw = body
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def __repr__(self):
        return "Response(%d, %s)" % (self.status, self.raw[:300])


class Client:
    """Keep-alive HTTP client; reconnects when the server closes."""

    def __init__(self, emu, token=None, ssl_context=None, timeout=10):
        self.emu = emu
        self.token = token
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.conn = None

    def _connect(self):
        if self.emu.scheme == "https":
            return http.client.HTTPSConnection(self.emu.host, self.emu.port, timeout=self.timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection(self.emu.host, self.emu.port, timeout=self.timeout)

    def request(self, method, path, body=None, ctype="application/json", headers=None):
        hdrs = {"Accept": "application/json"}
        if self.token:
            hdrs["Authorization"] = "Bearer " + self.token
        if headers:
            hdrs.update(headers)
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            hdrs["Content-Type"] = ctype
        for attempt in range(2):
            if self.conn is None:
                self.conn = self._connect()
            try:
                self.conn.request(method, path, body=data, headers=hdrs)
                r = self.conn.getresponse()
                raw = r.read().decode()
                if r.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return Response(r.status, dict(r.getheaders()), raw)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def put(self, path, body, **kw):
        return self.request("PUT", path, body, **kw)

    def patch(self, path, body, ctype="application/merge-patch+json", **kw):
        return self.request("PATCH", path, body, ctype=ctype, **kw)

    def delete(self, path, body=None, **kw):
        return self.request("DELETE", path, body, **kw)

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None


class Watch:
    """Reads a watch stream on a background thread into a list of events.

    Parses the chunked encoding itself so that a stream cut without the
    terminating chunk (broken) is told apart from a clean end (ended).
    """

    def __init__(self, emu, path, token=None, ssl_context=None):
        self.events = []
        self.ended = False
        self.broken = False
        self.cond = threading.Condition()
        sock = socket.create_connection((emu.host, emu.port), timeout=30)
        if emu.scheme == "https":
            sock = ssl_context.wrap_socket(sock, server_hostname=emu.host)
        self.sock = sock
        auth = "Authorization: Bearer %s\r\n" % token if token else ""
        sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nAccept: application/json\r\n%s\r\n"
                      % (path, emu.host, emu.port, auth)).encode())
        self.f = sock.makefile("rb")
        status_line = self.f.readline().decode()
        self.status = int(status_line.split()[1])
        self.headers = {}
        while True:
            line = self.f.readline().decode().strip()
            if not line:
                break
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        buf = b""
        try:
            while True:
                size_line = self.f.readline()
                if not size_line.endswith(b"\r\n"):
                    raise ConnectionError("stream cut")
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    self.f.readline()
                    with self.cond:
                        self.ended = True
                    break
                data = self.f.read(size)
                if len(data) < size or self.f.readline() != b"\r\n":
                    raise ConnectionError("stream cut")
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        with self.cond:
                            self.events.append(json.loads(line))
                            self.cond.notify_all()
        except (ConnectionError, OSError, ValueError):
            with self.cond:
                self.broken = True
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pred, timeout=10):
        deadline = time.time() + timeout
        with self.cond:
            while not pred(self.events):
                left = deadline - time.time()
                if left <= 0 or self.ended or self.broken:
                    return pred(self.events)
                self.cond.wait(left)
            return True

    def wait_end(self, timeout=10):
        deadline = time.time() + timeout
        with self.cond:
            while not (self.ended or self.broken):
                left = deadline - time.time()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def wait_until(fn, timeout=10, interval=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(interval)
    return fn()


def make_tls(tmpdir):
    """Makes a CA and a server certificate for 127.0.0.1 with openssl; returns paths."""
    ca_key = os.path.join(tmpdir, "ca.key")
    ca_crt = os.path.join(tmpdir, "ca.crt")
    key = os.path.join(tmpdir, "server.key")
    csr = os.path.join(tmpdir, "server.csr")
    crt = os.path.join(tmpdir, "server.crt")
    ext = os.path.join(tmpdir, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out",
        ca_crt, "-days", "2", "-subj", "/CN=emu-test-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj",
        "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key,
        "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext)
    return ca_crt, crt, key
