"""Each part of the Nightjar planner on its own (planner/nightjar/*.py)."""

from __future__ import annotations

import math
import random

import pytest
from nightjar_contract.planner import PlannerPriors, PriorEntry
from nightjar_worker.planner.nightjar.arms import ArmSet
from nightjar_worker.planner.nightjar.cells import Bucket, Cell
from nightjar_worker.planner.nightjar.estimates import Estimator
from nightjar_worker.planner.nightjar.excursions import Excursions
from nightjar_worker.planner.nightjar.explore import Candidates, PrunedExplorer, UniformExplorer
from nightjar_worker.planner.nightjar.flips import FlipPricer
from nightjar_worker.planner.nightjar.gate import AcceptanceGate
from nightjar_worker.planner.nightjar.prefill import PrefillCost
from nightjar_worker.planner.nightjar.priors import load, reconcile
from nightjar_worker.planner.nightjar.schedule import Schedule
from nightjar_worker.planner.nightjar.switching import Dwell, PaperSwitchCost, SwitchCost
from nightjar_worker.planner.policy import StepFeedback

ARMS = (0, 1, 2)
_RNG = random.Random(0)


def _observe(bk: Bucket, i: int, loss: float, tokens: int = 4, steps: int = 1, steady: float = 0.9995,
             noise: float = 0.0) -> None:
    for _ in range(steps):
        x = loss * (1 + noise * _RNG.gauss(0, 1))
        bk.cells[i].observe(bk.w, loss=x, tokens=tokens, time_s=x * tokens, prompt_tokens=0, normf=1.0, batch=tokens,
                            ratio_of_sums=True)
        bk.discount(steady, growing=True)


def _mean(bk: Bucket, i: int) -> float:
    return bk.cells[i].loss_sum / bk.cells[i].count


# -- cells -------------------------------------------------------------------------------------------
def test_every_float_slot_of_a_cell_is_either_weighted_or_named_unweighted():
    assert set(Cell.WEIGHTED) | set(Cell.UNWEIGHTED) == set(Cell.__slots__)
    assert not set(Cell.WEIGHTED) & set(Cell.UNWEIGHTED)


def test_rescaling_keeps_every_mean_and_count():
    bk = Bucket(4, 3)
    _observe(bk, 1, 0.02, steps=50)
    before = (bk.count(1), _mean(bk, 1), bk.cvs())
    bk.rescale(bk.w)
    bk.w = 1.0
    assert (bk.count(1), _mean(bk, 1)) == pytest.approx(before[:2], rel=1e-12)
    assert bk.cvs() == pytest.approx(before[2], rel=1e-9)


def test_the_growing_window_forgets_a_cold_start_and_the_discount_tracks_a_shift():
    bk = Bucket(4, 1)
    _observe(bk, 0, 0.05, steps=20)  # a cold-start transient
    _observe(bk, 0, 0.01, steps=200)
    assert _mean(bk, 0) < 0.012  # the transient has faded, far more than 20 / 220 of it
    assert bk.count(0) < 220


def test_the_weight_rescales_before_it_overflows():
    bk = Bucket(1, 1)
    _observe(bk, 0, 0.01, steps=2000, steady=0.5)
    assert math.isfinite(bk.w) and bk.w <= 1e150
    assert _mean(bk, 0) == pytest.approx(0.01)


def test_the_noise_of_an_arm_is_its_own_shrunk_towards_the_bucket():
    rng = random.Random(0)
    bk = Bucket(4, 2)
    for _ in range(400):
        _observe(bk, 0, 0.01 * (1 + 0.1 * rng.gauss(0, 1)))
    cv = bk.cvs()
    assert cv[0] == pytest.approx(0.1, rel=0.15)
    assert cv[1] == pytest.approx(cv[0], rel=1e-9)  # untried: the bucket's pooled noise


# -- gate ---------------------------------------------------------------------------------------------
def test_the_gate_closes_on_a_never_accepted_draft_and_reopens_as_its_counts_decay():
    g = AcceptanceGate(min_acceptance=0.05, min_tokens=64, halflife_steps=100, z=2.0)
    g.observe(40, 0)
    assert not g.closed()  # too few drafted tokens to judge
    for _ in range(20):
        g.observe(40, 0)
    assert g.closed()
    for _ in range(1000):
        g.observe(0, 0)
    assert not g.closed()
    ok = AcceptanceGate(min_acceptance=0.05, min_tokens=64, halflife_steps=100, z=2.0)
    for _ in range(20):
        ok.observe(40, 20)
    assert not ok.closed()


# -- excursions -----------------------------------------------------------------------------------------
def test_excursions_measure_how_long_the_batch_stays_above_and_below_a_bucket():
    ex = Excursions(3, initial=32.0)
    for _ in range(80):  # 10 steps in bucket 0, 5 in bucket 2, repeated
        for c in [0] * 10 + [2] * 5:
            ex.step(c)
    assert ex.above(1) == pytest.approx(5, rel=0.1)  # runs at or above bucket 1
    assert ex.below(1) == pytest.approx(10, rel=0.1)  # runs at or below bucket 1


def test_a_stay_not_yet_ended_counts_for_as_long_as_it_has_lasted():
    ex = Excursions(3, initial=32.0)
    for _ in range(200):
        ex.step(1)
    assert ex.below(1) == 32.0  # no run at or below bucket 1 has ended
    assert ex.staying_below(1) == pytest.approx(199, abs=1)
    assert ex.staying_below(0) == 32.0  # the context is not at or below bucket 0
    ex.step(2)
    assert ex.staying_below(1) == pytest.approx(32 + 0.1 * (200 - 32))  # ended: its mean


# -- schedule ----------------------------------------------------------------------------------------
def test_blocks_double_and_bins_are_about_the_square_root_of_their_block():
    s = Schedule()
    sizes = [s.next_bin(max_block_exp=12) for _ in range(12)]
    # blocks of 1, 2, 4, 8, 16 steps in bins of round(sqrt(block)): 1 | 1 1 | 2 2 | 3 3 2 | 4 4 4 4
    assert sizes == [1, 1, 1, 2, 2, 3, 3, 2, 4, 4, 4, 4]
    assert s.handed_out == sum(sizes)
    s2 = Schedule()
    s2.advance(1000, 12)
    assert s2.handed_out >= 1000 and s2.explore_probability(1.0, 0.0) < s.explore_probability(1.0, 0.0)


# -- switching ---------------------------------------------------------------------------------------
def _resume(sw: SwitchCost, missed: int, cost: float) -> None:
    sw.observe(StepFeedback(batch_size=1, gamma=2, step_time_s=0.1, tokens_emitted=1, switch_cost_s=cost,
                            catchup_tokens=missed), 0, None)


def test_the_catch_up_line_is_fitted_over_resumes_and_predicts_with_the_bucket_fill():
    sw = SwitchCost(buckets=2)
    for missed in (100, 300, 200, 400):
        _resume(sw, missed, 0.2 + 0.01 * missed)
    assert sw.catchup_line() == pytest.approx((0.2, 0.01))
    sw.observe(StepFeedback(batch_size=8, gamma=1, step_time_s=1.0, tokens_emitted=8), 1, 0.5)  # a fill excess
    assert sw.predict(1000, 1) == pytest.approx(0.2 + 10 + 0.5)
    assert sw.predict(1000, 0) == pytest.approx(0.2 + 10)
    sw.configure(override=0.05)
    assert sw.predict(1000, 1) == 0.05


def test_before_the_line_a_catch_up_is_priced_at_the_drafts_prefill_rate():
    rate: list[float | None] = [None]
    sw = SwitchCost(buckets=1, prefill_rate=lambda: rate[0])
    _resume(sw, 0, 0.24)  # one small resume (the first prompt's): without a rate it prices them all
    assert sw.predict(8780, 0) == pytest.approx(0.24)
    rate[0] = 0.005  # the draft prefills 200 tokens a second
    assert sw.predict(8780, 0) == pytest.approx(0.24 + 0.005 * 8780)
    for missed in (100, 300, 200):  # four resumes in all: their own line wins
        _resume(sw, missed, 0.2 + 0.01 * missed)
    line = sw.catchup_line()
    assert line is not None and sw.predict(1000, 0) == pytest.approx(line[0] + line[1] * 1000)


def test_the_papers_switch_cost_is_the_mean_observed():
    sw = PaperSwitchCost(buckets=1)
    assert sw.predict(500, 0) == 0.0
    for missed in (100, 300):
        _resume(sw, missed, 1.0)
    assert sw.predict(5000, 0) == pytest.approx(1.0) and PaperSwitchCost.charged_to_step


def test_the_draft_lag_levels_off_and_the_engine_count_replaces_the_guess():
    assert SwitchCost.lag_after(10_000, 1.0) == pytest.approx(256, rel=0.01)
    sw = SwitchCost(buckets=1)
    for _ in range(50):
        sw.observe(StepFeedback(batch_size=1, gamma=0, step_time_s=0.1, tokens_emitted=1), 0, None)
    assert sw.off_tokens > 40
    sw.observe(StepFeedback(batch_size=1, gamma=0, step_time_s=0.1, tokens_emitted=1, draft_lag_tokens=7), 0, None)
    assert sw.off_tokens == 8


def test_dwell_tracks_the_policy_own_run_lengths():
    d = Dwell(32.0)
    for _ in range(40):
        for k in range(10):
            d.step(flipped=k == 0, was_on=True)  # 10 steps off after each turn-off
        for k in range(5):
            d.step(flipped=k == 0, was_on=False)  # 5 on after each turn-on
    assert (d.mean(on=False), d.mean(on=True)) == pytest.approx((10, 5), rel=0.02)


# -- prefill -------------------------------------------------------------------------------------------
def test_the_prefill_slope_is_learnt_per_draft_state_and_the_draft_share_charged_per_token():
    pc = PrefillCost(amortise=True, catchup_rate=lambda: None)
    for on, slope in ((False, 0.02), (True, 0.03)):
        cell = Cell()
        for k in range(60):
            p = 100 * (k % 3 == 0)
            pc.regress(cell, p, 0.5 + slope * p, on)
            pc.observe_workload(p, 4)
    assert pc.slopes() == pytest.approx((0.02, 0.03), rel=0.05)
    assert pc.learnt_draft_slope() == pytest.approx(0.01, rel=0.1)
    assert pc.per_generated_token() == pytest.approx(0.01 * pc.prompt_per_generated(), rel=0.1)
    pc.amortise = False
    assert pc.per_generated_token() == 0.0


def test_before_both_states_have_seen_prompts_the_prior_then_the_catch_up_rate_prices_the_draft():
    pc = PrefillCost(amortise=True, catchup_rate=lambda: 0.007)
    assert pc.draft_slope() == 0.007
    pc.set_prior_slope(0.004)
    assert pc.draft_slope() == 0.004


# -- priors ----------------------------------------------------------------------------------------------
def _bucket_with_priors(prior_means: dict[int, float], count: float = 20.0) -> Bucket:
    bk = Bucket(4, 3)
    pri = PlannerPriors(bucket_edges=[4], entries=[PriorEntry(bucket_lo=4, gamma=g, mean_loss_s=m, count=count)
                                                  for g, m in prior_means.items()])
    load([bk], (4,), ArmSet.build(tuple(ARMS)), pri, cap=16.0)
    return bk


def test_priors_load_capped_and_a_level_shift_rescales_them_all():
    bk = _bucket_with_priors({0: 0.010, 1: 0.008, 2: 0.009})
    assert bk.has_prior and bk.cells[0].prior_count / bk.w == 16.0
    _observe(bk, 0, 0.020, steps=30)  # this worker is twice as slow on both arms it tried
    _observe(bk, 1, 0.016, steps=30)
    v = reconcile(bk, [x.loss_sum for x in bk.cells], bk.cvs, z=2.0)
    assert v.rescaled and v.dropped == 0
    assert bk.cells[2].prior_loss_sum / bk.cells[2].prior_count == pytest.approx(0.018, rel=0.02)  # the untried arm follows


def test_a_prior_contradicted_by_one_arm_alone_is_dropped():
    bk = _bucket_with_priors({0: 0.010, 1: 0.008})
    _observe(bk, 0, 0.010, steps=30, noise=0.05)  # agrees
    _observe(bk, 1, 0.016, steps=30, noise=0.05)  # twice its prior
    v = reconcile(bk, [x.loss_sum for x in bk.cells], bk.cvs, z=2.0)
    assert (v.rescaled, v.dropped, v.judged, v.gross) == (False, 1, 2, False)  # 2x off: not gross (priors.GROSS)
    assert bk.cells[1].prior_count == 0 and 1 in bk.dropped and bk.cells[0].prior_count > 0


# -- estimates and flips ------------------------------------------------------------------------------------
def _estimator(share: bool = True) -> Estimator:
    return Estimator((1, 2, 4), ArmSet.build(ARMS), PrefillCost(amortise=False, catchup_rate=lambda: None), share=share)


def test_a_neighbour_lends_an_untried_arm_rescaled_by_an_arm_both_have_tried():
    est = _estimator()
    _observe(est.buckets[1], 0, 0.02, steps=20)  # bucket 2: gamma 0 only
    _observe(est.buckets[2], 0, 0.01, steps=20)  # bucket 4: gamma 0 and 2, twice as cheap
    _observe(est.buckets[2], 2, 0.006, steps=20)
    means, counts = est.estimates(1)
    assert means[2] == pytest.approx(0.012, rel=0.02)  # 0.006 x (0.02 / 0.01)
    assert 0 < counts[2] <= 2.0  # at most share_weight pseudo-observations
    est.share = False
    assert est.estimates(1)[0][2] is None


def test_a_flip_costs_nothing_unless_it_flips_and_a_resume_is_amortised_over_the_on_run():
    est = _estimator(share=False)
    sw = SwitchCost(buckets=3, override=3.2)
    flips = FlipPricer(est, sw, Dwell(32.0), Excursions(3, 32.0), amortise_steps=32)
    _observe(est.buckets[2], 2, 0.01, tokens=8, steps=20)
    assert flips.penalty(2, 2, on_now=True) == 0.0
    # 3.2 s over 32 steps of 8 tokens, in bucket units (normalised at the bucket's mean batch = lo)
    assert flips.penalty(2, 2, on_now=False) == pytest.approx(3.2 / (32 * 8))
    assert flips.penalty(2, 2, on_now=False, horizon=4) == pytest.approx(3.2 / (4 * 8))


def test_a_resume_amortises_over_the_stay_where_speculation_gains_when_that_is_longer():
    est = _estimator(share=False)
    sw = SwitchCost(buckets=3, override=3.2)
    ex = Excursions(3, 32.0)
    flips = FlipPricer(est, sw, Dwell(32.0), ex, amortise_steps=32)
    _observe(est.buckets[1], 2, 0.01, tokens=8, steps=20)
    for _ in range(500):  # a steady load in bucket 1
        ex.step(1)
    flips.on_gain[:] = [None, 0.002, -0.001]  # speculation gains in bucket 1, loses in 2
    assert flips.on_run(1) == pytest.approx(499, abs=1)  # the stay at or below bucket 1 so far
    assert flips.penalty(1, 2, on_now=False) == pytest.approx(3.2 / (499 * 8), rel=0.01)
    for _ in range(3):  # the batch rises to bucket 2 and back, 3 times, 5 steps a time
        for c in [2] * 5 + [1] * 5:
            ex.step(c)
    # ended stays: their moving mean (the long one's weight decaying), not the current 5 steps
    assert flips.on_run(1) == ex.below(1) == pytest.approx(64.8, abs=0.1)
    assert flips.penalty(1, 2, on_now=False) == pytest.approx(3.2 / (int(ex.below(1)) * 8))
    flips.on_gain[2] = 0.001  # gains in bucket 2 too: the context has stayed at or below it all along
    assert flips.on_run(1) == pytest.approx(529, abs=1)


# -- explore --------------------------------------------------------------------------------------------
def test_exploration_tries_what_the_bucket_has_not_and_the_paper_draws_uniformly():
    est = _estimator(share=False)
    sched = [Schedule() for _ in est.buckets]
    flips = FlipPricer(est, SwitchCost(3), Dwell(32.0), Excursions(3, 32.0), 32)
    ex = PrunedExplorer(random.Random(0), est.arms, est, sched, flips, monotone=False, eliminate=False)
    _observe(est.buckets[1], 0, 0.02, steps=10)
    _observe(est.buckets[1], 1, 0.015, steps=10)
    means, counts = est.estimates(1)
    k = Candidates(c=1, cand=[0, 1, 2], means=means, counts=counts, eff=[0.02, 0.015, None], best=1)
    k.eff = [0.02, 0.015, None]
    assert ex.choose(k, on_now=True) == 2  # untried
    assert ex.hold(k, 2, left=5, raising=True) == 1  # n + 1 steps: 0 observations, one more for the fill
    uni = UniformExplorer(random.Random(0))
    assert {uni.choose(k, True) for _ in range(50)} == {0, 1, 2} and uni.hold(k, 2, 5, True) == 5


def test_source_then_gamma_skips_the_other_gammas_of_a_clearly_losing_source():
    """Arms: gamma 0, draft 1-2, n-gram 1-2. In a bucket where draft gamma 1 lost by 60 %, the untried
    draft gamma 2 is not explored; an untried source's arm is tried before another gamma of a tried one."""
    est = Estimator((1, 2, 4), ArmSet.build((0, 1, 2), {"ngram": (1, 2)}), PrefillCost(amortise=False, catchup_rate=lambda: None),
                    share=False)
    sched = [Schedule() for _ in est.buckets]
    flips = FlipPricer(est, SwitchCost(3), Dwell(32.0), Excursions(3, 32.0), 32)
    _observe(est.buckets[1], 0, 0.010, steps=10)
    _observe(est.buckets[1], 1, 0.016, steps=10)  # draft gamma 1: 60 % worse than gamma 0
    means, counts = est.estimates(1)
    eff = list(means)
    picks = set()
    for on in (True, False):
        ex = PrunedExplorer(random.Random(0), est.arms, est, sched, flips, monotone=False, eliminate=False,
                            source_first=on)
        k = Candidates(c=1, cand=[0, 1, 2, 3, 4], means=means, counts=counts, eff=eff, best=0)
        picks.add((on, frozenset(ex.choose(k, on_now=False) for _ in range(40))))
    assert (True, frozenset({3, 4})) in picks  # n-gram's arms, never draft gamma 2
    assert any(not on and 2 in p for on, p in picks)  # without it, draft gamma 2 is explored too
    # once n-gram gamma 1 has been tried and holds its own, n-gram gamma 2 is still worth a try
    _observe(est.buckets[1], 3, 0.011, steps=10)
    means, counts = est.estimates(1)
    ex = PrunedExplorer(random.Random(0), est.arms, est, sched, flips, monotone=False, eliminate=False)
    k = Candidates(c=1, cand=[0, 1, 2, 3, 4], means=means, counts=counts, eff=list(means), best=0)
    assert ex.choose(k, on_now=False) == 4


def test_the_monotone_prior_keeps_exploration_between_the_neighbours_best_arms():
    est = _estimator(share=False)
    sched = [Schedule() for _ in est.buckets]
    flips = FlipPricer(est, SwitchCost(3), Dwell(32.0), Excursions(3, 32.0), 32)
    ex = PrunedExplorer(random.Random(0), est.arms, est, sched, flips, monotone=True, eliminate=False)
    _observe(est.buckets[2], 0, 0.01, steps=200)  # bucket 4 (larger batch) is established on gamma 1
    sched[2].best = 1
    k = Candidates(c=1, cand=[0, 1, 2], means=[None] * 3, counts=[0.0] * 3, eff=[None] * 3, best=-1)
    picks = {ex.choose(k, on_now=True) for _ in range(30)}
    assert picks <= {1, 2}  # never below the larger batch's best gamma


# -- arms ------------------------------------------------------------------------------------------------
def test_arms_are_draft_gammas_then_ngram_ones_and_gamma_0_is_one_arm():
    a = ArmSet.build((0, 1, 2, 3), {"ngram": (2, 3)})
    assert a.keys == (("draft", 0), ("draft", 1), ("draft", 2), ("draft", 3), ("ngram", 2), ("ngram", 3))
    assert a.drafting == (False, True, True, True, False, False)
    assert a.of("ngram", 0) == a.of("draft", 0) == 0 and a.of("ngram", 3) == 5 and a.of("ngram", 1) is None
    assert a.draft_index() == {0: 0, 1: 1, 2: 2, 3: 3} and a.gammas() == (0, 1, 2, 3)


# -- TokenYield: tokens per request pooled over buckets ------------------------------------------
def test_token_yield_pools_tokens_per_request_and_waits_for_enough():
    from nightjar_worker.planner.nightjar.yields import TokenYield

    y = TokenYield(2, halflife_steps=10_000, min_requests=7)
    y.observe(1, 6, 4)  # 4 requests, 1.5 tokens each
    assert y.per_request(1) is None and y.rescale(1, 2.0) == 1.0  # too few requests: the cell's own stands
    y.observe(1, 10, 4)  # 8 requests, 16 tokens: 2 per request
    assert y.per_request(1) == pytest.approx(2.0, rel=1e-3)
    # a cell whose own draws came out lucky (3 per request) is read over the pooled yield
    assert y.rescale(1, 3.0) == pytest.approx(1.5, rel=1e-3)
    assert y.per_request(0) is None


def test_token_yield_forgets_with_its_half_life():
    from nightjar_worker.planner.nightjar.yields import TokenYield

    y = TokenYield(1, halflife_steps=4, min_requests=1)
    for _ in range(40):
        y.observe(0, 1, 1)  # 1 token per request
    for _ in range(40):
        y.observe(0, 3, 1)  # content changed: 3 per request
    assert y.per_request(0) == pytest.approx(3.0, rel=0.01)


def test_pooled_yield_separates_near_tied_arms_with_noisy_tokens():
    """Two arms whose time per request differs by 4 %, tokens per request a noisy draw: reading each
    bucket's loss over the pooled yield ranks them right in buckets where the own draws do not."""
    import random

    from nightjar_contract.planner import PlannerConfig
    from nightjar_worker.planner.nightjar import NightjarPolicy
    from nightjar_worker.planner.policy import StepFeedback

    wrong = {}
    for pool in (False, True):
        pol = NightjarPolicy(PlannerConfig(max_gamma=2, arms=[1, 2], pool_yield=pool, seed=0))
        rng = random.Random(3)
        for g, t in ((1, 1.0), (2, 1.04)):  # one arm, then the other (a step raising gamma is a fill)
            for _ in range(31):
                for b in (1, 2, 4, 8, 16, 32):
                    tokens = sum(1 + (rng.random() < 0.6) for _ in range(b))  # same yield for both arms
                    pol.observe(StepFeedback(batch_size=b, gamma=g, step_time_s=t * b, tokens_emitted=tokens,
                                             num_draft_tokens=b * g, num_accepted_tokens=tokens - b))
        wrong[pool] = 0
        for b in (1, 2, 4, 8, 16, 32):
            est = pol.estimates(b)
            wrong[pool] += est[("draft", 1)] >= est[("draft", 2)]  # type: ignore[operator]
    assert wrong[True] == 0 and wrong[True] < wrong[False]


# -- SourceModel: statistics shared across a source's gammas ----------------------------------------------
def _geo(g: int, alpha: float) -> float:
    return sum(alpha**i for i in range(g + 1))


def test_fit_alpha_recovers_the_geometric_rate_over_mixed_gammas():
    from nightjar_worker.planner.nightjar.sourcemodel import accepted_per_request, fit_alpha

    pts = [(g, r, r * accepted_per_request(g, 0.66)) for g, r in ((1, 40.0), (3, 10.0), (4, 100.0))]
    assert fit_alpha(pts) == pytest.approx(0.66, abs=1e-4)
    assert fit_alpha([(2, 10.0, 0.0)]) == 0.0  # nothing accepted
    assert fit_alpha([(2, 10.0, 20.0)]) == 0.99  # everything accepted: clamped


def test_line_at_interpolates_and_extrapolates_with_the_last_slope():
    from nightjar_worker.planner.nightjar.sourcemodel import line_at

    pts = [(0, 1.0), (1, 1.2), (3, 2.0)]
    assert line_at(pts, 2) == pytest.approx(1.6)  # between the two around it
    assert line_at(pts, 4) == pytest.approx(2.4)  # the last two's slope (0.4 per gamma)
    assert line_at([(2, 1.0), (3, 0.8)], 4) == pytest.approx(0.8)  # never a falling time
    assert line_at([(1, 1.0)], 2) is None  # one point is no line


def _model(alpha: float, requests: dict[int, float], extra: float = 0.0):
    """A SourceModel over draft 0..2 and n-gram 1..4 whose n-gram gammas pooled ``requests`` with
    exactly geometric yields at ``alpha`` (gamma 0: 1 + ``extra`` tokens per request)."""
    from nightjar_worker.planner.nightjar.sourcemodel import SourceModel
    from nightjar_worker.planner.nightjar.yields import TokenYield

    arms = ArmSet.build((0, 1, 2), {"ngram": (1, 2, 3, 4)})
    y = TokenYield(len(arms), halflife_steps=10**9)
    y.observe(0, 64, 64)
    y.tokens[0] = 64 * (1 + extra)
    for g, r in requests.items():
        i = arms.of("ngram", g)
        y.tokens[i], y.requests[i] = r * (_geo(g, alpha) + extra), r
    return arms, SourceModel(arms, y)


def test_source_model_yields_are_shrunk_towards_the_geometric_fit():
    arms, m = _model(0.6, {1: 200.0}, extra=0.05)  # only gamma 1 played: gamma 4 known from alpha
    assert m.alpha("ngram") == pytest.approx(0.6, abs=1e-3) and m.alpha("draft") is None
    assert m.per_request(arms.of("ngram", 4)) == pytest.approx(_geo(4, 0.6) + 0.05, rel=1e-3)
    assert m.per_request(arms.of("draft", 2)) is None  # the draft has not drafted: no fit, no yield
    # a few draws of gamma 3 that came out lucky move it less than their own mean would
    y, i = m.yields, arms.of("ngram", 3)
    y.tokens[i], y.requests[i] = 8 * 4.0, 8.0
    y.steps += 1
    assert _geo(3, 0.6) + 0.05 < m.per_request(i) < 0.5 * (4.0 + _geo(3, 0.6))
    # the optimistic yield (alpha's upper bound) is above the point one
    assert m.per_request(arms.of("ngram", 4), optimistic=True) > m.per_request(arms.of("ngram", 4))


def test_source_model_check_drops_a_source_whose_yields_are_not_geometric():
    arms, m = _model(0.6, {1: 200.0, 4: 200.0})
    assert m.alpha("ngram") is not None
    y, i = m.yields, arms.of("ngram", 4)
    y.tokens[i] = 200.0 * 3.4  # 1 + 0.6 g: every draft accepted at 0.6, independently (no prefix)
    y.steps += 1
    assert m.alpha("ngram") is None
    assert m.per_request(i) == pytest.approx(3.4)  # its own pooled yield again


def test_source_model_predicts_an_untried_gamma_from_the_bucket_line_and_alpha():
    arms, m = _model(0.6, {1: 200.0})
    times: list[float | None] = [None] * len(arms)
    times[arms.of("draft", 0)], times[arms.of("ngram", 1)] = 1.0, 1.3  # +0.3 per drafted token
    pred = m.predict(times)
    i4 = arms.of("ngram", 4)
    assert pred[i4] == pytest.approx((1.0 + 4 * 0.3) / _geo(4, 0.6), rel=1e-3)
    assert pred[arms.of("ngram", 1)] == pytest.approx(1.3 / _geo(1, 0.6), rel=1e-3)  # own time, pooled yield
    assert pred[arms.of("draft", 1)] is None  # no draft yield yet
    # a source not tried in this bucket: a borrowed relative slope
    times[arms.of("ngram", 1)] = None
    assert m.predict(times, {"ngram": 0.1})[i4] == pytest.approx(1.4 / _geo(4, 0.6), rel=1e-3)
    assert m.predict(times)[i4] is None
    assert m.relative_slopes([None, None, None, 1.3, None, None, None]) == {}  # gamma 0 missing
    t = [1.0, 1.5, None, 1.3, None, 1.9, None]
    assert m.relative_slopes(t) == {"draft": pytest.approx(0.5), "ngram": pytest.approx(0.3)}


def test_estimator_predictions_follow_the_bucket_step_times():
    """Steps of gamma 0 and n-gram gamma 1 at batch 200 (time linear in gamma, geometric yields):
    n-gram gamma 4, never played, is predicted at its true loss within the model's few per cent."""
    arms = ArmSet.build((0, 1, 2), {"ngram": (1, 2, 3, 4)})
    est = Estimator((1, 128, 192), arms, PrefillCost(amortise=False, catchup_rate=lambda: None))
    est.configure(correct_prefill=True, share=True, share_weight=2.0, normalise=True, discount=0.9995,
                  growing_window=True, ratio_of_sums=True, pool_yield=True, source_model=True)
    rng = random.Random(3)
    alpha, b = 0.65, 200

    def step(g: int) -> None:
        tokens = b + sum(next(n for n in range(g + 1) if n == g or rng.random() >= alpha) for _ in range(b)) if g else b
        t = 0.01 * (1 + 0.45 * g)
        fb = StepFeedback(batch_size=b, gamma=g, step_time_s=t, tokens_emitted=tokens, num_draft_tokens=b * g,
                          num_accepted_tokens=tokens - b, source="ngram" if g else "draft")
        est.observe(2, arms.of("ngram", g), fb, t)

    for _ in range(3):
        step(0)
        step(1)
    pred = est.predictions(2)
    assert pred is not None
    true4 = 0.01 * (1 + 0.45 * 4) / (_geo(4, alpha) * 192)  # per token at the bucket's lower edge
    assert pred[arms.of("ngram", 4)] == pytest.approx(true4, rel=0.05)
    assert pred[arms.of("draft", 1)] is None  # the draft: no acceptance known
    est.source_model = False
    assert est.predictions(2) is None


def test_explorer_skips_arms_predicted_to_lose_and_tries_the_predicted_best_first():
    from nightjar_worker.planner.nightjar.explore import unknown_source

    arms = ArmSet.build((0, 1), {"ngram": (1, 2, 3)})
    est = Estimator((1, 4), arms, PrefillCost(amortise=False, catchup_rate=lambda: None))
    sw = SwitchCost(2)
    flips = FlipPricer(est, sw, Dwell(32.0), Excursions(2, 32.0), 32)
    ex = PrunedExplorer(random.Random(0), arms, est, [Schedule(), Schedule()], flips)
    means = [1.0, None, None, None, None]
    counts = [20.0, 0.0, 0.0, 0.0, 0.0]
    for _ in range(20):
        est.buckets[1].cells[0].observe(1.0, loss=1.0, tokens=4, time_s=4.0, prompt_tokens=0, normf=1.0, batch=4,
                                        ratio_of_sums=True)
    pred = [1.0, None, 0.98, 0.85, 1.6]  # ngram 3 predicted 1.6x gamma 0: skipped
    k = Candidates(c=1, cand=list(range(5)), means=means, counts=counts, eff=list(means), best=0, pred=pred,
                   bound=pred)
    picks = {ex.choose(k, on_now=False) for _ in range(20)}
    assert picks == {1}  # the draft (no prediction: it anchors its line) first
    k.pred = k.bound = [1.0, 1.2, 0.98, 0.85, 1.6]
    assert ex.choose(k, on_now=False) == 3  # then the lowest prediction; ngram 3 never
    k.pred = k.bound = [1.0, 1.5, 1.05, 1.5, 1.6]
    assert ex.choose(k, on_now=False) == 2  # 1.05 x 0.9 is within the best's bound (1.0); 1.5 not
    k.pred, k.bound = [1.0, 1.5, 1.5, 1.5, 1.6], [1.0, 1.5, 1.05, 1.5, 1.6]
    assert ex.choose(k, on_now=False) == 2  # pruning reads the optimistic bound
    assert unknown_source(arms, list(range(5)), means, [1.0, None, None, None, None])  # both sources unknown
    assert not unknown_source(arms, list(range(5)), means, [1.0, 1.2, None, 0.9, None])
    assert not unknown_source(arms, list(range(5)), means, None)  # the source model off
