"""``make soak``: a bounded soak of the real worker at temperature 0, every response checked.

One Nightjar-scheduler server (K=4, loopback). For ``--seconds`` (``SOAK_S``, default 2400; QUICK: 120)
Poisson arrivals alternate low and high rates (``bench_dynamic``'s low rate and half its high rate), with the
planner policy rotating through ``nightjar``, ``static-4``, ``ucb`` and ``static-2`` so speculative,
non-speculative and switching steps (draft KV catch-up) all occur. Prompts come from a fixed pool of
Spec-Bench prompts (every category) so each is answered many times under different batch shapes.

Reference: afterwards the *same server* is switched to the planner's ``nosd`` policy (gamma 0 every
step: the runner skips the draft; plain autoregressive decoding) and every pool prompt is decoded once,
alone (concurrency 1), with the top-2 logprobs of each token. Every soak response must equal its
prompt's reference text; for one that does not, the reference token where it departs and that token's
top-2 margin are reported (a near-tie is what bf16 rounding of another GEMM shape can flip). A response that
differs is decoded again alone under ``static-4``: if that equals the reference, speculation is exact
at batch 1 and the difference came from the batch shape (vLLM's CPU bf16 GEMMs are not batch-invariant:
a near-tie can flip under another batch); both counts are reported.

Lost = requests that errored or returned no tokens. RSS of the server's process group (API server,
EngineCore, model-runner worker) is sampled every 2 s; its least-squares slope is reported over the soak
after the first 10% (in total and per process, split into anonymous and file-backed pages: a leak grows
anonymous memory) and over the soak's last third (a bounded cache filling slows down, a leak does not).
Writes ``benchmarks/results/soak[/quick]/{soak.md,results.json}``. Last line:
``RESULT soak_s=.. requests=.. lost=.. different=.. rss_slope_mib_per_h=.. rss_slope_last_third_mib_per_h=..``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from nightjar_worker import loadgen
from nightjar_worker.models import add_pair_argument
from nightjar_worker.serve import ServerProcess

from benchmarks import common, dynamic_lib
from benchmarks.bench_dynamic import trace_spec
from benchmarks.serving import (
    ADMIN_TOKEN,
    GroupRssSampler,
    openai_client,
    pair_args,
    pair_dtype,
    set_cpu_env,
    switch_policy,
)

set_cpu_env()

ROTATION = ("nightjar", "static-4", "ucb", "static-2")
# a reference token chosen over the runner-up by less than this (nats) is a near-tie: bf16 rounding of a
# different GEMM shape (another batch, or verifying 5 tokens at once) can flip it
NEAR_TIE_NATS = 0.25


def soak_phases(spec: dynamic_lib.TraceSpec, segment_s: float) -> list[loadgen.Phase]:
    """One segment: half at the low rate, half at half the trace's high rate (busy, not a growing
    queue); a request still waiting for a slot when its phase ends is not sent (counted as dropped)."""
    return [loadgen.Phase(segment_s / 2, spec.low_rate, spec.low_cap, name="low", drop_late=True),
            loadgen.Phase(segment_s / 2, spec.high_rate / 2, spec.high_cap, name="high", drop_late=True)]


async def decode_alone(url: str, model: str, prompts, max_tokens: int) -> list[loadgen.RequestRecord]:
    client = openai_client(url)
    recs = await loadgen.run_closed_loop(client, model, prompts, 1, len(prompts), max_tokens=max_tokens)
    await client.close()
    return recs


async def reference_decode(url: str, model: str, prompts, max_tokens: int) -> dict[int, dict]:
    """Each prompt alone, not streamed, with the top-2 logprobs of every token: {qid: {text, tokens,
    margins}} where margin = logprob(top 1) - logprob(top 2), nats (how close to a tie the choice was)."""
    client = openai_client(url)
    out: dict[int, dict] = {}
    for p in prompts:
        try:
            r = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": p.text}], max_tokens=max_tokens,
                temperature=0.0, logprobs=True, top_logprobs=2)
        except Exception as e:  # noqa: BLE001 - a failed reference is reported, not fatal
            print(f"  reference for {p.qid} failed: {type(e).__name__}: {e}", flush=True)
            continue
        content = r.choices[0].logprobs.content if r.choices[0].logprobs else []
        out[p.qid] = {
            "text": r.choices[0].message.content or "",
            "tokens": [c.token for c in content],
            "margins": [(c.top_logprobs[0].logprob - c.top_logprobs[1].logprob) if len(c.top_logprobs) > 1
                        else float("inf") for c in content],
        }
    await client.close()
    return out


async def soak_segment(url: str, model: str, prompts, phases, max_tokens: int, seed: int):
    client = openai_client(url)
    recs = await loadgen.run_load(client, model, prompts, phases, max_tokens=max_tokens, temperature=0.0, seed=seed)
    await client.close()
    return recs


def main(argv: list[str] | None = None) -> int:
    quick = common.is_quick()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_argument(ap)
    ap.add_argument("--seconds", type=float, default=120.0 if quick else float(os.environ.get("SOAK_S", "2400")))
    ap.add_argument("--segment-s", type=float, default=None, help="policy rotation period (default: 30 s, "
                    "at most a sixth of the soak so every policy runs)")
    ap.add_argument("--pool", type=int, default=24, help="distinct prompts")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-prompt-chars", type=int, default=1200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.segment_s is None:
        args.segment_s = min(30.0, args.seconds / 6)
    out = args.out or (common.results_dir("soak") / ("quick" if quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    spec = trace_spec(args.pair)
    # prompts that fit max_model_len (1024 tokens) with room to answer: a longer one is a 400, not a loss
    pool = loadgen.mixed_prompts(dynamic_lib.short_prompts(loadgen.load_prompts(), args.max_prompt_chars),
                                 args.pool, seed=5)
    # run_load picks prompts by index into this list (a phase's first arrival index plus the admission
    # rank, modulo its length): the pool cycled in shuffled order
    order = loadgen.mixed_prompts(pool, 4 * args.pool, seed=9)

    srv = ServerProcess([*pair_args(args.pair), "--scheduler", "nightjar"], env={"NIGHTJAR_ADMIN_TOKEN": ADMIN_TOKEN},
                        log_path=out / "server.log")
    t_start = time.perf_counter()
    srv.start()
    print(f"[soak] server ready in {time.perf_counter() - t_start:.0f} s", flush=True)
    assert srv.proc is not None
    rss = GroupRssSampler(os.getpgid(srv.proc.pid))
    records: list[loadgen.RequestRecord] = []
    policy_of: list[str] = []
    try:
        model = srv.model_name()
        asyncio.run(decode_alone(srv.url, model, pool[:2], 8))  # warm-up, not checked
        rss.start()
        t0 = time.perf_counter()
        seg = 0
        while time.perf_counter() - t0 < args.seconds:
            pol = ROTATION[seg % len(ROTATION)]
            switch_policy(srv.url, pol)
            left = args.seconds - (time.perf_counter() - t0)
            recs = asyncio.run(soak_segment(srv.url, model, order, soak_phases(spec, min(args.segment_s, max(left, 2.0))),
                                            args.max_tokens, seed=100 + seg))
            records += recs
            policy_of += [pol] * len(recs)
            print(f"  t={time.perf_counter() - t0:6.0f}s {pol:<9s} {len(recs)} requests, "
                  f"{sum(r.error is not None for r in recs)} errors", flush=True)
            seg += 1
        soak_s = time.perf_counter() - t0
        samples = rss.stop()
        # reference: plain decoding (planner nosd: no draft forward), each prompt alone
        switch_policy(srv.url, "nosd")
        refs = asyncio.run(reference_decode(srv.url, model, pool, args.max_tokens))
        ref = {q: v["text"] for q, v in refs.items()}
        got: dict[int, list[str]] = {}
        lost = 0
        for r in records:
            if r.dropped:
                continue
            if r.error is not None or r.output_tokens == 0:
                lost += 1
                continue
            got.setdefault(r.qid, []).append(r.text)
        verdict = dynamic_lib.compare_texts(got, ref)
        # where each differing response departs from the reference, and how close to a tie that token was
        margins = []
        for r in records:
            if r.error is None and not r.dropped and r.qid in refs and r.text != ref[r.qid]:
                i = dynamic_lib.first_divergence(refs[r.qid]["tokens"], r.text)
                m = refs[r.qid]["margins"][i] if i is not None and i < len(refs[r.qid]["margins"]) else None
                margins.append({"qid": r.qid, "token": i, "margin_nats": m})
        near = sum(1 for d in margins if d["margin_nats"] is not None and d["margin_nats"] < NEAR_TIE_NATS)
        # a differing prompt decoded alone with speculation: exact at batch 1?
        by_qid = {p.qid: p for p in pool}
        recheck = {}
        if verdict["different_qids"]:
            switch_policy(srv.url, "static-4")
            again = asyncio.run(decode_alone(srv.url, model, [by_qid[q] for q in verdict["different_qids"]],
                                             args.max_tokens))
            recheck = {q: r.text == ref.get(q) for q, r in zip(verdict["different_qids"], again, strict=True)}
    finally:
        if rss.is_alive():
            rss.stop()
        srv.stop()

    t_first = samples[0][0] if samples else 0.0
    pts = [(t - t_first, b / 2**20) for t, b in samples]
    steady = [p for p in pts if p[0] >= 0.1 * soak_s]
    slope = dynamic_lib.slope_per_hour(steady)
    # a bounded cache filling (e.g. oneDNN's primitives) decelerates; a leak keeps its pace
    late_slope = dynamic_lib.slope_per_hour([p for p in pts if 2 / 3 * soak_s <= p[0] <= soak_s])
    by_proc = dynamic_lib.rss_slopes_by_process(rss.by_process, t_first + 0.1 * soak_s)
    n = sum(1 for r in records if not r.dropped)
    rows = [
        ["soak seconds", round(soak_s, 1)],
        ["requests (not dropped)", n],
        ["dropped (waited past their phase)", sum(r.dropped for r in records)],
        ["lost (error or no tokens)", lost],
        ["compared with the nosd reference", verdict["same"] + verdict["different"]],
        ["different", verdict["different"]],
        [f"different, departing at a reference near-tie (top-2 margin < {NEAR_TIE_NATS} nats)",
         f"{near}/{len(margins)}"],
        ["margins at the departure (nats)", ", ".join(common.fmt(d["margin_nats"], 2) for d in margins[:20]) or "-"],
        ["differing prompts exact when decoded alone with static-4", f"{sum(recheck.values())}/{len(recheck)}"],
        ["responses per policy", ", ".join(f"{p} {policy_of.count(p)}" for p in ROTATION)],
        ["RSS first / last MiB", f"{pts[0][1]:.0f} / {pts[-1][1]:.0f}" if pts else "-"],
        ["RSS slope MiB/h (after the first 10%)", round(slope, 1) if slope is not None else "-"],
        ["RSS slope MiB/h (last third of the soak)", round(late_slope, 1) if late_slope is not None else "-"],
        *[[f"  {proc}: slope MiB/h all / anon / file", " / ".join(f"{k[x]:.1f}" if k.get(x) is not None else "-"
                                                               for x in ("rss", "anon", "file"))]
          for proc, k in sorted(by_proc.items())],
    ]
    common.print_table(
        f"soak ({args.pair} pair{', QUICK' if quick else ''}, temperature 0, reference: same server, planner "
        f"policy nosd, each prompt alone)", ["what", "value"], rows, out / "soak.md",
        notes="A difference that is exact when the prompt is decoded alone with speculation comes from the batch "
              "shape (CPU bf16 GEMMs are not batch-invariant), not from speculation. A departure at a reference "
              "near-tie is consistent with bf16 rounding of another GEMM shape; one with a clear margin is not.")
    common.write_json(out / "results.json", {
        "soak_s": soak_s, "requests": n, "lost": lost,
        "errors": [f"{r.qid}: {r.error}" for r in records if r.error is not None], "verdict": verdict, "recheck_alone_static4": recheck,
        "rss_mib": pts, "rss_slope_mib_per_h": slope, "rss_slope_last_third_mib_per_h": late_slope,
        "rss_slope_by_process_mib_per_h": by_proc,
        "rss_by_process_mib": [(round(t - t_first, 1), {p: {k: round(b / 2**20, 1) for k, b in kinds.items()}
                                                         for p, kinds in per.items()}) for t, per in rss.by_process],
        "pair": args.pair, "dtype": pair_dtype(args.pair), "quick": quick,
        "divergences": margins, "reference": {str(q): v for q, v in refs.items()},
        "responses": [{"qid": r.qid, "policy": pol, "text": r.text, "error": r.error}
                      for r, pol in zip(records, policy_of, strict=True) if not r.dropped],
    })
    common.print_result(soak_s=round(soak_s), requests=n, lost=lost, different=verdict["different"],
                        rss_slope_mib_per_h=round(slope, 1) if slope is not None else float("nan"),
                        rss_slope_last_third_mib_per_h=round(late_slope, 1) if late_slope is not None else float("nan"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
