"""Cost profile: the measured (or analytic) cost surface of one target/draft pair on one device.

Written by ``nightjar-worker profile`` (engine) or ``sim/roofline.py`` (analytic); read by the
simulator and by the DSD and oracle baselines. ``step_time_s[b][g]`` is the wall time of one
decoding step at ``batch_sizes[b]`` verifying ``gammas[g]`` drafts per request (draft proposal
included). Pure Python: no numpy, torch or vllm needed.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator


def expected_tokens(gamma: int, alpha: float) -> float:
    """Expected tokens emitted per request by one step verifying ``gamma`` drafts under the geometric
    acceptance model (draft i is accepted with probability alpha given drafts < i were): the
    accepted prefix plus the target's bonus token = sum_{i=0..gamma} alpha^i."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation; linear extrapolation from the last two points beyond the
    ends (step time keeps growing with batch past the profiled range), floored at a tiny positive."""
    n = len(xs)
    if n == 1:
        return ys[0]
    i = bisect.bisect_right(xs, x) - 1
    i = min(max(i, 0), n - 2)
    x0, x1 = xs[i], xs[i + 1]
    y0, y1 = ys[i], ys[i + 1]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(y, 1e-9)


class CostProfile(BaseModel):
    """See the module docstring and docs/planner.md for the meaning of every field."""

    model_config = ConfigDict(extra="forbid")

    name: str
    device: str
    target: str
    draft: str
    block_tokens: int = Field(16, ge=1, description="tokens per KV block")
    kv_blocks_total: int = Field(ge=1, description="KV blocks available with the draft resident")
    draft_weight_bytes: int = Field(0, ge=0, description="bytes of the draft's weights (freed when offloaded)")
    kv_block_bytes: int = Field(ge=1, description="target KV bytes per block")
    max_batch: int = Field(ge=1)
    batch_sizes: list[int]
    gammas: list[int]
    step_time_s: list[list[float]]
    acceptance: dict[str, float]
    switch_cost_fixed_s: float = Field(0.0, ge=0)
    switch_cost_per_token_s: float = Field(0.0, ge=0)
    draft_prefill_s_per_token: float = Field(
        0.0, ge=0, description="step time the running draft adds per prompt token prefilled in the step (0: not measured)"
    )
    prompt_tokens_per_output_token: float = Field(
        0.0, ge=0, description="the profiled workload's prompt tokens per generated token (0: not measured)"
    )

    _cols: list[list[float]] = PrivateAttr(default_factory=list)

    @field_validator("batch_sizes", "gammas")
    @classmethod
    def _ascending(cls, v: list[int], info) -> list[int]:
        if not v:
            raise ValueError(f"{info.field_name}: must not be empty")
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError(f"{info.field_name}: must be strictly ascending (got {v})")
        if v[0] < 0:
            raise ValueError(f"{info.field_name}: must be >= 0 (got {v[0]})")
        return v

    @field_validator("acceptance")
    @classmethod
    def _acc(cls, v: dict[str, float]) -> dict[str, float]:
        if "all" not in v:
            raise ValueError("acceptance: key 'all' is required")
        for k, a in v.items():
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"acceptance: rate for {k!r} must lie in [0, 1] (got {a})")
        return v

    @model_validator(mode="after")
    def _shape(self) -> CostProfile:
        if self.batch_sizes[0] < 1:
            raise ValueError(f"batch_sizes: must be >= 1 (got {self.batch_sizes[0]})")
        if len(self.step_time_s) != len(self.batch_sizes):
            raise ValueError(
                f"step_time_s: expected {len(self.batch_sizes)} rows (one per batch size), got {len(self.step_time_s)}"
            )
        for i, row in enumerate(self.step_time_s):
            if len(row) != len(self.gammas):
                raise ValueError(f"step_time_s[{i}]: expected {len(self.gammas)} values (one per gamma), got {len(row)}")
            if any(not t > 0 for t in row):
                raise ValueError(f"step_time_s[{i}]: step times must be > 0")
        # Column view for fast interpolation over batch.
        self._cols = [[row[g] for row in self.step_time_s] for g in range(len(self.gammas))]
        return self

    # -- cost model -------------------------------------------------------------------------
    def step_time(self, batch: float, gamma: float) -> float:
        """Wall seconds of one step at ``batch`` with ``gamma`` drafts per request, interpolated
        linearly in batch and in gamma (extrapolated linearly past the profiled ranges)."""
        gs = self.gammas
        if len(gs) == 1:
            return _interp(self.batch_sizes, self._cols[0], batch)
        j = bisect.bisect_right(gs, gamma) - 1
        if 0 <= j < len(gs) and gs[j] == gamma:
            return _interp(self.batch_sizes, self._cols[j], batch)
        j = min(max(j, 0), len(gs) - 2)
        t0 = _interp(self.batch_sizes, self._cols[j], batch)
        t1 = _interp(self.batch_sizes, self._cols[j + 1], batch)
        return max(t0 + (t1 - t0) * (gamma - gs[j]) / (gs[j + 1] - gs[j]), 1e-9)

    def alpha(self, category: str = "all") -> float:
        """Per-token acceptance rate of a category (falls back to 'all')."""
        return self.acceptance.get(category, self.acceptance["all"])

    def switch_cost(self, catch_up_tokens: float) -> float:
        """C_switch: time to rebuild the draft's KV cache for ``catch_up_tokens`` tokens."""
        return self.switch_cost_fixed_s + self.switch_cost_per_token_s * max(0.0, catch_up_tokens)

    def draft_prefill_rate(self) -> float:
        """Seconds the running draft adds per prompt token: measured, else a catch-up's per-token rate
        (the same work: the draft prefilling tokens it has not seen)."""
        return self.draft_prefill_s_per_token or self.switch_cost_per_token_s

    def draft_prefill_per_output_token(self) -> float:
        """The draft's prefill of the workload's prompts per generated token: what keeping the draft
        on costs beyond the decode steps (0 unless both factors were measured)."""
        return self.draft_prefill_s_per_token * self.prompt_tokens_per_output_token

    def draft_blocks(self) -> int:
        """KV blocks the draft's weights occupy while resident (freed when it is offloaded)."""
        return -(-self.draft_weight_bytes // self.kv_block_bytes) if self.draft_weight_bytes else 0

    def expected_loss(self, batch: int, gamma: int, alpha: float | None = None) -> float:
        """Expected seconds per generated token at (batch, gamma), switching cost excluded."""
        a = self.alpha() if alpha is None else alpha
        return self.step_time(batch, gamma) / (batch * expected_tokens(gamma, a))

    # -- I/O --------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        with open(path, encoding="utf-8") as f:
            return cls.model_validate(json.load(f))

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.model_dump(), indent=1) + "\n", encoding="utf-8")
