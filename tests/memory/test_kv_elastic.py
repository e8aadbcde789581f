import pytest
import torch
from nightjar_worker.memory.arena import HostArena
from nightjar_worker.memory.kv_elastic import (
    ElasticBlockPool,
    KVPageReleaser,
    merge_ranges,
    plan_extra_blocks,
)


def test_merge_ranges():
    assert merge_ranges([(10, 20), (0, 5), (15, 30)]) == [(0, 5), (10, 30)]


def test_plan_extra_blocks():
    assert plan_extra_blocks(100, None, 10_500, 1000) == (90, 10)
    assert plan_extra_blocks(100, 40, 10_500, 1000) == (40, 10)
    assert plan_extra_blocks(45, 40, 10_500, 1000) == (40, 5)  # the pool caps the gain
    with pytest.raises(ValueError, match="base_blocks"):
        plan_extra_blocks(100, 101, 10, 1)
    with pytest.raises(ValueError, match="block_bytes"):
        plan_extra_blocks(100, 40, 10, 0)


def test_a_draft_that_leaves_no_room_for_one_request_is_refused():
    """The Qwen pair in fp32 on a 2 GiB CPU KV cache: the 0.5B draft's weights (3.6 GB as loaded) took the whole
    pool, the base pool was 2 blocks and the engine stalled with requests waiting; now start-up
    fails with the size that works."""
    assert plan_extra_blocks(100, None, 90_000, 1000, min_base_blocks=8) == (10, 90)
    with pytest.raises(ValueError, match=r"leaving 2 for requests.*needs \(8\).*at least 0\.00 GiB"):
        plan_extra_blocks(100, None, 98_000, 1000, min_base_blocks=8)
    with pytest.raises(ValueError, match=r"leaving 0 for requests"):
        plan_extra_blocks(100, None, 150_000, 1000, min_base_blocks=8)
    assert plan_extra_blocks(100, 4, 10_000, 1000, min_base_blocks=8) == (4, 10)  # an explicit base is kept


def _pool(n=20, caching=True):
    from vllm.v1.core.block_pool import BlockPool

    return BlockPool(num_gpu_blocks=n, enable_caching=caching, hash_block_size=16)


def test_block_pool_exposes_base_then_extra_then_drains():
    bp = _pool(20)
    ep = ElasticBlockPool(bp, base=8, extra=8)  # ids 16..19: headroom never exposed
    assert bp.get_num_free_blocks() == 7  # 8 minus the null block
    got = bp.get_new_blocks(7)
    assert max(b.block_id for b in got) < 8
    with pytest.raises(ValueError):
        bp.get_new_blocks(1)
    ep.set_limit(16)  # draft offloaded
    assert bp.get_num_free_blocks() == 8
    extra = bp.get_new_blocks(8)
    assert sorted(b.block_id for b in extra) == list(range(8, 16))
    assert ep.used_blocks() == 15
    # drain: no new extra blocks; busy ones are caught when freed, base ones come back
    ep.set_limit(8)
    assert not ep.drained and set(ep.busy_above()) == set(range(8, 16))
    bp.free_blocks(extra[:5] + got[:2])
    assert bp.get_num_free_blocks() == 2  # only the two base blocks
    assert sorted(ep.busy_above()) == list(range(13, 16))
    bp.free_blocks(extra[5:])
    assert ep.drained and bp.get_num_free_blocks() == 2
    assert all(b.block_id < 8 for b in bp.get_new_blocks(2))
    # cancel / re-offload: the held extra ids come back
    ep.set_limit(16)
    assert bp.get_num_free_blocks() == 8
    with pytest.raises(ValueError, match="limit"):
        ep.set_limit(17)


def test_held_blocks_lose_their_prefix_cache_hash():
    bp = _pool(10)
    ep = ElasticBlockPool(bp, base=4, extra=6)
    ep.set_limit(10)
    blocks = bp.get_new_blocks(9)
    b = next(x for x in blocks if x.block_id == 7)
    b._block_hash = b"h"  # pretend it is cached
    bp.cached_block_hashes_by_block[7] = set()
    ep.set_limit(4)
    bp.free_blocks(blocks)
    assert 7 in ep.held and b.block_hash is None


def test_page_releaser_returns_and_maps_back_the_extra_blocks_memory():
    nblk, base = 64, 16
    arena = HostArena(3 * nblk * 8192)
    flat = arena.tensor().view(torch.bfloat16)
    kv = [flat[i * nblk * 4096:(i + 1) * nblk * 4096].view(nblk, 2, 32, 64) for i in range(3)]  # 8 KiB per block
    for t in kv:
        t.fill_(1)
    rel = KVPageReleaser(arena, kv)
    freed = rel.release(base)
    assert freed == 3 * (nblk - base) * 8192 and arena.mapped_bytes() == arena.size - freed
    assert rel.release(base) == 0  # idempotent: nothing left to return
    for t in kv:
        assert torch.all(t[:base] == 1)  # base blocks untouched
        assert torch.all(t[base:] == 0)  # released pages read back as zero (lazily recommitted)
    assert rel.restore(base) == freed and arena.mapped_bytes() == arena.size
    with pytest.raises(ValueError, match="arena"):
        KVPageReleaser(arena, [torch.ones(nblk, 2, 32, 64)])  # a tensor outside the pool


def test_restore_maps_whole_chunks_around_the_blocks_the_scheduler_gets():
    """Chunks larger than a block (CUDA: 2 MiB): release rounds inward, restore outward, so a block
    that shares its chunk with held-out blocks is backed when the scheduler may use it."""
    nblk, base, stop = 64, 16, 41  # 8 KiB blocks in 16 KiB chunks: block 40 shares one with block 41
    arena = HostArena(nblk * 8192, chunk=16384)
    rel = KVPageReleaser(arena, [arena.tensor().view(torch.bfloat16).view(nblk, 2, 32, 64)])
    assert rel.release(base) == (nblk - base) * 8192
    assert rel.restore(base, stop) == 13 * 16384  # chunks 8..20: blocks 16..41
    assert arena.is_mapped(0, stop * 8192) and not arena.is_mapped(42 * 8192, arena.size)


def test_arena_maps_and_unmaps_whole_chunks_inside_a_range_only():
    a = HostArena(10 * 4096)
    assert a.unmap(100, 3 * 4096 + 5) == 2 * 4096  # chunks 1 and 2: rounded inward
    assert a.unmap(0, 4 * 4096) == 2 * 4096  # chunks 0 and 3: 1 and 2 are unmapped already
    assert a.mapped_bytes() == 6 * 4096
    assert a.map(0, a.size) == 4 * 4096 and a.map(0, a.size) == 0


@pytest.mark.parametrize("layout", ["LBHNC", "BLHNC"])
def test_vllms_kv_allocation_lands_in_the_arena_and_its_tail_can_be_released(layout):
    """vLLM's own ``allocate_kv_cache`` (its layer views included), run inside ``kv_pool_in_arena``:
    every layer's cache lives in the arena, and the blocks above ``base`` of every layer go back."""
    import vllm.v1.worker.utils as vu
    from nightjar_worker.memory.kv_pool import kv_pool_in_arena
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    nb, page, base, layers = 64, spec.page_size_bytes, 40, ["l0", "l1"]
    layer_stride, block_stride = (nb * page, page) if layout.startswith("L") else (page, 2 * page)
    cfg = KVCacheConfig(
        num_blocks=nb, kv_cache_groups=[KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)],
        kv_cache_tensors=[KVCacheTensor(size=2 * nb * page, layers=layers, layer_stride=layer_stride,
                                        block_stride=block_stride)])
    real = vu.torch
    with kv_pool_in_arena() as proxy:
        kv = vu.allocate_kv_cache(cfg, torch.device("cpu"), vu.KVCacheLayout[layout])
        assert vu.torch.zeros(3, dtype=torch.int8).data_ptr() != proxy.arena.ptr  # only the pool's buffer
    assert vu.torch is real and isinstance(proxy.arena, HostArena)
    for t in kv.values():
        t[:base].fill_(1)
        t[base:].fill_(2)
    rel = KVPageReleaser(proxy.arena, list(kv.values()))
    assert rel.release(base) == 2 * (nb - base) * page  # page (8 KiB) is a multiple of the host chunk
    for t in kv.values():
        assert torch.all(t[:base] == 1) and torch.all(t[base:] == 0)


def test_block_ranges_cover_every_vllm_layout_and_only_extra_blocks():
    """Blocks on dim 0 with K/V or heads outside them (strided views of one buffer) give one range
    per outer index, each holding exactly the extra blocks' bytes of that index."""
    import torch
    from nightjar_worker.memory.arena import chunks_inside
    from nightjar_worker.memory.kv_elastic import block_ranges

    blocks, kv, heads, tok, dim = 8, 2, 2, 16, 64  # one block of one head: 16*64*4 = 4096 bytes
    buf = torch.zeros(kv * blocks * heads * tok * dim, dtype=torch.float32)
    flat = buf.view(kv, blocks, heads, tok, dim)  # K/V outermost (FlashAttention's layout)
    got = block_ranges(flat.transpose(0, 1), first=5)  # logical [B, 2, H, N, C]
    p, bs = buf.data_ptr(), heads * tok * dim * 4
    assert got == [(p + 5 * bs, p + 8 * bs), (p + (8 + 5) * bs, p + 16 * bs)]
    assert block_ranges(flat[0], first=5) == [(p + 5 * bs, p + 8 * bs)]  # blocks outermost
    heads_out = buf[: heads * blocks * tok * dim].view(heads, blocks, tok, dim).transpose(0, 1)  # heads outside blocks
    assert len(block_ranges(heads_out, first=6)) == heads
    holes = block_ranges(flat[:, :, :, :8, :].transpose(0, 1), first=5)  # each block leaves a gap: one range per block
    span = ((heads - 1) * tok + 8) * dim * 4
    assert holes == [(p + o + b * bs, p + o + b * bs + span) for o in (0, blocks * bs) for b in (5, 6, 7)]
    assert block_ranges(flat[0], first=8) == []
    assert list(chunks_inside(1, 4 * 2048, 2048)) == [1, 2, 3] and list(chunks_inside(10, 20, 2048)) == []
