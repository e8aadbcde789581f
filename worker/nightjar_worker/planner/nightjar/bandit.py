"""Nightjar's planner: the composition of the estimators in this package. See the package docstring."""

from __future__ import annotations

import random
from dataclasses import dataclass

from nightjar_contract.planner import PlannerConfig, PlannerPriors, PriorEntry, bucket_index

from nightjar_worker.planner.nightjar.arms import ArmSet
from nightjar_worker.planner.nightjar.estimates import Estimator
from nightjar_worker.planner.nightjar.excursions import Excursions
from nightjar_worker.planner.nightjar.explore import (
    MIN_ELIMINATE,
    Candidates,
    PrunedExplorer,
    UniformExplorer,
    unknown_source,
)
from nightjar_worker.planner.nightjar.flips import FlipPricer
from nightjar_worker.planner.nightjar.gate import AcceptanceGate
from nightjar_worker.planner.nightjar.objective import SloObjective
from nightjar_worker.planner.nightjar.prefill import PrefillCost
from nightjar_worker.planner.nightjar.schedule import Schedule
from nightjar_worker.planner.nightjar.switching import Dwell, PaperSwitchCost, Pipeline, SwitchCost
from nightjar_worker.planner.policy import SOURCES, PlannerStats, QueuedPrompt, StepFeedback


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """What separates the paper's algorithm from Nightjar's, fixed when the policy is built
    (``paper_mode`` is a rebuild field). The extensions that are run-time knobs are turned off
    for the paper in ``_PAPER_OFF``."""

    switch_cost: type[SwitchCost]  # learnt apart from the losses, or folded into the switching step
    pruned_exploration: bool  # PrunedExplorer, or the paper's uniform draw
    ratio_of_sums: bool  # loss per token as total time / total tokens, or the mean of per-step ratios
    detect_fill: bool  # a step raising gamma is a pipeline fill (its excess belongs to the switch)
    guard_flips: bool  # a held arm that would flip speculation must still win with C_switch charged
    warm_schedule: bool  # priors move a bucket's exploration schedule on


NIGHTJAR = Scheme(switch_cost=SwitchCost, pruned_exploration=True, ratio_of_sums=True, detect_fill=True,
                  guard_flips=True, warm_schedule=True)
PAPER = Scheme(switch_cost=PaperSwitchCost, pruned_exploration=False, ratio_of_sums=False, detect_fill=False,
               guard_flips=False, warm_schedule=False)
_PAPER_OFF = {"share_neighbours": False, "eliminate": False, "monotone_prior": False, "hysteresis": 0.0,
              "normalise_batch": False, "growing_window": False, "prefill_correction": False, "pool_yield": False,
              "source_model": False,
              "min_acceptance": 0.0}


class NightjarPolicy:
    """Contextual bandit over batch-size buckets (``GammaPolicy`` and ``PlannerView``).

    It composes the parts: ``decide`` asks them (the bucket's schedule, then the estimates, the
    flip pricing and the explorer at a new bin), ``observe`` hands them the step record. Each part
    owns its state; the policy keeps only the last decision and its own counters."""

    name = "nightjar"

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self.armset = ArmSet.build(config.resolved_arms(), config.host_arms())
        self._arms = self.armset.gamma  # gamma per arm index
        self._edges = config.edges()
        self._lut = [bucket_index(self._edges, max(b, 1)) for b in range(config.max_batch + 1)]
        self.scheme = PAPER if config.paper_mode else NIGHTJAR
        nb, amort = len(self._edges), config.switch_amortise_steps
        rng = random.Random(config.seed)
        self.rng = rng
        self.schedules = [Schedule() for _ in self._edges]
        # each prices the draft's prefill from the other's evidence until it has its own
        self.switch = self.scheme.switch_cost(nb, prefill_rate=lambda: self.prefill.exported_draft_slope())
        self.prefill = PrefillCost(amortise=True, catchup_rate=self.switch.catchup_rate)
        self.estimator = Estimator(self._edges, self.armset, self.prefill)
        self.pipeline = Pipeline(detect=self.scheme.detect_fill)
        self.dwell = Dwell(float(amort))
        self.excursions = Excursions(nb, float(amort))
        self.flips = FlipPricer(self.estimator, self.switch, self.dwell, self.excursions, amort)
        # acceptance is a property of the source (and the content): one gate each
        self.gates = {src: AcceptanceGate() for src in SOURCES}
        self.gate = self.gates["draft"]
        self.explorer: PrunedExplorer | UniformExplorer = (
            PrunedExplorer(rng, self.armset, self.estimator, self.schedules, self.flips)
            if self.scheme.pruned_exploration else UniformExplorer(rng)
        )
        self.current_gamma = 0  # the last decision: the engine's speculation state
        self.current_source = "draft"
        self.draft_available = True  # False while the draft's weights are not resident
        self.objective = SloObjective()  # TTFT/TPOT targets: goodput, not time per token
        self._resume = False  # the last step deferred its prompts' draft prefill: resume unguarded
        # per bucket, the draft gamma its last bin would have exploited were the draft resident
        self._draft_wish = [0] * len(self._edges)
        self.stats = PlannerStats()
        self._apply_knobs(config)

    # -- configuration ---------------------------------------------------------------------
    def _apply_knobs(self, config: PlannerConfig) -> None:
        k = config.model_copy(update=_PAPER_OFF) if config.paper_mode else config
        self._hyst = k.hysteresis
        self.objective.configure(ttft_s=k.slo_ttft_s, tpot_s=k.slo_tpot_s, attainment=k.slo_attainment)
        self.estimator.configure(correct_prefill=k.prefill_correction, share=k.share_neighbours,
                                 share_weight=k.share_weight, normalise=k.normalise_batch, discount=k.discount,
                                 growing_window=k.growing_window, ratio_of_sums=self.scheme.ratio_of_sums,
                                 pool_yield=k.pool_yield, source_model=k.source_model)
        self.prefill.configure(amortise=k.prefill_correction and k.amortise_draft_prefill)
        self._step_price = self.prefill.amortise and k.step_prefill_price
        for gate in self.gates.values():
            gate.configure(min_acceptance=k.min_acceptance, min_tokens=k.acceptance_gate_tokens,
                           halflife_steps=k.acceptance_halflife_steps, z=k.confidence_z)
        self.switch.configure(override=k.switch_cost_s)
        self.flips.configure(amortise_steps=k.switch_amortise_steps)
        self.explorer.configure(monotone=k.monotone_prior, eliminate=k.eliminate, z=k.confidence_z,
                                source_first=k.source_first)

    def apply_config(self, config: PlannerConfig) -> None:
        """Runtime update of the exploration knobs, SLO and switch-cost override (same arms, buckets
        and scheme: those rebuild the policy)."""
        if ArmSet.build(config.resolved_arms(), config.host_arms()) != self.armset or config.edges() != self._edges:
            raise ValueError("arms/bucket_edges: cannot change at run time; restart the planner")
        if config.paper_mode != self.config.paper_mode:
            raise ValueError("paper_mode: a different algorithm; rebuild the policy")
        self.config = config
        self._apply_knobs(config)

    def set_slo(self, tpot_s: float | None, ttft_s: float | None = None, attainment: float | None = None) -> None:
        """TPOT target (seconds per output token per request) the chosen arm must meet when it can;
        with a TTFT target too, goodput is the objective (``objective.py``)."""
        self.objective.configure(ttft_s=ttft_s, tpot_s=tpot_s,
                                 attainment=self.objective.attainment if attainment is None else attainment)
        self._end_bins()

    def set_priors(self, priors: PlannerPriors) -> None:
        """Replace the priors (see ``priors.py``). Priors are established evidence, not a cold-start
        transient: only the steady-state ``discount`` erodes them, and a bucket's exploration
        schedule moves on as if its prior observations had happened."""
        self.estimator.load_priors(priors, self.config.prior_max_count)
        self.prefill.set_prior_slope(priors.draft_prefill_s_per_token)
        if self.scheme.warm_schedule:
            for c, sc in enumerate(self.schedules):
                steps = self.estimator.prior_steps(c)
                if steps is not None:
                    sc.advance(steps - sc.handed_out, self.config.max_block_exp)
        self._end_bins()

    def _end_bins(self) -> None:
        for sc in self.schedules:
            sc.end_bin()  # re-decide at the next step
    @property
    def arms(self) -> tuple[int, ...]:
        return self.armset.gammas()

    def source(self) -> str:
        """The source of the last decision's drafts (``SourcePolicy``)."""
        return self.current_source

    def set_draft_available(self, available: bool) -> None:
        """Whether the draft model can run (its weights resident): while not, no arm that runs it
        is played (n-gram arms still are)."""
        if available != self.draft_available:
            self.draft_available = available
            self._end_bins()

    def wants_queue(self) -> bool:
        """Only a TTFT target prices the queue (``QueueAware``)."""
        return self.objective.ttft_s is not None

    def observe_queue(self, queue: tuple[QueuedPrompt, ...]) -> None:
        """The prompts waiting for their first token before the next ``decide`` (``QueueAware``)."""
        self.objective.observe_queue(queue)

    def draft_demand(self, batch_size: int) -> int:
        """While the draft cannot run: the draft gamma this bucket's last bin would have exploited
        had it been resident (C_switch of resuming included; 0: it would not), what brings the
        draft back. 0 while the draft is resident (the chosen arm says it)."""
        return 0 if self.draft_available else self._draft_wish[self.bucket(batch_size)]

    def _drafting_now(self) -> bool:
        return self.current_gamma > 0 and self.current_source == "draft"

    @property
    def slo_tpot_s(self) -> float | None:
        """The TPOT target in force (``set_slo`` or the config's)."""
        return self.objective.tpot_s

    # -- step contract -----------------------------------------------------------------------
    def bucket(self, batch_size: int) -> int:
        lut = self._lut
        return lut[batch_size] if 0 <= batch_size < len(lut) else lut[-1]

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        c = self.bucket(batch_size)
        sc = self.schedules[c]
        held = sc.held()
        a = self._new_bin(c) if held is None else held
        drafting = self.armset.drafting
        on_now = self._drafting_now()
        if drafting[a] != on_now and self.scheme.guard_flips and not (self._resume and drafting[a]):
            a = self._guard_flip(c, a, prompt_tokens)
        elif drafting[a] and on_now and prompt_tokens > 0 and self._step_price and not sc.exploring:
            a = self._tie_at_prompt_step(c, a, prompt_tokens)
        self._resume = False
        if drafting[a] and self.objective.ttft_s is not None and (prompt_tokens > 0 or not on_now):
            a = self._defer_for_ttft(c, a, batch_size, prompt_tokens, on_now)
        g = self._arms[a]
        st = self.stats
        st.decisions += 1
        flipped = drafting[a] != on_now  # the draft model starts or stops running
        if flipped:
            if drafting[a]:
                st.switches_on += 1
            else:
                st.switches_off += 1
        self.dwell.step(flipped, on_now)
        self.current_gamma, self.current_source = g, self.armset.source[a]
        return g

    def observe(self, feedback: StepFeedback) -> None:
        fb = feedback
        c = self.bucket(fb.batch_size)
        self.excursions.step(c)
        fill = self.pipeline.step(fb)
        excess = self.estimator.fill_excess(c, fb) if fill.resumes_draft else None
        self.switch.observe(fb, c, excess)
        if self.switch.ema is not None:
            self.stats.switch_cost_s_ema = self.switch.ema
        self.gates[fb.verified_source].observe(fb.num_draft_tokens, fb.num_accepted_tokens)
        self.prefill.observe_workload(fb.prefill_tokens, fb.tokens_emitted)
        i = self.armset.of(fb.source, fb.gamma)
        self.objective.observe_step(fb.step_time_s + fb.switch_cost_s, fb.prefill_tokens, fb.switch_cost_s)
        if i is None or fill.is_fill:
            return
        t = fb.step_time_s
        if self.switch.charged_to_step:
            t += fb.switch_cost_s
        self.estimator.observe(c, i, fb, t)

    # -- a new bin -------------------------------------------------------------------------------
    def _candidates(self, c: int) -> list[int]:
        """The arms a bin may play: all (a TPOT target needs no filter: ``objective.py``) but gamma > 0
        while the acceptance gate is closed (neither explored nor exploited: a bucket whose only
        evidence is one lucky step would otherwise keep speculating)."""
        cand = list(range(len(self._arms)))
        g, src = self._arms, self.armset.source
        closed = {s for s, gate in self.gates.items() if gate.closed()}
        if closed:
            cand = [i for i in cand if g[i] == 0 or src[i] not in closed] or cand
        return cand

    def _new_bin(self, c: int) -> int:
        cfg = self.config
        st = self.stats
        st.bins += 1
        v = self.estimator.reconcile_priors(c, cfg.confidence_z)
        if v is not None:
            st.prior_rescales += v.rescaled
            st.priors_dropped += v.dropped
            if v.forgotten:  # the warm start is void: every bucket explores as a cold one
                self.schedules[:] = [Schedule() for _ in self.schedules]
        sc = self.schedules[c]
        left = sc.next_bin(cfg.max_block_exp) - 1  # steps after this one
        exploring = False
        means, counts = self.estimator.estimates(c)
        self.flips.note_gain(c, means)
        cand = self._candidates(c)
        on_now = self._drafting_now()
        eff = [(m + self.flips.penalty(c, i, on_now)) if m is not None else None for i, m in enumerate(means)]
        if not self.draft_available:  # what the draft's return would be for, then what can run now
            wishes = _known(eff, cand)
            wish = min(wishes, key=wishes.__getitem__, default=-1)
            self._draft_wish[c] = self._arms[wish] if wish >= 0 and self.armset.drafting[wish] else 0
            cand = [i for i in cand if not self.armset.drafting[i]] or cand
        known = _known(eff, cand)
        best = -1
        if known:
            best = min(known, key=known.__getitem__)
            cur = self.armset.of(self.current_source, self.current_gamma)
            if self._hyst > 0 and cur is not None and cur in known and cur != best:
                if known[best] > known[cur] * (1.0 - self._hyst):
                    best = cur
            sc.note_best(best)
        choice = best
        pred = self.estimator.predictions(c)  # the source model's (None when off)
        if (best < 0 or unknown_source(self.armset, cand, means, pred)
                or self.rng.random() < sc.explore_probability(cfg.explore_scale, cfg.explore_floor)):
            bound = self.estimator.predictions(c, optimistic=True) if pred is not None else None
            if pred is not None and bound is not None:
                pred, bound = ([(m + self.flips.penalty(c, i, on_now)) if m is not None else None for i, m in enumerate(x)]
                               for x in (pred, bound))
            k = Candidates(c=c, cand=cand, means=means, counts=counts, eff=eff, best=best, pred=pred, bound=bound)
            # a TPOT target ranks arms as their losses do (``objective.py``): the best gamma still
            # does not grow with the batch, so the monotone prior holds under an SLO too
            pick = self.explorer.choose(k, on_now)
            if pick is not None:
                choice = pick
                if choice != best:
                    st.explore_bins += 1
                    exploring = True
                    raising = self._arms[choice] > self.current_gamma or (
                        self._arms[choice] > 0 and self.armset.source[choice] != self.current_source)
                    left = self.explorer.hold(k, choice, left, raising)
        if choice < 0:
            choice = self.rng.choice(cand)
        sc.hold(choice, left, exploring)
        return choice

    # -- flips at a step ----------------------------------------------------------------------------
    def _guard_flip(self, c: int, a: int, prompt_tokens: int) -> int:
        """The held arm would turn speculation on/off (e.g. the batch crossed into a bucket whose bin
        was decided while the engine was in the other state): keep the current on/off state unless
        the held arm still wins with the switching cost charged."""
        means, counts = self.estimator.estimates(c)
        on_now = self._drafting_now()
        if self._step_price and on_now:
            means = self.estimator.priced_at_step(c, means, prompt_tokens)
        same = _known(means, [i for i in self._candidates(c) if self.armset.drafting[i] == on_now
                              and (self.draft_available or not self.armset.drafting[i])])
        if not same:
            return a
        alt = min(same, key=same.__getitem__)
        # barely known (e.g. an exploration bin): optimistic, only the switching cost can veto it
        m_a = means[a]
        mine = m_a if m_a is not None and counts[a] >= MIN_ELIMINATE else 0.5 * same[alt]
        sc = self.schedules[c]
        hold = sc.left + 1
        horizon, off = (self.flips.visit(hold), hold) if sc.exploring else (None, None)
        if mine + self.flips.penalty(c, a, on_now, horizon, off) < same[alt]:
            return a
        sc.replace_arm(alt)  # for the rest of this bin
        return alt

    def _tie_at_prompt_step(self, c: int, a: int, prompt_tokens: int) -> int:
        """The draft is on, the bin exploits a gamma > 0 arm, and this step brings prompts: if gamma 0
        is within the hysteresis margin of that arm (the bandit cannot tell them apart), the step's
        own price decides, as for a turn-off (``Estimator.priced_at_step``). Beyond a tie the bucket's
        preference stands: turning off there would be undone at the next step, with a catch-up of
        the same prompts plus a fill step."""
        i0 = self.armset.of("draft", 0)
        if i0 is None:
            return a
        means, _ = self.estimator.estimates(c)
        m0, ma = means[i0], means[a]
        if m0 is None or ma is None or m0 > ma * (1.0 + self._hyst) or i0 not in self._candidates(c):
            return a
        step = self.estimator.priced_at_step(c, means, prompt_tokens)
        s0, s_a = step[i0], step[a]  # known: their means are
        if s0 is not None and s_a is not None and s0 + self.flips.penalty(c, i0, True) < s_a:
            self.schedules[c].replace_arm(i0)  # for the rest of this bin
            return i0
        return a

    def _defer_for_ttft(self, c: int, a: int, batch_size: int, prompt_tokens: int, on_now: bool) -> int:
        """The TTFT target: play this step at gamma 0 when that saves a first token
        (``SloObjective.defer``): a prompt step, whose draft prefill the first tokens wait for, and
        a step that would resume the draft, whose catch-up (C_switch) every waiting prompt waits
        for. The bin's arm resumes at the next step, unguarded."""
        i0 = self.armset.of("draft", 0)
        ob = self.objective
        if prompt_tokens > 0:
            plain = self.estimator.plain_step_time(c, batch_size, prompt_tokens)
            steps = ob.prompt_step_s(prompt_tokens, self.prefill.slopes(), plain)
        else:
            steps = ob.decode_step_s()
        resume_s = 0.0 if on_now else self.switch.now(c)
        if i0 is None or steps is None or not ob.defer(*steps, resume_s=resume_s, prompted=prompt_tokens > 0):
            return a
        self.stats.ttft_deferrals += 1
        self._resume = True
        return i0

    # -- PlannerView ---------------------------------------------------------------------------------
    def speculation_gain_s(self, batch_size: int) -> float | None:
        """Seconds a step at ``batch_size`` saves by speculating (its bucket's best drafting arm
        against gamma 0, at the bucket's last bin; negative when speculation loses); None until
        both have estimates."""
        c = self.bucket(batch_size)
        gain = self.flips.gain(c)
        return None if gain is None else self.estimator.step_seconds(c, batch_size, gain)

    def switch_cost_s(self, batch_size: int) -> float:
        """Expected C_switch of resuming speculation now at ``batch_size``."""
        return self.switch.now(self.bucket(batch_size))

    def acceptance_gate_closed(self) -> bool:
        return self.gate.closed()

    def draft_prefill_per_token(self) -> float:
        """Seconds per generated token charged to gamma > 0 for the running draft's prefill."""
        return self.prefill.per_generated_token()

    def estimates(self, batch_size: int) -> dict[tuple[str, int], float | None]:
        """(source, gamma) -> smoothed mean loss (seconds per token, in the bucket's units) at this batch."""
        means, _ = self.estimator.estimates(self.bucket(batch_size))
        return dict(zip(self.armset.keys, means, strict=True))

    def snapshot(self) -> PlannerPriors:
        """Own evidence (priors included, neighbours not) per (bucket_lo, gamma, source) of every
        arm, host sources' included (gamma 0 is the draft's key): mean loss and count. The result is
        a valid ``PlannerPriors``, so a fleet can average snapshots and push them back."""
        entries = []
        for c, lo in enumerate(self._edges):
            for i, (src, g) in enumerate(self.armset.keys):
                m = self.estimator.own_mean(c, i)
                if m is not None and m > 0:
                    entries.append(PriorEntry(bucket_lo=lo, gamma=g, mean_loss_s=m,
                                              count=self.estimator.own_count(c, i), source=src))
        return PlannerPriors(bucket_edges=list(self._edges), entries=entries,
                             draft_prefill_s_per_token=self.prefill.exported_draft_slope())


def _known(values: list[float | None], arms: list[int]) -> dict[int, float]:
    """The arms among ``arms`` whose value is known, in order, with it."""
    return {i: v for i in arms if (v := values[i]) is not None}
