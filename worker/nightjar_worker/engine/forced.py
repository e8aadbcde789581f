"""A forced gamma schedule, cycled per step: for tests (switches 0 <-> k) and the profiler.

Spec: comma-separated items ``g`` or ``gxN`` (gamma g for N steps), e.g. ``"0x5,4x5"`` or ``"0,2,4"``;
``ng`` drafts up to gamma g by prompt lookup instead of the draft model, ``sg`` by the suffix trees
(``"4x3,n3x3,s3x3,0"``).
Set through env ``NIGHTJAR_FORCE_GAMMA`` (overrides the configured policy).
"""

from __future__ import annotations

from nightjar_worker.planner.policy import StepFeedback

_PREFIXES = {"n": "ngram", "s": "suffix"}


def parse_schedule(spec: str) -> list[tuple[str, int]]:
    """(source, gamma) per step."""
    out: list[tuple[str, int]] = []
    for item in spec.replace(" ", "").split(","):
        if not item:
            continue
        g, _, n = item.partition("x")
        src = _PREFIXES.get(g[:1], "draft")
        try:
            gi, ni = int(g[1:] if src != "draft" else g), int(n) if n else 1
        except ValueError:
            raise ValueError(f"NIGHTJAR_FORCE_GAMMA: bad item {item!r} (expected 'g', 'ng', 'sg' or 'gxN')") from None
        if gi < 0 or ni < 1 or (src != "draft" and gi == 0):
            raise ValueError(f"NIGHTJAR_FORCE_GAMMA: bad item {item!r} (gamma >= 0, n-gram and suffix gamma >= 1, "
                             "N >= 1)")
        out += [(src, gi)] * ni
    if not out:
        raise ValueError("NIGHTJAR_FORCE_GAMMA: empty schedule")
    return out


class ForcedSchedulePolicy:
    """Ignores the context and cycles through a fixed list of (source, gamma); records every feedback."""

    name = "forced"

    def __init__(self, schedule: list[int] | list[tuple[str, int]] | str, max_gamma: int | None = None) -> None:
        raw = parse_schedule(schedule) if isinstance(schedule, str) else list(schedule)
        sched = [x if isinstance(x, tuple) else ("draft", x) for x in raw]
        if max_gamma is not None:
            bad = [g for _, g in sched if g > max_gamma]
            if bad:
                raise ValueError(f"NIGHTJAR_FORCE_GAMMA: gamma {bad[0]} > K={max_gamma} (num_speculative_tokens)")
        self.schedule = sched
        self._i = 0
        self._source = "draft"
        self.feedback: list[StepFeedback] = []

    @property
    def arms(self) -> tuple[int, ...]:
        return tuple(sorted({g for _, g in self.schedule}))

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        self._source, g = self.schedule[self._i % len(self.schedule)]
        self._i += 1
        return int(g)

    def source(self) -> str:
        return self._source

    def observe(self, feedback: StepFeedback) -> None:
        self.feedback.append(feedback)
