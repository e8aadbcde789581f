"""``make gpu-check``: the GPU measurements in one run (under 8 minutes on one H100/H200 class GPU).

Needs only PyTorch with CUDA and ``cuda-bindings`` (no vLLM, no pydantic, no model downloads), so
it runs on a bare GPU machine: ``PYTHONPATH=worker:contract:. python3 -m benchmarks.gpu_check``. Writes into
``$NIGHTJAR_GPU_CHECK_OUT`` (default ``build/gpu-check``):

1. **KV page release** (``memory/cuda_vmm.py``, ``kv_pool.py``, ``kv_elastic.KVPageReleaser``): the GPU
   sample pair's KV pool (Qwen3-8B + Qwen3-0.6B, 2048 blocks) laid out exactly as vLLM 0.32 lays it
   out on CUDA (``KV_LAYOUT_FILE``, derived with vLLM's own code), allocated as the worker allocates it
   (a ``VmmArena``); the draft's worth of blocks released and restored three times: bytes back in
   ``torch.cuda.mem_get_info``, base blocks' data intact (through segment splits), a CUDA graph
   captured before still valid, start-up map and restore times.
2. **Draft offload/reload over PCIe** (``memory/weight_mover.py``, pinned host memory, side stream)
   while the target's decode step (a CUDA graph) runs on the compute stream: GB/s each way, and the
   slowest step during the reload against the median step (target <= 1.5x), each step timed by CUDA
   events on the compute stream (a device-wide synchronize would wait for the copies too).
3. **Step-time profile**: random-weight models of real shapes (Llama-3.1-8B target; Llama-3.2-1B and
   Qwen2.5-0.5B-shaped drafts; bf16; attention reading the whole KV cache as paged attention does),
   one CUDA graph per (batch, gamma) like vLLM's: target verify at batch 1..256 x gamma 0..4, draft
   step, prefill rate. Written as ``CostProfile`` JSON (``profiles/gpu-*.json``) with the GPU's name;
   acceptance comes from the real pair measured on CPU (``benchmarks/profiles/cpu-qwen2.5-coder-*``).

Ends with ``RESULT passed=true|false ...`` (every criterion: ``verdict``) and exits 1 when any failed;
a stage that raises fails its criterion and the others still run. ``GPU_CHECK_DRY=1`` runs the same
code on CPU with tiny shapes (the script's own test; timings there are not judged; the KV release
runs on a host arena). ``GPU_CHECK_BUDGET_S`` (default 300) stops the profile early, marked
``truncated`` (a failed criterion), rather than overrunning the 8 minutes. ``GPU_CHECK_FAIL=<criterion>``
forces one to fail (the tests show the exit status that way).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
ACCEPTANCE_PROFILE = ROOT / "profiles" / "cpu-qwen2.5-coder-1.5b-0.5b-fp32.json"
BLOCK_TOKENS = 16


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    inter: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        hd = self.head_dim
        per_layer = self.hidden * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * self.hidden
        per_layer += 3 * self.hidden * self.inter
        return self.layers * per_layer + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, elem: int = 2) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * elem


LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256)
LLAMA_1B = Shape("Llama-3.2-1B", 16, 2048, 32, 8, 8192, 128256)
QWEN_05B = Shape("Qwen2.5-0.5B", 24, 896, 14, 2, 4864, 128256)  # the target's vocabulary (a pair shares it)
TINY_T = Shape("tiny-target", 2, 128, 4, 2, 256, 1000)
TINY_D = Shape("tiny-draft", 1, 64, 4, 2, 128, 1000)


@dataclass(frozen=True)
class Plan:
    device: str
    dtype: torch.dtype
    target: Shape
    drafts: tuple[Shape, ...]
    batch_sizes: tuple[int, ...]
    gammas: tuple[int, ...]
    context: int  # tokens already in each request's KV cache when a step runs
    prefill_tokens: tuple[int, int]  # two prompt lengths (<= context: the caches are sized for it)
    graphs: bool
    kv_blocks: int  # the KV release check's pool (the pair's real layout; KV_BLOCKS)

    @classmethod
    def for_run(cls, dry: bool) -> Plan:
        if dry:
            return cls("cpu", torch.float32, TINY_T, (TINY_D,), (1, 2, 4), (0, 1, 2), 32, (8, 32), False,
                       KV_BLOCKS["dry"])
        ctx = int(os.environ.get("GPU_CHECK_CONTEXT", "1024"))
        return cls("cuda", torch.bfloat16, LLAMA_8B, (LLAMA_1B, QWEN_05B), (1, 2, 4, 8, 16, 32, 64, 128, 256),
                   (0, 1, 2, 3, 4), ctx, (128, min(1024, ctx)), True, KV_BLOCKS["gpu"])


# --- a decoder of real shapes with random weights ------------------------------------------------------
class Decoder:
    """Llama-style blocks (fused QKV, GQA, SwiGLU, RMSNorm) over a KV cache ``[B, kv_heads, T, d]`` per
    layer. Attention multiplies against the cache directly (one read of K and V per kv head, like a
    paged-attention kernel); rotary embeddings are left out (elementwise, a rounding error of a step)."""

    def __init__(self, s: Shape, max_batch: int, max_tokens: int, device: str, dtype: torch.dtype) -> None:
        self.s = s
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

        hd = s.head_dim
        self.layers = [
            {"qkv": w(s.hidden, (s.heads + 2 * s.kv_heads) * hd), "o": w(s.heads * hd, s.hidden),
             "gate_up": w(s.hidden, 2 * s.inter), "down": w(s.inter, s.hidden)}
            for _ in range(s.layers)
        ]
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.hidden, s.vocab)
        self.k = [torch.zeros(max_batch, s.kv_heads, max_tokens, hd, device=device, dtype=dtype) for _ in range(s.layers)]
        self.v = [torch.zeros_like(t) for t in self.k]

    def weight_tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in layer.values()] + [self.embed, self.lm_head]

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weight_tensors())

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def forward(self, tokens: torch.Tensor, ctx: int, mask: torch.Tensor) -> torch.Tensor:
        """``tokens`` [b, q] at positions ctx..ctx+q-1; returns logits for every position."""
        s, (b, q) = self.s, tokens.shape
        hd, grp = s.head_dim, s.heads // s.kv_heads
        h = self.embed[tokens]
        for i, L in enumerate(self.layers):
            qkv = self._norm(h) @ L["qkv"]
            qh, kh, vh = qkv.split([s.heads * hd, s.kv_heads * hd, s.kv_heads * hd], dim=-1)
            self.k[i][:b, :, ctx : ctx + q] = kh.view(b, q, s.kv_heads, hd).transpose(1, 2)
            self.v[i][:b, :, ctx : ctx + q] = vh.view(b, q, s.kv_heads, hd).transpose(1, 2)
            kc, vc = self.k[i][:b, :, : ctx + q], self.v[i][:b, :, : ctx + q]
            # GQA: the heads of one kv head attend together -> [b, kv, grp*q, d] against [b, kv, T, d]
            qg = qh.view(b, q, s.kv_heads, grp, hd).permute(0, 2, 3, 1, 4).reshape(b, s.kv_heads, grp * q, hd)
            scores = (qg @ kc.transpose(-1, -2)) * (hd ** -0.5) + mask
            att = torch.softmax(scores.float(), dim=-1).to(h.dtype) @ vc
            att = att.view(b, s.kv_heads, grp, q, hd).permute(0, 3, 1, 2, 4).reshape(b, q, s.heads * hd)
            h = h + att @ L["o"]
            gate, up = (self._norm(h) @ L["gate_up"]).chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ L["down"]
        return self._norm(h) @ self.lm_head


def causal_mask(q: int, ctx: int, grp: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [grp*q, ctx+q]: new token i sees the cache and new tokens 0..i."""
    pos = torch.arange(ctx + q, device=device)
    allowed = pos[None, :] <= (ctx + torch.arange(q, device=device))[:, None]
    m = torch.zeros(q, ctx + q, device=device, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return m.repeat(grp, 1)


# --- timing ------------------------------------------------------------------------------------------
def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Step:
    """One forward at a fixed shape, as a CUDA graph on CUDA (what vLLM replays) or eager on CPU."""

    def __init__(self, model: Decoder, batch: int, q: int, ctx: int, plan: Plan) -> None:
        dev = plan.device
        self.device = dev
        self.tokens = torch.randint(0, model.s.vocab, (batch, q), device=dev)
        mask = causal_mask(q, ctx, model.s.heads // model.s.kv_heads, dev, plan.dtype)
        self.fn: Callable[[], torch.Tensor] = lambda: model.forward(self.tokens, ctx, mask)
        self.graph = None
        if plan.graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.fn()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.fn()
        else:
            self.fn()

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()

    def time(self, target_s: float = 0.25, min_reps: int = 3) -> float:
        """Mean seconds of one step: a short estimate, then enough replays for ``target_s``."""
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(min_reps):
            self.run()
        sync(self.device)
        est = (time.perf_counter() - t0) / min_reps
        reps = max(min_reps, min(100, int(target_s / max(est, 1e-6))))
        t0 = time.perf_counter()
        for _ in range(reps):
            self.run()
        sync(self.device)
        return (time.perf_counter() - t0) / reps

    def close(self) -> None:
        self.graph = None
        self.out = None
        if self.device == "cuda":
            torch.cuda.empty_cache()


# --- 1. KV page release ------------------------------------------------------------------------------
# The GPU sample pair's KV cache exactly as vLLM 0.32 lays it out on CUDA (FlashAttention, block size
# 16, the layout vLLM resolves: LBNHC, target and draft layers in one pool). ``derive_kv_layouts``
# computes it from the pair's config.json files with vLLM's own code and writes KV_LAYOUT_FILE; the
# check reads that file (the GPU machine has no vLLM) and ``tests/bench/test_gpu_check.py`` asserts
# the file still equals vLLM's derivation and that ``kv_views`` gives vLLM's own views.
PAIR = ("Qwen3-8B", "Qwen3-0.6B")  # manifests/samples/gpu-pair.yaml
PAIR_CONFIGS = ROOT.parent / "tests" / "fixtures" / "models"
KV_LAYOUT_FILE = ROOT / "kv-layout-qwen3-8b-qwen3-0.6b.json"
KV_BLOCKS = {"dry": 32, "gpu": 2048}  # the check's pool: 128 MiB on CPU, 8 GiB on the GPU


def vllm_kv_cache_config(num_blocks: int) -> tuple[Any, Any, dict[str, Any]]:
    """vLLM's ``(KVCacheConfig, KVCacheLayout, spec per layer)`` for PAIR on CUDA with a pool of
    ``num_blocks``, computed as the GPU worker computes it: the attention layers' specs
    (``FullAttentionSpec`` from vLLM's ``ModelConfig`` of each config.json, customised by the
    FlashAttention backend as ``GPUModelRunner.get_kv_cache_spec`` does; the draft's layers named as
    the ``draft_model`` proposer names them, after the target's), the block size and layout vLLM
    picks for that backend, then ``get_kv_cache_groups`` and ``get_kv_cache_config_from_groups``.
    Needs vLLM (its CPU build is enough)."""
    import types

    from vllm.config import CacheConfig, ModelConfig, ParallelConfig
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec

    par = ParallelConfig()
    block_size = FlashAttentionBackend.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)
    specs: dict[str, Any] = {}
    for prefix, name in zip(("", "draft_model."), PAIR, strict=True):
        # "auto" on CUDA is the checkpoint's dtype (bf16); on a CPU without bf16 it would not be
        dtype = json.loads((PAIR_CONFIGS / name / "config.json").read_text())["torch_dtype"]
        mc = ModelConfig(model=str(PAIR_CONFIGS / name), skip_tokenizer_init=True, dtype=dtype)
        for i in range(mc.get_num_layers(par)):
            spec = FullAttentionSpec(block_size=block_size, num_kv_heads=mc.get_num_kv_heads(par),
                                     head_size=mc.get_head_size(), dtype=mc.dtype)
            specs[f"{prefix}model.layers.{i}.self_attn.attn"] = customize_attention_spec(FlashAttentionBackend, spec)
    vc = types.SimpleNamespace(
        cache_config=CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks),
        parallel_config=par, kv_transfer_config=None, speculative_config=None,
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=types.SimpleNamespace(hisparse_config=None))
    names = [m.name for m in get_supported_kv_cache_layouts([FlashAttentionBackend])]
    layout = resolve_kv_cache_layout(vc, [names], specs.values())
    kc = get_kv_cache_config_from_groups(vc, get_kv_cache_groups(vc, specs), 1 << 50)
    return kc, layout, specs


def derive_kv_layouts(block_counts: tuple[int, ...] = tuple(KV_BLOCKS.values())) -> dict:
    """KV_LAYOUT_FILE's content: for each pool size, vLLM's KV cache tensors for PAIR with the 5-D
    ``[L, B, H, N, C]`` byte shape and strides ``create_kv_cache_views`` views them with."""
    from vllm.v1.kv_cache_interface import compute_layout_strides

    out: dict = {"pair": list(PAIR), "backend": "FLASH_ATTN", "layouts": {}}
    for n in block_counts:
        kc, layout, specs = vllm_kv_cache_config(n)
        tensors = []
        for t in kc.kv_cache_tensors:
            (spec,) = {specs[name] for name in t.layers}
            shape = (len(t.layers), kc.num_blocks, spec.num_heads, spec.num_states, spec.state_content_size_bytes)
            strides = compute_layout_strides(spec, kc.num_blocks, len(t.layers), layout,
                                             fixed_strides=(t.layer_stride, t.block_stride, None, None, None))
            tensors.append({"layers": t.layers, "offset": t.offset, "layer_stride": t.layer_stride,
                            "block_stride": t.block_stride, "page_size_bytes": spec.page_size_bytes,
                            "shape_bytes": list(shape), "strides_bytes": list(strides)})
            out["block_size"], out["dtype"] = spec.block_size, str(spec.dtype).removeprefix("torch.")
        out["layouts"][str(n)] = {"layout": layout.name, "num_blocks": kc.num_blocks,
                                  "size": kc.kv_cache_tensors[0].size, "groups": len(kc.kv_cache_groups),
                                  "tensors": tensors}
    return out


def load_kv_layout(num_blocks: int) -> dict:
    d = json.loads(KV_LAYOUT_FILE.read_text())
    lay = d["layouts"].get(str(num_blocks))
    if lay is None:
        raise ValueError(f"{KV_LAYOUT_FILE.name}: no layout for {num_blocks} blocks (run "
                         "`python -m benchmarks.gpu_check --write-kv-layout` where vLLM is installed)")
    return {**lay, "dtype": d["dtype"], "block_size": d["block_size"]}


def kv_views(raw: torch.Tensor, lay: dict) -> list[torch.Tensor]:
    """One ``[B, H, N, C]`` view per layer of the int8 pool ``raw``, as vLLM's
    ``kv_cache_interface.create_kv_cache_views`` makes them (shape and strides are vLLM's numbers)."""
    dtype = getattr(torch, lay["dtype"])
    out = []
    for t in lay["tensors"]:
        v5 = torch.as_strided(raw, t["shape_bytes"], t["strides_bytes"], raw.storage_offset() + t["offset"])
        out += [v5[i].view(dtype) for i in range(len(t["layers"]))]
    return out


def draft_weight_bytes(name: str = PAIR[1]) -> int:
    """The draft's bf16 weights from its config.json (what the offloaded draft pays KV blocks with):
    embeddings (tied or not), attention with Qwen3's q/k norms, SwiGLU MLP, norms."""
    c = json.loads((PAIR_CONFIGS / name / "config.json").read_text())
    h, hd, nh, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    layer = h * hd * (nh + 2 * nkv) + nh * hd * h + 3 * h * c["intermediate_size"] + 2 * hd + 2 * h
    emb = c["vocab_size"] * h * (1 if c.get("tie_word_embeddings") else 2)
    return 2 * (c["num_hidden_layers"] * layer + emb + h)


def free_bytes(device: str) -> int:
    """Memory the device has free: the driver's count on CUDA; minus this process's RSS on CPU."""
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0]
    with open("/proc/self/statm") as f:
        return -int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _ones(t: torch.Tensor) -> torch.Tensor:
    """How many elements of ``t`` are 1, counted in int64 (exact, unlike a float sum of 2**25 ones)."""
    return (t == 1).sum()


def _tail_count_graph(t: torch.Tensor, base: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A CUDA graph counting the ones in blocks >= ``base`` of ``t``: vLLM's graphs keep the KV
    addresses they captured."""
    total = torch.zeros((), device=t.device, dtype=torch.int64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch requires
        total.copy_(_ones(t[base:]))
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        total.copy_(_ones(t[base:]))
    return g, total


def _heads_equal(layers: list[torch.Tensor], saved: list[torch.Tensor], base: int) -> bool:
    """Blocks < ``base`` of every layer hold exactly what was saved."""
    return all(torch.equal(t[:base], x) for t, x in zip(layers, saved, strict=True))


def check_kv_release(plan: Plan) -> dict:
    """The pair's KV pool as the worker allocates it (``kv_pool``: vLLM's one int8 buffer from an
    arena; a VmmArena on CUDA, a HostArena in the dry run), vLLM's per-layer views into it, and the
    draft's worth of blocks above ``base`` released and restored three times by ``KVPageReleaser``."""
    from nightjar_worker.memory.arena import chunks_inside
    from nightjar_worker.memory.kv_elastic import KVPageReleaser, plan_extra_blocks
    from nightjar_worker.memory.kv_pool import TorchWithPoolZeros, make_arena

    lay = load_kv_layout(plan.kv_blocks)
    blocks = lay["num_blocks"]
    if plan.device == "cuda":
        torch.zeros(1, device="cuda")  # the context exists before the first count of free memory
        free_before = free_bytes(plan.device)
    pool = TorchWithPoolZeros(torch, make_arena)
    t0 = time.perf_counter()
    raw = pool.zeros(lay["size"], dtype=torch.int8, device=plan.device)  # vLLM's allocate_kv_cache call
    sync(plan.device)
    start_s = time.perf_counter() - t0
    arena = pool.arena
    layers = kv_views(raw, lay)
    rel = KVPageReleaser(arena, layers)
    block_bytes = sum(t["page_size_bytes"] * len(t["layers"]) for t in lay["tensors"])
    draft = draft_weight_bytes()
    base, extra = plan_extra_blocks(blocks, None, min(draft, (blocks // 3) * block_bytes), block_bytes)
    whole = sum(len(chunks_inside(s, e, arena.chunk)) * arena.chunk for s, e in rel.ranges(base))
    for t in layers:
        t.normal_()
    saved = [t[:base].clone() for t in layers]  # compared exactly: no float sums that could round
    graph = _tail_count_graph(layers[0], base) if plan.device == "cuda" else None
    unmaps, maps, returned = [], [], []
    for _ in range(3):
        free0 = free_bytes(plan.device)
        released = rel.release(base)
        unmaps.append(rel.last_s)
        returned.append(free_bytes(plan.device) - free0)
        intact_unmapped = _heads_equal(layers, saved, base)
        mapped = rel.restore(base)
        maps.append(rel.last_s)
        for t in layers:
            t[base:].fill_(1.0)  # the remapped blocks are usable
        sync(plan.device)
        intact = intact_unmapped and _heads_equal(layers, saved, base)
        tail_ok = all(int(_ones(t[base:])) == t[base:].numel() for t in layers)
    out = {
        "arena": type(arena).__name__, "pair": "/".join(PAIR),
        "kv_layout": f"vLLM {lay['layout']}: {len(layers)} layers x {blocks} blocks of {lay['block_size']} tokens, "
                     f"[B, H, N, C] views, layer stride {lay['tensors'][0]['layer_stride']}",
        "chunk_bytes": arena.chunk, "segments_at_start": getattr(arena, "segments", lambda: None)(),
        "start_map_s": start_s, "pool_bytes": arena.size,
        "blocks": blocks, "base_blocks": base, "released_blocks": extra, "block_bytes": block_bytes,
        "draft_bytes": draft, "released_bytes": released, "mapped_bytes": mapped,
        "whole_granule_bytes": whole,
        # what the granule rounding keeps of the draft's worth of blocks (layer-outer layout: one edge
        # per layer can fall inside a granule)
        "released_share_of_blocks": released / (extra * block_bytes),
        "returned_share_of_released": statistics.median(returned) / released,
        "unmap_s": statistics.median(unmaps), "map_s": statistics.median(maps),
        "base_data_intact": intact, "remapped_blocks_writable": tail_ok,
    }
    if graph is not None:  # captured before the first unmap, replayed on the remapped memory
        g, total = graph
        g.replay()
        torch.cuda.synchronize()
        out["cuda_graph_replays_after_remap"] = int(total) == layers[0][base:].numel()
        del g, total, graph
    del raw, layers, rel, saved
    arena.close()
    if plan.device == "cuda":  # every segment released and the reservation freed: all of it is back
        torch.cuda.empty_cache()
        out["bytes_not_back_after_close"] = free_before - free_bytes(plan.device)
    return out


def kv_release_passed(kv: dict) -> bool:
    """What must hold before CUDA workers may run elastic memory by default (``availability``): the
    device gets back what was unmapped, which is every whole granule of the released blocks, and all
    of the pool once the arena is closed (64 MiB of slack for what CUDA itself keeps)."""
    return (kv.get("returned_share_of_released", 0.0) >= 0.95 and kv.get("base_data_intact") is True
            and kv.get("released_bytes") == kv.get("mapped_bytes") == kv.get("whole_granule_bytes")
            and kv.get("remapped_blocks_writable") is True and kv.get("cuda_graph_replays_after_remap", True) is True
            and kv.get("bytes_not_back_after_close", 0) <= 64 << 20)


def reload_passed(off: dict) -> bool:
    """The draft's reload stretches no decode step beyond 1.5x the median (compute-stream time)."""
    return off.get("reload_max_step_ratio", math.inf) <= 1.5


# --- 2. draft offload / reload while decoding ---------------------------------------------------------
def check_offload(plan: Plan, target: Decoder, draft: Decoder) -> dict:
    from nightjar_worker.memory.weight_mover import DraftWeightMover

    module = torch.nn.Module()
    module.w = torch.nn.ParameterList([torch.nn.Parameter(t, requires_grad=False) for t in draft.weight_tensors()])
    mover = DraftWeightMover(module, plan.device, host_store="pinned" if plan.device == "cuda" else "memory")
    step = Step(target, min(32, max(plan.batch_sizes)), 1, plan.context, plan)

    def timed_step() -> tuple[float, float]:
        """(the step's time on the compute stream, host launch to its end on that stream). On CUDA
        the first is CUDA events recorded on the current (compute) stream around the graph replay
        and the second waits for that stream alone: a device-wide synchronize would also wait for
        the mover's copies on its side stream, so a mover that overlaps perfectly would read as a
        stall. The second also sees what queues the step behind it (a copy put on the compute
        stream, the mover thread holding the GIL): reported, the criterion is the first."""
        t0 = time.perf_counter()
        if plan.device == "cuda":
            stream = torch.cuda.current_stream()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            step.run()
            end.record(stream)
            end.synchronize()
            return start.elapsed_time(end) / 1e3, time.perf_counter() - t0
        step.run()
        t = time.perf_counter() - t0
        return t, t

    base = [timed_step() for _ in range(30)]
    phases: dict[str, dict] = {}
    for kind, begin in (("offload", mover.start_offload), ("reload", mover.start_reload)):
        task = begin()
        steps = []
        while not task.done:
            steps.append(timed_step())
        if task.error:
            raise RuntimeError(f"draft {kind} failed: {task.error}")
        phases[kind] = {"seconds": task.duration_s, "bytes": task.bytes_moved or mover.param_bytes,
                        "gb_per_s": (task.bytes_moved or mover.param_bytes) / task.duration_s / 1e9,
                        "steps_during": len(steps), "max_step_s": max((g for g, _ in steps), default=0.0),
                        "max_latency_s": max((h for _, h in steps), default=0.0)}
    med = statistics.median(g for g, _ in base)
    med_lat = statistics.median(h for _, h in base)
    step.close()
    mover.close()
    during = phases["reload"]["steps_during"]
    return {
        "draft": draft.s.name, "draft_bytes": mover.param_bytes, "decode_batch": step.tokens.shape[0],
        "median_step_s": med, "median_latency_s": med_lat,
        **{f"{k}_{m}": v for k, p in phases.items() for m, v in p.items()},
        "reload_max_step_ratio": phases["reload"]["max_step_s"] / med if during else 1.0,
        "reload_max_latency_ratio": phases["reload"]["max_latency_s"] / med_lat if during else 1.0,
        "step_timing": "CUDA events on the compute stream" if plan.device == "cuda" else "host clock (CPU)",
    }


# --- 3. step-time profile -------------------------------------------------------------------------------
def prefill_rate(model: Decoder, plan: Plan) -> tuple[float, float]:
    """(fixed s, s per token) of one request's prefill, from two prompt lengths."""
    ts = []
    for n in plan.prefill_tokens:
        st = Step(model, 1, n, 0, replace(plan, graphs=False))
        ts.append(st.time(0.2))
        st.close()
    (n0, n1), (t0, t1) = plan.prefill_tokens, ts
    per = max((t1 - t0) / (n1 - n0), 1e-9)
    return max(t0 - per * n0, 0.0), per


def profile(plan: Plan, target: Decoder, drafts: list[Decoder], deadline: float) -> dict:
    verify: dict[int, dict[int, float]] = {}
    draft_step: dict[str, dict[int, float]] = {d.s.name: {} for d in drafts}
    truncated = False
    for b in plan.batch_sizes:
        if time.monotonic() > deadline:
            truncated = True
            break
        verify[b] = {}
        for g in plan.gammas:
            st = Step(target, b, g + 1, plan.context, plan)
            verify[b][g] = st.time()
            st.close()
        for d in drafts:
            st = Step(d, b, 1, plan.context, plan)
            draft_step[d.s.name][b] = st.time()
            st.close()
        print(f"  batch {b:4d}: verify " + " ".join(f"g{g}={verify[b][g] * 1e3:.2f}ms" for g in plan.gammas)
              + "; draft " + " ".join(f"{n}={v[b] * 1e3:.2f}ms" for n, v in draft_step.items()), flush=True)
    prefill = {m.s.name: prefill_rate(m, plan) for m in [target, *drafts]}
    return {"verify_s": verify, "draft_step_s": draft_step, "prefill": prefill, "truncated": truncated}


def cost_profiles(plan: Plan, prof: dict, target: Decoder, drafts: list[Decoder], gpu: str) -> dict[str, dict]:
    """One CostProfile (the simulator's format, ``sim/profile.py``) per draft."""
    acc_src = json.loads(ACCEPTANCE_PROFILE.read_text())
    bs = sorted(prof["verify_s"])
    total_mem = torch.cuda.get_device_properties(0).total_memory if plan.device == "cuda" else 24 << 30
    kv_block = BLOCK_TOKENS * plan.target.kv_bytes_per_token(2 if plan.dtype != torch.float32 else 4)
    out = {}
    for d in drafts:
        dname = d.s.name
        steps = [[prof["verify_s"][b][g] + g * prof["draft_step_s"][dname][b] for g in plan.gammas] for b in bs]
        fixed, per_tok = prof["prefill"][dname]
        free = 0.9 * total_mem - target.weight_bytes() - d.weight_bytes() - (4 << 30)
        slug = f"gpu-{gpu.lower().replace(' ', '-')}-{plan.target.name.lower()}-{dname.lower()}"
        out[slug] = {
            "name": slug,
            "device": f"{gpu} (measured by make gpu-check: random-weight {plan.dtype}, CUDA graphs "
                      f"{'on' if plan.graphs else 'off'}, context {plan.context} tokens"
                      f"{', TRUNCATED' if prof['truncated'] else ''})",
            "target": plan.target.name, "draft": dname, "block_tokens": BLOCK_TOKENS,
            "kv_blocks_total": max(1, int(free // kv_block)), "draft_weight_bytes": d.weight_bytes(),
            "kv_block_bytes": kv_block, "max_batch": max(bs), "batch_sizes": bs, "gammas": list(plan.gammas),
            "step_time_s": steps,
            # Acceptance is a property of the model pair's weights, which random weights do not have:
            # the real Qwen2.5-Coder 1.5B/0.5B pair's rates as measured on CPU (ACCEPTANCE_PROFILE).
            "acceptance": acc_src["acceptance"],
            "switch_cost_fixed_s": fixed, "switch_cost_per_token_s": per_tok, "draft_prefill_s_per_token": per_tok,
            "prompt_tokens_per_output_token": 0.0,
        }
    return out


CRITERIA = ("kv_release", "reload", "profile_complete", "fits_8_min")
WALL_LIMIT_S = 480.0


def verdict(kv: dict, off: dict, truncated: bool, wall_s: float, inject: str = "",
            timed: bool = True) -> dict[str, bool | None]:
    """Every criterion of the run: True, False, or None where not judged (step timings in the dry
    run: CPU threads on shared cores say nothing about CUDA streams). ``inject`` (``GPU_CHECK_FAIL``,
    comma-separated names) forces some False: the tests' way to show a failed criterion fails the run."""
    got: dict[str, bool | None] = {
        "kv_release": kv_release_passed(kv), "reload": reload_passed(off) if timed else None,
        "profile_complete": not truncated, "fits_8_min": wall_s <= WALL_LIMIT_S}
    forced = {n.strip() for n in inject.split(",") if n.strip()}
    unknown = forced - set(CRITERIA)
    if unknown:
        raise ValueError(f"GPU_CHECK_FAIL: unknown criteria {sorted(unknown)} (known: {', '.join(CRITERIA)})")
    return {k: False if k in forced else v for k, v in got.items()}


def passed(crit: dict[str, bool | None]) -> bool:
    return all(v is not False for v in crit.values())


def main() -> int:
    if sys.argv[1:] == ["--write-kv-layout"]:
        KV_LAYOUT_FILE.write_text(json.dumps(derive_kv_layouts(), indent=1) + "\n")
        print(f"wrote {KV_LAYOUT_FILE}")
        return 0
    dry = os.environ.get("GPU_CHECK_DRY") == "1"
    inject = os.environ.get("GPU_CHECK_FAIL", "")
    verdict({}, {}, False, 0.0, inject)  # a misspelt criterion fails now, not after minutes
    if not dry and not torch.cuda.is_available():
        print("gpu-check: torch sees no CUDA device; on a machine without one run GPU_CHECK_DRY=1 "
              "(tiny shapes on CPU: a test of this script, not a measurement)", file=sys.stderr)
        return 2
    out = Path(os.environ.get("NIGHTJAR_GPU_CHECK_OUT") or "build/gpu-check")
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    deadline = t_start + float(os.environ.get("GPU_CHECK_BUDGET_S", "300"))
    plan = Plan.for_run(dry)
    gpu = torch.cuda.get_device_name(0) if plan.device == "cuda" else "cpu-dry-run"
    summary: dict = {"gpu": gpu, "torch": torch.__version__, "dry_run": dry, "errors": {}}
    print(f"gpu-check on {gpu}, torch {torch.__version__}", flush=True)

    def save() -> None:
        (out / "gpu-check.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

    def stage(name: str, fn: Callable[[], dict]) -> dict:
        """A stage that raises fails its criterion; the others still run and report."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - reported on the RESULT line and in the JSON
            import traceback

            traceback.print_exc()
            summary["errors"][name] = f"{type(e).__name__}: {e}"
            return {}

    summary["kv_release"] = kv = stage("kv_release", lambda: check_kv_release(plan))
    save()
    print("kv release:", json.dumps(kv), flush=True)
    tokens = plan.context + max(plan.gammas) + 1
    target = Decoder(plan.target, max(plan.batch_sizes), tokens, plan.device, plan.dtype)
    drafts = [Decoder(s, max(plan.batch_sizes), tokens, plan.device, plan.dtype) for s in plan.drafts]
    prof = stage("profile", lambda: profile(plan, target, drafts, deadline))
    if prof:
        summary["profile"] = {"verify_s": prof["verify_s"], "draft_step_s": prof["draft_step_s"],
                              "prefill_fixed_and_per_token_s": prof["prefill"], "truncated": prof["truncated"],
                              "context_tokens": plan.context}
        for slug, p in cost_profiles(plan, prof, target, drafts, gpu).items():
            (out / "profiles" / f"{slug}.json").write_text(json.dumps(p, indent=1) + "\n")
            summary.setdefault("profiles", []).append(f"profiles/{slug}.json")
    save()
    summary["offload"] = off = stage("offload", lambda: check_offload(plan, target, drafts[0]))
    summary["wall_s"] = wall = time.monotonic() - t_start
    print(f"offload: {json.dumps(off)}", flush=True)
    crit = verdict(kv, off, prof.get("truncated", True), wall, inject, timed=plan.device == "cuda")
    summary["criteria"], summary["passed"] = crit, passed(crit)
    summary["injected_failures"] = inject or None
    save()
    b1 = min(prof["verify_s"]) if prof else None
    fields = {
        "gpu": gpu.replace(" ", "_"), "passed": str(summary["passed"]).lower(),
        **{f"{k}_passed": "skipped" if v is None else str(v).lower() for k, v in crit.items()},
        "kv_returned_share": round(kv.get("returned_share_of_released", math.nan), 3),
        "kv_released_share_of_blocks": round(kv.get("released_share_of_blocks", math.nan), 3),
        "kv_data_intact": kv.get("base_data_intact", "error"),
        "kv_unmap_s": round(kv.get("unmap_s", math.nan), 5), "kv_restore_s": round(kv.get("map_s", math.nan), 5),
        "offload_gbps": round(off.get("offload_gb_per_s", math.nan), 2),
        "reload_gbps": round(off.get("reload_gb_per_s", math.nan), 2),
        "reload_max_step_ratio": round(off.get("reload_max_step_ratio", math.nan), 3),
        "reload_max_latency_ratio": round(off.get("reload_max_latency_ratio", math.nan), 3),
        "verify_b1_g0_ms": round(prof["verify_s"][b1][0] * 1e3, 3) if prof else "error",
        "errors": ",".join(summary["errors"]) or "none", "wall_s": round(wall, 1),
    }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    if not summary["passed"]:
        print("gpu-check: FAILED: " + ", ".join(k for k, v in crit.items() if v is False)
              + (f" (injected: {inject})" if inject else ""), file=sys.stderr, flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
