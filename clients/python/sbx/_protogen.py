"""Generates the sbx.v1 protobuf/gRPC modules from proto/sbx/v1/*.proto with grpc_tools.

Nothing generated is kept in git. Three callers share this one function:

- setup.py's build step writes the modules into the built package (sbx/v1/), so an
  installed sbx needs neither grpc_tools nor the .proto files at run time;
- the CMake target sbx-python-stubs writes them into the build tree for the tests;
- sbx/v1/__init__.py, when sbx is used in place from a source tree, writes them into
  $SBX_PROTO_GEN_DIR or a cache folder keyed by the protos' hash, and imports from there.

Run as a script: python3 sbx/_protogen.py --proto-dir proto --out DIR (DIR/sbx/v1/*.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from typing import List, Optional

_STAMP = ".sbx-proto-hash"


def proto_files(proto_dir: str) -> List[str]:
    """The sbx/v1 protos under proto_dir, relative to it, sorted."""
    folder = os.path.join(proto_dir, "sbx", "v1")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".proto"))
    if not files:
        raise RuntimeError(f"no .proto files in {folder}")
    return [f"sbx/v1/{f}" for f in files]


def proto_hash(proto_dir: str) -> str:
    h = hashlib.sha256()
    for rel in proto_files(proto_dir):
        h.update(rel.encode())
        with open(os.path.join(proto_dir, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def source_proto_dir() -> Optional[str]:
    """proto/ of the source tree this package sits in (clients/python/sbx -> ../../../proto)."""
    env = os.environ.get("SBX_PROTO_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.normpath(os.path.join(here, "..", "..", "..", "proto"))
    return candidate if os.path.isdir(os.path.join(candidate, "sbx", "v1")) else None


def generate(proto_dir: str, out_dir: str) -> str:
    """Writes out_dir/sbx/v1/{*_pb2,*_pb2_grpc}.py unless they are there for the same
    protos. Safe against concurrent callers (generates aside, then renames). Returns
    out_dir/sbx/v1."""
    digest = proto_hash(proto_dir)
    target = os.path.join(out_dir, "sbx", "v1")
    stamp = os.path.join(target, _STAMP)
    try:
        with open(stamp, encoding="utf-8") as f:
            if f.read().strip() == digest:
                return target
    except OSError:
        pass
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ImportError(
            "sbx: the sbx.v1 stubs are not built and grpc_tools is missing to generate "
            "them (Debian: apt install python3-grpc-tools; or pip install ./clients/python)"
        ) from e
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".sbx-gen-", dir=out_dir)
    try:
        includes = [f"-I{proto_dir}"]
        # Well-known types: grpc_tools ships them; Debian keeps them in /usr/include.
        for d in (os.path.join(os.path.dirname(protoc.__file__), "_proto"), "/usr/include"):
            if os.path.exists(os.path.join(d, "google", "protobuf", "duration.proto")):
                includes.append(f"-I{d}")
        args = ["grpc_tools.protoc", *includes, f"--python_out={tmp}",
                f"--grpc_python_out={tmp}", *proto_files(proto_dir)]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed ({rc}): {' '.join(args)}")
        gen = os.path.join(tmp, "sbx", "v1")
        with open(os.path.join(gen, _STAMP), "w", encoding="utf-8") as f:
            f.write(digest + "\n")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        old = None
        if os.path.exists(target):
            old = target + f".old-{os.getpid()}"
            os.rename(target, old)
        try:
            os.rename(gen, target)
        except OSError:
            # Another process put its copy there first: it is as good as ours.
            if not os.path.exists(os.path.join(target, _STAMP)):
                raise
        if old:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def generated_dir_for_source_tree() -> str:
    """Where sbx/v1/__init__.py finds (or makes) the modules when running from source."""
    proto_dir = source_proto_dir()
    if proto_dir is None:
        raise ImportError("sbx: the sbx.v1 stubs are not built and no proto/ folder was "
                          "found (set SBX_PROTO_DIR, or pip install ./clients/python)")
    out = os.environ.get("SBX_PROTO_GEN_DIR")
    if not out:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache")
        out = os.path.join(cache, "sbx-python", proto_hash(proto_dir))
    return generate(proto_dir, out)


def main(argv: List[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proto-dir", required=True)
    p.add_argument("--out", required=True, help="folder that gets sbx/v1/")
    a = p.parse_args(argv)
    print(generate(a.proto_dir, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
