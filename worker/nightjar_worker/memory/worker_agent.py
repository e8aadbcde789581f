"""The worker-process half of elastic memory, driven by ``collective_rpc`` from the scheduler.

Every ``rpc_*`` function is module level (vLLM pickles it by reference) and takes the worker
(vLLM's ``WorkerWrapperBase``) first. They return plain dicts and never raise into the worker's
RPC loop for expected failures: a failed move is reported in ``rpc_poll``.

Safety net: while the draft is not resident the runner's ``_input_fits_in_drafter`` answers False,
so even a scheduler bug asking for drafts cannot run a draft whose parameters are empty; vLLM then
emits no drafts for that step (plain autoregressive decoding).
"""

from __future__ import annotations

import logging
import os
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
            out.update(kind=t.kind, done=t.done, error=t.error, duration_s=t.duration_s, bytes=t.bytes_moved,
                       busy_s=t.busy_s, slices=t.slices, cancelled=t.cancelled)
        return out


def _agent(worker: Any) -> WorkerMemoryAgent:
    a = getattr(worker, ATTR, None)
    if a is None:
        raise RuntimeError("elastic memory: rpc_init was not called on this worker")
    return a


def rpc_init(worker: Any, host_store: str, offload_dir: str | None, release_pages: bool) -> dict[str, Any]:
    agent = getattr(worker, ATTR, None)
    if agent is None:
        agent = WorkerMemoryAgent(worker, host_store, offload_dir, release_pages)
        setattr(worker, ATTR, agent)
    return agent.info()


def rpc_release_from(worker: Any, first_block: int) -> int:
    """Return the memory of KV blocks >= first_block (their owners must be gone)."""
    a = _agent(worker)
    return a.releaser.release(first_block) if a.releaser is not None else 0


def rpc_restore(worker: Any, first_block: int, stop_block: int) -> int:
    """Map the memory of KV blocks first_block..stop_block-1 again, before the scheduler may use them."""
    a = _agent(worker)
    return a.releaser.restore(first_block, stop_block) if a.releaser is not None else 0


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
    return a.poll()
