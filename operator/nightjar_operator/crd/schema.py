"""Generate the NightjarDeployment CRD from the pydantic models.

pydantic emits JSON Schema 2020-12 with ``$defs``/``$ref``, ``anyOf [X, null]`` for optionals,
titles and ``additionalProperties: false``. The apiserver (apiextensions v1, Kubernetes 1.20) wants a
*structural* OpenAPI v3 schema: every node typed, no ``$ref``, no ``additionalProperties`` next to
``properties``, ``x-kubernetes-int-or-string`` for quantities, ``oneOf``/``anyOf`` only carrying value
validations. ``structural()`` performs that translation and refuses constructs it does not know,
so a model change can never silently produce a schema the apiserver would reject or not enforce.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from nightjar_operator import constants as c
from nightjar_operator.crd.models import NightjarDeploymentSpec, NightjarDeploymentStatus

CRD_FILE = "manifests/crds/nightjar.dev_nightjardeployments.yaml"
HEADER = (
    "# Generated from nightjar_operator/crd/models.py by `make crds` (nightjar-operator crd).\n"
    "# Do not edit by hand: tests/operator/test_crd_schema.py checks this file matches.\n"
)

# Keywords copied through unchanged (OpenAPI v3 value validations and Kubernetes extensions).
_PASSTHROUGH = {
    "type", "format", "description", "enum", "pattern", "minimum", "maximum", "minLength", "maxLength",
    "minItems", "maxItems", "multipleOf", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string", "nullable",
}  # fmt: skip
_DROP = {"title"}


class SchemaError(ValueError):
    """The models use a construct the structural-schema translation does not support."""


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline ``$ref`` (direct or pydantic's ``allOf: [{$ref}]`` wrapper), siblings win."""
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is None and "allOf" in node and len(node["allOf"]) == 1 and "$ref" in node["allOf"][0]:
        ref = node.pop("allOf")[0]["$ref"]
    if ref is None:
        return node
    target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
    target = _resolve(target, defs)
    target.update(node)
    return target


def _strip_null(node: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [X, {type: null}]`` (an Optional) -> X with the outer keywords kept."""
    any_of = node.get("anyOf")
    if not any_of:
        return node
    rest = [s for s in any_of if s != {"type": "null"}]
    node = {k: v for k, v in node.items() if k != "anyOf"}
    if node.get("x-kubernetes-int-or-string"):
        types = {s.get("type") for s in rest}
        if not types <= {"integer", "number", "string"}:
            raise SchemaError(f"int-or-string field with types {types}")
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return node
    if len(rest) != 1:
        raise SchemaError(f"unions are not structural: {rest}")
    merged = dict(rest[0])
    merged.update(node)
    return merged


def structural(node: dict[str, Any], defs: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Translate one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    node = _resolve(_strip_null(_resolve(node, defs)), defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "default":
            # Kubernetes 1.20 validates a "" default as null and rejects the CRD; pydantic still
            # applies such defaults in the operator.
            if value is not None and value != "":
                out["default"] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020 numbers -> OpenAPI v3.0 booleans.
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "properties":
            out["properties"] = {k: structural(v, defs, f"{path}.{k}") for k, v in value.items()}
        elif key == "additionalProperties":
            # ``false`` (extra="forbid") is implied by pruning; a schema means a map (dict[str, X]).
            if isinstance(value, dict):
                out["additionalProperties"] = structural(value, defs, f"{path}{{}}")
        elif key == "items":
            out["items"] = structural(value, defs, f"{path}[]")
        elif key == "required":
            out["required"] = list(value)
        elif key == "oneOf":
            # Only value validations inside (here: which key is required), never types/properties.
            for branch in value:
                if set(branch) - {"required"}:
                    raise SchemaError(f"{path}: oneOf branches may only carry 'required' ({branch})")
            out["oneOf"] = value
        elif key == "anyOf":
            out["anyOf"] = value  # int-or-string only (checked in _strip_null)
        elif key in _PASSTHROUGH:
            out[key] = value
        else:
            raise SchemaError(f"{path or '<root>'}: unsupported JSON-schema keyword {key!r}")
    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    if "properties" in out and "additionalProperties" in out:
        raise SchemaError(f"{path or '<root>'}: properties and additionalProperties are mutually exclusive")
    if "type" not in out and not out.get("x-kubernetes-int-or-string") and not out.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        raise SchemaError(f"{path or '<root>'}: node without a type is not structural ({node})")
    if out.get("type") == "object" and not ({"properties", "additionalProperties"} & set(out)) and not out.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        raise SchemaError(f"{path or '<root>'}: object without properties (use preserve-unknown-fields)")
    return _ordered(out)


_FIRST = ("description", "type", "format")
_LAST = ("properties", "additionalProperties", "required", "items", "oneOf", "anyOf")


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Stable, readable key order in the generated YAML (description/type first, children last)."""
    keys = [k for k in _FIRST if k in node]
    keys += sorted(k for k in node if k not in _FIRST and k not in _LAST)
    keys += [k for k in _LAST if k in node]
    return {k: node[k] for k in keys}


def model_schema(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")  # type: ignore[attr-defined]
    defs = raw.pop("$defs", {})
    return structural(raw, defs)


def open_api_schema() -> dict[str, Any]:
    spec = model_schema(NightjarDeploymentSpec)
    status = model_schema(NightjarDeploymentStatus)
    status["description"] = "Observed state, computed by the operator from the cluster's objects."
    return {
        "type": "object",
        "description": "A pool of Nightjar workers serving one target/draft model pair with load-adaptive speculative decoding.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
    }


PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas", "priority": 1},
    {"name": "Target", "type": "string", "jsonPath": ".spec.target.name"},
    {"name": "Draft", "type": "string", "jsonPath": ".spec.draft.name"},
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason', "priority": 1},
    {"name": "Stable", "type": "string", "jsonPath": ".status.stable.pair"},
    {"name": "Candidate", "type": "string", "jsonPath": ".status.candidate.pair"},
    {"name": "Weight", "type": "integer", "jsonPath": ".status.candidate.weight", "priority": 1},
    {"name": "SLO", "type": "string", "jsonPath": '.status.conditions[?(@.type=="SLOMet")].status', "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": c.CRD_NAME,
            "labels": {"app.kubernetes.io/name": "nightjar", "app.kubernetes.io/part-of": "nightjar"},
        },
        "spec": {
            "group": c.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": c.KIND,
                "listKind": f"{c.KIND}List",
                "plural": c.PLURAL,
                "singular": c.SINGULAR,
                "shortNames": list(c.SHORT_NAMES),
                "categories": ["nightjar"],
            },
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": open_api_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)
