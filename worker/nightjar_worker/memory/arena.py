"""Memory at one fixed address whose pieces can be given back and taken again: where the KV pool lives.

Elastic memory keeps vLLM's KV pool at its largest size and returns the bytes of the blocks it holds
back while the draft is resident. The KV tensors' addresses must never change (vLLM's block tables,
its attention metadata and CUDA graphs hold them), so the pool is an ``Arena``: ``size`` bytes at
``ptr`` in ``chunk``-sized pieces; ``unmap`` returns whole chunks' memory to the OS or the device,
``map`` backs them again at the same addresses. Two implementations behind this one interface:

* ``HostArena`` (CPU): anonymous ``mmap``; ``unmap`` is ``madvise(MADV_DONTNEED)``, ``map`` needs
  no call (a touched page is committed again, zero-filled).
* ``cuda_vmm.VmmArena`` (CUDA): a reserved virtual address range backed by physical chunks
  (``cuMemCreate``/``cuMemMap``); device memory is not committed on touch, so ``map`` must run
  before the scheduler hands those blocks out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import threading
from collections.abc import Callable
from typing import Any

PAGE = 4096
MADV_DONTNEED = 4
_BACKED, _FREE = b"\x01", b"\x00"


def chunks_inside(start: int, end: int, chunk: int) -> range:
    """Indices of the ``chunk``-sized chunks wholly inside ``[start, end)`` (offsets in the range):
    what may be unmapped without touching a byte outside."""
    first = -(-start // chunk)
    last = end // chunk
    return range(first, max(first, last))


def chunks_touching(start: int, end: int, chunk: int) -> range:
    """Indices of the chunks holding any byte of ``[start, end)``: what must be mapped to use it."""
    return range(start // chunk, max(start // chunk, -(-end // chunk)))


class Arena:
    """``size`` bytes at ``ptr`` in ``chunk``-sized pieces, all backed at first. Offsets are relative
    to ``ptr``. Subclasses set ``ptr`` and implement ``_back``/``_drop`` for a run of chunks
    ``[a, b)``; ``_back`` leaves nothing half-mapped when it raises, and ``_drop`` marks the chunks it
    had freed before it raised. ``map`` and ``unmap`` hold a lock: the worker agent maps on a
    background thread (off the engine step) while the engine thread may release."""

    zero_filled = False  # fresh memory reads as zeros
    map_is_bookkeeping = False  # ``_back`` does no work (nothing to take off the engine step)

    def __init__(self, size: int, chunk: int) -> None:
        self.chunk = chunk
        self.size = -(-size // chunk) * chunk
        self.ptr = 0
        self._state = bytearray(_BACKED * (self.size // chunk))  # one byte per chunk: C-speed run search
        self._lock = threading.Lock()

    def _back(self, a: int, b: int) -> None:
        raise NotImplementedError

    def _drop(self, a: int, b: int) -> None:
        raise NotImplementedError

    def _runs(self, r: range, state: bytes) -> list[tuple[int, int]]:
        """Runs ``[a, b)`` of consecutive chunks in ``r`` that are in ``state``."""
        other = _FREE if state == _BACKED else _BACKED
        out, i = [], r.start
        while i < r.stop:
            a = self._state.find(state, i, r.stop)
            if a < 0:
                break
            b = self._state.find(other, a, r.stop)
            b = r.stop if b < 0 else b
            out.append((a, b))
            i = b
        return out

    def _flip(self, r: range, state: bytes, op: Callable[[int, int], None], new: bytes) -> int:
        """``op`` on each run of chunks in ``r`` that are in ``state``, which are then ``new``; bytes done."""
        n = 0
        with self._lock:
            for a, b in self._runs(r, state):
                op(a, b)
                self._state[a:b] = new * (b - a)
                n += (b - a) * self.chunk
        return n

    def map(self, start: int, end: int) -> int:
        """Back every chunk holding a byte of ``[start, end)`` that is not backed (rounding outward:
        a block whose chunk it shares with held-out blocks must be usable); returns the bytes mapped.
        Their contents are undefined (the caller treats those KV blocks as free)."""
        return self._flip(chunks_touching(start, end, self.chunk), _FREE, self._back, _BACKED)

    def unmap(self, start: int, end: int) -> int:
        """Return the memory of every backed chunk wholly inside ``[start, end)`` (rounding inward:
        never a byte outside); the addresses stay reserved. Returns the bytes released. Nothing may
        touch them until ``map`` (on CUDA it faults)."""
        return self._flip(chunks_inside(start, end, self.chunk), _BACKED, self._drop, _FREE)

    def mapped_bytes(self) -> int:
        return self._state.count(_BACKED) * self.chunk

    def is_mapped(self, start: int, end: int) -> bool:
        """Every byte of ``[start, end)`` backed."""
        r = chunks_touching(start, end, self.chunk)
        return self._state.find(_FREE, r.start, r.stop) < 0

    def tensor(self) -> Any:
        """The whole range as a flat uint8 torch tensor on the arena's device (no copy)."""
        raise NotImplementedError

    def close(self) -> None:
        """Give the whole range back; no tensor made from it may be used after."""


class HostArena(Arena):
    """Anonymous host memory (CPU KV pools). The mapping lives as long as any tensor made from it."""

    zero_filled = True  # and committed only when touched: held-back blocks never cost memory
    map_is_bookkeeping = True

    def __init__(self, size: int, chunk: int = PAGE) -> None:
        import torch

        super().__init__(size, chunk)
        mm = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._t = torch.frombuffer(mm, dtype=torch.uint8)  # holds the mapping; zero-filled, committed on touch
        self.ptr = self._t.data_ptr()
        lib = ctypes.util.find_library("c")
        self._libc = ctypes.CDLL(lib, use_errno=True)
        self._libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def _back(self, a: int, b: int) -> None:
        pass  # the next touch commits a zero page

    def _drop(self, a: int, b: int) -> None:
        s, n = self.ptr + a * self.chunk, (b - a) * self.chunk
        if self._libc.madvise(ctypes.c_void_p(s), ctypes.c_size_t(n), MADV_DONTNEED) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise(MADV_DONTNEED) failed on KV range [{s:#x}, {s + n:#x})")

    def tensor(self) -> Any:
        return self._t
