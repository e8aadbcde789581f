"""Elastic draft memory configuration (env ``NIGHTJAR_MEMORY``, written by the operator).

``enabled: false`` (the default): the draft stays resident, vLLM unchanged. ``policy`` holds the
offload policy's thresholds (``nightjar_worker.memory.offload_policy``).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENV = "NIGHTJAR_MEMORY"
ADDITIONAL_CONFIG_KEY = "nightjar_memory"


class OffloadPolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    offload_after_steps: int = Field(8, ge=1, description="consecutive gamma=0 steps under pressure")
    reload_after_steps: int = Field(16, ge=1, description="consecutive calm steps wanting gamma>0")
    waiting_threshold: int = Field(1, ge=1, description="this many waiting requests is pressure")
    kv_usage_high: float = Field(0.90, gt=0.0, le=1.0, description="KV usage (of allowed blocks) = pressure")
    kv_usage_low: float = Field(
        0.70, ge=0.0, le=1.0, description="reload only when used blocks <= this share of the base pool"
    )
    min_resident_s: float = Field(2.0, ge=0.0, description="minimum dwell in RESIDENT before offloading")
    min_offloaded_s: float = Field(2.0, ge=0.0, description="minimum dwell in OFFLOADED before draining")
    recheck_after_s: float | None = Field(
        30.0, gt=0.0,
        description="offloaded this long and the KV cache calm (nothing waiting, blocks in use within "
        "kv_usage_low of the base pool): the draft returns although the planner does not ask for it, since "
        "its arms' estimates predate the load and the blocks it takes back are idle; null: only on demand",
    )
    amortize_steps: int = Field(
        200, ge=1, description="steps over which the reload + C_switch cost must be recovered"
    )
    drain_timeout_s: float = Field(
        30.0, gt=0.0, description="after this long draining, preempt (recompute) holders of extra blocks"
    )

    @model_validator(mode="after")
    def _thresholds(self) -> OffloadPolicyConfig:
        if self.kv_usage_low >= self.kv_usage_high:
            raise ValueError(
                f"kv_usage_low ({self.kv_usage_low}) must be below kv_usage_high ({self.kv_usage_high})"
            )
        return self


class BackoffConfig(BaseModel):
    """Retry back-off after a failed draft reload (``fault.RetryBackoff``)."""

    model_config = ConfigDict(extra="forbid")

    base_s: float = Field(1.0, gt=0.0, description="delay after the first failure")
    factor: float = Field(2.0, ge=1.0)
    max_s: float = Field(60.0, gt=0.0)


# How the draft's residency is decided: by the offload policy, or pinned (ops, tests, benchmarks).
MemoryMode = Literal["auto", "resident", "offloaded"]
MEMORY_MODES: tuple[MemoryMode, ...] = get_args(MemoryMode)


class ElasticMemoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    mode: MemoryMode = Field(
        "auto", description="auto: the offload policy decides; resident/offloaded: pinned (ops, tests, benchmarks)"
    )
    control_file: str | None = Field(
        None, description="if set, a file whose content (auto|resident|offloaded) overrides mode at run time"
    )
    base_blocks: int | None = Field(
        None,
        ge=2,
        description="KV blocks (null block included) usable with the draft resident; None: the pool "
        "vLLM allocated was sized for the offloaded case and the draft's share is held back",
    )
    release_pages: bool = Field(
        True, description="return the held-back KV blocks' memory (CPU: madvise; CUDA: unmap CUDA virtual memory)"
    )
    allow_unverified_cuda: bool = Field(
        False,
        description="run elastic memory on CUDA although this build's KV page release in CUDA virtual memory "
        "has not passed a GPU check (make gpu-check); for testing on a GPU, not for production",
    )
    host_store: Literal["auto", "pinned", "memory", "file"] = "auto"
    offload_dir: str | None = None
    reload_slice_s: float = Field(
        0.01, ge=0,
        description="CPU: reload in slices of at most about this much work between engine steps, on the "
        "engine thread (re-packing vLLM's CPU GEMM weights in a background thread competed with decoding "
        "for the cores: decode steps up to 7x the median); 0: a background thread. Keep it under half a "
        "decode step (bundled pair, 30 ms steps: 20 ms slices stretched them 1.8-2.1x, 10 ms 1.4x). CUDA "
        "always uses a background thread and a side stream",
    )
    reload_slice_bytes: int = Field(
        4 << 20, ge=0, description="largest read or packing call in one reload work item (0: whole tensors); "
        "an item is never cut, so it bounds how far a slice overruns reload_slice_s (8 MiB items: stall "
        "ratios up to 1.98 on the bundled pair, 4 MiB: 1.38-1.42)"
    )
    policy: OffloadPolicyConfig = Field(default_factory=OffloadPolicyConfig)
    backoff: BackoffConfig = Field(default_factory=BackoffConfig)
    trace_file: str | None = Field(None, description="append one JSON line per step (benchmarks)")
