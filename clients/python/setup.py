"""Installs the sbx Python SDK from the source tree, offline:

    pip install ./clients/python              # in a virtualenv, or with --user
    /usr/bin/python3 -m pip install --break-system-packages ./clients/python   # Debian

The sbx.v1 modules are generated from ../../proto at build time with grpc_tools (Debian:
python3-grpc-tools) and go into the built package; nothing generated is in git.
Run-time dependencies: grpcio and protobuf only.
"""

import glob
import importlib.util
import os
import shutil
import tempfile

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _protogen():
    # Loaded by path: importing the sbx package would need the stubs it is about to get.
    spec = importlib.util.spec_from_file_location("_sbx_protogen",
                                                  os.path.join(HERE, "sbx", "_protogen.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithStubs(build_py):
    """build_py, then the generated sbx/v1/*_pb2*.py into the built package."""

    def run(self):
        super().run()
        proto_dir = os.environ.get("SBX_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
        if not os.path.isdir(os.path.join(proto_dir, "sbx", "v1")):
            raise SystemExit(f"sbx: no protos at {proto_dir}/sbx/v1; build from the sbx "
                             "source tree or set SBX_PROTO_DIR")
        tmp = tempfile.mkdtemp(prefix="sbx-build-")
        try:
            gen = _protogen().generate(proto_dir, tmp)
            dest = os.path.join(self.build_lib, "sbx", "v1")
            os.makedirs(dest, exist_ok=True)
            for f in glob.glob(os.path.join(gen, "*_pb2*.py")):
                shutil.copy(f, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


setup(
    name="sbx",
    version="0.1.0",
    description="Python SDK of sbx, the warm-pool sandbox server (gRPC)",
    packages=find_packages(include=["sbx", "sbx.*"]),
    package_data={"sbx": ["py.typed"]},
    python_requires=">=3.8",
    install_requires=["grpcio", "protobuf"],
    cmdclass={"build_py": BuildPyWithStubs},
    zip_safe=False,
)
