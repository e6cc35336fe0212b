#!/usr/bin/python3
"""The `sbx` command-line client against a real sbx-server (local bubblewrap runtime, auth
on, loopback only), called as a user or a script would call it: exit codes, stdout
(tables, JSON) and stderr (errors, progress).

The classes are split by what the server serves: ClaimServiceCliTest and AdminCliTest use
RPCs the server implements today; TlsCliTest needs the server's --tls_* flags (skipped
without them or without openssl); SandboxCliTest (exec, cp, ls, suspend, resume) and
WatchCliTest (WatchClaims, WatchPools) use RPCs that land with the server's SandboxService
and watch work; on a server without them they fail with UNIMPLEMENTED.

Usage: sbx_cli_test.py PATH_TO_SBX PATH_TO_SBX_SERVER
"""

import json
import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import sandbox_procs  # noqa: E402

SBX = SERVER = None
ADMIN = "admin-token-1"
TENANT = "tenant-token-1"

CONFIG = """\
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
  - name: spare
    template: default
    min_warm: 1
    max_warm: 4
  - name: empty
    template: default
    min_warm: 0
    max_warm: 0
    empty_pool_policy: fail
"""


def server_help():
    return subprocess.run([SERVER, "--help"], capture_output=True, text=True,
                          timeout=20).stdout


class Server:
    """sbx-server in its own temp dir (short, under /tmp: sandbox sockets live there).
    `extra(dir)` returns more flags; `runtime` "instant" starts no sandbox at all."""

    def __init__(self, extra=lambda d: [], runtime="local"):
        self.dir = tempfile.mkdtemp(prefix="sbxcli-", dir="/tmp")
        with open(os.path.join(self.dir, "config.yaml"), "w") as f:
            f.write(CONFIG)
        with open(os.path.join(self.dir, "tokens"), "w") as f:
            f.write(f"{ADMIN} alice admin\n{TENANT} bob\n")
        port_file = os.path.join(self.dir, "port")
        flags = extra(self.dir)
        if "--delete_sandboxes_on_exit" in server_help():
            flags.append("--delete_sandboxes_on_exit")
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [SERVER, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", f"--port_file={port_file}",
             f"--data_dir={self.dir}/data", f"--sandbox_root={self.dir}/sb",
             f"--config={self.dir}/config.yaml", f"--auth_tokens_file={self.dir}/tokens",
             f"--runtime={runtime}", "--durability=buffered", "--shutdown_grace_seconds=2",
             *flags],
            cwd=self.dir, stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        port = ""
        while not port:
            if self.proc.poll() is not None or time.time() > deadline:
                log = self.logtext()
                self.stop()
                raise AssertionError("sbx-server did not start:\n" + log)
            time.sleep(0.05)
            if os.path.exists(port_file):
                with open(port_file) as f:
                    port = f.read().strip()
        self.target = "127.0.0.1:" + port

    def logtext(self):
        self.log.flush()
        with open(os.path.join(self.dir, "server.log")) as f:
            return f.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        # Whatever still runs from this folder (a sandbox that was starting) goes too.
        for pid in processes_mentioning(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def processes_mentioning(text):
    return sandbox_procs.processes_with(text)


SRV = None


def env_for(token=ADMIN, server=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env["SBX_SERVER"] = server or SRV.target
    if token is not None:
        env["SBX_TOKEN"] = token
    return env


def sbx(*args, token=ADMIN, input=None, timeout=90, server=None):
    """Runs sbx to completion; stdin is /dev/null unless `input` is given."""
    return subprocess.run([SBX, *args], capture_output=True, text=True, timeout=timeout,
                          env=env_for(token, server), input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)


class Popen:
    """sbx in the background, its stdout lines collected by a thread; always killed."""

    def __init__(self, *args, token=ADMIN):
        self.proc = subprocess.Popen([SBX, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, env=env_for(token))
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def next_line(self, timeout=30):
        return self.lines.get(timeout=timeout)

    def wait_for(self, predicate, timeout=30):
        deadline = time.time() + timeout
        seen = []
        while time.time() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                break
            seen.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"no matching line in {seen!r}; stderr: {self.stderr_now()}")

    def stderr_now(self):
        if self.proc.poll() is None or self.proc.stderr.closed:
            return "(still running)"
        return self.proc.stderr.read()

    def finish(self, timeout=20):
        try:
            self.proc.wait(timeout=timeout)
            self.reader.join(timeout=5)
            err = self.proc.stderr.read()
        finally:
            self.kill()
        return self.proc.returncode, err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.reader.join(timeout=5)
        self.proc.stdout.close()
        self.proc.stderr.close()


def claim_id(pool="default", *extra):
    r = sbx("claim", pool, "-q", *extra)
    if r.returncode != 0:
        raise AssertionError(f"claim failed: {r.stderr}")
    return r.stdout.strip()


class CliTestCase(unittest.TestCase):
    def assertOk(self, r):
        self.assertEqual(r.returncode, 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")

    def assertError(self, r, code, fragment=None, exit_code=1):
        self.assertEqual(r.returncode, exit_code, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        self.assertIn(f"sbx: error: {code}: ", r.stderr)
        if fragment is not None:
            self.assertIn(fragment, r.stderr)

    def wait_warm(self, pool, n, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = sbx("pools", "get", pool, "-o", "json")
            self.assertOk(r)
            if json.loads(r.stdout)["status"]["warm"] >= n:
                return
            time.sleep(0.2)
        self.fail(f"pool {pool} never had {n} warm sandboxes\n{SRV.logtext()}")


class UsageTest(CliTestCase):
    """Parsing only: these never reach a server."""

    def test_help_and_version(self):
        r = sbx("--help")
        self.assertOk(r)
        for word in ("claim", "release", "renew", "claims", "exec", "cp", "suspend", "resume",
                     "pools", "templates", "watch", "--server", "--token", "--output",
                     "--timeout", "--tls", "--ca", "--cert", "--key"):
            self.assertIn(word, r.stdout)
        r = sbx("exec", "--help")
        self.assertOk(r)
        self.assertIn("--timeout-exec", r.stdout)
        r = sbx("--version")
        self.assertOk(r)
        self.assertIn("sbx ", r.stdout)

    def test_usage_errors_exit_2_with_a_message(self):
        cases = [
            (["nope"], "nope"),
            (["claims", "--bogus"], "--bogus"),
            ([], "needs a subcommand"),
            (["watch"], "needs a subcommand: claims, pools"),
            (["claim"], "pool"),
            (["claim", "--image", ""], "give a pool (POOL) or an image (--image REF)"),
            (["claim", "default", "--image", "oci:/x:1"], "not both"),
            (["claim", "default", "--ttl", "10"], "not a duration"),
            (["claim", "default", "--policy", "sometimes"], "sometimes"),
            (["claim", "default", "--priority", "urgent"], "urgent"),
            (["claim", "default", "--label", "novalue"], "KEY=VALUE"),
            (["claim", "default", "--prefer", "novalue"], "KEY=VALUE"),
            (["claim", "default", "--count", "0"], "--count"),
            (["claim", "default", "--best-effort"], "--count"),
            (["-o", "yaml", "pools"], "yaml"),
            (["claims", "--state", "gone"], "gone"),
            (["pools", "scale", "default"], "--min"),
            (["cp", "a", "b"], "exactly one"),
            (["cp", "x:a", "y:b"], "exactly one"),
            (["exec", "some-claim"], "--"),
            (["--cert", "c.pem", "pools"], "--cert and --key"),
            (["--timeout", "0s", "pools"], "--timeout"),
        ]
        for args, fragment in cases:
            with self.subTest(args=args):
                r = sbx(*args)
                self.assertEqual(r.returncode, 2, f"{args}: {r.stdout}{r.stderr}")
                self.assertIn("sbx: error: ", r.stderr)
                self.assertIn(fragment, r.stderr)
                self.assertEqual(r.stdout, "")

    def test_unreachable_server(self):
        r = sbx("--timeout", "5s", "claims", server="127.0.0.1:1")
        self.assertError(r, "UNAVAILABLE")

    def test_missing_ca_file(self):
        r = sbx("--ca", "/nonexistent/ca.pem", "claims")
        self.assertError(r, "NOT_FOUND", "/nonexistent/ca.pem")


class ClaimServiceCliTest(CliTestCase):
    def test_claim_table_json_quiet_and_release(self):
        # Flags may come before the pool: --label takes one value per occurrence.
        r = sbx("claim", "--label", "team=rl", "default", "--id", "t-table", "--ttl", "10m")
        self.assertOk(r)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0].split(), ["CLAIM", "POOL", "SANDBOX", "STATE", "EXPIRES"])
        row = lines[1].split()
        self.assertEqual(row[0], "t-table")
        self.assertEqual(row[1], "default")
        self.assertEqual(row[3], "ACTIVE")
        self.assertRegex(" ".join(row[4:]), r"^in (10m|9m\d*s?)$")

        # The same id again: the same claim, with a note on stderr.
        r = sbx("claim", "default", "--id", "t-table", "-o", "json")
        self.assertOk(r)
        again = json.loads(r.stdout)
        self.assertEqual(again["claimId"], "t-table")
        self.assertEqual(again["state"], "CLAIM_STATE_ACTIVE")
        self.assertEqual(again["labels"], {"team": "rl"})
        self.assertEqual(again["owner"], "alice")
        self.assertIn("already existed", r.stderr)

        # -q: the id alone, for `id=$(sbx claim POOL -q)`.
        r = sbx("claim", "default", "-q", "--env", "SEED=7")
        self.assertOk(r)
        generated = r.stdout.strip()
        self.assertRegex(generated, r"^[0-9a-f]{32}$")
        self.assertEqual(r.stdout, generated + "\n")

        r = sbx("release", "t-table", generated, "-o", "json")
        self.assertOk(r)
        released = json.loads(r.stdout)
        self.assertEqual([c["claimId"] for c in released], ["t-table", generated])
        self.assertEqual({c["state"] for c in released}, {"CLAIM_STATE_RELEASED"})
        # Idempotent.
        r = sbx("release", "t-table")
        self.assertOk(r)
        self.assertIn("RELEASED", r.stdout)
        r = sbx("claims", "get", "t-table", "-o", "json")
        self.assertOk(r)
        self.assertEqual(json.loads(r.stdout)["state"], "CLAIM_STATE_RELEASED")
        # An ended claim's id is spent.
        r = sbx("claim", "default", "--id", "t-table")
        self.assertError(r, "FAILED_PRECONDITION")

    def test_release_reports_each_failure(self):
        cid = claim_id()
        r = sbx("release", "no-such-claim", cid)
        self.assertEqual(r.returncode, 1)
        self.assertIn('sbx: error: NOT_FOUND: release "no-such-claim"', r.stderr)
        self.assertIn(cid, r.stdout)
        self.assertIn("RELEASED", r.stdout)

    def test_renew(self):
        r = sbx("claim", "default", "--ttl", "1m", "-o", "json")
        self.assertOk(r)
        before = json.loads(r.stdout)
        r = sbx("renew", before["claimId"], "--ttl", "2h", "-o", "json")
        self.assertOk(r)
        after = json.loads(r.stdout)
        self.assertGreater(after["expiresAt"], before["expiresAt"])
        r = sbx("renew", before["claimId"], "--ttl", "30m")
        self.assertOk(r)
        self.assertRegex(r.stdout, r"in (29|30)m")
        self.assertOk(sbx("release", before["claimId"]))
        r = sbx("renew", before["claimId"])
        self.assertError(r, "FAILED_PRECONDITION")
        r = sbx("renew", before["claimId"], "--ttl", "100h")
        self.assertEqual(r.returncode, 1)

    def test_claims_filters_and_every_page(self):
        ids = [claim_id("default", "--label", f"run=r{i % 2}", "--label", "suite=list")
               for i in range(3)]
        r = sbx("claims", "--selector", "suite=list,run=r0", "-o", "json", "--page-size", "1")
        self.assertOk(r)
        got = json.loads(r.stdout)
        self.assertEqual(sorted(c["claimId"] for c in got), sorted([ids[0], ids[2]]))
        r = sbx("claims", "--selector", "suite=list", "-q", "--page-size", "1")
        self.assertOk(r)
        self.assertEqual(sorted(r.stdout.split()), sorted(ids))
        r = sbx("claims", "--selector", "suite=list,run!=r0", "--state", "active")
        self.assertOk(r)
        header = r.stdout.splitlines()[0].split()
        self.assertEqual(header, ["CLAIM", "POOL", "SANDBOX", "STATE", "EXPIRES", "AGE",
                                  "LABELS"])
        self.assertIn(ids[1], r.stdout)
        self.assertIn("run=r1,suite=list", r.stdout)
        self.assertNotIn(ids[0], r.stdout)
        self.assertOk(sbx("release", ids[1]))
        r = sbx("claims", "--selector", "suite=list", "--state", "released,expired", "-q")
        self.assertOk(r)
        self.assertEqual(r.stdout.split(), [ids[1]])
        r = sbx("claims", "--pool", "spare", "--selector", "suite=list")
        self.assertOk(r)
        self.assertEqual(r.stdout, "")
        self.assertIn("No claims found", r.stderr)
        r = sbx("claims", "--selector", "a=b=c")
        self.assertError(r, "INVALID_ARGUMENT")
        self.assertOk(sbx("release", ids[0], ids[2]))

    def test_tenants_see_only_their_claims(self):
        mine = claim_id()
        r = sbx("claims", "-q", token=TENANT)
        self.assertOk(r)
        self.assertNotIn(mine, r.stdout)
        r = sbx("claims", "get", mine, token=TENANT)
        self.assertError(r, "NOT_FOUND")
        r = sbx("claims", "--owner", "alice", token=TENANT)
        self.assertError(r, "PERMISSION_DENIED")
        r = sbx("claims", "--owner", "alice", "-q")
        self.assertOk(r)
        self.assertIn(mine, r.stdout.split())
        self.assertOk(sbx("release", mine))

    def test_batch_claim(self):
        self.wait_warm("default", 2)
        r = sbx("claim", "default", "--count", "2", "--id", "batch-1", "--ttl", "5m",
                "-o", "json")
        self.assertOk(r)
        claims = json.loads(r.stdout)
        self.assertEqual([c["claimId"] for c in claims], ["batch-1#0", "batch-1#1"])
        self.assertEqual({c["batchId"] for c in claims}, {"batch-1"})
        self.assertEqual(len({c["sandbox"]["id"] for c in claims}), 2)
        # Not a terminal: plain progress lines on stderr.
        self.assertIn('claiming 2 sandboxes from pool "default"', r.stderr)
        self.assertIn("claimed 2 of 2 sandboxes", r.stderr)
        r = sbx("claim", "default", "--count", "2", "--id", "batch-1", "-q")
        self.assertOk(r)
        self.assertEqual(r.stdout.split(), ["batch-1#0", "batch-1#1"])
        self.assertIn("replayed", r.stderr)
        self.assertOk(sbx("release", "batch-1#0", "batch-1#1"))
        # A best-effort batch takes what is warm when it arrives: let the pool refill first.
        self.wait_warm("default", 1)
        r = sbx("claim", "default", "--count", "2", "--best-effort", "--wait", "20s")
        self.assertOk(r)
        rows = r.stdout.splitlines()[1:]
        self.assertTrue(1 <= len(rows) <= 2, r.stdout)
        self.assertOk(sbx("release", *[row.split()[0] for row in rows]))

    def test_batch_larger_than_the_warm_sandboxes_waits_for_the_refill(self):
        # Issue 22: `sbx claim default --count 3` with 2 warm (pool policy wait, room to
        # grow) waits for the refill and gets all of them, instead of RESOURCE_EXHAUSTED.
        self.wait_warm("default", 2)
        r = sbx("pools", "get", "default", "-o", "json")
        self.assertOk(r)
        count = json.loads(r.stdout)["status"]["warm"] + 1
        r = sbx("claim", "default", "--count", str(count), "-q", "--priority", "batch")
        self.assertOk(r)
        ids = r.stdout.split()
        self.assertEqual(len(ids), count, r.stderr)
        self.assertOk(sbx("release", *ids))

    def test_claim_with_a_priority(self):
        r = sbx("claim", "default", "--priority", "interactive", "-q")
        self.assertOk(r)
        self.assertOk(sbx("release", r.stdout.strip()))

    def test_claim_with_a_node_preference(self):
        # Soft: no local sandbox has node labels, so nothing matches and a sandbox is
        # still granted; a bad key is the server's INVALID_ARGUMENT naming it.
        r = sbx("claim", "default", "--prefer", "topology.kubernetes.io/zone=a", "-q")
        self.assertOk(r)
        self.assertOk(sbx("release", r.stdout.strip()))
        r = sbx("claim", "default", "--prefer", "-bad=a")
        self.assertError(r, "INVALID_ARGUMENT", "node_preference")

    def test_errors_name_the_code_and_the_server_message(self):
        r = sbx("claim", "nope")
        self.assertError(r, "NOT_FOUND", '"nope"')
        self.assertEqual(r.stdout, "")
        r = sbx("claim", "default", "--id", "bad/id")
        self.assertError(r, "INVALID_ARGUMENT")
        r = sbx("claim", "empty")
        self.assertError(r, "RESOURCE_EXHAUSTED")
        r = sbx("claim", "empty", "--policy", "wait", "--wait", "300ms")
        self.assertError(r, "DEADLINE_EXCEEDED")
        r = sbx("claims", token="wrong-token")
        self.assertError(r, "UNAUTHENTICATED")
        r = sbx("claims", token=None)
        self.assertError(r, "UNAUTHENTICATED")
        # --token beats $SBX_TOKEN.
        r = sbx("--token", ADMIN, "claims", "-q", token="wrong-token")
        self.assertOk(r)
        r = sbx("claims", "get", "never-made")
        self.assertError(r, "NOT_FOUND")

    def test_token_file(self):
        path = os.path.join(SRV.dir, "my-token")
        with open(path, "w") as f:
            f.write(ADMIN + "\n")
        r = sbx("--token-file", path, "pools", "-o", "json", token=None)
        self.assertOk(r)
        r = sbx("--token-file", path, "--token", ADMIN, "pools", token=None)
        self.assertEqual(r.returncode, 2)


class AdminCliTest(CliTestCase):
    def test_pools_list_and_get(self):
        r = sbx("pools")
        self.assertOk(r)
        header = r.stdout.splitlines()[0].split()
        for column in ("NAME", "TEMPLATE", "WARM", "CLAIMED", "WAITING", "TARGET", "WHY", "MIN",
                       "MAX", "SIZING", "RATE/S"):
            self.assertIn(column, header)
        # Issue 22: the target and why; the example pools are sized static at their floor.
        default = r.stdout.splitlines()[1].split()
        self.assertEqual(default[header.index("SIZING")], "static")
        self.assertIn(default[header.index("WHY")], ("floor", "waiters"))
        names = [line.split()[0] for line in r.stdout.splitlines()[1:]]
        self.assertEqual(names, ["default", "empty", "spare"])
        r = sbx("pools", "-o", "json")
        self.assertOk(r)
        pools = json.loads(r.stdout)
        self.assertEqual([p["name"] for p in pools], ["default", "empty", "spare"])
        self.assertEqual(pools[0]["minWarm"], 2)
        self.assertIn("warm", pools[0]["status"])
        r = sbx("pools", "get", "default", "-o", "json")
        self.assertOk(r)
        self.assertEqual(json.loads(r.stdout)["template"], "default")
        r = sbx("pools", "get", "default")
        self.assertOk(r)
        self.assertIn("min_warm", r.stdout)
        self.assertIn("max_ttl", r.stdout)
        for field in ("sizing", "target_reason", "arrival_rate", "create_latency"):
            self.assertIn(field, r.stdout)
        r = sbx("pools", "get", "nope")
        self.assertError(r, "NOT_FOUND", '"nope"')
        r = sbx("pools", token=TENANT)
        self.assertError(r, "PERMISSION_DENIED")

    def test_templates(self):
        r = sbx("templates")
        self.assertOk(r)
        self.assertEqual(r.stdout.splitlines()[0].split(), ["NAME", "RUNTIME", "GENERATION",
                                                            "UPDATED"])
        self.assertEqual(r.stdout.splitlines()[1].split()[:2], ["default", "local"])
        r = sbx("templates", "-o", "json")
        self.assertOk(r)
        self.assertEqual([t["name"] for t in json.loads(r.stdout)], ["default"])
        r = sbx("templates", "get", "default", "-o", "json")
        self.assertOk(r)
        t = json.loads(r.stdout)
        self.assertEqual(t["runtime"], "local")
        self.assertEqual(t["local"]["pidsLimit"], "256")
        r = sbx("templates", "get", "default")
        self.assertOk(r)
        self.assertIn("pidsLimit", r.stdout)
        r = sbx("templates", "get", "nope")
        self.assertError(r, "NOT_FOUND")

    def test_pools_scale_wait(self):
        r = sbx("pools", "scale", "spare", "--min", "2", "--max", "3", "--wait",
                "--wait-timeout", "60s", "-o", "json")
        self.assertOk(r)
        pool = json.loads(r.stdout)
        self.assertEqual((pool["minWarm"], pool["maxWarm"]), (2, 3))
        self.assertGreaterEqual(pool["status"]["warm"], 2)
        self.assertIn('pool "spare"', r.stderr)
        self.assertIn("warm sandboxes (min 2)", r.stderr)
        r = sbx("pools", "scale", "spare", "--min", "1")
        self.assertOk(r)
        row = r.stdout.splitlines()[1].split()
        self.assertEqual(row[0], "spare")
        r = sbx("pools", "scale", "spare", "--min", "9", "--max", "3")
        self.assertError(r, "INVALID_ARGUMENT")
        r = sbx("pools", "scale", "nope", "--min", "1")
        self.assertError(r, "NOT_FOUND")


def make_certificates(d):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, in d."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "1", "-subj", "/CN=sbx-test-ca")
    with open(os.path.join(d, "san.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:sbx.test\n")
    for name, ext in (("server", ["-extfile", "san.cnf"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext)


class TlsCliTest(CliTestCase):
    """The client side of TLS against a server with --tls_cert_file (and mTLS)."""

    @classmethod
    def setUpClass(cls):
        if "--tls_cert_file" not in server_help():
            raise unittest.SkipTest("this sbx-server has no --tls_cert_file")
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("no openssl to make test certificates")
        cls.certs = tempfile.mkdtemp(prefix="sbxcli-certs-", dir="/tmp")
        make_certificates(cls.certs)
        c = cls.certs
        cls.tls = cls.mtls = None
        try:
            cls.tls = Server(lambda d: [f"--tls_cert_file={c}/server.pem",
                                        f"--tls_key_file={c}/server.key"], runtime="instant")
            cls.mtls = Server(lambda d: [f"--tls_cert_file={c}/server.pem",
                                         f"--tls_key_file={c}/server.key",
                                         f"--tls_client_ca_file={c}/ca.pem"], runtime="instant")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for s in (cls.tls, cls.mtls):
            if s is not None:
                s.stop()
        shutil.rmtree(cls.certs, ignore_errors=True)

    def test_tls_with_ca(self):
        c = self.certs
        r = sbx("--ca", f"{c}/ca.pem", "pools", "-o", "json",
                server=self.tls.target)
        self.assertOk(r)
        self.assertIn("default", [p["name"] for p in json.loads(r.stdout)])
        # The name in the certificate rather than the address.
        r = sbx("--ca", f"{c}/ca.pem", "--tls-server-name", "sbx.test", "templates",
                server=self.tls.target)
        self.assertOk(r)
        # Plaintext to a TLS port, or TLS without trusting the test CA: no connection.
        r = sbx("--timeout", "5s", "pools", server=self.tls.target)
        self.assertError(r, "UNAVAILABLE")
        r = sbx("--tls", "--timeout", "5s", "pools", server=self.tls.target)
        self.assertError(r, "UNAVAILABLE")
        r = sbx("--ca", f"{c}/ca.pem", "--tls-server-name", "other.test", "--timeout", "5s",
                "pools", server=self.tls.target)
        self.assertError(r, "UNAVAILABLE")

    def test_mutual_tls(self):
        c = self.certs
        r = sbx("--ca", f"{c}/ca.pem", "--cert", f"{c}/client.pem", "--key", f"{c}/client.key",
                "claim", "default", "-q", server=self.mtls.target)
        self.assertOk(r)
        self.assertTrue(r.stdout.strip())
        r = sbx("--ca", f"{c}/ca.pem", "--timeout", "5s", "pools", server=self.mtls.target)
        self.assertError(r, "UNAVAILABLE")
        r = sbx("--ca", f"{c}/ca.pem", "--cert", f"{c}/nope.pem", "--key", f"{c}/client.key",
                "pools", server=self.mtls.target)
        self.assertError(r, "NOT_FOUND", "nope.pem")


class SandboxCliTest(CliTestCase):
    """exec, cp, ls, suspend, resume: need SandboxService on the server."""

    def setUp(self):
        self.claim = claim_id("default", "--ttl", "10m")

    def tearDown(self):
        sbx("release", self.claim)

    def test_exec_streams_output_and_propagates_the_exit_code(self):
        r = sbx("exec", self.claim, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertEqual(r.stdout, "out\n")
        self.assertIn("err\n", r.stderr)
        r = sbx("exec", self.claim, "--env", "GREETING=hi there", "--", "sh", "-c",
                'echo "$GREETING"')
        self.assertOk(r)
        self.assertEqual(r.stdout, "hi there\n")
        r = sbx("exec", self.claim, "--", "sh", "-c", "kill -TERM $$")
        self.assertEqual(r.returncode, 128 + 15, r.stderr)
        r = sbx("exec", self.claim, "--timeout-exec", "1s", "--", "sleep", "30")
        self.assertEqual(r.returncode, 124, r.stderr)
        self.assertIn("timed out", r.stderr)
        r = sbx("exec", self.claim, "--max-output", "10", "--", "sh", "-c", "seq 1 1000")
        self.assertOk(r)
        self.assertLessEqual(len(r.stdout), 10)
        self.assertIn("truncated", r.stderr)
        r = sbx("exec", "no-such-claim", "--", "true")
        self.assertError(r, "NOT_FOUND")
        r = sbx("exec", self.claim, "--", "/no/such/program")
        self.assertEqual(r.returncode, 1)
        self.assertIn("sbx: error: ", r.stderr)

    def test_exec_forwards_stdin_with_i_only(self):
        data = "".join(f"line {i}\n" for i in range(20000))  # ~200 KB, several chunks
        r = sbx("exec", self.claim, "-i", "--", "cat", input=data)
        self.assertOk(r)
        self.assertEqual(r.stdout, data)
        r = sbx("exec", self.claim, "-i", "--", "wc", "-c", input="")
        self.assertOk(r)
        self.assertEqual(r.stdout.strip(), "0")
        r = sbx("exec", self.claim, "--", "cat", input="ignored\n")
        self.assertOk(r)
        self.assertEqual(r.stdout, "")

    def test_exec_forwards_sigint(self):
        p = Popen("exec", self.claim, "--", "sh", "-c",
                  'trap "echo got-int; exit 7" INT; echo ready; '
                  "while :; do sleep 0.1; done")
        try:
            p.wait_for(lambda line: line == "ready\n")
            p.proc.send_signal(signal.SIGINT)
            p.wait_for(lambda line: line == "got-int\n")
            code, err = p.finish()
            self.assertEqual(code, 7, err)
        finally:
            p.kill()

    def test_cp_large_file_directories_and_absolute_paths(self):
        local = tempfile.mkdtemp(prefix="sbxcli-cpr-", dir="/tmp")
        try:
            # Above the unary calls' 64 MiB limit: only the streamed copy can move it.
            big = os.path.join(local, "big.bin")
            with open(big, "wb") as f:
                for i in range(70):
                    f.write(bytes([i]) * (1 << 20))
            self.assertOk(sbx("cp", big, f"{self.claim}:/tmp/big.bin"))
            back = os.path.join(local, "big.back")
            self.assertOk(sbx("cp", f"{self.claim}:/tmp/big.bin", back))
            with open(big, "rb") as a, open(back, "rb") as b:
                self.assertTrue(a.read() == b.read(), "the 70 MiB file came back changed")
            self.assertOk(sbx("exec", self.claim, "--", "rm", "/tmp/big.bin"))
            # A directory both ways.
            tree = os.path.join(local, "tree")
            os.makedirs(os.path.join(tree, "sub"))
            with open(os.path.join(tree, "sub", "a.txt"), "w") as f:
                f.write("a")
            os.symlink("sub/a.txt", os.path.join(tree, "link"))
            self.assertOk(sbx("cp", "-r", tree, f"{self.claim}:proj"))
            r = sbx("exec", self.claim, "--", "cat", "proj/link")
            self.assertOk(r)
            self.assertEqual(r.stdout, "a")
            # Made in the sandbox: a link out, a FIFO, a setuid file; none arrive as such.
            self.assertOk(sbx("exec", self.claim, "--", "sh", "-c",
                              "ln -s /etc proj/etc; mkfifo proj/fifo; echo x > proj/suid; "
                              "chmod 4755 proj/suid"))
            out = os.path.join(local, "out")
            self.assertOk(sbx("cp", "-r", f"{self.claim}:proj", out))
            with open(os.path.join(out, "sub", "a.txt")) as f:
                self.assertEqual(f.read(), "a")
            self.assertEqual(os.readlink(os.path.join(out, "etc")), "/etc")  # a link, kept
            self.assertFalse(os.path.exists(os.path.join(out, "fifo")))
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(out, "suid")).st_mode), 0o755)
            r = sbx("cp", "-r", "-", f"{self.claim}:x")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("'-'", r.stderr)
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def test_cp_round_trip_and_ls(self):
        local = tempfile.mkdtemp(prefix="sbxcli-cp-", dir="/tmp")
        try:
            src = os.path.join(local, "blob.bin")
            payload = os.urandom(2 * 1024 * 1024 + 12345)  # three WriteFile chunks
            with open(src, "wb") as f:
                f.write(payload)
            os.chmod(src, 0o750)
            r = sbx("cp", src, f"{self.claim}:dir/sub/blob.bin")
            self.assertOk(r)
            r = sbx("exec", self.claim, "--", "sh", "-c",
                    "stat -c '%s %a' dir/sub/blob.bin")
            self.assertOk(r)
            self.assertEqual(r.stdout.split(), [str(len(payload)), "750"])
            back = os.path.join(local, "back.bin")
            r = sbx("cp", f"{self.claim}:dir/sub/blob.bin", back)
            self.assertOk(r)
            with open(back, "rb") as f:
                self.assertEqual(f.read(), payload)
            self.assertEqual(stat.S_IMODE(os.stat(back).st_mode), 0o750)
            # Into a directory: keeps the name.
            r = sbx("cp", f"{self.claim}:dir/sub/blob.bin", local + "/")
            self.assertOk(r)
            # stdin and stdout.
            r = sbx("cp", "-", f"{self.claim}:note.txt", input="from stdin\n")
            self.assertOk(r)
            r = sbx("cp", f"{self.claim}:note.txt", "-")
            self.assertOk(r)
            self.assertEqual(r.stdout, "from stdin\n")
            # An empty file.
            empty = os.path.join(local, "empty")
            open(empty, "w").close()
            self.assertOk(sbx("cp", empty, f"{self.claim}:"))
            r = sbx("cp", f"{self.claim}:empty", "-")
            self.assertOk(r)
            self.assertEqual(r.stdout, "")
            r = sbx("cp", f"{self.claim}:missing.txt", os.path.join(local, "x"))
            self.assertError(r, "NOT_FOUND")
            self.assertFalse(os.path.exists(os.path.join(local, "x")))
            self.assertEqual(sorted(os.listdir(local)), ["back.bin", "blob.bin", "empty"])
            r = sbx("ls", self.claim, "dir", "-r")
            self.assertOk(r)
            self.assertIn("dir/sub/", r.stdout)
            self.assertIn("dir/sub/blob.bin", r.stdout)
            r = sbx("ls", self.claim, "-o", "json")
            self.assertOk(r)
            paths = [f["path"] for f in json.loads(r.stdout)]
            self.assertIn("note.txt", paths)
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def test_suspend_and_resume(self):
        r = sbx("suspend", self.claim)
        self.assertOk(r)
        self.assertIn("suspended", r.stdout)
        r = sbx("suspend", self.claim, "-o", "json")
        self.assertOk(r)
        self.assertTrue(json.loads(r.stdout)["suspended"])
        r = sbx("exec", self.claim, "--", "true")
        self.assertError(r, "FAILED_PRECONDITION")
        r = sbx("resume", self.claim)
        self.assertOk(r)
        self.assertIn("running", r.stdout)
        r = sbx("exec", self.claim, "--", "echo", "awake")
        self.assertOk(r)
        self.assertEqual(r.stdout, "awake\n")


class WatchCliTest(CliTestCase):
    """watch claims / watch pools: need WatchClaims and WatchPools on the server."""

    def test_watch_claims_until_ctrl_c(self):
        p = Popen("watch", "claims", "--selector", "suite=watch", "-o", "json")
        try:
            time.sleep(1)  # the stream is open (initial state: nothing matches)
            self.assertIsNone(p.proc.poll(), p.stderr_now())
            cid = claim_id("default", "--label", "suite=watch")
            added = json.loads(p.wait_for(lambda line: cid in line))
            self.assertEqual(added["type"], "WATCH_EVENT_TYPE_ADDED")
            self.assertEqual(added["claim"]["state"], "CLAIM_STATE_ACTIVE")
            self.assertOk(sbx("release", cid))
            modified = json.loads(p.wait_for(lambda line: cid in line))
            self.assertEqual(modified["type"], "WATCH_EVENT_TYPE_MODIFIED")
            self.assertEqual(modified["claim"]["state"], "CLAIM_STATE_RELEASED")
            self.assertGreater(int(modified["revision"]), int(added["revision"]))
            p.proc.send_signal(signal.SIGINT)
            code, err = p.finish()
            self.assertEqual(code, 0, err)
        finally:
            p.kill()

    def test_watch_claims_table(self):
        cid = claim_id("default", "--label", "suite=watch-table")
        try:
            r = sbx("watch", "claims", "--selector", "suite=watch-table", "--max-events", "1",
                    timeout=30)
            self.assertOk(r)
            lines = r.stdout.splitlines()
            self.assertEqual(lines[0].split()[:3], ["EVENT", "CLAIM", "POOL"])
            self.assertEqual(lines[1].split()[:4], ["ADDED", cid, "default", "ACTIVE"])
        finally:
            sbx("release", cid)

    def test_watch_pools(self):
        r = sbx("watch", "pools", "default", "--max-events", "1", "-o", "json", timeout=30)
        self.assertOk(r)
        event = json.loads(r.stdout)
        self.assertEqual(event["type"], "WATCH_EVENT_TYPE_ADDED")
        self.assertEqual(event["pool"]["name"], "default")
        # The API answers NOT_FOUND at once for a name that does not exist.
        try:
            r = sbx("watch", "pools", "nope", "--max-events", "1", timeout=15)
        except subprocess.TimeoutExpired:
            self.fail("`sbx watch pools nope` still waiting after 15 s: the server did not end "
                      "WatchPools with NOT_FOUND")
        self.assertError(r, "NOT_FOUND", '"nope"')


MAKE_OCI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "images", "make_oci.py")


class ImageCliTest(CliTestCase):
    """`sbx images [pull|rm]` against a server with an image cache (issue 34), on an image
    the test writes offline (tests/images/make_oci.py), with the real skopeo and umoci."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(extra=lambda d: ["--image_cache_bytes", str(64 << 20),
                                          "--image_import_dir", os.path.join(d, "import")],
                         runtime="instant")
        cls.layout = os.path.join(cls.srv.dir, "import", "bb")
        spec = {"config": {"Env": ["A=1"], "WorkingDir": "/work"},
                "layers": [[{"name": "bin", "type": "dir"},
                            {"name": "bin/busybox", "type": "file", "from": "/bin/busybox",
                             "mode": 0o755}]]}
        subprocess.run([sys.executable, MAKE_OCI, cls.layout, "v1", json.dumps(spec)],
                       check=True, capture_output=True, timeout=60)
        cls.ref = "oci:%s:v1" % cls.layout

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def metric(self, name):
        import re
        import urllib.request
        log = self.srv.logtext()
        port = re.search(r"metrics: serving /metrics on port (\d+)", log).group(1)
        with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
            text = r.read().decode()
        m = re.search(r"(?m)^%s(?:\{[^}]*\})? (\S+)$" % name, text)
        return float(m.group(1)) if m else None

    def test_pull_list_and_remove(self):
        target = self.srv.target
        r = sbx("images", server=target)
        self.assertOk(r)
        self.assertIn("No images in the cache", r.stderr)
        r = sbx("images", "pull", self.ref, server=target)
        self.assertOk(r)
        self.assertIn(self.ref, r.stdout)
        self.assertEqual(r.stdout.splitlines()[0].split()[:3], ["DIGEST", "REF", "SIZE"])
        r = sbx("-o", "json", "images", "pull", self.ref, server=target)  # a hit now
        self.assertOk(r)
        pulled = json.loads(r.stdout)
        self.assertTrue(pulled["digest"].startswith("sha256:"))
        self.assertEqual(pulled["config"]["env"], ["A=1"])
        self.assertEqual(pulled["config"]["workingDir"], "/work")
        r = sbx("-o", "json", "images", server=target)
        self.assertOk(r)
        listed = json.loads(r.stdout)
        self.assertEqual([i["digest"] for i in listed], [pulled["digest"]])
        self.assertGreater(int(listed[0]["bytes"]), 1 << 20)
        self.assertEqual(self.metric("sbx_image_cache_misses_total"), 1)
        self.assertEqual(self.metric("sbx_image_cache_hits_total"), 1)
        self.assertGreater(self.metric("sbx_image_cache_bytes"), 1 << 20)
        self.assertEqual(listed[0].get("holders", 0), 0)
        r = sbx("images", "rm", pulled["digest"][:19], server=target)  # as the table shows it
        self.assertOk(r)
        r = sbx("-o", "json", "images", server=target)
        self.assertEqual(json.loads(r.stdout), [])
        r = sbx("images", "rm", pulled["digest"], server=target)
        self.assertError(r, "NOT_FOUND", pulled["digest"])

    def test_refusals(self):
        target = self.srv.target
        r = sbx("images", "pull", self.ref, token=TENANT, server=target)
        self.assertError(r, "PERMISSION_DENIED")
        # The server reads no host file outside its import folders.
        r = sbx("images", "pull", "oci:/etc:v1", server=target)
        self.assertError(r, "INVALID_ARGUMENT", "outside the import folders")
        r = sbx("images", "pull", "dir:/tmp", server=target)
        self.assertError(r, "INVALID_ARGUMENT", "dir:/tmp")
        r = sbx("images", "pull", "oci:%s:nosuchtag" % self.layout, server=target)
        self.assertError(r, "NOT_FOUND", "nosuchtag")
        # A server without an image cache says so.
        r = sbx("images")
        self.assertError(r, "FAILED_PRECONDITION", "--image_cache_bytes")

    def test_claim_by_image_without_a_pool_of_it(self):
        # The instant runtime makes no pools of images (only the local runtime does):
        # NOT_FOUND naming the image, and no pool was made.
        target = self.srv.target
        r = sbx("claim", "--image", self.ref, token=TENANT, server=target)
        self.assertError(r, "NOT_FOUND", 'no pool runs image "%s"' % self.ref)
        r = sbx("-o", "json", "pools", server=target)
        self.assertOk(r)
        self.assertNotIn("image-", r.stdout)
        # A reference with a blank is the request's mistake. (This server makes no pools
        # of images, so its image cache does not judge references: any other string
        # names an image no pool runs.)
        r = sbx("claim", "--image", "oci:/x y", token=TENANT, server=target)
        self.assertError(r, "INVALID_ARGUMENT", '"oci:/x y" has a blank')
        r = sbx("claim", "--image", "dir:/tmp", token=TENANT, server=target)
        self.assertError(r, "NOT_FOUND", "only the local runtime")


def setUpModule():
    global SRV
    SRV = Server()


def tearDownModule():
    if SRV is not None:
        SRV.stop()


if __name__ == "__main__":
    SBX = os.path.abspath(sys.argv.pop(1))
    SERVER = os.path.abspath(sys.argv.pop(1))
    unittest.main()
