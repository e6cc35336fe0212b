"""Finding the processes of local sandboxes from the host, for the tests that start
servers: standard library only, so that every test script can import it."""

import os


def processes_with(text):
    """Pids of processes whose command line contains `text` (a sandbox id, which is bwrap's
    --hostname, or a folder) or that work in a folder whose path contains it (a sandbox's
    top process works in its host folder), and of every process below those (bwrap's
    init in the sandbox's pid namespace, and what it runs)."""
    parent = {}
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                parent[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.add(pid)
            if text in os.readlink(f"/proc/{entry}/cwd"):
                found.add(pid)
        except (OSError, IndexError, ValueError):
            pass
    found.discard(os.getpid())
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return sorted(found)
