"""Generate the Grafana dashboard JSON in charts/nightjar/dashboards/ (one file per dashboard).

Usage: python scripts/prometheus/dashboard.py [--check]
  --check: exit 1 if the checked-in JSON differs from what this script generates.

Queries use vLLM 0.32's metric names (vllm/v1/metrics/loggers.py), the worker's ``nightjar_*`` names
(worker/nightjar_worker/metrics.py), the operator's ``nightjar_operator_*`` names
(operator/nightjar_operator/metrics.py) and the recording rules in charts/nightjar/rules/. Grafana
variables: $datasource, $namespace, $deployment, plus Grafana's $__rate_interval.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "charts" / "nightjar" / "dashboards"

S = 'namespace=~"$namespace", nightjar_deployment=~"$deployment"'  # worker series selector
OP = 'namespace=~"$namespace", name=~"$deployment"'  # operator per-deployment series
RI = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "format": fmt}
    if instant:
        t["instant"] = True
        t["range"] = False
    return t


class Layout:
    """Places panels on Grafana's 24-column grid, row by row."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.h = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {"type": "row", "title": title, "id": self._id(), "collapsed": False, "panels": [],
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}}
        )
        self.y += 1

    def add(self, panel: dict[str, Any], w: int = 8, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        panel.setdefault("datasource", DS)
        self.panels.append(panel)
        self.x += w
        self.h = max(self.h, h)

    def _newline(self) -> None:
        self.y += self.h
        self.x, self.h = 0, 0

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i


def timeseries(title: str, desc: str, targets: list[dict[str, Any]], unit: str = "short", stack: bool = False,
               overrides: list[dict[str, Any]] | None = None, min0: bool = True) -> dict[str, Any]:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if not stack else 60, "showPoints": "never",
                   "stacking": {"mode": "normal" if stack else "none", "group": "A"}},
    }
    if min0:
        defaults["min"] = 0
    return {
        "type": "timeseries", "title": title, "description": desc, "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def target_line(name_regex: str) -> dict[str, Any]:
    """Override drawing the SLO target series as a dashed red line."""
    return {
        "matcher": {"id": "byRegexp", "options": name_regex},
        "properties": [
            {"id": "color", "value": {"fixedColor": "red", "mode": "fixed"}},
            {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }


def stat(title: str, desc: str, targets: list[dict[str, Any]], unit: str = "short", thresholds: list[dict[str, Any]] | None = None,
         decimals: int | None = None) -> dict[str, Any]:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat", "title": title, "description": desc, "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "area", "textMode": "value_and_name"},
    }


def table(title: str, desc: str, expr: str, unit: str = "short", hide: list[str] | None = None) -> dict[str, Any]:
    excl = {k: True for k in ["Time", "__name__", *(hide or [])]}
    return {
        "type": "table", "title": title, "description": desc,
        "targets": [target(expr, ref="A", instant=True, fmt="table")],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "transformations": [{"id": "organize", "options": {"excludeByName": excl}}],
        "options": {"showHeader": True, "sortBy": [{"displayName": "bucket", "desc": False}]},
    }


def q(quantile: str, metric: str, by: str = "nightjar_deployment") -> str:
    return f"histogram_quantile({quantile}, sum by ({by}, le) (rate({metric}_bucket{{{S}}}[{RI}])))"


def overview() -> dict[str, Any]:
    L = Layout()

    # ---- SLO ------------------------------------------------------------------------------------
    L.row("SLO: latency against the target")
    L.add(timeseries(
        "TTFT p50 / p95 / p99 vs target",
        "Time to first token over 5-minute windows (recording rules nightjar:ttft_seconds:*), against the "
        "TTFT p95 target the worker reports from spec.slo (dashed).",
        [target(f"nightjar:ttft_seconds:p50_5m{{{S}}}", "{{nightjar_deployment}} p50"),
         target(f"nightjar:ttft_seconds:p95_5m{{{S}}}", "{{nightjar_deployment}} p95"),
         target(f"nightjar:ttft_seconds:p99_5m{{{S}}}", "{{nightjar_deployment}} p99"),
         target(f"nightjar:slo_ttft_target_seconds{{{S}}}", "{{nightjar_deployment}} target")],
        unit="s", overrides=[target_line(".*target$")]), w=9)
    L.add(timeseries(
        "TPOT p50 / p95 / p99 vs target",
        "Time per output token of finished requests (vLLM request_time_per_output_token) over 5-minute "
        "windows, against the TPOT p95 target (dashed). The planner trades speculation for this target.",
        [target(f"nightjar:tpot_seconds:p50_5m{{{S}}}", "{{nightjar_deployment}} p50"),
         target(f"nightjar:tpot_seconds:p95_5m{{{S}}}", "{{nightjar_deployment}} p95"),
         target(f"nightjar:tpot_seconds:p99_5m{{{S}}}", "{{nightjar_deployment}} p99"),
         target(f"nightjar:slo_tpot_target_seconds{{{S}}}", "{{nightjar_deployment}} target")],
        unit="s", overrides=[target_line(".*target$")]), w=9)
    L.add(stat(
        "SLO attainment (1h)",
        "Share of the last hour's 5-minute windows whose p95 met the target, per objective "
        "(nightjar:slo_attainment:1h). Red below 99%.",
        [target(f"nightjar:slo_attainment:1h{{{S}}}", "{{nightjar_deployment}} {{objective}}")],
        unit="percentunit", decimals=2,
        thresholds=[{"color": "red", "value": None}, {"color": "orange", "value": 0.95}, {"color": "green", "value": 0.99}]),
        w=6)
    L.add(timeseries(
        "SLO met per window",
        "1 when the 5-minute p95 met the target, 0 when not (absent without traffic).",
        [target(f"nightjar:slo_ok:5m{{{S}}}", "{{nightjar_deployment}} {{objective}}")], unit="bool"), w=12)
    L.add(timeseries(
        "Error-budget burn rate (1h)",
        "Share of bad windows over the last hour divided by the 1% budget: 1 spends the budget exactly "
        "in the SLO period; the fast-burn alert fires above 14.4.",
        [target(f"nightjar:slo_error_ratio:1h{{{S}}} / 0.01", "{{nightjar_deployment}} {{objective}}")], unit="short"),
        w=12)

    # ---- Throughput -----------------------------------------------------------------------------
    L.row("Throughput")
    L.add(timeseries(
        "Output tokens / s",
        "Generated tokens per second (vllm:generation_tokens_total), per deployment and in total.",
        [target(f"sum by (nightjar_deployment) (rate(vllm:generation_tokens_total{{{S}}}[{RI}]))", "{{nightjar_deployment}}"),
         target(f"sum(rate(vllm:generation_tokens_total{{{S}}}[{RI}]))", "total")], unit="short"))
    L.add(timeseries(
        "Requests / s by finish reason",
        "Finished requests per second (vllm:request_success_total) by finished_reason (stop, length, abort).",
        [target(f"sum by (nightjar_deployment, finished_reason) (rate(vllm:request_success_total{{{S}}}[{RI}]))",
                "{{nightjar_deployment}} {{finished_reason}}")], unit="reqps", stack=True))
    L.add(timeseries(
        "End-to-end latency p50 / p95",
        "Request latency from arrival to the last token (vllm:e2e_request_latency_seconds).",
        [target(q("0.50", "vllm:e2e_request_latency_seconds"), "{{nightjar_deployment}} p50"),
         target(q("0.95", "vllm:e2e_request_latency_seconds"), "{{nightjar_deployment}} p95")], unit="s"))

    # ---- Planner ---------------------------------------------------------------------------------
    L.row("Planner: gamma (speculation length)")
    L.add(timeseries(
        "Gamma over time",
        "Gamma of each worker's latest step (nightjar_gamma_current) and the mean gamma per step over the "
        "interval (nightjar_gamma_chosen). Falls towards 0 as the batch grows.",
        [target(f"max by (nightjar_deployment, pod, instance) (nightjar_gamma_current{{{S}}})", "{{instance}} current"),
         target(f"sum by (nightjar_deployment) (rate(nightjar_gamma_chosen_sum{{{S}}}[{RI}])) / "
                f"sum by (nightjar_deployment) (rate(nightjar_gamma_chosen_count{{{S}}}[{RI}]))", "{{nightjar_deployment}} mean")],
        unit="short"))
    L.add(timeseries(
        "Steps / s per arm",
        "Decoding steps per second by chosen gamma and source of drafts (nightjar_steps_total: draft model, "
        "n-gram prompt lookup or suffix trees), stacked: the arm mix.",
        [target(f"sum by (gamma, source) (rate(nightjar_steps_total{{{S}}}[{RI}]))", "{{source}} gamma={{gamma}}")],
        unit="short", stack=True))
    L.add(timeseries(
        "Batch size p50 / p95",
        "Requests in the decoding batch per step (nightjar_batch_size): the planner's context.",
        [target(q("0.50", "nightjar_batch_size"), "{{nightjar_deployment}} p50"),
         target(q("0.95", "nightjar_batch_size"), "{{nightjar_deployment}} p95")], unit="short"))
    L.add(table(
        "Preferred gamma per batch bucket",
        "For each batch-size bucket (lower edge), the arm (source, gamma) with the lowest estimated loss "
        "(nightjar_planner_loss_seconds: seconds per generated token, switching cost included).",
        f"bottomk by (nightjar_deployment, instance, bucket) (1, nightjar_planner_loss_seconds{{{S}}})", unit="s",
        hide=["namespace", "job", "pod", "container", "endpoint", "service"]), w=8, h=10)
    L.add(table(
        "Planner loss estimate per (bucket, source, gamma)",
        "Mean loss the planner estimates for each (batch bucket, source, gamma), averaged over workers (gamma 2 "
        "of the draft model and of prompt lookup are two arms, kept apart): decode cost per "
        "generated token with prefill taken out (gamma > 0 also pays the draft prefill charge, panel below).",
        f"avg by (bucket, source, gamma) (nightjar_planner_loss_seconds{{{S}}})", unit="s"), w=8, h=10)
    L.add(table(
        "Planner observations per (bucket, source, gamma)",
        "Discounted observation counts behind the estimates (nightjar_planner_count), summed over workers: "
        "where the planner has explored.",
        f"sum by (bucket, source, gamma) (nightjar_planner_count{{{S}}})", unit="short"), w=8, h=10)
    L.add(timeseries(
        "Planner decision time p99",
        "Wall time of one decide() call (nightjar_planner_decision_seconds).",
        [target(q("0.99", "nightjar_planner_decision_seconds"), "{{nightjar_deployment}} p99")], unit="s"), w=12, h=6)
    L.add(timeseries(
        "Acceptance gate (no gamma > 0 exploration)",
        "1 while a worker's pooled draft acceptance is too low for any gamma > 0 to pay, so its planner stops "
        "exploring speculation (nightjar_planner_acceptance_gate_closed); it re-opens now and then to re-probe.",
        [target(f"max by (nightjar_deployment, instance) (nightjar_planner_acceptance_gate_closed{{{S}}})",
                "{{instance}}")], unit="short"), w=12, h=6)
    L.add(timeseries(
        "Planner priors contradicted / s",
        "Priors (a profiled pair's, or the fleet's) that a worker's own steps contradict "
        "(nightjar_planner_prior_conflicts_total): dropped, one arm whose prior is wrong for this worker; "
        "rescaled, a bucket whose arms are all off the same way (another machine, longer prompts, a batch "
        "capped by memory), whose priors keep their shape at the worker's level. A steady rate says the "
        "fleet's priors do not fit this worker.",
        [target(f"sum by (action) (rate(nightjar_planner_prior_conflicts_total{{{S}}}[{RI}]))", "{{action}}")],
        unit="short"), w=12, h=6)
    L.add(timeseries(
        "Draft prefill charged per generated token",
        "What each worker's planner charges gamma > 0 per generated token for the running draft's prefill of "
        "the workload's prompts: learnt draft seconds per prompt token x prompt tokens per generated token "
        "(nightjar_planner_draft_prefill_seconds). Long prompts and short replies raise it; above the "
        "per-token gain of speculating, the planner keeps gamma at 0.",
        [target(f"max by (nightjar_deployment, instance) (nightjar_planner_draft_prefill_seconds{{{S}}})",
                "{{instance}}")], unit="s"), w=12, h=6)
    L.add(timeseries(
        "Draft prefill per prompt token",
        "The running draft's extra seconds per prompt token prefilled, as each worker's planner prices it: its "
        "own estimate (draft-on minus draft-off prefill slope), else its priors' (a profiled pair, or the fleet's "
        "median, which the operator hands new workers); 0 while unknown "
        "(nightjar_planner_draft_prefill_per_prompt_token_seconds). A property of the pair and device: workers "
        "of one deployment should agree.",
        [target(f"max by (nightjar_deployment, instance) "
                f"(nightjar_planner_draft_prefill_per_prompt_token_seconds{{{S}}})", "{{instance}}")],
        unit="s"), w=12, h=6)
    L.add(timeseries(
        "Prompt steps with the draft off for the TTFT target / s",
        "With a TTFT target (spec.slo.ttftP95Ms) the planner plays a step that admits prompts, or one that would "
        "resume the draft (its catch-up delays every waiting prompt), at gamma 0 when that lets a waiting "
        "prompt's first token meet the target; the running arm resumes at the next step "
        "(nightjar_planner_ttft_deferrals_total). 0 without a TTFT target, and under overload, where every "
        "waiting prompt has already missed it.",
        [target(f"sum by (nightjar_deployment) (rate(nightjar_planner_ttft_deferrals_total{{{S}}}[$__rate_interval]))",
                "{{nightjar_deployment}}")]), w=12, h=6)

    # ---- Acceptance -----------------------------------------------------------------------------
    L.row("Draft acceptance per arm")
    L.add(timeseries(
        "Acceptance rate per arm (interval)",
        "Accepted / verified draft tokens per gamma and source (nightjar_accepted_tokens_total / "
        "nightjar_draft_tokens_total).",
        [target(f"sum by (gamma, source) (rate(nightjar_accepted_tokens_total{{{S}}}[{RI}])) / "
                f"(sum by (gamma, source) (rate(nightjar_draft_tokens_total{{{S}}}[{RI}])) > 0)",
                "{{source}} gamma={{gamma}}")],
        unit="percentunit"), w=12)
    L.add(timeseries(
        "Acceptance rate per arm (worker estimate)",
        "The worker's decayed recent acceptance per gamma and source (nightjar_acceptance_rate), averaged over workers.",
        [target(f"avg by (gamma, source) (nightjar_acceptance_rate{{{S}}})", "{{source}} gamma={{gamma}}")],
        unit="percentunit"), w=12)

    L.add(timeseries(
        "Suffix trees: lookup hit rate",
        "Share of suffix-step lookups (one per request and step) that found at least one draft token in the "
        "request's own tree or the cross-request tree of cached outputs (nightjar_suffix_lookups_total, "
        "result=hit over all). Low: the workload does not repeat itself; the suffix arms' acceptance is "
        "in the panels above.",
        [target(f"sum by (nightjar_deployment) (rate(nightjar_suffix_lookups_total{{{S}, result=\"hit\"}}[{RI}])) / "
                f"(sum by (nightjar_deployment) (rate(nightjar_suffix_lookups_total{{{S}}}[{RI}])) > 0)",
                "{{nightjar_deployment}}")],
        unit="percentunit"), w=12)
    L.add(timeseries(
        "Suffix trees: memory and cached outputs",
        "Memory of each worker's suffix trees (nightjar_suffix_cache_bytes: the cross-request tree and the "
        "running requests' trees, measured every few seconds) and the finished outputs the cross-request "
        "tree holds (nightjar_suffix_cached_requests, bounded by the runtime config's suffix.cache_requests, "
        "evicted oldest first; right axis).",
        [target(f"max by (nightjar_deployment, instance) (nightjar_suffix_cache_bytes{{{S}}})", "{{instance}} bytes"),
         target(f"max by (nightjar_deployment, instance) (nightjar_suffix_cached_requests{{{S}}})",
                "{{instance}} cached outputs")],
        unit="bytes", overrides=[{"matcher": {"id": "byRegexp", "options": ".* cached outputs"},
                                  "properties": [{"id": "unit", "value": "short"},
                                                 {"id": "custom.axisPlacement", "value": "right"}]}]), w=12)

    # ---- Switching --------------------------------------------------------------------------------
    L.row("Switching (speculation on/off) and C_switch")
    L.add(timeseries(
        "Switches / s",
        "Speculation switched on (0 -> k) and off (k -> 0) per second (nightjar_switches_total).",
        [target(f"sum by (direction) (rate(nightjar_switches_total{{{S}}}[{RI}]))", "{{direction}}")], unit="short"), w=12)
    L.add(timeseries(
        "Switching cost C_switch",
        "Measured draft KV catch-up time on resume (nightjar_switch_cost_seconds): p50, p95 and mean.",
        [target(q("0.50", "nightjar_switch_cost_seconds"), "{{nightjar_deployment}} p50"),
         target(q("0.95", "nightjar_switch_cost_seconds"), "{{nightjar_deployment}} p95"),
         target(f"sum by (nightjar_deployment) (rate(nightjar_switch_cost_seconds_sum{{{S}}}[{RI}])) / "
                f"sum by (nightjar_deployment) (rate(nightjar_switch_cost_seconds_count{{{S}}}[{RI}]))", "{{nightjar_deployment}} mean")],
        unit="s"), w=12)

    # ---- Draft memory & KV ----------------------------------------------------------------------------
    L.row("Draft memory and KV cache")
    state = timeseries(
        "Draft state",
        "Draft weights per worker (nightjar_draft_state): resident, offloading, offloaded (its bytes lent "
        "to the KV cache), reloading, draining (waiting for in-flight drafts before offloading).",
        [target(f"max by (instance) (nightjar_draft_state{{{S}}})", "{{instance}}")], unit="short")
    state["type"] = "state-timeline"
    state["fieldConfig"]["defaults"]["mappings"] = [{"type": "value", "options": {
        "0": {"text": "resident", "color": "green", "index": 0},
        "1": {"text": "offloading", "color": "yellow", "index": 1},
        "2": {"text": "offloaded", "color": "blue", "index": 2},
        "3": {"text": "reloading", "color": "orange", "index": 3},
        "4": {"text": "draining", "color": "purple", "index": 4}}}]
    state["fieldConfig"]["defaults"].pop("custom")
    state["options"] = {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9,
                        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
    L.add(state)
    L.add(timeseries(
        "Draft transitions / s",
        "Draft state transitions (nightjar_draft_transitions_total) by from -> to; the returns started by "
        "trigger (nightjar_draft_returns_total: the planner's demand, a recheck of a draft offloaded with "
        "the KV cache calm, or pinned resident); of the reloads that "
        "went back to offloaded, those that failed (nightjar_draft_reload_failures_total, retried after a "
        "back-off) and those cancelled because KV pressure returned (nightjar_draft_reload_cancels_total).",
        [target(f"sum by (from, to) (rate(nightjar_draft_transitions_total{{{S}}}[{RI}]))", "{{from}} -> {{to}}"),
         target(f"sum(rate(nightjar_draft_reload_failures_total{{{S}}}[{RI}]))", "reload failed", ref="B"),
         target(f"sum(rate(nightjar_draft_reload_cancels_total{{{S}}}[{RI}]))", "reload cancelled", ref="C"),
         target(f"sum by (trigger) (rate(nightjar_draft_returns_total{{{S}}}[{RI}]))", "return ({{trigger}})",
                ref="D")],
        unit="short"))
    L.add(timeseries(
        "Offload / reload time p95",
        "Time to move the draft's weights out (nightjar_draft_offload_seconds) and back (nightjar_draft_reload_seconds).",
        [target(q("0.95", "nightjar_draft_offload_seconds"), "{{nightjar_deployment}} offload p95"),
         target(q("0.95", "nightjar_draft_reload_seconds"), "{{nightjar_deployment}} reload p95")], unit="s"))
    L.add(timeseries(
        "Elastic memory: pods by state",
        "Workers by nightjar_memory_offload_enabled's reason: enabled (they offload and reload the draft), "
        "disabled (offload policy Never), or why the device cannot (cuda_kv_release_unverified: a CUDA "
        "worker of this build keeps the draft resident; vllm_memory_pool: vLLM's sleep mode owns the KV "
        "pool; see docs/memory.md).",
        [target(f"count by (reason) (nightjar_memory_offload_enabled{{{S}}})", "{{reason}}")], unit="short"), w=24)
    L.add(timeseries(
        "KV blocks: total and gained from the draft",
        "KV cache blocks available to the target (nightjar_kv_blocks_total) and the part gained from the "
        "offloaded draft's bytes (nightjar_kv_blocks_extra), summed over workers.",
        [target(f"sum by (nightjar_deployment) (nightjar_kv_blocks_total{{{S}}})", "{{nightjar_deployment}} total"),
         target(f"sum by (nightjar_deployment) (nightjar_kv_blocks_extra{{{S}}})", "{{nightjar_deployment}} extra")],
        unit="short"), w=12)
    L.add(timeseries(
        "KV cache usage",
        "Share of KV cache blocks in use (vllm:kv_cache_usage_perc), per worker.",
        [target(f"max by (instance) (vllm:kv_cache_usage_perc{{{S}}})", "{{instance}}")], unit="percentunit"), w=12)
    L.add(timeseries(
        "KV memory given back",
        "Bytes of the KV pool returned (CPU: madvise; CUDA: unmapped) while their blocks are held out: the "
        "draft's share while it is resident and headroom it does not pay for (nightjar_kv_released_bytes), "
        "per worker. It falls when the offloaded draft's blocks are mapped for the scheduler.",
        [target(f"max by (instance) (nightjar_kv_released_bytes{{{S}}})", "{{instance}}")], unit="bytes"), w=24)

    # ---- Queue -----------------------------------------------------------------------------------
    L.row("Queue")
    L.add(timeseries(
        "Requests waiting / running",
        "Queue depth (vllm:num_requests_waiting) and requests in the running batch (vllm:num_requests_running).",
        [target(f"sum by (nightjar_deployment) (vllm:num_requests_waiting{{{S}}})", "{{nightjar_deployment}} waiting"),
         target(f"sum by (nightjar_deployment) (vllm:num_requests_running{{{S}}})", "{{nightjar_deployment}} running")],
        unit="short"), w=12)
    L.add(timeseries(
        "Preemptions / s",
        "Requests preempted for lack of KV cache (vllm:num_preemptions_total).",
        [target(f"sum by (nightjar_deployment) (rate(vllm:num_preemptions_total{{{S}}}[{RI}]))", "{{nightjar_deployment}}")],
        unit="short"), w=12)

    # ---- Operator --------------------------------------------------------------------------------
    L.row("Operator")
    L.add(timeseries(
        "Reconciles / s by result",
        "Reconciles of NightjarDeployments by result: ok, invalid, conflict, error (nightjar_operator_reconciles_total).",
        [target(f"sum by (result) (rate(nightjar_operator_reconciles_total[{RI}]))", "{{result}}")], unit="short", stack=True), w=6)
    L.add(timeseries(
        "Reconcile errors / s by reason",
        "Failed reconciles by reason (nightjar_operator_reconcile_errors_total); empty while there are none.",
        [target(f"sum by (reason) (rate(nightjar_operator_reconcile_errors_total[{RI}]))", "{{reason}}")], unit="short"), w=6)
    L.add(timeseries(
        "Reconcile duration p95",
        "Wall time of one reconcile (nightjar_operator_reconcile_duration_seconds).",
        [target(f"histogram_quantile(0.95, sum by (le) (rate(nightjar_operator_reconcile_duration_seconds_bucket[{RI}])))", "p95")],
        unit="s"), w=6)
    L.add(timeseries(
        "Workers desired / ready",
        "Replicas per NightjarDeployment (nightjar_operator_deployment_replicas) and its Ready condition.",
        [target(f"sum by (name, kind) (nightjar_operator_deployment_replicas{{{OP}}})", "{{name}} {{kind}}"),
         target(f"max by (name) (nightjar_operator_deployment_ready{{{OP}}})", "{{name}} ready")], unit="short"), w=6)
    L.add(timeseries(
        "Fleet loop round",
        "Wall time of the fleet loop's last round over every NightjarDeployment (nightjar_operator_fleet_round_seconds); "
        "above the interval (NIGHTJAR_FLEET_INTERVAL_S) the loop is behind.",
        [target("max(nightjar_operator_fleet_round_seconds)", "round")], unit="s"), w=12)
    L.add(timeseries(
        "Fleet loop objects",
        "NightjarDeployments the fleet loop ticks each round (nightjar_operator_fleet_objects). Ticks that raise "
        "are counted in nightjar_operator_fleet_tick_failures_total and logged.",
        [target("max(nightjar_operator_fleet_objects)", "objects")], unit="short"), w=12)

    variables = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {},
         "hide": 0, "refresh": 1, "regex": "", "options": []},
        {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DS,
         "query": {"query": "label_values(vllm:num_requests_running, namespace)", "refId": "ns"},
         "definition": "label_values(vllm:num_requests_running, namespace)",
         "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "refresh": 2, "sort": 1, "hide": 0,
         "regex": "", "options": []},
        {"name": "deployment", "label": "NightjarDeployment", "type": "query", "datasource": DS,
         "query": {"query": 'label_values(vllm:num_requests_running{namespace=~"$namespace"}, nightjar_deployment)', "refId": "dep"},
         "definition": 'label_values(vllm:num_requests_running{namespace=~"$namespace"}, nightjar_deployment)',
         "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "refresh": 2, "sort": 1, "hide": 0,
         "regex": "", "options": []},
    ]
    return {
        "uid": "nightjar-overview",
        "title": "Nightjar: SLO, speculation and memory",
        "description": "Load-adaptive speculative decoding: SLO attainment, throughput, the planner's gamma, "
        "acceptance, switching cost, elastic draft memory, queue and operator health.",
        "tags": ["nightjar", "vllm", "llm-serving"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables},
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [],
        "panels": L.panels,
    }


DASHBOARDS = {"nightjar-overview.json": overview}


def render() -> dict[str, str]:
    return {name: json.dumps(fn(), indent=2, sort_keys=False) + "\n" for name, fn in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the checked-in JSON is out of date")
    args = ap.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python scripts/prometheus/dashboard.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
