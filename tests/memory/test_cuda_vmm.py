"""``VmmArena`` against a fake CUDA driver on CPU: the driver's rules (``cuMemUnmap`` covers exactly one
``cuMemMap``, a mapping starts at offset 0 of its allocation, access is granted on mapped memory
only) are asserted by the fake, bytes live in the fake's allocations so a split's copy is checked,
and every call can be made to fail at any position: afterwards no handle is left unreleased, the
reservation is freed and the arena's bookkeeping matches what the driver has mapped."""

from __future__ import annotations

import itertools
import types
from collections import Counter

import pytest
from nightjar_worker.memory.arena import _BACKED
from nightjar_worker.memory.cuda_vmm import VmmArena

G = 4096  # the fake's allocation granularity
ERR = 2  # CUDA_ERROR_OUT_OF_MEMORY


class FakeDriver:
    """The part of ``cuda.bindings.driver`` VmmArena uses, with bookkeeping and error injection."""

    CUdeviceptr = int

    class CUmemAllocationProp:
        def __init__(self) -> None:
            self.type = None
            self.location = types.SimpleNamespace(type=None, id=None)

    class CUmemAccessDesc:
        def __init__(self) -> None:
            self.location = None
            self.flags = None

    CUmemAllocationType = types.SimpleNamespace(CU_MEM_ALLOCATION_TYPE_PINNED=1)
    CUmemLocationType = types.SimpleNamespace(CU_MEM_LOCATION_TYPE_DEVICE=1)
    CUmemAllocationGranularity_flags = types.SimpleNamespace(CU_MEM_ALLOC_GRANULARITY_MINIMUM=0)
    CUmemAccess_flags = types.SimpleNamespace(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)

    def __init__(self, fail: tuple[str, int] | None = None) -> None:
        self.fail = fail
        self.calls: Counter[str] = Counter()
        self.mem: dict[int, bytearray] = {}  # handle -> its bytes
        self.live: set[int] = set()  # handles not released
        self.maps: dict[int, tuple[int, int]] = {}  # va -> (size, handle)
        self.reserved: dict[int, int] = {}
        self._va = 1 << 40
        self._h = itertools.count(1)

    def _failing(self, name: str) -> bool:
        self.calls[name] += 1
        return self.fail == (name, self.calls[name])

    def _mapping_at(self, va: int) -> tuple[int, int, int]:
        for start, (size, h) in self.maps.items():
            if start <= va < start + size:
                return start, size, h
        raise AssertionError(f"address {va:#x} is not mapped")

    def read(self, va: int, n: int) -> bytes:
        out = b""
        while n:
            start, size, h = self._mapping_at(va)
            k = min(n, start + size - va)
            out += bytes(self.mem[h][va - start:va - start + k])
            va, n = va + k, n - k
        return out

    def write(self, va: int, data: bytes) -> None:
        while data:
            start, size, h = self._mapping_at(va)
            k = min(len(data), start + size - va)
            self.mem[h][va - start:va - start + k] = data[:k]
            va, data = va + k, data[k:]

    # -- the driver API -----------------------------------------------------------------------------
    def cuInit(self, flags):
        return (0,)

    def cuCtxGetCurrent(self):
        return (0, "ctx")

    def cuCtxSetCurrent(self, ctx):
        assert ctx == "ctx"
        return (0,)

    def cuCtxSynchronize(self):
        return (0,)

    def cuMemGetAllocationGranularity(self, prop, flags):
        return (0, G)

    def cuMemAddressReserve(self, size, align, addr, flags):
        va, self._va = self._va, self._va + size + (1 << 30)
        self.reserved[va] = size
        return (0, va)

    def cuMemAddressFree(self, va, size):
        assert self.reserved.pop(va) == size
        return (0,)

    def cuMemCreate(self, size, prop, flags):
        if self._failing("cuMemCreate"):
            return (ERR, None)
        assert size % G == 0 and size > 0
        h = next(self._h)
        self.mem[h] = bytearray(size)
        self.live.add(h)
        return (0, h)

    def cuMemRelease(self, h):
        assert h in self.live, f"handle {h} released twice"
        self.live.discard(h)
        return (0,)

    def cuMemMap(self, va, size, offset, h, flags):
        if self._failing("cuMemMap"):
            return (ERR,)
        assert offset == 0 and h in self.live and size == len(self.mem[h])
        assert any(r <= va and va + size <= r + n for r, n in self.reserved.items()), "outside the reservation"
        assert all(va + size <= s or s + n <= va for s, (n, _) in self.maps.items()), "mapped twice"
        self.maps[va] = (size, h)
        return (0,)

    def cuMemUnmap(self, va, size):
        if self._failing("cuMemUnmap"):
            return (ERR,)
        assert self.maps.get(va, (None,))[0] == size, "cuMemUnmap must cover exactly one cuMemMap"
        del self.maps[va]
        return (0,)

    def cuMemSetAccess(self, va, size, descs, count):
        if self._failing("cuMemSetAccess"):
            return (ERR,)
        end = va
        while end < va + size:  # fully mapped, as the driver requires
            start, n, _ = self._mapping_at(end)
            end = start + n
        return (0,)

    def cuMemcpyDtoD(self, dst, src, n):
        if self._failing("cuMemcpyDtoD"):
            return (ERR,)
        self.write(dst, self.read(src, n))
        return (0,)


def consistent(arena: VmmArena, fake: FakeDriver) -> None:
    """Backed granules are exactly the mapped ones, and every live handle is one the arena holds."""
    for i, st in enumerate(arena._state):
        va = arena.ptr + i * G
        mapped = any(s <= va < s + n for s, (n, _) in fake.maps.items())
        assert mapped == (bytes([st]) == _BACKED), f"granule {i}: mapped {mapped}, state {st}"
    assert fake.live == {h for _, h in arena._segs.values()}


PATTERN = bytes(range(256)) * (20 * G // 256)


def scenario(fake: FakeDriver) -> None:
    """Start-up, a release cutting segments (two 'layers' of 10 granules, tails from 6.9 and 7),
    a restore, a second release and restore, close; after each step (failed or not) the arena is
    consistent and the granules backed all along hold their data."""
    arena = VmmArena(20 * G, segment=4 * G, driver=fake)
    try:
        fake.write(arena.ptr, PATTERN)
        kept = set(range(20))
        steps = [("unmap", int(6.9 * G), 10 * G), ("unmap", 17 * G, 20 * G), ("map", 7 * G, 9 * G),
                 ("unmap", 7 * G, 10 * G), ("map", 0, 20 * G)]
        for op, s, e in steps:
            try:
                getattr(arena, op)(s, e)
            except RuntimeError:
                pass
            if op == "unmap":
                kept -= set(range(-(-s // G), e // G))
            kept &= {i for i, st in enumerate(arena._state) if bytes([st]) == _BACKED}
            consistent(arena, fake)
            for i in kept:
                assert fake.read(arena.ptr + i * G, G) == PATTERN[i * G:(i + 1) * G], f"granule {i} lost its data"
    finally:
        try:
            arena.close()
        except RuntimeError:
            pass


def _clean_counts() -> Counter[str]:
    fake = FakeDriver()
    scenario(fake)
    assert not fake.live and not fake.reserved and not fake.maps
    return fake.calls


FAILING = [(name, k) for name, n in sorted(_clean_counts().items()) for k in range(1, n + 1)]


def test_the_clean_run_splits_segments_and_keeps_the_data():
    calls = _clean_counts()
    assert calls["cuMemcpyDtoD"] >= 2  # both releases cut a segment: the part kept was copied
    assert {"cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemSetAccess"} <= set(calls)


@pytest.mark.parametrize("fail", FAILING, ids=[f"{n}#{k}" for n, k in FAILING])
def test_no_handle_or_reservation_leaks_when_a_driver_call_fails(fail):
    fake = FakeDriver(fail)
    try:
        scenario(fake)
    except RuntimeError as e:  # the constructor's start-up map failed: it must have cleaned up
        assert "CUDA driver error" in str(e)
    assert fake.calls[fail[0]] >= fail[1]  # the failure was really injected
    assert not fake.live, f"handles not released: {fake.live}"
    assert not fake.reserved, "the virtual reservation was not freed"


def test_start_up_and_restore_take_one_allocation_per_segment_not_per_granule():
    fake = FakeDriver()
    arena = VmmArena(1024 * G, segment=64 * G, driver=fake)  # like 2 GiB in 2 MiB granules, 128 MiB segments
    assert fake.calls["cuMemCreate"] == fake.calls["cuMemMap"] == 16 and fake.calls["cuMemSetAccess"] == 1
    assert arena.segments() == 16
    arena.unmap(100 * G, 400 * G)  # segments 2..5 wholly inside; 1 and 6 split (copies of what stays)
    assert arena.mapped_bytes() == (1024 - 300) * G
    before = fake.calls["cuMemCreate"]
    arena.map(100 * G, 400 * G)  # the restore: one allocation per segment-aligned piece of the run
    assert fake.calls["cuMemCreate"] - before == 6 and arena.is_mapped(0, 1024 * G)
    consistent(arena, fake)
    arena.close()
    assert not fake.live and not fake.reserved and not fake.maps


def test_bad_segment_sizes_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="segment"):
        VmmArena(8 * G, segment=G + 1, driver=FakeDriver())
    fake = FakeDriver()
    with pytest.raises(ValueError, match="chunk"):
        VmmArena(8 * G, chunk=G + 1, driver=fake)
    assert not fake.reserved
