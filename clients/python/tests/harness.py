"""Starting real sbx-servers for the SDK's tests, examples and benchmark.

Standard library only. The binaries come from SBX_TEST_SERVER_BIN / SBX_TEST_SANDBOXD_BIN
(set by clients/python/CMakeLists.txt), else build/clang/src/cmd/. Each Server runs in a
fresh short temp dir under /tmp (local sandboxes keep unix sockets below it), leads its
own session, and is killed with everything that names its dir at stop() and at exit.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from typing import List, Optional

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                     ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import sandbox_procs  # noqa: E402

ADMIN_TOKEN = "admin-token-1"
TENANT_TOKEN = "tenant-token-1"
# A second tenant, for the attacks of one tenant on another's claim.
OTHER_TENANT_TOKEN = "tenant-token-2"


def binary(env: str, name: str) -> str:
    path = os.environ.get(env) or os.path.join(ROOT, "build", "clang", "src", "cmd", name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{name} not found at {path} (build it, or set {env})")
    return path


LOCAL_CONFIG = """
templates:
  - name: default
    runtime: local
    local:
      network: false
      env: {LANG: C.UTF-8}
      pids_limit: 256
pools:
  - name: default
    template: default
    min_warm: 2
    max_warm: 8
    empty_pool_policy: wait
    default_wait: 30s
    default_ttl: 1h
    max_ttl: 24h
  - name: empty
    template: default
    min_warm: 0
    max_warm: 0
    empty_pool_policy: fail
"""


def instant_config(warm: int = 16) -> str:
    return f"""
templates:
  - name: default
    runtime: local
    local: {{network: false}}
pools:
  - name: default
    template: default
    min_warm: {warm}
    max_warm: {warm}
    empty_pool_policy: wait
    default_wait: 30s
    default_ttl: 1h
    max_ttl: 24h
  - name: other
    template: default
    min_warm: 2
    max_warm: 2
  - name: empty
    template: default
    min_warm: 0
    max_warm: 0
    empty_pool_policy: fail
"""


_LIVE: List["Server"] = []


class Server:
    """sbx-server on 127.0.0.1 (port 0 unless given)."""

    def __init__(self, config: str = LOCAL_CONFIG, runtime: str = "local",
                 auth: bool = False, extra: Optional[List[str]] = None,
                 durability: str = "buffered") -> None:
        self.dir = os.path.realpath(tempfile.mkdtemp(prefix="sbxpy-", dir="/tmp"))
        self.runtime = runtime
        self.auth = auth
        self.extra = list(extra or [])
        self.durability = durability
        with open(os.path.join(self.dir, "config.yaml"), "w") as f:
            f.write(config)
        with open(os.path.join(self.dir, "tokens"), "w") as f:
            f.write(f"{ADMIN_TOKEN} alice admin\n{TENANT_TOKEN} bob\n"
                    f"{OTHER_TENANT_TOKEN} carol\n")
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None
        _LIVE.append(self)
        self.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Starts (or restarts, on the same port and store) the server."""
        port_file = os.path.join(self.dir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        flags = [f"--listen=127.0.0.1:{self.port}", "--metrics_listen=127.0.0.1:0",
                 f"--port_file={port_file}", f"--data_dir={self.dir}/data",
                 f"--sandbox_root={self.dir}/sb", f"--config={self.dir}/config.yaml",
                 f"--runtime={self.runtime}", f"--durability={self.durability}",
                 "--shutdown_grace_seconds=1",
                 f"--sandboxd={binary('SBX_TEST_SANDBOXD_BIN', 'sbx-sandboxd')}"]
        if self.auth:
            flags.append(f"--auth_tokens_file={self.dir}/tokens")
        if getattr(self, "log", None):
            self.log.close()
        self.log = open(os.path.join(self.dir, "server.log"), "ab")
        self.proc = subprocess.Popen(
            [binary("SBX_TEST_SERVER_BIN", "sbx-server"), *flags, *self.extra],
            cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sbx-server exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                with open(port_file) as f:
                    m = re.fullmatch(r"\s*(\d+)\s*", f.read())
                if m:
                    self.port = int(m.group(1))
                    return
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sbx-server did not serve within {timeout} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILLs the server (its sandboxes, which run in their own sessions, survive
        and are adopted by the next start)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for _ in range(10):
            pids = sandbox_procs.processes_with(os.path.join(self.dir, ""))
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        shutil.rmtree(self.dir, ignore_errors=True)
        if getattr(self, "images", None):
            shutil.rmtree(self.images, ignore_errors=True)
        self.log.close()
        if self in _LIVE:
            _LIVE.remove(self)

    def log_tail(self, n: int = 4000) -> str:
        try:
            self.log.flush()
            with open(os.path.join(self.dir, "server.log"), "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_warm(self, pool: str, n: int, timeout: float = 60.0) -> None:
        """Waits (bounded) until `pool` has at least n warm sandboxes."""
        import sbx
        with sbx.Client(self.target, token=ADMIN_TOKEN if self.auth else None) as c:
            deadline = time.monotonic() + timeout
            while True:
                warm = {p.name: p.warm for p in c.pools()}.get(pool, 0)
                if warm >= n:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pool {pool!r} has {warm} warm, not {n}, after "
                                       f"{timeout} s:\n{self.log_tail()}")
                time.sleep(0.1)


IMAGE_POOL_CONFIG = """
templates:
  - name: img
    runtime: local
    local:
      image: "{ref}"
      network: false
      workspace_size_bytes: 268435456
      layer_size_bytes: 268435456
pools:
  - name: img
    template: img
    min_warm: {min_warm}
    max_warm: {max_warm}
    empty_pool_policy: wait
    default_wait: 60s
    default_ttl: 1h
    max_ttl: 24h
"""


def image_pool_server(min_warm: int = 2, max_warm: int = 4, auth: bool = True,
                      extra: Optional[List[str]] = None,
                      durability: str = "buffered") -> Server:
    """A server (needs root: image sandboxes run as uids of their own) with the pool "img"
    of a busybox image built here offline (tests/images/test_images.py), for snapshots,
    reset and fork. The image folder lives in the server's dir and goes with stop()."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "images"))
    import test_images
    images = os.path.realpath(tempfile.mkdtemp(prefix="sbxpy-img-", dir="/tmp"))
    os.chmod(images, 0o755)
    ref = test_images.busybox_image(os.path.join(images, "env"), "v1",
                                    config={"Env": ["PATH=/bin"]})
    config = IMAGE_POOL_CONFIG.format(ref=ref, min_warm=min_warm, max_warm=max_warm)
    srv = Server(config=config, auth=auth, durability=durability,
                 extra=["--image_cache_bytes=1000000000", f"--image_import_dir={images}",
                        *(extra or [])])
    os.chmod(srv.dir, 0o755)
    srv.images = images
    return srv


def _stop_all() -> None:
    for s in list(_LIVE):
        s.stop()


def _on_signal(signum, frame) -> None:
    _stop_all()
    os._exit(1)


atexit.register(_stop_all)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGHUP, _on_signal)


def clean_env() -> None:
    """The SDK reads SBX_SERVER / SBX_TOKEN: tests start from neither."""
    for k in ("SBX_SERVER", "SBX_TOKEN"):
        os.environ.pop(k, None)


def main() -> None:
    clean_env()
    program = unittest.main(argv=[sys.argv[0], "-v", *sys.argv[1:]], exit=False)
    _stop_all()
    sys.exit(0 if program.result.wasSuccessful() else 1)
