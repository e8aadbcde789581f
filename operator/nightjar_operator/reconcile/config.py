"""The worker's runtime config (ConfigMap key ``nightjar.yaml``) built from a spec.

The file is a ``nightjar_contract.runtime.WorkerRuntimeConfig``: the contract package the worker
reads it with (pure pydantic: the operator never imports the worker, torch or vLLM).

Only what the spec sets is written, so the worker's own defaults stay in force. ``priors`` belong
to the fleet loop (it pushes aggregated priors into this ConfigMap): a reconcile carries the live
``priors`` over instead of reverting them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml
from nightjar_contract.runtime import RESTART_FIELDS, WorkerRuntimeConfig

from nightjar_operator.crd.models import NightjarDeploymentSpec


def planner_dict(spec: NightjarDeploymentSpec) -> dict[str, Any]:
    sp = spec.speculation
    out: dict[str, Any] = {"policy": sp.policy, "max_gamma": sp.max_gamma}
    if sp.arms is not None:
        out["arms"] = sorted(sp.arms)
    if sp.static_gamma is not None:
        out["static_gamma"] = sp.static_gamma
    hosted = sorted(g for g in (sp.arms or range(sp.max_gamma + 1)) if g > 0)  # a host source's gammas
    if sp.ngram:
        out["ngram_arms"] = hosted
    if sp.suffix.enabled:
        out["suffix_arms"] = list(hosted)
    if sp.switching_cost_ms is not None:
        out["switch_cost_s"] = sp.switching_cost_ms / 1000.0
    return out


def suffix_dict(spec: NightjarDeploymentSpec) -> dict[str, Any]:
    """The worker's ``suffix`` block: the tree settings the spec sets (the worker's defaults for the rest)."""
    sx = spec.speculation.suffix
    fields = {"cache_requests": sx.cache_requests, "tree_depth": sx.tree_depth, "spec_factor": sx.spec_factor,
              "min_token_prob": sx.min_token_prob}
    return {k: v for k, v in fields.items() if v is not None}


def runtime_config_dict(spec: NightjarDeploymentSpec, priors: Any = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"planner": planner_dict(spec)}
    if priors is not None:
        cfg["priors"] = priors
    slo: dict[str, Any] = {}
    if spec.slo.ttft_p95_ms is not None:
        slo["ttft_p95_ms"] = spec.slo.ttft_p95_ms
    if spec.slo.tpot_p95_ms is not None:
        slo["tpot_p95_ms"] = spec.slo.tpot_p95_ms
    if slo:
        slo["attainment"] = spec.slo.attainment  # the planner's goodput objective is for this share
        cfg["slo"] = slo
    if sx := suffix_dict(spec):
        cfg["suffix"] = sx
    return cfg


def render_runtime_config(spec: NightjarDeploymentSpec, priors: Any = None) -> str:
    """YAML text of the worker config, validated by the worker's model."""
    cfg = runtime_config_dict(spec, priors)
    # Raises ValidationError naming the field (the reconcile checks this earlier as InvalidSpec).
    WorkerRuntimeConfig.model_validate(cfg)
    return yaml.safe_dump(cfg, sort_keys=False)


def live_priors(config_text: str | None) -> Any:
    """The ``priors`` section of a live ``nightjar.yaml`` (None when absent or unreadable)."""
    if not config_text:
        return None
    try:
        doc = yaml.safe_load(config_text)
    except yaml.YAMLError:
        return None
    return doc.get("priors") if isinstance(doc, dict) else None


def engine_hash(spec: NightjarDeploymentSpec) -> str:
    """Hash of the planner fields a running worker cannot take (pod-template annotation): a change
    rolls the pods; the rest, the policy included, reloads live through the ConfigMap. The suffix trees'
    settings are read at start-up too."""
    p = planner_dict(spec)
    sub: dict[str, Any] = {k: p.get(k) for k in RESTART_FIELDS}
    if sx := suffix_dict(spec):  # the trees are built at start-up (only when set: other hashes unchanged)
        sub["suffix"] = sx
    return hashlib.sha256(json.dumps(sub, sort_keys=True).encode()).hexdigest()[:16]
