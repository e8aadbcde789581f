"""How a verification pass scales with its rows on this CPU: vLLM's packed oneDNN GEMM (what its CPU
backend runs for every linear layer) for the Qwen2.5-Coder-1.5B shapes, in bfloat16 and float32,
for M = 1..16 rows (M = batch x (gamma + 1) tokens in a decode step).

Speculation pays only while a GEMM of (gamma + 1) rows costs about as much as one row (the weights
are read once either way: memory-bound). On a GPU that holds to dozens of rows. Here (AVX-512 BF16,
no AMX) bfloat16 GEMMs are compute-bound from 2 rows, float32 ones stay memory-bound to ~8 rows:
hence ``serve --dtype float32`` for the Qwen pair in the benchmarks (docs/engine.md).

Writes ``build/results/cpu-gemm/{table.md,results.json,gemm_rows.png}``. Last line:
``RESULT bf16_m4_vs_m1=<x> bf16_m1_ms=<x> fp32_m4_vs_m1=<x> fp32_m1_ms=<x>`` (sum over the shapes; a dtype whose oneDNN
GEMM this CPU lacks, e.g. bf16 without AVX-512, is left out and said so).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks.common import RESULTS_ROOT, is_quick

OUT = RESULTS_ROOT / "cpu-gemm"
# Qwen2.5-Coder-1.5B: fused gate/up, down, fused qkv, o; (N, K) of the weight
SHAPES = [(2 * 8960, 1536), (1536, 8960), (1536 + 2 * 256, 1536), (1536, 1536)]
ROWS = [1, 2, 4, 8, 16]


def time_gemm(ops, handle, x, reps: int) -> float:
    for _ in range(2):
        ops.onednn_mm(handle, x, None)
    best = float("inf")
    for _ in range(3):  # best of 3 batches: other processes share these cores
        t = time.perf_counter()
        for _ in range(reps):
            ops.onednn_mm(handle, x, None)
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def plot(ms: dict[str, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, row in ms.items():
        ax.plot(ROWS, [row[m] / row[1] for m in ROWS], marker="o", label=name)
    ax.plot(ROWS, [1.0] * len(ROWS), "k:", label="memory-bound (free rows)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows per GEMM (batch x (gamma+1))")
    ax.set_ylabel("time / time at 1 row")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what the benchmarks' engines use
    import torch
    from vllm import _custom_ops as ops

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.set_flush_denormal(True)
    reps = 3 if is_quick() else 10
    ms: dict[str, dict[int, float]] = {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        try:
            ops.create_onednn_mm(torch.randn(8, 8, dtype=dtype).t(), 32)
        except RuntimeError as e:  # e.g. bf16 on a CPU without AVX-512: vLLM falls back to torch linear
            print(f"{name}: vLLM's oneDNN GEMM is not available on this CPU ({str(e).splitlines()[0]}); "
                  f"its engine runs torch's linear instead. CPU flags: {cpu_simd_flags()}")
            continue
        ms[name] = dict.fromkeys(ROWS, 0.0)
        for n, k in SHAPES:
            w = torch.randn(n, k, dtype=dtype)
            h = ops.create_onednn_mm(w.t(), 32)
            for m in ROWS:
                ms[name][m] += 1e3 * time_gemm(ops, h, torch.randn(m, k, dtype=dtype), reps)
    if not ms:
        print("RESULT error=no_onednn_gemm")
        return 1
    lines = ["| dtype | " + " | ".join(f"M={m} (ms)" for m in ROWS) + " | M=4 / M=1 | M=16 / M=1 |",
             "|---|" + "---|" * (len(ROWS) + 2)]
    for name, row in ms.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.2f}" for m in ROWS)
                     + f" | {row[4] / row[1]:.2f} | {row[16] / row[1]:.2f} |")
    table = "\n".join(lines)
    print("one transformer layer of Qwen2.5-Coder-1.5B (4 GEMMs), vLLM's packed oneDNN GEMM, 1 thread")
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.md").write_text(table + "\n")
    (OUT / "results.json").write_text(json.dumps({"shapes": SHAPES, "ms": ms}, indent=1))
    plot(ms, OUT / "gemm_rows.png")
    keys = {"bfloat16": "bf16", "float32": "fp32"}
    print("RESULT " + " ".join(f"{keys[n]}_m4_vs_m1={r[4] / r[1]:.2f} {keys[n]}_m1_ms={r[1]:.2f}" for n, r in ms.items()))
    return 0


def cpu_simd_flags() -> str:
    """The AVX-512 / AMX flags of this CPU (what oneDNN's bf16 GEMM needs), or a phrase saying none."""
    try:
        words = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "unknown"
    return " ".join(sorted({w for w in words if w.startswith(("avx512", "amx"))})) or "no AVX-512, no AMX"


if __name__ == "__main__":
    raise SystemExit(main())
