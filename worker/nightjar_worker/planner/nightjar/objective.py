"""The SLO objective: with a TTFT target, goodput (tokens of requests meeting both targets) decides
the steps that admit prompts and the steps that would resume the draft.

Without targets the planner minimises time per generated token. With them, what counts is how many
requests meet both. The TPOT needs nothing more: in a bucket a request's time per token is the
batch times the arm's loss per token (the draft's prefill charged) plus the prompts prefilled in its
steps (batch x prompt tokens per output token x the target's prefill slope, the same for every
arm), so the arm of least loss is the arm of least TPOT, and meets a TPOT target whenever any arm
does. (Filtering arms on a TPOT cap, as before, only kept the explorer off arms and the monotone
prior off: SLO goodput 0.47-0.66 of the best static arm on the Qwen CPU profile's loaded shapes,
where long prompts' prefill made every arm miss the cap.) The two pull apart at one place: a step that admits prompts while the draft
runs also runs the draft's prefill of them (and a longer verification), and a first token lands at
the end of the step that prefills its prompt, having waited for the step before it to end. So such
a step is played at gamma 0 when its first tokens would miss the TTFT target with the draft on and
meet it with the draft off; the bin's arm resumes at the next step, where the draft catches up on
those prompts (C_switch): the cost lands in the TPOT of the requests running, spread over their
outputs, instead of in the new requests' TTFT. A first token that meets it either way keeps the
bin's arm; one that misses either way does too, unless the step before also admitted prompts: then
a queue is draining (a burst, prompts waiting for the prefill budget), and every shorter prompt
step brings the first tokens still waiting sooner.

When the engine tells the queue (``QueueAware``: each waiting prompt's wait so far and the prompt
steps before its own), the verdict counts first tokens instead: the step is played at gamma 0 when
some prompt's first token would meet the target if this and the prompt steps before it ran without
the draft and miss it with the draft on. Under overload every waiting prompt has already missed,
no first token is saved, and the bin's arm keeps the throughput that drains the queue (the rule
above, which cannot tell overload from a burst, deferred there and fell to 0.71 of the best static
arm's goodput on the roofline's long prompts at high load; this one reaches 0.93). What it does not
see is the prompts that have not arrived yet: near saturation a shorter prompt step also shortens
the queue they will join, which the rule above captured by accident on the roofline's spec-bench
high and dynamic shapes (1.10 and 1.08; 1.00 and 0.96 here).

A step that resumes the draft pays its catch-up (C_switch: the draft prefilling what it missed while
off, whole prompts included) once, and every waiting prompt's first token waits for it. With the
queue told, such a step is priced the same way, its catch-up added to the draft-on side: played at
gamma 0 when that saves a first token, prompt step or not (the draft then resumes once the queue can
afford it). On the roofline's bursts this took 0.91 to 0.93 of the best static arm's goodput with
long prompts and 0.95 to 0.98 on spec-bench (8 traces a cell).

Without a queue the wait before the step is taken as ``attainment`` x the last step's length (the
quantile of an arrival uniform inside it that the target is for).
"""

from __future__ import annotations

from nightjar_worker.planner.policy import QueuedPrompt


class SloObjective:
    """Owns the targets and the last step's length; ``defer`` is its per-step verdict."""

    def __init__(self) -> None:
        self.ttft_s: float | None = None
        self.tpot_s: float | None = None
        self.attainment = 0.99
        self.last_step_s = 0.0  # the previous step's length, C_switch included
        self.last_decode_s = 0.0  # the last step without prompts or C_switch: the running arm's decode step
        self.last_prompted = False  # the last step admitted prompts too (back to back: a queue)
        self.queue: tuple[QueuedPrompt, ...] | None = None  # None: the engine does not tell it

    def configure(self, *, ttft_s: float | None, tpot_s: float | None, attainment: float) -> None:
        for name, v in (("slo_ttft_s", ttft_s), ("slo_tpot_s", tpot_s)):
            if v is not None and not v > 0:
                raise ValueError(f"{name}: must be > 0 (got {v})")
        if not 0 < attainment <= 1:
            raise ValueError(f"slo_attainment: must lie in (0, 1] (got {attainment})")
        self.ttft_s, self.tpot_s, self.attainment = ttft_s, tpot_s, attainment

    def observe_queue(self, queue: tuple[QueuedPrompt, ...]) -> None:
        """The prompts waiting for their first token before this step (see the module docstring)."""
        self.queue = queue

    def observe_step(self, seconds: float, prompt_tokens: int = 0, switch_s: float = 0.0) -> None:
        """A step ended, ``seconds`` long (C_switch included), with ``prompt_tokens`` prefilled."""
        self.last_step_s = seconds
        self.last_prompted = prompt_tokens > 0
        if prompt_tokens == 0 and switch_s == 0.0:
            self.last_decode_s = seconds

    def prompt_step_s(self, prompt_tokens: int, slopes: tuple[float, float], plain_s: float | None) -> tuple[float, float] | None:
        """Predicted lengths of this prompt step with the draft on (the running arm's decode step, the
        target's and the draft's prefill) and off (``plain_s``, a gamma-0 step with these prompts,
        when the bucket knows one; else the running arm's step with the target's prefill only: an
        upper bound). None before a decode step has been seen."""
        off, on = slopes
        d = self.last_decode_s
        if d <= 0.0:
            return None if plain_s is None else (plain_s + (on - off) * prompt_tokens, plain_s)
        return d + on * prompt_tokens, plain_s if plain_s is not None else d + off * prompt_tokens

    def decode_step_s(self) -> tuple[float, float] | None:
        """Predicted lengths of a step without prompts, with the draft on and off: the running
        arm's last decode step for both (the catch-up of a resume is priced apart). None before a
        decode step has been seen."""
        d = self.last_decode_s
        return (d, d) if d > 0.0 else None

    def first_token_s(self, step_s: float) -> float:
        """Predicted TTFT of a prompt prefilled in a step of ``step_s`` (its wait included)."""
        return self.attainment * self.last_step_s + step_s

    def defer(self, step_on_s: float, step_off_s: float, *, resume_s: float = 0.0, prompted: bool = True) -> bool:
        """Play this step at gamma 0 (``step_on_s`` / ``step_off_s``: its predicted length with the
        draft on / off; ``resume_s``: the catch-up it pays once when it resumes the draft;
        ``prompted``: it prefills prompts): with the queue told, when that saves a first token
        (some waiting prompt meets the target with the draft off until its prompt step and misses
        it with the draft on); without, for a prompt step only, when its first tokens miss the
        target with the draft on and meet it off, or miss it either way while a queue drains (the
        last step admitted prompts too)."""
        t = self.ttft_s
        if t is None:
            return False
        if self.queue is not None:
            return any(q.wait_s + (q.steps_ahead + 1) * step_on_s + resume_s > t >= q.wait_s + (q.steps_ahead + 1) * step_off_s
                       for q in self.queue)
        if not prompted:
            return False
        on, off = self.first_token_s(step_on_s) + resume_s, self.first_token_s(step_off_s)
        return on > t >= off or (off > t and self.last_prompted)
