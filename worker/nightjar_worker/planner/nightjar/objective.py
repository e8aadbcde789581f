"""The SLO objective: with a TTFT target, goodput (tokens of requests meeting both targets) decides
the steps that admit prompts.

Without targets the planner minimises time per generated token. With them, what counts is how many
requests meet both, and the two pull apart at one place: a step that admits prompts while the draft
runs also runs the draft's prefill of them (and a longer verification), and a first token lands at
the end of the step that prefills its prompt, having waited for the step before it to end. So such
a step is played at gamma 0 when its first tokens would miss the TTFT target with the draft on and
meet it with the draft off; the bin's arm resumes at the next step, where the draft catches up on
those prompts (C_switch): the cost lands in the TPOT of the requests running, spread over their
outputs, instead of in the new requests' TTFT. A first token that misses either way, or meets it
either way, keeps the bin's arm (nothing for goodput to gain).

The TPOT target is a cap on the bin's arm: a bucket plays, by least loss, the arms whose predicted
TPOT meets it, the prefill of the prompts merged into its steps included (with long prompts most
of a request's time per token); none does: every arm (goodput then needs throughput).

The wait before the step is taken as ``attainment`` x the last step's length (the quantile of an
arrival uniform inside it that the target is for). Queueing behind a full batch or KV pool is not
seen here (the planner is not told the queue).
"""

from __future__ import annotations


class SloObjective:
    """Owns the targets and the last step's length; ``defer_prefill`` is its per-step verdict."""

    def __init__(self) -> None:
        self.ttft_s: float | None = None
        self.tpot_s: float | None = None
        self.attainment = 0.99
        self.last_step_s = 0.0  # the previous step's length, C_switch included
        self.deferred = 0  # prompt steps played at gamma 0 for the TTFT target

    def configure(self, *, ttft_s: float | None, tpot_s: float | None, attainment: float) -> None:
        for name, v in (("slo_ttft_s", ttft_s), ("slo_tpot_s", tpot_s)):
            if v is not None and not v > 0:
                raise ValueError(f"{name}: must be > 0 (got {v})")
        if not 0 < attainment <= 1:
            raise ValueError(f"slo_attainment: must lie in (0, 1] (got {attainment})")
        self.ttft_s, self.tpot_s, self.attainment = ttft_s, tpot_s, attainment

    def tpot_candidates(self, cand: list[int], tpots: list[float | None]) -> list[int]:
        """The arms of ``cand`` whose predicted TPOT (``tpots``, per arm; None: not known, counted as
        meeting it) meets the target; none does: all of ``cand`` (no arm earns goodput by its TPOT,
        and the least loss drains the queue fastest, for the requests after)."""
        t = self.tpot_s
        if t is None:
            return cand
        return [i for i in cand if (x := tpots[i]) is None or x <= t] or cand

    def observe_step(self, seconds: float) -> None:
        """A step ended, ``seconds`` long (C_switch included)."""
        self.last_step_s = seconds

    def first_token_s(self, step_s: float) -> float:
        """Predicted TTFT of a prompt prefilled in a step of ``step_s`` (its wait included)."""
        return self.attainment * self.last_step_s + step_s

    def defer_prefill(self, step_on_s: float, step_off_s: float) -> bool:
        """Play this prompt step at gamma 0: its first tokens miss the TTFT target with the draft on
        (``step_on_s``: the step's predicted length) and meet it with the draft off (``step_off_s``)."""
        t = self.ttft_s
        if t is None:
            return False
        defer = self.first_token_s(step_on_s) > t >= self.first_token_s(step_off_s)
        self.deferred += defer
        return defer
