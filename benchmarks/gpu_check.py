"""``make gpu-check``: the GPU measurements in one run (under 8 minutes on one H100/H200 class GPU).

Needs only PyTorch with CUDA and ``cuda-bindings`` (no vLLM, no pydantic, no model downloads), so
it runs on a bare GPU machine: ``PYTHONPATH=worker:contract:. python3 -m benchmarks.gpu_check``. Writes into
``$NIGHTJAR_GPU_CHECK_OUT`` (default ``build/gpu-check``):

1. **KV page release** (``memory/cuda_vmm.py``, ``kv_pool.py``, ``kv_elastic.KVPageReleaser``): a KV
   pool of vLLM's FlashAttention layout in CUDA virtual memory, allocated as the worker allocates it; bytes returned to ``torch.cuda.mem_get_info`` per released block, base blocks'
   data intact across unmap/map, time per unmap/map.
2. **Draft offload/reload over PCIe** (``memory/weight_mover.py``, pinned host memory, side stream)
   while the target's decode step (a CUDA graph) runs on the compute stream: GB/s each way, and the
   slowest step during the reload against the median step (target <= 1.5x).
3. **Step-time profile**: random-weight models of real shapes (Llama-3.1-8B target; Llama-3.2-1B and
   Qwen2.5-0.5B-shaped drafts; bf16; attention reading the whole KV cache as paged attention does),
   one CUDA graph per (batch, gamma) like vLLM's: target verify at batch 1..256 x gamma 0..4, draft
   step, prefill rate. Written as ``CostProfile`` JSON (``profiles/gpu-*.json``) with the GPU's name;
   acceptance comes from the real pair measured on CPU (``benchmarks/profiles/cpu-qwen2.5-coder-*``).

Ends with ``RESULT ...``. ``GPU_CHECK_DRY=1`` runs the same code on CPU with tiny shapes (the
script's own test; no figures mean anything there; the KV release runs on a host arena). ``GPU_CHECK_BUDGET_S`` (default 420) stops the
profile early, marked ``truncated``, rather than overrunning the machine's time.
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

    @classmethod
    def for_run(cls, dry: bool) -> Plan:
        if dry:
            return cls("cpu", torch.float32, TINY_T, (TINY_D,), (1, 2, 4), (0, 1, 2), 32, (8, 32), False)
        ctx = int(os.environ.get("GPU_CHECK_CONTEXT", "1024"))
        return cls("cuda", torch.bfloat16, LLAMA_8B, (LLAMA_1B, QWEN_05B), (1, 2, 4, 8, 16, 32, 64, 128, 256),
                   (0, 1, 2, 3, 4), ctx, (128, min(1024, ctx)), True)


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
        total.copy_(_ones(t[:, base:]))
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        total.copy_(_ones(t[:, base:]))
    return g, total


def _heads_equal(layers: list[torch.Tensor], saved: list[torch.Tensor], base: int) -> bool:
    """Blocks < ``base`` of every layer hold exactly what was saved."""
    return all(torch.equal(t[:, :base], x) for t, x in zip(layers, saved, strict=True))


def check_kv_release(plan: Plan) -> dict:
    """On CUDA the pool is a VmmArena; the dry run (CPU) runs the same steps on a HostArena."""
    from nightjar_worker.memory.kv_elastic import KVPageReleaser
    from nightjar_worker.memory.kv_pool import TorchWithPoolZeros, make_arena

    s, blocks, base = plan.target, 2048, 1024
    per_layer = 2 * blocks * BLOCK_TOKENS * s.kv_heads * s.head_dim  # elements: [2, B, N, H, D]
    # the pool's buffer as kv_pool serves vLLM's torch.zeros(size, dtype=int8, device) in the worker
    pool = TorchWithPoolZeros(torch, make_arena)
    flat = pool.zeros(s.layers * per_layer * 2, dtype=torch.int8, device=plan.device).view(torch.bfloat16)
    arena = pool.arena
    layers = [flat[i * per_layer:(i + 1) * per_layer].view(2, blocks, BLOCK_TOKENS, s.kv_heads, s.head_dim)
              for i in range(s.layers)]
    kv = [t.transpose(0, 1) for t in layers]  # logical [B, 2, N, H, D], vLLM's per-layer view
    rel = KVPageReleaser(arena, kv)
    block_bytes = 2 * BLOCK_TOKENS * s.kv_heads * s.head_dim * 2 * s.layers
    for t in layers:
        t.normal_()
    saved = [t[:, :base].clone() for t in layers]  # compared exactly: no float sums that could round
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
            t[:, base:].fill_(1.0)  # the remapped blocks are usable
        sync(plan.device)
        intact = intact_unmapped and _heads_equal(layers, saved, base)
        tail_ok = all(int(_ones(t[:, base:])) == t[:, base:].numel() for t in layers)
    extra = blocks - base
    out = {
        "arena": type(arena).__name__,
        "kv_layout": "[2, blocks, 16, kv_heads, head_dim] per layer (FlashAttention), " + s.name,
        "chunk_bytes": arena.chunk, "blocks": blocks, "released_blocks": extra, "block_bytes": block_bytes,
        "released_bytes": released, "mapped_bytes": mapped,
        "returned_bytes_per_block": statistics.median(returned) / extra,
        "returned_share_of_block": statistics.median(returned) / extra / block_bytes,
        "unmap_s": statistics.median(unmaps), "map_s": statistics.median(maps),
        "unmap_s_per_gib": statistics.median(unmaps) / (released / 2**30),
        "map_s_per_gib": statistics.median(maps) / (mapped / 2**30),
        "base_data_intact": intact, "remapped_blocks_writable": tail_ok,
    }
    if graph is not None:  # captured before the first unmap, replayed on the remapped chunks
        g, total = graph
        g.replay()
        torch.cuda.synchronize()
        out["cuda_graph_replays_after_remap"] = int(total) == layers[0][:, base:].numel()
    del flat, layers, kv, rel, saved
    arena.close()
    return out


def kv_release_passed(kv: dict) -> bool:
    """What must hold before CUDA workers may run elastic memory by default (``availability``)."""
    return (kv.get("returned_share_of_block", 0.0) >= 0.95 and kv.get("base_data_intact") is True
            and kv.get("remapped_blocks_writable") is True and kv.get("cuda_graph_replays_after_remap", True) is True)


def reload_passed(off: dict) -> bool:
    """The draft's reload stretches no decode step beyond 1.5x the median."""
    return off["reload_max_step_ratio"] <= 1.5


# --- 2. draft offload / reload while decoding ---------------------------------------------------------
def check_offload(plan: Plan, target: Decoder, draft: Decoder) -> dict:
    from nightjar_worker.memory.weight_mover import DraftWeightMover

    module = torch.nn.Module()
    module.w = torch.nn.ParameterList([torch.nn.Parameter(t, requires_grad=False) for t in draft.weight_tensors()])
    mover = DraftWeightMover(module, plan.device, host_store="pinned" if plan.device == "cuda" else "memory")
    step = Step(target, min(32, max(plan.batch_sizes)), 1, plan.context, plan)

    def timed_step() -> float:
        t0 = time.perf_counter()
        step.run()
        sync(plan.device)
        return time.perf_counter() - t0

    base = [timed_step() for _ in range(30)]
    phases: dict[str, dict] = {}
    for kind, start in (("offload", mover.start_offload), ("reload", mover.start_reload)):
        task = start()
        steps = []
        while not task.done:
            steps.append(timed_step())
        if task.error:
            raise RuntimeError(f"draft {kind} failed: {task.error}")
        phases[kind] = {"seconds": task.duration_s, "bytes": task.bytes_moved or mover.param_bytes,
                        "gb_per_s": (task.bytes_moved or mover.param_bytes) / task.duration_s / 1e9,
                        "steps_during": len(steps), "max_step_s": max(steps, default=0.0)}
    med = statistics.median(base)
    step.close()
    mover.close()
    return {
        "draft": draft.s.name, "draft_bytes": mover.param_bytes, "decode_batch": step.tokens.shape[0],
        "median_step_s": med, **{f"{k}_{m}": v for k, p in phases.items() for m, v in p.items()},
        "reload_max_step_ratio": phases["reload"]["max_step_s"] / med if phases["reload"]["steps_during"] else 1.0,
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


def main() -> int:
    dry = os.environ.get("GPU_CHECK_DRY") == "1"
    if not dry and not torch.cuda.is_available():
        print("gpu-check: torch sees no CUDA device; on a machine without one run GPU_CHECK_DRY=1 "
              "(tiny shapes on CPU: a test of this script, not a measurement)", file=sys.stderr)
        return 2
    out = Path(os.environ.get("NIGHTJAR_GPU_CHECK_OUT") or "build/gpu-check")
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    deadline = t_start + float(os.environ.get("GPU_CHECK_BUDGET_S", "420"))
    plan = Plan.for_run(dry)
    gpu = torch.cuda.get_device_name(0) if plan.device == "cuda" else "cpu-dry-run"
    summary: dict = {"gpu": gpu, "torch": torch.__version__, "dry_run": dry}
    print(f"gpu-check on {gpu}, torch {torch.__version__}", flush=True)

    def save() -> None:
        (out / "gpu-check.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

    summary["kv_release"] = check_kv_release(plan)
    save()
    print("kv release:", json.dumps(summary["kv_release"]), flush=True)
    tokens = plan.context + max(plan.gammas) + 1
    target = Decoder(plan.target, max(plan.batch_sizes), tokens, plan.device, plan.dtype)
    drafts = [Decoder(s, max(plan.batch_sizes), tokens, plan.device, plan.dtype) for s in plan.drafts]
    prof = profile(plan, target, drafts, deadline)
    summary["profile"] = {"verify_s": prof["verify_s"], "draft_step_s": prof["draft_step_s"],
                          "prefill_fixed_and_per_token_s": prof["prefill"], "truncated": prof["truncated"],
                          "context_tokens": plan.context}
    for slug, p in cost_profiles(plan, prof, target, drafts, gpu).items():
        (out / "profiles" / f"{slug}.json").write_text(json.dumps(p, indent=1) + "\n")
        summary.setdefault("profiles", []).append(f"profiles/{slug}.json")
    save()
    summary["offload"] = check_offload(plan, target, drafts[0])
    summary["wall_s"] = time.monotonic() - t_start
    save()
    kv, off = summary["kv_release"], summary["offload"]
    b1 = min(prof["verify_s"])
    print(f"offload: {json.dumps(off)}", flush=True)
    fields = {
        "gpu": gpu.replace(" ", "_"),
        "kv_returned_share": round(kv.get("returned_share_of_block", math.nan), 3),
        "kv_data_intact": kv.get("base_data_intact", "skipped"),
        "kv_unmap_s_per_gib": round(kv.get("unmap_s_per_gib", math.nan), 5),
        "kv_release_passed": kv_release_passed(kv), "reload_passed": reload_passed(off),
        "offload_gbps": round(off["offload_gb_per_s"], 2), "reload_gbps": round(off["reload_gb_per_s"], 2),
        "reload_max_step_ratio": round(off["reload_max_step_ratio"], 3),
        "verify_b1_g0_ms": round(prof["verify_s"][b1][0] * 1e3, 3),
        "truncated": prof["truncated"], "wall_s": round(summary["wall_s"], 1),
    }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
