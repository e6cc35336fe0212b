#!/usr/bin/env python3
"""Layering check: fails when a file includes a header its component may not use.

The rules are the table "Components and who may use whom" of docs/architecture.md
(and ../shared/docs/design.md), written out here as data. Run from the repository root,
or pass --root. Exit status 0 when clean, 1 with one line per violation otherwise.
"""

import argparse
import os
import re
import sys

# Which components each component's files may include ("store:interface" means only the
# interface headers of store, never its implementations). A component may always include
# its own headers. "proto" means the generated sbx/v1/*.pb.h headers.
ALLOWED = {
    "common": set(),
    "store": {"common"},
    # The local runtime holds images of the cache through its interface (images.h).
    "runtime": {"common", "images:interface"},
    # The OCI image cache of the local runtime (skopeo and umoci as child processes).
    "images": {"common", "store:interface"},
    "allocator": {"common", "store:interface", "runtime:interface"},
    # The warm-pool and claim controllers are front-ends of the allocator, like the server.
    "k8s": {"common", "runtime:interface", "store:interface", "allocator:interface"},
    "sandboxd": {"common", "proto"},
    "server": {"allocator", "common", "proto", "images:interface"},
    # The HTTP front (the port proxy): a front-end like the gRPC services, beside them.
    "gateway": {"server", "allocator", "common", "proto"},
    # The E2B-compatible API, src/gateway/e2b (its own target, sbx::gateway_e2b; a room of
    # the gateway, see component_of_path): a client of sbx's public gRPC API (through a
    # channel the server gives it), so it needs neither the allocator, nor the server's
    # internals, nor the port proxy (the wiring in src/cmd joins the two).
    "gateway_e2b": {"common", "proto", "e2b_proto"},
    # Store replication between replicas: the store's replication interface and its own
    # generated service (proto/sbx/replication/v1).
    "replication": {"common", "store:interface", "proto"},
    "cmd": {"*"},
}

# src/k8s in rooms (src/k8s/CMakeLists.txt builds one target per room): a file's room is
# named by its stem (foo.h and foo.cc); the rooms each room's files may include, and the
# only room that may include other components' interfaces beyond common.
K8S_ROOMS = {
    "transports": {"http", "http_lines", "http_socket", "http_cpprest"},
    "client": {"client", "config", "informer", "work_queue", "controller_metrics", "leader_election", "write_scheduler",
               "sandbox_key", "rate_limiter", "resources", "json_fields", "thread_priority",
               "namespaces", "objects_types"},
    "sandbox_controller": {"sandbox_objects", "sandbox_controller", "template_objects",
                           "template_controller"},
    "conversion": {"conversion", "conversion_webhook", "crd_conversion"},
    "pools": {"kube_runtime", "warm_pool_controller", "claim_objects", "claim_writer",
              "grpc_claim_mirror", "claim_controller"},
    "fleet": {"fleet_config", "fleet_health", "fleet_placement", "fleet_runtime"},
}
K8S_ROOM_USES = {
    "transports": set(),
    "client": {"transports"},
    "sandbox_controller": {"client"},
    "conversion": {"client"},
    "pools": {"client", "sandbox_controller"},
    "fleet": set(),
}
# Only the pools room sees the allocator, runtime and store: the REST client and the
# Sandbox controller build and test without them.
K8S_ROOM_OUTSIDE = {"pools", "fleet"}


def k8s_room(path):
    """The room of src/k8s/<stem>.{h,cc}, or None when no room names it."""
    stem = os.path.splitext(os.path.basename(path))[0]
    for room, stems in K8S_ROOMS.items():
        if stem in stems:
            return room
    return None


# src/runtime in rooms (src/runtime/CMakeLists.txt): the local runtime (sbx::runtime_local)
# is split by job, one room per stem (foo.h and foo.cc); each room may include the headers
# of the rooms listed, which keeps them free of cycles. local_sandbox.h and proc.h are at
# the bottom; bubblewrap_runtime.cc (the runtime's table, threads and Make) sits on top.
# bubblewrap_runtime.h is the local runtime's public header: it may include only runtime.h
# (RUNTIME_HEADER_USES), and it and the other public headers (RUNTIME_DOORS) are all that
# files outside src/runtime may include of it.
RUNTIME_ROOM_USES = {
    "runtime": set(),
    "instant_runtime": {"runtime"},
    "proc": set(),
    "local_sandbox": {"proc"},
    "seccomp_filter": {"proc"},
    "state_file": {"proc", "local_sandbox"},
    "cgroups": {"proc", "local_sandbox", "bubblewrap_runtime"},
    # Sandboxes of an image: image_root (the runtime's side) and image_root_helper (the body
    # of sbx-rootfs, which includes nothing of sbx's).
    "image_root_helper": set(),
    "image_root": {"proc"},
    "bwrap_args": {"proc", "local_sandbox", "bubblewrap_runtime", "image_root",
                   "image_root_helper"},
    "reaper": {"proc", "local_sandbox", "cgroups", "image_root"},
    "spawn": {"proc", "local_sandbox", "cgroups", "state_file", "reaper", "bubblewrap_runtime"},
    "adoption": {"proc", "local_sandbox", "cgroups", "state_file", "reaper"},
    "probe": {"proc", "local_sandbox", "seccomp_filter", "bwrap_args", "spawn",
              "bubblewrap_runtime"},
    # Snapshots (issue 37): the copy of a hostile tree, and the snapshots' folder.
    "snapshot_copy": {"proc"},
    "snapshot_files": {"proc", "local_sandbox", "snapshot_copy", "image_root"},
    "bubblewrap_runtime": {"runtime", "proc", "local_sandbox", "seccomp_filter", "state_file",
                           "cgroups", "bwrap_args", "reaper", "spawn", "adoption", "probe",
                           "image_root", "snapshot_files", "snapshot_copy"},
}
# src/allocator: the allocator (allocator.h, its implementation allocator_impl.h and the
# rooms that define AllocatorImpl's methods) sits on top of its parts, and the refill drives
# it; the parts below (ready sets, watch hub, pools, queues, tables) never include it back.
ALLOCATOR_TOP = {"allocator", "allocator_impl", "admin", "claim_path", "claim_batch",
                 "claim_changes", "sandbox_events", "recovery", "refill", "snapshots"}
ALLOCATOR_TOP_HEADERS = {"src/allocator/allocator.h", "src/allocator/allocator_impl.h"}

RUNTIME_HEADER_USES = {"src/runtime/bubblewrap_runtime.h": {"runtime"}}
RUNTIME_DOORS = {"src/runtime/runtime.h", "src/runtime/bubblewrap_runtime.h",
                 "src/runtime/instant_runtime.h", "src/runtime/image_root_helper.h"}


def stem_of(path):
    return os.path.splitext(os.path.basename(path))[0]


def check_runtime_room(where, rel, inc):
    """Errors of one include of a src/runtime file that crosses the rooms of src/runtime."""
    room = stem_of(rel)
    if room not in RUNTIME_ROOM_USES:
        return []  # reported once by check_file
    to = stem_of(inc)
    uses = RUNTIME_HEADER_USES.get(rel, RUNTIME_ROOM_USES[room])
    if to == room and rel not in RUNTIME_HEADER_USES:
        return []
    if to not in RUNTIME_ROOM_USES:
        return [f"{where}: includes \"{inc}\", which is not in a room of src/runtime"]
    if to in uses:
        return []
    return [f"{where}: {rel} includes \"{inc}\" of the {to} room "
            f"(it may use: {', '.join(sorted(uses)) or 'no other room'})"]


# The interface headers of components whose implementations others must not see.
INTERFACES = {
    "images": {"src/images/images.h"},
    "store": {"src/store/store.h", "src/store/records.h", "src/store/replication.h"},
    "runtime": {"src/runtime/runtime.h"},
    "allocator": {"src/allocator/allocator.h", "src/allocator/reconciler.h",
                  "src/allocator/sandbox.h"},
}

# Third-party libraries whose types must stop at one adapter file (style.md). The value
# lists the files (relative to the root) allowed to include them; "src/<c>/" allows a
# whole component.
THIRD_PARTY = {
    # The RocksDB store's rooms (src/store/rocksdb_common.h lists them).
    "rocksdb/": ["src/store/rocksdb_store.cc", "src/store/rocksdb_store_open.cc",
                 "src/store/rocksdb_store_open.h", "src/store/rocksdb_commit.cc",
                 "src/store/rocksdb_commit.h", "src/store/rocksdb_space.cc",
                 "src/store/rocksdb_space.h", "src/store/rocksdb_replication.cc",
                 "src/store/rocksdb_replication.h", "src/store/rocksdb_info_log.cc",
                 "src/store/rocksdb_info_log.h", "src/store/rocksdb_common.cc",
                 "src/store/rocksdb_common.h"],
    "cpprest/": ["src/k8s/http_cpprest.cc"],
    "pplx/": ["src/k8s/http_cpprest.cc"],
    "openssl/": ["src/k8s/http_socket.cc", "src/common/sandbox_secret.cc",
                 "src/replication/service.cc", "src/images/digest.cc",
                 "src/server/port_token.cc"],
    "boost/": ["src/k8s/conversion_webhook.cc", "src/gateway/port_proxy.cc",
               "src/gateway/e2b/http_server.cc"],
    "grpcpp/": ["src/server/", "src/sandboxd/", "src/cmd/", "src/replication/",
                "src/gateway/e2b/"],
    "grpc/": ["src/server/", "src/sandboxd/", "src/cmd/", "src/replication/",
              "src/gateway/e2b/"],
    "google/protobuf/": ["src/server/", "src/sandboxd/", "src/cmd/", "src/store/rocksdb_store.cc",
                         "src/runtime/", "src/replication/", "src/gateway/e2b/"],
    "prometheus/": ["src/server/", "src/cmd/", "src/k8s/"],
    "seccomp.h": ["src/runtime/seccomp_filter.cc"],
}

# clients/ (design.md): packages of their own ecosystems that speak the public API only.
# They may read proto/ (to generate stubs) and the MCP server the TypeScript SDK; a path
# into src/ or tests/ means code that reaches past the API.
CLIENT_EXT = (".py", ".ts", ".mts", ".js", ".mjs", ".cjs")
CLIENT_SKIP = {"node_modules", "dist", "dist-test", "build", "gen", "__pycache__"}
RELATIVE_PATH_RE = re.compile(r"""["']((?:\.\.?/)+[^"'\s]*)["']""")


def check_clients(root):
    """Lines of files in clients/ with a relative path that leads into src/ or tests/."""
    errors, checked = [], 0
    clients = os.path.join(root, "clients")
    forbidden = [os.path.join(root, "src") + os.sep, os.path.join(root, "tests") + os.sep]
    for dirpath, dirnames, files in os.walk(clients):
        dirnames[:] = [d for d in dirnames if d not in CLIENT_SKIP]
        for name in sorted(files):
            if not name.endswith(CLIENT_EXT):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            checked += 1
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    for m in RELATIVE_PATH_RE.finditer(line):
                        target = os.path.normpath(os.path.join(dirpath, m.group(1))) + os.sep
                        if any(target.startswith(p) for p in forbidden):
                            errors.append(f"{rel}:{lineno}: \"{m.group(1)}\" leads into "
                                          f"{os.path.relpath(target, root).split(os.sep)[0]}/; "
                                          "clients use the public API (proto/) only")
    return errors, checked


INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
SOURCE_EXT = (".h", ".hh", ".hpp", ".cc", ".cpp", ".cxx", ".inc")


# src/gateway holds two targets: the port proxy (src/gateway/*) and the E2B-compatible API
# (src/gateway/e2b/*), checked as components of their own.
GATEWAY_E2B = "src/gateway/e2b/"


def component_of_path(rel):
    """The component of a file (or header) under src/: its folder, or gateway_e2b."""
    if rel.startswith(GATEWAY_E2B):
        return "gateway_e2b"
    return rel.split("/")[1]


def component_of_include(path):
    """Returns (component, kind) of an included project header, or (None, None)."""
    if path.startswith("src/"):
        parts = path.split("/")
        if len(parts) >= 3:
            return component_of_path(path), "src"
    if path.startswith("sbx/v1/") or path.startswith("sbx/replication/"):
        return "proto", "proto"
    if path.startswith("e2b/envd/"):  # envd's messages (proto/e2b), for the E2B front only
        return "e2b_proto", "proto"
    if path.startswith("tests/") or path.startswith("bench/"):
        return path.split("/")[0], "outside"
    return None, None


def allowed_file(rel, patterns):
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in patterns)


def check_file(root, rel, component):
    errors = []
    allowed = ALLOWED.get(component)
    if allowed is None:
        return [f"{rel}: component \"{component}\" is not in the layering table "
                "(add it to scripts/check_layering.py and docs/architecture.md)"]
    if component == "k8s" and k8s_room(rel) is None:
        errors.append(f"{rel}: not in a room of src/k8s (add its stem to K8S_ROOMS in "
                      "scripts/check_layering.py and to a target of src/k8s/CMakeLists.txt)")
    if component == "runtime" and stem_of(rel) not in RUNTIME_ROOM_USES:
        errors.append(f"{rel}: not in a room of src/runtime (add its stem to RUNTIME_ROOM_USES "
                      "in scripts/check_layering.py and to src/runtime/CMakeLists.txt)")
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            inc = m.group(1)
            where = f"{rel}:{lineno}"
            for prefix, files in THIRD_PARTY.items():
                if inc.startswith(prefix) and not allowed_file(rel, files):
                    errors.append(f"{where}: includes <{inc}>, but {prefix.rstrip('/')} may be "
                                  f"used only in {', '.join(files) or 'no file of src/'}")
            target, kind = component_of_include(inc)
            if component == "k8s" and target is not None:
                errors.extend(check_k8s_room(where, rel, inc, target))
            if (component == "allocator" and inc in ALLOCATOR_TOP_HEADERS
                    and stem_of(rel) not in ALLOCATOR_TOP):
                errors.append(f"{where}: includes \"{inc}\", the allocator that sits on top of "
                              f"this part of src/allocator (a back-arrow; only "
                              f"{', '.join(sorted(ALLOCATOR_TOP))} may)")
            if target == "runtime" and component == "runtime":
                errors.extend(check_runtime_room(where, rel, inc))
            elif target == "runtime" and inc not in RUNTIME_DOORS:
                errors.append(f"{where}: includes \"{inc}\", a room of the local runtime; "
                              f"outside src/runtime only {', '.join(sorted(RUNTIME_DOORS))} "
                              "may be included")
                continue
            if target is None or target == component or "*" in allowed:
                continue
            if kind == "outside":
                errors.append(f"{where}: includes \"{inc}\"; src/ may not include {target}/")
                continue
            if target in allowed:
                continue
            if f"{target}:interface" in allowed:
                if inc in INTERFACES.get(target, set()):
                    continue
                errors.append(f"{where}: {component} includes \"{inc}\", an implementation "
                              f"header of {target}; it may use only "
                              f"{', '.join(sorted(INTERFACES.get(target, [])))}")
                continue
            errors.append(f"{where}: {component} may not include \"{inc}\" "
                          f"({component} may use: {', '.join(sorted(allowed)) or 'abseil only'})")
    return errors


# Cycles inside a component (issue 39). A component's files are grouped by stem (foo.h and
# foo.cc are one unit, as in Lakos's physical design): stem A uses stem B when a file of A
# includes src/<folder>/B.h. The units of one folder must form no cycle, or no part of the
# component can be understood, tested or replaced without the others: a back-arrow (a part
# including the allocator that sits on it) closes one. Every folder of src/ is checked
# (src/gateway/e2b apart from src/gateway).
#
# The cycles that stood when the check came, each a set of stems that may stay mutually
# reachable (a cycle among a subset of them passes; one more stem, or a cycle elsewhere,
# fails). Most are the same shape: the component's public header (the door) declares the
# options struct the rooms below take, and the door's .cc sits on top of those rooms; the
# cure is to move the options into a header of their own below the rooms.
KNOWN_CYCLES = {
    # e2b.h declares FrontOptions and FrontDeps, which control_plane.h and envd.h take, and
    # e2b.cc includes both; control_plane.cc uses envd's EnvdAccessToken while envd.cc uses
    # control_plane's HttpStatusOf, RespondError and PrepareContext (shared helpers that
    # belong in a room below both).
    "src/gateway/e2b": {"control_plane", "e2b", "envd"},
    # bubblewrap_runtime.h declares BubblewrapRuntimeOptions (and LocalSpec), which
    # bwrap_args, cgroups, probe and spawn take; bubblewrap_runtime.cc includes them all.
    "src/runtime": {"adoption", "bubblewrap_runtime", "bwrap_args", "cgroups", "probe",
                    "reaper", "spawn"},
    # rocksdb_store.h declares RocksDbStoreOptions, which the store's rooms take;
    # rocksdb_store.cc (the class) includes the rooms.
    "src/store": {"rocksdb_commit", "rocksdb_replication", "rocksdb_space", "rocksdb_store",
                  "rocksdb_store_open"},
}


def include_graph(root, folder):
    """{stem: {used stem: "file:line"}} of the files directly in src folder `folder`."""
    graph = {}
    path = os.path.join(root, folder)
    for name in sorted(os.listdir(path)):
        if not name.endswith(SOURCE_EXT) or not os.path.isfile(os.path.join(path, name)):
            continue
        stem = stem_of(name)
        uses = graph.setdefault(stem, {})
        with open(os.path.join(path, name), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m or os.path.dirname(m.group(1)) != folder:
                    continue
                to = stem_of(m.group(1))
                if to != stem:
                    uses.setdefault(to, f"{folder}/{name}:{lineno}")
    return graph


def strongly_connected(graph):
    """The strongly connected sets of stems with more than one member (Tarjan), sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        # Iterative, so a long chain of includes cannot reach Python's recursion limit.
        work = [(v, iter(sorted(graph.get(v, {}))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            advanced = False
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    members.add(w)
                    if w == node:
                        break
                if len(members) > 1:
                    found.append(members)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda s: sorted(s))


def one_cycle(graph, members):
    """A shortest cycle through the alphabetically first member, inside `members`."""
    start = min(members)
    parent, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, {})):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(members)


def check_cycles(root):
    """Errors for include cycles among the stems of each folder of src/."""
    errors = []
    src = os.path.join(root, "src")
    for dirpath, _, _ in sorted(os.walk(src)):
        folder = os.path.relpath(dirpath, root).replace(os.sep, "/")
        if folder == "src":
            continue
        graph = include_graph(root, folder)
        for members in strongly_connected(graph):
            if members <= KNOWN_CYCLES.get(folder, set()):
                continue
            cycle = one_cycle(graph, members)
            steps = "; ".join(f"{graph[a][b]} includes {folder}/{b}.h"
                              for a, b in zip(cycle, cycle[1:]))
            extra = sorted(members - set(cycle))
            errors.append(f"{folder}: include cycle {' -> '.join(cycle)} ({steps})"
                          + (f"; also in it: {', '.join(extra)}" if extra else "")
                          + " (a unit of a component may not reach back to one that uses it)")
    return errors


def check_k8s_room(where, rel, inc, target):
    """Errors of one include of a src/k8s file that crosses the rooms of src/k8s."""
    room = k8s_room(rel)
    if room is None:
        return []  # reported once by check_file
    if target == "k8s":
        to = k8s_room(inc)
        if to is None or to == room or to in K8S_ROOM_USES[room]:
            return []
        uses = ", ".join(sorted(K8S_ROOM_USES[room])) or "no other room"
        return [f"{where}: the {room} room of src/k8s includes \"{inc}\" of the {to} room "
                f"({room} may use: {uses})"]
    if target not in ("common", "proto") and room not in K8S_ROOM_OUTSIDE:
        return [f"{where}: the {room} room of src/k8s includes \"{inc}\"; only "
                f"{', '.join(sorted(K8S_ROOM_OUTSIDE))} may use {target}"]
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    src = os.path.join(root, "src")
    errors = []
    checked = 0
    for dirpath, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith(SOURCE_EXT):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            rel = rel.replace(os.sep, "/")
            errors.extend(check_file(root, rel, component_of_path(rel)))
            checked += 1
    errors.extend(check_cycles(root))
    client_errors, client_files = check_clients(root)
    errors.extend(client_errors)
    checked += client_files
    for e in errors:
        print(e)
    if errors:
        print(f"layering: {len(errors)} violation(s) in {checked} files", file=sys.stderr)
        return 1
    print(f"layering: ok ({checked} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
