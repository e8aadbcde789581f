"""The CRD is generated from the pydantic models, is structural, and the checked-in YAML matches."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from nightjar_operator.crd import schema as s
from nightjar_operator.crd.models import NightjarDeploymentSpec
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]


def _walk(node, path="<root>"):
    yield path, node
    for k, v in (node.get("properties") or {}).items():
        yield from _walk(v, f"{path}.{k}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_checked_in_crd_matches_models():
    checked_in = (ROOT / s.CRD_FILE).read_text()
    assert checked_in == s.crd_yaml(), "CRD out of date: run `make crds`"


def test_crd_names_scope_and_subresources():
    crd = s.crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "nightjardeployments.nightjar.dev"
    assert spec["group"] == "nightjar.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["njd"] and spec["names"]["kind"] == "NightjarDeployment"
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    shown = [col["name"] for col in version["additionalPrinterColumns"] if not col.get("priority")]
    assert shown == ["Ready", "Replicas", "Target", "Draft", "Stable", "Candidate", "Age"]


def test_schema_is_structural():
    root = s.open_api_schema()
    for path, node in _walk(root):
        assert "$ref" not in node and "title" not in node, path
        assert "x-kubernetes-validations" not in node, f"{path}: no CEL on Kubernetes 1.20"
        assert node.get("default", None) != "", f"{path}: 1.20 rejects empty-string defaults"
        if "properties" in node:
            assert node["type"] == "object" and "additionalProperties" not in node, path
        typed = "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert typed, f"{path} has no type"
        for branch in node.get("oneOf", []):
            assert set(branch) == {"required"}, path
    # preserve-unknown-fields only where the rollout loop owns the shape, and for core/v1 objects in
    # the pod overrides (the apiserver checks them when the operator applies the Deployment).
    preserved = [p for p, n in _walk(root) if n.get("x-kubernetes-preserve-unknown-fields")]
    status = ["<root>.status.stable", "<root>.status.candidate", "<root>.status.fleet", "<root>.status.rollout"]
    assert [p for p in preserved if p.startswith("<root>.status")] == status
    assert sorted(p for p in preserved if not p.startswith("<root>.status")) == sorted(
        [f"<root>.spec.pod.{f}" for f in ("affinity", "topologySpreadConstraints[]", "volumes[]", "env[].valueFrom",
                                          "envFrom[].configMapRef", "envFrom[].secretRef")]
        + [f"<root>.spec.networkPolicy.from[].{f}" for f in ("namespaceSelector", "podSelector", "ipBlock")])


def test_schema_carries_validations():
    spec = s.open_api_schema()["properties"]["spec"]
    props = spec["properties"]
    assert spec["required"] == ["target", "draft", "image"]  # no default worker image (CPU and CUDA differ)
    spec_props = props["speculation"]["properties"]
    assert spec_props["maxGamma"]["minimum"] == 0 and spec_props["maxGamma"]["maximum"] == 64
    assert spec_props["arms"]["items"] == {"type": "integer", "maximum": 64, "minimum": 0}
    assert props["slo"]["properties"]["ttftP95Ms"]["type"] == "integer"
    assert props["slo"]["properties"]["attainment"] == {
        "description": props["slo"]["properties"]["attainment"]["description"],
        "type": "number", "default": 0.99, "maximum": 1, "minimum": 0,
    }  # fmt: skip
    assert props["target"]["properties"]["source"]["oneOf"] == [
        {"required": ["pvc"]}, {"required": ["uri"]}, {"required": ["image"]}, {"required": ["imagePath"]},
    ]  # fmt: skip
    assert set(props["speculation"]["properties"]["offload"]["properties"]["policy"]["enum"]) == {"Auto", "Never"}
    cpu = props["resources"]["properties"]["requests"]["properties"]["cpu"]
    assert cpu["x-kubernetes-int-or-string"] and cpu["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert props["replicas"]["default"] == 1
    status = s.open_api_schema()["properties"]["status"]["properties"]
    cond = status["conditions"]
    assert cond["x-kubernetes-list-type"] == "map" and cond["x-kubernetes-list-map-keys"] == ["type"]
    assert set(cond["items"]["required"]) == {"type", "status", "reason", "lastTransitionTime"}


def test_schema_defaults_validate_against_models():
    """Apiserver defaulting of an empty object must yield what pydantic would default to."""
    spec = NightjarDeploymentSpec.model_validate(
        {"target": {"name": "t", "source": {"uri": "hf://a/b"}}, "draft": {"name": "d", "source": {"uri": "hf://a/c"}},
         "image": "example.org/nightjar-worker:1"}
    )
    props = s.open_api_schema()["properties"]["spec"]["properties"]
    assert props["replicas"]["default"] == spec.replicas
    assert props["speculation"]["properties"]["maxGamma"]["default"] == spec.speculation.max_gamma
    assert props["rollout"]["properties"]["steps"]["default"] == spec.rollout.steps
    assert "default" not in props["image"]  # required: no worker image that was never built


def test_unsupported_constructs_are_refused():
    class Bad(BaseModel):
        x: int | str  # a real union cannot be expressed structurally

    with pytest.raises(s.SchemaError, match="unions are not structural"):
        s.model_schema(Bad)

    class Loose(BaseModel):
        y: dict  # an object without properties

    with pytest.raises(s.SchemaError, match="object without properties"):
        s.model_schema(Loose)


def test_sample_validates():
    doc = yaml.safe_load((ROOT / "manifests/samples/cpu-demo.yaml").read_text())
    assert doc["apiVersion"] == "nightjar.dev/v1alpha1" and doc["kind"] == "NightjarDeployment"
    NightjarDeploymentSpec.model_validate(doc["spec"])


def test_maps_translate_to_additional_properties():
    class WithMap(BaseModel):
        labels: dict[str, str]

    out = s.model_schema(WithMap)
    assert out["properties"]["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}


def test_cli_prints_the_crd(tmp_path, capsys):
    from nightjar_operator.cli import main

    assert main(["crd"]) == 0
    assert capsys.readouterr().out == s.crd_yaml()
    out = tmp_path / "crd.yaml"
    assert main(["crd", "-o", str(out)]) == 0
    assert out.read_text() == s.crd_yaml()


def test_operator_metrics_are_prefixed_and_unit_named():
    from nightjar_operator.metrics import metrics
    from prometheus_client import REGISTRY

    metrics()
    names = {m.name for m in REGISTRY.collect() if m.name.startswith("nightjar_operator_")}
    assert {"nightjar_operator_reconciles", "nightjar_operator_reconcile_errors",
            "nightjar_operator_reconcile_duration_seconds", "nightjar_operator_child_writes"} <= names  # fmt: skip
