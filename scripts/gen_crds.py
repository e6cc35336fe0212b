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

Each CRD also serves the deprecated v1alpha1, derived here from its v1beta1 by the
differences upstream agent-sandbox's v1alpha1 types have (ALPHA below), and converts
between them through sbx-server's conversion webhook (CONVERSION; sbx-server writes the
webhook's Service and caBundle into the installed CRDs at start, src/k8s/crd_conversion.h).
"""
import argparse
import copy
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


# spec.conversion as installed: sbx-server (--conversion_webhook_service) rewrites the
# Service and adds the caBundle.
CONVERSION = {
    "strategy": "Webhook",
    "webhook": {
        "conversionReviewVersions": ["v1"],
        "clientConfig": {"service": {"namespace": "sbx-system", "name": "sbx-webhook",
                                     "path": "/convert", "port": 443}},
    },
}

SCALE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
         "labelSelectorPath": ".status.selector"}
INT32 = {"type": "integer", "format": "int32"}


def alpha_sandbox(version, spec, status):
    del spec["properties"]["operatingMode"]
    spec["properties"]["replicas"] = dict(INT32, minimum=0, maximum=1, default=1,
                                          description="1: running, 0: suspended (pod deleted, "
                                                      "volumes kept).")
    del status["properties"]["nodeName"]
    status["properties"]["replicas"] = dict(INT32, description="1 while running, else 0.")
    version["subresources"] = {"status": {}, "scale": dict(SCALE)}
    version.pop("additionalPrinterColumns", None)
    spec.pop("x-kubernetes-validations", None)  # upstream's v1alpha1 has no CEL rule


def alpha_claim(version, spec, status):
    props = spec["properties"]
    del props["warmPoolRef"]
    del props["volumeClaimTemplates"]
    props["sandboxTemplateRef"] = {
        "description": "The SandboxTemplate (same namespace) to make the Sandbox from.",
        "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
    props["warmpool"] = {
        "description": '"none", "default" or the name of a SandboxWarmPool to take from.',
        "type": "string", "default": "default"}
    spec["required"] = ["sandboxTemplateRef"]
    version.pop("additionalPrinterColumns", None)


def alpha_template(version, spec, status):
    del spec["properties"]["volumeClaimTemplatesPolicy"]


def alpha_warm_pool(version, spec, status):
    spec["properties"]["replicas"].pop("default", None)
    spec["required"] = ["replicas"] + spec.get("required", [])
    del status["properties"]["observedGeneration"]


# v1alpha1 of each kind, as upstream's v1alpha1 Go types differ from v1beta1 (and what
# src/k8s/conversion.cc converts).
ALPHA = {"Sandbox": alpha_sandbox, "SandboxClaim": alpha_claim,
         "SandboxTemplate": alpha_template, "SandboxWarmPool": alpha_warm_pool}


def with_alpha(crd):
    """`crd` (v1beta1 only) serving v1alpha1 too, deprecated, converted by the webhook."""
    beta = crd["spec"]["versions"][0]
    assert beta["name"] == "v1beta1" and len(crd["spec"]["versions"]) == 1
    alpha = copy.deepcopy(beta)
    alpha["name"] = "v1alpha1"
    alpha["storage"] = False
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    alpha["deprecated"] = True
    alpha["deprecationWarning"] = ("%s/v1alpha1 %s is deprecated; use %s/v1beta1 %s instead"
                                   % (group, kind, group, kind))
    root = alpha["schema"]["openAPIV3Schema"]["properties"]
    ALPHA[kind](alpha, root["spec"], root.get("status", {"properties": {}}))
    crd["spec"]["versions"].append(alpha)
    crd["spec"]["conversion"] = copy.deepcopy(CONVERSION)
    return crd


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
        text = yaml.safe_dump(with_alpha(expand(crd, definitions)), sort_keys=False, width=100)
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
