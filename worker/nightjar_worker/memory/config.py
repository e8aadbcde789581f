"""Elastic draft memory configuration (pydantic; importable without torch or vLLM).

Sources, first found wins: env ``NIGHTJAR_MEMORY`` (inline JSON, or a path to a JSON/YAML file),
then ``additional_config["nightjar_memory"]`` of the vLLM engine (``LLM(additional_config=...)`` /
``--additional-config``). Absent or ``enabled: false``: the draft stays resident, vLLM unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .offload_policy import OffloadPolicyConfig

ENV = "NIGHTJAR_MEMORY"
ADDITIONAL_CONFIG_KEY = "nightjar_memory"


class BackoffConfig(BaseModel):
    """Retry back-off after a failed draft reload (``fault.RetryBackoff``)."""

    model_config = ConfigDict(extra="forbid")

    base_s: float = Field(1.0, gt=0.0, description="delay after the first failure")
    factor: float = Field(2.0, ge=1.0)
    max_s: float = Field(60.0, gt=0.0)


class ElasticMemoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    mode: Literal["auto", "resident", "offloaded"] = Field(
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
    release_pages: bool = Field(True, description="return held-back KV pages to the OS (CPU: madvise)")
    host_store: Literal["auto", "pinned", "memory", "file"] = "auto"
    offload_dir: str | None = None
    reload_slice_s: float = Field(
        0.02, ge=0,
        description="CPU: reload in slices of at most about this much work between engine steps, on the "
        "engine thread (re-packing vLLM's CPU GEMM weights in a background thread competed with decoding "
        "for the cores: decode steps up to 7x the median); 0: a background thread. CUDA always uses a "
        "background thread and a side stream",
    )
    reload_slice_bytes: int = Field(
        8 << 20, ge=0, description="largest read or packing call in one reload work item (0: whole tensors)"
    )
    policy: OffloadPolicyConfig = Field(default_factory=OffloadPolicyConfig)
    backoff: BackoffConfig = Field(default_factory=BackoffConfig)
    trace_file: str | None = Field(None, description="append one JSON line per step (benchmarks)")


def load_config(additional_config: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> ElasticMemoryConfig:
    env = os.environ if environ is None else environ
    raw: Any = None
    src = env.get(ENV, "").strip()
    if src:
        if src.startswith("{"):
            raw = json.loads(src)
        else:
            p = Path(src)
            if not p.is_file():
                raise ValueError(f"{ENV}: {src!r} is neither inline JSON nor an existing file")
            raw = yaml.safe_load(p.read_text())
    elif additional_config and ADDITIONAL_CONFIG_KEY in additional_config:
        raw = additional_config[ADDITIONAL_CONFIG_KEY]
    if raw is None:
        return ElasticMemoryConfig()
    return ElasticMemoryConfig.model_validate(raw)
