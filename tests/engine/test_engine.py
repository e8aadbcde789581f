"""Real vLLM engine on the bundled model (CPU): lossless per arm and across switches, gamma == 0 runs
no draft forward, draft KV catch-up restores acceptance after a resume (and its absence does not)."""

from __future__ import annotations

import pytest
from engine_helpers import (
    LOSSLESS_MAX_TOKENS,
    K,
    force,
    generate_ids,
    generate_margins,
    lossless_mismatch,
    prompts,
)

pytestmark = pytest.mark.engine



@pytest.mark.parametrize("gamma", list(range(K + 1)))
def test_lossless_every_arm(nightjar_llm, reference_outputs, steps, gamma: int) -> None:
    force(nightjar_llm, [gamma])
    texts = prompts()
    got = generate_ids(nightjar_llm, texts, LOSSLESS_MAX_TOKENS)
    for t, ids in zip(texts, got, strict=True):
        assert (why := lossless_mismatch(ids, *reference_outputs[t])) is None, f"gamma={gamma}: {t[:40]!r} {why}"
    assert steps.steps and {s.gamma for s in steps.steps} == {gamma}
    # the policy's context is the batch as vLLM's per-batch-size table counts it: the first step
    # admits every prompt (none running yet) and is decided at that batch, not at 0
    assert steps.steps[0].batch_size == len(texts) == steps.steps[0].num_reqs
    assert all(s.batch_size >= s.num_reqs for s in steps.steps)
    # the prompt tokens the policy was told before scheduling are those the step then prefilled
    assert [s.decide_prompt_tokens for s in steps.steps] == [s.prefill_tokens for s in steps.steps]
    assert steps.steps[0].prefill_tokens > 0
    if gamma == 0:  # a true autoregressive step: the draft model never runs
        assert all(s.draft_forwards == 0 and s.num_draft_tokens == 0 for s in steps.steps)
    else:
        drafting = [s for s in steps.steps if s.num_draft_tokens > 0]
        assert drafting, "no step verified drafts"
        assert all(s.draft_forwards >= 1 for s in steps.steps)
        # the target drafts for itself: every draft is accepted (greedy) except where a request hit its
        # max_tokens/EOS mid-step (vLLM truncates the accepted run there)
        full = [s for s in drafting if s.tokens_emitted == s.num_reqs * (gamma + 1)]
        assert full and all(s.num_accepted_tokens == s.num_draft_tokens for s in full)
        assert sum(s.num_accepted_tokens for s in drafting) >= 0.8 * sum(s.num_draft_tokens for s in drafting)
        assert max(s.num_draft_tokens for s in drafting) <= gamma * len(texts)


@pytest.mark.parametrize("schedule", ["0x2,3x2", "3,0,1,0,2,3,0x3", "3x4,0x6"])
def test_lossless_forced_switches(nightjar_llm, reference_outputs, steps, schedule: str) -> None:
    force(nightjar_llm, schedule)
    texts = prompts()
    got = generate_ids(nightjar_llm, texts, LOSSLESS_MAX_TOKENS)
    for t, ids in zip(texts, got, strict=True):
        assert (why := lossless_mismatch(ids, *reference_outputs[t])) is None, f"schedule {schedule}: {t[:40]!r} {why}"
    gammas = [s.gamma for s in steps.steps]
    assert 0 in gammas and any(g > 0 for g in gammas)
    assert all(s.draft_forwards == 0 for s in steps.steps if s.gamma == 0)
    pairs = [(a, b) for a, b in zip(steps.steps, steps.steps[1:], strict=False) if a.gamma == 0 and b.gamma > 0]
    assert pairs and all(b.catchup_tokens > 0 and b.switch_cost_s > 0 for _, b in pairs)
    # the draft's lag reported at gamma 0 (for the planner's C_switch model) is what the resume
    # caught up on, less that step's own tokens; it is only measured at gamma 0
    assert all(s.draft_lag_tokens is not None and s.draft_lag_tokens >= 0 for s in steps.steps if s.gamma == 0)
    assert all(s.draft_lag_tokens is None for s in steps.steps if s.gamma > 0)
    for a, b in pairs:
        assert a.draft_lag_tokens <= b.catchup_tokens <= a.draft_lag_tokens + a.tokens_emitted + a.prefill_tokens


def _acceptance(steps) -> float:
    d = sum(s.num_draft_tokens for s in steps)
    return sum(s.num_accepted_tokens for s in steps) / d if d else float("nan")


def _resume_run(llm, steps, catchup_on: bool):
    from nightjar_worker.engine import inproc

    steady_n, off_n, after_n = 8, 12, 50
    force(llm, f"{K}x{steady_n},0x{off_n},{K}x{after_n + 100}")
    # the catch-up object exists once a proposing step ran (the lossless tests ran many)
    c = inproc.catchup(llm)
    assert c is not None
    c.enabled = catchup_on
    try:
        generate_ids(llm, prompts(1, ("coding", "writing")), 4 * steady_n + off_n + 4 * after_n + 8, ignore_eos=True)
    finally:
        c.enabled = True
    s = steps.steps
    steady = [x for x in s[2:steady_n] if x.num_draft_tokens > 0]
    resume_i = next(i for i in range(1, len(s)) if s[i - 1].gamma == 0 and s[i].gamma > 0)
    after = [x for x in s[resume_i + 1: resume_i + 1 + after_n] if x.num_draft_tokens > 0]
    return steady, s[resume_i], after, off_n


def test_catchup_keeps_acceptance_after_resume(nightjar_llm, steps) -> None:
    steady, resume, after, off_n = _resume_run(nightjar_llm, steps, catchup_on=True)
    assert len(after) >= 40, f"only {len(after)} drafting steps after the resume"
    a_steady, a_after = _acceptance(steady), _acceptance(after)
    assert abs(a_after - a_steady) <= 0.05, f"acceptance steady {a_steady:.3f} vs after resume {a_after:.3f}"
    # C_switch was measured on the resume step and covers every missed token of both requests
    assert resume.switch_cost_s > 0
    assert resume.catchup_tokens >= 2 * off_n
    assert resume.draft_forwards >= 2  # catch-up forward + the proposal


def test_without_catchup_acceptance_collapses(nightjar_llm, steps) -> None:
    """Negative control: the same run with the catch-up disabled (vLLM #49548's behaviour)."""
    steady, resume, after, _ = _resume_run(nightjar_llm, steps, catchup_on=False)
    assert resume.catchup_tokens == 0
    a_steady, a_after = _acceptance(steady), _acceptance(after)
    assert a_steady - a_after > 0.05, f"acceptance steady {a_steady:.3f} vs after resume {a_after:.3f}"


# Prompts whose answers repeat their own tokens (prompt lookup finds matches). bf16 CPU kernels are
# not batch-invariant: where plain decoding's two best tokens tie, any gamma > 0 (draft model
# included) may part from it, so these are compared up to such a tie (``lossless_mismatch``).
REPEATING = ["Repeat this list three times, exactly: apples, pears, plums, figs, dates, limes, kiwis.",
             "List the days of the week twice, separated by commas.",
             "Write the word 'nightjar' five times, each on its own line, then count them.",
             "Spell out the numbers one to ten in words, then again in reverse order."]


@pytest.fixture(scope="module")
def repeating_plain(nightjar_llm) -> list[tuple[list[int], list[float]]]:
    """Plain decoding of ``REPEATING`` (gamma 0: lossless above), 40 tokens, with margins."""
    force(nightjar_llm, [0])
    return generate_margins(nightjar_llm, REPEATING, 40)


def _check_lossless(llm, reference_outputs, repeating_plain, schedule: str) -> None:
    """The lossless prompts and ``REPEATING`` under ``schedule`` against plain decoding."""
    force(llm, schedule)
    texts = prompts() + REPEATING
    got = generate_ids(llm, texts, 40)
    want = [None] * len(prompts()) + repeating_plain
    for t, ids, ref in zip(texts, got, want, strict=True):
        if ref is None:
            why = lossless_mismatch(ids[:LOSSLESS_MAX_TOKENS], *reference_outputs[t])
            assert why is None, f"{schedule}: {t[:40]!r} {why}"
        else:
            assert (why := lossless_mismatch(ids, *ref)) is None, f"{schedule}: {t[:40]!r} {why}"


@pytest.mark.parametrize("schedule", ["n3", "n3x3,3x3,0x2,n2x2,3x2,n1"])
def test_ngram_drafts_are_lossless_and_leave_the_draft_to_catch_up(nightjar_llm, reference_outputs, repeating_plain,
                                                                   steps, schedule) -> None:
    """Prompt-lookup drafts from the same engine, alone and switching with the draft model and gamma 0:
    greedy output equals plain decoding; an n-gram step runs no draft forward, and the draft's next
    proposal first catches up on what those steps added."""
    steps.steps.clear()
    _check_lossless(nightjar_llm, reference_outputs, repeating_plain, schedule)
    s = steps.steps
    ngram = [x for x in s if x.source == "ngram"]
    assert ngram and all(x.draft_forwards == 0 and x.draft_lag_tokens is not None for x in ngram)
    after = [b for a, b in zip(s, s[1:], strict=False) if a.source == "ngram" and b.gamma > 0]
    assert sum(b.num_draft_tokens for b in after) > 0 and sum(b.num_accepted_tokens for b in after) > 0
    resumes = [b for a, b in zip(s, s[1:], strict=False) if a.source == "ngram" and b.gamma > 0 and b.source == "draft"]
    if "," in schedule:
        assert resumes and all((b.catchup_tokens or 0) > 0 for b in resumes)
    # A step verifies what the previous step proposed (after a change of source, the other
    # source's drafts), and the draft model, the target itself here, has every one of its own
    # drafts accepted once it has caught up on the n-gram steps (bar requests ending mid-step).
    assert all(b.verified_source == a.source for a, b in zip(s, s[1:], strict=False) if b.num_draft_tokens)
    own = [x for x in s if x.verified_source == "draft" and x.num_draft_tokens]
    if "," in schedule:
        assert _acceptance(own) >= 0.9, f"the draft's own drafts: acceptance {_acceptance(own):.2f}"


def _suffix_metric(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("schedule", ["s3", "s3x3,3x3,0x2,n2x2,s2x2,3x2,n1,s1"])
def test_suffix_drafts_are_lossless_and_switch_with_the_other_sources(nightjar_llm, reference_outputs,
                                                                      repeating_plain, steps, schedule) -> None:
    """Suffix-tree drafts from the same engine, alone and switching among all three sources and gamma 0:
    greedy output equals plain decoding; a suffix step runs no draft forward (the draft catches up
    after it, as after an n-gram step); its drafts are ragged and accepted."""
    hits0 = _suffix_metric("nightjar_suffix_lookups_total", result="hit")
    steps.steps.clear()
    _check_lossless(nightjar_llm, reference_outputs, repeating_plain, schedule)
    s = steps.steps
    sfx = [x for x in s if x.source == "suffix"]
    assert sfx and all(x.draft_forwards == 0 and x.draft_lag_tokens is not None for x in sfx)
    verified = [b for a, b in zip(s, s[1:], strict=False) if a.source == "suffix" and b.num_draft_tokens]
    assert verified and all(b.verified_source == "suffix" for b in verified)
    # these prompts ran before in this engine (and the REPEATING ones repeat themselves): the trees
    # draft most of their greedy output
    assert _acceptance(verified) >= 0.6, f"suffix acceptance {_acceptance(verified):.2f}"
    resumes = [b for a, b in zip(s, s[1:], strict=False) if a.source == "suffix" and b.gamma > 0 and b.source == "draft"]
    if "," in schedule:
        assert resumes and all((b.catchup_tokens or 0) > 0 for b in resumes)
        own = [x for x in s if x.verified_source == "draft" and x.num_draft_tokens]
        assert _acceptance(own) >= 0.9, f"the draft's own drafts: acceptance {_acceptance(own):.2f}"
    assert _suffix_metric("nightjar_suffix_lookups_total", result="hit") > hits0


NOVEL = ["Describe, in four sentences, how a lighthouse keeper might spend a stormy winter night."]


def test_suffix_drafts_from_an_earlier_requests_output(nightjar_llm, steps) -> None:
    """A request asked again drafts from the first answer, cached in the cross-request tree: most of
    the second answer is drafted and accepted (the first one, on a novel prompt, is not), the
    cache's size and contents are exported, and the drafts are ragged (capped by the match)."""
    from nightjar_worker.engine import inproc

    force(nightjar_llm, "s3")
    first = generate_ids(nightjar_llm, NOVEL, 48, ignore_eos=True)
    a = list(steps.steps)
    steps.steps.clear()
    second = generate_ids(nightjar_llm, NOVEL, 48, ignore_eos=True)
    b = list(steps.steps)
    assert second[:16] == first[:16]  # bf16 near-ties may part them later (lossless_mismatch)
    rate_first = sum(x.num_accepted_tokens for x in a) / sum(x.tokens_emitted for x in a)
    rate_second = sum(x.num_accepted_tokens for x in b) / sum(x.tokens_emitted for x in b)
    assert rate_second >= 0.5 and rate_second > rate_first + 0.2, (rate_first, rate_second)
    assert len(b) < 0.6 * len(a), f"{len(a)} steps, then {len(b)}"
    drafted = [x.num_draft_tokens for x in b if x.num_draft_tokens]
    assert drafted and max(drafted) <= 3 and min(drafted) < 3  # ragged: the first match is short
    d = inproc.model_runner(nightjar_llm)._nightjar_suffix
    size = d.cache_bytes()
    assert size > 0 and len(d.cache.cached_requests) >= 2
    assert _suffix_metric("nightjar_suffix_cached_requests") == len(d.cache.cached_requests)
    assert _suffix_metric("nightjar_suffix_cache_bytes") > 0
    print(f"suffix cache: {len(d.cache.cached_requests)} cached outputs, {size} bytes; accepted/token "
          f"{rate_first:.2f} -> {rate_second:.2f}, steps {len(a)} -> {len(b)}")


def test_the_scheduler_tells_the_planner_the_waiting_prompts(nightjar_llm, reference_outputs, steps) -> None:
    """With a TTFT target the planner is told, before each decision, the prompts waiting for their
    first token (``plan_prefill``); the output stays the plain decoding's."""
    from nightjar_worker.engine import inproc
    from nightjar_worker.planner import PlannerConfig, build_policy

    pol = build_policy(PlannerConfig(max_gamma=K, max_batch=8, seed=0, slo_ttft_s=60.0))
    told = []
    tell = pol.observe_queue
    pol.observe_queue = lambda q: (told.append(q), tell(q))  # type: ignore[method-assign]
    inproc.scheduler(nightjar_llm).nightjar_control.set_policy(pol)
    texts = prompts()
    got = generate_ids(nightjar_llm, texts, LOSSLESS_MAX_TOKENS)
    for t, ids in zip(texts, got, strict=True):
        assert (why := lossless_mismatch(ids, *reference_outputs[t])) is None, f"{t[:40]!r} {why}"
    assert len(told) == len(steps.steps)
    # the first step admits every prompt: each is listed, completed this step, having waited a little
    assert [q.steps_ahead for q in told[0]] == [0] * len(texts)
    assert all(0.0 <= q.wait_s < 60.0 for q in told[0])
    assert all(q == () for q in told[1:])  # then every request has its first token
