"""The worker's run-time configuration file: model, validation, watcher, and how it reaches the policy.

The file (YAML or JSON; path in env ``NIGHTJAR_CONFIG``, default ``/etc/nightjar/nightjar.yaml``, where
the operator mounts ConfigMap key ``nightjar.yaml``) holds a ``WorkerRuntimeConfig``. It is watched
*in the EngineCore process* (where the scheduler and its gamma policy live): a valid update is
applied to the live policy (priors, SLO, exploration knobs); a malformed one is rejected with a
logged error naming the field, ``nightjar_config_reload_failures_total`` is incremented and the old
config stays in force. The admin endpoint (``nightjar_worker.admin``) validates a body with the same
model and atomically rewrites the file, so both paths go through one watcher.

Pure logic (parse, validate, diff, apply) is separated from I/O (``RuntimeConfigWatcher``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from nightjar_contract.runtime import (
    REBUILD_FIELDS,
    RESTART_FIELDS,
    RuntimeConfigError,
    WorkerRuntimeConfig,
    parse_runtime_config_text,
)

log = logging.getLogger("nightjar.runtime_config")

DEFAULT_CONFIG_PATH = "/etc/nightjar/nightjar.yaml"
ENV_CONFIG = "NIGHTJAR_CONFIG"
ENV_STATE_DIR = "NIGHTJAR_STATE_DIR"  # where the engine reports what it applied (read by GET)
STATUS_FILE = "config-status.json"


def load_runtime_config(path: str | os.PathLike[str]) -> WorkerRuntimeConfig:
    """Read and validate the file; a missing file means the defaults."""
    p = Path(path)
    if not p.exists():
        return WorkerRuntimeConfig()
    return parse_runtime_config_text(p.read_text())


def check_live_update(old: WorkerRuntimeConfig, new: WorkerRuntimeConfig) -> None:
    """Refuse changes a running engine cannot take (see ``RESTART_FIELDS``)."""
    changed = [f for f in RESTART_FIELDS if getattr(old.planner, f) != getattr(new.planner, f)]
    if changed:
        raise RuntimeConfigError(
            "; ".join(
                f"planner.{f}: cannot change on a running worker ({getattr(old.planner, f)!r} -> "
                f"{getattr(new.planner, f)!r}); restart the worker"
                for f in changed
            )
        )


def apply_to_policy(policy: Any, old: WorkerRuntimeConfig | None, new: WorkerRuntimeConfig) -> list[str]:
    """Push what changed into the live policy; returns what was applied (for the log).

    Duck-typed on the policy's run-time hooks: ``apply_config(PlannerConfig)`` (exploration knobs,
    switch cost; same arms/buckets), ``set_slo(tpot_s, ttft_s, attainment)`` and ``set_priors(PlannerPriors)``.
    Baselines without these hooks ignore the corresponding part (a static policy learns nothing).
    Order matters: ``apply_config`` resets the SLO to ``planner.slo_tpot_s``, so the effective SLO
    (``slo.tpot_p95_ms`` wins) is set after it.
    """
    applied: list[str] = []
    knobs_changed = old is None or old.planner != new.planner
    if knobs_changed:
        hook = getattr(policy, "apply_config", None) or getattr(policy, "update_knobs", None)
        if hook is not None:
            hook(new.planner)
            applied.append("planner knobs")
    tpot, ttft = new.tpot_target_s(), new.ttft_target_s()
    if knobs_changed or old is None or old.slo != new.slo:
        if hasattr(policy, "set_slo"):
            att = new.slo.attainment if new.slo is not None and new.slo.attainment else None
            policy.set_slo(tpot, ttft_s=ttft, attainment=att)  # a TTFT target: goodput is the objective
            applied.append(f"slo tpot={tpot} ttft={ttft}")
    if new.priors is not None and (old is None or old.priors != new.priors):
        if hasattr(policy, "set_priors"):
            policy.set_priors(new.priors)
            applied.append(f"priors ({len(new.priors.entries)} entries)")
    return applied


class PolicyHolder:
    """Owns the live gamma policy and applies runtime configs to it (the watcher's ``on_update``).

    A change of ``policy``/``static_gamma``/``gamma_table``/``seed`` rebuilds the policy with
    ``build_policy`` (same arms, so the engine is unaffected); any other change is pushed into the
    existing policy with ``apply_to_policy`` (its learned state is kept). The scheduler reads
    ``holder.policy`` on every step, under the watcher's lock.
    """

    def __init__(self, config: WorkerRuntimeConfig | None = None, profile: Any = None) -> None:
        from nightjar_worker.planner import build_policy

        self._build = build_policy
        self.profile = profile
        self.config = config or WorkerRuntimeConfig()
        self.policy = build_policy(self.config.planner, profile)
        apply_to_policy(self.policy, None, self.config)

    def __call__(self, new: WorkerRuntimeConfig, old: WorkerRuntimeConfig | None) -> None:
        self.update(new)

    def update(self, new: WorkerRuntimeConfig) -> list[str]:
        old = self.config
        if any(getattr(old.planner, f) != getattr(new.planner, f) for f in REBUILD_FIELDS):
            policy = self._build(new.planner, self.profile)  # raises on a bad combination: old kept
            apply_to_policy(policy, None, new)
            self.policy, self.config = policy, new
            applied = [f"policy rebuilt: {getattr(policy, 'name', new.planner.policy)}"]
        else:
            applied = apply_to_policy(self.policy, old, new)
            self.config = new
        self.export_snapshot()
        return applied

    def export_snapshot(self) -> None:
        """Publish the planner's estimates now (new priors show on /metrics without waiting for steps)."""
        snap = getattr(self.policy, "snapshot", None)
        if snap is None:
            return
        from nightjar_worker.metrics import worker_metrics

        worker_metrics().set_planner_snapshot(snap())


def write_config_atomically(path: str | os.PathLike[str], cfg: WorkerRuntimeConfig) -> None:
    """Write ``cfg`` as YAML via rename, so a watcher never reads a half-written file."""
    write_text_atomically(path, yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True), sort_keys=False))


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".nightjar-", suffix=".yaml", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def config_path_from_env() -> str:
    return os.environ.get(ENV_CONFIG, DEFAULT_CONFIG_PATH)


def read_status(state_dir: str | None = None) -> dict[str, Any] | None:
    """What the engine last reported (applied digest, time, last error), or None."""
    d = state_dir or os.environ.get(ENV_STATE_DIR)
    if not d:
        return None
    try:
        return json.loads((Path(d) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


class RuntimeConfigWatcher:
    """Polls the config file and hands each *valid, changed* config to ``on_update(new, old)``.

    Call ``load_initial()`` once at start (raises on a malformed file: a worker must not start on a
    broken config), then ``start()`` for a daemon polling thread, or call ``check()`` yourself.
    ``on_update`` runs under ``self.lock``: the scheduler holds the same lock around
    ``decide``/``observe`` so a policy is never updated mid-decision. If ``on_update`` raises, the
    update counts as failed and the previous config stays current.

    Change detection uses the content hash (mtime alone misses Kubernetes' ConfigMap symlink swaps
    on coarse-mtime filesystems), checked every ``interval_s``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_update: Callable[[WorkerRuntimeConfig, WorkerRuntimeConfig | None], None],
        *,
        interval_s: float = 1.0,
        state_dir: str | None = None,
        metrics: Any = None,
    ) -> None:
        self.path = Path(path)
        self.on_update = on_update
        self.interval_s = interval_s
        self.state_dir = state_dir if state_dir is not None else os.environ.get(ENV_STATE_DIR)
        self.lock = threading.RLock()
        self.current: WorkerRuntimeConfig | None = None
        self.last_error: str | None = None
        self._last_hash: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if metrics is None:
            from nightjar_worker import metrics as metrics_mod

            metrics = metrics_mod.worker_metrics()
        self._metrics = metrics

    # -- I/O helpers -------------------------------------------------------------------------------
    def _read(self) -> tuple[str, str] | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        return text, hashlib.sha256(text.encode()).hexdigest()

    def _write_status(self) -> None:
        if not self.state_dir:
            return
        status = {
            "path": str(self.path),
            "applied": self.current.model_dump(mode="json", exclude_none=True) if self.current else None,
            "applied_digest": self.current.digest() if self.current else None,
            "applied_at": time.time(),
            "last_error": self.last_error,
            "pid": os.getpid(),
        }
        try:
            d = Path(self.state_dir)
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{STATUS_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps(status))
            os.replace(tmp, d / STATUS_FILE)
        except OSError as e:  # status is informational; never break the engine for it
            log.warning("nightjar: cannot write config status to %s: %s", self.state_dir, e)

    # -- lifecycle -----------------------------------------------------------------------------------
    def load_initial(self) -> WorkerRuntimeConfig:
        """Load and apply the file as it is now. Raises ``RuntimeConfigError`` if malformed."""
        read = self._read()
        cfg = WorkerRuntimeConfig() if read is None else parse_runtime_config_text(read[0])
        with self.lock:
            self.on_update(cfg, None)
            self.current = cfg
            self._last_hash = read[1] if read else None
        self._metrics.config_applied(cfg)
        self._write_status()
        log.info("nightjar: runtime config loaded from %s (digest %s)", self.path, cfg.digest())
        return cfg

    def check(self) -> bool:
        """Apply the file if it changed. Returns True if a new config was applied."""
        read = self._read()
        if read is None:
            return False  # a deleted file keeps the current config (ConfigMap swaps briefly unlink)
        text, h = read
        if h == self._last_hash:
            return False
        self._last_hash = h  # a bad file is reported once, not on every poll
        try:
            new = parse_runtime_config_text(text)
            if self.current is not None:
                check_live_update(self.current, new)
            with self.lock:
                self.on_update(new, self.current)
                self.current = new
        except Exception as e:  # noqa: BLE001 - any failure keeps the old config
            self.last_error = f"{self.path}: {e}"
            log.error("nightjar: rejected runtime config update, keeping the previous one: %s", self.last_error)
            self._metrics.config_reload_failed()
            self._write_status()
            return False
        self.last_error = None
        self._metrics.config_applied(new)
        self._write_status()
        log.info("nightjar: runtime config applied from %s (digest %s)", self.path, new.digest())
        return True

    def start(self) -> RuntimeConfigWatcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="nightjar-config-watcher", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watcher must survive anything
                log.exception("nightjar: config watcher error")
