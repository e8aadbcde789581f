"""Nightjar over (source, gamma) arms: the draft model, prompt lookup (n-gram) and suffix-tree drafts."""

from __future__ import annotations

import random

import pytest
from nightjar_contract.planner import PlannerConfig
from nightjar_worker.planner.nightjar import NightjarPolicy
from nightjar_worker.planner.policy import DraftAware, SourcePolicy, StepFeedback

# Per-token loss at batch 4 (seconds) and acceptance per source: the draft pays most at gamma 3,
# n-gram drafts (no draft forward) pay at gamma 2, less than the draft.
LOSS = {("draft", 0): 0.010, ("draft", 1): 0.008, ("draft", 2): 0.007, ("draft", 3): 0.0065,
        ("ngram", 1): 0.0088, ("ngram", 2): 0.0078, ("ngram", 3): 0.0092}


def run(pol: NightjarPolicy, steps: int, loss: dict = LOSS, acc: dict | None = None, batch: int = 4,
        seed: int = 0, draft_available: bool = True) -> list[tuple[str, int]]:
    """``acc``: acceptance per source (default 0.5); the first step of a new source or a higher
    gamma verifies nothing (pipeline fill); resuming the draft costs a 0.05 s catch-up."""
    acc = acc or {"draft": 0.5, "ngram": 0.5, "suffix": 0.5}
    rng = random.Random(seed)
    pol.set_draft_available(draft_available)
    out: list[tuple[str, int]] = []
    prev = ("draft", 0)
    for _ in range(steps):
        g = pol.decide(batch)
        src = pol.source() if g > 0 else "draft"
        assert draft_available or src != "draft" or g == 0
        fill = g > prev[1] or (g > 0 and src != prev[0])
        resume = src == "draft" and g > 0 and (prev[1] == 0 or prev[0] != "draft")
        key = (src, g)
        drafted = 0 if fill else batch * g
        # each request accepts a prefix of its drafts (the first rejection ends it), as the engine does
        accepted = 0 if fill else sum(_prefix(rng, acc[src], g) for _ in range(batch))
        tokens = batch + accepted if not fill else batch
        # the step's time makes ``loss`` the per-token loss at the expected tokens
        t = loss[key] * batch * sum(acc[src] ** i for i in range(g + 1)) * (1 + 0.03 * rng.gauss(0, 1))
        pol.observe(StepFeedback(batch_size=batch, gamma=g, step_time_s=t, tokens_emitted=tokens,
                                 num_draft_tokens=drafted, num_accepted_tokens=accepted,
                                 switch_cost_s=0.05 if resume else 0.0, source=src,
                                 draft_lag_tokens=10 if src != "draft" or g == 0 else None))
        out.append(key)
        prev = key
    return out


def _prefix(rng: random.Random, alpha: float, gamma: int) -> int:
    """Drafts accepted before the first rejection, each with probability ``alpha``."""
    n = 0
    while n < gamma and rng.random() < alpha:
        n += 1
    return n


def test_the_planner_is_source_and_draft_aware():
    pol = NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3]))
    assert isinstance(pol, SourcePolicy) and isinstance(pol, DraftAware)
    assert pol.arms == (0, 1, 2, 3)


def test_without_ngram_arms_only_the_draft_model_is_played():
    pol = NightjarPolicy(PlannerConfig(max_gamma=3))
    assert {s for s, _ in run(pol, 500)} == {"draft"}


def test_with_the_draft_resident_it_speculates_with_the_draft_and_without_it_with_ngram_drafts():
    pol = NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3], seed=1))
    late = run(pol, 2500)[-500:]
    assert late.count(("draft", 3)) >= 400
    off = run(pol, 2500, draft_available=False)[-500:]  # the draft offloaded: n-gram drafts, not gamma 0
    assert not any(s == "draft" and g > 0 for s, g in off)
    assert off.count(("ngram", 2)) >= 350


def test_while_the_draft_is_away_the_planner_says_which_draft_gamma_it_would_play():
    # what brings the draft back: the memory manager reloads only on the planner's demand
    pol = NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3], seed=1))
    run(pol, 2500)
    assert pol.draft_demand(4) == 0  # resident: the chosen arm says it
    run(pol, 500, draft_available=False)
    assert pol.draft_demand(4) == 3
    # where prompt lookup beats the draft, or the draft's drafts are never accepted, it wants none
    worse = {**LOSS, ("draft", 1): 0.0095, ("draft", 2): 0.0094, ("draft", 3): 0.0093}
    for loss, acc in ((worse, None), (LOSS, {"draft": 0.0, "ngram": 0.5})):
        pol = NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3], seed=1))
        run(pol, 2500, loss=loss, acc=acc)
        run(pol, 500, loss=loss, acc=acc, draft_available=False)
        assert pol.draft_demand(4) == 0


def test_the_acceptance_gate_is_per_source():
    # prompt lookup never matches on this content: its gate closes and its arms are no longer
    # played, even where their step time alone would look cheap; the draft's gate stays open
    pol = NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3], seed=2))
    for _ in range(20):
        pol.observe(StepFeedback(batch_size=4, gamma=2, step_time_s=0.01, tokens_emitted=4, num_draft_tokens=8,
                                 source="ngram"))
    assert pol.gates["ngram"].closed() and not pol.gates["draft"].closed()
    cheap = {**LOSS, ("ngram", 1): 0.001, ("ngram", 2): 0.001, ("ngram", 3): 0.001}
    late = run(pol, 1500, loss=cheap, acc={"draft": 0.6, "ngram": 0.0})
    assert not any(s == "ngram" for s, _ in late)
    assert late[-500:].count(("draft", 3)) >= 400


def test_drafts_verified_after_a_switch_count_for_the_source_that_proposed_them():
    # a step verifies what the previous step proposed: right after a change of source those are the
    # other source's drafts, and their acceptance is that source's (here the draft model's steps
    # verify unmatched n-gram drafts: the n-gram gate closes, the draft's stays open)
    pol = NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3], seed=2))
    for _ in range(20):
        pol.observe(StepFeedback(batch_size=4, gamma=2, step_time_s=0.01, tokens_emitted=4, num_draft_tokens=8,
                                 source="draft", drafts_source="ngram"))
    assert pol.gates["ngram"].closed() and not pol.gates["draft"].closed()


def test_an_ngram_step_is_draft_off_for_the_switching_cost():
    # going from n-gram drafts back to the draft is a resume (C_switch is learnt from it), while
    # switching to n-gram drafts is a turn-off of the draft model, counted as such
    pol = NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[2], seed=3))
    run(pol, 1500, draft_available=False)
    run(pol, 1500)
    assert pol.stats.switches_on >= 1 and pol.switch.ema is not None and pol.switch.ema >= 0.05


# -- three sources: the suffix trees beside the draft and prompt lookup ----------------------------------
# suffix drafts (no draft forward, the cross-request cache) pay most at gamma 3 here, n-gram at 2,
# the draft model at 3 but less than the suffix trees: the draft wins while resident, then suffix 3
SUFFIX = {("suffix", 1): 0.0085, ("suffix", 2): 0.0072, ("suffix", 3): 0.0068}
THREE = {**LOSS, **SUFFIX}


def _three(seed: int = 1, **kw) -> NightjarPolicy:
    return NightjarPolicy(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3], suffix_arms=[1, 2, 3], seed=seed, **kw))


def test_three_sources_are_arms_after_the_draft_models():
    pol = _three()
    assert pol.armset.keys == (("draft", 0), ("draft", 1), ("draft", 2), ("draft", 3), ("ngram", 1), ("ngram", 2),
                               ("ngram", 3), ("suffix", 1), ("suffix", 2), ("suffix", 3))
    assert pol.armset.drafting == (False, True, True, True) + (False,) * 6  # only draft arms run the draft
    assert set(pol.gates) >= {"draft", "ngram", "suffix"}
    # the arms are fixed for the policy's life: adding a source at run time is refused
    with pytest.raises(ValueError, match="arms"):
        pol.apply_config(PlannerConfig(max_gamma=3, ngram_arms=[1, 2, 3]))


def test_the_cheapest_of_three_sources_is_played():
    late = run(_three(), 3000, loss=THREE)[-500:]
    assert late.count(("draft", 3)) >= 400
    cheap = {**THREE, ("suffix", 3): 0.0055}  # the suffix trees now beat the draft model too
    late = run(_three(), 3000, loss=cheap)[-500:]
    assert late.count(("suffix", 3)) >= 400


def test_suffix_drafts_are_played_while_the_draft_is_offloaded():
    pol = _three()
    run(pol, 2500, loss=THREE)
    off = run(pol, 2500, loss=THREE, draft_available=False)[-500:]
    assert not any(s == "draft" and g > 0 for s, g in off)
    assert off.count(("suffix", 3)) >= 350  # the best host arm, not gamma 0 nor n-gram
    assert pol.draft_demand(4) == 3  # and the draft would be wanted back


def test_the_suffix_gate_closes_only_the_suffix_arms():
    # the suffix trees never match on this content (no repeats): their gate closes, the draft's and
    # prompt lookup's stay open, and with the draft away prompt lookup is played, not the cheap-looking
    # suffix arms
    pol = _three(seed=2)
    for _ in range(20):
        pol.observe(StepFeedback(batch_size=4, gamma=3, step_time_s=0.01, tokens_emitted=4, num_draft_tokens=12,
                                 source="suffix", draft_lag_tokens=10))
    assert pol.gates["suffix"].closed() and not pol.gates["ngram"].closed() and not pol.gates["draft"].closed()
    cheap = {**THREE, ("suffix", 1): 0.001, ("suffix", 2): 0.001, ("suffix", 3): 0.001}
    acc = {"draft": 0.5, "ngram": 0.5, "suffix": 0.0}
    off = run(pol, 2000, loss=cheap, acc=acc, draft_available=False)
    assert not any(s == "suffix" for s, _ in off)
    assert off[-500:].count(("ngram", 2)) >= 350


def test_a_suffix_step_is_draft_off_for_the_switching_cost():
    # like an n-gram step: switching to suffix drafts turns the draft model off, coming back resumes
    # it (C_switch learnt from the catch-up)
    pol = NightjarPolicy(PlannerConfig(max_gamma=3, suffix_arms=[2], seed=3))
    seen = run(pol, 1500, loss=THREE, draft_available=False)
    assert ("suffix", 2) in seen and not any(s == "ngram" for s, _ in seen)
    run(pol, 1500, loss=THREE)
    assert pol.stats.switches_on >= 1 and pol.switch.ema is not None and pol.switch.ema >= 0.05


def test_a_static_suffix_policy_never_needs_the_draft():
    from nightjar_worker.planner import build_policy

    pol = build_policy(PlannerConfig(policy="static", static_source="suffix", static_gamma=2, max_gamma=3))
    assert pol.name == "static-suffix-2" and pol.decide(8) == 2
    assert isinstance(pol, SourcePolicy) and pol.source() == "suffix"
    assert pol.needs_draft() is False  # type: ignore[attr-defined]
    assert build_policy(PlannerConfig(policy="static", static_gamma=2, max_gamma=3)).needs_draft() is True  # type: ignore[attr-defined]
