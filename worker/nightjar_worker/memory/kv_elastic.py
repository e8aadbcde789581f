"""Turn the offloaded draft's bytes into KV blocks the scheduler really uses.

Mechanism (chosen after reading vLLM 0.32: ``v1/core/block_pool.py``, ``v1/core/kv_cache_manager.py``,
``v1/worker/utils.py::allocate_kv_cache``, ``v1/worker/cpu_model_runner.py``):

* The engine allocates the KV pool for the *larger* size up front (``num_gpu_blocks_override`` =
  base + extra). vLLM puts all layers in one backing allocation; on the CPU backend each layer's
  blocks are contiguous (layer-outermost: ``kv_caches[i]`` is ``[num_blocks, heads, block, 2*dim]``),
  so the extra blocks ``[base, total)`` are one page-aligned byte range per layer.
* Scheduler side (``ElasticBlockPool``): while the draft is resident, every block id >= base is
  held out of vLLM's ``FreeKVCacheBlockQueue`` (removed from the queue, prefix-cache hash evicted so
  no cache hit can resurrect it). The scheduler's own admission and preemption logic then sees a
  base-sized pool; nothing in vLLM is resized. Offloaded: the ids go back to the free queue and vLLM
  uses them like any other block. Draining: free extra ids are pulled out immediately and ids freed
  later are intercepted as requests finish (or are preempted with recompute after a timeout), so a
  running request never loses a block it holds.
* Worker side (``KVPageReleaser``): vLLM's KV pool lives in an ``arena.Arena`` (``kv_pool.py``
  redirects its one backing allocation there). Once no request holds an extra block, the chunks of
  the extra range are unmapped (CPU: ``madvise(MADV_DONTNEED)``, the next touch gets a fresh zero
  page; CUDA: ``cuMemUnmap``), and mapped again before the scheduler may use them. So the committed
  bytes are base blocks + draft while resident and at most base + extra blocks without the draft:
  the budget holds at every moment.

Why not resize vLLM's ``BlockPool``/``KVCacheManager``? Block ids index the worker's preallocated
tensors and the block table; growing them means reallocating and rebinding every layer's KV
tensor in the worker while requests run. Holding ids out of the free queue needs no vLLM change,
and page release makes the held-out part cost nothing.

CUDA: the scheduler side is identical; the arena is ``cuda_vmm.VmmArena``. Until that has passed a
GPU check, CUDA workers run with elastic memory off (``availability.unavailable_reason``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .arena import Arena

log = logging.getLogger("nightjar.memory")


# --- pure helpers ------------------------------------------------------------------------------------
def block_ranges(t: Any, first: int, stop: int | None = None, block_dim: int = 0) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of blocks ``first..stop-1`` (default: all from ``first``) of one KV
    tensor (blocks along ``block_dim``), not rounded: the arena rounds inward to whole chunks after
    the layers' ranges are merged.

    Dimensions with a larger stride than the block dimension (e.g. K/V outside the blocks) split the
    blocks' bytes into one range per index. Where a block does not fill its stride (other layers'
    bytes inside each block: vLLM's block-outermost layouts), every block is a range of its own;
    merged with the other layers' they become contiguous again."""
    n = t.shape[block_dim] if stop is None else min(stop, t.shape[block_dim])
    if first >= n:
        return []
    bs = t.stride(block_dim) * t.element_size()
    inner = [d for d in range(t.dim()) if d != block_dim and t.stride(d) < t.stride(block_dim)]
    outer = [d for d in range(t.dim()) if d != block_dim and t.stride(d) >= t.stride(block_dim) and t.shape[d] > 1]
    span = t.element_size() * (1 + sum((t.shape[d] - 1) * t.stride(d) for d in inner))
    if span > bs:
        raise NotImplementedError(f"kv elastic: blocks of a KV tensor {tuple(t.shape)} strides {t.stride()} overlap")
    starts = [t.data_ptr()]
    for d in outer:
        starts = [p + i * t.stride(d) * t.element_size() for p in starts for i in range(t.shape[d])]
    if span == bs:
        return [(p + first * bs, p + n * bs) for p in starts]
    return [(p + b * bs, p + b * bs + span) for p in starts for b in range(first, n)]


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def plan_extra_blocks(
    total_blocks: int, base_blocks: int | None, draft_bytes: int, block_bytes: int, min_base_blocks: int = 2
) -> tuple[int, int]:
    """(base, extra): ``extra`` blocks the offloaded draft pays for, at most what the pool holds
    above ``base``. ``base_blocks=None``: the pool was sized for the offloaded case.
    ``min_base_blocks``: what one request of ``max_model_len`` needs (vLLM checks the same of its
    pool); a smaller derived base would leave the engine unable to admit requests while the draft is
    resident (it stalls), so it is refused here, at start-up, with the size that would work."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes: must be > 0 (got {block_bytes})")
    gain = draft_bytes // block_bytes
    if base_blocks is None:
        base = total_blocks - gain
        if base < min_base_blocks:
            need = (min_base_blocks + gain) * block_bytes
            raise ValueError(
                f"elastic memory: the KV pool holds {total_blocks} blocks and the resident draft's weights "
                f"({draft_bytes} bytes) take {gain} of them, leaving {max(base, 0)} for requests, fewer than "
                f"one max_model_len request needs ({min_base_blocks}); give the KV cache at least "
                f"{need / 2**30:.2f} GiB (VLLM_CPU_KVCACHE_SPACE / serve --kv-cache-gib) or set base_blocks"
            )
    else:
        if not 2 <= base_blocks <= total_blocks:  # set on purpose (small-pool tests, bench-offload)
            raise ValueError(f"base_blocks: must be in [2, {total_blocks}] (got {base_blocks})")
        base = base_blocks
    return base, min(gain, total_blocks - base)


# --- scheduler side ----------------------------------------------------------------------------------
class ElasticBlockPool:
    """Holds block ids >= ``limit`` out of a vLLM ``BlockPool``'s free queue.

    ``limit`` is the number of blocks the scheduler may use: ``base`` while the draft is resident
    or coming back, ``base + extra`` while it is offloaded. Blocks in ``[base + extra, total)``
    (headroom the draft does not pay for) are held out for ever.
    """

    def __init__(self, block_pool: Any, base: int, extra: int) -> None:
        self.pool = block_pool
        self.total = block_pool.num_gpu_blocks
        if base + extra > self.total:
            raise ValueError(f"kv elastic: base {base} + extra {extra} > pool size {self.total}")
        self.base, self.extra = base, extra
        self.limit = self.total  # vLLM starts with every block free
        self.held: set[int] = set()
        self._orig_free = block_pool.free_blocks
        block_pool.free_blocks = self._free_blocks  # instance attribute: intercept frees of held-out ids
        self.set_limit(base)

    # Blocks are returned through BlockPool.free_blocks; catch ids above the limit on the way back.
    def _free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        blocks = list(ordered_blocks)
        self._orig_free(blocks)
        for b in blocks:
            if b.block_id >= self.limit and b.ref_cnt == 0 and not b.is_null:
                self._hold(b)

    def _hold(self, block: Any) -> None:
        if block.block_id in self.held:
            return
        self.pool.free_block_queue.remove(block)
        if self.pool.enable_caching:
            self.pool._maybe_evict_cached_block(block)  # no prefix-cache hit may touch a held-out block
        self.held.add(block.block_id)

    def set_limit(self, limit: int) -> None:
        """Expose blocks ``< limit``. Lowering it holds free ids at once; busy ones when freed."""
        if not self.base <= limit <= self.base + self.extra:
            raise ValueError(f"kv elastic: limit {limit} outside [{self.base}, {self.base + self.extra}]")
        old, self.limit = self.limit, limit
        if limit > old:  # release held ids back to vLLM
            back = [self.pool.blocks[i] for i in sorted(self.held) if i < limit]
            for b in back:
                self.held.discard(b.block_id)
            self.pool.free_block_queue.append_n(back)
        else:
            self.sweep()

    def sweep(self) -> None:
        for i in range(self.limit, self.total):
            b = self.pool.blocks[i]
            if i not in self.held and b.ref_cnt == 0:
                self._hold(b)

    def busy_above(self, limit: int | None = None) -> list[int]:
        """Ids >= ``limit`` (default: current limit) still owned by requests."""
        lim = self.limit if limit is None else limit
        return [i for i in range(lim, self.total) if i not in self.held and self.pool.blocks[i].ref_cnt > 0]

    @property
    def drained(self) -> bool:
        return not self.busy_above()

    def used_blocks(self) -> int:
        """Blocks owned by requests (null block and held-out ids excluded)."""
        return int(self.total - 1 - self.pool.get_num_free_blocks() - len(self.held))

    def allowed_blocks(self) -> int:
        return int(self.limit - 1)  # the null block is never handed out


def requests_holding(kv_cache_manager: Any, requests: Sequence[Any], ids: set[int]) -> list[Any]:
    """Running requests that own any block id in ``ids`` (drain-timeout preemption candidates)."""
    out = []
    for r in requests:
        try:
            groups = kv_cache_manager.get_block_ids(r.request_id)
        except Exception:  # noqa: BLE001 - request without blocks yet
            continue
        if any(b in ids for g in groups for b in g):
            out.append(r)
    return out


# --- worker side -------------------------------------------------------------------------------------
class KVPageReleaser:
    """Returns and takes back the memory of KV blocks >= ``first`` in every layer tensor; the
    tensors live in ``arena`` (``arena.HostArena`` on CPU, ``cuda_vmm.VmmArena`` on CUDA), where
    ``kv_pool.py`` made vLLM allocate them. ``restore`` runs before the scheduler hands those blocks
    out again (on CUDA, unmapped device memory faults; on CPU it only does the bookkeeping)."""

    def __init__(self, arena: Arena, kv_caches: Sequence[Any]) -> None:
        self.arena = arena
        seen: dict[int, Any] = {}
        for t in kv_caches:
            if not arena.ptr <= t.data_ptr() < arena.ptr + arena.size:
                raise ValueError("kv elastic: a KV tensor does not live in the KV pool's arena (kv_pool.py)")
            seen.setdefault(t.data_ptr(), t)  # layers may alias the same bytes
        self.layers = list(seen.values())
        self.last_s = 0.0

    def ranges(self, first: int, stop: int | None = None) -> list[tuple[int, int]]:
        """Byte ranges (offsets in the arena) of blocks ``first..stop-1``."""
        out = [r for t in self.layers for r in block_ranges(t, first, stop)]
        return [(s - self.arena.ptr, e - self.arena.ptr) for s, e in merge_ranges(out)]

    def release(self, first: int) -> int:
        """Returns the bytes released (their owners must be gone)."""
        t0 = time.perf_counter()
        n = sum(self.arena.unmap(s, e) for s, e in self.ranges(first))
        self.last_s = time.perf_counter() - t0
        return n

    def restore(self, first: int, stop: int | None = None) -> int:
        """Map blocks ``first..stop-1`` again (only those the offloaded draft pays for); returns the bytes."""
        t0 = time.perf_counter()
        ranges = self.ranges(first, stop)
        n = sum(self.arena.map(s, e) for s, e in ranges)
        self.last_s = time.perf_counter() - t0
        if not all(self.arena.is_mapped(s, e) for s, e in ranges):  # the scheduler is about to use them
            raise RuntimeError(f"kv elastic: KV blocks {first}..{stop} not fully mapped after restore")
        return n
