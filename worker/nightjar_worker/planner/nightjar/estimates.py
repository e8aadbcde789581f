"""Per-bucket loss estimates: own evidence, priors, neighbours' evidence and the prefill corrections.

* ``correct_prefill``: each arm's loss sum less the learnt prefill cost of its draft state;
* ``share``: an arm seldom tried in one bucket borrows evidence from the neighbouring buckets,
  rescaled by the loss ratio of an arm both have tried (per-token loss scales with batch);
* ``normalise``: losses are learnt as loss x batch / bucket_lo (per-token loss falls like 1/batch
  in the memory-bound regime, which otherwise confounds arms held at different batch sizes inside
  one bucket); snapshots and priors use these units (loss at the bucket's lower edge);
* ``pool_yield``: a cell's loss is read over its arm's tokens per request pooled over every bucket
  (``yields.py``), not over its own few geometric draws;
* ``source_model``: that pooled yield shrunk towards the source's geometric acceptance fitted over
  all its gammas, and ``predictions``: an untried arm's loss from the bucket's step times, linear in
  gamma per source (``sourcemodel.py``);
* every arm that runs the draft model is charged the running draft's prefill per generated token
  (``PrefillCost.per_generated_token``), in the bucket's units.
"""

from __future__ import annotations

from collections.abc import Callable

from nightjar_contract.planner import PlannerPriors

from nightjar_worker.planner.nightjar import priors as prior_rules
from nightjar_worker.planner.nightjar.arms import ArmSet
from nightjar_worker.planner.nightjar.cells import Bucket, less_prefill
from nightjar_worker.planner.nightjar.prefill import PrefillCost
from nightjar_worker.planner.nightjar.sourcemodel import SourceModel
from nightjar_worker.planner.nightjar.yields import TokenYield
from nightjar_worker.planner.policy import StepFeedback


class Estimator:
    """Owns the buckets' evidence: what a step teaches (``observe``), what the priors say
    (``load_priors``, ``reconcile_priors``) and what both estimate (``estimates``)."""

    def __init__(self, edges: tuple[int, ...], arms: ArmSet, prefill: PrefillCost, *, correct_prefill: bool = True,
                 share: bool = True, share_weight: float = 2.0, normalise: bool = True) -> None:
        self.edges = edges
        self.buckets = [Bucket(lo, len(arms)) for lo in edges]
        self.arms = arms
        self.prefill = prefill
        self.correct_prefill, self.share, self.share_weight, self.normalise = (
            correct_prefill, share, share_weight, normalise)
        self.discount, self.growing_window, self.ratio_of_sums = 1.0, False, True
        self.yields = TokenYield(len(arms))
        self.pool_yield = False
        self.model = SourceModel(arms, self.yields)
        self.source_model = False

    def configure(self, *, correct_prefill: bool, share: bool, share_weight: float, normalise: bool,
                  discount: float, growing_window: bool, ratio_of_sums: bool, pool_yield: bool = False,
                  source_model: bool = False) -> None:
        """The estimation knobs (``PlannerConfig``'s, and the scheme's ``ratio_of_sums``)."""
        self.correct_prefill, self.share, self.share_weight, self.normalise = (
            correct_prefill, share, share_weight, normalise)
        self.discount, self.growing_window, self.ratio_of_sums = discount, growing_window, ratio_of_sums
        self.pool_yield = pool_yield
        self.source_model = source_model

    # -- evidence ----------------------------------------------------------------------------------
    def observe(self, c: int, i: int, step: StepFeedback, time_s: float) -> None:
        """A steady-state step of arm i in bucket c that took ``time_s`` (the step's time, plus
        C_switch where the scheme charges it to the step): its loss per token, prefill taken out
        and normalised to the bucket's lower edge, joins the arm's evidence; the bucket ages."""
        bk = self.buckets[c]
        cell = bk.cells[i]
        b, p = step.batch_size, step.prefill_tokens
        tokens = max(1, step.tokens_emitted)
        bk.note_batch(b)
        normf = max(1, b) / bk.lo if self.normalise else 1.0
        scale = normf / tokens
        if self.correct_prefill:
            on = self.arms.drafting[i]
            self.prefill.regress(cell, p, time_s, on)
            loss = less_prefill(time_s, p, self.prefill.slope(on)) * scale
        else:
            loss = time_s * scale
        cell.observe(bk.w, loss=loss, tokens=tokens, time_s=time_s, prompt_tokens=p, normf=normf, batch=b,
                     ratio_of_sums=self.ratio_of_sums)
        self.yields.observe(i, tokens, b)
        bk.discount(self.discount, self.growing_window)

    def fill_excess(self, c: int, step: StepFeedback) -> float | None:
        """A resume's fill step: its time above a plain step at its batch and prefill (None while
        bucket c has no gamma-0 evidence)."""
        plain = self.plain_step_time(c, step.batch_size, step.prefill_tokens)
        return None if plain is None else max(0.0, step.step_time_s - plain)

    def load_priors(self, priors: PlannerPriors, cap: float) -> None:
        """Replace every bucket's priors (see ``priors.py``)."""
        prior_rules.load(self.buckets, self.edges, self.arms, priors, cap)

    def prior_steps(self, c: int) -> int | None:
        """Steps bucket c has played plus the steps its priors are worth; None without priors."""
        bk = self.buckets[c]
        return bk.observed + bk.prior_steps() if bk.has_prior else None

    def reconcile_priors(self, c: int, z: float) -> prior_rules.Verdict | None:
        """Bucket c's priors against its own evidence (``priors.reconcile``); None without priors."""
        bk = self.buckets[c]
        if not bk.has_prior:
            return None
        v = prior_rules.reconcile(bk, self.corrected(c), bk.cvs, z)
        if v.gross:  # the fleet worked under other conditions: forget every prior
            return prior_rules.Verdict(v.rescaled, v.dropped + prior_rules.clear(self.buckets), v.judged, v.gross, True)
        return v

    # -- reading -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.buckets)

    def cvs(self, c: int) -> list[float]:
        return self.buckets[c].cvs()

    def cvs_of(self, c: int) -> Callable[[], list[float]]:
        return self.buckets[c].cvs

    def total(self, c: int) -> float:
        """Effective observations of bucket c over all arms, priors included."""
        return self.buckets[c].total()

    def untried(self, c: int, i: int) -> bool:
        """Arm i has not played in bucket c and its prior there is worth less than a step."""
        bk = self.buckets[c]
        x = bk.cells[i]
        return x.steps == 0 and x.prior_count * (1.0 / bk.w) < 1.0

    def corrected(self, c: int, slopes: tuple[float, float] | None = None) -> list[float]:
        """Loss sums of bucket c with the learnt prefill cost of each arm's state taken out
        (``slopes``: ``prefill.slopes()`` when the caller already has them)."""
        cells = self.buckets[c].cells
        out = [x.loss_sum for x in cells]
        if self.correct_prefill:
            b_off, b_on = slopes if slopes is not None else self.prefill.slopes()
            if b_off > 0 or b_on > 0:
                out = [less_prefill(x.loss_sum, x.prompt_sum, b_on if on else b_off)
                       for on, x in zip(self.arms.drafting, cells, strict=True)]
        if self.pool_yield:
            y = self.model if self.source_model else self.yields
            out = [v * y.rescale(i, x.tokens_per_request()) for i, (v, x) in enumerate(zip(out, cells, strict=True))]
        return out

    def predictions(self, c: int, optimistic: bool = False) -> list[float | None] | None:
        """Per arm of bucket c, its loss predicted by the source model (``sourcemodel.py``) from the
        step times per request of the arms the bucket has played (prefill taken out), the draft's
        prefill charged to gamma > 0 as in ``estimates``; None when ``source_model`` is off.
        ``optimistic``: the yields at each source's alpha upper bound."""
        if not self.source_model:
            return None
        slopes = self.prefill.slopes() if self.correct_prefill else None
        times = self._step_times(c, slopes)
        # a source not tried here: the nearest smaller bucket's relative slope (a step's time grows
        # faster with gamma at larger batches, so this errs low), and at least the least slope of the
        # sources tried here (every source's drafts cost at least their verification)
        here = self.model.relative_slopes(times)
        floor = min(here.values(), default=0.0)
        missing = {s for s, g in zip(self.arms.source, self.arms.gamma, strict=True) if g > 0 and s not in here}
        borrowed: dict[str, float] = {}
        d = c - 1
        while missing and d >= 0:
            for s, r in self.model.relative_slopes(self._step_times(d, slopes)).items():
                if s in missing:
                    borrowed[s] = max(r, floor)
                    missing.discard(s)
            d -= 1
        for s in missing:
            if here:
                borrowed[s] = floor
        out = self.model.predict(times, borrowed, optimistic)
        extra = self.draft_prefill_charge(c)
        if extra > 0:
            out = [m + extra if m is not None and self.arms.drafting[i] else m for i, m in enumerate(out)]
        return out

    def _step_times(self, c: int, slopes: tuple[float, float] | None) -> list[float | None]:
        """Per arm of bucket c, its step time per request (prefill taken out, in the bucket's units:
        its loss x its own yield); None before it has played there."""
        times: list[float | None] = []
        for on, x in zip(self.arms.drafting, self.buckets[c].cells, strict=True):
            if x.steps == 0 or x.count <= 0 or x.req_sum <= 0:
                times.append(None)
                continue
            loss = x.loss_sum if slopes is None else less_prefill(x.loss_sum, x.prompt_sum, slopes[1] if on else slopes[0])
            times.append(loss / x.count * x.tok_sum / x.req_sum)
        return times

    def estimates(self, c: int) -> tuple[list[float | None], list[float]]:
        """Smoothed mean loss and effective count per arm of bucket c (priors and neighbour evidence
        included, the draft's prefill charged to gamma > 0)."""
        bk = self.buckets[c]
        slopes = self.prefill.slopes() if self.correct_prefill else None
        s = self.corrected(c, slopes)
        tn = [x.count + x.prior_count for x in bk.cells]
        ts = [s[i] + x.prior_loss_sum for i, x in enumerate(bk.cells)]
        if self.share:
            for d in (c - 1, c + 1):
                if 0 <= d < len(self.buckets):
                    self._borrow(c, d, tn, ts, s, self.corrected(d, slopes))
        means: list[float | None] = [ts[i] / tn[i] if tn[i] > 1e-12 else None for i in range(len(tn))]
        extra = self.draft_prefill_charge(c)
        if extra > 0:
            means = [m + extra if m is not None and self.arms.drafting[i] else m for i, m in enumerate(means)]
        inv = 1.0 / bk.w
        return means, [x * inv for x in tn]

    def _borrow(self, c: int, d: int, tn: list[float], ts: list[float], sc: list[float], sd: list[float]) -> None:
        """Add neighbour d's evidence to bucket c, rescaled via a reference arm both have tried
        (``sc``, ``sd``: the two buckets' corrected loss sums)."""
        bc, bd = self.buckets[c], self.buckets[d]
        nc, nd = [x.count for x in bc.cells], [x.count for x in bd.cells]
        inv_c, inv_d = 1.0 / bc.w, 1.0 / bd.w
        ref, ref_n = -1, 0.0
        for i in range(len(nc)):
            m = min(nc[i] * inv_c, nd[i] * inv_d)
            if m > ref_n:
                ref, ref_n = i, m
        if ref < 0 or ref_n < 1.0 or sd[ref] <= 0 or sc[ref] <= 0:
            return
        ratio = (sc[ref] / nc[ref]) / (sd[ref] / nd[ref])
        wc = bc.w
        for i in range(len(nc)):
            if i == ref or nd[i] <= 0:
                continue
            k = min(self.share_weight, nd[i] * inv_d) * wc  # pseudo-count in bucket c's scaling
            tn[i] += k
            ts[i] += k * ratio * sd[i] / nd[i]

    def own_mean(self, c: int, i: int) -> float | None:
        """Arm i's mean loss in bucket c from its own evidence and prior (no neighbours, no charge)."""
        x = self.buckets[c].cells[i]
        n = x.count + x.prior_count
        return (self.corrected(c)[i] + x.prior_loss_sum) / n if n > 0 else None

    def own_count(self, c: int, i: int) -> float:
        """Arm i's effective observations in bucket c, its prior's included."""
        bk = self.buckets[c]
        x = bk.cells[i]
        return (x.count + x.prior_count) * (1.0 / bk.w)

    def plain_step_time(self, c: int, batch: int, prompt_tokens: int) -> float | None:
        """Expected time of a gamma-0 step in bucket c at this batch and prefill; None while
        bucket c has no gamma-0 evidence."""
        i = self.arms.of("draft", 0)
        if i is None:
            return None
        x = self.buckets[c].cells[i]
        if x.count <= 0:
            return None
        slopes = self.prefill.slopes() if self.correct_prefill else None
        loss0 = x.loss_sum if slopes is None else less_prefill(x.loss_sum, x.prompt_sum, slopes[0])
        loss0 /= x.count  # per token, prefill removed, batch-normalised
        plain = loss0 * (self.buckets[c].lo if self.normalise else max(1, batch))
        plain += slopes[0] * prompt_tokens if slopes is not None else 0.0
        return plain

    def tokens_per_step(self, c: int, i: int) -> float:
        """Tokens a step of arm i emits in bucket c (the bucket's lower edge until it has played)."""
        return self.buckets[c].cells[i].tokens_per_step(float(self.buckets[c].lo))

    def in_bucket_units(self, c: int, per_token: float) -> float:
        """Seconds per generated token at bucket c's typical batch, in its learnt loss units."""
        bk = self.buckets[c]
        return per_token * bk.mean_batch / bk.lo if self.normalise and per_token else per_token

    def draft_prefill_charge(self, c: int) -> float:
        """The running draft's prefill per generated token, in bucket c's loss units."""
        return self.in_bucket_units(c, self.prefill.per_generated_token())

    def priced_at_step(self, c: int, means: list[float | None], prompt_tokens: int) -> list[float | None]:
        """``means`` with the gamma > 0 arms' draft prefill priced at this step's own prompt tokens
        instead of the workload's mean, where the step may turn the draft off: staying on commits
        the draft to prefilling this step's prompts now, while turning off defers them to a
        catch-up (priced in the turn-off's switching cost) that never comes for requests finishing
        before the draft resumes. Turning on is left at the mean price: deferring a resume by a
        step only moves this step's prompts into its catch-up."""
        slope = self.prefill.draft_slope()
        if not slope:
            return means
        mean_charge = self.draft_prefill_charge(c)
        return [
            m - mean_charge + self.in_bucket_units(c, slope * prompt_tokens / self.tokens_per_step(c, i))
            if m is not None and self.arms.drafting[i] else m
            for i, m in enumerate(means)
        ]

    def step_seconds(self, c: int, batch: int, per_token: float) -> float:
        """A per-token loss difference in bucket c's units as seconds per gamma-0 step at ``batch``
        (a gamma-0 step emits one token per request)."""
        return per_token * (self.buckets[c].lo if self.normalise else max(1, batch))
