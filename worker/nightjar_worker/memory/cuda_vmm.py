"""KV page release on CUDA: the KV pool in CUDA virtual memory, whose chunks can be unmapped and mapped.

Device memory from ``cudaMalloc`` cannot be partly returned. Here the pool is one reserved virtual
address range (``cuMemAddressReserve``) backed by physical chunks (``cuMemCreate`` + ``cuMemMap``), so
releasing the extra blocks is ``cuMemUnmap`` + ``cuMemRelease`` of the chunks wholly inside their
byte ranges, and bringing them back is ``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess`` at the same
addresses: the KV tensors' pointers never change, so vLLM's block tables and CUDA graphs stay valid.
It is the CUDA ``Arena`` (``arena.py``); ``kv_pool.py`` makes vLLM allocate its KV pool in one.

Why not the ``kvcached`` package: it is published as a source distribution whose C++ extension
must be compiled against the installed torch and CUDA toolkit, and it replaces vLLM's KV allocator
with its own page allocator through patches for specific vLLM versions. Nightjar needs one coarse
operation (drop or restore one tail of the pool) behind the CPU path's interface, which the CUDA
driver API does directly; ``cuda-bindings`` (NVIDIA's Python bindings, no compiler) is enough.

Status: exercised by ``make gpu-check`` on a GPU. Until that has passed, CUDA workers run with
elastic memory off unless the memory config sets ``allow_unverified_cuda``
(``availability.unavailable_reason``).
"""

from __future__ import annotations

from typing import Any

from .arena import _FREE, Arena


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


class VmmArena(Arena):
    """``size`` bytes of device memory at one fixed virtual address, in chunks of the allocation
    granularity (2 MiB on current GPUs) or a multiple of it."""

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
        chunk = chunk or gran
        if chunk % gran:
            raise ValueError(f"chunk: {chunk} is not a multiple of the allocation granularity {gran}")
        super().__init__(size, chunk)
        self.ptr = int(_check(cu.cuMemAddressReserve(self.size, self.chunk, cu.CUdeviceptr(0), 0)))
        access = cu.CUmemAccessDesc()
        access.location = prop.location
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = access
        self._handles: dict[int, Any] = {}
        self._state[:] = bytes(len(self._state))  # reserved, nothing backed yet
        self.map(0, self.size)

    def _back(self, a: int, b: int) -> None:
        cu = self.cu
        done: list[int] = []
        try:
            for i in range(a, b):
                h = _check(cu.cuMemCreate(self.chunk, self._prop, 0))
                try:
                    _check(cu.cuMemMap(cu.CUdeviceptr(self.ptr + i * self.chunk), self.chunk, 0, h, 0))
                except BaseException:
                    cu.cuMemRelease(h)
                    raise
                self._handles[i] = h
                done.append(i)
            # access is granted per contiguous run, on mapped memory only
            _check(cu.cuMemSetAccess(cu.CUdeviceptr(self.ptr + a * self.chunk), (b - a) * self.chunk,
                                     [self._access], 1))
        except BaseException:
            for i in done:  # nothing half-mapped: the run stays unbacked
                cu.cuMemUnmap(cu.CUdeviceptr(self.ptr + i * self.chunk), self.chunk)
                cu.cuMemRelease(self._handles.pop(i))
            raise

    def _drop(self, a: int, b: int) -> None:
        import torch

        torch.cuda.synchronize(self.device)  # no kernel may still read or write these pages
        # One unmap per chunk, as each was mapped: cuMemUnmap must cover exactly what a cuMemMap
        # mapped (a range spanning several mappings is not documented to work; PyTorch's
        # expandable segments unmap per handle too).
        cu, done = self.cu, a
        try:
            for i in range(a, b):
                _check(cu.cuMemUnmap(cu.CUdeviceptr(self.ptr + i * self.chunk), self.chunk))
                done = i + 1
                _check(cu.cuMemRelease(self._handles.pop(i)))
        except BaseException:  # the chunks already unmapped are free: a later map backs them again
            self._state[a:done] = _FREE * (done - a)
            raise

    def tensor(self) -> Any:
        """The whole range as a flat uint8 torch tensor (no copy; the arena must outlive it)."""
        import torch

        arena = self

        class _View:  # __cuda_array_interface__ v3: what torch.as_tensor wraps without copying
            __cuda_array_interface__ = {"shape": (arena.size,), "typestr": "|u1", "data": (arena.ptr, False),
                                        "version": 3, "strides": None, "stream": None}

        return torch.as_tensor(_View(), device=f"cuda:{self.device}")

    def close(self) -> None:
        self.unmap(0, self.size)
        _check(self.cu.cuMemAddressFree(self.cu.CUdeviceptr(self.ptr), self.size))
