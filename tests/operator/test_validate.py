"""Spec validation: schema-level (pydantic) and semantic errors both name the offending field."""

from __future__ import annotations

import pytest
from nightjar_operator.reconcile.validate import MAX_SUPPORTED_GAMMA, parse_spec, semantic_errors


def _errors(raw, name="demo"):
    spec, errs = parse_spec(raw)
    if spec is None:
        return [str(e) for e in errs]
    return [str(e) for e in semantic_errors(spec, name)]


def test_valid_spec_has_no_errors(raw_spec):
    assert _errors(raw_spec) == []


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s["target"]["source"].update(uri="hf://a/b"), "spec.target.source"),  # two sources
        (lambda s: s["draft"].update(source={}), "spec.draft.source"),  # none
        (lambda s: s.update(speculation={"maxGamma": 65}), "spec.speculation.maxGamma"),
        (lambda s: s.update(slo={"tpotP95Ms": 0}), "spec.slo.tpotP95Ms"),
        (lambda s: s.update(slo={"attainment": 1.5}), "spec.slo.attainment"),
        (lambda s: s.update(replicas=-1), "spec.replicas"),
        (lambda s: s.update(resources={"requests": {"cpu": "two"}}), "spec.resources.requests.cpu"),
        (lambda s: s.update(speculation={"offload": {"policy": "Sometimes"}}), "spec.speculation.offload.policy"),
        (lambda s: s.update(bogus=1), "spec.bogus"),
        (lambda s: s.update(modelCache={"sizeLimit": "40Gi", "claimName": "c"}), "spec.modelCache"),
        (lambda s: s.update(modelCache={"sizeLimit": "lots"}), "spec.modelCache.sizeLimit"),
        (lambda s: s.update(hub={"tokenSecretRef": {"name": "Bad_Name"}}), "spec.hub.tokenSecretRef.name"),
        (lambda s: s.update(hub={"endpoint": "ftp://mirror"}), "spec.hub.endpoint"),
    ],
)
def test_schema_level_errors_name_the_field(raw_spec, mutate, field):
    mutate(raw_spec)
    errs = _errors(raw_spec)
    assert errs and any(e.startswith(field + ":") for e in errs), errs


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda s: s["draft"].update(source=s["target"]["source"]), "spec.draft.source", "must differ"),
        (lambda s: s["draft"].update(name=s["target"]["name"], source={"uri": "hf://x/y"}), "spec.draft.name", "must differ"),
        (lambda s: s.update(speculation={"maxGamma": 0}), "spec.speculation.maxGamma", "1..16"),
        (lambda s: s.update(speculation={"maxGamma": MAX_SUPPORTED_GAMMA + 1}), "spec.speculation.maxGamma", "1..16"),
        (lambda s: s.update(speculation={"maxGamma": 4, "arms": [0, 2, 7]}), "spec.speculation.arms[2]", "unknown arm 7"),
        (lambda s: s.update(speculation={"arms": [1, 1]}), "spec.speculation.arms[1]", "duplicate arm 1"),
        (lambda s: s.update(speculation={"policy": "static", "staticGamma": 9}), "spec.speculation.staticGamma", "0..maxGamma"),
        (lambda s: s.update(speculation={"offload": {"kvUsageLow": 0.95}}), "spec.speculation.offload.kvUsageLow", "below"),
        (lambda s: s.update(rollout={"steps": [50, 10, 100]}), "spec.rollout.steps[1]", "ascending"),
        (lambda s: s.update(vllmArgs=["--model=/x"]), "spec.vllmArgs[0]", "set by the operator"),
        (lambda s: s["target"].update(source={"uri": "s3://bucket/m"}), "spec.target.source.uri", "s3:// is not supported"),
        (lambda s: s["draft"].update(source={"uri": "hf://only-a-name"}), "spec.draft.source.uri", "expected hf://Org/Model"),
        (lambda s: s.update(modelCache={"claimName": s["target"]["source"]["pvc"]["claimName"]}),
         "spec.modelCache.claimName", "read-only"),
    ],
)
def test_semantic_errors_name_the_field(raw_spec, mutate, field, words):
    mutate(raw_spec)
    errs = _errors(raw_spec)
    assert any(e.startswith(field + ":") and words in e for e in errs), errs


def test_nosd_ignores_max_gamma(raw_spec):
    raw_spec["speculation"] = {"policy": "nosd", "maxGamma": 0}
    assert _errors(raw_spec) == []


def test_name_must_fit_a_service(raw_spec):
    assert any(e.startswith("metadata.name:") for e in _errors(raw_spec, name="x" * 60))
    assert any(e.startswith("metadata.name:") for e in _errors(raw_spec, name="9lives"))
