"""Helpers shared by the engine tests (imported by basename; tests/engine is on sys.path)."""

from __future__ import annotations

from typing import Any

import pytest
from nightjar_worker.engine.lossless import lossless_mismatch, top2_margin  # noqa: F401 - the tests import it from here
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


def generate_margins(llm: Any, texts: list[str], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Greedy ids and, per position, the logprob gap between the two most likely tokens."""
    from vllm import SamplingParams

    outs = llm.generate(chat(llm, texts), SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2),
                        use_tqdm=False)
    res = []
    for o in outs:
        margins = [top2_margin(x.logprob for x in lp.values()) for lp in o.outputs[0].logprobs or []]
        res.append((list(o.outputs[0].token_ids), margins))
    return res


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
