"""Planner configuration and priors (pydantic v2; importable without torch or vllm).

``PlannerConfig`` selects and parameterises a gamma policy; ``PlannerPriors`` carries per
(bucket, gamma) mean losses and pseudo-counts that can be injected at start and at run time
(the operator pushes fleet-wide priors). Every invalid field raises a ``ValidationError`` whose
message names the field.
"""

from __future__ import annotations

import bisect
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

POLICIES = ("nightjar", "nosd", "static", "table", "dsd", "ucb", "oracle")
DEFAULT_MAX_GAMMA = 4  # K when none is given: the planner, the simulator, the demo and the benchmarks
MAX_GAMMA = 64  # the largest K a configuration may ask for (the CRD's schema bound too)
PolicyName = Literal["nightjar", "nosd", "static", "table", "dsd", "ucb", "oracle"]


def default_bucket_edges(max_batch: int) -> list[int]:
    """Log-spaced lower edges 1,2,3,4,6,8,12,16,24,32,48,64,... below ``max_batch``.

    ``max_batch`` itself is not an edge: a full batch and a batch a few requests short of it
    alternate step by step at saturation and must share a context (and an arm)."""
    edges = [1, 2, 3]
    base = 4
    while True:
        for e in (base, base * 3 // 2):
            if e >= max_batch:
                return [x for x in edges if x < max_batch] or [1]
            edges.append(e)
        base *= 2


def _check_edges(field: str, edges: list[int]) -> list[int]:
    if not edges:
        raise ValueError(f"{field}: must not be empty")
    if edges[0] < 1:
        raise ValueError(f"{field}: edges are batch sizes and must be >= 1 (got {edges[0]})")
    for a, b in zip(edges, edges[1:], strict=False):
        if b <= a:
            raise ValueError(f"{field}: must be strictly ascending without duplicates (got {a} then {b})")
    return edges


def bucket_index(edges: list[int] | tuple[int, ...], batch_size: int) -> int:
    """Index of the bucket whose lower edge is the largest edge <= batch_size (0 below the first)."""
    return max(0, bisect.bisect_right(edges, batch_size) - 1)


class PlannerConfig(BaseModel):
    """Which gamma policy to run and how."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicyName = "nightjar"
    max_gamma: int = Field(DEFAULT_MAX_GAMMA, ge=0, le=MAX_GAMMA,
                           description="K: the largest speculation length (arms are 0..K)")
    arms: list[int] | None = Field(None, description="subset of 0..K; default all")
    ngram_arms: list[int] = Field(
        default_factory=list,
        description="gammas (1..K) also offered with prompt-lookup (n-gram) drafts: no draft model, no KV "
        "memory, available while the draft is offloaded; empty: draft-model arms only",
    )
    suffix_arms: list[int] = Field(
        default_factory=list,
        description="gammas (1..K) also offered with suffix-tree drafts (the request's and earlier outputs; "
        "drafts of up to gamma tokens per request): no draft model, no KV memory; empty: none",
    )
    bucket_edges: list[int] | None = Field(
        None, description="ascending lower edges of batch-size buckets; default log-spaced up to max_batch"
    )
    max_batch: int = Field(256, ge=1)
    static_gamma: int | None = Field(None, description="gamma for policy 'static' (default K)")
    static_source: Literal["draft", "ngram", "suffix"] = Field(
        "draft", description="where policy 'static' takes its drafts: the draft model, prompt lookup (n-gram) "
        "or the suffix trees"
    )
    gamma_table: dict[int, int] | None = Field(
        None, description="batch size -> gamma (vLLM num_speculative_tokens_per_batch_size semantics)"
    )
    switch_cost_s: float | None = Field(None, ge=0, description="override the measured C_switch (seconds)")
    slo_tpot_s: float | None = Field(None, gt=0, description="TPOT target (seconds/token) the arm must respect")
    slo_ttft_s: float | None = Field(
        None, gt=0, description="TTFT target (seconds): with a target set, the planner maximises goodput (tokens of "
        "requests meeting both targets) instead of minimising time per token (docs/planner.md, Objective)",
    )
    slo_attainment: float = Field(0.99, gt=0, le=1, description="fraction of requests the targets are for")
    seed: int = 0

    # Exploration knobs (Nightjar), all runtime-updatable.
    explore_scale: float = Field(
        1.0, ge=0, description="a bin explores with probability min(1, explore_scale / sqrt(bin index))"
    )
    explore_floor: float = Field(0.0, ge=0, description="lower bound on the per-bin exploration probability")
    max_block_exp: int = Field(
        12, ge=1, description="blocks grow as 2^(b-1) steps up to 2^max_block_exp (keeps tracking under drift)"
    )
    share_neighbours: bool = Field(True, description="pool evidence from neighbouring batch buckets")
    monotone_prior: bool = Field(
        True, description="prior: the best gamma does not grow with batch size (used to prune exploration)"
    )
    hysteresis: float = Field(
        0.02, ge=0, description="relative margin a challenger arm must beat the incumbent by before switching"
    )
    discount: float = Field(
        0.9995, ge=0.5, le=1.0, description="per-observation decay of old evidence (1.0 = stationary)"
    )
    switch_amortise_steps: int = Field(
        32, ge=1, description="steps over which C_switch charged to a 0->k decision is amortised"
    )
    eliminate: bool = Field(
        True, description="explore only arms whose confidence interval overlaps the best arm's"
    )
    confidence_z: float = Field(2.0, ge=0, description="width of those confidence intervals in standard errors")
    share_weight: float = Field(
        2.0, ge=0, description="pseudo-count of evidence transferred from each neighbouring bucket"
    )
    growing_window: bool = Field(
        True, description="forget early evidence at rate 1/(t+10) per observation (cold-start transients)"
    )
    normalise_batch: bool = Field(
        True, description="learn loss x batch / bucket_lo, removing the 1/batch trend inside a bucket"
    )
    prefill_correction: bool = Field(
        True, description="subtract the learnt cost of prefill tokens merged into a step from its loss"
    )
    source_first: bool = Field(
        True,
        description="with several draft sources, a bucket explores a source not yet tried there before another "
        "gamma of a tried one, and skips the untried gammas of a source whose tried ones all lose by over 25 %",
    )
    pool_yield: bool = Field(
        True,
        description="read a (bucket, arm)'s loss over the arm's tokens per request pooled over every bucket "
        "(acceptance is the source's and the content's, not the batch's) instead of its own few draws",
    )
    source_model: bool = Field(
        True,
        description="share statistics across a source's gammas: yields shrunk towards the source's pooled geometric "
        "acceptance, and an untried (source, gamma)'s loss in a bucket predicted from it and the bucket's step times "
        "(linear in gamma per source) to rank and prune exploration",
    )
    amortise_draft_prefill: bool = Field(
        True,
        description="charge the running draft's prefill to gamma > 0 as a smooth per-token cost (its "
        "learnt seconds per prompt token x the workload's prompt tokens per generated token) instead "
        "of leaving each prefill step's lump in whichever arm happened to play it",
    )
    step_prefill_price: bool = Field(
        True,
        description="when the held arm would turn the draft off, or a held gamma > 0 arm ties with gamma 0 "
        "(within the hysteresis) on a step that brings prompts, price keeping the draft on at this step's "
        "own scheduled prompt tokens (the draft prefills them now) instead of the workload's mean, so a "
        "wave's rise is not prefilled with the draft on over a near tie",
    )
    min_acceptance: float = Field(
        0.05, ge=0, lt=1,
        description="acceptance gate: no bucket explores gamma > 0 while the draft's acceptance (pooled "
        "over buckets, upper confidence bound) is below this; 0 turns the gate off",
    )
    acceptance_gate_tokens: int = Field(64, ge=1, description="drafted tokens before the gate may close")
    acceptance_halflife_steps: int = Field(
        4096, ge=1, description="half-life of the gate's pooled counts (steps): it re-opens to re-probe"
    )
    prior_max_count: float = Field(
        64.0, ge=0, description="upper bound on the pseudo-count of an injected prior per bucket and arm"
    )
    paper_mode: bool = Field(
        False, description="ablation: the paper's per-bucket scheme only (no sharing, no pruning, no hysteresis)"
    )

    @field_validator("bucket_edges")
    @classmethod
    def _edges(cls, v: list[int] | None) -> list[int] | None:
        return None if v is None else _check_edges("bucket_edges", v)

    @model_validator(mode="after")
    def _cross(self) -> PlannerConfig:
        k = self.max_gamma
        if self.arms is not None:
            if not self.arms:
                raise ValueError("arms: must not be empty (omit it to use all of 0..max_gamma)")
            bad = [a for a in self.arms if a < 0 or a > k]
            if bad:
                raise ValueError(f"arms: values must lie in 0..max_gamma={k} (got {bad})")
            if len(set(self.arms)) != len(self.arms):
                raise ValueError(f"arms: duplicate values in {self.arms}")
            self.arms = sorted(self.arms)
        for name in ("ngram_arms", "suffix_arms"):
            vals = getattr(self, name)
            bad = [a for a in vals if a < 1 or a > k]
            if bad:
                raise ValueError(f"{name}: values must lie in 1..max_gamma={k} (got {bad})")
            if len(set(vals)) != len(vals):
                raise ValueError(f"{name}: duplicate values in {vals}")
            setattr(self, name, sorted(vals))
        if self.bucket_edges is None:
            self.bucket_edges = default_bucket_edges(self.max_batch)
        if self.static_gamma is not None and not 0 <= self.static_gamma <= k:
            raise ValueError(f"static_gamma: must lie in 0..max_gamma={k} (got {self.static_gamma})")
        if self.gamma_table is not None:
            if not self.gamma_table:
                raise ValueError("gamma_table: must not be empty")
            for bs, g in self.gamma_table.items():
                if bs < 1:
                    raise ValueError(f"gamma_table: batch-size keys must be >= 1 (got {bs})")
                if not 0 <= g <= k:
                    raise ValueError(f"gamma_table: gamma for batch {bs} must lie in 0..max_gamma={k} (got {g})")
        if self.policy == "table" and self.gamma_table is None:
            raise ValueError("gamma_table: required when policy is 'table'")
        return self

    def resolved_arms(self) -> tuple[int, ...]:
        return tuple(self.arms) if self.arms is not None else tuple(range(self.max_gamma + 1))

    def host_arms(self) -> dict[str, tuple[int, ...]]:
        """The host sources' gammas (no draft model, no KV memory), in arm order: n-gram, then suffix."""
        return {src: tuple(g) for src, g in (("ngram", self.ngram_arms), ("suffix", self.suffix_arms)) if g}

    def edges(self) -> tuple[int, ...]:
        assert self.bucket_edges is not None
        return tuple(self.bucket_edges)


class PriorEntry(BaseModel):
    """Prior belief about one (bucket, gamma): mean loss (s/token) worth ``count`` observations."""

    model_config = ConfigDict(extra="forbid")

    bucket_lo: int = Field(description="a bucket lower edge from PlannerPriors.bucket_edges")
    gamma: int = Field(ge=0)
    mean_loss_s: float = Field(gt=0)
    count: float = Field(1.0, ge=0)
    source: str = Field(
        "draft", min_length=1,
        description="where the arm's drafts come from (the draft model, or a host source such as 'ngram'); "
        "gamma 0 is the plain arm whatever the source",
    )


class PlannerPriors(BaseModel):
    """Per (bucket, gamma) priors; buckets given by their lower edges."""

    model_config = ConfigDict(extra="forbid")

    bucket_edges: list[int]
    entries: list[PriorEntry] = Field(default_factory=list)
    draft_prefill_s_per_token: float | None = Field(
        None, ge=0,
        description="seconds the running draft adds per prompt token prefilled in a step (a property of "
        "the pair and device, like the entries); the planner uses it until it has learnt its own",
    )

    @field_validator("bucket_edges")
    @classmethod
    def _edges(cls, v: list[int]) -> list[int]:
        return _check_edges("bucket_edges", v)

    @model_validator(mode="after")
    def _entries(self) -> PlannerPriors:
        edges = set(self.bucket_edges)
        seen: set[tuple[int, int, str]] = set()
        for i, e in enumerate(self.entries):
            if e.bucket_lo not in edges:
                raise ValueError(
                    f"entries[{i}].bucket_lo: {e.bucket_lo} is not one of bucket_edges {self.bucket_edges}"
                )
            key = (e.bucket_lo, e.gamma, e.source if e.gamma > 0 else "draft")
            if key in seen:
                raise ValueError(f"entries[{i}]: duplicate entry for bucket_lo={e.bucket_lo} gamma={e.gamma} "
                                 f"source={key[2]}")
            seen.add(key)
        return self
