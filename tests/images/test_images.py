"""OCI images for tests, built here and offline with make_oci.py from this machine's files:
Debian's busybox-static (with a link per applet) and, where asked, this machine's python3
with the libraries it loads and its standard library."""

import json
import os
import subprocess
import sys
import tempfile

MAKE_OCI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_oci.py")
BUSYBOX = "/bin/busybox"
PYTHON = "/usr/bin/python3.11"
PYTHON_LIB = "/usr/lib/python3.11"
# Parts of the standard library no test runs.
PYTHON_EXCLUDE = ["test", "__pycache__", "idlelib", "tkinter", "lib2to3", "ensurepip",
                  "distutils", "pydoc_data", "site-packages", "dist-packages", "turtledemo",
                  "config-3.11-x86_64-linux-gnu"]


def busybox_entries():
    """/bin/busybox and a link to it for each applet in /bin."""
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    entries = [{"name": "bin", "type": "dir"},
               {"name": "bin/busybox", "type": "file", "from": BUSYBOX, "mode": 0o755}]
    entries += [{"name": f"bin/{a}", "type": "symlink", "link": "busybox"}
                for a in applets if a != "busybox"]
    return entries


def shared_libraries(paths):
    """The host paths of the libraries (and the loader) the ELF files `paths` load."""
    libs = set()
    for path in paths:
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                libs.add(parts[2])
            elif parts and parts[0].startswith("/"):
                libs.add(parts[0])
    return sorted(libs)


def python_entries():
    """python3 (at /usr/bin/python3), its libraries at their host paths and its standard
    library."""
    dynload = os.path.join(PYTHON_LIB, "lib-dynload")
    elves = [PYTHON] + [os.path.join(dynload, n) for n in os.listdir(dynload)
                        if n.endswith(".so")]
    entries, dirs = [], set()
    for lib in shared_libraries(elves):
        real = os.path.realpath(lib)
        parent = os.path.dirname(lib.lstrip("/"))
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = os.path.dirname(parent)
        entries.append({"name": lib.lstrip("/"), "type": "file", "from": real, "mode": 0o755})
    entries = [{"name": d, "type": "dir"} for d in sorted(dirs)] + entries
    entries += [{"name": "usr", "type": "dir"}, {"name": "usr/bin", "type": "dir"},
                {"name": "usr/lib", "type": "dir"},
                {"name": "usr/bin/python3", "type": "file", "from": PYTHON, "mode": 0o755},
                {"name": "usr/lib/python3.11", "type": "tree", "from": PYTHON_LIB,
                 "exclude": PYTHON_EXCLUDE}]
    return entries


def make_image(out_dir, tag, layers, config=None, compresslevel=1):
    """Writes (or adds `tag` to) the OCI layout `out_dir`; returns "oci:OUT_DIR:TAG"."""
    spec = {"config": config or {}, "layers": layers, "compresslevel": compresslevel}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        spec_path = f.name
    try:
        subprocess.run([sys.executable, MAKE_OCI, out_dir, tag, "@" + spec_path], check=True,
                       stdout=subprocess.DEVNULL)
    finally:
        os.remove(spec_path)
    return f"oci:{out_dir}:{tag}"


OS_RELEASE = 'ID=sbx-test\nNAME="sbx test image"\nVERSION_ID=1\n'
PASSWD = ("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
GROUP = "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"


def base_entries():
    """/etc of a small image: os-release, passwd, group; /tmp."""
    return [{"name": "etc", "type": "dir"},
            {"name": "etc/os-release", "type": "file", "data": OS_RELEASE},
            {"name": "etc/passwd", "type": "file", "data": PASSWD},
            {"name": "etc/group", "type": "file", "data": GROUP},
            {"name": "tmp", "type": "dir", "mode": 0o1777}]


def busybox_image(out_dir, tag="busybox", config=None, extra=()):
    """busybox with /etc/os-release ID=sbx-test; `extra` entries in a second layer."""
    layers = [busybox_entries() + base_entries()]
    if extra:
        layers.append(list(extra))
    cfg = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]}
    cfg.update(config or {})
    return make_image(out_dir, tag, layers, cfg)


def python_image(out_dir, tag="python", config=None):
    """busybox and python3 (what the attack suite runs in a sandbox)."""
    cfg = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]}
    cfg.update(config or {})
    return make_image(out_dir, tag, [busybox_entries() + base_entries(), python_entries()], cfg)
