"""Pure logic of ``make bench-dynamic`` and ``make soak`` (no engine, no I/O besides nothing):
rate traces, per-phase aggregation, the CostProfile / vLLM table / oracle gammas derived from the
run's own step log, the RESULT ratios, and the RSS slope. Unit-tested in ``tests/bench``."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from nightjar_worker.loadgen import Phase, Prompt, RequestRecord, summarize
from nightjar_worker.planner import PlannerConfig
from nightjar_worker.planner.dsd import invert_acceptance
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.planner.policy import StepFeedback
from nightjar_worker.sim.profile import CostProfile
from pydantic import BaseModel, ConfigDict, Field

# --- rate traces -----------------------------------------------------------------------------------


class TraceSpec(BaseModel):
    """Offered load of one pair: Poisson rates (req/s) and in-flight caps for the low and high levels;
    durations in seconds before ``scale``."""

    model_config = ConfigDict(extra="forbid")

    low_rate: float = Field(gt=0)
    high_rate: float = Field(gt=0)
    low_cap: int = Field(4, ge=1)
    high_cap: int = Field(16, ge=1)
    low_s: float = Field(60.0, gt=0)
    high_s: float = Field(90.0, gt=0)
    saw_teeth: int = Field(2, ge=1)
    saw_levels: int = Field(3, ge=2, description="rate steps per tooth, low_rate .. high_rate geometrically")
    saw_level_s: float = Field(20.0, gt=0)


def step_trace(spec: TraceSpec, scale: float = 1.0) -> list[Phase]:
    """low -> high -> low. A request still waiting for a slot when its phase ends is dropped, so a
    saturated phase does not spill its queue into the next one."""
    return [
        Phase(spec.low_s * scale, spec.low_rate, spec.low_cap, name="low", drop_late=True),
        Phase(spec.high_s * scale, spec.high_rate, spec.high_cap, name="high", drop_late=True),
        Phase(spec.low_s * scale, spec.low_rate, spec.low_cap, name="low-again", drop_late=True),
    ]


def saw_rates(spec: TraceSpec) -> list[float]:
    """One tooth: ``saw_levels`` rates rising geometrically from low_rate to high_rate."""
    n = spec.saw_levels
    return [spec.low_rate * (spec.high_rate / spec.low_rate) ** (i / (n - 1)) for i in range(n)]


def sawtooth_trace(spec: TraceSpec, scale: float = 1.0) -> list[Phase]:
    """``saw_teeth`` ramps low -> high, each dropping back at once; every level is named ``saw`` (one
    phase for aggregation), the in-flight cap rises with the rate."""
    out = []
    rates = saw_rates(spec)
    for _ in range(spec.saw_teeth):
        for i, r in enumerate(rates):
            cap = round(spec.low_cap + (spec.high_cap - spec.low_cap) * i / (len(rates) - 1))
            out.append(Phase(spec.saw_level_s * scale, r, cap, name="saw", drop_late=True))
    return out


def short_prompts(prompts: Sequence[Prompt], max_chars: int | None) -> list[Prompt]:
    """Prompts of at most ``max_chars`` characters (None: all). On 2 shared cores the engine prefills
    ~90 tokens/s, so Spec-Bench's long summarization/extraction inputs (median ~3000 characters)
    would turn the benchmark into a prefill benchmark; every category keeps its short prompts."""
    return list(prompts) if max_chars is None else [p for p in prompts if len(p.text) <= max_chars]


def dynamic_trace(spec: TraceSpec, scale: float = 1.0) -> list[Phase]:
    """low -> high -> low, then the sawtooth. The step trace comes first because the sawtooth ends at
    its highest level: the requests still running from it would otherwise fill the low phase's batch
    (a request outlives a 20-30 s level); they drain after the trace instead, counted in ``saw``."""
    return step_trace(spec, scale) + sawtooth_trace(spec, scale)


def phase_names(phases: Sequence[Phase]) -> list[str]:
    """Distinct names in order of first appearance."""
    return list(dict.fromkeys(p.name for p in phases))


def phase_windows(phases: Sequence[Phase]) -> list[tuple[str, float, float]]:
    """(name, start_s, end_s) of every phase, relative to the run start."""
    out, t = [], 0.0
    for p in phases:
        out.append((p.name, t, t + p.duration_s))
        t += p.duration_s
    return out


def phase_lengths(windows: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds of the trace each phase name holds (a sawtooth's teeth summed)."""
    out: dict[str, float] = defaultdict(float)
    for name, a, b in windows:
        out[name] += b - a
    return dict(out)


def phase_of(t: float, windows: Sequence[tuple[str, float, float]]) -> str:
    """Name of the phase containing ``t`` (after the last: ``drain``)."""
    for name, a, b in windows:
        if a <= t < b:
            return name
    return "drain" if windows and t >= windows[-1][2] else "before"


# --- per-phase aggregation -------------------------------------------------------------------------


def per_phase_summary(records: Sequence[RequestRecord], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """loadgen.summarize per phase of arrival and ``overall`` (throughput over each group's own span);
    ``overall["error_messages"]`` says why each failed request failed (a failure is not a result)."""
    out = {n: summarize([r for r in records if r.phase == n]).as_dict() for n in names}
    out["overall"] = summarize(records).as_dict()
    out["overall"]["error_messages"] = [f"{r.phase} +{r.start_s:.1f}s: {r.error}" for r in records if r.error]
    return out


def _phase_spans(windows: Sequence[tuple[str, float, float]], run_end: float) -> list[tuple[str, float, float]]:
    """The windows with the last one run on to ``run_end`` (the drain counts to the last phase)."""
    return [(n, a, max(b, run_end) if i == len(windows) - 1 else b) for i, (n, a, b) in enumerate(windows)]


def own_window_tok_s(
    records: Sequence[RequestRecord], windows: Sequence[tuple[str, float, float]], run_end: float,
) -> dict[str, float | None]:
    """Per phase: output tokens of the requests arriving in the phase that came out while the phase
    lasted, over its length (the last phase's window runs on to ``run_end``, seconds since the run
    started). Unlike throughput by arrival (tokens over the requests' own span), it is not set by the
    one request that runs on into the next phase; unlike ``window_tok_s``, the previous phase's
    backlog served meanwhile does not count. None where a phase's records carry no token times."""
    spans = _phase_spans(windows, run_end)
    toks: dict[str, int] = defaultdict(int)
    timed: set[str] = set()
    for r in records:
        if r.token_times:
            timed.add(r.phase)
        prev = 0
        for t, n in r.token_times:
            if any(name == r.phase and a <= t < b for name, a, b in spans):
                toks[r.phase] += n - prev
            prev = n
    length = phase_lengths(spans)
    return {name: toks[name] / length[name] if name in timed and length[name] > 0 else None for name in length}


def record_row(r: RequestRecord) -> dict[str, Any]:
    """One request as a JSON row, without its text, token times to the millisecond."""
    row = {k: v for k, v in vars(r).items() if k not in ("text", "token_times")}
    row["token_times"] = [[round(t, 3), n] for t, n in r.token_times]
    return row


def step_phase_stats(
    steps: Iterable[StepFeedback], unix0: float, windows: Sequence[tuple[str, float, float]],
    unix1: float | None = None,
) -> dict[str, dict[str, float | None]]:
    """Per phase (by step end time) and ``overall``: mean gamma, mean decoding batch, step count,
    acceptance (accepted / drafted) from the worker's step log of one run starting at ``unix0``, and
    ``window_tok_s``: tokens the server emitted in the phase's windows over their length (given the
    run's end ``unix1``, the last phase's window runs on through the drain). It is the delivered
    throughput while the phase lasted, whoever's requests the tokens belonged to.

    ``busy_s`` (step times plus catch-ups) and the prompt tokens prefilled, all and with the draft on
    (``prompt_tokens_draft_on``: a step at gamma > 0 prefills the draft too), say where a policy
    spent its time: by-arrival throughput of a short phase moves with a few requests' timing."""
    acc: dict[str, list[StepFeedback]] = defaultdict(list)
    end = windows[-1][2] if windows else 0.0
    run_end = max(end, unix1 - unix0) if unix1 is not None else end
    last = end
    for s in steps:
        t = s.time - unix0
        if t < 0:
            continue
        acc["overall"].append(s)
        last = max(last, t)
        if t < end:
            acc[phase_of(t, windows)].append(s)
        elif t < run_end:
            acc[windows[-1][0]].append(s)
    span = phase_lengths(_phase_spans(windows, run_end))
    span["overall"] = run_end if unix1 is not None else last
    out: dict[str, dict[str, float | None]] = {}
    for name in [*dict.fromkeys(w[0] for w in windows), "overall"]:
        ss = acc.get(name, [])
        drafted = sum(s.num_draft_tokens for s in ss)
        out[name] = {
            "steps": float(len(ss)),
            "mean_gamma": statistics.fmean(s.gamma for s in ss) if ss else None,
            "mean_batch": statistics.fmean(s.batch_size for s in ss) if ss else None,
            "acceptance": sum(s.num_accepted_tokens for s in ss) / drafted if drafted else None,
            "window_tok_s": sum(s.tokens_emitted for s in ss) / span[name] if span[name] > 0 else None,
            "busy_s": sum(s.step_time_s + s.switch_cost_s for s in ss),
            "prompt_tokens": float(sum(s.prefill_tokens for s in ss)),
            "prompt_tokens_draft_on": float(sum(s.prefill_tokens for s in ss if s.gamma > 0)),
        }
    return out


def steps_between(steps: Iterable[StepFeedback], unix0: float, unix1: float) -> list[StepFeedback]:
    return [s for s in steps if unix0 <= s.time < unix1]


def binned(
    steps: Sequence[StepFeedback], unix0: float, bin_s: float = 1.0
) -> list[tuple[float, float, float]]:
    """(bin start s, mean gamma, tokens/s) per ``bin_s`` bin of the step log (empty bins skipped)."""
    bins: dict[int, list[StepFeedback]] = defaultdict(list)
    for s in steps:
        if s.time >= unix0:
            bins[int((s.time - unix0) // bin_s)].append(s)
    return [
        (k * bin_s, statistics.fmean(s.gamma for s in v), sum(s.tokens_emitted for s in v) / bin_s)
        for k, v in sorted(bins.items())
    ]


# --- what the run's own step log says about the cost surface ----------------------------------------


def _decode_steps(steps: Iterable[StepFeedback]) -> list[StepFeedback]:
    """Pure decode steps (no prefill tokens in the step): the cost surface the planner trades on,
    keyed by the requests the step ran (``num_reqs``; ``batch_size`` is the policy's context, which
    also counts requests still waiting)."""
    return [s for s in steps if s.prefill_tokens == 0 and s.num_reqs >= 1 and s.step_time_s > 0]


def cell_times(steps: Iterable[StepFeedback]) -> dict[tuple[int, int], list[float]]:
    """{(batch, gamma): [step seconds]} over pure decode steps."""
    out: dict[tuple[int, int], list[float]] = defaultdict(list)
    for s in _decode_steps(steps):
        out[(s.num_reqs, s.gamma)].append(s.step_time_s)
    return out


def acceptance_alpha(steps: Iterable[StepFeedback]) -> float | None:
    """Per-token acceptance of the geometric model, from the largest gamma's decode steps: mean
    accepted drafts per request-step inverted (the planner's own inversion)."""
    by_g: dict[int, list[StepFeedback]] = defaultdict(list)
    for s in steps:
        if s.gamma > 0 and s.num_draft_tokens > 0:
            by_g[s.gamma].append(s)
    if not by_g:
        return None
    g = max(by_g)
    drafted = sum(s.num_draft_tokens for s in by_g[g])
    accepted = sum(s.num_accepted_tokens for s in by_g[g])
    return invert_acceptance(accepted / (drafted / g), g)


def draft_prefill_cost(steps: Sequence[StepFeedback], min_steps: int = 3) -> float:
    """Seconds the running draft adds per prompt token prefilled in a step: the least-squares slope
    of step time on prompt tokens over the steps that carried prompts with the draft on (gamma > 0),
    minus the same slope with it off. 0 when a state has fewer than ``min_steps`` such steps or a
    single prompt size (no slope)."""
    import numpy as np

    slopes = []
    for on in (False, True):
        pts = [(s.prefill_tokens, s.step_time_s) for s in steps
               if s.prefill_tokens > 0 and (s.gamma > 0) == on]
        if len(pts) < min_steps or len({x for x, _ in pts}) < 2:
            return 0.0
        x, y = np.array(pts, dtype=float).T
        slopes.append(float(np.polyfit(x, y, 1)[0]))
    return max(0.0, slopes[1] - slopes[0])


def prompt_per_output(steps: Sequence[StepFeedback]) -> float:
    """The workload's prompt tokens prefilled per token generated, over all steps (0 if none)."""
    gen = sum(s.tokens_emitted for s in steps)
    return sum(s.prefill_tokens for s in steps) / gen if gen > 0 else 0.0


def profile_from_steps(
    steps: Sequence[StepFeedback],
    gammas: Sequence[int],
    *,
    name: str,
    device: str,
    target: str,
    draft: str,
    kv_blocks_total: int,
    kv_block_bytes: int,
    draft_weight_bytes: int = 0,
    block_tokens: int = 16,
    min_steps: int = 3,
) -> CostProfile:
    """A CostProfile from step logs of runs covering every gamma (no-SD + static-k). Per gamma, the
    median step time at every batch size observed at least ``min_steps`` times under it; each gamma's
    points interpolated linearly onto the union of those batch sizes inside the range every gamma
    covers (no extrapolation). Each static run meets its own batch sizes (a trace's waves fill
    differently at another gamma), so requiring every gamma at the same batch size left two batch
    sizes of a 375 s Qwen trace (1 and 2, or 1 and 38), and the oracle extrapolated from them.
    Acceptance from the largest gamma; C_switch fitted on the catch-up steps; the draft's prefill cost
    and the prompt/output ratio from the steps that carried prompts. Raises ValueError when
    a gamma has no batch size or the gammas' ranges do not overlap."""
    import numpy as np
    from nightjar_worker.profiler import fit_switch_cost

    cells = cell_times(steps)
    gs = sorted(set(gammas))
    pts = {g: sorted((b, statistics.median(v)) for (b, gg), v in cells.items() if gg == g and len(v) >= min_steps)
           for g in gs}
    missing = [g for g in gs if not pts[g]]
    if missing:
        raise ValueError(f"gamma {missing}: no batch size has >= {min_steps} pure decode steps "
                         f"(the profile needs every gamma {gs})")
    lo, hi = max(p[0][0] for p in pts.values()), min(p[-1][0] for p in pts.values())
    grid = sorted({b for p in pts.values() for b, _ in p if lo <= b <= hi})
    if not grid:
        raise ValueError(f"the batch sizes of every gamma {gs} do not overlap ({lo} > {hi})")
    rows = [(b, [float(np.interp(b, [x for x, _ in pts[g]], [y for _, y in pts[g]])) for g in gs]) for b in grid]
    alpha = acceptance_alpha(steps)
    fixed, per_tok = fit_switch_cost([(s.catchup_tokens or 0, s.switch_cost_s) for s in steps if s.switch_cost_s > 0])
    return CostProfile(
        name=name, device=device, target=target, draft=draft, block_tokens=block_tokens,
        kv_blocks_total=max(1, kv_blocks_total), kv_block_bytes=max(1, kv_block_bytes),
        draft_weight_bytes=draft_weight_bytes, max_batch=rows[-1][0],
        batch_sizes=[b for b, _ in rows], gammas=gs, step_time_s=[r for _, r in rows],
        acceptance={"all": min(1.0, max(0.0, alpha if alpha is not None else 0.0))},
        switch_cost_fixed_s=fixed, switch_cost_per_token_s=per_tok,
        draft_prefill_s_per_token=draft_prefill_cost(steps), prompt_tokens_per_output_token=prompt_per_output(steps),
    )


def best_gamma_per_batch(steps: Iterable[StepFeedback], min_steps: int = 3) -> dict[int, int]:
    """The offline sweep vLLM's Dynamic SD docs suggest, per batch size: the gamma whose decode steps
    produced the most tokens per second (ratio of sums; gamma 0 = no-SD). Only batch sizes where at
    least two gammas have ``min_steps`` steps."""
    tok: dict[tuple[int, int], float] = defaultdict(float)
    sec: dict[tuple[int, int], float] = defaultdict(float)
    n: dict[tuple[int, int], int] = defaultdict(int)
    for s in _decode_steps(steps):
        key = (s.num_reqs, s.gamma)
        tok[key] += s.tokens_emitted
        sec[key] += s.step_time_s
        n[key] += 1
    out = {}
    for b in sorted({b for b, _ in n}):
        cands = {g: tok[(bb, g)] / sec[(bb, g)] for (bb, g) in n if bb == b and n[(bb, g)] >= min_steps}
        if len(cands) >= 2:
            out[b] = max(sorted(cands), key=cands.__getitem__)
    return out


def table_from_best(best: Mapping[int, int], max_batch: int = 1024) -> list[list[int]]:
    """vLLM's ``[[start, end, k], ...]`` from {batch: best k}: each measured batch size owns the range
    up to the next one; equal neighbours merged; the first range starts at 1 (default k 0 if empty)."""
    if not best:
        return [[1, max_batch, 0]]
    items = sorted(best.items())
    rows: list[list[int]] = []
    for i, (b, k) in enumerate(items):
        start = 1 if i == 0 else b
        end = items[i + 1][0] - 1 if i + 1 < len(items) else max_batch
        if rows and rows[-1][2] == k:
            rows[-1][1] = end
        else:
            rows.append([start, end, k])
    return rows


def oracle_gammas(profile: CostProfile, batches: Iterable[int]) -> dict[int, int]:
    """Per batch size the gamma with the least expected seconds per token under the profile: what the
    planner's oracle plays, switching cost aside (gamma > 0 pays the draft's prefill per token)."""
    oracle = OraclePolicy(PlannerConfig(max_gamma=max(profile.gammas)), profile)
    return {b: min(oracle.arms, key=lambda g: oracle.expected_loss(b, g)) for b in batches}


# --- verdicts --------------------------------------------------------------------------------------


def _tput(res: Mapping[str, Mapping[str, Any]], pol: str, phase: str, field: str = "output_tok_s") -> float:
    return float(res[pol][phase][field])


def _worst_phase(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]], pol: str, phases: Sequence[str], st: Sequence[str],
    field: str = "output_tok_s",
) -> float | None:
    """min over phases of ``pol``'s ``field`` over the best static's in that phase."""
    best_per_phase = {ph: max(_tput(results, p, ph, field) for p in st) for ph in phases}
    per = [_tput(results, pol, ph, field) / best for ph, best in best_per_phase.items() if best > 0]
    return min(per) if per else None


def _own_window_known(results: Mapping[str, Mapping[str, Mapping[str, Any]]], pols: Iterable[str],
                      phases: Iterable[str]) -> bool:
    """Whether every policy's summaries carry ``own_window_tok_s`` (the records had token times)."""
    return all(results[p][ph].get("own_window_tok_s") is not None for p in pols for ph in phases)


def _vs_best_static(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]], pol: str, phases: Sequence[str], st: Sequence[str],
) -> dict[str, float | None]:
    """``pol`` against the best of the fixed gammas ``st``: the worst phase, overall throughput and
    the overall p99 latencies (for those the lowest static p99 is the best)."""
    out: dict[str, float | None] = {"worst_phase_vs_best_static": _worst_phase(results, pol, phases, st)}
    if _own_window_known(results, (pol, *st), phases):
        out["worst_phase_own_window_vs_best_static"] = _worst_phase(results, pol, phases, st, "own_window_tok_s")
    best = max(_tput(results, p, "overall") for p in st)
    out["overall_vs_best_static"] = _tput(results, pol, "overall") / best if best > 0 else None
    for key, field in (("p99_tpot_vs_best_static", "tpot_p99_s"), ("p99_ttft_vs_best_static", "ttft_p99_s")):
        best_p99 = [results[p]["overall"][field] for p in st if results[p]["overall"][field]]
        mine = results[pol]["overall"][field]
        out[key] = mine / min(best_p99) if best_p99 and mine else None
    return out


def _own_window_envelope(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]], pol: str, st: Sequence[str],
    phase_s: Mapping[str, float],
) -> dict[str, float]:
    """Own-window tok/s averaged over the trace (each phase weighted by its length): ``pol`` and the
    best static of every phase, both over no-SD. The second is what switching to each phase's best
    fixed gamma, for free and knowing the phases, would reach: a ceiling for a gamma policy on this
    trace and machine, not counting what a policy gains by choosing per batch inside a phase."""
    def mean(rate: Callable[[str], float]) -> float:
        return sum(rate(ph) * s for ph, s in phase_s.items()) / sum(phase_s.values())
    base = mean(lambda ph: _tput(results, "nosd", ph, "own_window_tok_s"))
    if base <= 0:
        return {}
    return {"own_window_overall_vs_nosd": mean(lambda ph: _tput(results, pol, ph, "own_window_tok_s")) / base,
            "best_static_per_phase_vs_nosd":
                mean(lambda ph: max(_tput(results, p, ph, "own_window_tok_s") for p in st)) / base}


def dynamic_ratios(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
    phases: Sequence[str],
    adaptive: str = "nightjar",
    statics: Sequence[str] = ("nosd", "static-1", "static-2", "static-3", "static-4"),
    oracle: str = "oracle",
    phase_s: Mapping[str, float] | None = None,
) -> dict[str, float | None]:
    """The RESULT figures. ``results[policy][phase | 'overall']`` holds loadgen summaries. "Best
    static" is taken over every fixed gamma in the run, no-SD (gamma 0) included, per phase; for the
    p99 latencies (lower is better) it is the lowest. ``p99_ttft_vs_best_static`` goes with the TPOT
    one: a policy that admits more requests (elastic memory) trades per-token latency for queueing.
    ``overall_vs_nosd_nodraft`` only when the run has ``nosd-nodraft`` (bench_dynamic --kv-base-blocks).
    ``oracle_worst_phase_vs_best_static`` and ``oracle_p99_tpot_vs_best_static``, when the oracle ran,
    are the same two figures for the oracle: what the profile's best per-batch gamma reaches on the
    same trace and machine, a reference for reading a missed target (not a bound: by-arrival phases
    of a few requests move with one request's finish). ``worst_phase_own_window_vs_best_static`` (and
    the oracle's), when the records carry token times: the worst phase by ``own_window_tok_s``, what
    each phase's own requests got out while the phase lasted; reported beside the issue's figure, not
    in its place. With ``phase_s`` (seconds per phase) and token times, ``own_window_overall_vs_nosd``
    and ``best_static_per_phase_vs_nosd`` (see ``_own_window_envelope``): how much a perfect choice of
    fixed gamma per phase could gain over no-SD, against what the adaptive policy gained."""
    st = [p for p in statics if p in results]
    out: dict[str, float | None] = dict.fromkeys(
        ("worst_phase_vs_best_static", "overall_vs_nosd", "overall_vs_best_static",
         "p99_tpot_vs_best_static", "p99_ttft_vs_best_static", "oracle_fraction"))
    if adaptive not in results:
        return out
    if st:
        out.update(_vs_best_static(results, adaptive, phases, st))
        if phase_s and "nosd" in st and _own_window_known(results, (adaptive, *st), phase_s):
            out.update(_own_window_envelope(results, adaptive, st, phase_s))
    if "nosd" in results and _tput(results, "nosd", "overall") > 0:
        out["overall_vs_nosd"] = _tput(results, adaptive, "overall") / _tput(results, "nosd", "overall")
    if "nosd-nodraft" in results and _tput(results, "nosd-nodraft", "overall") > 0:
        out["overall_vs_nosd_nodraft"] = _tput(results, adaptive, "overall") / _tput(results, "nosd-nodraft", "overall")
    if oracle in results and _tput(results, oracle, "overall") > 0:
        out["oracle_fraction"] = _tput(results, adaptive, "overall") / _tput(results, oracle, "overall")
        if st:
            ref = _vs_best_static(results, oracle, phases, st)
            for key in ("worst_phase_vs_best_static", "p99_tpot_vs_best_static", "worst_phase_own_window_vs_best_static"):
                if key in ref:
                    out[f"oracle_{key}"] = ref[key]
    return out


def slope_per_hour(samples: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) in value units per hour (None under 3 samples)."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    sxx = sum((t - mx) ** 2 for t, _ in samples)
    if sxx == 0:
        return None
    return sum((t - mx) * (v - my) for t, v in samples) / sxx * 3600.0


def rss_slopes_by_process(
    by_process: Sequence[tuple[float, Mapping[str, Mapping[str, int]]]], t_from: float
) -> dict[str, dict[str, float | None]]:
    """MiB/h per process and RSS kind (rss, anon, file, shmem) over the samples at or after ``t_from``
    (monotonic seconds, as sampled): which process grows, and whether it is anonymous memory (what a
    leak grows) or file-backed pages. A process seen in fewer than 3 samples gets None."""
    series: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for t, per in by_process:
        if t < t_from:
            continue
        for proc, kinds in per.items():
            for kind, b in kinds.items():
                series.setdefault(proc, {}).setdefault(kind, []).append((t, b / 2**20))
    return {proc: {kind: slope_per_hour(pts) for kind, pts in kinds.items()} for proc, kinds in series.items()}


def compare_texts(got: Mapping[int, Sequence[str]], ref: Mapping[int, str]) -> dict[str, Any]:
    """Soak verdict: every response for prompt ``qid`` against the plain-decoding reference text.
    ``missing_ref`` counts responses whose prompt has no reference (not compared)."""
    diff, same, missing = [], 0, 0
    for qid, texts in got.items():
        if qid not in ref:
            missing += len(texts)
            continue
        for t in texts:
            if t == ref[qid]:
                same += 1
            else:
                diff.append(qid)
    return {"same": same, "different": len(diff), "different_qids": sorted(set(diff)), "missing_ref": missing}


def first_divergence(ref_tokens: Sequence[str], text: str) -> int | None:
    """Index of the reference token where ``text`` first departs from the reference (the tokens'
    concatenation); None if ``text`` equals it."""
    ref = "".join(ref_tokens)
    if text == ref:
        return None
    k = next((i for i, (a, b) in enumerate(zip(ref, text, strict=False)) if a != b), min(len(ref), len(text)))
    pos = 0
    for i, tok in enumerate(ref_tokens):
        pos += len(tok)
        if k < pos:
            return i
    return max(0, len(ref_tokens) - 1)
