"""Pure logic of bench-dynamic and soak: rate traces, per-phase aggregation, the profile/table/oracle
derived from a step log, the RESULT ratios, the RSS slope, the soak comparison."""

from __future__ import annotations

import math

import pytest
from nightjar_worker.loadgen import RequestRecord, arrival_times
from nightjar_worker.planner.policy import StepFeedback

from benchmarks import dynamic_lib as dl

SPEC = dl.TraceSpec(low_rate=0.5, high_rate=8.0, low_cap=2, high_cap=16, low_s=10, high_s=20, saw_teeth=2,
                    saw_levels=3, saw_level_s=5)


def test_trace_shapes_low_high_low_then_sawtooth():
    ph = dl.dynamic_trace(SPEC, scale=2.0)
    assert [p.name for p in ph[:3]] == ["low", "high", "low-again"]
    assert [p.rate for p in ph[:3]] == [0.5, 8.0, 0.5]
    saw = ph[3:]
    assert len(saw) == 6 and {p.name for p in saw} == {"saw"}
    rates = [p.rate for p in saw]
    assert rates[:3] == rates[3:] and rates[0] == pytest.approx(0.5) and rates[2] == pytest.approx(8.0)
    assert rates[0] < rates[1] < rates[2]  # each tooth rises, then drops back
    assert rates[1] == pytest.approx(2.0)  # geometric middle
    assert [p.max_concurrency for p in saw[:3]] == [2, 9, 16]
    assert all(p.drop_late for p in ph)
    assert sum(p.duration_s for p in ph) == pytest.approx(2 * (10 + 20 + 10 + 30))
    assert dl.phase_names(ph) == ["low", "high", "low-again", "saw"]


def test_arrivals_follow_the_trace():
    ph = dl.dynamic_trace(SPEC, scale=20.0)
    w = dl.phase_windows(ph)
    arr = arrival_times(ph, seed=1)
    n_high = sum(1 for _, p in arr if p.name == "high")
    n_low = sum(1 for _, p in arr if p.name == "low")
    assert n_high == pytest.approx(8.0 * 400, rel=0.1) and n_low == pytest.approx(0.5 * 200, rel=0.3)
    assert all(dl.phase_of(t, w) == p.name for t, p in arr)


def test_phase_of_edges():
    w = dl.phase_windows(dl.step_trace(SPEC))
    assert dl.phase_of(0.0, w) == "low" and dl.phase_of(10.0, w) == "high" and dl.phase_of(39.99, w) == "low-again"
    assert dl.phase_of(40.0, w) == "drain" and dl.phase_of(-1, w) == "before"


def rec(i: int, phase: str, start: float, e2e: float, toks: int, err: str | None = None) -> RequestRecord:
    return RequestRecord(i, i, "c", phase, start_s=start, ttft_s=0.1, e2e_s=e2e, output_tokens=toks, error=err)


def test_per_phase_summary_groups_by_arrival_phase():
    recs = [rec(0, "low", 0, 1.0, 10), rec(1, "low", 1, 1.0, 10), rec(2, "high", 5, 2.0, 40),
            rec(3, "high", 5, 2.0, 0, err="boom")]
    s = dl.per_phase_summary(recs, ["low", "high", "saw"])
    assert s["low"]["output_tok_s"] == pytest.approx(20 / 2.0)
    assert s["high"]["output_tok_s"] == pytest.approx(40 / 2.0) and s["high"]["errors"] == 1
    assert s["saw"]["requests"] == 0 and s["saw"]["output_tok_s"] == 0
    assert s["overall"]["output_tokens"] == 60 and s["overall"]["output_tok_s"] == pytest.approx(60 / 7.0)
    assert s["overall"]["error_messages"] == ["high +5.0s: boom"]


def step(t: float, b: int, g: int, dt: float, toks: int, acc: int = 0, prefill: int = 0, **kw) -> StepFeedback:
    return StepFeedback(step=0, batch_size=b, num_reqs=b, gamma=g, step_time_s=dt, tokens_emitted=toks,
                     num_draft_tokens=g * b, num_accepted_tokens=acc, prefill_tokens=prefill, time=t, **kw)


def test_step_phase_stats_per_window():
    w = [("low", 0.0, 10.0), ("high", 10.0, 20.0), ("saw", 20.0, 25.0), ("saw", 25.0, 30.0)]
    steps = [step(100 + 1, 1, 4, 0.1, 1, acc=0), step(100 + 12, 8, 0, 0.2, 8), step(100 + 14, 8, 2, 0.2, 8, acc=8),
             step(100 + 27, 2, 1, 0.1, 2), step(99, 1, 3, 0.1, 1), step(100 + 40, 1, 2, 0.1, 1)]
    s = dl.step_phase_stats(steps, 100.0, w)
    assert s["low"]["mean_gamma"] == 4 and s["low"]["acceptance"] == 0
    assert s["high"]["mean_gamma"] == 1 and s["high"]["mean_batch"] == 8 and s["high"]["acceptance"] == 0.5
    assert s["saw"]["steps"] == 1
    assert s["overall"]["steps"] == 5  # the step before the start is not counted, the drain one is
    # window throughput: tokens emitted in the phase's windows over their length
    assert s["low"]["window_tok_s"] == pytest.approx(1 / 10) and s["high"]["window_tok_s"] == pytest.approx(16 / 10)
    assert s["saw"]["window_tok_s"] == pytest.approx(2 / 10) and s["overall"]["window_tok_s"] == pytest.approx(20 / 40)
    # where the time went: step times plus catch-ups, prompt tokens prefilled with the draft on / all
    p = dl.step_phase_stats([step(101, 4, 2, 0.5, 4, prefill=90, switch_cost_s=0.25), step(102, 4, 0, 0.2, 4, prefill=30),
                             step(103, 4, 1, 0.3, 6)], 100.0, w)
    assert p["low"]["busy_s"] == pytest.approx(1.25)
    assert (p["low"]["prompt_tokens_draft_on"], p["low"]["prompt_tokens"]) == (90, 120)
    # given the run's end, the last phase's window runs on through the drain
    d = dl.step_phase_stats(steps, 100.0, w, unix1=150.0)
    assert d["saw"]["steps"] == 2 and d["saw"]["window_tok_s"] == pytest.approx(3 / 30)
    assert d["low"] == s["low"] and d["overall"]["window_tok_s"] == pytest.approx(20 / 50)


def test_binned_timeline():
    steps = [step(10.2, 1, 4, 0.1, 3), step(10.7, 1, 2, 0.1, 1), step(12.5, 1, 0, 0.1, 1)]
    assert dl.binned(steps, 10.0) == [(0.0, 3.0, 4.0), (2.0, 0.0, 1.0)]


def sweep_steps() -> list[StepFeedback]:
    """Synthetic no-SD + static sweep: T(b, g) = 0.01 * b + 0.004 * g, alpha = 0.5; speculation pays at
    batch 1 and not at batch 8."""
    out, t = [], 0.0
    a = 0.5
    for g in range(5):
        for b in (1, 8):
            for _ in range(4):
                t += 1
                dt = 0.01 + 0.003 * b + (0.006 * g if b == 1 else 0.02 * g)
                acc_per_req = sum(a**i for i in range(1, g + 1))
                out.append(step(t, b, g, dt, round(b * (1 + acc_per_req)), acc=round(b * acc_per_req)))
    out.append(step(t + 1, 4, 2, 9.9, 4, prefill=100))  # prefill steps are ignored
    out.append(step(t + 2, 1, 2, 0.05, 2, switch_cost_s=0.02, catchup_tokens=10))
    out.append(step(t + 3, 1, 2, 0.05, 2, switch_cost_s=0.04, catchup_tokens=30))
    return out


def test_profile_from_steps_and_oracle():
    prof = dl.profile_from_steps(sweep_steps(), [0, 1, 2, 3, 4], name="t", device="cpu", target="x", draft="y",
                                 kv_blocks_total=100, kv_block_bytes=1000)
    assert prof.batch_sizes == [1, 8] and prof.gammas == [0, 1, 2, 3, 4]
    assert prof.step_time(1, 0) == pytest.approx(0.013) and prof.step_time(8, 4) == pytest.approx(0.034 + 0.08)
    assert 0.3 < prof.alpha() < 0.7  # rounding of the synthetic counts
    assert prof.switch_cost_per_token_s == pytest.approx(0.001) and prof.switch_cost_fixed_s == pytest.approx(0.01)
    og = dl.oracle_gammas(prof, [1, 8])
    assert og[1] > 0 and og[8] == 0


def test_the_draft_prefill_measured_in_the_sweep_prices_speculation():
    # Prompt steps: the target prefills at 20 ms/token, the draft adds 10 ms/token when on. Charged per
    # generated token at the sweep's prompt/output ratio, that outweighs gamma 1's small gain at batch 1.
    decode = [s for s in sweep_steps() if s.prefill_tokens == 0]
    prompts = [step(100 + i, 4, g, 0.05 + (0.02 + 0.01 * (g > 0)) * p, 4, prefill=p)
               for i, (g, p) in enumerate((g, p) for g in (0, 2) for p in (100, 200, 300, 150))]
    steps = decode + prompts
    assert dl.draft_prefill_cost(steps) == pytest.approx(0.01)
    ratio = dl.prompt_per_output(steps)
    assert ratio == pytest.approx(2 * 750 / sum(s.tokens_emitted for s in steps))
    assert dl.draft_prefill_cost(steps[:-2]) == 0.0  # two draft-on prompt steps: too few to trust
    prof = dl.profile_from_steps(steps, [0, 1, 2, 3, 4], name="t", device="cpu", target="x", draft="y",
                                 kv_blocks_total=100, kv_block_bytes=1000)
    assert prof.draft_prefill_s_per_token == pytest.approx(0.01)
    assert prof.draft_prefill_per_output_token() == pytest.approx(0.01 * ratio)
    assert dl.oracle_gammas(prof, [1, 8]) == {1: 0, 8: 0}  # speculation paid at batch 1 decoding alone
    assert dl.oracle_gammas(prof.model_copy(update={"prompt_tokens_per_output_token": 0.0}), [1])[1] > 0


def test_profile_needs_every_gamma():
    steps = [s for s in sweep_steps() if s.gamma != 3]
    with pytest.raises(ValueError, match="every gamma"):
        dl.profile_from_steps(steps, [0, 1, 2, 3, 4], name="t", device="c", target="x", draft="y",
                              kv_blocks_total=1, kv_block_bytes=1)


def test_tuned_table_from_the_sweep():
    best = dl.best_gamma_per_batch(sweep_steps())
    assert best[8] == 0 and best[1] > 0
    assert dl.table_from_best(best) == [[1, 7, best[1]], [8, 1024, 0]]
    assert dl.table_from_best({1: 2, 4: 2, 16: 0}) == [[1, 15, 2], [16, 1024, 0]]
    assert dl.table_from_best({}) == [[1, 1024, 0]]


def summ(tok_s: float, tpot_p99: float = 0.05, ttft_p99: float = 1.0) -> dict:
    return {"output_tok_s": tok_s, "tpot_p99_s": tpot_p99, "ttft_p99_s": ttft_p99}


def test_own_window_counts_a_phase_own_tokens_inside_its_windows():
    w = [("low", 0.0, 10.0), ("high", 10.0, 20.0), ("saw", 20.0, 25.0), ("saw", 25.0, 30.0)]
    a = rec(0, "low", 2.0, 12.0, 4)
    a.token_times = [(3.0, 1), (9.0, 3), (12.0, 4)]  # the last token came out in the high phase
    b = rec(1, "high", 11.0, 2.0, 6)
    b.token_times = [(12.0, 6)]
    c = rec(2, "saw", 29.0, 7.0, 5)
    c.token_times = [(29.5, 2), (34.0, 5)]  # the last phase's window runs on through the drain
    d = rec(3, "low", 5.0, 1.0, 0, err="boom")
    own = dl.own_window_tok_s([a, b, c, d], w, run_end=40.0)
    assert own["low"] == pytest.approx(3 / 10) and own["high"] == pytest.approx(6 / 10)
    assert own["saw"] == pytest.approx(5 / 20)  # 20..25 and 25..40
    assert dl.phase_lengths(w) == {"low": 10.0, "high": 10.0, "saw": 10.0}  # teeth summed
    assert dl.own_window_tok_s([rec(0, "low", 0, 1.0, 3)], w, 40.0)["low"] is None  # no token times: unknown
    row = dl.record_row(a)
    assert row["token_times"] == [[3.0, 1], [9.0, 3], [12.0, 4]] and "text" not in row and row["phase"] == "low"


def test_dynamic_ratios():
    phases = ["low", "high"]
    res = {
        "nosd": {"low": summ(10), "high": summ(100), "overall": summ(40, 0.06, 3.0)},
        "static-2": {"low": summ(20), "high": summ(80), "overall": summ(45, 0.04, 4.0)},
        "nightjar": {"low": summ(19), "high": summ(99), "overall": summ(50, 0.05, 1.5)},
        "oracle": {"low": summ(20), "high": summ(100), "overall": summ(52)},
    }
    r = dl.dynamic_ratios(res, phases)
    assert r["worst_phase_vs_best_static"] == pytest.approx(0.95)  # low: 19 / 20 (high: 99 / 100)
    assert r["overall_vs_nosd"] == pytest.approx(50 / 40)
    assert r["overall_vs_best_static"] == pytest.approx(50 / 45)
    assert r["p99_tpot_vs_best_static"] == pytest.approx(0.05 / 0.04)
    assert r["p99_ttft_vs_best_static"] == pytest.approx(1.5 / 3.0)  # the lowest static p99 (no-SD's), not the fastest's
    assert r["oracle_fraction"] == pytest.approx(50 / 52)
    assert r["oracle_worst_phase_vs_best_static"] == pytest.approx(1.0)  # the oracle's own figure (low 20 / 20)
    assert r["oracle_p99_tpot_vs_best_static"] == pytest.approx(0.05 / 0.04)
    assert dl.dynamic_ratios({"nosd": res["nosd"]}, phases)["overall_vs_nosd"] is None
    assert "overall_vs_nosd_nodraft" not in r  # only a memory-tight run has the no-draft baseline
    assert "oracle_worst_phase_vs_best_static" not in dl.dynamic_ratios({k: res[k] for k in ("nosd", "nightjar")}, phases)
    assert "worst_phase_own_window_vs_best_static" not in r  # no token times in these summaries
    own = {"nosd": (10, 100), "static-2": (16, 80), "nightjar": (15.2, 99), "oracle": (16, 90)}
    for pol, (low, high) in own.items():
        res[pol]["low"]["own_window_tok_s"], res[pol]["high"]["own_window_tok_s"] = low, high
    r = dl.dynamic_ratios(res, phases)
    assert r["worst_phase_own_window_vs_best_static"] == pytest.approx(0.95)  # low: 15.2 / 16
    assert r["oracle_worst_phase_own_window_vs_best_static"] == pytest.approx(0.9)  # high: 90 / 100
    assert r["worst_phase_vs_best_static"] == pytest.approx(0.95)  # the figure is unchanged
    assert "best_static_per_phase_vs_nosd" not in r  # no phase lengths given
    r = dl.dynamic_ratios(res, phases, phase_s={"low": 30, "high": 10})
    # no-SD averages (10 * 30 + 100 * 10) / 40 = 32.5 tok/s; the best static per phase (16 in low,
    # 100 in high) 37; Nightjar (15.2, 99) 36.15
    assert r["best_static_per_phase_vs_nosd"] == pytest.approx(37 / 32.5)
    assert r["own_window_overall_vs_nosd"] == pytest.approx(36.15 / 32.5)


def test_memory_tight_ratios_keep_the_no_draft_baseline_out_of_the_statics():
    """nosd-nodraft has the draft's memory for its KV cache, which no static gamma has: it is its own
    ratio, never the "best static"."""
    phases = ["high"]
    res = {
        "nosd": {"high": summ(80), "overall": summ(80)},
        "nosd-nodraft": {"high": summ(100), "overall": summ(100)},
        "nightjar": {"high": summ(96), "overall": summ(96)},
    }
    r = dl.dynamic_ratios(res, phases)
    assert r["overall_vs_best_static"] == pytest.approx(96 / 80)
    assert r["overall_vs_nosd_nodraft"] == pytest.approx(0.96)


def test_rss_slopes_by_process_splits_process_and_kind():
    mib = 2**20
    # EngineCore: anon +1 MiB per 100 s (36 MiB/h), file flat; the API server flat; a worker seen twice
    samples = [(t, {"EngineCore 7": {"rss": (100 + t // 100) * mib, "anon": (60 + t // 100) * mib, "file": 40 * mib},
                    "python 3": {"rss": 50 * mib, "anon": 50 * mib, "file": 0}}) for t in range(0, 1000, 100)]
    samples[-1][1]["late 9"] = {"rss": mib}
    samples[-2][1]["late 9"] = {"rss": mib}
    out = dl.rss_slopes_by_process(samples, t_from=200)
    assert out["EngineCore 7"]["anon"] == pytest.approx(36.0)
    assert out["EngineCore 7"]["rss"] == pytest.approx(36.0)
    assert out["EngineCore 7"]["file"] == pytest.approx(0.0)
    assert out["python 3"]["rss"] == pytest.approx(0.0)
    assert out["late 9"]["rss"] is None
    # samples before t_from are left out: a step at the start does not count
    samples[0][1]["python 3"]["rss"] = 0
    assert dl.rss_slopes_by_process(samples, t_from=100)["python 3"]["rss"] == pytest.approx(0.0)


def test_slope_per_hour():
    pts = [(t, 100.0 + 0.01 * t) for t in range(0, 600, 2)]
    assert dl.slope_per_hour(pts) == pytest.approx(36.0)
    assert dl.slope_per_hour([(0, 1.0), (1, 2.0)]) is None
    assert math.isclose(dl.slope_per_hour([(t, 5.0) for t in range(10)]), 0.0, abs_tol=1e-12)


def test_compare_texts():
    v = dl.compare_texts({1: ["a", "a"], 2: ["b", "x"], 3: ["c"]}, {1: "a", 2: "b"})
    assert v == {"same": 3, "different": 1, "different_qids": [2], "missing_ref": 1}


def test_short_prompts_keep_every_category_with_short_inputs():
    from nightjar_worker.loadgen import Prompt

    ps = [Prompt(1, "a", "x" * 10), Prompt(2, "a", "x" * 2000), Prompt(3, "b", "y" * 50)]
    assert [p.qid for p in dl.short_prompts(ps, 100)] == [1, 3]
    assert dl.short_prompts(ps, None) == ps


def test_first_divergence_maps_chars_to_reference_tokens():
    toks = ["The", " cat", " sat", "."]
    assert dl.first_divergence(toks, "The cat sat.") is None
    assert dl.first_divergence(toks, "The cow sat.") == 1
    assert dl.first_divergence(toks, "The cat") == 2  # stopped early: the next reference token
    assert dl.first_divergence(toks, "The cat sat. More") == 3


def test_warm_start_body_switches_policy_and_seeds_its_priors(tmp_path):
    # bench-dynamic (and bench-serve --warm-profile) switch to Nightjar with the priors derived from a profile: the body
    # is a valid runtime config, and the policy the worker rebuilds from it starts from them.
    from nightjar_contract.planner import PlannerPriors
    from nightjar_contract.runtime import parse_runtime_config
    from nightjar_worker.runtime_config import PolicyHolder

    from benchmarks.serving import switch_body, warm_priors

    prof = dl.profile_from_steps(sweep_steps(), [0, 1, 2, 3, 4], name="t", device="cpu", target="x", draft="y",
                                 kv_blocks_total=100, kv_block_bytes=1000)
    path = tmp_path / "profile.json"
    prof.save(path)
    pri = PlannerPriors.model_validate(warm_priors(path))
    assert {e.bucket_lo for e in pri.entries} == {1, 2, 3, 4, 6, 8}  # the profile's batches reach 8
    holder = PolicyHolder()
    holder.update(parse_runtime_config({"planner": {"policy": "ucb"}}))
    holder.update(parse_runtime_config(switch_body("nightjar", priors=warm_priors(path))))
    snap = holder.policy.snapshot()
    assert holder.policy.name == "nightjar"
    assert {(e.bucket_lo, e.gamma) for e in snap.entries} == {(e.bucket_lo, e.gamma) for e in pri.entries}
    assert "priors" not in switch_body("nightjar")


def test_profile_interpolates_each_gamma_over_its_own_batch_sizes():
    # Each static run meets its own batch sizes: gamma 0 at 1, 4 and 16, gamma 1 at 1, 8 and 12.
    # The profile covers 1-12 (the range both cover; no extrapolation to 16) at the union of their
    # batch sizes, each gamma interpolated over its own points.
    def t(b, g):
        return 0.1 + 0.01 * b + (0.05 + 0.02 * b) * g

    steps, clock = [], 0.0
    for g, batches in ((0, (1, 4, 16)), (1, (1, 8, 12))):
        for b in batches:
            for _ in range(3):
                clock += 1
                steps.append(step(clock, b, g, t(b, g), b * (1 + g)))
    prof = dl.profile_from_steps(steps, [0, 1], name="t", device="c", target="x", draft="y",
                                 kv_blocks_total=1, kv_block_bytes=1)
    assert prof.batch_sizes == [1, 4, 8, 12] and prof.max_batch == 12
    for b in (1, 4, 8, 12):  # both lines are linear in b, so interpolation is exact
        assert prof.step_time(b, 0) == pytest.approx(t(b, 0)) and prof.step_time(b, 1) == pytest.approx(t(b, 1))
    with pytest.raises(ValueError, match="do not overlap"):
        dl.profile_from_steps([s for s in steps if s.gamma == 1 or s.num_reqs == 16]
                              + [step(99 + i, 16, 0, 0.3, 16) for i in range(3)], [0, 1], name="t", device="c",
                              target="x", draft="y", kv_blocks_total=1, kv_block_bytes=1)
