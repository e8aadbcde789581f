"""kopf entry module: decorators only; each delegates to ``nightjar_operator.handlers``.

Run with ``nightjar-operator run`` (or ``kopf run -m nightjar_operator.main -A --standalone``).
"""

from __future__ import annotations

import os
from typing import Any

import kopf

from nightjar_operator import constants as c
from nightjar_operator.handlers import fleet_loop
from nightjar_operator.handlers import settings as cfg
from nightjar_operator.handlers import sync as rec
from nightjar_operator.metrics import metrics

# Level-based resync: repairs drift even if every event was missed.
RESYNC_SECONDS = float(os.environ.get("NIGHTJAR_OPERATOR_RESYNC_SECONDS", "60"))
CHILD_LABELS = {c.LABEL_MANAGED_BY: c.OPERATOR_NAME, c.LABEL_COMPONENT: "worker"}


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, fleet_objects: kopf.Index,
                  **_: Any) -> None:
    cfg.configure(settings, memo, logger)
    # One task ticks every object's fleet loop (scrape, priors, SLO, rollout): handlers/fleet_loop.py.
    await fleet_loop.start(memo, fleet_objects)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await fleet_loop.stop(memo)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo:
    return cfg.login(**kwargs)


@kopf.on.resume(c.GROUP, c.VERSION, c.PLURAL, backoff=2)
@kopf.on.create(c.GROUP, c.VERSION, c.PLURAL, backoff=2)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, backoff=2)
def reconcile(body: kopf.Body, memo: kopf.Memo, reason: Any, **_: Any) -> None:
    rec.reconcile(memo.api, dict(body), trigger=getattr(reason, "value", str(reason)))


@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rec.reconcile(memo.api, dict(body), trigger="resync")


@kopf.index(c.GROUP, c.VERSION, c.PLURAL)
def fleet_objects(namespace: str, name: str, uid: str, **_: Any) -> dict[tuple[str, str], str]:
    # The fleet loop's list of objects, kept by kopf within the operator's namespace scope.
    return fleet_loop.index_entry(namespace, name, uid)


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
def child_deployment(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    # Also on DELETED: a child removed by hand is recreated (unless its owner is going away).
    rec.on_child_event(memo.api, dict(body))


@kopf.on.delete(c.GROUP, c.VERSION, c.PLURAL, optional=True)
def deleted(name: str, namespace: str, **_: Any) -> None:
    metrics().forget(namespace, name)
