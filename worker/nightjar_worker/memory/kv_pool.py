"""vLLM's KV pool in an ``arena.Arena``, so that elastic memory can return part of it and take it back.

vLLM 0.32 allocates the whole KV pool as one buffer in ``v1/worker/utils.py::allocate_kv_cache``
(``torch.zeros(size, dtype=torch.int8, device=device)``) and views every layer's cache into it.
``install`` wraps ``GPUModelRunner.initialize_kv_cache`` (the CPU runner calls it too): when elastic
memory runs in this engine and releases pages (``availability``), that one allocation comes from an
arena (``HostArena`` on CPU, ``cuda_vmm.VmmArena`` on CUDA), kept on the runner for the worker agent.
Everything vLLM does with the buffer (layer views, ``bind_kv_cache``, CUDA graphs) is unchanged. The
profiling run's minimal pool (``is_profiling``) stays vLLM's.

How: while vLLM initialises the KV cache, the name ``torch`` in its ``v1/worker/utils`` module is a
proxy whose ``zeros`` serves the pool's int8 allocation from the arena and defers to torch for all
else, so vLLM's own layout code runs as is. vLLM's hook for this (``kv_cache_allocation_context``)
expects a torch memory pool, which needs an allocator compiled against torch and CUDA.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .arena import Arena, HostArena

log = logging.getLogger("nightjar.memory")

ARENA_ATTR = "_nightjar_kv_arena"
_PATCHED_ATTR = "_nightjar_kv_pool"

MakeArena = Callable[[int, Any], Arena]


def make_arena(size: int, device: Any) -> Arena:
    """An arena of ``size`` bytes on ``device`` (a torch device or its name)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return HostArena(size)
    if dev.type == "cuda":
        from .cuda_vmm import VmmArena

        return VmmArena(size, device=torch.cuda.current_device() if dev.index is None else dev.index)
    raise ValueError(f"kv pool: no arena for device {dev} (cpu and cuda only)")


class TorchWithPoolZeros:
    """``torch``, except that the first 1-D int8 ``zeros`` (the KV pool's buffer) comes from an arena."""

    def __init__(self, real: Any, make: MakeArena) -> None:
        self._real, self._make = real, make
        self.arena: Arena | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def zeros(self, *size: Any, dtype: Any = None, device: Any = None, **kw: Any) -> Any:
        torch = self._real
        if self.arena is not None or dtype is not torch.int8 or len(size) != 1 or kw:
            return torch.zeros(*size, dtype=dtype, device=device, **kw)
        n = int(size[0])
        self.arena = self._make(n, device)
        buf = self.arena.tensor()[:n].view(torch.int8)
        if not self.arena.zero_filled:
            buf.zero_()  # new device memory is undefined; vLLM's pool starts zeroed
        return buf


@contextmanager
def kv_pool_in_arena(make: MakeArena = make_arena) -> Iterator[TorchWithPoolZeros]:
    """Inside, vLLM's ``allocate_kv_cache`` takes its buffer from an arena (``proxy.arena`` after)."""
    import vllm.v1.worker.utils as vu

    proxy = TorchWithPoolZeros(vu.torch, make)
    vu.torch = proxy
    try:
        yield proxy
    finally:
        vu.torch = proxy._real


def install() -> bool:
    """Wrap ``GPUModelRunner.initialize_kv_cache`` (idempotent). Returns True if this call patched it."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from .availability import availability  # pydantic: not on the GPU check's machine

    if getattr(GPUModelRunner, _PATCHED_ATTR, False):
        return False
    orig = GPUModelRunner.initialize_kv_cache

    def initialize_kv_cache(self: Any, kv_cache_config: Any, is_profiling: bool = False, **kwargs: Any) -> Any:
        cfg, _, reason = availability(self.vllm_config)
        if is_profiling or reason is not None or not cfg.release_pages:
            return orig(self, kv_cache_config, is_profiling, **kwargs)
        with kv_pool_in_arena() as proxy:
            out = orig(self, kv_cache_config, is_profiling, **kwargs)
        if proxy.arena is None:
            raise RuntimeError(
                "elastic memory: vLLM allocated its KV cache without the one int8 buffer Nightjar places in an "
                "arena (v1/worker/utils.py::allocate_kv_cache changed?); set memory.release_pages false or "
                "turn elastic memory off"
            )
        setattr(self, ARENA_ATTR, proxy.arena)
        log.info("nightjar memory: KV pool of %d bytes in a %s (chunks of %d bytes)",
                 proxy.arena.size, type(proxy.arena).__name__, proxy.arena.chunk)
        return out

    initialize_kv_cache.__wrapped__ = orig  # type: ignore[attr-defined]
    GPUModelRunner.initialize_kv_cache = initialize_kv_cache
    setattr(GPUModelRunner, _PATCHED_ATTR, True)
    return True
