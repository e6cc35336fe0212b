#!/usr/bin/python3
"""A tiny server the port tests run inside a sandbox (python3 has no WebSocket library
here): on 127.0.0.1:PORT, a connection that starts with an HTTP Upgrade: websocket request
gets 101 and then has every text/binary frame echoed back (unmasked, as a server sends);
any other connection gets its bytes echoed raw (CONNECT tunnels). Many idle connections
at once (selectors). Usage: port_echo_server.py PORT
"""
import base64
import hashlib
import resource
import selectors
import socket
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

sel = selectors.DefaultSelector()
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(4096)
ls.setblocking(False)
sel.register(ls, selectors.EVENT_READ, None)


class Conn:
    def __init__(self, s):
        self.s, self.buf, self.mode = s, b"", None

    def feed(self, data):
        self.buf += data
        if self.mode is None:
            if not self.buf.startswith(b"GET "):
                if len(self.buf) >= 4:
                    self.mode = "raw"
                else:
                    return
            else:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:]
                key = ""
                for line in head.split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "sec-websocket-key":
                        key = value.strip()
                accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest())
                self.s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                               b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                               b"\r\n\r\n")
                self.mode = "ws"
        if self.mode == "raw":
            self.s.sendall(self.buf)
            self.buf = b""
            return
        while len(self.buf) >= 2:
            b0, b1 = self.buf[0], self.buf[1]
            n, i = b1 & 0x7F, 2
            if n == 126:
                if len(self.buf) < 4:
                    return
                n, i = int.from_bytes(self.buf[2:4], "big"), 4
            elif n == 127:
                if len(self.buf) < 10:
                    return
                n, i = int.from_bytes(self.buf[2:10], "big"), 10
            mask = b""
            if b1 & 0x80:
                mask, i = self.buf[i:i + 4], i + 4
            if len(self.buf) < i + n:
                return
            payload = self.buf[i:i + n]
            self.buf = self.buf[i + n:]
            if mask:
                payload = bytes(c ^ mask[j % 4] for j, c in enumerate(payload))
            head = bytes([b0]) + (bytes([n]) if n < 126 else
                                  bytes([126]) + n.to_bytes(2, "big") if n < 65536 else
                                  bytes([127]) + n.to_bytes(8, "big"))
            self.s.sendall(head + payload)


while True:
    for key, _ in sel.select():
        if key.data is None:
            try:
                s, _ = ls.accept()
            except OSError:
                continue
            s.setblocking(True)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sel.register(s, selectors.EVENT_READ, Conn(s))
            continue
        c = key.data
        try:
            data = c.s.recv(65536)
        except OSError:
            data = b""
        if not data:
            sel.unregister(c.s)
            c.s.close()
            continue
        c.feed(data)
