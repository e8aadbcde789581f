"""Fleet aggregation: per-pod scrapes of worker ``/metrics`` -> one ``FleetStats``.

Pure: the handler does the HTTP. Counters and histograms are windowed (``window(prev, cur)``: the
delta between two scrapes of the same pod, with counter resets handled like PromQL ``rate``), the
planner's own estimates (``nightjar_planner_loss_seconds``/``_count`` gauges) and the other gauges
are taken as they are now. Aggregation across pods is ``sum by (le)`` for histograms, sums for
counters, count-weighted means for the planner's per (bucket, gamma, source) losses (a series
without the ``source`` label, from a worker before it, is the draft model's), and the median of the
workers' draft prefill prices (one odd pod does not move it).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from nightjar_operator.fleet.promtext import Histogram, Scrape

# Metric names (interfaces.md for nightjar_*, vLLM 0.32 for vllm:*). Several vLLM names are tried in
# order because vLLM renamed its per-token latency histograms across releases.
PLANNER_LOSS = "nightjar_planner_loss_seconds"
PLANNER_COUNT = "nightjar_planner_count"
DRAFT_PREFILL = "nightjar_planner_draft_prefill_per_prompt_token_seconds"
DRAFT_TOKENS = "nightjar_draft_tokens_total"
ACCEPTED_TOKENS = "nightjar_accepted_tokens_total"
ACCEPTANCE_RATE = "nightjar_acceptance_rate"
STEPS = "nightjar_steps_total"
PlannerKey = tuple[int, int, str]  # (bucket_lo, gamma, source) of a planner estimate
SWITCH_COST = "nightjar_switch_cost_seconds"
DRAFT_STATE_INFO = "nightjar_draft_state_info"
OFFLOAD_ENABLED = "nightjar_memory_offload_enabled"
TTFT_NAMES = ("vllm:time_to_first_token_seconds",)
TPOT_NAMES = (
    "vllm:request_time_per_output_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
)
GENERATION_TOKENS_NAMES = ("vllm:generation_tokens_total", "vllm:generation_tokens")
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)


def _with_escaped(names: tuple[str, ...]) -> tuple[str, ...]:
    """Each ``vllm:`` name and its ``vllm_`` form: prometheus_client >= 0.22 escapes the colon when
    the scraper negotiates OpenMetrics (Prometheus does), so through Prometheus they read ``vllm_*``."""
    return tuple(x for n in names for x in (n, n.replace("vllm:", "vllm_", 1)))


TTFT_NAMES, TPOT_NAMES = _with_escaped(TTFT_NAMES), _with_escaped(TPOT_NAMES)
GENERATION_TOKENS_NAMES = _with_escaped(GENERATION_TOKENS_NAMES)
RUNNING, WAITING = _with_escaped(RUNNING), _with_escaped(WAITING)

_INT = re.compile(r"-?\d+")


def _int_label(v: str) -> int | None:
    """Bucket/gamma labels are integers; tolerate forms like "4-5" or "[4,6)" (first integer)."""
    m = _INT.search(v)
    return int(m.group()) if m else None


@dataclass(frozen=True)
class PodMetrics:
    """What the fleet loop reads from one pod's scrape. Counters/histograms are cumulative until
    ``window`` turns them into deltas."""

    ts: float  # wall time of the scrape (seconds)
    planner: dict[PlannerKey, tuple[float, float]] = field(default_factory=dict)  # -> (mean, count)
    draft_prefill_s: float | None = None  # the planner's draft prefill seconds per prompt token (None: unknown)
    draft_tokens: dict[int, float] = field(default_factory=dict)
    accepted_tokens: dict[int, float] = field(default_factory=dict)
    acceptance_gauge: dict[int, float] = field(default_factory=dict)
    steps: dict[int, float] = field(default_factory=dict)
    switch_cost: Histogram | None = None
    ttft: Histogram | None = None
    tpot: Histogram | None = None
    generation_tokens: float | None = None
    running: float | None = None
    waiting: float | None = None
    draft_state: str | None = None
    offload: str | None = None  # reason label of nightjar_memory_offload_enabled ("enabled" when it runs)
    window_s: float | None = None  # set by ``window``: seconds between the two scrapes


def _first_hist(scrape: Scrape, names: tuple[str, ...]) -> Histogram | None:
    for n in names:
        h = scrape.histogram(n)
        if h is not None:
            return h
    return None


def _first_value(scrape: Scrape, names: tuple[str, ...]) -> float | None:
    for n in names:
        v = scrape.value(n)
        if v is not None:
            return v
    return None


def _per_gamma(scrape: Scrape, name: str) -> dict[int, float]:
    """Per gamma, the draft model's series only: n-gram drafts (source="ngram") are not the pair's
    acceptance (series without the label come from workers that had only the draft model)."""
    out: dict[int, float] = {}
    for s in scrape.series(name):
        g = _int_label(s.label("gamma") or "")
        if g is not None and g >= 0 and not math.isnan(s.value) and (s.label("source") or "draft") == "draft":
            out[g] = out.get(g, 0.0) + s.value
    return out


def extract(scrape: Scrape, ts: float) -> PodMetrics:
    """Read the fleet-relevant series out of one pod's scrape. Missing series stay empty/None."""
    counts: dict[PlannerKey, float] = {}
    for s in scrape.series(PLANNER_COUNT):
        b, g = _int_label(s.label("bucket") or ""), _int_label(s.label("gamma") or "")
        if b is not None and g is not None and s.value > 0:
            counts[(b, g, s.label("source") or "draft")] = s.value
    planner: dict[PlannerKey, tuple[float, float]] = {}
    for s in scrape.series(PLANNER_LOSS):
        b, g = _int_label(s.label("bucket") or ""), _int_label(s.label("gamma") or "")
        if b is None or g is None or not (s.value > 0) or math.isinf(s.value):
            continue
        key = (b, g, s.label("source") or "draft")
        n = counts.get(key, 0.0)
        if n > 0:
            planner[key] = (s.value, n)
    state = None
    for s in scrape.series(DRAFT_STATE_INFO):
        if s.value >= 1:
            state = s.label("state")
    offload = next((s.label("reason") for s in scrape.series(OFFLOAD_ENABLED)), None)
    dps = scrape.value(DRAFT_PREFILL)
    return PodMetrics(
        ts=ts,
        planner=planner,
        draft_prefill_s=dps if dps is not None and 0 < dps < math.inf else None,  # 0: not known yet
        draft_tokens=_per_gamma(scrape, DRAFT_TOKENS),
        accepted_tokens=_per_gamma(scrape, ACCEPTED_TOKENS),
        acceptance_gauge=_per_gamma(scrape, ACCEPTANCE_RATE),
        steps=_per_gamma(scrape, STEPS),
        switch_cost=scrape.histogram(SWITCH_COST),
        ttft=_first_hist(scrape, TTFT_NAMES),
        tpot=_first_hist(scrape, TPOT_NAMES),
        generation_tokens=_first_value(scrape, GENERATION_TOKENS_NAMES),
        running=_first_value(scrape, RUNNING),
        waiting=_first_value(scrape, WAITING),
        draft_state=state,
        offload=offload,
    )


def _counter_delta(cur: Mapping[int, float], prev: Mapping[int, float]) -> dict[int, float]:
    # A reset of any series (worker restart) -> take the current value, as PromQL increase() does.
    if any(cur.get(k, 0.0) < v for k, v in prev.items()):
        return dict(cur)
    return {k: v - prev.get(k, 0.0) for k, v in cur.items()}


def window(prev: PodMetrics | None, cur: PodMetrics) -> PodMetrics:
    """Counters and histograms of ``cur`` as deltas since ``prev`` (same pod). Without ``prev``
    the cumulative values are returned and ``window_s`` stays None (no rate can be computed);
    ``prev`` from the same scrape gives an empty window (``window_s`` 0, no rate)."""
    if prev is None or prev.ts > cur.ts:
        return cur
    # prev.ts == cur.ts (a pod first seen in this very scrape) gives an empty window.
    gen = None
    if cur.generation_tokens is not None:
        p = prev.generation_tokens or 0.0
        gen = cur.generation_tokens - p if cur.generation_tokens >= p else cur.generation_tokens
    return replace(
        cur,
        draft_tokens=_counter_delta(cur.draft_tokens, prev.draft_tokens),
        accepted_tokens=_counter_delta(cur.accepted_tokens, prev.accepted_tokens),
        steps=_counter_delta(cur.steps, prev.steps),
        switch_cost=cur.switch_cost.delta(prev.switch_cost) if cur.switch_cost else None,
        ttft=cur.ttft.delta(prev.ttft) if cur.ttft else None,
        tpot=cur.tpot.delta(prev.tpot) if cur.tpot else None,
        generation_tokens=gen,
        window_s=cur.ts - prev.ts,
    )


@dataclass
class FleetStats:
    """Fleet-wide statistics of one deployment (or one revision of it)."""

    pods: int = 0
    planner: dict[PlannerKey, tuple[float, float]] = field(default_factory=dict)  # -> (mean, count)
    draft_prefill_s: float | None = None  # median over the pods that know it
    acceptance: dict[int, float] = field(default_factory=dict)  # gamma -> accepted / drafted
    steps: dict[int, float] = field(default_factory=dict)
    switch_cost_mean_s: float | None = None
    switch_cost_p95_s: float | None = None
    ttft: Histogram | None = None
    tpot: Histogram | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    throughput_tok_s: float | None = None  # generated tokens per second, summed over pods
    running: float = 0.0
    waiting: float = 0.0
    draft_states: dict[str, int] = field(default_factory=dict)
    offload: dict[str, int] = field(default_factory=dict)  # reason -> pods ("enabled": elastic memory runs)

    @property
    def requests(self) -> float:
        """Requests observed in the window (TTFT histogram observations)."""
        return self.ttft.observations if self.ttft is not None else 0.0


def _sum_hist(hs: list[Histogram | None]) -> Histogram | None:
    out: Histogram | None = None
    for h in hs:
        if h is not None:
            out = h if out is None else out + h
    return out


def aggregate(pods: Mapping[str, PodMetrics]) -> FleetStats:
    """Combine per-pod (windowed) metrics into fleet statistics."""
    st = FleetStats(pods=len(pods))
    loss_sum: dict[PlannerKey, float] = {}
    count_sum: dict[PlannerKey, float] = {}
    drafted: Counter[int] = Counter()
    accepted: Counter[int] = Counter()
    gauge_acc: dict[int, list[float]] = {}
    states: Counter[str] = Counter()
    rate_total = 0.0
    have_rate = False
    for pm in pods.values():
        for key, (mean, n) in pm.planner.items():
            loss_sum[key] = loss_sum.get(key, 0.0) + mean * n
            count_sum[key] = count_sum.get(key, 0.0) + n
        drafted.update(pm.draft_tokens)
        accepted.update(pm.accepted_tokens)
        for g, v in pm.acceptance_gauge.items():
            gauge_acc.setdefault(g, []).append(v)
        for g, v in pm.steps.items():
            st.steps[g] = st.steps.get(g, 0.0) + v
        st.running += pm.running or 0.0
        st.waiting += pm.waiting or 0.0
        if pm.draft_state:
            states[pm.draft_state] += 1
        if pm.offload:
            st.offload[pm.offload] = st.offload.get(pm.offload, 0) + 1
        if pm.generation_tokens is not None and pm.window_s:
            rate_total += pm.generation_tokens / pm.window_s
            have_rate = True
    st.planner = {k: (loss_sum[k] / count_sum[k], count_sum[k]) for k in sorted(loss_sum)}
    dps = [pm.draft_prefill_s for pm in pods.values() if pm.draft_prefill_s is not None]
    st.draft_prefill_s = statistics.median(dps) if dps else None
    for g in sorted(set(drafted) | set(gauge_acc)):
        if drafted.get(g, 0) > 0:
            st.acceptance[g] = accepted.get(g, 0.0) / drafted[g]
        elif g in gauge_acc:  # no drafts counted in the window: fall back to the workers' gauges
            st.acceptance[g] = sum(gauge_acc[g]) / len(gauge_acc[g])
    sw = _sum_hist([pm.switch_cost for pm in pods.values()])
    if sw is not None and sw.count > 0:
        st.switch_cost_mean_s = sw.sum / sw.count
        st.switch_cost_p95_s = sw.quantile(0.95)
    st.ttft = _sum_hist([pm.ttft for pm in pods.values()])
    st.tpot = _sum_hist([pm.tpot for pm in pods.values()])
    if st.ttft is not None:
        st.ttft_p50_s, st.ttft_p95_s = st.ttft.quantile(0.5), st.ttft.quantile(0.95)
    if st.tpot is not None:
        st.tpot_p50_s, st.tpot_p95_s = st.tpot.quantile(0.5), st.tpot.quantile(0.95)
    st.throughput_tok_s = rate_total if have_rate else None
    st.draft_states = dict(states)
    return st
