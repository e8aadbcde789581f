"""What "lossless" means when greedy outputs are compared (engine tests, bench-ngram).

Speculation must not change greedy output. In bf16 on CPU, verifying k+1 tokens runs GEMMs of
another shape than a plain step, and the last bits of a logit can differ: where plain decoding's
two best tokens were within a rounding step, either may win, and the texts part ways there without
anything being wrong. So an output is lossless when it equals plain decoding's, or equals it up to
a position where plain decoding's top-2 logprob margin was at most ``TIE_MARGIN`` (two bf16 steps
of a logprob near 0). Any other difference is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

TIE_MARGIN = 0.25

T = TypeVar("T")


def top2_margin(logprobs: Iterable[float]) -> float:
    """The gap between the two best logprobs of a position (inf with fewer than two)."""
    top = sorted(logprobs, reverse=True)
    return top[0] - top[1] if len(top) > 1 else float("inf")


def lossless_mismatch(got: Sequence[T], ref: Sequence[T], margins: Sequence[float]) -> str | None:
    """None when ``got`` equals plain decoding's ``ref`` (token ids or token strings), or equals it up
    to a position where plain decoding's two best tokens tied within ``TIE_MARGIN`` (``margins``:
    per position of ``ref``); else where and how it differs."""
    n = next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), min(len(got), len(ref)))
    if n == len(got) == len(ref):
        return None
    margin = margins[n] if n < len(margins) else float("inf")
    return None if margin <= TIE_MARGIN else f"differs at token {n} where plain decoding's top-2 margin was {margin:.3f}"
