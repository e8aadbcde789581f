"""Turn a CR's ``spec`` into a validated model, or into errors that name the offending field.

Two layers: ``parse_spec`` (the pydantic models: what the CRD schema already enforces on the
apiserver, re-checked because a CRD may be stale or edited) and ``semantic_errors`` (cross-field
rules the apiserver cannot express without CEL: draft equals target, maxGamma out of the range a
worker supports, arms outside 0..maxGamma, ...). Either kind of error makes the reconcile set
``Ready=False, reason=InvalidSpec`` and leave the running children alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from nightjar_operator.crd.models import NightjarDeploymentSpec

# vLLM sizes the draft proposer for K at start-up; beyond this the verification batch cost grows
# with no realistic acceptance gain, and the worker refuses it.
MAX_SUPPORTED_GAMMA = 16
MAX_NAME_LENGTH = 56  # leaves room for "-config" and still fits a 63-character Service name
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Flags the operator sets itself; letting vllmArgs repeat them would make the pod ambiguous.
RESERVED_ARGS = ("--model", "--draft", "--port", "--host", "--config", "--speculative-config")
# hf://Org/Model, what the worker hands vLLM as a Hub repo id.
HF_URI = re.compile(r"^hf://[A-Za-z0-9][\w.-]*/[\w.-]+/?$")
WORKER_OFFLOAD_DEFAULTS = {"kv_usage_high": 0.90, "kv_usage_low": 0.70}


@dataclass(frozen=True)
class FieldError:
    field: str  # dotted path as in the CR, e.g. spec.speculation.arms[2]
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _loc_to_path(prefix: str, loc: tuple[Any, ...]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part:
            path += f".{part}"
    return path


def parse_spec(raw: Mapping[str, Any] | None) -> tuple[NightjarDeploymentSpec | None, list[FieldError]]:
    """Validate the wire spec; on failure every error carries its ``spec.``-rooted field path."""
    try:
        return NightjarDeploymentSpec.model_validate(dict(raw or {})), []
    except ValidationError as e:
        errors = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            msg = msg.removeprefix("Value error, ")
            errors.append(FieldError(_loc_to_path("spec", loc), msg))
        return None, errors


def semantic_errors(spec: NightjarDeploymentSpec, name: str = "") -> list[FieldError]:
    """Cross-field rules; an empty list means the spec can be deployed."""
    errs: list[FieldError] = []
    if name and (len(name) > MAX_NAME_LENGTH or not DNS1035_LABEL.match(name)):
        errs.append(
            FieldError(
                "metadata.name",
                f"{name!r} must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (it names a Service)",
            )
        )

    t, d = spec.target, spec.draft
    if d.source.location() == t.source.location():
        errs.append(FieldError("spec.draft.source", "the draft model must differ from the target model (same files)"))
    elif d.name == t.name and d.revision == t.revision:
        errs.append(FieldError("spec.draft.name", f"the draft model must differ from the target model ({t.name!r})"))

    for role, m in (("target", t), ("draft", d)):
        uri = m.source.uri
        if uri is not None and not HF_URI.match(uri):
            scheme = uri.split("://", 1)[0]
            why = (f"scheme {scheme}:// is not supported" if scheme != "hf" else "expected hf://Org/Model")
            errs.append(FieldError(f"spec.{role}.source.uri", f"{why} (got {uri!r}); use hf://Org/Model for a "
                                   "Hugging Face Hub repo, or an image, pvc or imagePath source"))
    if spec.model_cache.claim_name and spec.model_cache.claim_name in {
            m.source.pvc.claim_name for m in (t, d) if m.source.pvc is not None}:
        errs.append(FieldError("spec.modelCache.claimName", "must not be a model's PVC (models are mounted read-only)"))

    sp = spec.speculation
    k = sp.max_gamma
    if sp.policy == "nosd":
        pass  # speculation off: K is irrelevant
    elif not 1 <= k <= MAX_SUPPORTED_GAMMA:
        errs.append(
            FieldError(
                "spec.speculation.maxGamma",
                f"must lie in 1..{MAX_SUPPORTED_GAMMA} for policy {sp.policy!r} (got {k}); "
                "use policy nosd to turn speculation off",
            )
        )
    seen: set[int] = set()
    for i, arm in enumerate(sp.arms or []):
        if arm > k:
            errs.append(FieldError(f"spec.speculation.arms[{i}]", f"unknown arm {arm}: arms must lie in 0..maxGamma={k}"))
        elif arm in seen:
            errs.append(FieldError(f"spec.speculation.arms[{i}]", f"duplicate arm {arm}"))
        seen.add(arm)
    if sp.static_gamma is not None:
        if sp.static_gamma > k:
            errs.append(FieldError("spec.speculation.staticGamma", f"must lie in 0..maxGamma={k} (got {sp.static_gamma})"))
        elif sp.arms is not None and sp.static_gamma not in sp.arms:
            errs.append(FieldError("spec.speculation.staticGamma", f"{sp.static_gamma} is not one of arms {sp.arms}"))
    if sp.ngram:
        # Reserved in the API; the worker has no n-gram arm yet, and silently ignoring it would lie.
        errs.append(FieldError("spec.speculation.ngram", "the n-gram arm is not supported by this worker version; set false"))
    high = sp.offload.kv_usage_high if sp.offload.kv_usage_high is not None else WORKER_OFFLOAD_DEFAULTS["kv_usage_high"]
    low = sp.offload.kv_usage_low if sp.offload.kv_usage_low is not None else WORKER_OFFLOAD_DEFAULTS["kv_usage_low"]
    if low >= high:
        field = "kvUsageLow" if sp.offload.kv_usage_low is not None else "kvUsageHigh"
        errs.append(
            FieldError(f"spec.speculation.offload.{field}", f"kvUsageLow ({low}) must be below kvUsageHigh ({high})")
        )

    steps = spec.rollout.steps
    for i in range(1, len(steps)):
        if steps[i] <= steps[i - 1]:
            errs.append(FieldError(f"spec.rollout.steps[{i}]", f"steps must be strictly ascending ({steps[i - 1]} then {steps[i]})"))

    for i, arg in enumerate(spec.vllm_args):
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag in RESERVED_ARGS:
            errs.append(FieldError(f"spec.vllmArgs[{i}]", f"{flag} is set by the operator and cannot be overridden"))

    if not errs:
        errs.extend(planner_config_errors(spec))
    return errs


# Planner-config field -> CR field, to name the CR field when the worker's model rejects a value.
_PLANNER_FIELDS = {
    "policy": "spec.speculation.policy",
    "max_gamma": "spec.speculation.maxGamma",
    "arms": "spec.speculation.arms",
    "static_gamma": "spec.speculation.staticGamma",
    "switch_cost_s": "spec.speculation.switchingCostMs",
    "slo_tpot_s": "spec.slo.tpotP95Ms",
}


def planner_config_errors(spec: NightjarDeploymentSpec) -> list[FieldError]:
    """Run the worker's own config models over what the ConfigMap will carry (when installed)."""
    from nightjar_operator.reconcile.config import runtime_config_dict, worker_models

    models = worker_models()
    if models is None:
        return []
    try:
        models.WorkerRuntimeConfig.model_validate(runtime_config_dict(spec))
    except ValidationError as e:
        out = []
        for err in e.errors():
            loc = [str(p) for p in err["loc"]]
            field = next((_PLANNER_FIELDS[p] for p in loc if p in _PLANNER_FIELDS), "spec.speculation")
            if loc and loc[0] == "slo":
                field = "spec.slo"
            out.append(FieldError(field, err["msg"].removeprefix("Value error, ")))
        return out
    return []
