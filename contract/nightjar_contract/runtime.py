"""The worker's run-time configuration (ConfigMap key ``nightjar.yaml``): model, parsing, field sets.

Written by the operator (and by ``POST /nightjar/v1/config``), watched by the worker
(``nightjar_worker.runtime_config``). Every invalid field raises ``RuntimeConfigError`` naming it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nightjar_contract.planner import PlannerConfig, PlannerPriors

# Fields of PlannerConfig that shape the engine (K, arms, buckets) cannot change on a live engine:
# vLLM sized the draft and its buffers for K at start-up. Changing them needs a restart (the operator
# rolls the pods). Everything else applies live: priors, SLO, exploration knobs, switch cost, and
# even the policy itself (``PolicyHolder`` rebuilds it on the same arms; used by benchmarks).
RESTART_FIELDS = ("max_gamma", "arms", "bucket_edges", "max_batch")
REBUILD_FIELDS = ("policy", "static_gamma", "gamma_table", "seed", "paper_mode", "ngram_arms", "suffix_arms",
                  "static_source")


# The bounds of a latency target, milliseconds (the CRD's spec.slo takes them from here).
TTFT_P95_MS_MAX = 3_600_000
TPOT_P95_MS_MAX = 600_000


class SloTarget(BaseModel):
    """Latency targets (milliseconds, p95). ``tpot_p95_ms`` bounds the planner's arm choice."""

    model_config = ConfigDict(extra="forbid")

    ttft_p95_ms: int | None = Field(None, ge=1, le=TTFT_P95_MS_MAX, description="time to first token, p95, milliseconds")
    tpot_p95_ms: int | None = Field(None, ge=1, le=TPOT_P95_MS_MAX, description="time per output token, p95, milliseconds")
    attainment: float | None = Field(
        None, ge=0, le=1, description="fraction of requests the targets are for (the CRD's spec.slo.attainment); "
        "the planner judges a first token's wait at this quantile (0 or unset: the planner's slo_attainment)",
    )


class SuffixConfig(BaseModel):
    """The suffix-tree source's trees (``nightjar_worker.engine.suffix``). Read when the worker
    builds them, at start-up: a change applies at the worker's next restart."""

    model_config = ConfigDict(extra="forbid")

    cache_requests: int = Field(
        1000, ge=0, le=2**31 - 1,
        description="outputs of finished requests kept in the cross-request suffix tree, evicted oldest "
        "first (0: none, each request drafts from its own tokens only); about 300 bytes per cached output "
        "token at worst (nightjar_suffix_cache_bytes reports the size)",
    )
    tree_depth: int = Field(24, ge=1, le=256, description="longest context matched and longest draft (tokens)")
    spec_factor: float = Field(1.0, ge=0, description="a draft is at most spec_factor x the matched length")
    min_token_prob: float = Field(0.1, ge=0, le=1, description="drafts stop at a token estimated less likely")


class WorkerRuntimeConfig(BaseModel):
    """What the worker's config file (and ``POST /nightjar/v1/config``) carries."""

    model_config = ConfigDict(extra="forbid")

    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    priors: PlannerPriors | None = None
    slo: SloTarget | None = None
    suffix: SuffixConfig = Field(default_factory=SuffixConfig)

    def tpot_target_s(self) -> float | None:
        """The TPOT bound the policy enforces: the SLO's p95 if set, else the planner's own knob."""
        if self.slo is not None and self.slo.tpot_p95_ms is not None:
            return self.slo.tpot_p95_ms / 1000.0
        return self.planner.slo_tpot_s

    def ttft_target_s(self) -> float | None:
        """The TTFT target the policy plans for: the SLO's p95 if set, else the planner's own knob."""
        if self.slo is not None and self.slo.ttft_p95_ms is not None:
            return self.slo.ttft_p95_ms / 1000.0
        return self.planner.slo_ttft_s

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class RuntimeConfigError(ValueError):
    """A config file or body that cannot be applied; the message names the offending field."""


def format_validation_error(err: ValidationError) -> str:
    """One line per error, each starting with the dotted field path (``planner.max_gamma: ...``)."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_runtime_config(data: Any) -> WorkerRuntimeConfig:
    """Validate an already-decoded document (dict). Raises ``RuntimeConfigError`` naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RuntimeConfigError(f"<root>: expected a mapping with keys planner/priors/slo/suffix, got {type(data).__name__}")
    try:
        return WorkerRuntimeConfig.model_validate(data)
    except ValidationError as e:
        raise RuntimeConfigError(format_validation_error(e)) from None


def parse_runtime_config_text(text: str) -> WorkerRuntimeConfig:
    """Parse YAML (a superset of JSON) and validate."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RuntimeConfigError(f"<root>: not valid YAML/JSON: {e}") from None
    return parse_runtime_config(data)
