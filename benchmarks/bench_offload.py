"""``make bench-offload``: elastic draft memory at saturation on the bundled CPU pair, in one engine run.

Phases (one vLLM engine, NightjarScheduler + ElasticMemoryManager, pinned through the control file):
  A. draft RESIDENT: a burst of N requests (saturation: the KV pool, not max_num_seqs, caps the batch);
  B. draft OFFLOADED (its bytes given to the KV cache): the same burst;
  C. reload under load: the draft is brought back while L requests decode autoregressively.
Measured: max concurrently running requests, throughput, p99 TTFT (A vs B); KV blocks gained vs draft
bytes / block bytes; reload duration; the longest decode step during the reload vs the median decode
step; worker RSS (sampled at 50 Hz) per phase vs the resident budget; requests lost (not finished with
exactly max_tokens tokens).

The KV budget is deliberately small (``--base-blocks`` blocks of 32 tokens, about 36 MB with the
draft's KV layers) so the draft's bytes (its weights plus the packed copies vLLM's CPU GEMMs keep)
matter at saturation. gamma is forced to 0 (``NIGHTJAR_FORCE_GAMMA=0``): at saturation the planner
picks AR anyway, and the comparison is about KV capacity.

Last line: ``RESULT blocks_gained_ratio=.. reload_stall_ratio=.. ttft_p99_gain=.. lost_requests=..``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import RESULTS_ROOT, is_quick

RESULTS = RESULTS_ROOT
BLOCK = 32


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def read_trace(path: str) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


class RssSampler(threading.Thread):
    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.period = pid, period_s
        self.samples: list[tuple[float, int]] = []
        self.stop_ev = threading.Event()
        self.page = os.sysconf("SC_PAGE_SIZE")

    def run(self) -> None:
        while not self.stop_ev.is_set():
            try:
                with open(f"/proc/{self.pid}/statm") as f:
                    self.samples.append((time.time(), int(f.read().split()[1]) * self.page))
            except OSError:
                return
            time.sleep(self.period)

    def max_between(self, t0: float, t1: float) -> int:
        return max((r for t, r in self.samples if t0 <= t <= t1), default=0)


def prompts(n: int) -> list[str]:
    from nightjar_worker.loadgen import load_prompts

    texts = [p.text for p in load_prompts() if 40 <= len(p.text) <= 400]
    return [texts[i % len(texts)] for i in range(n)]


def run_burst(engine, texts: list[str], max_tokens: int, tag: str) -> dict:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t_sub: dict[str, float] = {}
    ttft: dict[str, float] = {}
    done: dict[str, int] = {}
    t0 = time.time()
    for i, p in enumerate(texts):
        rid = f"{tag}-{i}"
        t_sub[rid] = time.time()
        engine.add_request(rid, p, sp)
    while engine.has_unfinished_requests():
        for o in engine.step():
            now = time.time()
            n = len(o.outputs[0].token_ids) if o.outputs else 0
            if o.request_id not in t_sub:  # a request of an earlier phase
                continue
            if n and o.request_id not in ttft:
                ttft[o.request_id] = now - t_sub[o.request_id]
            if o.finished:
                done[o.request_id] = n
    t1 = time.time()
    ok = sum(1 for rid in t_sub if done.get(rid) == max_tokens)
    return {
        "t0": t0, "t1": t1, "requests": len(texts), "ok": ok, "lost": len(texts) - ok,
        "throughput_tok_s": sum(done.values()) / (t1 - t0),
        "ttft_p50_s": pct(list(ttft.values()), 50), "ttft_p99_s": pct(list(ttft.values()), 99),
    }


def drive_until(engine, trace_path: str, state: str, timeout_s: float = 300.0) -> float:
    """Steps tiny requests (the manager acts inside schedule()) until the draft reaches ``state``."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    t0 = time.time()
    i = 0
    while time.time() - t0 < timeout_s:
        evs = [e for e in read_trace(trace_path) if e.get("event") == "transition"]
        if evs and evs[-1]["to"] == state:
            while engine.has_unfinished_requests():  # leave no request behind for the next phase
                engine.step()
            return time.time() - t0
        if not engine.has_unfinished_requests():
            engine.add_request(f"drive-{state}-{i}", "Hi", sp)
            i += 1
        engine.step()
        time.sleep(0.005)
    raise TimeoutError(f"draft did not reach state {state} within {timeout_s}s")


def main() -> None:
    ap = argparse.ArgumentParser()
    quick = is_quick()
    ap.add_argument("--requests", type=int, default=24 if quick else 48)
    ap.add_argument("--max-tokens", type=int, default=32 if quick else 64)
    ap.add_argument("--reload-load", type=int, default=4, help="requests decoding during the reload")
    ap.add_argument("--base-blocks", type=int, default=40)
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args()

    os.environ.setdefault("NIGHTJAR_FORCE_GAMMA", "0")
    os.environ.setdefault("NIGHTJAR_CONFIG_POLL_S", "0")
    from nightjar_worker.engine.engine_args import engine_kwargs
    from nightjar_worker.models import bundled_pair
    from vllm import EngineArgs, LLMEngine

    target, draft = bundled_pair()
    tmp = Path(tempfile.mkdtemp(prefix="nightjar-bench-offload-"))
    ctl, trace = tmp / "control", tmp / "trace.jsonl"
    ctl.write_text("resident")
    tcfg = json.loads((Path(target) / "config.json").read_text())
    dcfg = json.loads((Path(draft) / "config.json").read_text())
    head = tcfg.get("head_dim") or tcfg["hidden_size"] // tcfg["num_attention_heads"]
    layers = tcfg["num_hidden_layers"] + dcfg["num_hidden_layers"]
    block_bytes_est = layers * 2 * tcfg["num_key_value_heads"] * head * 2 * BLOCK
    draft_file = sum(p.stat().st_size for p in Path(draft).glob("*.safetensors"))
    # Headroom for the offloaded case: three times the draft checkpoint (vLLM's CPU GEMMs keep packed copies);
    # the part the draft does not pay for stays held back with its pages released (costs no memory).
    headroom = -(-3 * draft_file // block_bytes_est)
    total = args.base_blocks + headroom
    mem = {"enabled": True, "base_blocks": args.base_blocks, "control_file": str(ctl), "trace_file": str(trace),
           "offload_dir": str(tmp)}
    kw = engine_kwargs(target, draft, k=args.k, block_size=BLOCK, num_gpu_blocks_override=total,
                       kv_cache_memory_bytes=total * block_bytes_est, max_num_seqs=256,
                       additional_config={"nightjar_memory": mem})
    t_start = time.time()
    engine = LLMEngine.from_engine_args(EngineArgs(**kw))
    print(f"engine up in {time.time() - t_start:.1f}s", flush=True)
    init = next(e for e in read_trace(str(trace)) if e.get("event") == "init")
    rss = RssSampler(init["worker"]["pid"])
    rss.start()
    texts = prompts(args.requests)

    # warm-up (first-step allocations), then A: resident
    run_burst(engine, texts[:2], 4, "warm")
    a = run_burst(engine, texts, args.max_tokens, "A")
    # B: offloaded
    ctl.write_text("offloaded")
    drive_until(engine, str(trace), "offloaded")
    b = run_burst(engine, texts, args.max_tokens, "B")
    # C: reload while decoding
    # The reload must happen while requests decode. Short "holder" requests admitted while offloaded
    # occupy blocks above the base (more than the base can hold); asking for the draft then starts a
    # drain (the KV limit drops to the base at once), the measured requests are admitted into base
    # blocks and decode, and the weights come back when the holders finish, mid-way through them.
    from vllm import SamplingParams

    hold_sp = SamplingParams(max_tokens=max(8, args.max_tokens // 4), temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(args.requests)):
        engine.add_request(f"hold-{i}", p, hold_sp)
    for _ in range(3):
        engine.step()
    ctl.write_text("resident")
    c_t0 = time.time()
    c = run_burst(engine, prompts(args.reload_load), 4 * args.max_tokens, "C")
    if not any(e.get("to") == "resident" for e in read_trace(str(trace)) if e.get("t", 0) >= c_t0):
        drive_until(engine, str(trace), "resident")
    rss.stop_ev.set()
    rss.join()

    tr = read_trace(str(trace))
    steps = [e for e in tr if "step" in e]
    trans = [e for e in tr if e.get("event") == "transition"]

    def in_window(t0: float, t1: float) -> list[dict]:
        return [e for e in steps if t0 <= e["t"] <= t1]

    max_run_a = max((e["running"] for e in in_window(a["t0"], a["t1"])), default=0)
    max_run_b = max((e["running"] for e in in_window(b["t0"], b["t1"])), default=0)
    max_used_b = max((e["used"] for e in in_window(b["t0"], b["t1"])), default=0)
    extra, base = init["extra_blocks"], init["base_blocks"]
    ratio_den = init["draft_bytes"] / init["block_bytes"]
    blocks_gained_ratio = extra / ratio_den
    reload_evs = [e for e in trans if e["from"] == "reloading" and e["t"] >= c_t0]
    reload_s = reload_evs[0]["duration_s"] if reload_evs else float("nan")
    offload_s = next((e["duration_s"] for e in trans if e["from"] == "offloading"), float("nan"))
    # Decode steps of phase C: the record of on_step(i) carries dt = step i-1's execution plus
    # on_step(i)'s own work (``work_s``: reload slices, KV page release). A step that admitted
    # requests (running grew) was a prefill step and is left out. "During the reload": records whose
    # on_step *began* in RELOADING (a step executed while the weights were coming back, plus the
    # slice done after it) and the record that entered RELOADING (its page release).
    c_steps = in_window(c["t0"], c["t1"])
    by_batch: dict[int, list[float]] = {}  # decode step times outside the reload, per batch size
    dec_reload: list[tuple[int, float, float]] = []  # (batch, dt, work_s)
    for prev, cur in zip(c_steps, c_steps[1:], strict=False):
        if cur["dt"] is None or cur["running"] > prev["running"] or prev["running"] == 0:
            continue
        if prev["state"] == "reloading" or (cur["state"] == "reloading" and prev["state"] != "reloading"):
            dec_reload.append((prev["running"], cur["dt"], cur.get("work_s", 0.0)))
        else:
            by_batch.setdefault(prev["running"], []).append(cur["dt"])
    dec_all = [dt for v in by_batch.values() for dt in v]
    med = statistics.median(dec_all) if dec_all else float("nan")

    def ref_step(batch: int, dt: float, work: float) -> float:
        """The same step without the reload: the median decode step at that batch size (the
        holders make the batch shrink through phase C; a bigger batch is not a stall), or, for a
        batch size seen only during the reload, the step minus the memory hook's own work."""
        same = by_batch.get(batch)
        return statistics.median(same) if same else max(dt - work, 1e-9)

    stall = max((dt / ref_step(b, dt, w) for b, dt, w in dec_reload), default=float("nan"))
    rss_a = rss.max_between(a["t0"], a["t1"])
    rss_b = rss.max_between(b["t0"], b["t1"])
    rss_c = rss.max_between(c["t0"], c["t1"])
    lost = a["lost"] + b["lost"] + c["lost"]
    ttft_gain = a["ttft_p99_s"] / b["ttft_p99_s"] if b["ttft_p99_s"] > 0 else float("nan")

    rows = [
        ("max running requests", max_run_a, max_run_b),
        ("throughput (tok/s)", f"{a['throughput_tok_s']:.1f}", f"{b['throughput_tok_s']:.1f}"),
        ("TTFT p50 (s)", f"{a['ttft_p50_s']:.2f}", f"{b['ttft_p50_s']:.2f}"),
        ("TTFT p99 (s)", f"{a['ttft_p99_s']:.2f}", f"{b['ttft_p99_s']:.2f}"),
        ("KV blocks usable", base - 1, base - 1 + extra),
        ("worker RSS max (MiB)", f"{rss_a / 2**20:.0f}", f"{rss_b / 2**20:.0f}"),
        ("requests lost", a["lost"], b["lost"]),
    ]
    lines = [f"{'':28s} {'resident':>12s} {'offloaded':>12s}"]
    lines += [f"{k:28s} {str(x):>12s} {str(y):>12s}" for k, x, y in rows]
    lines += [
        f"draft bytes {init['draft_bytes']} / block bytes {init['block_bytes']} = {ratio_den:.2f}; "
        f"extra blocks {extra} (ratio {blocks_gained_ratio:.3f}); max blocks used offloaded {max_used_b} "
        f"(base usable {base - 1})",
        f"offload {offload_s:.3f}s, reload {reload_s:.3f}s; decode step median {med * 1e3:.1f} ms, "
        f"max during reload {max((dt for _, dt, _ in dec_reload), default=float('nan')) * 1e3:.1f} ms over {len(dec_reload)} steps, "
        f"reload work per step max {max((w for _, _, w in dec_reload), default=float('nan')) * 1e3:.1f} ms "
        f"(stall ratio against the median step at the same batch size)",
        f"worker RSS max: resident {rss_a / 2**20:.0f} MiB, offloaded {rss_b / 2**20:.0f} MiB, "
        f"during reload {rss_c / 2**20:.0f} MiB",
    ]
    print("\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {
        "quick": quick, "args": vars(args), "init": init, "A": a, "B": b, "C": c,
        "max_running": {"resident": max_run_a, "offloaded": max_run_b}, "max_used_blocks_offloaded": max_used_b,
        "offload_s": offload_s, "reload_s": reload_s, "decode_step_median_s": med,
        "decode_steps_during_reload_s": dec_reload, "rss_max_bytes": {"A": rss_a, "B": rss_b, "C": rss_c},
        "blocks_gained_ratio": blocks_gained_ratio, "reload_stall_ratio": stall, "ttft_p99_gain": ttft_gain,
        "lost_requests": lost,
    }
    (RESULTS / "bench_offload.json").write_text(json.dumps(summary, indent=2, default=str))
    (RESULTS / "bench_offload.md").write_text("```\n" + "\n".join(lines) + "\n```\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t_ref = steps[0]["t"] if steps else 0
        fig, ax = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
        ax[0].plot([e["t"] - t_ref for e in steps], [e["running"] for e in steps], lw=0.8)
        ax[0].set_ylabel("running")
        ax[1].plot([e["t"] - t_ref for e in steps], [e["used"] for e in steps], lw=0.8, label="used")
        ax[1].plot([e["t"] - t_ref for e in steps], [e["allowed"] for e in steps], lw=0.8, label="allowed")
        ax[1].set_ylabel("KV blocks")
        ax[1].legend()
        ts, rs = zip(*rss.samples, strict=False) if rss.samples else ((), ())
        ax[2].plot([t - t_ref for t in ts], [r / 2**20 for r in rs], lw=0.8)
        ax[2].set_ylabel("worker RSS (MiB)")
        ax[2].set_xlabel("time (s)")
        for e in trans:
            for a_ in ax:
                a_.axvline(e["t"] - t_ref, color="grey", lw=0.5, ls=":")
        fig.suptitle("elastic draft memory: resident -> offloaded -> reload under load")
        fig.tight_layout()
        fig.savefig(RESULTS / "bench_offload.png", dpi=110)
    except Exception as e:  # noqa: BLE001
        print(f"(plot skipped: {e})")
    print(
        f"RESULT blocks_gained_ratio={blocks_gained_ratio:.3f} reload_stall_ratio={stall:.2f} "
        f"ttft_p99_gain={ttft_gain:.2f} lost_requests={lost}"
    )


if __name__ == "__main__":
    main()
