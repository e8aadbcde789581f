"""Every ``nightjar_*`` Prometheus metric of the worker, defined in one place.

Where they are recorded vs. where they are served: the gamma policy, the scheduler and the draft
memory manager run in vLLM's *EngineCore* process, while ``/metrics`` is served by the *API server*
process. vLLM 0.32 builds its ``/metrics`` registry with ``get_prometheus_registry()``
(``vllm/v1/metrics/prometheus.py``): when ``PROMETHEUS_MULTIPROC_DIR`` is set it serves a fresh
``CollectorRegistry`` with a ``multiprocess.MultiProcessCollector`` that reads the mmap'd value files
*every* process wrote into that directory; otherwise only the API server's in-memory registry. So
``nightjar-worker serve`` creates a fresh, private directory and sets ``PROMETHEUS_MULTIPROC_DIR``
before vLLM (and ``prometheus_client``) is imported; the EngineCore inherits the variable and
our metrics, recorded there, appear on the API server's ``/metrics`` next to vLLM's ``vllm:*``.
(Alternatives rejected: a side HTTP port in the EngineCore means a second scrape target per pod;
piggy-backing on ``SchedulerStats`` needs a custom stat logger the API server cannot be given.)

Gauges therefore carry a ``multiprocess_mode``: ``mostrecent`` (the value last set by any process).
Without ``PROMETHEUS_MULTIPROC_DIR`` (e.g. the offline ``LLM`` class in tests) the same objects live
in the default in-process registry.

Recording is through ``WorkerMetrics`` (plain methods, no vLLM types) so the engine code stays free of
Prometheus details. Names/labels are the fixed interface in ``notes/interfaces.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from nightjar_worker.planner.policy import PlannerStats

ENV_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"

GAMMA_BUCKETS = tuple(float(g) for g in range(0, 17))  # le=0 counts gamma 0, le=1 gamma<=1, ...
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512)
SWITCH_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
DECISION_BUCKETS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01)
MOVE_BUCKETS = (1e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 60.0)

DRAFT_STATES = ("resident", "offloading", "offloaded", "reloading", "draining")  # index = nightjar_draft_state

_MP = "mostrecent"

# --- planner / executor ----------------------------------------------------------------------------
gamma_chosen = Histogram("nightjar_gamma_chosen", "Speculation length chosen per decoding step", buckets=GAMMA_BUCKETS)
gamma_current = Gauge("nightjar_gamma_current", "Speculation length of the latest step", multiprocess_mode=_MP)
steps_total = Counter(
    "nightjar_steps_total", "Decoding steps run, by chosen gamma and source of drafts (draft, ngram, suffix)",
    ["gamma", "source"]
)
switches_total = Counter(
    "nightjar_switches_total", "The draft model started (on: 0 or n-gram -> draft k) or stopped drafting (off)",
    ["direction"]
)
switch_cost_seconds = Histogram(
    "nightjar_switch_cost_seconds", "Measured C_switch: draft KV catch-up time on resume", buckets=SWITCH_BUCKETS
)
acceptance_rate = Gauge(
    "nightjar_acceptance_rate", "Recent per-token draft acceptance rate, by gamma and source", ["gamma", "source"],
    multiprocess_mode=_MP,
)
draft_tokens_total = Counter(
    "nightjar_draft_tokens_total", "Draft tokens verified, by gamma and source", ["gamma", "source"]
)
accepted_tokens_total = Counter(
    "nightjar_accepted_tokens_total", "Draft tokens accepted, by gamma and source", ["gamma", "source"]
)
planner_loss_seconds = Gauge(
    "nightjar_planner_loss_seconds",
    "Planner's mean loss estimate (seconds per generated token) per (batch bucket lower edge, gamma, source)",
    ["bucket", "gamma", "source"],
    multiprocess_mode=_MP,
)
planner_count = Gauge(
    "nightjar_planner_count", "Planner's (discounted) observation count per (bucket, gamma, source)",
    ["bucket", "gamma", "source"],
    multiprocess_mode=_MP,
)
planner_acceptance_gate_closed = Gauge(
    "nightjar_planner_acceptance_gate_closed",
    "1 while the planner's acceptance gate stops exploring gamma > 0 (pooled draft acceptance too low to pay)",
    multiprocess_mode=_MP,
)
planner_draft_prefill_seconds = Gauge(
    "nightjar_planner_draft_prefill_seconds",
    "Seconds per generated token the planner charges gamma > 0 for the running draft's prefill of the "
    "workload's prompts (learnt draft prefill cost per prompt token x prompt tokens per generated token; 0 until learnt)",
    multiprocess_mode=_MP,
)
planner_draft_prefill_prompt_seconds = Gauge(
    "nightjar_planner_draft_prefill_per_prompt_token_seconds",
    "Seconds the running draft adds per prompt token prefilled, as the planner prices it (its own estimate, "
    "else its priors'; 0 while unknown): a property of the pair and device, merged into the fleet's priors",
    multiprocess_mode=_MP,
)
planner_prior_conflicts_total = Counter(
    "nightjar_planner_prior_conflicts_total",
    "Planner priors contradicted by the worker's own evidence: an arm's prior dropped (action=dropped), or a "
    "bucket's priors moved to the worker's level when every arm tried is off the same way (action=rescaled)",
    ["action"],
)
planner_ttft_deferrals_total = Counter(
    "nightjar_planner_ttft_deferrals_total",
    "Steps the planner played at gamma 0 (draft off: a prompt step, or one that would resume the draft) so "
    "that waiting prompts' first tokens meet the TTFT target (the SLO objective; 0 without a TTFT target)",
)
batch_size = Histogram("nightjar_batch_size", "Requests in the decoding batch per step", buckets=BATCH_BUCKETS)
planner_decision_seconds = Histogram(
    "nightjar_planner_decision_seconds", "Wall time of one policy decide() call", buckets=DECISION_BUCKETS
)
config_reloads_total = Counter("nightjar_config_reloads_total", "Runtime config updates applied")
config_reload_failures_total = Counter(
    "nightjar_config_reload_failures_total", "Runtime config updates rejected (old config kept)"
)
# Extensions (compatible additions): what the applied config says, for dashboards and tests.
slo_tpot_target_seconds = Gauge(
    "nightjar_slo_tpot_target_seconds", "TPOT target in force (0 = none)", multiprocess_mode=_MP
)
slo_ttft_target_seconds = Gauge(
    "nightjar_slo_ttft_target_seconds", "TTFT p95 target in force (0 = none)", multiprocess_mode=_MP
)
config_last_reload_timestamp_seconds = Gauge(
    "nightjar_config_last_reload_timestamp_seconds", "Unix time the runtime config was last applied",
    multiprocess_mode=_MP,
)

# --- suffix-tree source (engine/suffix.py) ----------------------------------------------------------
SUFFIX_RESULTS = ("hit", "miss")
suffix_lookups_total = Counter(
    "nightjar_suffix_lookups_total",
    "Suffix-tree draft lookups of suffix steps, one per request: hit (at least one draft token) or miss",
    ["result"],
)
suffix_cache_bytes = Gauge(
    "nightjar_suffix_cache_bytes",
    "Memory of the suffix trees (the cross-request tree of cached outputs and the running requests' trees), "
    "as last measured (every few seconds)", multiprocess_mode=_MP,
)
suffix_cached_requests = Gauge(
    "nightjar_suffix_cached_requests",
    "Outputs held in the cross-request suffix tree (bounded by the runtime config's suffix.cache_requests)",
    multiprocess_mode=_MP,
)

# --- elastic draft memory ----------------------------------------------------------------------------
draft_state = Gauge(
    "nightjar_draft_state", "Draft weights state: 0 resident, 1 offloading, 2 offloaded, 3 reloading, 4 draining",
    multiprocess_mode=_MP,
)
draft_state_info = Gauge(
    "nightjar_draft_state_info", "1 for the draft's current state, 0 for the others", ["state"], multiprocess_mode=_MP
)
draft_transitions_total = Counter(
    "nightjar_draft_transitions_total", "Draft state transitions", ["from", "to"]
)
draft_offload_seconds = Histogram("nightjar_draft_offload_seconds", "Time to offload the draft", buckets=MOVE_BUCKETS)
draft_reload_seconds = Histogram("nightjar_draft_reload_seconds", "Time to reload the draft", buckets=MOVE_BUCKETS)
RETURN_TRIGGERS = ("demand", "recheck", "pinned")
draft_returns_total = Counter(
    "nightjar_draft_returns_total", "Draft returns started (offloaded -> draining) by trigger: demand (the planner "
    "wants the draft), recheck (offloaded for recheck_after_s with the KV cache calm), pinned (mode resident)",
    ["trigger"],
)
draft_reload_failures_total = Counter("nightjar_draft_reload_failures_total", "Failed draft reloads")
draft_reload_cancels_total = Counter(
    "nightjar_draft_reload_cancels_total", "Draft reloads cancelled because KV pressure returned (not failures)"
)
offload_enabled = Gauge(
    "nightjar_memory_offload_enabled",
    "1 when elastic draft memory runs, 0 when it is off; reason says why (enabled, disabled, or why it "
    "cannot run on this device)", ["reason"], multiprocess_mode=_MP,
)
kv_blocks_total = Gauge("nightjar_kv_blocks_total", "KV cache blocks available to the target", multiprocess_mode=_MP)
kv_blocks_extra = Gauge(
    "nightjar_kv_blocks_extra", "KV blocks gained from the offloaded draft's bytes", multiprocess_mode=_MP
)
kv_released_bytes = Gauge(
    "nightjar_kv_released_bytes",
    "Bytes of the KV pool given back while their blocks are held out (CPU: madvise; CUDA: unmapped)",
    multiprocess_mode=_MP,
)


class WorkerMetrics:
    """Recording façade used by the scheduler, the config watcher and the memory manager.

    Step contract: call ``observe_decision`` around ``policy.decide`` and ``observe_step`` once per
    finished step; ``observe_switch`` when gamma crosses 0; ``set_planner_snapshot`` now and then
    (it is a full overwrite of the per (bucket, gamma) gauges).
    """

    def __init__(self, acceptance_decay: float = 0.98) -> None:
        self._decay = acceptance_decay
        self._acc: dict[tuple[str, int], list[float]] = {}  # (source, gamma) -> [decayed accepted, decayed drafted]
        self._last_drafting: bool | None = None
        self._counts = (0, 0, 0)  # the policy's cumulative (dropped, rescaled, ttft deferrals) last seen
        for action in ("dropped", "rescaled"):  # present at 0, so rate() reads 0, not "no data"
            planner_prior_conflicts_total.labels(action=action)
        for result in SUFFIX_RESULTS:
            suffix_lookups_total.labels(result=result)

    # -- steps ---------------------------------------------------------------------------------------
    def observe_decision(self, seconds: float) -> None:
        planner_decision_seconds.observe(seconds)

    def observe_step(self, gamma: int, batch: int, num_draft_tokens: int = 0, num_accepted_tokens: int = 0,
                     source: str = "draft", drafts_source: str | None = None) -> None:
        """``source``: of this step's gamma; ``drafts_source``: of the drafts it verified (proposed
        by the previous step, so another source right after a switch; None: ``source``)."""
        g = str(gamma)
        gamma_chosen.observe(gamma)
        gamma_current.set(gamma)
        steps_total.labels(gamma=g, source=source).inc()
        batch_size.observe(batch)
        if num_draft_tokens > 0:
            src = drafts_source or source
            draft_tokens_total.labels(gamma=g, source=src).inc(num_draft_tokens)
            accepted_tokens_total.labels(gamma=g, source=src).inc(num_accepted_tokens)
            s = self._acc.setdefault((src, gamma), [0.0, 0.0])
            s[0] = s[0] * self._decay + num_accepted_tokens
            s[1] = s[1] * self._decay + num_draft_tokens
            acceptance_rate.labels(gamma=g, source=src).set(s[0] / s[1])
        drafting = gamma > 0 and source == "draft"
        prev = self._last_drafting
        if prev is not None and prev != drafting:
            switches_total.labels(direction="on" if drafting else "off").inc()
        self._last_drafting = drafting

    def observe_suffix(self, lookups: int, hits: int, cache_bytes: int | None, cached_requests: int | None) -> None:
        """One step's suffix-tree figures (``WorkerStepStats``): lookups of a suffix step, the
        cache's size when the worker measured it (None: not this step)."""
        if hits:
            suffix_lookups_total.labels(result="hit").inc(hits)
        if lookups > hits:
            suffix_lookups_total.labels(result="miss").inc(lookups - hits)
        if cache_bytes is not None:
            suffix_cache_bytes.set(cache_bytes)
        if cached_requests is not None:
            suffix_cached_requests.set(cached_requests)

    def observe_planner_counts(self, stats: PlannerStats) -> None:
        """The policy's cumulative counters (``PlannerStats``: priors dropped and rescaled, TTFT
        deferrals); a count below the last one seen is a new policy (a runtime config rebuilds it),
        counted from 0."""
        counts = (stats.priors_dropped, stats.prior_rescales, stats.ttft_deferrals)
        children = (planner_prior_conflicts_total.labels(action="dropped"),
                    planner_prior_conflicts_total.labels(action="rescaled"), planner_ttft_deferrals_total)
        for child, now, last in zip(children, counts, self._counts, strict=True):
            if now != last:
                child.inc(now - last if now > last else now)
        self._counts = counts

    def observe_switch_cost(self, seconds: float) -> None:
        switch_cost_seconds.observe(seconds)

    def set_planner_snapshot(self, snapshot: Any) -> None:
        """Accepts the policy's ``snapshot()``: a mapping ``{(bucket_lo, gamma[, source]): (mean_loss_s,
        count)}``, an iterable of ``(bucket_lo, gamma, mean_loss_s, count[, source])`` tuples or of
        objects/dicts with ``bucket_lo, gamma, mean_loss_s, count`` (and ``source``), or a
        ``PlannerPriors``-like object with ``entries``. The source defaults to the draft model's."""
        for b, g, loss, count, src in _iter_snapshot(snapshot):
            if loss is not None:
                planner_loss_seconds.labels(bucket=str(b), gamma=str(g), source=src).set(loss)
            planner_count.labels(bucket=str(b), gamma=str(g), source=src).set(count)
        if hasattr(snapshot, "draft_prefill_s_per_token"):  # a PlannerPriors; None (unknown) exports 0
            planner_draft_prefill_prompt_seconds.set(snapshot.draft_prefill_s_per_token or 0.0)

    def set_acceptance_gate(self, closed: bool) -> None:
        planner_acceptance_gate_closed.set(1 if closed else 0)

    def set_draft_prefill(self, seconds_per_token: float) -> None:
        planner_draft_prefill_seconds.set(seconds_per_token)

    # -- runtime config ------------------------------------------------------------------------------
    def config_applied(self, cfg: Any) -> None:
        import time

        config_reloads_total.inc()
        config_last_reload_timestamp_seconds.set(time.time())
        tpot = cfg.tpot_target_s()
        slo_tpot_target_seconds.set(tpot or 0.0)
        ttft = cfg.slo.ttft_p95_ms / 1000.0 if cfg.slo is not None and cfg.slo.ttft_p95_ms else 0.0
        slo_ttft_target_seconds.set(ttft)

    def config_reload_failed(self) -> None:
        config_reload_failures_total.inc()

    # -- draft memory --------------------------------------------------------------------------------
    def draft_state_changed(self, old: str | None, new: str) -> None:
        if new not in DRAFT_STATES:
            raise ValueError(f"draft state: {new!r} is not one of {DRAFT_STATES}")
        draft_state.set(DRAFT_STATES.index(new))
        for s in DRAFT_STATES:
            draft_state_info.labels(state=s).set(1 if s == new else 0)
        if old is None:
            # Every legal edge exists at 0 from the start, so rate() reads 0, not "no data".
            from nightjar_worker.memory.offload_state import ALLOWED_TRANSITIONS

            for src, dsts in ALLOWED_TRANSITIONS.items():
                for dst in dsts:
                    draft_transitions_total.labels(**{"from": src.label, "to": dst.label})
            for tr in RETURN_TRIGGERS:
                draft_returns_total.labels(tr)
        elif old != new:
            draft_transitions_total.labels(**{"from": old, "to": new}).inc()

    def observe_offload(self, seconds: float) -> None:
        draft_offload_seconds.observe(seconds)

    def observe_reload(self, seconds: float | None, ok: bool = True) -> None:
        if ok and seconds is not None:
            draft_reload_seconds.observe(seconds)
        if not ok:
            draft_reload_failures_total.inc()

    def observe_return(self, trigger: str) -> None:
        draft_returns_total.labels(trigger).inc()

    def observe_reload_cancel(self) -> None:
        draft_reload_cancels_total.inc()

    def set_offload_enabled(self, enabled: bool, reason: str) -> None:
        offload_enabled.clear()  # one series: the current reason
        offload_enabled.labels(reason).set(1 if enabled else 0)

    def set_kv_blocks(self, total: int, extra: int = 0) -> None:
        kv_blocks_total.set(total)
        kv_blocks_extra.set(extra)

    def set_kv_released_bytes(self, n: int) -> None:
        kv_released_bytes.set(n)


def _iter_snapshot(snapshot: Any) -> Iterable[tuple[int, int, float | None, float, str]]:
    if snapshot is None:
        return
    if hasattr(snapshot, "entries"):
        snapshot = snapshot.entries
    if isinstance(snapshot, Mapping):
        for key, v in snapshot.items():
            b, g, src = key[0], key[1], (key[2] if len(key) > 2 else "draft")
            if isinstance(v, Mapping):
                yield b, g, v.get("mean_loss_s"), v.get("count", 0.0), src
            else:
                loss, count = v
                yield b, g, loss, count, src
        return
    for e in snapshot:
        if isinstance(e, tuple):
            yield e[0], e[1], e[2], e[3], (e[4] if len(e) > 4 else "draft")
        elif isinstance(e, Mapping):
            yield e["bucket_lo"], e["gamma"], e.get("mean_loss_s"), e.get("count", 0.0), e.get("source", "draft")
        else:
            yield (e.bucket_lo, e.gamma, getattr(e, "mean_loss_s", None), getattr(e, "count", 0.0),
                   getattr(e, "source", "draft"))


_worker_metrics: WorkerMetrics | None = None


def worker_metrics() -> WorkerMetrics:
    """The process-wide recorder (one per process: EngineCore and API server each get theirs)."""
    global _worker_metrics
    if _worker_metrics is None:
        _worker_metrics = WorkerMetrics()
    return _worker_metrics
