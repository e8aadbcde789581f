"""A forced gamma schedule, cycled per step: for tests (switches 0 <-> k) and the profiler.

Spec: comma-separated items ``g`` or ``gxN`` (gamma g for N steps), e.g. ``"0x5,4x5"`` or ``"0,2,4"``.
Set through env ``NIGHTJAR_FORCE_GAMMA`` (overrides the configured policy).
"""

from __future__ import annotations

from nightjar_worker.planner.policy import StepFeedback


def parse_schedule(spec: str) -> list[int]:
    out: list[int] = []
    for item in spec.replace(" ", "").split(","):
        if not item:
            continue
        g, _, n = item.partition("x")
        try:
            gi, ni = int(g), int(n) if n else 1
        except ValueError:
            raise ValueError(f"NIGHTJAR_FORCE_GAMMA: bad item {item!r} (expected 'g' or 'gxN')") from None
        if gi < 0 or ni < 1:
            raise ValueError(f"NIGHTJAR_FORCE_GAMMA: bad item {item!r} (gamma >= 0, N >= 1)")
        out += [gi] * ni
    if not out:
        raise ValueError("NIGHTJAR_FORCE_GAMMA: empty schedule")
    return out


class ForcedSchedulePolicy:
    """Ignores the context and cycles through a fixed list of gammas; records every feedback."""

    name = "forced"

    def __init__(self, schedule: list[int] | str, max_gamma: int | None = None) -> None:
        sched = parse_schedule(schedule) if isinstance(schedule, str) else list(schedule)
        if max_gamma is not None:
            bad = [g for g in sched if g > max_gamma]
            if bad:
                raise ValueError(f"NIGHTJAR_FORCE_GAMMA: gamma {bad[0]} > K={max_gamma} (num_speculative_tokens)")
        self.schedule = sched
        self._i = 0
        self.feedback: list[StepFeedback] = []

    @property
    def arms(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.schedule)))

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        g = self.schedule[self._i % len(self.schedule)]
        self._i += 1
        return g

    def observe(self, feedback: StepFeedback) -> None:
        self.feedback.append(feedback)
