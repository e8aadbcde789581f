"""Helpers shared by the engine tests (imported by basename; tests/engine is on sys.path)."""

from __future__ import annotations

from typing import Any

import pytest
from nightjar_worker.models import bundled_pair

K = 3
MAX_MODEL_LEN = 768
LOSSLESS_MAX_TOKENS = 24


def require_models() -> tuple[str, str]:
    t, d = bundled_pair()
    if not (t / "config.json").is_file() or not (d / "config.json").is_file():
        pytest.fail(f"bundled models missing under {t.parent}: run `make models`")
    return str(t), str(d)

def prompts(n_per_cat: int = 1, cats: tuple[str, ...] = ("coding", "qa", "translation", "math_reasoning")) -> list[str]:
    from nightjar_worker.data import specbench_sample

    out: list[str] = []
    for c in cats:
        out += [q["prompt"] for q in specbench_sample() if q["category"] == c][:n_per_cat]
    return out


def chat(llm: Any, texts: list[str]) -> list[str]:
    tok = llm.get_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def generate_ids(llm: Any, texts: list[str], max_tokens: int, ignore_eos: bool = False) -> list[list[int]]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    outs = llm.generate(chat(llm, texts), sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


# bf16 logits around 20 lie 0.125 apart: where plain decoding's two most likely tokens are this
# close, a verification pass of another batch shape (bf16 CPU kernels are not batch-invariant) may
# break the tie the other way, and the outputs part there with neither being wrong.
TIE_MARGIN = 0.25


def generate_margins(llm: Any, texts: list[str], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Greedy ids and, per position, the logprob gap between the two most likely tokens."""
    from vllm import SamplingParams

    outs = llm.generate(chat(llm, texts), SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2),
                        use_tqdm=False)
    res = []
    for o in outs:
        margins = []
        for lp in o.outputs[0].logprobs or []:
            top = sorted((x.logprob for x in lp.values()), reverse=True)
            margins.append(top[0] - top[1] if len(top) > 1 else float("inf"))
        res.append((list(o.outputs[0].token_ids), margins))
    return res


def lossless_mismatch(got: list[int], ref: list[int], margins: list[float]) -> str | None:
    """None when ``got`` equals plain decoding's ``ref``, or equals it up to a position where plain
    decoding's two best tokens tied within ``TIE_MARGIN``; else where and how it differs."""
    n = next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), min(len(got), len(ref)))
    if n == len(got) == len(ref):
        return None
    margin = margins[n] if n < len(margins) else float("inf")
    return None if margin <= TIE_MARGIN else f"differs at token {n} where plain decoding's top-2 margin was {margin:.3f}"


class StepRecorder:
    def __init__(self) -> None:
        self.steps: list[Any] = []

    def __call__(self, s: Any) -> None:
        self.steps.append(s)


def force(llm: Any, schedule: str | list[int]) -> Any:
    from nightjar_worker.engine import inproc
    from nightjar_worker.engine.forced import ForcedSchedulePolicy

    pol = ForcedSchedulePolicy(schedule, K)
    inproc.scheduler(llm).nightjar_control.set_policy(pol)
    return pol
