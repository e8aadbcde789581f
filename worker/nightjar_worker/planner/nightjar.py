"""Nightjar's planner: a contextual bandit choosing gamma per decoding step.

Context = batch-size bucket; arms = gamma values; loss = step latency per generated token.

Exploration follows the paper's hierarchical scheme, per bucket: the steps that fall in a bucket
form blocks of 2^(b-1) steps, each split into bins of about sqrt(block length) steps; a bin is an
exploration bin with probability min(1, explore_scale / sqrt(bin index)); the arm is held fixed for
the whole bin (no thrashing); an exploitation bin plays the arm with the best smoothed mean.

Switching cost: resuming speculation (gamma 0 -> k) makes the engine rebuild the draft's KV cache
(C_switch, reported in ``StepFeedback.switch_cost_s``). It is charged to the decision that changes
speculation on/off, amortised over ``switch_amortise_steps`` steps of the new arm.

Beyond the paper (each switchable for the ablation; ``paper_mode=True`` turns all of them off):
  * ``share_neighbours``: an arm seldom tried in one bucket borrows evidence from the neighbouring
    buckets, rescaled by the loss ratio of an arm both have tried (per-token loss scales with batch);
  * ``eliminate``: exploration bins only play arms whose confidence interval still overlaps the
    best arm's (successive elimination inside the paper's schedule), least-tried first;
  * ``monotone_prior``: the best gamma does not grow with batch size, so exploration in a bucket is
    confined between the best arms of established neighbours on either side;
  * ``hysteresis``: a challenger must beat the arm in use by a relative margin;
  * C_switch is learnt separately from the arms' step losses, as fixed + rate * tokens the draft
    missed while off (least squares over observed switches) plus the bucket's pipeline-fill excess
    (learnt per bucket: it grows with the batch, not with the missed tokens), and charged to the
    decision that flips speculation on/off, amortised over the dwell (exploitation) or the visit (exploration);
    a turn-off's dwell is how long the context stays above the batch where resuming pays (the
    context's own excursions), not only the off-runs of the policy as it stands, which under a
    mostly-on policy are short and priced a profitable turn-off out;
    the paper instead folds it into the loss of the switching step, which makes that arm look
    bad in whichever bucket happened to switch;
  * ``normalise_batch``: the loss is learnt as loss * batch / bucket_lo (per-token loss falls like
    1/batch in the memory-bound regime, which otherwise confounds arms held at different batch sizes
    inside one bucket); ``snapshot``/priors use these normalised units (loss at the bucket's lower
    edge);
  * ``prefill_correction``: the target's work on prompt tokens prefilled in the same step
    (``StepFeedback.prefill_tokens``) costs the same whatever gamma is; its learnt per-token cost
    (from draft-off steps) is subtracted, otherwise arms that emit more tokens look better merely by
    amortising someone else's prefill. The running draft's own prefill stays in the gamma > 0 loss;
  * ``amortise_draft_prefill``: how the draft's prefill is charged. A prompt is prefilled in one
    step, so with the draft on that step carries the draft's prefill of every prompt admitted (on the
    Qwen CPU pair a 260-token wave is a 7 s step, 2 s more with the draft on), and the lump would land
    in whichever arm that step's bin played. Instead each step's own state's prefill slope (draft
    off / on) is taken out, and every gamma > 0 arm is charged the draft's learnt extra seconds per
    prompt token times the workload's prompt tokens per generated token (pooled over all steps):
    the long-run price of keeping the draft on, which a decode-only estimate misses (on the Qwen CPU
    trace it is most of what static speculation lost to no-SD). Until both states have seen prompts,
    the priors' slope stands in, else the catch-up line's per-token rate. ``snapshot`` exports the
    decode-only losses and the slope: priors are per pair and device, the prompt/output ratio is
    each worker's own workload;
  * ``step_prefill_price``: the mean price chooses a bucket's arm; the step at which to turn the
    draft off is chosen at the step's own prompt tokens (``decide``'s ``prompt_tokens``), which
    staying on would have the draft prefill now (``_priced_at_step``): when the held arm would turn
    it off, and when a held gamma > 0 arm ties with gamma 0 (``_tie_at_prompt_step``);
  * acceptance gate (``min_acceptance``): acceptance is a property of the draft and the content, not
    of the batch size, so it is pooled over all buckets; once its upper confidence bound is below
    ``min_acceptance`` no bucket plays gamma > 0, exploring or exploiting (a draft that is almost
    never accepted cannot pay, whatever the batch). The pooled counts decay
    (``acceptance_halflife_steps``), so the gate re-opens now and then and a change of content is
    noticed.

Evidence is discounted per observation (``discount``) so the planner tracks drifting acceptance.

Step contract: see ``policy.py``. ``decide`` is O(1) on the common path (inside a bin).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from nightjar_worker.planner.config import PlannerConfig, PlannerPriors, PriorEntry, bucket_index
from nightjar_worker.planner.policy import StepFeedback

_DEFAULT_CV = 0.3  # relative noise assumed before a bucket has its own estimate
_ESTABLISHED = 32.0  # effective observations before a bucket's best arm constrains its neighbours
_MIN_ELIMINATE = 4.0  # an arm is never ruled out on fewer (effective) observations
_LAG_DECAY = 1.0 - 1.0 / 256
_MAX_DWELL = 1024  # cap on the amortisation horizon of a flip (steps)
_EXC_RATE = 0.1  # moving-mean rate of the context's excursion lengths
_MIN_REGRESSION = 20  # prefill-slope samples before a draft-on/off specific slope is trusted
_MIN_PREFILL_STEPS = 3  # steps with prompt tokens, per draft state, before the draft's prefill cost is learnt
_RHO_DECAY = 1.0 - 1.0 / 2048  # prompt/generated token sums (the workload's mix: slow to change)


def _less_prefill(loss_sum: float, prompt_tokens: float, slope: float) -> float:
    """A loss sum less its prompt tokens' learnt prefill cost, floored at 5 % so a slope fitted
    too steep never makes an arm look free."""
    return max(loss_sum - slope * prompt_tokens, 0.05 * loss_sum)


@dataclass
class NightjarStats:
    """Plain counters for metrics."""

    decisions: int = 0
    bins: int = 0
    explore_bins: int = 0
    switches_on: int = 0
    switches_off: int = 0
    switch_cost_s_ema: float = 0.0
    priors_dropped: int = 0  # prior entries dropped for contradicting the arm's own evidence
    prior_rescales: int = 0  # buckets' priors rescaled to the level of this worker's evidence


class NightjarPolicy:
    """Contextual bandit over batch-size buckets. See the module docstring."""

    name = "nightjar"

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._arms = config.resolved_arms()
        self._arm_idx = {g: i for i, g in enumerate(self._arms)}
        self._edges = config.edges()
        self._rng = random.Random(config.seed)
        nb, na = len(self._edges), len(self._arms)
        self._lut = [bucket_index(self._edges, max(b, 1)) for b in range(config.max_batch + 1)]
        # Discounted sufficient statistics per bucket and arm, stored scaled by self._w[c] (each new
        # observation enters with weight w, then w /= discount), so discounting is O(1).
        self._w = [1.0] * nb
        self._t = [0] * nb  # observations per bucket
        self._raw = [[0] * na for _ in range(nb)]  # undiscounted observations per bucket and arm
        self._n = [[0.0] * na for _ in range(nb)]
        self._s = [[0.0] * na for _ in range(nb)]
        # noise of the per-token mean (a ratio of sums, time / tokens): sums of a, a^2, a*b, b^2 with
        # a = the step's loss x its tokens, b = its tokens
        self._sa = [[0.0] * na for _ in range(nb)]
        self._saa = [[0.0] * na for _ in range(nb)]
        self._sab = [[0.0] * na for _ in range(nb)]
        self._sbb = [[0.0] * na for _ in range(nb)]
        self._tok = [[0.0] * na for _ in range(nb)]
        self._tpot = [[0.0] * na for _ in range(nb)]
        # Prefill correction: prompt tokens per generated token (batch-normalised) times the count,
        # like _s, and a pooled within-cell regression of step time on prefill tokens (slope =
        # seconds per prompt token).
        self._sp = [[0.0] * na for _ in range(nb)]
        self._st = [[0.0] * na for _ in range(nb)]  # sums of step time and prefill tokens (normalised),
        self._spt = [[0.0] * na for _ in range(nb)]  # whose ratios to _tok give _s / n and _sp / n
        self._mp: list[list[float | None]] = [[None] * na for _ in range(nb)]
        self._mt = [[0.0] * na for _ in range(nb)]
        # separately with the draft off (arm 0) and on: a resident, running draft prefills too
        self._sxy = [0.0, 0.0]
        self._sxx = [0.0, 0.0]
        self._betas = [0.0, 0.0]
        self._nreg = [0, 0]  # regression samples per state
        self._npre = [0, 0]  # of which carried prompt tokens
        self._rho = [0.0, 0.0]  # decaying sums of prompt tokens and generated tokens, all steps
        self._prior_dps: float | None = None  # the priors' draft prefill seconds per prompt token
        self._bmean = [float(e) for e in self._edges]  # moving mean batch size per bucket
        self._pn = [[0.0] * na for _ in range(nb)]  # priors (same scaling)
        self._ps = [[0.0] * na for _ in range(nb)]
        self._has_prior = [False] * nb
        # priors dropped for conflict, per bucket: arm -> (prior mean, count), to recognise a level shift
        self._dropped: list[dict[int, tuple[float, float]]] = [{} for _ in range(nb)]
        self._sched = [0] * nb  # steps the bucket's block/bin schedule has handed out
        # Hierarchical schedule per bucket.
        self._block_exp = [0] * nb
        self._block_left = [0] * nb
        self._bin_size = [1] * nb
        self._bin_left = [0] * nb
        self._bin_idx = [0] * nb
        self._arm = [0] * nb  # arm index held in the current bin
        self._exploring = [False] * nb  # whether the current bin explores
        self._best = [-1] * nb  # cached exploit arm index (for the monotone prior)
        self._last_gamma = 0
        self._prev_gamma = 0  # gamma of the last observed step (pipeline fill detection)
        self._run = 0  # steps since speculation last flipped on/off
        # moving mean length of the runs with speculation off [0] and on [1]: how long a flip into
        # that state is expected to last, the horizon over which its C_switch amortises
        self._dwell = [float(config.switch_amortise_steps)] * 2
        # The context's own excursions, per bucket: moving mean length of its runs at or above the
        # bucket [0] and at or below it [1]. The draft, once off, stays off until the context falls
        # to a bucket where resuming pays: a turn-off's run is an excursion above that bucket, and
        # a resume there amortises over the stay below (_off_run). The policy's own runs (_dwell)
        # only say what its current choices produce: short off-runs under a mostly-on policy.
        self._ctx = -1  # bucket of the last observed step
        self._steps = 0  # observed steps
        self._exc_start = [[0] * nb, [0] * nb]
        self._exc = [[float(config.switch_amortise_steps)] * nb for _ in range(2)]
        # per bucket, gamma 0's mean less the best drafting arm's at its last bin (bucket units)
        self._on_gain: list[float | None] = [None] * nb
        self._switch_ema: float | None = None
        self._sw = [0.0] * 5  # catch-up regression sums: n, x, y, xx, xy (x = missed tokens)
        self._fill_cost: list[float | None] = [None] * nb  # pipeline-fill excess on resume, per bucket
        self._off_tokens = 0.0  # tokens emitted/prefilled since speculation went off
        self._drafted = 0.0  # draft tokens verified, all buckets (decaying: see acceptance gate)
        self._accepted = 0.0
        self.stats = NightjarStats()
        self._apply_knobs(config)

    # -- configuration ---------------------------------------------------------------------
    def _apply_knobs(self, c: PlannerConfig) -> None:
        paper = c.paper_mode
        self._share = c.share_neighbours and not paper
        self._elim = c.eliminate and not paper
        self._mono = c.monotone_prior and not paper
        self._hyst = 0.0 if paper else c.hysteresis
        self._paper = paper
        self._slo = c.slo_tpot_s
        self._d = c.discount
        self._max_exp = c.max_block_exp
        self._norm = c.normalise_batch and not paper
        self._grow = c.growing_window and not paper
        self._prefill = c.prefill_correction and not paper
        self._amortise = self._prefill and c.amortise_draft_prefill
        self._step_price = self._amortise and c.step_prefill_price
        self._gate = c.min_acceptance if not paper else 0.0
        self._acc_decay = 0.5 ** (1.0 / c.acceptance_halflife_steps)

    def apply_config(self, config: PlannerConfig) -> None:
        """Runtime update of the exploration knobs, SLO and switch-cost override (same arms/buckets)."""
        if config.resolved_arms() != self._arms or config.edges() != self._edges:
            raise ValueError("arms/bucket_edges: cannot change at run time; restart the planner")
        self.config = config
        self._apply_knobs(config)

    def set_slo(self, tpot_s: float | None) -> None:
        """TPOT target (seconds per output token per request) the chosen arm must meet when it can."""
        if tpot_s is not None and not tpot_s > 0:
            raise ValueError(f"slo_tpot_s: must be > 0 (got {tpot_s})")
        self._slo = tpot_s
        self._bin_left = [0] * len(self._edges)  # re-decide at the next step

    def set_priors(self, priors: PlannerPriors) -> None:
        """Replace the priors: each entry is worth ``count`` observations of ``mean_loss_s``
        (at most ``prior_max_count`` per bucket and arm, so a worker's own evidence soon outweighs
        a wrong prior).

        Priors are established evidence, not a cold-start transient: they are exempt from the
        growing-window forgetting (only the steady-state ``discount`` erodes them), and a bucket's
        exploration schedule moves on as if its prior observations had happened (a warm bucket
        explores like a cold one that has already seen that many steps)."""
        na, nb = len(self._arms), len(self._edges)
        cap = self.config.prior_max_count
        merged: dict[tuple[int, int], list[float]] = {}  # entries on other edges may share a bucket
        for e in priors.entries:
            i = self._arm_idx.get(e.gamma)
            if i is not None and e.count > 0:
                acc = merged.setdefault((bucket_index(self._edges, e.bucket_lo), i), [0.0, 0.0])
                acc[0] += e.count
                acc[1] += e.count * e.mean_loss_s
        self._pn = [[0.0] * na for _ in range(nb)]
        self._ps = [[0.0] * na for _ in range(nb)]
        self._has_prior = [False] * nb
        self._dropped = [{} for _ in range(nb)]
        self._prior_dps = priors.draft_prefill_s_per_token
        for (c, i), (n, s) in merged.items():
            k = min(n, cap) * self._w[c]
            self._pn[c][i] = k
            self._ps[c][i] = k * s / n
            self._has_prior[c] = True
        for c in range(nb):
            if self._has_prior[c] and not self._paper:
                prior_steps = int(sum(self._pn[c]) / self._w[c])
                self._advance_schedule(c, self._t[c] + prior_steps - self._sched[c])
        self._bin_left = [0] * nb

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    # -- step contract -----------------------------------------------------------------------
    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        lut = self._lut
        c = lut[batch_size] if 0 <= batch_size < len(lut) else lut[-1]
        left = self._bin_left[c]
        if left > 0:
            self._bin_left[c] = left - 1
            a = self._arm[c]
        else:
            a = self._new_bin(c)
        g = self._arms[a]
        if (g > 0) != (self._last_gamma > 0) and not self._paper:
            a = self._guard_flip(c, a, prompt_tokens)
            g = self._arms[a]
        elif g > 0 and self._last_gamma > 0 and prompt_tokens > 0 and self._step_price and not self._exploring[c]:
            a = self._tie_at_prompt_step(c, a, prompt_tokens)
            g = self._arms[a]
        st = self.stats
        st.decisions += 1
        if (g > 0) != (self._last_gamma > 0):
            if g > 0:
                st.switches_on += 1
            else:
                st.switches_off += 1
            k = 1 if self._last_gamma > 0 else 0  # the run that just ended
            self._dwell[k] += 0.2 * (min(self._run, _MAX_DWELL) - self._dwell[k])
            self._run = 0
        self._run += 1
        self._last_gamma = g
        return g

    def _cross(self, c: int) -> None:
        """The context moved from bucket self._ctx to c: close the excursions it left (at or above
        the buckets it fell below, at or below those it rose above) and open the ones it entered."""
        prev, now, start, exc = self._ctx, self._steps, self._exc_start, self._exc
        self._ctx = c
        if prev < 0:
            for k in range(len(self._edges)):
                start[0][k] = start[1][k] = now
            return
        lo, hi = (prev, c) if c > prev else (c, prev)
        up = c > prev
        for k in range(lo + 1, hi + 1):  # thresholds crossed for "at or above k"
            if up:
                start[0][k] = now
            else:
                exc[0][k] += _EXC_RATE * (min(now - start[0][k], _MAX_DWELL) - exc[0][k])
        for k in range(lo, hi):  # and for "at or below k"
            if up:
                exc[1][k] += _EXC_RATE * (min(now - start[1][k], _MAX_DWELL) - exc[1][k])
            else:
                start[1][k] = now

    def observe(self, feedback: StepFeedback) -> None:
        fb = feedback
        lut = self._lut
        b = fb.batch_size
        c = lut[b] if 0 <= b < len(lut) else lut[-1]
        self._steps += 1
        if c != self._ctx:
            self._cross(c)
        # Pipeline fill: drafts proposed in one step are verified in the next, so a step that raises
        # gamma verifies only the previous step's drafts (none when the draft was off: one token per
        # request, plus the drafting). It is not the arm's steady state and is not learnt as such;
        # when resuming, its cost above a plain step belongs to the switch.
        fill = fb.gamma > self._prev_gamma and not self._paper
        resume = fill and self._prev_gamma == 0
        self._prev_gamma = fb.gamma
        excess = self._fill_excess(c, fb) if resume else None
        if excess is not None:
            # the fill step's cost grows with the batch, not with what the draft missed: learnt per
            # bucket, outside the catch-up line (fitted together, the batch's growth showed up as a
            # per-missed-token rate several times the real one, and flips were priced out)
            f0 = self._fill_cost[c]
            self._fill_cost[c] = excess if f0 is None else 0.8 * f0 + 0.2 * excess
        switch_cost = fb.switch_cost_s + (excess or 0.0)
        if switch_cost > 0:
            e = self._switch_ema
            self._switch_ema = switch_cost if e is None else 0.8 * e + 0.2 * switch_cost
            self.stats.switch_cost_s_ema = self._switch_ema
        if fb.switch_cost_s > 0:
            # catch-up = fixed + rate * (tokens the draft missed while off): discounted least squares,
            # over the engine's count of caught-up tokens when it gives one
            x = self._off_tokens if fb.catchup_tokens is None else float(fb.catchup_tokens)
            y, f = fb.switch_cost_s, 0.95
            sw = self._sw
            sw[0] = f * sw[0] + 1.0
            sw[1] = f * sw[1] + x
            sw[2] = f * sw[2] + y
            sw[3] = f * sw[3] + x * x
            sw[4] = f * sw[4] + x * y
        self._drafted = self._drafted * self._acc_decay + fb.num_draft_tokens
        self._accepted = self._accepted * self._acc_decay + fb.num_accepted_tokens
        self._rho[0] = self._rho[0] * _RHO_DECAY + fb.prefill_tokens
        self._rho[1] = self._rho[1] * _RHO_DECAY + fb.tokens_emitted
        if fb.gamma == 0 and fb.draft_lag_tokens is not None:
            # the engine's count (running requests only), plus what this step adds
            self._off_tokens = fb.draft_lag_tokens + fb.tokens_emitted + fb.prefill_tokens
        elif fb.gamma == 0:
            # a guess: requests that finish take their share away (~1/256 per step)
            self._off_tokens = self._off_tokens * _LAG_DECAY + fb.tokens_emitted + fb.prefill_tokens
        else:
            self._off_tokens = 0.0
        i = self._arm_idx.get(fb.gamma)
        if i is None or fill:
            return
        tokens = max(1, fb.tokens_emitted)
        w = self._w[c]
        t = fb.step_time_s
        p = fb.prefill_tokens
        if self._paper:
            t += fb.switch_cost_s  # the paper charges C_switch to the switching step itself
        self._bmean[c] += 0.05 * (b - self._bmean[c])
        normf = max(1, b) / self._edges[c] if self._norm else 1.0
        scale = normf / tokens
        if self._prefill:
            mp = self._mp[c][i]
            if mp is None:
                self._mp[c][i] = float(p)
                self._mt[c][i] = t
            else:
                x, y = p - mp, t - self._mt[c][i]
                k = 1 if fb.gamma > 0 else 0
                self._nreg[k] += 1
                self._npre[k] += p > 0
                self._sxy[k] = 0.9995 * self._sxy[k] + x * y
                self._sxx[k] = 0.9995 * self._sxx[k] + x * x
                if self._sxx[k] > 0:
                    self._betas[k] = max(0.0, self._sxy[k] / self._sxx[k])
                self._mp[c][i] = mp + 0.05 * x
                self._mt[c][i] += 0.05 * y
            loss = max(t - self._prefill_slope(fb.gamma > 0) * p, 0.05 * t) * scale
        else:
            loss = t * scale
        self._raw[c][i] += 1
        self._n[c][i] += w
        a = loss * tokens
        self._sa[c][i] += w * a
        self._saa[c][i] += w * a * a
        self._sab[c][i] += w * a * tokens
        self._sbb[c][i] += w * tokens * tokens
        self._tok[c][i] += w * tokens
        if self._paper:
            self._s[c][i] += w * t * scale  # mean of per-step losses
        else:
            # latency per token = total time / total tokens (a ratio of sums): the mean of per-step
            # ratios overweights steps that emit one token (every draft rejected), so it ranks
            # long drafts too low; _s and _sp hold the ratio times the count, so s / n reads it.
            self._st[c][i] += w * t * normf
            self._spt[c][i] += w * p * normf
            r = self._n[c][i] / self._tok[c][i]
            self._s[c][i] = self._st[c][i] * r
            self._sp[c][i] = self._spt[c][i] * r
        self._tpot[c][i] += w * t * max(1, b) / tokens
        # Growing-window forgetting: discount 1 - 1/(t + 10) for the bucket's t-th observation
        # (weights grow linearly with recency, so a cold-start transient fades), floored at the
        # configured discount (the tracking horizon in steady state).
        self._t[c] += 1
        d = min(self._d, 1.0 - 1.0 / (self._t[c] + 10.0)) if self._grow else self._d
        if d < self._d and self._has_prior[c]:
            # priors are not a cold-start transient: they decay at the steady-state rate only
            keep = self._d / d
            pn, ps = self._pn[c], self._ps[c]
            for j in range(len(pn)):
                pn[j] *= keep
                ps[j] *= keep
        if d < 1.0:
            w /= d
            if w > 1e150:
                self._rescale(c, w)
                w = 1.0
            self._w[c] = w

    # -- internals -----------------------------------------------------------------------------
    def _rescale(self, c: int, w: float) -> None:
        for arr in (self._n, self._s, self._sa, self._saa, self._sab, self._sbb, self._tok, self._tpot, self._sp,
                    self._st, self._spt, self._pn, self._ps):
            row = arr[c]
            for i in range(len(row)):
                row[i] /= w

    def _estimates(self, c: int) -> tuple[list[float | None], list[float]]:
        """Smoothed mean loss and effective count per arm (priors and neighbour evidence included)."""
        na = len(self._arms)
        n, pn, ps = self._n[c], self._pn[c], self._ps[c]
        slopes = self._prefill_slopes() if self._prefill else None
        s = self._corrected(c, slopes)
        tn = [n[i] + pn[i] for i in range(na)]
        ts = [s[i] + ps[i] for i in range(na)]
        if self._share:
            for d in (c - 1, c + 1):
                if 0 <= d < len(self._edges):
                    self._borrow(c, d, tn, ts, s, self._corrected(d, slopes))
        means: list[float | None] = [ts[i] / tn[i] if tn[i] > 1e-12 else None for i in range(na)]
        extra = self._draft_prefill_charge(c)
        if extra > 0:
            means = [m + extra if m is not None and self._arms[i] > 0 else m for i, m in enumerate(means)]
        inv = 1.0 / self._w[c]
        return means, [x * inv for x in tn]

    def _fill_excess(self, c: int, fb: StepFeedback) -> float | None:
        """Time of a pipeline-fill step above a plain (gamma 0) step of bucket c with the same
        prefill; None while bucket c has no gamma-0 evidence."""
        i = self._arm_idx.get(0)
        if i is None or self._n[c][i] <= 0:
            return None
        slopes = self._prefill_slopes() if self._prefill else None
        loss0 = self._s[c][i] if slopes is None else _less_prefill(self._s[c][i], self._sp[c][i], slopes[0])
        loss0 /= self._n[c][i]  # per token, prefill removed, batch-normalised
        plain = loss0 * (self._edges[c] if self._norm else max(1, fb.batch_size))
        plain += slopes[0] * fb.prefill_tokens if slopes is not None else 0.0
        return max(0.0, fb.step_time_s - plain)

    def _prefill_slope(self, draft_on: bool) -> float:
        """Prefill seconds per prompt token of a step with the draft on or off (see ``_prefill_slopes``)."""
        return self._prefill_slopes()[1 if draft_on else 0]

    def _prefill_slopes(self) -> tuple[float, float]:
        """Prefill seconds per prompt token of a step with the draft off (the target's) and on
        (target and draft, once ``_draft_prefill_slope`` is known; until then the target's, which
        leaves the running draft's prefill in the gamma > 0 arms' loss: a cost of keeping it on)."""
        extra = self._draft_prefill_slope()
        off = self._target_prefill_slope(extra)
        return off, (off + extra if extra is not None else off)

    def _target_prefill_slope(self, extra: float | None) -> float:
        """The target's prefill seconds per prompt token: learnt with the draft off; else, with the
        draft's share known, learnt with it on less that share; else pooled over both states."""
        if self._nreg[0] >= _MIN_REGRESSION and (extra is None or self._npre[0] >= _MIN_PREFILL_STEPS):
            return self._betas[0]
        if extra is not None and self._nreg[1] >= _MIN_REGRESSION and self._npre[1] >= _MIN_PREFILL_STEPS:
            return max(0.0, self._betas[1] - extra)
        sxx = self._sxx[0] + self._sxx[1]
        return max(0.0, (self._sxy[0] + self._sxy[1]) / sxx) if sxx > 0 else 0.0

    def _learnt_draft_prefill(self) -> float | None:
        """This worker's own draft-on minus draft-off prefill slope; None until both rest on enough
        steps that carried prompts."""
        if min(self._nreg) < _MIN_REGRESSION or min(self._npre) < _MIN_PREFILL_STEPS:
            return None
        return max(0.0, self._betas[1] - self._betas[0])

    def _draft_prefill_slope(self) -> float | None:
        """The running draft's extra prefill seconds per prompt token (None unless amortising): the
        worker's own once learnt; until then the priors' (per pair and device), else the catch-up
        line's per-token rate (the same work, and learnt from the first resumes: a warm or cold
        worker whose first prompts all land in one draft state is not left without a price)."""
        if not self._amortise:
            return None
        own = self._learnt_draft_prefill()
        if own is not None:
            return own
        if self._prior_dps is not None:
            return self._prior_dps
        line = self._catchup_line()
        return line[1] if line is not None else None

    def draft_prefill_per_token(self) -> float:
        """Seconds per generated token charged to gamma > 0 for the running draft's prefill: its
        learnt seconds per prompt token x the workload's prompt tokens per generated token (0 until
        learnt)."""
        extra = self._draft_prefill_slope()
        if not extra or self._rho[1] <= 0:
            return 0.0
        return extra * self._rho[0] / self._rho[1]

    def _draft_prefill_charge(self, c: int) -> float:
        """``draft_prefill_per_token`` in bucket c's loss units."""
        return self._in_bucket_units(c, self.draft_prefill_per_token())

    def _in_bucket_units(self, c: int, per_token: float) -> float:
        """Seconds per generated token at bucket c's typical batch, in its learnt loss units
        (batch-normalised to the lower edge when ``normalise_batch``)."""
        return per_token * self._bmean[c] / self._edges[c] if self._norm and per_token else per_token

    def _corrected(self, c: int, slopes: tuple[float, float] | None = None) -> list[float]:
        """Loss sums of bucket c with the learnt prefill cost of each arm's state taken out
        (``slopes``: ``_prefill_slopes()`` when the caller already has them)."""
        if not self._prefill:
            return self._s[c]
        b_off, b_on = slopes if slopes is not None else self._prefill_slopes()
        if b_off <= 0 and b_on <= 0:
            return self._s[c]
        return [_less_prefill(a, b, b_on if g > 0 else b_off)
                for g, a, b in zip(self._arms, self._s[c], self._sp[c], strict=True)]

    def _borrow(self, c: int, d: int, tn: list[float], ts: list[float], sc: list[float], sd: list[float]) -> None:
        """Add neighbour d's evidence to bucket c, rescaled via a reference arm both have tried
        (``sc``, ``sd``: the two buckets' corrected loss sums)."""
        nc, nd = self._n[c], self._n[d]
        inv_c, inv_d = 1.0 / self._w[c], 1.0 / self._w[d]
        ref, ref_n = -1, 0.0
        for i in range(len(nc)):
            m = min(nc[i] * inv_c, nd[i] * inv_d)
            if m > ref_n:
                ref, ref_n = i, m
        if ref < 0 or ref_n < 1.0 or sd[ref] <= 0 or sc[ref] <= 0:
            return
        ratio = (sc[ref] / nc[ref]) / (sd[ref] / nd[ref])
        wc = self._w[c]
        cap = self.config.share_weight
        for i in range(len(nc)):
            if i == ref or nd[i] <= 0:
                continue
            k = min(cap, nd[i] * inv_d) * wc  # pseudo-count in bucket c's scaling
            tn[i] += k
            ts[i] += k * ratio * sd[i] / nd[i]

    def _cvs(self, c: int) -> list[float]:
        """Relative noise of each arm's per-token mean in bucket c, per observation (its standard
        error is cv / sqrt(n)): the arm's own estimate shrunk towards the bucket's pooled one (worth
        3 observations), so one outlier in a barely tried arm widens its interval instead of being
        trusted.

        The mean is a ratio of sums, R = sum(a) / sum(b) (a = a step's loss x tokens, b = its
        tokens), so the noise is that of the residuals a - R b over the mean b (the delta method):
        steps that emit many tokens weigh more. The spread of per-step losses about R, as before,
        is not that; with a per-step mean different from R it came out negative, was clipped to 0,
        and the intervals collapsed (every small difference a conflict)."""
        n, tok, sa, saa, sab, sbb = self._n[c], self._tok[c], self._sa[c], self._saa[c], self._sab[c], self._sbb[c]
        inv = 1.0 / self._w[c]
        own: list[float | None] = []
        num = den = 0.0
        for i in range(len(n)):
            if n[i] * inv >= 2.0 and sa[i] > 0:
                r = sa[i] / tok[i]
                v = max(saa[i] - 2.0 * r * sab[i] + r * r * sbb[i], 0.0) * n[i] / (sa[i] * sa[i])
                own.append(v)
                num += n[i] * v
                den += n[i]
            else:
                own.append(None)
        pooled = num / den if den > 0 else _DEFAULT_CV**2
        out = []
        for i in range(len(n)):
            k = n[i] * inv
            v = own[i]
            out.append(math.sqrt(pooled if v is None else (k * v + 3.0 * pooled) / (k + 3.0)))
        return out

    def _visit(self, hold: int) -> int:
        """Steps over which an exploration visit amortises C_switch: its hold, but at least a quarter
        of the exploitation dwell (a visit that finds a better arm is followed by exploiting it)."""
        return max(hold, self.config.switch_amortise_steps // 4, 1)

    def _predict_switch(self, missed_tokens: float, c: int) -> float:
        """Expected C_switch of resuming in bucket c after the draft missed ``missed_tokens``: the
        catch-up line plus the bucket's pipeline-fill excess (each 0 while unknown: optimistic)."""
        if self.config.switch_cost_s is not None:
            return self.config.switch_cost_s
        if self._paper:
            return self._switch_ema or 0.0
        fill = self._fill_cost[c] or 0.0
        n, sx, sy = self._sw[:3]
        if n <= 0:
            return fill
        line = self._catchup_line()
        if line is not None:
            return line[0] + line[1] * missed_tokens + fill
        # too few switches for a line: the more optimistic of "always the mean" and "proportional"
        mx, my = sx / n, sy / n
        return (min(my, my / mx * missed_tokens) if mx > 0 else my) + fill

    def _catchup_line(self) -> tuple[float, float] | None:
        """The catch-up's (fixed seconds, seconds per missed token); None before 3 resumes that
        missed different amounts."""
        n, sx, sy, sxx, sxy = self._sw
        if n < 3:
            return None
        mx, my = sx / n, sy / n
        var = sxx / n - mx * mx
        if var <= 1e-9 * max(mx * mx, 1.0):
            return None
        b = max((sxy / n - mx * my) / var, 0.0)
        return max(my - b * mx, 0.0), b

    @staticmethod
    def _lag_after(steps: int, per_step: float) -> float:
        """Tokens the draft will have missed after ``steps`` steps off: each step adds ``per_step``
        and requests that finish take theirs away (the decay of the running estimate), so the lag
        levels off at ~256 steps' worth instead of growing with the time spent off."""
        return per_step * (1.0 - _LAG_DECAY**steps) / (1.0 - _LAG_DECAY)

    def _switch_penalty(
        self, c: int, i: int, counts: list[float], horizon: int | None = None, off_steps: int | None = None
    ) -> float:
        """C_switch amortised per token, if playing arm i flips speculation on/off from now.

        Turning on pays the predicted catch-up now; turning off is charged the C_switch of coming
        back after ``off_steps`` steps off (default: the horizon), but no more than resumes have
        cost so far. The cost is spread over ``horizon`` steps: for exploitation, the expected
        length of a run in the state entered (at least ``switch_amortise_steps``); for exploration
        the visit (paying a large C_switch for a two-step look is a loss); an exploration visit
        turns the draft off only for its hold, so that is what it misses."""
        on = self._arms[i] > 0
        if on == (self._last_gamma > 0):
            return 0.0
        per_step = self._tokens_per_step(c, i)
        if horizon is None:
            # not the current run's length: a long pause says nothing about how long the next
            # run lasts (amortising a resume over it made resumes look cheap after long pauses)
            run = self._dwell[1] if on else max(self._dwell[0], self._off_run(c, per_step))
            h = int(max(self.config.switch_amortise_steps, run))
        else:
            h = max(horizon, 1)
        if on:
            cost = self._predict_switch(self._off_tokens, c)  # catch up on what was missed so far
        else:  # coming back after the steps off
            cost = self._predict_switch(self._lag_after(h if off_steps is None else max(off_steps, 1), per_step), c)
            if self._switch_ema is not None and self.config.switch_cost_s is None:
                # the lag extrapolated at this batch overshoots: speculation resumes at a smaller
                # batch, whose running contexts bound the catch-up; observed resumes embody that
                cost = min(cost, self._switch_ema)
        if not cost:
            return 0.0
        pen = cost / (h * per_step)
        return self._in_bucket_units(c, pen)

    def _tokens_per_step(self, c: int, i: int) -> float:
        """Tokens a step of arm i emits in bucket c (the bucket's lower edge until it has played)."""
        n = self._n[c][i]
        return max(self._tok[c][i] / n if n > 0 else float(self._edges[c]), 1.0)

    def _off_run(self, c: int, per_step: float) -> float:
        """Expected steps the draft stays off if it turns off in bucket c: until the context falls
        to a bucket where resuming pays (its best drafting arm beats gamma 0 by more than a resume
        amortised over the context's stay at or below it), i.e. the context's excursion above the
        highest such bucket below c; no such bucket: off for good."""
        cost = self._switch_ema
        if cost is None:
            cost = self._predict_switch(self._lag_after(int(self._dwell[0]), per_step), c)
        i0 = self._arm_idx.get(0)  # a gain is only recorded when gamma 0 is an arm
        for r in range(c - 1, -1, -1):
            gain = self._on_gain[r]
            if gain is None or gain <= 0:
                continue
            tok = self._tokens_per_step(r, i0)
            pen = self._in_bucket_units(r, cost / (max(self._exc[1][r], 1.0) * tok))
            if gain > pen:
                return self._exc[0][r + 1]
        return float(_MAX_DWELL)

    def _guard_flip(self, c: int, a: int, prompt_tokens: int) -> int:
        """The held arm would turn speculation on/off (e.g. the batch crossed into a bucket whose bin
        was decided while the engine was in the other state): keep the current on/off state unless
        the held arm still wins with the switching cost charged."""
        means, counts = self._estimates(c)
        if self._step_price and self._last_gamma > 0:
            means = self._priced_at_step(c, means, prompt_tokens)
        same = [
            i for i in self._gated(self._feasible(c))
            if means[i] is not None and (self._arms[i] > 0) == (self._last_gamma > 0)
        ]
        if not same:
            return a
        alt = min(same, key=lambda i: means[i])
        # barely known (e.g. an exploration bin): optimistic, only the switching cost can veto it
        mine = means[a] if means[a] is not None and counts[a] >= _MIN_ELIMINATE else 0.5 * means[alt]
        hold = self._bin_left[c] + 1
        horizon, off = (self._visit(hold), hold) if self._exploring[c] else (None, None)
        if mine + self._switch_penalty(c, a, counts, horizon, off) < means[alt]:
            return a
        self._arm[c] = alt  # for the rest of this bin
        return alt

    def _tie_at_prompt_step(self, c: int, a: int, prompt_tokens: int) -> int:
        """The draft is on, the bin exploits a gamma > 0 arm, and this step brings prompts: if gamma 0
        is within the hysteresis margin of that arm (the bandit cannot tell them apart), the step's
        own price decides, as for a turn-off (``_priced_at_step``). Beyond a tie the bucket's
        preference stands: turning off there would be undone at the next step, with a catch-up of
        the same prompts plus a fill step (Qwen CPU bench-dynamic: at batch 5, gamma 0 and gamma 1
        within 0.2 %, a 195-token step took 4.2 s with the draft on against the oracle's 3.1 off)."""
        i0 = self._arm_idx.get(0)
        if i0 is None:
            return a
        means, counts = self._estimates(c)
        m0, ma = means[i0], means[a]
        if m0 is None or ma is None or m0 > ma * (1.0 + self._hyst) or i0 not in self._feasible(c):
            return a
        step = self._priced_at_step(c, means, prompt_tokens)
        if step[i0] + self._switch_penalty(c, i0, counts) < step[a]:  # type: ignore[operator]
            self._arm[c] = i0  # for the rest of this bin
            return i0
        return a

    def _priced_at_step(self, c: int, means: list[float | None], prompt_tokens: int) -> list[float | None]:
        """``means`` with the gamma > 0 arms' draft prefill priced at this step's own prompt tokens
        instead of the workload's mean, where the step may turn the draft off: staying on commits
        the draft to prefilling this step's prompts now, while turning off defers them to a
        catch-up (priced in the turn-off's switching cost) that never comes for requests finishing
        before the draft resumes. A wave's rise brings its prompts in a few steps: at the mean
        price, a near tie kept the draft on through them (Qwen CPU sawtooth: 1749 prompt tokens
        prefilled with the draft on at batches 6-19, where gamma 0 was within 4 %). Turning on is
        left at the mean price: deferring a resume by a step only moves this step's prompts into
        its catch-up."""
        slope = self._draft_prefill_slope()
        if not slope:
            return means
        mean_charge = self._draft_prefill_charge(c)
        return [
            m - mean_charge + self._in_bucket_units(c, slope * prompt_tokens / self._tokens_per_step(c, i))
            if m is not None and self._arms[i] > 0 else m
            for i, m in enumerate(means)
        ]

    def _feasible(self, c: int) -> list[int]:
        """Arms meeting the TPOT SLO (unknown ones count as feasible); all arms without an SLO."""
        idx = list(range(len(self._arms)))
        if self._slo is None:
            return idx
        n, tp = self._n[c], self._tpot[c]
        known = [(tp[i] / n[i], i) for i in idx if n[i] > 0]
        ok = [i for i in idx if n[i] <= 0 or tp[i] / n[i] <= self._slo]
        if ok:
            return ok
        return [min(known)[1]]  # none meets it: the lowest TPOT

    def _next_bin_size(self, c: int) -> int:
        """Advance the hierarchical schedule by one bin: blocks of 2^(b-1) steps, bins of
        ~sqrt(block) steps. Returns the bin's length."""
        if self._block_left[c] <= 0:
            b = min(self._block_exp[c] + 1, self._max_exp + 1)
            self._block_exp[c] = b
            length = 1 << (b - 1)
            self._block_left[c] = length
            self._bin_size[c] = max(1, round(math.sqrt(length)))
        size = min(self._bin_size[c], self._block_left[c])
        self._block_left[c] -= size
        self._bin_idx[c] += 1
        self._sched[c] += size
        return size

    def _advance_schedule(self, c: int, steps: int) -> None:
        """Move bucket c's schedule on by about ``steps`` steps (whole bins), as if they had been
        played: later bins are longer and explore with lower probability."""
        while steps > 0:
            steps -= self._next_bin_size(c)

    def _new_bin(self, c: int) -> int:
        size = self._next_bin_size(c)
        self._bin_left[c] = size - 1
        st = self.stats
        st.bins += 1

        self._exploring[c] = False
        if self._has_prior[c]:
            self._reconcile_priors(c)
        means, counts = self._estimates(c)
        i0 = self._arm_idx.get(0)
        on = [m for i, m in enumerate(means) if m is not None and self._arms[i] > 0]
        m0 = means[i0] if i0 is not None else None
        self._on_gain[c] = m0 - min(on) if on and m0 is not None else None
        cand = self._gated(self._feasible(c))
        eff = [
            (means[i] + self._switch_penalty(c, i, counts)) if means[i] is not None else None
            for i in range(len(self._arms))
        ]
        known = [i for i in cand if eff[i] is not None]
        best = -1
        if known:
            best = min(known, key=lambda i: eff[i])
            cur = self._arm_idx.get(self._last_gamma)
            if self._hyst > 0 and cur is not None and cur in known and cur != best:
                if eff[best] > eff[cur] * (1.0 - self._hyst):
                    best = cur
            self._best[c] = best

        cfg = self.config
        p = max(cfg.explore_floor, cfg.explore_scale / math.sqrt(self._bin_idx[c]))
        explore = best < 0 or self._rng.random() < p
        choice = best
        if explore:
            pool = self._explore_pool(c, cand, means, counts, eff, best)
            if pool:
                if self._paper:
                    choice = self._rng.choice(pool)
                else:
                    choice = self._pick_exploration(c, pool, eff, counts, best)
                if choice != best:
                    st.explore_bins += 1
                    self._exploring[c] = True
                    if not self._paper:
                        # doubling: an arm with n observations is held at most n + 1 steps, so a
                        # barely known (possibly bad) arm never gets a whole long bin; raising
                        # gamma holds one step more (the pipeline-fill step is not observed)
                        hold = min(self._bin_left[c], int(counts[choice]))
                        if self._arms[choice] > self._last_gamma:
                            hold = max(hold, 1)
                        self._bin_left[c] = hold
        if choice < 0:
            choice = self._rng.choice(cand)
        self._arm[c] = choice
        return choice

    def _reconcile_priors(self, c: int) -> None:
        """Prior-data conflict: an arm's own mean lies outside what its prior allows (z standard
        errors of both, with the bucket's own noise).

        * Level shift: every arm with own evidence (two at least: one arm cannot tell a wrong level
          from a wrong arm) is off in the same direction, its dropped prior counted. The priors'
          shape across arms still holds and only their level is off (a slower machine, longer
          prompts, a batch that memory caps below the requests waiting), so all of the bucket's
          priors are rescaled by the evidence-weighted geometric mean of own / prior and the
          dropped ones come back. Dropping arm by arm instead made each arm whose prior was still
          standing look better than the arms already tried, and the bucket played them in turn
          (on the memory-tight Qwen run: gamma 1, then 2, at batch 40, each until its own prior
          was dropped).
        * Otherwise the conflicting arms' priors are wrong for this worker and are dropped, so a
          wrong prior costs a few observations of that arm, not the time it takes the discount
          to erode it; they are kept aside to recognise a level shift later."""
        inv = 1.0 / self._w[c]
        n, pn, ps = self._n[c], self._pn[c], self._ps[c]
        dropped = self._dropped[c]
        z = self.config.confidence_z
        s = self._corrected(c)
        cv = None
        judged = []  # (arm, own mean, prior mean, own count, conflicts)
        for i in range(len(n)):
            k = n[i] * inv
            if k < 2.0 or s[i] <= 0:
                continue
            if pn[i] > 0:
                prior, kp = ps[i] / pn[i], pn[i] * inv
            elif i in dropped:
                prior, kp = dropped[i]
            else:
                continue
            if cv is None:
                cv = self._cvs(c)
            own = s[i] / n[i]
            bad = abs(own - prior) > z * cv[i] * max(own, prior) * math.sqrt(1.0 / k + 1.0 / kp)
            judged.append((i, own, prior, k, bad))
        if not any(bad and pn[i] > 0 for i, _, _, _, bad in judged):
            return
        st = self.stats
        same_way = len({own > prior for _, own, prior, _, _ in judged}) == 1
        if len(judged) >= 2 and same_way and all(bad for *_, bad in judged):
            weight = sum(k for _, _, _, k, _ in judged)
            r = math.exp(sum(k * math.log(own / prior) for _, own, prior, k, _ in judged) / weight)
            for i in range(len(pn)):
                ps[i] *= r
            for i, (prior, kp) in dropped.items():
                pn[i] = kp * self._w[c]
                ps[i] = pn[i] * prior * r
            dropped.clear()
            st.prior_rescales += 1
        else:
            for i, _, prior, _, bad in judged:
                if bad and pn[i] > 0:
                    dropped[i] = (prior, pn[i] * inv)
                    pn[i] = ps[i] = 0.0
                    st.priors_dropped += 1
        self._has_prior[c] = any(x > 0 for x in pn)

    def _pick_exploration(
        self, c: int, pool: list[int], eff: list[float | None], counts: list[float], best: int
    ) -> int:
        """Arms this bucket has not tried itself come first (neighbour evidence is only a guess);
        then the most promising by its optimistic bound (lowest lower confidence bound)."""
        others = [i for i in pool if i != best] or pool
        inv = 1.0 / self._w[c]
        untried = [i for i in others if self._raw[c][i] == 0 and self._pn[c][i] * inv < 1.0]
        if untried:
            return untried[0] if len(untried) == 1 else self._rng.choice(untried)
        z = self.config.confidence_z
        cv = self._cvs(c)
        return min(
            others,
            key=lambda i: -math.inf if eff[i] is None else eff[i] * (1.0 - z * cv[i] / math.sqrt(counts[i])),
        )

    def _explore_pool(
        self,
        c: int,
        cand: list[int],
        means: list[float | None],
        counts: list[float],
        eff: list[float | None],
        best: int,
    ) -> list[int]:
        pool = list(cand)
        if self._mono and self._slo is None:
            hi = self._neighbour_best(c, -1)  # best gamma of a smaller-batch bucket: upper bound
            lo = self._neighbour_best(c, +1)  # best gamma of a larger-batch bucket: lower bound
            pruned = [
                i for i in pool
                if (hi is None or self._arms[i] <= hi) and (lo is None or self._arms[i] >= lo)
            ]
            if pruned:
                pool = pruned
        if self._elim and best >= 0:
            z = self.config.confidence_z
            cv = self._cvs(c)
            b_ucb = eff[best] * (1.0 + z * cv[best] / math.sqrt(max(counts[best], 1e-9)))
            flip = self._switch_penalty
            pool = [
                i for i in pool
                if (
                    eff[i] * (1.0 - z * cv[i] / math.sqrt(counts[i])) <= b_ucb
                    if eff[i] is not None and counts[i] >= _MIN_ELIMINATE
                    # barely known: optimistic, unless flipping speculation alone costs more than
                    # half of what the best arm loses (e.g. resuming the draft at a full batch)
                    else flip(c, i, counts, self._visit(int(counts[i]) + 1), int(counts[i]) + 1) <= 0.5 * b_ucb
                )
            ]
            if pool == [best]:
                return []
        return pool

    def _gated(self, cand: list[int]) -> list[int]:
        """Candidates without gamma > 0 while the acceptance gate is closed: neither explored nor
        exploited (a bucket whose only evidence is one lucky gamma > 0 step would otherwise keep
        speculating with a draft that is never accepted)."""
        if not self.acceptance_gate_closed():
            return cand
        return [i for i in cand if self._arms[i] == 0] or cand

    def acceptance_gate_closed(self) -> bool:
        """True when the pooled acceptance's upper confidence bound (Wilson, ``confidence_z``) over
        at least ``acceptance_gate_tokens`` drafted tokens is below ``min_acceptance``."""
        n = self._drafted
        if self._gate <= 0 or n < self.config.acceptance_gate_tokens:
            return False
        p, z2 = min(1.0, self._accepted / n), self.config.confidence_z ** 2
        ucb = (p + z2 / (2 * n) + math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) * math.sqrt(z2)) / (1 + z2 / n)
        return ucb < self._gate

    def _neighbour_best(self, c: int, step: int) -> int | None:
        d = c + step
        while 0 <= d < len(self._edges):
            tot = (sum(self._n[d]) + sum(self._pn[d])) / self._w[d]  # priors are evidence too
            if tot >= _ESTABLISHED and self._best[d] >= 0:
                return self._arms[self._best[d]]
            d += step
        return None

    # -- introspection ---------------------------------------------------------------------------
    def snapshot(self) -> PlannerPriors:
        """Own evidence (priors included, neighbours not) per (bucket_lo, gamma): mean loss and count.

        The result is a valid ``PlannerPriors``, so a fleet can average snapshots and push them back.
        """
        entries = []
        for c, lo in enumerate(self._edges):
            inv = 1.0 / self._w[c]
            for i, g in enumerate(self._arms):
                n = self._n[c][i] + self._pn[c][i]
                if n <= 0:
                    continue
                m = (self._corrected(c)[i] + self._ps[c][i]) / n
                if m > 0:
                    entries.append(PriorEntry(bucket_lo=lo, gamma=g, mean_loss_s=m, count=n * inv))
        own = self._learnt_draft_prefill()
        return PlannerPriors(bucket_edges=list(self._edges), entries=entries,
                             draft_prefill_s_per_token=self._prior_dps if own is None else own)
