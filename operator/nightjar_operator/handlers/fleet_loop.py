"""One asyncio task drives the fleet tick (``handlers.fleet_tick.tick``) of every NightjarDeployment.

A kopf daemon per object held a thread for the object's whole life, so the thread pool, not the
cluster, bounded the fleet: about 60 objects exhausted 64 threads and starved the reconcile. Here one
task runs a round every ``NIGHTJAR_FLEET_INTERVAL_S`` over kopf's index of the watched objects (so
the operator's namespace scope applies), and the ticks, which block on the Kubernetes client and on
HTTP scrapes, run on a pool of ``NIGHTJAR_FLEET_TICK_WORKERS`` threads whatever the number of
objects. A round longer than the interval delays the next one (nothing queues up); the round's wall
time is the metric ``nightjar_operator_fleet_round_seconds``.

Per-object state (scrape history, rollout baselines) lives in a dict keyed by the object's uid and
is dropped when the object leaves the index, so a re-created object starts clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nightjar_operator import constants as c
from nightjar_operator.handlers import fleet_tick as fleet
from nightjar_operator.handlers.k8s import Api
from nightjar_operator.metrics import metrics

log = logging.getLogger("nightjar.operator.fleet")


def index_entry(namespace: str, name: str, uid: str) -> dict[tuple[str, str], str]:
    """What the kopf index holds per object: (namespace, name) -> uid."""
    return {(namespace, name): uid}


class FleetLoop:
    """The fleet's one loop. ``objects`` is kopf's index: (namespace, name) -> store of uids."""

    def __init__(self, api: Api, objects: Mapping[tuple[str, str], Iterable[str]]) -> None:
        self.api = api
        self.objects = objects
        self.memos: dict[str, fleet.FleetMemo] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._behind = False
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    # ----------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="nightjar-fleet")

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------------------------- loop

    async def run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                settings = fleet.FleetSettings.from_env()
            except ValueError as e:
                log.warning("fleet: %s; using the defaults", e)
                settings = fleet.FleetSettings()
            try:
                await self.round(settings)
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one round
                log.warning("fleet: round failed: %s: %s", type(e).__name__, e)
            elapsed = time.monotonic() - started
            metrics().fleet_round_seconds.set(elapsed)
            if (elapsed > settings.interval_s) != self._behind:  # log the change, not every round
                self._behind = elapsed > settings.interval_s
                level = logging.WARNING if self._behind else logging.INFO
                log.log(level, "fleet: a round over %d objects took %.1f s (interval %.1f s, %d tick workers)",
                        len(self.memos), elapsed, settings.interval_s, settings.tick_workers)  # fmt: skip
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, settings.interval_s - elapsed))

    def snapshot(self) -> dict[tuple[str, str], str]:
        """(namespace, name) -> uid of the objects in the index now (the newest uid of a name)."""
        out: dict[tuple[str, str], str] = {}
        for key in list(self.objects):
            uids = list(self.objects.get(key) or ())
            if uids:
                out[key] = uids[-1]
        return out

    async def round(self, settings: fleet.FleetSettings) -> None:
        objects = self.snapshot()
        live = set(objects.values())
        for uid in [u for u in self.memos if u not in live]:
            del self.memos[uid]
        metrics().fleet_objects.set(len(objects))
        if not objects:
            return
        pool = self._executor(settings.tick_workers)
        loop = asyncio.get_running_loop()
        # Each tick runs in a copy of this task's context vars, as asyncio.to_thread would run it.
        ticks = [
            loop.run_in_executor(pool, contextvars.copy_context().run, self.tick_one, ns, name, uid, settings)
            for (ns, name), uid in sorted(objects.items())
        ]
        await asyncio.gather(*ticks)

    def _executor(self, size: int) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_size != size:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="fleet-tick")
            self._pool_size = size
        return self._pool

    def tick_one(self, namespace: str, name: str, uid: str, settings: fleet.FleetSettings) -> None:
        """One object's tick on a pool thread; its failure is logged and the round goes on."""
        if self._stop.is_set():
            return
        try:
            body = self.api.get(c.KIND, namespace, name)
            if body is None or body["metadata"].get("uid") != uid or body["metadata"].get("deletionTimestamp"):
                return
            fm = self.memos.setdefault(uid, fleet.FleetMemo())
            fleet.tick(self.api, body, fm, settings=settings)
        except Exception as e:  # noqa: BLE001 - one object's failure must not stop the others
            metrics().fleet_tick_failures.labels(namespace, name).inc()
            log.warning("fleet %s/%s: tick failed: %s: %s", namespace, name, type(e).__name__, e)


def memo_loop(memo: Any) -> FleetLoop | None:
    return getattr(memo, "fleet_loop", None)


async def start(memo: Any, objects: Mapping[tuple[str, str], Iterable[str]]) -> None:
    loop = FleetLoop(memo.api, objects)
    memo.fleet_loop = loop
    loop.start()


async def stop(memo: Any) -> None:
    loop = memo_loop(memo)
    if loop is not None:
        await loop.stop()
