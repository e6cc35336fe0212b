"""Small helpers shared by the Python benchmark drivers of bench/ (relay_hop.py,
replication_cost.py): a kube-emulator with sbx's CRDs, bounded waits and stopping the
processes a run started."""
import json
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


def start_emulator(emulator, work, procs):
    """Starts kube-emulator on loopback (appended to `procs`), writes a kubeconfig for it in
    `work` and applies sbx's CRDs. Returns the kubeconfig's path."""
    emu = subprocess.Popen([emulator, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    procs.append(emu)
    url = emu.stdout.readline().strip().split("serving on ")[1]
    kubeconfig = os.path.join(work, "kubeconfig")
    with open(kubeconfig, "w") as f:
        json.dump({"apiVersion": "v1", "kind": "Config",
                   "clusters": [{"name": "emu", "cluster": {"server": url}}],
                   "users": [{"name": "emu", "user": {"token": "t"}}],
                   "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                   "current-context": "emu"}, f)
    kubectl = ["kubectl", "--kubeconfig", kubeconfig]
    crds = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "charts", "sbx", "crds")
    subprocess.run(kubectl + ["apply", "-f", crds], check=True, stdout=subprocess.DEVNULL)
    return kubeconfig
