"""Shared helpers for the kube-emulator Python tests (stdlib only).

Starts the emulator binary on a free loopback port, talks raw HTTP/1.1 to it
over keep-alive connections, and always kills the process at the end. For CRD
conversion: test CAs and serving certificates (openssl CLI), a ConversionReview
server over HTTPS, and a multi-version CRD converted by it.
"""
import base64
import copy
import http.client
import http.server
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

    def __init__(self, emu, path, token=None, ssl_context=None, headers=None):
        self.events = []
        self.ended = False
        self.broken = False
        self.cond = threading.Condition()
        sock = socket.create_connection((emu.host, emu.port), timeout=30)
        if emu.scheme == "https":
            sock = ssl_context.wrap_socket(sock, server_hostname=emu.host)
        self.sock = sock
        auth = "Authorization: Bearer %s\r\n" % token if token else ""
        auth += "".join("%s: %s\r\n" % kv for kv in (headers or {}).items())
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


# ---------------------------------------------------------------- CRD conversion webhooks

WEBHOOK_SERVICE = ("test-ns", "conv-webhook")  # namespace, name
WEBHOOK_DNS = "conv-webhook.test-ns.svc"


def make_ca(tmpdir, name):
    """Makes a CA (EC P-256) with openssl; returns (cert path, key path)."""
    crt, key = os.path.join(tmpdir, name + ".crt"), os.path.join(tmpdir, name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", crt,
                    "-days", "2", "-subj", "/CN=" + name], check=True, capture_output=True)
    return crt, key


def make_serving_cert(tmpdir, name, ca, sans):
    """Makes a serving certificate for `sans` ("DNS:x", "IP:y") signed by `ca` (cert, key);
    returns (cert path, key path)."""
    crt, key = os.path.join(tmpdir, name + ".crt"), os.path.join(tmpdir, name + ".key")
    csr, ext = os.path.join(tmpdir, name + ".csr"), os.path.join(tmpdir, name + ".cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=%s\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n" % ",".join(sans))
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=" + name)
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", crt, "-days", "2", "-extfile", ext)
    return crt, key


def ca_bundle(ca):
    """The caBundle field for CA (cert, key): base64 of the PEM."""
    with open(ca[0], "rb") as f:
        return base64.b64encode(f.read()).decode()


def free_port():
    """A loopback port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def convert_widget(obj, desired):
    """The toy Widget conversion: v1 and v1beta1 keep spec.size, v2 has spec.dimensions.size.
    Marks what it did in an annotation and (to be undone by the API server) the generation."""
    obj = copy.deepcopy(obj)
    spec = obj.get("spec") or {}
    if "dimensions" in spec:
        spec["size"] = spec.pop("dimensions").get("size")
    if desired.endswith("/v2") and "size" in spec:
        spec["dimensions"] = {"size": spec.pop("size")}
    obj["apiVersion"] = desired
    meta = obj.setdefault("metadata", {})
    meta.setdefault("annotations", {})["conv.example.com/converted-to"] = desired.split("/")[1]
    meta["generation"] = 99
    return obj


class ConversionWebhook:
    """A ConversionReview server over HTTPS on a thread (stdlib only); a context manager.

    `mode` selects what it answers: "ok", "fail" (a Failure result), "uid" (another uid),
    "count" (one object too many), "http500". `reviews` holds (path, content type, review)
    of every request.
    """

    def __init__(self, cert, convert=convert_widget):
        self.convert = convert
        self.mode = "ok"
        self.reviews = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                review = json.loads(raw)
                hook.reviews.append((self.path, self.headers.get("Content-Type"), review))
                req = review["request"]
                if hook.mode == "http500":
                    return self.answer(500, b"boom", "text/plain")
                resp = {"uid": req["uid"], "result": {"status": "Success"},
                        "convertedObjects": [hook.convert(o, req["desiredAPIVersion"])
                                             for o in req["objects"]]}
                if hook.mode == "fail":
                    resp = {"uid": req["uid"], "result": {
                        "status": "Failure", "message": "widgets cannot be converted today"}}
                elif hook.mode == "uid":
                    resp["uid"] = "not-" + req["uid"]
                elif hook.mode == "count":
                    resp["convertedObjects"].append(resp["convertedObjects"][0])
                self.answer(200, json.dumps({"apiVersion": review["apiVersion"],
                                             "kind": "ConversionReview",
                                             "response": resp}).encode())

            def answer(self, code, body, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # e.g. a client that refused the certificate

        self.httpd = Server(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert[0], cert[1])
        # The handshake runs on the connection's thread, not in accept().
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True,
                                            do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def widget_conversion_crd(client_config):
    """CRD widgets.conv.example.com: v1 (storage), v2 (spec.size as spec.dimensions.size),
    v1beta1 (deprecated, v1's shape) and v1alpha1 (not served), converted by a webhook at
    `client_config`."""
    def schema(v2):
        size = ({"dimensions": {"type": "object", "properties": {
            "size": {"type": "string", "enum": ["S", "M", "L"]}}}} if v2 else
                {"size": {"type": "string", "enum": ["S", "M", "L"]}})
        return {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": dict(size, color={"type": "string"})},
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}

    def version(name, v2=False, **kw):
        path = ".spec.dimensions.size" if v2 else ".spec.size"
        v = {"name": name, "served": True, "storage": False, "schema": schema(v2),
             "subresources": {"status": {}},
             "additionalPrinterColumns": [{"name": "Size", "type": "string", "jsonPath": path}]}
        v.update(kw)
        return v

    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.conv.example.com"},
        "spec": {
            "group": "conv.example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                      "listKind": "WidgetList"},
            "versions": [version("v1alpha1", served=False), version("v1beta1", deprecated=True),
                         version("v1", storage=True), version("v2", v2=True)],
            "conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": client_config, "conversionReviewVersions": ["v1"]}}}}
