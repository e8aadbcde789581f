"""Planner priors from a measured cost profile: start warm when the pair's cost surface is known.

A fleet's workers learn these from each other (the operator averages their planner snapshots); a
single worker, or a benchmark that has just swept the static arms, can derive the same belief from
the ``CostProfile`` it measured (``nightjar-worker profile``, or the step log of a static sweep) and
push it like any other priors (runtime config ``priors``). Pure: no torch, no vllm.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from nightjar_contract.planner import PlannerConfig, PlannerPriors, PriorEntry

if TYPE_CHECKING:
    from nightjar_worker.sim.profile import CostProfile
    from nightjar_worker.sim.sources import SourceTable


def priors_from_profile(profile: CostProfile, config: PlannerConfig, count: float | None = None,
                        sources: SourceTable | None = None) -> PlannerPriors:
    """Per bucket lower edge and arm, the profile's expected seconds per generated token at the
    bucket's geometric middle batch (decode steps without prefill, the geometric acceptance of the
    profile's ``all`` rate), batch-normalised to the lower edge: the units of
    ``NightjarPolicy.snapshot``. Not at the edge itself: the worker normalises a step at batch b by
    b / edge, which matches an edge prior only where the step time is flat in the batch; in a
    compute-bound bucket a worker measured gamma 0 well above its edge prior, dropped that prior
    alone and played the arms whose priors still stood (docs/planner.md). Each entry is worth
    ``count`` observations (default ``config.prior_max_count``, the most a prior may count for).

    The draft's prefill cost per prompt token travels with them (``draft_prefill_s_per_token``).

    With ``sources`` (``sim/sources.py``, the pair's calibration), the arms of every host
    source in it get entries too (their step cost and acceptance from the table), so a worker with 9+
    arms does not start by trying each in every bucket.

    Buckets whose lower edge lies beyond the profiled batch sizes, and arms beyond its gammas, get no
    entry: the profile extrapolates there, and a guess would only delay the planner's own evidence."""
    n = config.prior_max_count if count is None else count
    top_b, top_g = profile.batch_sizes[-1], profile.gammas[-1]
    edges = config.edges()
    # each bucket's geometric middle batch (within the profiled batch sizes), by lower edge
    his = [e - 1 for e in edges[1:]] + [config.max_batch]
    mid = {lo: min(max(lo, round(math.sqrt(lo * max(hi, lo)))), top_b) for lo, hi in zip(edges, his, strict=True)}
    entries = [
        PriorEntry(bucket_lo=lo, gamma=g, mean_loss_s=profile.expected_loss(mid[lo], g) * mid[lo] / lo, count=n)
        for lo in edges if lo <= top_b
        for g in config.resolved_arms() if g <= top_g
    ]
    if sources is not None:
        from nightjar_worker.sim.profile import expected_tokens

        a = "all"
        host = config.host_arms()
        for name in sources.names():
            src = sources[name]
            if src.runs_draft or name not in host:
                continue
            entries += [
                PriorEntry(bucket_lo=lo, gamma=g, source=name, count=n,
                           mean_loss_s=src.step_time(profile, mid[lo], g) / (lo * expected_tokens(g, src.acceptance(profile, a))))
                for lo in edges if lo <= top_b
                for g in host[name] if g <= top_g
            ]
    dps = profile.draft_prefill_rate() or None
    return PlannerPriors(bucket_edges=list(config.edges()), entries=entries, draft_prefill_s_per_token=dps)
