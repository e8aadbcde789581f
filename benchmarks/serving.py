"""Helpers shared by the benchmarks that drive the real worker (bench-serve, bench-dynamic, soak):
CPU engine environment, model pairs, switching the planner policy of a running server through the
admin endpoint, and samplers for ``/metrics`` and worker RSS. Imports no vLLM."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from nightjar_worker import loadgen
from nightjar_worker.models import PAIRS, pair_args, pair_dirs, pair_dtype  # noqa: F401 - re-exported

ADMIN_TOKEN = "bench-serve"
def lossless_verdict(detail: dict[str, str]) -> bool:
    """bench-serve's lossless verdict from its per-policy "identical/total" counts (none: false)."""
    return bool(detail) and all(v.split("/")[0] == v.split("/")[1] for v in detail.values())


def set_cpu_env() -> None:
    """vLLM's CPU backend pins every engine to the same core ("auto" binding): on a small shared machine
    the benchmarks let the OS place the (single-threaded) engine instead, unless the caller chose."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def switch_body(name: str, table: list[list[int]] | None = None, priors: dict | None = None) -> dict:
    """Runtime-config body selecting the planner policy that reproduces baseline ``name`` (with
    ``priors``, a ``PlannerPriors`` dump, the rebuilt policy starts from them)."""
    body = _policy_body(name, table)
    return {**body, "priors": priors} if priors is not None else body


def _policy_body(name: str, table: list[list[int]] | None) -> dict:
    if name.startswith("static-"):
        return {"planner": {"policy": "static", "static_gamma": int(name.split("-")[1])}}
    if name == "vllm-table":
        assert table is not None
        return {"planner": {"policy": "table", "gamma_table": {str(a): k for a, _, k in table}}}
    if name in ("nosd", "nightjar", "ucb", "dsd", "oracle"):
        # nosd: gamma 0 every step (the runner skips the draft entirely); dsd/oracle need the server's
        # CostProfile (NIGHTJAR_PROFILE at start-up)
        return {"planner": {"policy": name}}
    raise ValueError(f"policy: {name!r} cannot be switched at run time")


def warm_priors(profile_path: str | os.PathLike[str]) -> dict:
    """Nightjar's warm start as a ``PlannerPriors`` dump: the priors derived from a CostProfile (what a
    fleet's priors or a profiled pair give a worker in production; docs/planner.md)."""
    from nightjar_worker.planner import PlannerConfig
    from nightjar_worker.planner.profile_priors import priors_from_profile
    from nightjar_worker.sim.profile import CostProfile

    return priors_from_profile(CostProfile.load(profile_path), PlannerConfig()).model_dump()


def switch_policy(url: str, name: str, table: list[list[int]] | None = None, priors: dict | None = None) -> None:
    """POST the policy to the admin endpoint; returns once the engine reports it applied."""
    import httpx

    r = httpx.post(url + "/nightjar/v1/config", json=switch_body(name, table, priors),
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    if r.status_code != 200 or r.json().get("status") != "applied":
        raise RuntimeError(f"switching to {name} failed: {r.status_code} {r.text}")


# --- /metrics sampling -----------------------------------------------------------------------------


@dataclass
class MetricTick:
    t: float  # seconds since the sampler's t0 (perf_counter based)
    unix: float
    gamma_now: float | None
    draft_state: float | None  # nightjar_draft_state: 0 resident .. 4 draining (None: not exported)
    running: float
    gen_tokens: float  # vllm:generation_tokens_total (cumulative)


async def sample_metrics(url: str, t0: float, stop: asyncio.Event, out: list[MetricTick], period_s: float = 1.0) -> None:
    """Append a MetricTick every ``period_s`` until ``stop`` is set (scrape errors skip a tick)."""
    import httpx

    async with httpx.AsyncClient(timeout=10) as http:
        while not stop.is_set():
            try:
                m = await loadgen.scrape(http, url)
                out.append(MetricTick(
                    t=time.perf_counter() - t0,
                    unix=time.time(),
                    gamma_now=loadgen.metric_or_none(m, "nightjar_gamma_current"),
                    draft_state=loadgen.metric_or_none(m, "nightjar_draft_state"),
                    running=loadgen.metric_sum(m, "vllm:num_requests_running"),
                    gen_tokens=loadgen.metric_sum(m, "vllm:generation_tokens_total"),
                ))
            except Exception:  # noqa: BLE001 - a missed scrape is a gap in the timeline, not a failure
                pass
            try:
                await asyncio.wait_for(stop.wait(), timeout=period_s)
            except TimeoutError:
                pass


# --- worker RSS -------------------------------------------------------------------------------------


_RSS_KINDS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}


def group_rss(pgid: int) -> dict[str, dict[str, int]]:
    """Per process of group ``pgid`` (API server, EngineCore, model-runner worker), keyed ``"<name> <pid>"``:
    VmRSS and its parts in bytes. Anonymous memory is what a leak grows; file-backed pages (mapped
    weights, libraries) are reclaimable cache."""
    out: dict[str, dict[str, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
            if int(tail.split()[2]) != pgid:  # field 5 of stat: pgrp
                continue
            kinds: dict[str, int] = {}
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    key = _RSS_KINDS.get(line.partition(":")[0])
                    if key:
                        kinds[key] = int(line.split()[1]) * 1024
            if kinds.get("rss"):
                out[f"{head.split('(', 1)[1]} {d}"] = kinds
        except (OSError, IndexError, ValueError):
            continue
    return out


class GroupRssSampler(threading.Thread):
    """Samples ``group_rss`` every ``period_s`` into ``by_process`` as (monotonic s, ``group_rss``
    result); ``stop`` returns the group's summed VmRSS per sample."""

    def __init__(self, pgid: int, period_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.pgid, self.period_s = pgid, period_s
        self.by_process: list[tuple[float, dict[str, dict[str, int]]]] = []
        self._stop_ev = threading.Event()

    def run(self) -> None:
        while not self._stop_ev.is_set():
            per = group_rss(self.pgid)
            if per:
                self.by_process.append((time.monotonic(), per))
            self._stop_ev.wait(self.period_s)

    def stop(self) -> list[tuple[float, int]]:
        self._stop_ev.set()
        self.join(timeout=5)
        return [(t, sum(k["rss"] for k in per.values())) for t, per in self.by_process]


def openai_client(url: str) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=url + "/v1", api_key="x", timeout=600, max_retries=0)
