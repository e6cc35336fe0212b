"""Small helpers shared by the Python benchmark drivers of bench/ (relay_hop.py,
replication_cost.py): bounded waits and stopping the processes a run started."""
import os
import shutil
import subprocess
import time


def wait_for(pred, timeout, what):
    """pred()'s first true value within `timeout` seconds; exits naming `what` otherwise."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise SystemExit("timed out waiting for " + what)


def stop_all(procs, work, keep_env):
    """Terminates `procs` (last started first), kills those that do not stop within 15 s,
    and removes `work` unless the environment variable `keep_env` is set."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
    if not os.environ.get(keep_env):
        shutil.rmtree(work, ignore_errors=True)
