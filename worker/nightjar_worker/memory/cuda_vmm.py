"""KV page release on CUDA: a pool in CUDA virtual memory whose tail can be unmapped and mapped again.

The CPU path returns the extra KV blocks' pages with ``madvise`` (``kv_elastic.KVPageReleaser``);
device memory from ``cudaMalloc`` cannot be partly returned. Here the pool is one reserved virtual
address range (``cuMemAddressReserve``) backed by physical chunks (``cuMemCreate`` + ``cuMemMap``), so
releasing the extra blocks is ``cuMemUnmap`` + ``cuMemRelease`` of the chunks wholly inside their
byte ranges, and bringing them back is ``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess`` at the same
addresses: the KV tensors' pointers never change, so vLLM's block tables and CUDA graphs stay valid.

Why not the ``kvcached`` package: it is published as a source distribution whose C++ extension
must be compiled against the installed torch and CUDA toolkit, and it replaces vLLM's KV allocator
with its own page allocator through patches for specific vLLM versions. Nightjar needs one coarse
operation (drop or restore one tail of the pool) behind the CPU path's interface, which the CUDA
driver API does directly; ``cuda-bindings`` (NVIDIA's Python bindings, no compiler) is enough.

Status: exercised by ``make gpu-check`` on a GPU; the worker does not yet allocate vLLM's KV pool
here, so CUDA workers run with elastic memory off (``manager.unavailable_reason``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .kv_elastic import block_ranges, merge_ranges


def chunks_inside(start: int, end: int, chunk: int) -> range:
    """Indices of the ``chunk``-sized chunks wholly inside ``[start, end)`` (offsets in the range):
    rounding inward, a chunk that also holds bytes outside is never touched."""
    first = -(-start // chunk)
    last = end // chunk
    return range(first, max(first, last))


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:  # cuda-python < 12.6 names it cuda.cuda
        try:
            from cuda import cuda as driver  # type: ignore[no-redef]
        except ImportError as e:
            raise RuntimeError("CUDA virtual memory needs the cuda-bindings package (pip install cuda-bindings)") from e
    return driver


def _check(res: Any) -> Any:
    """cuda-bindings calls return (CUresult, value...): raise on an error, return the value(s)."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    if int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"CUDA driver error {err!r}")
    return vals[0] if len(vals) == 1 else (tuple(vals) or None)


class VmmArena:
    """``size`` bytes of device memory at one fixed virtual address, in chunks that can be unmapped
    (their physical memory returned to the device) and mapped again. Offsets are relative to ``ptr``.
    """

    def __init__(self, size: int, device: int = 0, chunk: int | None = None) -> None:
        import torch

        self.cu = cu = _driver()
        torch.cuda.init()
        torch.cuda.set_device(device)
        torch.zeros(1, device=f"cuda:{device}")  # torch's primary context current on this thread
        _check(cu.cuInit(0))
        self.device = device
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        self._prop = prop
        gran = int(_check(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
        self.chunk = chunk or gran
        if self.chunk % gran:
            raise ValueError(f"chunk: {self.chunk} is not a multiple of the allocation granularity {gran}")
        self.size = -(-size // self.chunk) * self.chunk
        self.ptr = int(_check(cu.cuMemAddressReserve(self.size, self.chunk, cu.CUdeviceptr(0), 0)))
        access = cu.CUmemAccessDesc()
        access.location = prop.location
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = access
        self._handles: list[Any] = [None] * (self.size // self.chunk)
        self.map(0, self.size)

    # -- mapping -------------------------------------------------------------------------------------
    def _map_chunk(self, i: int) -> None:
        cu = self.cu
        h = _check(cu.cuMemCreate(self.chunk, self._prop, 0))
        addr = cu.CUdeviceptr(self.ptr + i * self.chunk)
        try:
            _check(cu.cuMemMap(addr, self.chunk, 0, h, 0))
        except BaseException:
            cu.cuMemRelease(h)
            raise
        self._handles[i] = h

    def map(self, start: int, end: int) -> int:
        """Back every chunk inside ``[start, end)`` that is not backed; returns the bytes mapped.
        New memory is uninitialised (the caller treats those KV blocks as free)."""
        todo = [i for i in chunks_inside(start, end, self.chunk) if self._handles[i] is None]
        for i in todo:
            self._map_chunk(i)
        # Access is granted per contiguous run (one call per run, as the driver requires mapped memory).
        for a, b in _runs(todo):
            _check(self.cu.cuMemSetAccess(self.cu.CUdeviceptr(self.ptr + a * self.chunk), (b - a) * self.chunk,
                                          [self._access], 1))
        return len(todo) * self.chunk

    def unmap(self, start: int, end: int) -> int:
        """Return the physical memory of every backed chunk inside ``[start, end)``; the addresses
        stay reserved. Returns the bytes released. The caller must not touch them until ``map``."""
        import torch

        todo = [i for i in chunks_inside(start, end, self.chunk) if self._handles[i] is not None]
        if todo:
            torch.cuda.synchronize(self.device)  # no kernel may still read or write these pages
        for a, b in _runs(todo):
            _check(self.cu.cuMemUnmap(self.cu.CUdeviceptr(self.ptr + a * self.chunk), (b - a) * self.chunk))
        for i in todo:
            _check(self.cu.cuMemRelease(self._handles[i]))
            self._handles[i] = None
        return len(todo) * self.chunk

    def mapped_bytes(self) -> int:
        return sum(self.chunk for h in self._handles if h is not None)

    def tensor(self, dtype: Any = None) -> Any:
        """The whole range as a flat torch tensor (no copy; the arena must outlive it)."""
        import torch

        arena = self

        class _View:  # __cuda_array_interface__ v3: what torch.as_tensor wraps without copying
            __cuda_array_interface__ = {"shape": (arena.size,), "typestr": "|u1", "data": (arena.ptr, False),
                                        "version": 3, "strides": None, "stream": None}

        t = torch.as_tensor(_View(), device=f"cuda:{self.device}")
        return t if dtype is None else t.view(dtype)

    def close(self) -> None:
        self.unmap(0, self.size)
        _check(self.cu.cuMemAddressFree(self.cu.CUdeviceptr(self.ptr), self.size))


def _runs(idx: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted chunk indices as [a, b) runs of consecutive indices."""
    out: list[tuple[int, int]] = []
    for i in sorted(idx):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


class CudaPageReleaser:
    """The CUDA counterpart of ``kv_elastic.KVPageReleaser``: the KV tensors live in ``arena``;
    ``release(first)`` returns the memory of blocks >= ``first``, ``restore(first)`` maps it again
    (before the scheduler hands those blocks out: unlike CPU pages, unmapped device memory faults)."""

    def __init__(self, arena: VmmArena, kv_caches: Sequence[Any]) -> None:
        self.arena = arena
        seen: dict[int, Any] = {}
        for t in kv_caches:
            if not arena.ptr <= t.data_ptr() < arena.ptr + arena.size:
                raise ValueError("kv elastic: a KV tensor does not live in the CUDA virtual memory pool")
            seen.setdefault(t.data_ptr(), t)
        self.layers = list(seen.values())
        self.last_s = 0.0

    def ranges(self, first: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for t in self.layers:
            out += block_ranges(t, first, page=self.arena.chunk)
        return [(s - self.arena.ptr, e - self.arena.ptr) for s, e in merge_ranges(out)]

    def release(self, first: int) -> int:
        t0 = time.perf_counter()
        n = sum(self.arena.unmap(s, e) for s, e in self.ranges(first))
        self.last_s = time.perf_counter() - t0
        return n

    def restore(self, first: int) -> int:
        t0 = time.perf_counter()
        n = sum(self.arena.map(s, e) for s, e in self.ranges(first))
        self.last_s = time.perf_counter() - t0
        return n
