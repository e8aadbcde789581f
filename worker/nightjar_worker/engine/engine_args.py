"""vLLM engine options for a Nightjar draft/target pair: one function for CPU and CUDA.

``engine_kwargs`` gives ``LLM(**kw)`` / ``EngineArgs(**kw)`` keywords; ``cli_args`` turns the same
dict into the API server's flags (``nightjar-worker serve``), so the two paths cannot disagree.

Per device:

* **CUDA graphs**: off on CPU (``enforce_eager``; the CPU backend has no graphs), on for CUDA unless
  the caller asks for eager mode. A step whose gamma is below K is not the "uniform decode" shape
  vLLM captures full graphs for (1 + K tokens per request); vLLM then runs the piecewise graphs, so
  output is unchanged and only that step's launch overhead differs.
* **Async scheduling**: always off, with ``ASYNC_SCHEDULING_OFF_REASON``. vLLM 0.32 turns it on by
  default on CUDA for draft-model speculation; the CPU platform forces it off anyway.
* Models: a local directory (checked for ``config.json``, and the pair's tokenizers compared before
  vLLM starts) or a Hugging Face Hub repo id (``Org/Model``), which vLLM downloads into ``HF_HOME``;
  ``revision`` / ``draft_revision`` pin the Hub revision of each.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from nightjar_worker.engine.pair_check import check_pair
from nightjar_worker.engine.version import check_vllm_version

NIGHTJAR_SCHEDULER_CLS = "nightjar_worker.engine.scheduler.NightjarScheduler"
DTYPES = ("bfloat16", "float32", "float16", "auto")  # what serve and profile accept as --dtype
Device = Literal["cpu", "cuda"]
ASYNC_SCHEDULING_OFF_REASON = (
    "Nightjar picks each step's gamma from the previous step's measured time and acceptance; vLLM's "
    "AsyncScheduler schedules step N+1 before step N's output exists and pads every request to K "
    "placeholder drafts, so the planner would decide on stale feedback and verify drafts it did not ask for"
)
# A Hub repo id as vLLM and huggingface_hub take it: "Org/Model" (one slash, no leading dot or slash).
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(model: str | os.PathLike[str], field: str) -> tuple[str, bool]:
    """(what vLLM gets, is it a local directory). A directory must hold ``config.json``; anything
    else must look like a Hub repo id, or the error names ``field``."""
    s = os.fspath(model)
    p = Path(s)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{field}: {p} has no config.json (not a model directory)")
        return str(p), True
    if HUB_ID.match(s) and not s.startswith((".", "/")):
        return s, False
    raise FileNotFoundError(
        f"{field}: {s} is neither a model directory nor a Hugging Face Hub repo id (Org/Model); "
        "run `make models` for the bundled pair"
    )


def speculative_config(draft: str | os.PathLike[str], k: int, **extra: Any) -> dict[str, Any]:
    if k < 1:
        raise ValueError(f"num_speculative_tokens: K must be >= 1 for a draft (got {k})")
    return {"method": "draft_model", "model": os.fspath(draft), "num_speculative_tokens": k, **extra}


def engine_kwargs(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None,
    k: int = 4,
    *,
    device: Device = "cpu",
    nightjar: bool = True,
    max_model_len: int = 1024,
    dtype: str = "bfloat16",
    eager: bool | None = None,
    revision: str | None = None,
    draft_revision: str | None = None,
    check_tokenizers: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """``nightjar=False`` gives the same engine with vLLM's own scheduler (baselines).
    ``eager=None``: CUDA graphs wherever the device has them. ``check_tokenizers=False`` leaves the
    pair check to the scheduler (the API server path). ``extra`` wins over everything."""
    check_vllm_version()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected cpu or cuda (got {device!r})")
    t, t_local = resolve_model(target, "model")
    kw: dict[str, Any] = {
        "model": t,
        "dtype": dtype,
        "enforce_eager": True if device == "cpu" else bool(eager),
        "max_model_len": max_model_len,
        "async_scheduling": False,  # ASYNC_SCHEDULING_OFF_REASON
    }
    if revision:
        kw["revision"] = revision
    if draft is not None:
        d, d_local = resolve_model(draft, "speculative_config.model")
        if check_tokenizers and t_local and d_local:
            check_pair(t, d)  # Hub pairs are checked by the scheduler once vLLM has downloaded them
        kw["speculative_config"] = speculative_config(d, k, **({"revision": draft_revision} if draft_revision else {}))
        if nightjar:
            kw["scheduler_cls"] = NIGHTJAR_SCHEDULER_CLS
    elif draft_revision:
        raise ValueError("draft_revision: given without a draft")
    kw.update(extra)
    return kw


def cli_args(kw: dict[str, Any]) -> list[str]:
    """The API server flags for ``engine_kwargs``' dict: booleans as ``--x`` / ``--no-x``, dicts as
    JSON, ``None`` left out (vLLM's default)."""
    argv: list[str] = []
    for key, v in kw.items():
        if v is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, dict | list):
            argv += [flag, json.dumps(v)]
        else:
            argv += [flag, str(v)]
    return argv
