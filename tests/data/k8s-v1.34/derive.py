"""Derive tests/data/k8s-v1.34/deployment-service.schema.json (see the README beside it).

    python derive.py <kubernetes_validate>/kubernetes-json-schema/v1.34.0-local-strict OUT.json
"""
import json
import sys
from pathlib import Path

src, out = Path(sys.argv[1]), Path(sys.argv[2])
defs = json.loads((src / "_definitions.json").read_text())["$defs"]
kinds = {"Deployment": "deployment-apps-v1.json", "Service": "service-v1.json"}


def local(ref: str) -> str:
    return "#/$defs/" + ref.split("#/$defs/")[-1]


def strip(node):
    """The node without descriptions, its references pointing into this one file."""
    if isinstance(node, dict):
        return {k: (local(v) if k == "$ref" else strip(v)) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


needed, todo = set(), []


def refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                name = v.split("#/$defs/")[-1]
                if name not in needed:
                    needed.add(name)
                    todo.append(name)
            else:
                refs(v)
    elif isinstance(node, list):
        for v in node:
            refs(v)


docs = {kind: json.loads((src / f).read_text()) for kind, f in kinds.items()}
for d in docs.values():
    refs(d)
while todo:
    refs(defs[todo.pop()])
for d in docs.values():
    d.pop("$schema", None)
    d.pop("$id", None)
schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$comment": "derived from kubernetes-validate 1.37.0 (v1.34.0-local-strict); see README.md beside this file",
    "$defs": {**{name: strip(defs[name]) for name in sorted(needed)}, **{k: strip(d) for k, d in docs.items()}},
}
out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
print(len(needed), "definitions,", out.stat().st_size, "bytes")
