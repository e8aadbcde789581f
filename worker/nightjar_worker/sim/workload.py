"""Spec-Bench-like workload: request categories, prompt and output lengths, arrival traces.

The shipped ``specbench_dist.json`` summarises the bundled Spec-Bench questions (``data/specbench_questions.jsonl.gz``) (400 prompts
in 12 categories): per category its share of the prompts and the empirical prompt lengths in tokens
(characters / 4 + 16 chat-template tokens, first turn). Spec-Bench ships no answers, so output
lengths are a stated assumption per category (lognormal median/sigma, clipped to [8, 1024]),
chosen from typical 7B chat answer lengths (long prose for MT-bench writing, short for QA and
translation). ``summarise_specbench`` regenerates the file; the simulator reads only the JSON.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

DIST_PATH = Path(__file__).with_name("specbench_dist.json")

# Assumed median output tokens per category (Spec-Bench has no reference answers).
OUTPUT_MEDIAN = {
    "writing": 400, "roleplay": 350, "reasoning": 250, "math": 200, "coding": 300, "extraction": 200,
    "stem": 350, "humanities": 400, "translation": 50, "summarization": 120, "qa": 100,
    "math_reasoning": 180,
}
OUTPUT_SIGMA = 0.5
OUTPUT_MIN, OUTPUT_MAX = 8, 1024
TEMPLATE_TOKENS = 16


def summarise_specbench(questions_jsonl: str | Path, out: str | Path = DIST_PATH) -> dict:
    """Build the distribution JSON from a Spec-Bench questions file (run once, offline)."""
    cats: dict[str, list[int]] = {}
    for line in Path(questions_jsonl).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        cats.setdefault(q["category"], []).append(len(q["turns"][0]) // 4 + TEMPLATE_TOKENS)
    total = sum(len(v) for v in cats.values())
    dist = {
        "source": "Spec-Bench questions.jsonl (prompt tokens ~ chars/4 + 16); output lengths assumed",
        "categories": {
            c: {
                "weight": len(v) / total,
                "prompt_tokens": sorted(v),
                "output_median": OUTPUT_MEDIAN.get(c, 200),
                "output_sigma": OUTPUT_SIGMA,
            }
            for c, v in sorted(cats.items())
        },
    }
    Path(out).write_text(json.dumps(dist, indent=1) + "\n", encoding="utf-8")
    return dist


@dataclass(frozen=True, slots=True)
class Request:
    rid: int
    arrival_s: float
    category: str
    prompt_tokens: int
    output_tokens: int


class Workload:
    """Samples requests from the category mix."""

    def __init__(self, dist: dict | None = None) -> None:
        if dist is None:
            dist = json.loads(DIST_PATH.read_text(encoding="utf-8"))
        self.categories = list(dist["categories"])
        self.spec = dist["categories"]
        self.weights = [self.spec[c]["weight"] for c in self.categories]

    def category_weights(self) -> dict[str, float]:
        return dict(zip(self.categories, self.weights, strict=True))

    def sample(self, rng: random.Random, rid: int, arrival_s: float) -> Request:
        c = rng.choices(self.categories, self.weights)[0]
        s = self.spec[c]
        p = rng.choice(s["prompt_tokens"])
        o = int(round(s["output_median"] * math.exp(s["output_sigma"] * rng.gauss(0.0, 1.0))))
        return Request(rid, arrival_s, c, p, min(max(o, OUTPUT_MIN), OUTPUT_MAX))

    def mean_output_tokens(self) -> float:
        # lognormal mean (clipping ignored): median * exp(sigma^2 / 2)
        return sum(
            w * self.spec[c]["output_median"] * math.exp(self.spec[c]["output_sigma"] ** 2 / 2)
            for c, w in zip(self.categories, self.weights, strict=True)
        )


# -- arrival traces ----------------------------------------------------------------------------
RateTrace = list[tuple[float, float]]  # piecewise-constant (duration_s, requests/s)


def poisson_arrivals(trace: RateTrace, rng: random.Random) -> list[float]:
    """Arrival times of a non-homogeneous Poisson process with a piecewise-constant rate."""
    out: list[float] = []
    t0 = 0.0
    for dur, rate in trace:
        if rate > 0:
            t = t0
            while True:
                t += rng.expovariate(rate)
                if t >= t0 + dur:
                    break
                out.append(t)
        t0 += dur
    return out


def make_requests(trace: RateTrace, seed: int, workload: Workload | None = None) -> list[Request]:
    """The same seed gives the same arrivals and lengths, whatever policy is simulated."""
    wl = workload or Workload()
    rng = random.Random(seed)
    times = poisson_arrivals(trace, rng)
    return [wl.sample(rng, i, t) for i, t in enumerate(times)]


def dynamic_trace(low: float, high: float, phase_s: float) -> RateTrace:
    """Low -> high -> low load, ramping in 4 steps between phases."""
    ramp = [low + (high - low) * f for f in (0.25, 0.5, 0.75)]
    seg = phase_s / 4
    return (
        [(phase_s, low)] + [(seg, r) for r in ramp] + [(phase_s, high)]
        + [(seg, r) for r in reversed(ramp)] + [(phase_s, low)]
    )


# Long prompts (issue 50 item 4): the Spec-Bench category mix (so acceptance is drawn as usual), but
# every prompt several hundred tokens (a RAG context, a pasted document) and answers of ~100-200
# tokens, where prefill and the queueing it brings weigh on the request as much as decoding does.
LONG_PROMPT_TOKENS = (300, 900)  # uniform range, tokens
LONG_OUTPUT_MEDIAN, LONG_OUTPUT_SIGMA = 150, 0.2


def long_prompt_workload(base: Workload | None = None) -> Workload:
    """The base workload's categories and weights with long prompts and short-to-medium answers."""
    wl = base or Workload()
    lo, hi = LONG_PROMPT_TOKENS
    prompts = list(range(lo, hi + 1, 10))
    return Workload({"categories": {
        c: {"weight": w, "prompt_tokens": prompts, "output_median": LONG_OUTPUT_MEDIAN, "output_sigma": LONG_OUTPUT_SIGMA}
        for c, w in wl.category_weights().items()
    }})
