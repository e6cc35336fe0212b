#!/usr/bin/python3
"""Checks a running sbx-server from Python's grpcio: health, then Ping.

Usage: /usr/bin/python3 scripts/ping.py [host:port]   (default 127.0.0.1:50051)
Generates the sbx.v1 stubs from proto/ into a temporary folder with grpc_tools.
"""

import os
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main():
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    proto_dir = os.path.join(ROOT, "proto")
    out = tempfile.mkdtemp(prefix="sbx-ping-")
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = ["protoc", f"-I{proto_dir}", f"-I{wkt}", f"--python_out={out}", f"--grpc_python_out={out}",
            "sbx/v1/diagnostics.proto"]
    if protoc.main(args) != 0:
        sys.exit("ping: cannot generate stubs from proto/")
    sys.path.insert(0, out)
    from sbx.v1 import diagnostics_pb2, diagnostics_pb2_grpc  # noqa: E402

    channel = grpc.insecure_channel(target)
    # grpc.health.v1.Health/Check with an empty HealthCheckRequest; field 1 of the reply is
    # the status enum, SERVING = 1.
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    reply = check(b"", timeout=5)
    serving = b"\x08\x01"
    print("health: " + ("SERVING" if reply == serving else repr(reply)))
    stub = diagnostics_pb2_grpc.DiagnosticsServiceStub(channel)
    start = time.perf_counter()
    resp = stub.Ping(diagnostics_pb2.PingRequest(payload=b"hello"), timeout=5)
    took_us = (time.perf_counter() - start) * 1e6
    print(f"ping: {resp.payload.decode()} from sbx {resp.server_version} ({resp.server_commit})"
          f" in {took_us:.0f} us")


if __name__ == "__main__":
    main()
