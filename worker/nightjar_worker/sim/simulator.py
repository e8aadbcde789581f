"""Step-level serving simulator: continuous batching with speculative decoding under a KV budget.

Each iteration is one engine step, driven through the same contract as the real engine
(``policy.decide(batch_size, prompt_tokens)`` -> run -> ``policy.observe(StepFeedback)``):

  * arrivals (pre-generated, identical for every policy under one seed) join a FIFO queue;
  * queued requests are admitted while the batch has room (``max_batch``), the KV pool has the
    blocks for their context and the step's prefill budget (``max_prefill_tokens``) lasts; their
    prefill is merged into the step (chunked-prefill style) and produces their first token; they
    decode from the next step on;
  * the decoding requests each need KV blocks for ``context + gamma + 1`` tokens; when the pool runs
    out, the most recently admitted request is preempted (blocks freed, recomputed on re-admission,
    vLLM's default); the step's feedback then reports the smaller batch that actually ran;
  * step time is ``T(batch, gamma)`` from the profile with small multiplicative noise, plus the
    incremental cost of the merged prefill tokens;
  * each request accepts a geometric number of drafts (draft i accepted with probability alpha of its
    category, given drafts < i were) and emits accepted + 1 tokens, capped by its remaining length;
  * while gamma == 0 the draft sees none of the new tokens; when speculation resumes, the draft
    must catch up on them: C_switch = fixed + per_token * lag, reported in ``switch_cost_s``.

The draft's weights occupy ``profile.draft_blocks()`` KV blocks while resident (``kv_blocks_total``
already excludes them); a policy that never speculates runs with the draft offloaded and gets them.
Pure Python; one run of a few thousand requests takes well under a second.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from nightjar_worker.planner.policy import (
    DraftAware,
    GammaPolicy,
    QueueAware,
    QueuedPrompt,
    SourcePolicy,
    StepFeedback,
)
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.sources import DRAFT, SourceTable
from nightjar_worker.sim.workload import Request


@dataclass
class SimResult:
    policy: str
    completed: int
    output_tokens: int  # emitted inside the measurement window
    makespan_s: float  # measurement window: warm-up end (or first arrival) to the last arrival
    busy_s: float
    steps: int
    mean_token_latency_s: float  # mean over requests of (finish - arrival) / output tokens
    mean_tpot_s: float  # mean over requests of (finish - first token) / (output tokens - 1)
    switches_on: int
    switch_time_s: float
    preemptions: int
    max_blocks_used: int
    kv_budget_blocks: int
    total_tokens: int = 0  # every token emitted (all requests, warm-up included)
    gamma_steps: dict[int, int] = field(default_factory=dict)
    arm_steps: dict[str, int] = field(default_factory=dict)  # "source-gamma" (or "0") -> steps
    step_log: list[tuple[int, int]] | None = None  # (batch, gamma) per step when recorded

    offered_tokens: int = 0  # output tokens of the requests arriving inside the window
    # per measured request (arrival after the warm-up), in arrival order: what an SLO is judged on
    requests: list[RequestTiming] = field(default_factory=list)

    def slo(self, ttft_s: float | None, tpot_s: float | None) -> SloOutcome:
        """Goodput and attainment against TTFT/TPOT targets (None: that target is not set)."""
        return slo_outcome(self.requests, self.makespan_s, ttft_s, tpot_s)

    @property
    def delivered_tok_s(self) -> float:
        """Tokens emitted inside the window per second (backlog carried in or out included)."""
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def throughput_tok_s(self) -> float:
        """Delivered token rate capped at the offered rate: a policy that keeps up delivers exactly
        the offered load (backlog noise at the window's edges removed); at overload, what the
        engine delivers (its capacity)."""
        offered = self.offered_tokens / self.makespan_s if self.makespan_s > 0 else 0.0
        return min(self.delivered_tok_s, offered) if offered > 0 else self.delivered_tok_s


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One request's service: time to its first token (queueing and prefill included), time per
    output token after it, and its total latency (finish - arrival)."""

    ttft_s: float
    tpot_s: float  # 0 for a one-token answer
    latency_s: float
    output_tokens: int


@dataclass(frozen=True, slots=True)
class SloOutcome:
    goodput_tok_s: float  # output tokens of the requests meeting both targets, per second of the window
    attainment: float  # fraction of the requests meeting both
    mean_latency_s: float  # mean request latency (finish - arrival)


def slo_outcome(reqs: list[RequestTiming], window_s: float, ttft_s: float | None, tpot_s: float | None) -> SloOutcome:
    good = [r for r in reqs if (ttft_s is None or r.ttft_s <= ttft_s) and (tpot_s is None or r.tpot_s <= tpot_s)]
    n = len(reqs)
    return SloOutcome(
        goodput_tok_s=sum(r.output_tokens for r in good) / window_s if window_s > 0 else 0.0,
        attainment=len(good) / n if n else 0.0,
        mean_latency_s=sum(r.latency_s for r in reqs) / n if n else 0.0,
    )


class Simulator:
    """One profile, one request list; ``run(policy)`` simulates it to completion."""

    def __init__(
        self,
        profile: CostProfile,
        requests: list[Request],
        *,
        max_batch: int | None = None,
        noise_cv: float = 0.03,
        seed: int = 0,
        kv_blocks: int | None = None,
        record_steps: bool = False,
        max_steps: int = 10_000_000,
        max_prefill_tokens: int = 4096,
        sources: SourceTable | None = None,
        draft_resident: bool = True,
    ) -> None:
        self.profile = profile
        # where drafts come from (``sim/sources.py``): a policy's ``source()`` picks one per step
        self.sources = sources or SourceTable.draft_only()
        # False: the draft's weights are offloaded for the whole run (its arms unavailable, its
        # blocks KV cache), as the memory manager's pinned offload (bench-ngram's ``tight``)
        self.draft_resident = draft_resident
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        self.max_batch = max_batch or profile.max_batch
        self.noise_cv = noise_cv
        self.seed = seed
        self.kv_blocks = kv_blocks if kv_blocks is not None else profile.kv_blocks_total
        self.record_steps = record_steps
        self.max_steps = max_steps
        self.max_prefill_tokens = max_prefill_tokens  # per-step prefill budget (max_num_batched_tokens)
        base = profile.step_time(1, 0)
        self._prefill_cache: dict[int, float] = {}
        self._base = base

    def prefill_time(self, batch: int, tokens: int, draft_on: bool = False) -> float:
        """What merging ``tokens`` prompt tokens into a step of ``batch`` decoding requests adds to it."""
        return self._prefill_time(batch, tokens, draft_on)

    def _prefill_time(self, batch: int, tokens: int, draft_on: bool) -> float:
        """Incremental cost of merging ``tokens`` prefill tokens into a step of ``batch`` decoding
        requests: T(batch + tokens, 0) - T(batch, 0) (cheap while the step is memory-bound,
        the compute cost per token above the ridge); plus the draft's prefill when it is on."""
        if tokens <= 0:
            return 0.0
        key = (batch, tokens)
        t = self._prefill_cache.get(key)
        if t is None:
            b = max(batch, 1)
            rate = self.sources.prefill_s_per_token  # measured on the engine, where calibrated
            t = rate * tokens if rate > 0 else max(self.profile.step_time(b + tokens, 0) - self.profile.step_time(b, 0), 0.0)
            if batch == 0:
                t += self._base  # a prefill-only step still pays the fixed cost of a forward
            if len(self._prefill_cache) > 200_000:
                self._prefill_cache.clear()
            self._prefill_cache[key] = t
        if draft_on:
            t += self.profile.draft_prefill_rate() * tokens
        return t

    def _queue(self, t: float, prefilling: list[list], waiting: list[list], running: int,
               arrival: dict[int, float], limit: int = 64) -> tuple[QueuedPrompt, ...]:
        """What a ``QueueAware`` policy is told before a step: this step's prompts (0 steps ahead),
        then the waiting ones as this simulator admits them (whole prompts in FIFO order within
        ``max_prefill_tokens`` a step) while batch slots last; requests whose first token is out
        (preempted ones) take their slot and budget but are not listed."""
        out = [QueuedPrompt(t - arrival[st[0]], 0) for st in prefilling if st[6] < 0]
        seats = self.max_batch - running - len(prefilling)
        ahead, used = 1, 0
        for st in waiting:
            if seats <= 0 or len(out) >= limit:
                break
            if used and used + st[2] > self.max_prefill_tokens:
                ahead, used = ahead + 1, 0
            used += st[2]
            seats -= 1
            if st[6] < 0:
                out.append(QueuedPrompt(t - arrival[st[0]], ahead))
        return tuple(out)

    def run(self, policy: GammaPolicy, measure_from_s: float = 0.0) -> SimResult:
        """Simulate every request to completion.

        Measurement window: from ``measure_from_s`` (a warm-up before it is simulated but not
        measured) to the last arrival. Throughput = tokens emitted by steps ending inside the window
        / window length (the drain after the last arrival, run at a small batch, is excluded: it
        would otherwise dominate saturated runs), capped at the offered rate (see
        ``SimResult.throughput_tok_s``). Latencies cover the requests arriving in it."""
        prof = self.profile
        bt = prof.block_tokens
        rng = random.Random(self.seed * 7919 + 1)
        sources = self.sources
        picks_source = isinstance(policy, SourcePolicy)
        tells_queue = isinstance(policy, QueueAware) and policy.wants_queue()
        # the draft is resident when the policy may run it: a static host-source arm never does
        needs = getattr(policy, "needs_draft", None)
        needs_draft = self.draft_resident and (needs() if callable(needs) else any(g > 0 for g in policy.arms))
        if isinstance(policy, DraftAware):
            policy.set_draft_available(self.draft_resident)
        budget = self.kv_blocks + (0 if needs_draft else prof.draft_blocks())
        reqs = self.requests
        n_req = len(reqs)
        if n_req == 0:
            raise ValueError("requests: empty request list")
        for r in reqs:
            if -(-(r.prompt_tokens + r.output_tokens + 1) // bt) > budget:
                raise ValueError(
                    f"requests: request {r.rid} needs more KV blocks than the budget of {budget}"
                )
        arrival = {r.rid: r.arrival_s for r in reqs}
        # per source, per request: ln(alpha) of its category (the geometric acceptance draw)
        ln_alpha: dict[str, dict[int, float]] = {}
        for name in sources.names():
            src = sources[name]
            ln_alpha[name] = {r.rid: _ln(src.acceptance(prof, r.category)) for r in reqs}

        # Per-request mutable state: [rid, remaining, ctx, blocks, lag, ln_alpha, first_token_t]
        waiting: list[list] = []  # FIFO of states (preempted ones re-enter at the front)
        running: list[list] = []
        prefilling: list[list] = []
        finish: dict[int, tuple[float, float]] = {}
        t = 0.0
        busy = 0.0
        i_arr = 0
        free = budget
        max_used = 0
        steps = 0
        last_drafting = False
        switches_on = 0
        switch_time = 0.0
        preemptions = 0
        out_tokens = 0
        gsteps: dict[int, int] = {}
        asteps: dict[str, int] = {}
        log: list[tuple[int, int]] | None = [] if self.record_steps else None
        cv = self.noise_cv
        first_arrival = reqs[0].arrival_s
        w_lo = measure_from_s if measure_from_s > 0 else first_arrival
        w_hi = reqs[-1].arrival_s
        if w_hi <= w_lo:
            raise ValueError("measure_from_s: no request arrives after the warm-up")
        window_tokens = 0

        while len(finish) < n_req:
            while i_arr < n_req and reqs[i_arr].arrival_s <= t:
                r = reqs[i_arr]
                waiting.append([r.rid, r.output_tokens, r.prompt_tokens, 0, 0, r.rid, -1.0])
                i_arr += 1
            if not running and not waiting:
                t = reqs[i_arr].arrival_s
                continue
            steps += 1
            if steps > self.max_steps:
                raise RuntimeError("max_steps: simulation did not finish (policy stuck?)")

            # Admission (FIFO) into free batch slots and KV blocks; prefill merged into this step.
            prefill_tokens = 0
            while waiting and len(running) + len(prefilling) < self.max_batch:
                st = waiting[0]
                need = -(-(st[2] + 1) // bt)
                if need > free or (prefilling and prefill_tokens + st[2] > self.max_prefill_tokens):
                    break
                waiting.pop(0)
                free -= need
                st[3] = need
                prefill_tokens += st[2]
                prefilling.append(st)

            b = len(running)
            if tells_queue and b > 0:
                policy.observe_queue(self._queue(t, prefilling, waiting, len(running), arrival))
            g = policy.decide(b, prefill_tokens) if b > 0 else 0
            src_name = policy.source() if picks_source and g > 0 else DRAFT
            if src_name == DRAFT and g > 0 and not needs_draft:
                g = 0  # the draft is offloaded: a draft arm falls back to a plain step (the engine's clamp)
            src = sources[src_name]
            drafting = g > 0 and src.runs_draft

            # Blocks for context + gamma + 1 per decoding request; preempt the newest when short.
            if b > 0:
                need_total = 0
                for st in running:
                    extra = -(-(st[2] + g + 1) // bt) - st[3]
                    if extra > 0:
                        need_total += extra
                while need_total > free and running:
                    victim = running.pop()
                    free += victim[3]
                    extra = -(-(victim[2] + g + 1) // bt) - victim[3]
                    if extra > 0:
                        need_total -= extra
                    victim[3] = 0
                    victim[4] = 0
                    waiting.insert(0, victim)
                    preemptions += 1
                for st in running:
                    nb = -(-(st[2] + g + 1) // bt)
                    if nb > st[3]:
                        free -= nb - st[3]
                        st[3] = nb
                b = len(running)
                if b == 0:
                    g = 0
                    drafting = False
            used = budget - free
            if used > max_used:
                max_used = used

            # Switching cost when speculation resumes: the draft catches up on what it missed.
            sw = 0.0
            lag = None
            if drafting and not last_drafting and steps > 1:
                lag = sum(st[4] for st in running)
                sw = prof.switch_cost(lag)
                for st in running:
                    st[4] = 0
                switches_on += 1
                switch_time += sw

            draft_on = drafting if b > 0 else last_drafting
            step_t = 0.0
            if b > 0:
                noise = 1.0 + cv * rng.gauss(0.0, 1.0) if cv > 0 else 1.0
                step_t = src.step_time(prof, b, g) * min(max(noise, 0.5), 1.5)
            step_t += self._prefill_time(b, prefill_tokens, draft_on)

            # Tokens: geometric acceptance per request.
            emitted = 0
            accepted_total = 0
            lacks = 0  # at gamma 0: positions of running requests the draft lacks (as the engine reports)
            done: list[list] = []
            rand = rng.random
            lns = ln_alpha[src_name]
            for st in running:
                if g > 0:
                    la = lns[st[5]]
                    if la == 0.0:
                        acc = g
                    elif la == -math.inf:
                        acc = 0
                    else:
                        u = rand()
                        acc = g if u <= 0.0 else min(g, int(math.log(u) / la))
                    accepted_total += acc
                    e = acc + 1
                else:
                    e = 1
                if e > st[1]:
                    e = st[1]
                st[1] -= e
                st[2] += e
                if not drafting:  # the draft misses what it does not run for (n-gram steps too)
                    lacks += st[4]
                    st[4] += e
                emitted += e
                if st[1] <= 0:
                    done.append(st)
            t_end = t + step_t + sw
            for st in prefilling:
                # prefill emits the first token; the draft misses the prompt while it is off
                st[1] -= 1
                st[2] += 1
                if not draft_on:
                    st[4] += st[2]
                if st[6] < 0:
                    st[6] = t_end
                emitted += 1
                if st[1] <= 0:
                    done.append(st)
                else:
                    running.append(st)
            prefilling = []
            out_tokens += emitted
            if w_lo < t_end <= w_hi:
                window_tokens += emitted
            busy += step_t + sw
            t = t_end

            if b > 0:
                policy.observe(
                    StepFeedback(
                        batch_size=b,
                        gamma=g,
                        step_time_s=step_t,
                        tokens_emitted=emitted,
                        num_draft_tokens=b * g,
                        num_accepted_tokens=accepted_total,
                        switch_cost_s=sw,
                        prefill_tokens=prefill_tokens,
                        catchup_tokens=lag,
                        draft_lag_tokens=lacks if not drafting else None,
                        source=src_name if g > 0 else DRAFT,
                    )
                )
                gsteps[g] = gsteps.get(g, 0) + 1
                arm = f"{src_name}-{g}" if g > 0 else "0"
                asteps[arm] = asteps.get(arm, 0) + 1
                if log is not None:
                    log.append((b, g))
                last_drafting = drafting
            if done:
                ids = {id(st) for st in done}
                running = [st for st in running if id(st) not in ids]
                for st in done:
                    free += st[3]
                    finish[st[0]] = (t, st[6])

        lat = []
        tpot = []
        timings: list[RequestTiming] = []
        offered = 0
        for r in reqs:
            if r.arrival_s < measure_from_s:
                continue
            if r.arrival_s > w_lo:
                offered += r.output_tokens
            f, first = finish[r.rid]
            lat.append((f - r.arrival_s) / r.output_tokens)
            per = (f - first) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
            if r.output_tokens > 1:
                tpot.append(per)
            timings.append(RequestTiming(first - r.arrival_s, per, f - r.arrival_s, r.output_tokens))
        if not lat:
            raise ValueError("measure_from_s: no request arrives after the warm-up")
        return SimResult(
            policy=getattr(policy, "name", type(policy).__name__),
            completed=len(finish),
            output_tokens=window_tokens,
            makespan_s=w_hi - w_lo,
            busy_s=busy,
            steps=steps,
            mean_token_latency_s=sum(lat) / len(lat),
            mean_tpot_s=sum(tpot) / len(tpot) if tpot else 0.0,
            switches_on=switches_on,
            switch_time_s=switch_time,
            preemptions=preemptions,
            max_blocks_used=max_used,
            kv_budget_blocks=budget,
            total_tokens=out_tokens,
            offered_tokens=offered,
            gamma_steps=gsteps,
            arm_steps=asteps,
            step_log=log,
            requests=timings,
        )


def _ln(alpha: float) -> float:
    return math.log(alpha) if 0 < alpha < 1 else (0.0 if alpha >= 1 else -math.inf)
