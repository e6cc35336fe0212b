#!/usr/bin/env python3
"""The port proxy (sbx-server --proxy_listen) against going straight to the server in the
sandbox, in one run: HTTP GET latency on a kept-alive connection and on a new connection
each time, the throughput of a large download, and a WebSocket echo round trip; then N
idle WebSockets through the proxy and the server's resident memory. Prints tables;
asserts nothing.

  bench/port_proxy_bench.py --server build/clang/src/cmd/sbx-server [--gets 5000]
                            [--download_mib 1024] [--websockets 10000]

The baseline needs a port the client can reach without the proxy: the sandbox of the
bench's pool has the host's network (template `network: true`), so its server listens on
the host's loopback; "direct" connects there, "proxy" goes through the proxy, whose relay
gets its socket from the sandbox's daemon (the path a sandbox without network takes too).
One more line measures the proxy to a sandbox without network (the default). The servers
in the sandbox are small Python programs (a fixed response per request; a stream of a
preallocated 1 MiB block; tests/e2e/port_echo_server.py for WebSockets); the client is
Python on raw sockets, the same code for both paths, so the difference is the proxy's.

The same server also runs the E2B listener (--e2b_listen), and "e2b" rows send the same
requests there, addressed as E2B clients address a sandbox port (E2b-Sandbox-Id,
E2b-Sandbox-Port, X-Access-Token: the envdAccessToken of GET /sandboxes/{id}): the
listener parses the header and hands the connection to the proxy (docs/e2b.md), so
"e2b" minus "proxy" is what that hand-off costs.
"""
import json
import urllib.request
import argparse
import base64
import os
import resource
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "e2e"))
import sbx_e2e  # noqa: E402

CONFIG = """
templates:
  - name: net
    runtime: local
    local: {network: true}
  - name: nonet
    runtime: local
    local: {network: false}
pools:
  - {name: net, template: net, min_warm: 1, max_warm: 1, empty_pool_policy: wait, default_wait: 60s}
  - {name: nonet, template: nonet, min_warm: 1, max_warm: 1, empty_pool_policy: wait, default_wait: 60s}
"""

HTTP_SERVER = r"""
import socket, sys, threading
BLOCK = b"x" * (1 << 20)
SMALL = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                c.close(); return
            buf += d
        head, _, buf = buf.partition(b"\r\n\r\n")
        path = head.split(b" ")[1]
        if path.startswith(b"/big"):
            n = int(path.split(b"=")[1])
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
            while n > 0:
                k = min(n, len(BLOCK))
                c.sendall(BLOCK[:k] if k < len(BLOCK) else BLOCK)
                n -= k
        else:
            c.sendall(SMALL)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1024)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def recv_response(s, buf=b""):
    """Reads one response with a Content-Length; returns (body length, leftover)."""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise EOFError
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
    while len(rest) < n:
        d = s.recv(1 << 20)
        if not d:
            raise EOFError
        rest += d
    return n, rest[n:]


def connect(addr):
    s = socket.create_connection(addr, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def gets_kept_alive(addr, path, headers, n):
    s = connect(addr)
    req = f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode()
    lat, left = [], b""
    for _ in range(n):
        t = time.perf_counter()
        s.sendall(req)
        _, left = recv_response(s, left)
        lat.append(time.perf_counter() - t)
    s.close()
    return lat


def gets_new_connection(addr, path, headers, n):
    req = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode()
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        s = connect(addr)
        s.sendall(req)
        recv_response(s)
        lat.append(time.perf_counter() - t)
        s.close()
    return lat


def download(addr, path, headers, nbytes):
    s = connect(addr)
    s.sendall(f"GET {path}?n={nbytes} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    t = time.perf_counter()
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    got = len(buf.partition(b"\r\n\r\n")[2])
    view = bytearray(1 << 20)
    while got < nbytes:
        k = s.recv_into(view)
        if k == 0:
            break
        got += k
    dt = time.perf_counter() - t
    s.close()
    return got / dt / (1 << 20)


def ws_open(addr, path, headers):
    s = connect(addr)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise EOFError(buf)
        buf += d
    if not buf.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(buf[:200])
    return s


def ws_rtt(addr, path, headers, n):
    s = ws_open(addr, path, headers)
    frame = bytes([0x82, 0x80 | 4]) + b"\0\0\0\0" + b"ping"
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        s.sendall(frame)
        got = b""
        while len(got) < 6:
            got += s.recv(64)
        lat.append(time.perf_counter() - t)
    s.close()
    return lat


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def us(v):
    return f"{v * 1e6:8.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--gets", type=int, default=5000)
    ap.add_argument("--download_mib", type=int, default=1024)
    ap.add_argument("--websockets", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    work = tempfile.mkdtemp(prefix="sbx-portbench-", dir="/tmp")
    with open(os.path.join(work, "config.yaml"), "w") as f:
        f.write(CONFIG)
    sbx_e2e.generate_stubs(os.path.join(SOURCE, "proto"))
    from sbx.v1 import claims_pb2, claims_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc
    port_file = os.path.join(work, "proxy_port")
    e2b_port_file = os.path.join(work, "e2b_port")
    server = sbx_e2e.Server(args.server, work, os.path.join(work, "config.yaml"), (
        "--proxy_listen=127.0.0.1:0", f"--proxy_port_file={port_file}",
        "--e2b_listen=127.0.0.1:0", f"--e2b_port_file={e2b_port_file}",
        f"--proxy_max_connections_per_sandbox={args.websockets + 100}",
        f"--proxy_max_connections_per_tenant={args.websockets + 100}",
        f"--proxy_max_connections={args.websockets + 100}"))
    try:
        with open(port_file) as f:
            proxy = ("127.0.0.1", int(f.read()))
        sbx_e2e.wait_for(lambda: os.path.exists(e2b_port_file), 30, "the E2B port file")
        with open(e2b_port_file) as f:
            e2b = ("127.0.0.1", int(f.read()))
        claims = claims_pb2_grpc.ClaimServiceStub(server.channel)
        sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(server.channel)
        with open(os.path.join(SOURCE, "tests", "e2e", "port_echo_server.py"), "rb") as f:
            echo = f.read()
        # Ports free on the host (the networked sandbox listens on the host's loopback).
        def free_port():
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            s.close()
            return p
        setups = {}
        for pool in ("net", "nonet"):
            cid = claims.Claim(claims_pb2.ClaimRequest(pool=pool, claim_id=f"bench-{pool}"),
                               timeout=60).claim.claim_id
            hp, wp = free_port(), free_port()
            for path, content in (("http.py", HTTP_SERVER.encode()), ("echo.py", echo)):
                sandboxes.WriteFile(sandboxes_pb2.WriteFileRequest(
                    claim_id=cid, path=path, content=content), timeout=30)
            for argv in (["python3", "http.py", str(hp)], ["python3", "echo.py", str(wp)]):
                list(sandboxes.StartProcess(sandboxes_pb2.StartProcessRequest(
                    claim_id=cid, argv=argv, detach=True), timeout=30))
            setups[pool] = (cid, hp, wp)
        time.sleep(1.0)
        cid, hp, wp = setups["net"]
        direct_h, direct_w = ("127.0.0.1", hp), ("127.0.0.1", wp)
        ph, pw = f"/_sbx/{cid}/{hp}/", f"/_sbx/{cid}/{wp}/"
        ncid, nhp, nwp = setups["nonet"]
        nph = f"/_sbx/{ncid}/{nhp}/"
        sbx_e2e.wait_for(lambda: gets_kept_alive(proxy, ph, "", 1), 30, "the proxied server")
        # The sandbox's envd access token, from E2B's GET /sandboxes/{id} (no auth here: any
        # key is the anonymous tenant's).
        with urllib.request.urlopen(urllib.request.Request(
                f"http://{e2b[0]}:{e2b[1]}/sandboxes/{cid}", headers={"X-API-Key": "bench"}),
                timeout=30) as r:
            token = json.load(r)["envdAccessToken"]
        eh = f"E2b-Sandbox-Id: {cid}\r\nE2b-Sandbox-Port: {hp}\r\nX-Access-Token: {token}\r\n"
        ew = f"E2b-Sandbox-Id: {cid}\r\nE2b-Sandbox-Port: {wp}\r\nX-Access-Token: {token}\r\n"
        sbx_e2e.wait_for(lambda: gets_kept_alive(e2b, "/", eh, 1), 30, "the server through E2B")

        print(f"# port proxy bench: {args.gets} GETs per path and round, {args.rounds} rounds, "
              f"alternating; microseconds")
        print(f"{'what':46} {'p50':>8} {'p99':>8}")
        res = {}
        for r in range(args.rounds):
            for name, fn, addr, path, headers in (
                    ("GET kept-alive, direct", gets_kept_alive, direct_h, "/", ""),
                    ("GET kept-alive, proxy", gets_kept_alive, proxy, ph, ""),
                    ("GET kept-alive, e2b", gets_kept_alive, e2b, "/", eh),
                    ("GET kept-alive, proxy (sandbox w/o network)", gets_kept_alive, proxy, nph,
                     ""),
                    ("GET new connection, direct", gets_new_connection, direct_h, "/", ""),
                    ("GET new connection, proxy", gets_new_connection, proxy, ph, ""),
                    ("GET new connection, e2b", gets_new_connection, e2b, "/", eh),
                    ("WebSocket echo RTT, direct", ws_rtt, direct_w, "/", ""),
                    ("WebSocket echo RTT, proxy", ws_rtt, proxy, pw, ""),
                    ("WebSocket echo RTT, e2b", ws_rtt, e2b, "/", ew)):
                n = args.gets if "new" not in name else args.gets // 5
                res.setdefault(name, []).extend(fn(addr, path, headers, n))
        for name, lat in res.items():
            print(f"{name:46} {us(pct(lat, 0.5))} {us(pct(lat, 0.99))}")
        for what, a, b in (("GET kept-alive", "GET kept-alive, direct", "GET kept-alive, proxy"),
                           ("GET new connection", "GET new connection, direct",
                            "GET new connection, proxy"),
                           ("WebSocket echo", "WebSocket echo RTT, direct",
                            "WebSocket echo RTT, proxy")):
            print(f"added by the proxy, {what}: p50 {us(pct(res[b], .5) - pct(res[a], .5)).strip()} us, "
                  f"p99 {us(pct(res[b], .99) - pct(res[a], .99)).strip()} us")
            e = b.replace("proxy", "e2b")
            print(f"added by the E2B listener's hand-off, {what}: p50 "
                  f"{us(pct(res[e], .5) - pct(res[b], .5)).strip()} us, "
                  f"p99 {us(pct(res[e], .99) - pct(res[b], .99)).strip()} us")

        nbytes = args.download_mib << 20
        print(f"\n# download of {args.download_mib} MiB, MiB/s ({args.rounds} rounds, alternating)")
        d, p, cpu = [], [], 0.0
        for _ in range(args.rounds):
            d.append(download(direct_h, "/big", "", nbytes))
            c0 = cpu_seconds(server.proc.pid)
            p.append(download(proxy, ph + "big", "", nbytes))
            cpu += cpu_seconds(server.proc.pid) - c0
        print(f"direct {statistics.median(d):8.0f}   proxy {statistics.median(p):8.0f}   "
              f"ratio {statistics.median(p) / statistics.median(d):.2f}   (per round: "
              f"{' '.join(f'{x:.0f}/{y:.0f}' for x, y in zip(d, p))})")
        print(f"sbx-server CPU while proxying: {cpu / (args.rounds * args.download_mib / 1024):.2f} "
              f"s per GiB (user+system, its own process; the kernel's loopback work for "
              f"the second hop falls partly on the sender and receiver)")

        print(f"\n# {args.websockets} idle WebSockets through the proxy")
        before = rss(server.proc.pid)
        fds_before = fds(server.proc.pid)
        socks = []
        t = time.perf_counter()
        try:
            for _ in range(args.websockets):
                try:
                    socks.append(ws_open(proxy, pw, ""))
                except (OSError, RuntimeError) as e:
                    print(f"WebSocket {len(socks) + 1} failed: {e}; the server's log ends:\n"
                          f"{server.logtext()[-1500:]}")
                    break
            opened = time.perf_counter() - t
            time.sleep(1)
            during = rss(server.proc.pid)
            print(f"opened in {opened:.2f} s; server RSS {before / 2**20:.1f} -> "
                  f"{during / 2**20:.1f} MiB = {(during - before) / len(socks):.0f} B per "
                  f"connection; server descriptors {fds_before} -> {fds(server.proc.pid)}")
        finally:
            for s in socks:
                s.close()
        time.sleep(1)
        print(f"after closing: server RSS {rss(server.proc.pid) / 2**20:.1f} MiB, "
              f"{fds(server.proc.pid)} descriptors")
    finally:
        server.stop(signal.SIGTERM)
        sbx_e2e.kill_all_with(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
