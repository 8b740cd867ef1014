"""Validate a Kubernetes document against a published CRD the way the API server would.

The CRD's ``openAPIV3Schema`` is a JSON schema (OpenAPI 3.0's subset, JSON Schema draft 4
keywords); on top of it the API server (1) treats fields the schema does not name as errors
(kubectl's default ``--validate=strict``; without it they are silently dropped, which is worse:
the setting would vanish), so every object schema with ``properties`` gets
``additionalProperties: false`` unless it says ``x-kubernetes-preserve-unknown-fields``; and (2)
evaluates the CEL rules in ``x-kubernetes-validations``.  This helper evaluates the rules whose
text it knows (:data:`_RULES` and the name rules, read from the rule text itself) and reports any
other rule on a part of the document that is present, so a rule is never skipped in silence.
Transition rules (``oldSelf``) apply to updates only and are skipped.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable

import jsonschema
import yaml

DATA = Path(__file__).parent / "data" / "kubeflow-trainer-v2.3.0"
TRAINJOB_CRD = DATA / "trainer.kubeflow.org_trainjobs.yaml"
TRAININGRUNTIME_CRD = DATA / "trainer.kubeflow.org_trainingruntimes.yaml"

# CEL rules (exact text in the v2.3.0 CRDs) on parts trnqwen writes, as Python.
_RULES: dict[str, Callable[[Any], bool]] = {
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1":
        lambda s: sum(k in s for k in ("torch", "mpi", "jax", "xgboost", "flux")) <= 1,
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))":
        lambda s: not ((s.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
                       and any("dependsOn" in x for x in s.get("replicatedJobs", []))),
    "self >= 1": lambda s: s >= 1,
    "!self.exists(c, c == 'node')": lambda s: "node" not in s,
}
_MATCHES = re.compile(r"^self\.metadata\.name\.matches\('(.+)'\)$")
_SIZE = re.compile(r"^size\(self\.metadata\.name\) <= (\d+)$")


@functools.lru_cache(maxsize=None)
def crd(path: Path) -> dict[str, Any]:
    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def crd_schema(path: Path, version: str = "v1alpha1") -> dict[str, Any]:
    for v in crd(path)["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{path.name} has no version {version}")


def strict(schema: Any) -> Any:
    """A copy where objects that list their properties refuse others (what strict validation does)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def _validator(path: Path) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(strict(crd_schema(path)))


def _rule_errors(schema: dict[str, Any], node: Any, where: str) -> list[str]:
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        text = rule["rule"]
        if "oldSelf" in text:
            continue
        if (m := _MATCHES.match(text)) is not None:
            ok = re.search(m.group(1), node["metadata"]["name"]) is not None
        elif (m := _SIZE.match(text)) is not None:
            ok = len(node["metadata"]["name"]) <= int(m.group(1))
        elif text in _RULES:
            ok = _RULES[text](node)
        else:
            errors.append(f"{where or '/'}: CEL rule not evaluated by tests/k8s_schema.py: {text}")
            continue
        if not ok:
            errors.append(f"{where or '/'}: {rule.get('message') or text}")
    props = schema.get("properties") or {}
    if isinstance(node, dict):
        for key, value in node.items():
            if key in props:
                errors += _rule_errors(props[key], value, f"{where}/{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += _rule_errors(schema["additionalProperties"], value, f"{where}/{key}")
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(node):
            errors += _rule_errors(schema["items"], value, f"{where}/{i}")
    return errors


def errors(doc: dict[str, Any], path: Path) -> list[str]:
    """Every problem the API server would report for ``doc`` (empty: it would be accepted)."""
    group_kind = crd(path)["spec"]
    found = []
    want_api = f"{group_kind['group']}/v1alpha1"
    if doc.get("apiVersion") != want_api or doc.get("kind") != group_kind["names"]["kind"]:
        found.append(f"/: {doc.get('apiVersion')}/{doc.get('kind')} is not {want_api}/{group_kind['names']['kind']}")
    for e in _validator(path).iter_errors(doc):
        found.append("/" + "/".join(str(p) for p in e.absolute_path) + f": {e.message}")
    found += _rule_errors(crd_schema(path), doc, "")
    return found
