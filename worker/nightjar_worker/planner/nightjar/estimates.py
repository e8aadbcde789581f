"""Per-bucket loss estimates: own evidence, priors, neighbours' evidence and the prefill corrections.

* ``correct_prefill``: each arm's loss sum less the learnt prefill cost of its draft state;
* ``share``: an arm seldom tried in one bucket borrows evidence from the neighbouring buckets,
  rescaled by the loss ratio of an arm both have tried (per-token loss scales with batch);
* ``normalise``: losses are learnt as loss x batch / bucket_lo (per-token loss falls like 1/batch
  in the memory-bound regime, which otherwise confounds arms held at different batch sizes inside
  one bucket); snapshots and priors use these units (loss at the bucket's lower edge);
* every arm that runs the draft model is charged the running draft's prefill per generated token
  (``PrefillCost.per_generated_token``), in the bucket's units.
"""

from __future__ import annotations

from dataclasses import dataclass

from nightjar_worker.planner.nightjar.arms import ArmSet
from nightjar_worker.planner.nightjar.cells import Bucket, less_prefill
from nightjar_worker.planner.nightjar.prefill import PrefillCost


@dataclass
class Estimator:
    buckets: list[Bucket]
    arms: ArmSet
    prefill: PrefillCost
    correct_prefill: bool = True
    share: bool = True
    share_weight: float = 2.0
    normalise: bool = True

    def corrected(self, c: int, slopes: tuple[float, float] | None = None) -> list[float]:
        """Loss sums of bucket c with the learnt prefill cost of each arm's state taken out
        (``slopes``: ``prefill.slopes()`` when the caller already has them)."""
        cells = self.buckets[c].cells
        if not self.correct_prefill:
            return [x.s for x in cells]
        b_off, b_on = slopes if slopes is not None else self.prefill.slopes()
        if b_off <= 0 and b_on <= 0:
            return [x.s for x in cells]
        return [less_prefill(x.s, x.sp, b_on if on else b_off) for on, x in zip(self.arms.drafting, cells, strict=True)]

    def estimates(self, c: int) -> tuple[list[float | None], list[float]]:
        """Smoothed mean loss and effective count per arm of bucket c (priors and neighbour evidence
        included, the draft's prefill charged to gamma > 0)."""
        bk = self.buckets[c]
        slopes = self.prefill.slopes() if self.correct_prefill else None
        s = self.corrected(c, slopes)
        tn = [x.n + x.pn for x in bk.cells]
        ts = [s[i] + x.ps for i, x in enumerate(bk.cells)]
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
        nc, nd = [x.n for x in bc.cells], [x.n for x in bd.cells]
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
        n = x.n + x.pn
        return (self.corrected(c)[i] + x.ps) / n if n > 0 else None

    def plain_step_time(self, c: int, batch: int, prompt_tokens: int) -> float | None:
        """Expected time of a gamma-0 step in bucket c at this batch and prefill; None while
        bucket c has no gamma-0 evidence."""
        i = self.arms.of("draft", 0)
        if i is None:
            return None
        x = self.buckets[c].cells[i]
        if x.n <= 0:
            return None
        slopes = self.prefill.slopes() if self.correct_prefill else None
        loss0 = x.s if slopes is None else less_prefill(x.s, x.sp, slopes[0])
        loss0 /= x.n  # per token, prefill removed, batch-normalised
        plain = loss0 * (self.buckets[c].lo if self.normalise else max(1, batch))
        plain += slopes[0] * prompt_tokens if slopes is not None else 0.0
        return plain

    def tokens_per_step(self, c: int, i: int) -> float:
        """Tokens a step of arm i emits in bucket c (the bucket's lower edge until it has played)."""
        return self.buckets[c].cells[i].tokens_per_step(float(self.buckets[c].lo))

    def in_bucket_units(self, c: int, per_token: float) -> float:
        """Seconds per generated token at bucket c's typical batch, in its learnt loss units."""
        bk = self.buckets[c]
        return per_token * bk.bmean / bk.lo if self.normalise and per_token else per_token

    def draft_prefill_charge(self, c: int) -> float:
        """The running draft's prefill per generated token, in bucket c's loss units."""
        return self.in_bucket_units(c, self.prefill.per_generated_token())

    def step_seconds(self, c: int, batch: int, per_token: float) -> float:
        """A per-token loss difference in bucket c's units as seconds per gamma-0 step at ``batch``
        (a gamma-0 step emits one token per request)."""
        return per_token * (self.buckets[c].lo if self.normalise else max(1, batch))
