"""The worker-process half of elastic memory, driven by ``collective_rpc`` from the scheduler.

Every ``rpc_*`` function is module level (vLLM pickles it by reference) and takes the worker
(vLLM's ``WorkerWrapperBase``) first. They return plain dicts and never raise into the worker's
RPC loop for expected failures: a failed move is reported in ``rpc_poll``.

KV restore off the engine step: the scheduler tells ``rpc_release_from`` which blocks it will want back
(``restore_stop``). Once the draft has left the device (an offload done, a reload failed or cancelled),
``poll`` maps them on a background thread and reports the move done only when they are mapped; the
scheduler's ``rpc_restore`` then finds them mapped (or maps what is left, the fallback) before it hands
them out. On CUDA each mapping is driver calls (``cuda_vmm``): off the step, they cost no step time.

Safety net: while the draft is not resident the runner's ``_input_fits_in_drafter`` answers False,
so even a scheduler bug asking for drafts cannot run a draft whose parameters are empty; vLLM then
emits no drafts for that step (plain autoregressive decoding).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from . import kv_pool
from .fault import FaultInjector
from .kv_elastic import KVPageReleaser
from .weight_mover import DraftWeightMover

log = logging.getLogger("nightjar.memory")

ATTR = "_nightjar_memory_agent"


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class WorkerMemoryAgent:
    def __init__(self, worker: Any, host_store: str = "auto", offload_dir: str | None = None,
                 release_pages: bool = True) -> None:
        runner = worker.model_runner
        drafter = getattr(runner, "drafter", None)
        draft = getattr(drafter, "model", None)
        if draft is None:
            raise RuntimeError(
                "elastic memory: the engine has no draft model (speculative_config method 'draft_model' is required)"
            )
        self.runner = runner
        self.device = runner.device
        self.mover = DraftWeightMover(
            draft, self.device, shared_with=runner.model, host_store=host_store, offload_dir=offload_dir,
            faults=FaultInjector.from_env(),
        )
        kv = list(runner.kv_caches)
        self.num_blocks = int(kv[0].shape[0])
        uniq = {t.data_ptr(): t for t in kv}.values()
        self.block_bytes = int(sum(t[0].numel() * t.element_size() for t in uniq))
        self.releaser = None
        if release_pages:
            arena = getattr(runner, kv_pool.ARENA_ATTR, None)
            if arena is None:
                raise RuntimeError(
                    "elastic memory: vLLM's KV pool was not allocated in a Nightjar arena, so its pages cannot "
                    "be released (the nightjar vLLM plugin must load in the worker process before the KV cache "
                    "is allocated: is nightjar-worker installed in this environment?)"
                )
            self.releaser = KVPageReleaser(arena, kv)
        self.restore_range: tuple[int, int] | None = None  # blocks the scheduler will want back
        self._restorer: threading.Thread | None = None
        self._restored = 0  # bytes the background restore mapped, not yet reported by rpc_restore
        self._restore_error: str | None = None
        self._install_guard()

    def _install_guard(self) -> None:
        runner, mover = self.runner, self.mover
        orig = runner._input_fits_in_drafter

        def fits(*args: Any, **kwargs: Any) -> bool:
            return mover.usable and orig(*args, **kwargs)

        runner._input_fits_in_drafter = fits

    def info(self) -> dict[str, Any]:
        return {
            "draft_bytes": self.mover.param_bytes,
            "draft_params": len(self.mover.params),
            "shared_params": list(self.mover.shared_names),
            "block_bytes": self.block_bytes,
            "num_blocks": self.num_blocks,
            "device": str(self.device),
            "rss_bytes": _rss_bytes(),
            "pid": os.getpid(),
        }

    def poll(self) -> dict[str, Any]:
        t = self.mover.task
        out: dict[str, Any] = {"resident": self.mover.resident, "rss_bytes": _rss_bytes()}
        if t is not None:
            restoring = t.done and self._restore_in_background()
            out.update(kind=t.kind, done=t.done and not restoring, error=t.error, duration_s=t.duration_s,
                       bytes=t.bytes_moved, busy_s=t.busy_s, slices=t.slices, cancelled=t.cancelled,
                       restoring=restoring, restore_error=self._restore_error)
        return out

    # -- KV restore on a background thread ---------------------------------------------------------------
    def _restore_in_background(self) -> bool:
        """With the draft off the device, map the blocks the scheduler will want back on a thread;
        True while that runs."""
        th = self._restorer
        if th is not None:
            if th.is_alive():
                return True
            self._restorer = None
            return False
        rng, rel = self.restore_range, self.releaser
        if rel is None or rng is None or self.mover.resident:
            return False
        if all(rel.arena.is_mapped(s, e) for s, e in rel.ranges(*rng)):
            return False
        if rel.arena.map_is_bookkeeping:  # CPU: no work to move off the step
            self._restored += rel.restore(*rng)
            return False

        def run() -> None:
            try:
                self._restored += rel.restore(*rng)
                self._restore_error = None
            except Exception as e:  # noqa: BLE001 - rpc_restore maps what is left, or reports it
                self._restore_error = f"{type(e).__name__}: {e}"
                log.warning("nightjar memory: mapping the extra KV blocks in the background failed (%s)",
                            self._restore_error)

        self._restorer = th = threading.Thread(target=run, name="nightjar-kv-restore", daemon=True)
        th.start()
        return True

    def join_restore(self, timeout_s: float | None = None) -> None:
        th = self._restorer
        if th is not None:
            th.join(timeout_s)

    def restore(self, first: int, stop: int) -> int:
        """Blocks ``first..stop-1`` mapped before the scheduler uses them: what the background restore
        mapped plus whatever is still unmapped, mapped now."""
        self.join_restore()
        n, self._restored = self._restored, 0
        return n + (self.releaser.restore(first, stop) if self.releaser is not None else 0)

    def release_from(self, first: int, restore_stop: int | None) -> int:
        self.join_restore()  # never unmap under a running restore
        if restore_stop is not None:
            self.restore_range = (first, restore_stop)
        self._restored = 0
        return self.releaser.release(first) if self.releaser is not None else 0


def _agent(worker: Any) -> WorkerMemoryAgent:
    a = getattr(worker, ATTR, None)
    if not isinstance(a, WorkerMemoryAgent):
        raise RuntimeError("elastic memory: rpc_init was not called on this worker")
    return a


def rpc_init(worker: Any, host_store: str, offload_dir: str | None, release_pages: bool) -> dict[str, Any]:
    agent = getattr(worker, ATTR, None)
    if agent is None:
        agent = WorkerMemoryAgent(worker, host_store, offload_dir, release_pages)
        setattr(worker, ATTR, agent)
    return agent.info()


def rpc_release_from(worker: Any, first_block: int, restore_stop: int | None = None) -> int:
    """Return the memory of KV blocks >= first_block (their owners must be gone). ``restore_stop``:
    blocks first_block..restore_stop-1 are the ones to map again, in the background, once the draft
    has left the device."""
    return _agent(worker).release_from(first_block, restore_stop)


def rpc_restore(worker: Any, first_block: int, stop_block: int) -> int:
    """KV blocks first_block..stop_block-1 mapped, before the scheduler may use them (usually the
    background restore has done it); returns the bytes mapped since the last release."""
    return _agent(worker).restore(first_block, stop_block)


def rpc_offload(worker: Any) -> dict[str, Any]:
    a = _agent(worker)
    a.mover.start_offload()
    return a.poll()


def rpc_reload(worker: Any, slice_s: float = 0.0, slice_bytes: int = 0) -> dict[str, Any]:
    """``slice_s`` > 0 on CPU: a stepped reload, advanced by ``rpc_poll`` between steps (a thread would
    compete with decoding for the cores); CUDA always copies in a background thread on a side stream."""
    a = _agent(worker)
    a.mover.start_reload(slice_bytes, stepped=slice_s > 0 and a.device.type == "cpu")
    return a.poll()


def rpc_poll(worker: Any, slice_s: float = 0.0) -> dict[str, Any]:
    """Progress of the current move; a stepped reload first does up to ``slice_s`` of its work here."""
    a = _agent(worker)
    if a.mover.task is not None and slice_s > 0:
        a.mover.task.advance(slice_s)
    return a.poll()


def rpc_cancel(worker: Any) -> dict[str, Any]:
    """Stop a stepped reload between work items (the draft stays offloaded); a threaded move runs on."""
    a = _agent(worker)
    if a.mover.task is not None:
        a.mover.task.cancel()
    return a.poll()


def rpc_wait(worker: Any, timeout_s: float) -> dict[str, Any]:
    a = _agent(worker)
    if a.mover.task is not None:
        a.mover.task.wait(timeout_s)
        a.poll()  # starts the KV restore if the move left the draft off the device
        a.join_restore(timeout_s)
    return a.poll()
