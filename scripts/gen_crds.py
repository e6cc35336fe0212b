#!/usr/bin/env python3
"""Generates charts/sbx/crds/*.yaml: the CRDs of charts/crds-src/ with every node that
says `x-sbx-openapi: <definition>` replaced by that Kubernetes API definition as a
structural schema, inlined (CRDs cannot use $ref), from Kubernetes' own OpenAPI v2
definitions.

    scripts/gen_crds.py                    # write charts/sbx/crds/ from the vendored subset
    scripts/gen_crds.py --check            # exit 1 when charts/sbx/crds/ differs (ctest)
    scripts/gen_crds.py --extract SWAGGER [--source WHERE]
                                           # refresh third_party/kubernetes-openapi/ from a
                                           # full swagger.json, then generate

The vendored subset (third_party/kubernetes-openapi/definitions.json) holds only the
definitions the CRDs reach, without descriptions; its header names where it came from.
Nothing here is typed by hand but the few facts the OpenAPI v2 document leaves out and
the API server needs (DEFAULTS below).
"""
import argparse
import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "charts", "crds-src")
OUT = os.path.join(ROOT, "charts", "sbx", "crds")
VENDORED = os.path.join(ROOT, "third_party", "kubernetes-openapi", "definitions.json")
MARKER = "x-sbx-openapi"

# Definitions that become a fixed structural schema instead of their own.
SPECIAL = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
        {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True},
    "io.k8s.apimachinery.pkg.api.resource.Quantity":
        {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
         "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"},
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": {"type": "string", "format": "date-time"},
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": {"type": "string", "format": "date-time"},
}

# Defaults the Go types declare (+default) that the OpenAPI v2 document does not carry.
# The API server requires each key of an x-kubernetes-list-map-keys list to be required
# or defaulted, so these must be here for the CRDs to be accepted.
DEFAULTS = {
    ("io.k8s.api.core.v1.ContainerPort", "protocol"): "TCP",
    ("io.k8s.api.core.v1.LocalObjectReference", "name"): "",
}

# Keywords of a schema kept in a CRD; the rest (descriptions, patch strategies, group
# version kinds) are dropped.
KEPT = {"type", "format", "items", "properties", "required", "enum", "additionalProperties",
        "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
        "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}


def ref_name(ref):
    return ref.rsplit("/", 1)[-1]


def closure(definitions, roots):
    """The names of `roots` and every definition they reach."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in SPECIAL:
            continue
        if name not in definitions:
            sys.exit("gen_crds: definition %s not found" % name)
        seen.add(name)
        stack = [definitions[name]]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                if "$ref" in x:
                    todo.append(ref_name(x["$ref"]))
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
    return seen


def stripped(schema):
    """`schema` without descriptions (the vendored subset keeps structure only)."""
    if isinstance(schema, dict):
        return {k: stripped(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [stripped(v) for v in schema]
    return schema


def structural(schema, definitions, owner=None, path=()):
    """`schema` with every $ref inlined and only the CRD keywords kept."""
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        if name in path:
            sys.exit("gen_crds: %s refers to itself; cannot inline" % name)
        if name in SPECIAL:
            return dict(SPECIAL[name])
        return structural(definitions[name], definitions, name, path + (name,))
    out = {}
    for key, value in schema.items():
        if key not in KEPT:
            continue
        if key == "properties":
            props = {}
            for prop, sub in value.items():
                props[prop] = structural(sub, definitions, None, path)
                if (owner, prop) in DEFAULTS:
                    props[prop]["default"] = DEFAULTS[(owner, prop)]
            out[key] = props
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = structural(value, definitions, None, path)
        else:
            out[key] = value
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def markers(node, found):
    if isinstance(node, dict):
        if MARKER in node:
            found.add(node[MARKER])
        for v in node.values():
            markers(v, found)
    elif isinstance(node, list):
        for v in node:
            markers(v, found)


def expand(node, definitions):
    if isinstance(node, dict):
        if MARKER in node:
            schema = structural({"$ref": "#/definitions/" + node[MARKER]}, definitions)
            # What the source says beside the marker (a description) is kept.
            for key, value in node.items():
                if key != MARKER:
                    schema[key] = value
            return schema
        return {k: expand(v, definitions) for k, v in node.items()}
    if isinstance(node, list):
        return [expand(v, definitions) for v in node]
    return node


def sources():
    return sorted(f for f in os.listdir(SRC) if f.endswith(".yaml"))


def header_of(path):
    lines = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line)
    return "".join(lines)


def generate():
    """{file name: generated text}."""
    with open(VENDORED) as f:
        definitions = json.load(f)["definitions"]
    out = {}
    for name in sources():
        path = os.path.join(SRC, name)
        with open(path) as f:
            crd = yaml.safe_load(f)
        text = yaml.safe_dump(expand(crd, definitions), sort_keys=False, width=100)
        out[name] = (header_of(path) +
                     "# GENERATED by scripts/gen_crds.py from charts/crds-src/%s and\n"
                     "# third_party/kubernetes-openapi/definitions.json: edit those, then run it.\n"
                     % name + text)
    return out


def extract(swagger_path, source):
    with open(swagger_path) as f:
        swagger = json.load(f)
    wanted = set()
    for name in sources():
        with open(os.path.join(SRC, name)) as f:
            markers(yaml.safe_load(f), wanted)
    definitions = swagger["definitions"]
    names = closure(definitions, sorted(wanted))
    subset = {
        "source": "Kubernetes OpenAPI v2 definitions (Apache-2.0), from %s; descriptions "
                  "removed, only the definitions the CRDs reach" % (source or swagger_path),
        "definitions": {n: stripped(definitions[n]) for n in sorted(names)},
    }
    os.makedirs(os.path.dirname(VENDORED), exist_ok=True)
    with open(VENDORED, "w") as f:
        json.dump(subset, f, indent=1, sort_keys=True)
        f.write("\n")
    print("gen_crds: %d definitions -> %s" % (len(names), os.path.relpath(VENDORED, ROOT)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare charts/sbx/crds/ with what would be generated")
    ap.add_argument("--extract", metavar="SWAGGER",
                    help="refresh the vendored definitions from a full swagger.json first")
    ap.add_argument("--source", help="with --extract: where SWAGGER came from, recorded")
    args = ap.parse_args()
    if args.extract:
        extract(args.extract, args.source)
    generated = generate()
    if args.check:
        stale = []
        for name, text in generated.items():
            path = os.path.join(OUT, name)
            if not os.path.exists(path) or open(path).read() != text:
                stale.append(name)
        extra = sorted(set(f for f in os.listdir(OUT) if f.endswith(".yaml")) - set(generated))
        if stale or extra:
            print("gen_crds: charts/sbx/crds/ is not what charts/crds-src/ generates: %s; "
                  "run scripts/gen_crds.py" % ", ".join(stale + extra))
            return 1
        print("gen_crds: %d CRDs up to date" % len(generated))
        return 0
    for name, text in generated.items():
        with open(os.path.join(OUT, name), "w") as f:
            f.write(text)
        print("gen_crds: wrote charts/sbx/crds/%s (%d bytes)" % (name, len(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
