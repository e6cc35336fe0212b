#!/usr/bin/python3
"""Claims a sandbox from a running sbx-server, runs a command in it, and releases it.

Usage: /usr/bin/python3 scripts/try_claim.py [host:port] [command ...]
  default target 127.0.0.1:50051, default command: uname -a; id; ls -la
Generates the sbx.v1 stubs from proto/ into a temporary folder. The command runs through
the server (SandboxService.Exec), as any client would do it; `sbx exec` is the CLI way.
"""

import glob
import os
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main():
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    command = sys.argv[2:] or ["/bin/sh", "-c", "uname -a; id; ls -la"]
    proto = os.path.join(ROOT, "proto")
    out = tempfile.mkdtemp(prefix="sbx-try-")
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = [os.path.relpath(f, proto) for f in glob.glob(f"{proto}/sbx/v1/*.proto")]
    if protoc.main(["protoc", f"-I{proto}", f"-I{wkt}", f"--python_out={out}",
                    f"--grpc_python_out={out}"] + files) != 0:
        sys.exit("try_claim: cannot generate stubs from proto/")
    sys.path.insert(0, out)
    from sbx.v1 import claims_pb2, claims_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc

    channel = grpc.insecure_channel(target)
    claims = claims_pb2_grpc.ClaimServiceStub(channel)
    sandboxes = sandboxes_pb2_grpc.SandboxServiceStub(channel)
    start = time.perf_counter()
    claim = claims.Claim(claims_pb2.ClaimRequest(pool="default"), timeout=60).claim
    print(f"claimed {claim.claim_id}: sandbox {claim.sandbox.id} at {claim.sandbox.endpoint} "
          f"in {(time.perf_counter() - start) * 1000:.1f} ms")
    try:
        start = time.perf_counter()
        req = sandboxes_pb2.ExecRequest(
            start=sandboxes_pb2.ExecStart(claim_id=claim.claim_id, argv=command))
        for r in sandboxes.Exec(iter([req]), timeout=60):
            kind = r.WhichOneof("kind")
            if kind == "stdout_chunk":
                sys.stdout.write(r.stdout_chunk.decode(errors="replace"))
            elif kind == "stderr_chunk":
                sys.stderr.write(r.stderr_chunk.decode(errors="replace"))
            elif kind == "exit":
                status = (f"exit {r.exit.exit_code}" if r.exit.WhichOneof("status") == "exit_code"
                          else f"signal {r.exit.signal}")
                print(f"[{status} after {(time.perf_counter() - start) * 1000:.1f} ms]")
    finally:
        claims.Release(claims_pb2.ReleaseRequest(claim_id=claim.claim_id), timeout=30)
        print(f"released {claim.claim_id}")


if __name__ == "__main__":
    main()
