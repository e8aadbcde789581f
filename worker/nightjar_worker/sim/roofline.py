"""Analytic roofline cost profile: a 7B-class target with a ~1B draft on an H100-class GPU.

Step time of one decoding step at batch B verifying gamma drafts per request:

    T_target = max((W_t + B*ctx*kv_t) / BW, 2*P_t*B*(gamma+1) / F) + o_t
    T_draft  = gamma * (max((W_d + B*ctx*kv_d) / BW, 2*P_d*B / F) + o_d)

(weights and KV are read once per forward; the target verifies B*(gamma+1) tokens in one forward;
the draft runs gamma sequential forwards of B tokens). Below the ridge (B*(gamma+1) < F/BW tokens)
the target is memory-bound, so verifying extra tokens is nearly free and speculation helps; above
it, every drafted token costs compute, so speculation hurts at large batch. ``o_*`` are per-forward
fixed overheads (launch, sampling, scheduling). C_switch is a draft prefill over the tokens
generated while the draft was off (compute-bound) plus a fixed cost.

Run ``python -m nightjar_worker.sim.roofline [out.json]`` to regenerate the shipped profile.
"""

from __future__ import annotations

import sys

from nightjar_worker.sim.profile import CostProfile

# Acceptance per token of a ~1B same-family draft per Spec-Bench category (assumed; code/maths
# and extraction are easy to draft, open prose and translation hard).
ACCEPTANCE = {
    "writing": 0.62, "roleplay": 0.60, "reasoning": 0.68, "math": 0.78, "coding": 0.80,
    "extraction": 0.78, "stem": 0.66, "humanities": 0.63, "translation": 0.55,
    "summarization": 0.74, "qa": 0.64, "math_reasoning": 0.80,
}
BATCH_SIZES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256]


def target_time(
    b: int, g: int, *, bw: float = 3.35e12 * 0.80, flops: float = 989e12 * 0.35, p_target: float = 7.24e9,
    kv_target: int = 2 * 32 * 8 * 128 * 2, ctx: int = 320, o_target: float = 1.0e-3,
) -> float:
    """The target's forward verifying ``g`` drafts per request at batch ``b`` (no draft forwards):
    a step with drafts proposed on the host (``sim/sources.py``) costs this."""
    return max((2 * p_target + b * ctx * kv_target) / bw, 2 * p_target * b * (g + 1) / flops) + o_target


def verify_grid(gammas: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6)) -> list[list[float]]:
    """``target_time`` over the shipped profile's batch sizes x gammas (the defaults' model)."""
    return [[round(target_time(b, g), 9) for g in gammas] for b in BATCH_SIZES]


def roofline_profile(
    *,
    bw: float = 3.35e12 * 0.80,  # achieved HBM bandwidth (H100 SXM 3.35 TB/s at 80 %)
    flops: float = 989e12 * 0.35,  # achieved dense bf16 throughput (989 TFLOP/s at 35 %)
    p_target: float = 7.24e9,  # Mistral-7B-class, GQA with 8 KV heads
    kv_target: int = 2 * 32 * 8 * 128 * 2,  # bytes of KV per token (K and V, 32 layers, bf16)
    p_draft: float = 1.1e9,  # TinyLlama-1.1B-class draft
    kv_draft: int = 2 * 22 * 4 * 64 * 2,
    ctx: int = 320,  # mean context length of a running request (Spec-Bench-like mix)
    o_target: float = 1.0e-3,
    o_draft: float = 0.35e-3,
    gammas: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6),
    block_tokens: int = 16,
    gpu_bytes: float = 80e9,
    gpu_util: float = 0.9,
    activation_bytes: float = 3e9,
    max_batch: int = 256,
) -> CostProfile:
    w_t, w_d = 2 * p_target, 2 * p_draft

    def step(b: int, g: int) -> float:
        t = target_time(b, g, bw=bw, flops=flops, p_target=p_target, kv_target=kv_target, ctx=ctx, o_target=o_target)
        d = g * (max((w_d + b * ctx * kv_draft) / bw, 2 * p_draft * b / flops) + o_draft)
        return t + d

    kv_block_bytes = block_tokens * kv_target
    free = gpu_bytes * gpu_util - w_t - activation_bytes - w_d
    alpha_all = sum(ACCEPTANCE.values()) / len(ACCEPTANCE)  # unweighted; the simulator uses the mix
    return CostProfile(
        name="roofline-h100-7b",
        device="H100-SXM-80GB (analytic roofline)",
        target="7B-class (Mistral-7B-like, GQA)",
        draft="1.1B-class (TinyLlama-like)",
        block_tokens=block_tokens,
        kv_blocks_total=int(free // kv_block_bytes),
        draft_weight_bytes=int(w_d),
        kv_block_bytes=kv_block_bytes,
        max_batch=max_batch,
        batch_sizes=BATCH_SIZES,
        gammas=list(gammas),
        step_time_s=[[round(step(b, g), 9) for g in gammas] for b in BATCH_SIZES],
        acceptance={**ACCEPTANCE, "all": round(alpha_all, 4)},
        switch_cost_fixed_s=2e-3,
        switch_cost_per_token_s=round(2 * p_draft / flops, 12),
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else "benchmarks/profiles/roofline-h100-7b.json"
    roofline_profile().save(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
