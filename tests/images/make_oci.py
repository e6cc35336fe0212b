#!/usr/bin/env python3
"""Writes an OCI image layout for tests, offline, from a JSON spec (no tool, no network).

  make_oci.py OUT_DIR TAG SPEC_JSON        (or @FILE holding the JSON)

SPEC_JSON: {"config": {"Env": [...], "WorkingDir": "...", "User": "...", "Cmd": [...]},
            "layers": [[ENTRY, ...], ...],
            "corrupt_layer": false,          # change a layer's bytes after its digest
            "zeros_file": {"name": "big", "bytes": N},   # a gzip bomb entry in layer 0
            "compresslevel": 9,                          # gzip level of the layers
            "declare_layer_size": N}                     # the manifest lies about layer 0's size
ENTRY: {"name": "bin/busybox", "type": "file"|"dir"|"symlink"|"hardlink"|"chardev"|"fifo",
        "data": "text", "from": "/bin/busybox", "mode": 493, "link": "target",
        "xattrs": {"user.x": "value", "security.capability": "hex:0100..."}}
    or {"name": "usr/lib/python3.11", "type": "tree", "from": "/usr/lib/python3.11",
        "exclude": ["test", "__pycache__"]}: a host folder's files, folders and links
        (names in "exclude" skipped at any depth), owned by root.
Names are written as given (a hostile layer may say "../x" or "/etc/x").
"""
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile


def blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(out, "blobs", "sha256")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest


class Zeros(io.RawIOBase):
    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def expand_trees(entries):
    """The entries with each "tree" replaced by the host folder's contents."""
    out = []
    for e in entries:
        if e["type"] != "tree":
            out.append(e)
            continue
        exclude = set(e.get("exclude", ()))
        out.append({"name": e["name"], "type": "dir"})
        for root, dirs, files in os.walk(e["from"]):
            dirs[:] = sorted(d for d in dirs if d not in exclude)
            rel = os.path.relpath(root, e["from"])
            base = e["name"] if rel == "." else os.path.join(e["name"], rel)
            for name in dirs + sorted(f for f in files if f not in exclude):
                host = os.path.join(root, name)
                st = os.lstat(host)
                entry = {"name": os.path.join(base, name), "mode": st.st_mode & 0o7777}
                if os.path.islink(host):
                    entry.update(type="symlink", link=os.readlink(host))
                elif os.path.isdir(host):
                    entry.update(type="dir")
                elif os.path.isfile(host):
                    entry.update(type="file", **{"from": host})
                else:
                    continue
                out.append(entry)
    return out


def layer_tar(entries, zeros=None, compresslevel=9):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in expand_trees(entries):
            info = tarfile.TarInfo(e["name"])
            info.mode = e.get("mode", 0o755 if e["type"] == "dir" else 0o644)
            info.uid = e.get("uid", 0)
            if "xattrs" in e:  # PAX records, as GNU tar and Docker write them
                # "hex:..." values are bytes (a file capability, say).
                info.pax_headers = {
                    f"SCHILY.xattr.{k}": (bytes.fromhex(v[4:]).decode("utf-8", "surrogateescape")
                                          if v.startswith("hex:") else v)
                    for k, v in e["xattrs"].items()}
            info.gid = e.get("gid", 0)
            t = e["type"]
            data = None
            if t == "file":
                if "from" in e:
                    with open(e["from"], "rb") as f:
                        data = f.read()
                else:
                    data = e.get("data", "").encode()
                info.size = len(data)
            elif t == "dir":
                info.type = tarfile.DIRTYPE
            elif t == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = e["link"]
            elif t == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = e["link"]
            elif t == "chardev":
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = 1, 3
            elif t == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        if zeros:
            info = tarfile.TarInfo(zeros["name"])
            info.size = zeros["bytes"]
            info.mode = 0o644
            tar.addfile(info, io.BufferedReader(Zeros(zeros["bytes"]), 1 << 20))
    raw_bytes = raw.getvalue()
    return raw_bytes, gzip.compress(raw_bytes, compresslevel=compresslevel, mtime=0)


def main():
    out, tag, spec = sys.argv[1], sys.argv[2], sys.argv[3]
    if spec.startswith("@"):
        with open(spec[1:]) as f:
            spec = f.read()
    spec = json.loads(spec)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    layers, diff_ids = [], []
    for i, entries in enumerate(spec.get("layers", [])):
        raw, gz = layer_tar(entries, spec.get("zeros_file") if i == 0 else None,
                            spec.get("compresslevel", 9))
        digest = blob(out, gz)
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        size = len(gz)
        if i == 0 and "declare_layer_size" in spec:
            size = spec["declare_layer_size"]
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": digest, "size": size})
        if spec.get("corrupt_layer"):
            path = os.path.join(out, "blobs", "sha256", digest.split(":")[1])
            with open(path, "r+b") as f:
                f.seek(len(gz) // 2)
                f.write(b"\xff\xfe")
    config = {"architecture": "amd64", "os": "linux",
              "config": spec.get("config", {}),
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    config_bytes = json.dumps(config).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": blob(out, config_bytes), "size": len(config_bytes)},
                "layers": layers}
    manifest_bytes = json.dumps(manifest).encode()
    index_path = os.path.join(out, "index.json")
    index = {"schemaVersion": 2, "manifests": []}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    index["manifests"] = [m for m in index["manifests"]
                          if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") != tag]
    index["manifests"].append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "digest": blob(out, manifest_bytes), "size": len(manifest_bytes),
                               "annotations": {"org.opencontainers.image.ref.name": tag}})
    with open(index_path, "w") as f:
        json.dump(index, f)
    print(index["manifests"][-1]["digest"])


if __name__ == "__main__":
    main()
