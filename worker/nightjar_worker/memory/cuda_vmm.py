"""KV page release on CUDA: the KV pool in CUDA virtual memory, whose pieces can be unmapped and mapped.

Device memory from ``cudaMalloc`` cannot be partly returned. Here the pool is one reserved virtual
address range (``cuMemAddressReserve``) backed by physical allocations (``cuMemCreate`` +
``cuMemMap`` + ``cuMemSetAccess``), so releasing the extra blocks is ``cuMemUnmap`` + ``cuMemRelease``
of what lies wholly inside their byte ranges, and bringing them back maps new physical memory at the
same addresses: the KV tensors' pointers never change, so vLLM's block tables and CUDA graphs stay
valid. It is the CUDA ``Arena`` (``arena.py``); ``kv_pool.py`` makes vLLM allocate its KV pool in one.

Granule and segment (the trade-off). The arena's unit (``chunk``) is the driver's allocation
granularity (2 MiB on current GPUs): what a release rounds inward to, so at most one granule per
edge of a released range stays committed. Physical memory is allocated in *segments*: one
``cuMemCreate`` + ``cuMemMap`` per run of granules, cut at multiples of ``segment`` bytes (64 MiB by
default) and one ``cuMemSetAccess`` per run. A 60 GiB pool maps in ~1,000 driver calls instead of
~60,000 at 2 MiB each (and a restore of a draft's worth of blocks in tens, not hundreds). The price:
``cuMemUnmap`` must cover a whole ``cuMemMap`` and a mapping cannot start inside an allocation
(``cuMemMap``'s offset must be 0), so releasing part of a segment *splits* it: the part that stays is
copied into a new allocation (mapped first at a scratch range past the pool's end), the old one is
unmapped and the copy mapped in its place. That costs a device-to-device copy of at most one segment
and that much memory for a moment, per segment a released range cuts (with vLLM's default layer-outer
KV layout, at most two per layer, once: later releases and restores cover the segments restores
made). Larger segments: fewer calls, bigger split copies; smaller: the reverse. Release granularity
stays the granule either way.

Errors: every path that fails leaves no physical handle unreleased and no mapping the arena does not
record; a failed constructor frees its reservation; ``close`` releases every handle and the
reservation even when some driver calls fail (then raises the first error). ``tests/memory/
test_cuda_vmm.py`` proves it on CPU with a fake driver that fails each call at each position.

Why not the ``kvcached`` package: it is published as a source distribution whose C++ extension
must be compiled against the installed torch and CUDA toolkit, and it replaces vLLM's KV allocator
with its own page allocator through patches for specific vLLM versions. Nightjar needs one coarse
operation (drop or restore one tail of the pool) behind the CPU path's interface, which the CUDA
driver API does directly; ``cuda-bindings`` (NVIDIA's Python bindings, no compiler) is enough.

Status: exercised by ``make gpu-check`` on a GPU (not yet run: docs/memory.md). Until that has
passed, CUDA workers run with elastic memory off unless the memory config sets
``allow_unverified_cuda`` (``availability.unavailable_reason``).
"""

from __future__ import annotations

from typing import Any

from .arena import _BACKED, _FREE, Arena

SEGMENT = 64 << 20


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:  # cuda-python < 12.6 names it cuda.cuda
        try:
            from cuda import cuda as driver
        except ImportError as e:
            raise RuntimeError("CUDA virtual memory needs the cuda-bindings package (pip install cuda-bindings)") from e
    return driver


def _check(res: Any) -> Any:
    """cuda-bindings calls return (CUresult, value...): raise on an error, return the value(s)."""
    err, *vals = res if isinstance(res, tuple) else (res,)
    code: Any = getattr(err, "value", err)
    if int(code) != 0:
        raise RuntimeError(f"CUDA driver error {err!r}")
    return vals[0] if len(vals) == 1 else (tuple(vals) or None)


def _torch_context(device: int) -> None:
    """Make torch's primary context current on this thread (the driver calls use it)."""
    import torch

    torch.cuda.init()
    torch.cuda.set_device(device)
    torch.zeros(1, device=f"cuda:{device}")


class VmmArena(Arena):
    """``size`` bytes of device memory at one fixed virtual address: granules of the allocation
    granularity (or ``chunk``, a multiple of it) backed by segments of up to ``segment`` bytes.
    ``driver``: the ``cuda.bindings.driver`` module, or a stand-in (tests); with a stand-in torch
    is not touched."""

    def __init__(self, size: int, device: int = 0, chunk: int | None = None, segment: int = SEGMENT,
                 driver: Any = None) -> None:
        if driver is None:
            driver = _driver()
            _torch_context(device)
        self.cu = cu = driver
        _check(cu.cuInit(0))
        self._ctx = _check(cu.cuCtxGetCurrent())  # background threads (restore) make it current
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
        if segment < chunk or segment % chunk:
            raise ValueError(f"segment: {segment} is not a positive multiple of the chunk {chunk}")
        super().__init__(size, chunk)
        self._seg_chunks = segment // chunk
        # the pool, then one segment of scratch addresses where a split's copy is made
        self._reserved = self.size + segment
        self.ptr = int(_check(cu.cuMemAddressReserve(self._reserved, chunk, cu.CUdeviceptr(0), 0)))
        access = cu.CUmemAccessDesc()
        access.location = prop.location
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = access
        self._segs: dict[int, tuple[int, Any]] = {}  # first granule -> (granules, physical handle)
        self._state[:] = _FREE * len(self._state)  # reserved, nothing backed yet
        try:
            self.map(0, self.size)
        except BaseException:
            self.cu.cuMemAddressFree(self.cu.CUdeviceptr(self.ptr), self._reserved)
            raise

    # -- driver steps -------------------------------------------------------------------------------
    def _addr(self, i: int) -> Any:
        return self.cu.CUdeviceptr(self.ptr + i * self.chunk)

    def _use_ctx(self) -> None:
        _check(self.cu.cuCtxSetCurrent(self._ctx))

    def _create_map(self, addr: int, n: int) -> Any:
        """A new allocation of ``n`` granules mapped at ``addr``; nothing left behind if it fails."""
        cu = self.cu
        h = _check(cu.cuMemCreate(n * self.chunk, self._prop, 0))
        try:
            _check(cu.cuMemMap(cu.CUdeviceptr(addr), n * self.chunk, 0, h, 0))
        except BaseException:
            cu.cuMemRelease(h)
            raise
        return h

    def _unmap_release(self, addr: int, n: int, h: Any) -> None:
        """Unmap one allocation and release its handle. If the unmap fails it stays mapped and the
        caller keeps it (the handle too); a failed release is all the driver's."""
        _check(self.cu.cuMemUnmap(self.cu.CUdeviceptr(addr), n * self.chunk))
        self.cu.cuMemRelease(h)

    def _pieces(self, a: int, b: int) -> list[tuple[int, int]]:
        """``[a, b)`` cut at multiples of the segment: (first granule, granules) per allocation."""
        out, i, k = [], a, self._seg_chunks
        while i < b:
            j = min(b, (i // k + 1) * k)
            out.append((i, j - i))
            i = j
        return out

    # -- Arena ----------------------------------------------------------------------------------------
    def _back(self, a: int, b: int) -> None:
        self._use_ctx()
        made: list[tuple[int, int, Any]] = []
        try:
            for i, n in self._pieces(a, b):
                made.append((i, n, self._create_map(self.ptr + i * self.chunk, n)))
            # one grant for the run: it is fully mapped, as cuMemSetAccess requires
            _check(self.cu.cuMemSetAccess(self._addr(a), (b - a) * self.chunk, [self._access], 1))
        except BaseException:
            for i, n, h in made:  # nothing half-mapped: the run stays unbacked
                self.cu.cuMemUnmap(self._addr(i), n * self.chunk)
                self.cu.cuMemRelease(h)
            raise
        for i, n, h in made:
            self._segs[i] = (n, h)

    def _segments_over(self, a: int, b: int) -> list[int]:
        """First granules of the segments holding any granule of ``[a, b)`` (all backed)."""
        starts = sorted(s for s, (n, _) in self._segs.items() if s < b and s + n > a)
        return starts

    def _drop(self, a: int, b: int) -> None:
        self._use_ctx()
        # no kernel may still read or write these pages (the driver-wide sync torch.cuda.synchronize does)
        _check(self.cu.cuCtxSynchronize())
        segs = self._segments_over(a, b)
        inside = [s for s in segs if a <= s and s + self._segs[s][0] <= b]
        for s in inside:  # first what frees memory: a split below needs some for a moment
            n, h = self._segs[s]
            try:
                self._unmap_release(self.ptr + s * self.chunk, n, h)
            except BaseException:
                self._mark_free_segments_gone(a, b)
                raise
            del self._segs[s]
        for s in segs:
            if s not in inside:
                try:
                    self._split(s, a, b)
                except BaseException:
                    self._mark_free_segments_gone(a, b)
                    raise

    def _mark_free_segments_gone(self, a: int, b: int) -> None:
        """After a failed ``_drop``: granules of ``[a, b)`` no segment backs any more are free (the
        arena's contract: ``_drop`` marks what it had freed before it raised)."""
        backed = bytearray(_FREE * (b - a))
        for s, (n, _) in self._segs.items():
            lo, hi = max(s, a), min(s + n, b)
            if lo < hi:
                backed[lo - a:hi - a] = _BACKED * (hi - lo)
        self._state[a:b] = backed

    def _split(self, s: int, a: int, b: int) -> None:
        """Segment ``s`` straddles ``[a, b)``: keep its granules outside, with their data, as new
        allocations; free the inside."""
        cu, c = self.cu, self.chunk
        n, old = self._segs[s]
        keep = [(p, q) for p, q in ((s, max(s, a)), (min(s + n, b), s + n)) if p < q]
        scratch = self.ptr + self.size
        new: list[tuple[int, int, Any]] = []
        on_scratch: list[tuple[int, int]] = []
        try:
            for p, q in keep:  # a copy of what stays, at scratch addresses
                addr = scratch + (p - s) * c
                new.append((p, q, self._create_map(addr, q - p)))
                on_scratch.append((addr, q - p))
                _check(cu.cuMemSetAccess(cu.CUdeviceptr(addr), (q - p) * c, [self._access], 1))
                _check(cu.cuMemcpyDtoD(cu.CUdeviceptr(addr), self._addr(p), (q - p) * c))
            _check(cu.cuCtxSynchronize())
            while on_scratch:
                addr, m = on_scratch[-1]
                _check(cu.cuMemUnmap(cu.CUdeviceptr(addr), m * c))
                on_scratch.pop()
            self._unmap_release(self.ptr + s * c, n, old)  # fails: the old segment stays as it was
        except BaseException:
            for addr, m in on_scratch:
                cu.cuMemUnmap(cu.CUdeviceptr(addr), m * c)
            for _, _, h in new:
                cu.cuMemRelease(h)
            raise
        del self._segs[s]
        # The old segment is gone: map the copies in its place. A failure here loses the kept
        # granules' data (they are marked free and released; the caller's map backs them again).
        for k, (p, q, h) in enumerate(new):
            try:
                _check(cu.cuMemMap(self._addr(p), (q - p) * c, 0, h, 0))
            except BaseException:
                for _, _, h2 in new[k:]:
                    cu.cuMemRelease(h2)
                for p2, q2, _ in new[k:]:
                    self._state[p2:q2] = _FREE * (q2 - p2)
                raise
            self._segs[p] = (q - p, h)
            _check(cu.cuMemSetAccess(self._addr(p), (q - p) * c, [self._access], 1))

    def segments(self) -> int:
        """Physical allocations now mapped (one driver call each to map or unmap)."""
        return len(self._segs)

    def tensor(self) -> Any:
        """The whole range as a flat uint8 torch tensor (no copy; the arena must outlive it)."""
        import torch

        arena = self

        class _View:  # __cuda_array_interface__ v3: what torch.as_tensor wraps without copying
            __cuda_array_interface__ = {"shape": (arena.size,), "typestr": "|u1", "data": (arena.ptr, False),
                                        "version": 3, "strides": None, "stream": None}

        return torch.as_tensor(_View(), device=f"cuda:{self.device}")

    def close(self) -> None:
        """Unmap and release everything and free the reservation; every handle is released even
        if a driver call fails (the first error is raised at the end). Idempotent."""
        if self._reserved == 0:
            return
        cu, first = self.cu, None
        try:
            self._use_ctx()
            _check(cu.cuCtxSynchronize())
        except BaseException as e:  # noqa: BLE001 - still give everything back
            first = e
        for s, (n, h) in sorted(self._segs.items()):
            try:
                _check(cu.cuMemUnmap(self._addr(s), n * self.chunk))
            except BaseException as e:  # noqa: BLE001
                first = first or e
            cu.cuMemRelease(h)
        self._segs.clear()
        self._state[:] = _FREE * len(self._state)
        try:
            _check(cu.cuMemAddressFree(cu.CUdeviceptr(self.ptr), self._reserved))
        except BaseException as e:  # noqa: BLE001
            first = first or e
        self._reserved = 0
        if first is not None:
            raise first
