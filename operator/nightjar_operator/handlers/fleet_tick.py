"""The fleet loop's I/O: scrape worker ``/metrics``, push priors, measure the SLO, drive the rollout.

The operator's one fleet loop (``handlers.fleet_loop``) calls ``tick`` for every NightjarDeployment
once per interval. Each tick:

1. finds the worker pods (label selector of the owner, stable and candidate tracks) and their pod
   IPs, and scrapes ``http://<podIP>:<port>/metrics`` concurrently with a short timeout (or, with
   ``NIGHTJAR_FLEET_PROMETHEUS_URL``, reads the same series from Prometheus' ``/federate``). A pod that
   fails is reported (SLOMet message, ``status.fleet.scrapeErrors``,
   ``nightjar_operator_scrape_failures_total``) and skipped; it never stalls the others;
2. aggregates (``fleet.aggregate``): counters and histograms over a sliding window
   (``NIGHTJAR_FLEET_SLO_WINDOW_S``) from per-pod scrape history kept in the loop's per-object memo;
3. merges the planner estimates of each track (and the median of its workers' draft prefill
   price) into ``PlannerPriors`` and writes them into that
   track's ConfigMap key ``nightjar.yaml`` (the worker watches it; new pods mount it and start warm),
   only when they changed materially;
4. evaluates the SLO and writes the ``SLOMet`` condition and ``status.fleet``;
5. hands the per-track analysis-window stats to ``handlers.rollout_io``.

Everything persistent lives in the object's status; the loop's per-object ``FleetMemo`` only holds
scrape history, so an operator restart (or a new leader) loses nothing but the current window's
baselines.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nightjar_operator import constants as c
from nightjar_operator.crd.models import NightjarDeploymentSpec
from nightjar_operator.fleet.aggregate import FleetStats, PodMetrics, aggregate, extract, window
from nightjar_operator.fleet.memory import evaluate_memory
from nightjar_operator.fleet.priors import PriorsConfig, merge_priors, priors_equal
from nightjar_operator.fleet.promtext import PromParseError, Scrape, parse
from nightjar_operator.fleet.slo import evaluate_slo
from nightjar_operator.handlers.k8s import Api
from nightjar_operator.metrics import op_metrics
from nightjar_operator.reconcile.status import get_condition, now_iso, set_condition

log = logging.getLogger("nightjar.operator.fleet")
# One INFO line per scrape per pod is noise at a 15 s interval times N pods.
logging.getLogger("httpx").setLevel(logging.WARNING)


# --------------------------------------------------------------------------------------- settings


class FleetSettings(BaseModel):
    """Operator-wide knobs of the fleet loop, read from ``NIGHTJAR_FLEET_*`` environment variables."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(15.0, gt=0, description="seconds between ticks per NightjarDeployment")
    scrape_timeout_s: float = Field(2.0, gt=0, description="per-pod HTTP timeout")
    scrape_port: int | None = Field(None, ge=1, le=65535, description="override the pods' metrics port")
    scrape_path: str = "/metrics"
    prometheus_url: str | None = Field(None, description="read the series from Prometheus /federate instead")
    prometheus_pod_label: str = Field("pod", description="label carrying the pod name in Prometheus")
    slo_window_s: float = Field(300.0, gt=0, description="sliding window of the SLO evaluation")
    priors_weight: float = Field(0.25, ge=0)
    priors_max_count: float = Field(64.0, ge=0)
    priors_floor_count: float = Field(64.0, ge=0)
    priors_min_count: float = Field(0.0, ge=0)
    max_workers: int = Field(16, ge=1, description="concurrent scrapes within one tick")
    tick_workers: int = Field(8, ge=1, description="ticks run at once (threads), whatever the number of objects")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> FleetSettings:
        env = dict(os.environ if env is None else env)
        data: dict[str, Any] = {}
        for name in cls.model_fields:
            key = f"NIGHTJAR_FLEET_{name.upper()}"
            if env.get(key) not in (None, ""):
                data[name] = env[key]
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            loc = ", ".join(f"NIGHTJAR_FLEET_{str(x['loc'][0]).upper()}: {x['msg']}" for x in e.errors())
            raise ValueError(f"fleet settings: {loc}") from None

    def priors_config(self) -> PriorsConfig:
        return PriorsConfig(weight=self.priors_weight, max_pseudo_count=self.priors_max_count,
                            min_pseudo_count=self.priors_floor_count, min_fleet_count=self.priors_min_count)


# ---------------------------------------------------------------------------------------- metrics

# ---------------------------------------------------------------------------------------- scraping


@dataclass(frozen=True)
class PodTarget:
    name: str
    uid: str
    ip: str
    port: int
    track: str


def discover(api: Api, namespace: str, name: str, settings: FleetSettings) -> list[PodTarget]:
    """Running worker pods of ``name`` with a pod IP (both tracks)."""
    pods = api.worker_pods(namespace, name)
    out: list[PodTarget] = []
    for p in pods:
        meta, st = p.get("metadata") or {}, p.get("status") or {}
        if meta.get("deletionTimestamp") or st.get("phase") != "Running" or not st.get("podIP"):
            continue
        ann = meta.get("annotations") or {}
        port = settings.scrape_port or int(ann.get("prometheus.io/port") or c.HTTP_PORT)
        track = (meta.get("labels") or {}).get(c.LABEL_TRACK, c.TRACK_STABLE)
        out.append(PodTarget(meta["name"], meta["uid"], st["podIP"], port, track))
    return sorted(out, key=lambda t: t.name)


def _scrape_one(client: httpx.Client, t: PodTarget, path: str) -> Scrape:
    host = f"[{t.ip}]" if ":" in t.ip else t.ip
    r = client.get(f"http://{host}:{t.port}{path}")
    r.raise_for_status()
    return parse(r.text)


def _short(e: Exception) -> str:
    if isinstance(e, httpx.HTTPStatusError):
        return f"HTTP {e.response.status_code}"
    if isinstance(e, httpx.TimeoutException):
        return "timeout"
    if isinstance(e, httpx.ConnectError):
        return "connection refused" if "refused" in str(e).lower() else f"connect error: {e}"
    if isinstance(e, PromParseError):
        return f"bad exposition: {e}"
    return f"{type(e).__name__}: {e}"


def scrape_direct(targets: list[PodTarget], settings: FleetSettings) -> dict[str, Scrape | str]:
    """pod uid -> Scrape or an error string. Concurrent; each pod bounded by the timeout."""
    if not targets:
        return {}
    out: dict[str, Scrape | str] = {}
    with httpx.Client(timeout=settings.scrape_timeout_s, trust_env=False) as client:

        def one(t: PodTarget) -> tuple[str, Scrape | str]:
            try:
                return t.uid, _scrape_one(client, t, settings.scrape_path)
            except Exception as e:  # noqa: BLE001 - one pod's failure is data, not a crash
                return t.uid, _short(e)

        with ThreadPoolExecutor(max_workers=min(settings.max_workers, len(targets))) as ex:
            for uid, res in ex.map(one, targets):
                out[uid] = res
    return out


def scrape_prometheus(targets: list[PodTarget], namespace: str, settings: FleetSettings) -> dict[str, Scrape | str]:
    """The same series from Prometheus' federation endpoint, split per pod by ``prometheus_pod_label``."""
    assert settings.prometheus_url
    if not targets:
        return {}
    pods = "|".join(t.name for t in targets)
    lbl = settings.prometheus_pod_label
    match = f'{{__name__=~"nightjar_.*|vllm[:_].*",namespace="{namespace}",{lbl}=~"{pods}"}}'
    try:
        with httpx.Client(timeout=max(5.0, settings.scrape_timeout_s), trust_env=False) as client:
            r = client.get(settings.prometheus_url.rstrip("/") + "/federate", params={"match[]": match})
            r.raise_for_status()
            whole = parse(r.text)
    except Exception as e:  # noqa: BLE001
        err = f"prometheus: {_short(e)}"
        return {t.uid: err for t in targets}
    by_pod: dict[str, list] = {}
    for s in whole.samples:
        pod = s.label(lbl)
        if pod:
            by_pod.setdefault(pod, []).append(s)
    return {
        t.uid: Scrape(by_pod[t.name], whole.types) if t.name in by_pod else "no series in Prometheus"
        for t in targets
    }


# ------------------------------------------------------------------------------------------ memo


@dataclass
class FleetMemo:
    """Per-object in-memory state of the fleet loop: scrape history for windowed deltas."""

    last_tick: float = 0.0
    last_failures: set[str] = field(default_factory=set)
    history: dict[str, deque[PodMetrics]] = field(default_factory=dict)  # pod uid -> cumulative scrapes
    rollout_key: tuple | None = None  # (candidate revision, step, windowStartedAt) of the baselines below
    rollout_baselines: dict[str, PodMetrics] = field(default_factory=dict)


def _window_baseline(hist: deque[PodMetrics], now: float, window_s: float) -> PodMetrics | None:
    """The newest scrape at least ``window_s`` old, else the oldest one (a younger window)."""
    base = None
    for pm in hist:
        if pm.ts <= now - window_s:
            base = pm
        else:
            break
    if base is None and len(hist) > 1:
        base = hist[0]
    return base


# ----------------------------------------------------------------------------------------- priors


def planner_edges_and_arms(spec: NightjarDeploymentSpec) -> tuple[list[int], list[int], dict[str, tuple[int, ...]]]:
    """The planner's bucket edges, draft gammas and host sources' gammas for ``spec``."""
    from nightjar_contract.planner import PlannerConfig

    from nightjar_operator.reconcile.config import planner_dict

    cfg = PlannerConfig.model_validate(planner_dict(spec))
    return list(cfg.edges()), list(cfg.resolved_arms()), cfg.host_arms()


def push_priors(api: Api, namespace: str, cm_name: str, stats: FleetStats, spec: NightjarDeploymentSpec,
                settings: FleetSettings) -> tuple[bool, int]:
    """Write merged priors into ConfigMap ``cm_name`` key ``nightjar.yaml`` if they changed materially.
    Returns (written, number of entries). Optimistic concurrency: a 409 waits for the next tick."""
    from kubernetes.client.exceptions import ApiException
    from nightjar_contract.planner import PlannerPriors

    from nightjar_operator.reconcile.config import render_runtime_config

    if not stats.planner:
        return False, 0
    edges, arms, host = planner_edges_and_arms(spec)
    new = merge_priors(stats.planner, edges, arms, settings.priors_config(), stats.draft_prefill_s, host)
    if not new.entries:
        return False, 0
    cm = api.get("ConfigMap", namespace, cm_name)
    if cm is None:
        return False, len(new.entries)  # the reconcile (or rollout) creates it; next tick
    text = (cm.get("data") or {}).get(c.CONFIG_KEY) or ""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    old = None
    if doc.get("priors"):
        try:
            old = PlannerPriors.model_validate(doc["priors"])
        except ValidationError:
            old = None
    if priors_equal(old, new):
        return False, len(new.entries)
    # Same rendering as the reconcile's (which carries live priors over), so neither rewrites the other.
    text_new = render_runtime_config(spec, new.model_dump(mode="json"))
    body = {"metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]}, "data": {c.CONFIG_KEY: text_new}}
    try:
        api.request("PATCH", api.path("ConfigMap", namespace, cm_name), body, content_type="application/merge-patch+json")
    except ApiException as e:
        if e.status == 409:
            return False, len(new.entries)
        raise
    return True, len(new.entries)


# ------------------------------------------------------------------------------------------- tick


def _fmt_s(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 2)


def tick(api: Api, body: dict[str, Any], fm: FleetMemo, now: float | None = None,
         settings: FleetSettings | None = None) -> None:
    """One round of the fleet loop for one NightjarDeployment (see the module docstring). ``body``
    must be fresh (the rollout state in its status is read from it)."""
    from nightjar_operator.handlers import rollout_io as rollout_handler
    from nightjar_operator.handlers.settings import pod_policy
    from nightjar_operator.reconcile.validate import validate

    settings = settings or FleetSettings.from_env()
    now = time.time() if now is None else now
    fm.last_tick = now
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return
    name, namespace = meta["name"], meta["namespace"]
    # The reconcile's checks, all of them: a spec it reports InvalidSpec never starts a canary.
    spec, errors = validate(body.get("spec"), name, pod_policy())
    if spec is None or errors:
        return  # the reconcile reports InvalidSpec; nothing to measure against
    m = op_metrics()
    lbl = (namespace, name)

    # 1. scrape
    targets = discover(api, namespace, name, settings)
    results = scrape_prometheus(targets, namespace, settings) if settings.prometheus_url else scrape_direct(targets, settings)
    failures: dict[str, str] = {}
    current: dict[str, PodMetrics] = {}
    by_uid = {t.uid: t for t in targets}
    for uid, res in results.items():
        m["scrapes"].labels(*lbl).inc()
        if isinstance(res, str):
            failures[by_uid[uid].name] = res
            m["scrape_failures"].labels(*lbl).inc()
        else:
            current[uid] = extract(res, now)
    m["pods_scraped"].labels(*lbl).set(len(current))
    if set(failures) != fm.last_failures:  # log changes only (the condition message has the rest)
        if failures:
            log.warning("fleet %s/%s: scrape failed for %s", namespace, name,
                        ", ".join(f"{k} ({v})" for k, v in sorted(failures.items())))  # fmt: skip
        fm.last_failures = set(failures)

    # 2. sliding-window aggregation
    for uid in list(fm.history):
        if uid not in by_uid:
            del fm.history[uid]  # pod gone
    windowed: dict[str, PodMetrics] = {}
    for uid, pm in current.items():
        hist = fm.history.setdefault(uid, deque())
        hist.append(pm)
        while len(hist) > 2 and hist[1].ts <= now - settings.slo_window_s:
            hist.popleft()
        windowed[uid] = window(_window_baseline(hist, now, settings.slo_window_s), pm)
    fleet_all = aggregate(windowed)

    # 3. priors per track (planner estimates are gauges: current values, not windowed)
    pushed: dict[str, int] = {}
    for track, cm_name in ((c.TRACK_STABLE, c.config_map_name(name)), (c.TRACK_CANDIDATE, c.candidate_config_name(name))):
        pods = {u: pm for u, pm in current.items() if by_uid[u].track == track}
        if not pods:
            continue
        try:
            written, n = push_priors(api, namespace, cm_name, aggregate(pods), spec, settings)
        except Exception as e:  # noqa: BLE001 - priors are best effort; the SLO and rollout go on
            log.warning("fleet %s/%s: priors for %s not written: %s", namespace, name, cm_name, e)
            continue
        pushed[track] = n
        if written:
            m["priors_pushes"].labels(namespace, name, track).inc()

    # 4. SLO
    ev = evaluate_slo(fleet_all, spec.slo.ttft_p95_ms, spec.slo.tpot_p95_ms, objective=spec.slo.attainment)
    msg = ev.message
    if failures:
        msg += f"; scrape failed for {len(failures)}/{len(targets)} pods: " + ", ".join(
            f"{k} ({v})" for k, v in sorted(failures.items())
        )
    if not targets:
        msg += "; no running worker pods"
    m["attainment"].labels(*lbl).set(ev.attainment if ev.attainment is not None else float("nan"))
    m["slo_met"].labels(*lbl).set({"True": 1, "False": 0}.get(ev.status, -1))
    m["attainment_target"].labels(*lbl).set(spec.slo.attainment)  # the alerts' objective (rules/)
    m["ttft_p95"].labels(*lbl).set(ev.ttft_p95_s if ev.ttft_p95_s is not None else float("nan"))
    m["tpot_p95"].labels(*lbl).set(ev.tpot_p95_s if ev.tpot_p95_s is not None else float("nan"))
    if fleet_all.throughput_tok_s is not None:
        m["throughput"].labels(*lbl).set(fleet_all.throughput_tok_s)
    fleet_status = {
        "pods": len(targets),
        "podsScraped": len(current),
        "scrapeErrors": [f"{k}: {v}" for k, v in sorted(failures.items())],
        "windowSeconds": settings.slo_window_s,
        "requests": int(fleet_all.requests),
        "ttftP95Ms": _fmt_s(ev.ttft_p95_s),
        "tpotP95Ms": _fmt_s(ev.tpot_p95_s),
        "attainment": None if ev.attainment is None else round(ev.attainment, 4),
        "throughputTokensPerSecond": None if fleet_all.throughput_tok_s is None else round(fleet_all.throughput_tok_s, 2),
        "acceptance": {str(g): round(a, 4) for g, a in fleet_all.acceptance.items()},
        "switchCostMs": _fmt_s(fleet_all.switch_cost_mean_s),
        "running": fleet_all.running,
        "waiting": fleet_all.waiting,
        "draftStates": fleet_all.draft_states,
        "offload": fleet_all.offload,
        "priorsEntries": pushed.get(c.TRACK_STABLE, 0),
    }
    mem = evaluate_memory(spec.speculation.offload.policy, fleet_all.offload)
    gen = meta.get("generation")

    def fields(old: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        conds = [dict(x) for x in old.get("conditions") or []]
        new_conds = set_condition(conds, c.COND_SLO_MET, ev.status, ev.reason, msg[:4000], gen, now_iso())
        new_conds = set_condition(new_conds, c.COND_ELASTIC_MEMORY, mem.status, mem.reason, mem.message, gen, now_iso())
        if any(get_condition(conds, t) != get_condition(new_conds, t) for t in (c.COND_SLO_MET, c.COND_ELASTIC_MEMORY)):
            out["conditions"] = new_conds
        old_fleet = {k: v for k, v in (old.get("fleet") or {}).items() if k != "lastScrapeTime"}
        if old_fleet != fleet_status:
            out["fleet"] = {**fleet_status, "lastScrapeTime": now_iso()}
        return out

    rollout_handler.patch_status(api, namespace, name, meta["uid"], fields)

    # 5. rollout
    rollout_handler.tick(api, body, spec, current, by_uid, fm, now)
