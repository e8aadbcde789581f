"""``make bench-serve``: the real worker under closed-loop load, every policy in one run.

For each policy a fresh server is started on the pair (``--pair``/``PAIR``: bundled or qwen; restart per policy: the baselines
are vLLM's *own* code paths, not imitations inside our scheduler):

* ``nosd``        vLLM scheduler, no draft;
* ``static-k``    vLLM scheduler, ``num_speculative_tokens=k`` (k = 1..4);
* ``vllm-table``  vLLM scheduler, ``num_speculative_tokens_per_batch_size``, tuned the way vLLM's
                  Dynamic SD docs suggest: sweep K per concurrency offline (the static runs above,
                  no-SD counting as K=0) and give each concurrency range its best K;
* ``nightjar``    the Nightjar scheduler with the default runtime config.

Load: the async generator in ``nightjar_worker.loadgen`` (OpenAI client, Poisson arrivals at a
rate far above the service rate, capped at concurrency c, i.e. closed loop at c; Spec-Bench prompts
interleaved by category), temperature 0. Lossless: a fixed prompt set at c=1 on the no-SD server and
on the Nightjar server (and static-4, where the draft surely runs) must give identical text.
Each level is preceded by the same load on other prompts, not measured (``--warmup-waves N`` sends
N times that load, ``--no-warmup`` skips it):
every policy is compared in its steady state, as in a long-running server; an adaptive policy's cold
start is what bench-warmstart and bench-dynamic measure. The Qwen pair serves in float32 on CPU
(``DTYPE`` overrides; docs/engine.md).

Nightjar starts cold unless ``--warm-profile PATH`` (switch mode) gives it the priors derived from a
CostProfile, e.g. the pair's committed ``benchmarks/profiles/cpu-*.json``: what a deployment that
profiled its pair starts from (bench-dynamic's warm start).

Writes ``benchmarks/results/serve/{results.json,table.md,serve.png}`` (switch mode also ``steps.jsonl``,
every step of the shared server, with each policy's window in ``results.json``'s ``windows_unix``). Last line:
``RESULT adaptive_vs_best_static_min=... adaptive_vs_nosd_c1=... adaptive_vs_nosd_sat=... lossless=...``
``QUICK=1``: c in {1, 16} only (16 stands in for saturation on 2 shared cores), 32 output tokens, one wave
of requests per level, and ``--mode switch``: instead
of a server per policy, static-k, the table and Nightjar run on *one* Nightjar-scheduler server
(K=4) whose policy is switched through the admin endpoint between runs (the planner's ``static``
and ``table`` policies have vLLM's semantics; the scheduler trims drafts to the chosen gamma and the
draft proposes exactly gamma tokens, so the steps are the same as vLLM's native static-k); no-SD
runs on the same server with the planner's ``nosd`` policy (gamma 0 every step: the runner skips the
draft entirely; ``--no-nosd-switched`` is not offered, use ``--mode restart`` for a native no-SD
server). Start-up dominates on 2 shared cores (1-15 min per server under load), which is why QUICK
uses one server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from nightjar_worker import loadgen
from nightjar_worker.models import add_pair_argument
from nightjar_worker.serve import ServerProcess

from benchmarks.common import RESULTS_ROOT, is_quick
from benchmarks.serving import (
    ADMIN_TOKEN,
    lossless_verdict,
    pair_args,
    pair_dtype,
    set_cpu_env,
    switch_policy,
    warm_priors,
)

RESULTS = RESULTS_ROOT / "serve"

set_cpu_env()


def policy_args(name: str, table: list[list[int]] | None = None) -> list[str]:
    if name == "nosd":
        return ["--scheduler", "vllm", "--draft", "none"]
    if name.startswith("static-"):
        return ["--scheduler", "vllm", "--num-speculative-tokens", name.split("-")[1]]
    if name == "vllm-table":
        assert table is not None
        return ["--scheduler", "vllm", "--spec-per-batch-size", json.dumps(table)]
    if name == "nightjar":
        return ["--scheduler", "nightjar"]
    raise ValueError(f"policy: unknown {name!r}")


def tuned_table(results: dict[str, dict[int, dict]], concurrencies: list[int]) -> tuple[list[list[int]], dict]:
    """vLLM-style schedule [[start, end, K], ...]: per measured concurrency the best K (0 = no-SD)."""
    best: dict[int, int] = {}
    for c in concurrencies:
        cands = {0: results["nosd"][c]["output_tok_s"]}
        for k in range(1, 5):
            cands[k] = results[f"static-{k}"][c]["output_tok_s"]
        best[c] = max(cands, key=cands.get)
    table = []
    for i, c in enumerate(concurrencies):
        end = concurrencies[i + 1] - 1 if i + 1 < len(concurrencies) else 1024
        table.append([1 if i == 0 else c, end, best[c]])
    return table, best


def _metric_deltas(before: dict, after: dict) -> dict[str, float]:
    d = {}
    for key, name in (
        ("drafted", "vllm:spec_decode_num_draft_tokens_total"),
        ("accepted", "vllm:spec_decode_num_accepted_tokens_total"),
        ("gamma_sum", "nightjar_gamma_chosen_sum"),
        ("gamma_count", "nightjar_gamma_chosen_count"),
        ("batch_sum", "nightjar_batch_size_sum"),
    ):
        d[key] = loadgen.metric_sum(after, name) - loadgen.metric_sum(before, name)
    d["acceptance"] = d["accepted"] / d["drafted"] if d["drafted"] else None
    d["mean_gamma"] = d["gamma_sum"] / d["gamma_count"] if d["gamma_count"] else None
    d["mean_batch"] = d["batch_sum"] / d["gamma_count"] if d["gamma_count"] else None
    return d


async def run_policy(
    server: ServerProcess, concurrencies: list[int], prompts, *, max_tokens: int, n_req, lossless_prompts,
    warmup: int = 0,
) -> tuple[dict[int, dict], list[str] | None]:
    """``warmup``: before each level, that many times the level's load on other prompts, not
    measured (steady state for every policy: an adaptive one has learnt that batch size, as in a
    long-running server)."""
    import httpx
    from openai import AsyncOpenAI

    model = server.model_name()
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", timeout=600, max_retries=0)
    out: dict[int, dict] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        # warm-up (not measured): first requests pay one-off costs
        await loadgen.run_closed_loop(client, model, prompts[-4:], 2, 2, max_tokens=16)
        texts = None
        if lossless_prompts is not None:
            recs = await loadgen.run_closed_loop(client, model, lossless_prompts, 1, len(lossless_prompts),
                                                 max_tokens=max_tokens)
            texts = [r.text if r.error is None else f"<error {r.error}>" for r in recs]
        for c in concurrencies:
            if warmup:
                await loadgen.run_closed_loop(client, model, prompts[len(prompts) // 2 :], c, warmup * n_req(c),
                                              max_tokens=max_tokens)
            before = await loadgen.scrape(http, server.url)
            t0 = time.perf_counter()
            recs = await loadgen.run_closed_loop(client, model, prompts, c, n_req(c), max_tokens=max_tokens)
            s = loadgen.summarize(recs).as_dict()
            after = await loadgen.scrape(http, server.url)
            s.update(_metric_deltas(before, after))
            s["wall_s"] = time.perf_counter() - t0
            out[c] = s
            print(f"  c={c:<3d} {s['output_tok_s']:7.1f} tok/s  TPOT p50 {_ms(s['tpot_p50_s'])} ms  "
                  f"acc {_f(s['acceptance'])}  mean gamma {_f(s['mean_gamma'])}  errors {s['errors']}", flush=True)
    await client.close()
    return out, texts


def _ms(x: float | None) -> str:
    return "   -" if x is None else f"{x * 1000:6.1f}"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def write_table(results: dict[str, dict[int, dict]], concurrencies: list[int], path: Path) -> str:
    lines = [
        "| policy | c | output tok/s | TTFT p50/p99 ms | TPOT p50/p99 ms | E2E p50/p99 s | acceptance | mean gamma |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pol, per_c in results.items():
        for c in concurrencies:
            s = per_c.get(c)
            if s is None:
                continue
            lines.append(
                f"| {pol} | {c} | {s['output_tok_s']:.1f} | {_ms(s['ttft_p50_s']).strip()}/{_ms(s['ttft_p99_s']).strip()} "
                f"| {_ms(s['tpot_p50_s']).strip()}/{_ms(s['tpot_p99_s']).strip()} "
                f"| {s['e2e_p50_s'] or 0:.2f}/{s['e2e_p99_s'] or 0:.2f} | {_f(s['acceptance'])} | {_f(s['mean_gamma'])} |"
            )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def plot(results: dict[str, dict[int, dict]], concurrencies: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for pol, per_c in results.items():
        cs = [c for c in concurrencies if c in per_c]
        style = dict(lw=2.5, color="black") if pol == "nightjar" else dict(lw=1.2, alpha=0.8)
        axes[0].plot(cs, [per_c[c]["output_tok_s"] for c in cs], marker="o", label=pol, **style)
        axes[1].plot(cs, [(per_c[c]["tpot_p50_s"] or math.nan) * 1000 for c in cs], marker="o", label=pol, **style)
        axes[2].plot(cs, [(per_c[c]["e2e_p99_s"] or math.nan) for c in cs], marker="o", label=pol, **style)
    for ax, t in zip(axes, ("output tokens/s", "TPOT p50 (ms)", "E2E p99 (s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    quick = is_quick()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 16] if quick else [1, 2, 4, 8, 16, 32])
    ap.add_argument("--max-tokens", type=int, default=32 if quick else 128)
    ap.add_argument("--policies", nargs="*",
                    default=["nosd", "static-1", "static-2", "static-3", "static-4", "vllm-table", "nightjar"])
    ap.add_argument("--lossless-prompts", type=int, default=3 if quick else 12)
    ap.add_argument("--out", type=Path, default=None, help="default build/results/serve[-<pair>]")
    add_pair_argument(ap)
    ap.add_argument("--nosd-switched", action="store_true", default=quick,
                    help="switch mode: run no-SD on the same server too (planner policy 'nosd': no draft forward)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="an unmeasured run of each level's load first (steady state; cold start is bench-warmstart's)")
    ap.add_argument("--warmup-waves", type=int, default=1,
                    help="how many times each level's load the warm-up sends (a longer-running server)")
    ap.add_argument("--mode", choices=("restart", "switch"), default="switch" if quick else "restart",
                    help="restart: a native vLLM server per baseline; switch: one Nightjar server, policy switched")
    ap.add_argument("--warm-profile", type=Path, default=None,
                    help="switch mode: start Nightjar from the priors of this CostProfile (e.g. the pair's "
                         "committed profile, as a deployment that profiled its pair would); default cold")
    args = ap.parse_args(argv)
    if args.warm_profile is not None and args.mode != "switch":
        ap.error("--warm-profile: needs --mode switch (priors go through the admin endpoint)")
    concurrencies = sorted(args.concurrency)
    if args.out is None:
        args.out = RESULTS if args.pair == "bundled" else RESULTS.with_name(f"serve-{args.pair}")
    args.out.mkdir(parents=True, exist_ok=True)
    # Every policy replays the same prompts: with vLLM's prefix cache on, later policies would skip the
    # prefill the earlier ones paid (measured +55 % tok/s for the same gamma-0 schedule in bench-dynamic).
    model_args = [*pair_args(args.pair), "--no-enable-prefix-caching"]

    fitted: dict[str, list] = {}

    def prompt_sets(srv: ServerProcess) -> tuple[list, list]:
        """(load prompts, lossless prompts), only those that fit the served context (same for every policy)."""
        if not fitted:
            pool = loadgen.fit_to_context(srv.url, srv.model_name(), loadgen.load_prompts(), args.max_tokens)
            fitted["load"] = loadgen.mixed_prompts(pool, 400, seed=1)
            fitted["lossless"] = loadgen.mixed_prompts(pool, args.lossless_prompts, seed=7)
        return fitted["load"], fitted["lossless"]

    def n_req(c: int) -> int:
        return max(3, c) if quick else max(8, 3 * c)

    results: dict[str, dict[int, dict]] = {}
    texts: dict[str, list[str]] = {}
    meta: dict[str, Any] = {"pair": args.pair, "dtype": pair_dtype(args.pair), "quick": quick, "concurrencies": concurrencies, "max_tokens": args.max_tokens,
                            "server_start_s": {}}
    order = [p for p in args.policies if p != "vllm-table"] + (["vllm-table"] if "vllm-table" in args.policies else [])
    meta["mode"] = args.mode
    meta["warmup"] = args.warmup
    meta["warmup_waves"] = args.warmup_waves if args.warmup else 0
    meta["nosd_switched"] = args.mode == "switch" and args.nosd_switched
    priors = warm_priors(args.warm_profile) if args.warm_profile is not None else None
    meta["nightjar_start"] = f"warm: priors from {args.warm_profile}" if priors is not None else "cold"
    t_all = time.perf_counter()
    shared: ServerProcess | None = None  # switch mode: the Nightjar-scheduler server
    try:
        for pol in order:
            table = None
            if pol == "vllm-table":
                if not all(p in results for p in ("nosd", "static-1", "static-2", "static-3", "static-4")):
                    print("vllm-table: needs nosd and static-1..4 in the same run to tune; skipped", flush=True)
                    continue
                table, best = tuned_table(results, concurrencies)
                meta["vllm_table"] = table
                meta["vllm_table_best_k"] = best
                print(f"vllm-table tuned from the sweep: best K per concurrency {best} -> {table}", flush=True)
            want_text = pol in ("nosd", "nightjar", "static-4")
            if args.mode == "switch" and (pol != "nosd" or args.nosd_switched):
                if shared is None:
                    t0 = time.perf_counter()
                    print("[switch] starting the Nightjar-scheduler server ...", flush=True)
                    steps = args.out / "steps.jsonl"  # every step, for the analysis of a run
                    steps.unlink(missing_ok=True)
                    shared = ServerProcess([*model_args, "--scheduler", "nightjar"],
                                           env={"NIGHTJAR_ADMIN_TOKEN": ADMIN_TOKEN, "NIGHTJAR_STEP_LOG": str(steps)},
                                           log_path=args.out / "server-switch.log").start()
                    meta["server_start_s"]["switch"] = round(time.perf_counter() - t0, 1)
                    meta["windows_unix"] = {}
                switch_policy(shared.url, pol, table, priors if pol == "nightjar" else None)
                t_pol = time.time()
                print(f"[{pol}] (runtime switch)", flush=True)
                prompts, lossless = prompt_sets(shared)
                lp = lossless if want_text else None
                res, tx = asyncio.run(run_policy(shared, concurrencies, prompts, max_tokens=args.max_tokens,
                                                 n_req=n_req, lossless_prompts=lp, warmup=meta["warmup_waves"]))
                meta["windows_unix"][pol] = [t_pol, time.time()]  # the policy's steps in steps.jsonl
            else:
                t0 = time.perf_counter()
                print(f"[{pol}] starting server ...", flush=True)
                with ServerProcess([*model_args, *policy_args(pol, table)], log_path=args.out / f"server-{pol}.log") as srv:
                    meta["server_start_s"][pol] = round(time.perf_counter() - t0, 1)
                    prompts, lossless = prompt_sets(srv)
                    lp = lossless if want_text else None
                    res, tx = asyncio.run(run_policy(srv, concurrencies, prompts, max_tokens=args.max_tokens,
                                                     n_req=n_req, lossless_prompts=lp, warmup=meta["warmup_waves"]))
            results[pol] = res
            if tx is not None:
                texts[pol] = tx
    finally:
        if shared is not None:
            shared.stop()
    meta["wall_s"] = round(time.perf_counter() - t_all, 1)

    # --- verdicts ---------------------------------------------------------------------------------
    c1, sat = concurrencies[0], concurrencies[-1]
    ratios = {}
    if "nightjar" in results:
        nj = results["nightjar"]
        statics = [p for p in results if p.startswith("static-")]
        if statics:
            ratios["adaptive_vs_best_static_min"] = min(
                nj[c]["output_tok_s"] / max(results[p][c]["output_tok_s"] for p in statics) for c in concurrencies
            )
        if "nosd" in results:
            ratios["adaptive_vs_nosd_c1"] = nj[c1]["output_tok_s"] / results["nosd"][c1]["output_tok_s"]
            ratios["adaptive_vs_nosd_sat"] = nj[sat]["output_tok_s"] / results["nosd"][sat]["output_tok_s"]
    lossless_detail = {}
    if "nosd" in texts:
        for pol in ("nightjar", "static-4"):
            if pol in texts:
                same = [a == b for a, b in zip(texts["nosd"], texts[pol], strict=True)]
                lossless_detail[pol] = f"{sum(same)}/{len(same)}"
    lossless = lossless_verdict(lossless_detail)

    # acceptance and cost ratio at c=1 (to explain what speculation can buy on this pair)
    diag = {}
    if "nosd" in results:
        t_target = 1.0 / results["nosd"][c1]["output_tok_s"]  # seconds per token = one target step at c=1
        for k in range(1, 5):
            s = results.get(f"static-{k}", {}).get(c1)
            if s and s["acceptance"] is not None:
                tok_per_step = 1 + k * s["acceptance"]
                t_step = tok_per_step / s["output_tok_s"]
                diag[f"static-{k}"] = {
                    "acceptance": round(s["acceptance"], 3),
                    "step_vs_target_step": round(t_step / t_target, 3),
                    "overhead_per_draft_token_vs_target_step": round((t_step / t_target - 1) / k, 3),
                }
    meta["c1_diagnostics"] = diag
    meta["lossless"] = lossless_detail

    print()
    table_md = write_table(results, concurrencies, args.out / "table.md")
    print(table_md)
    plot(results, concurrencies, args.out / "serve.png")
    (args.out / "results.json").write_text(json.dumps(
        {"meta": meta, "ratios": ratios, "results": {p: {str(c): v for c, v in r.items()} for p, r in results.items()},
         "lossless_texts": texts}, indent=1))
    print(f"c=1 diagnostics (acceptance, draft+verify cost): {json.dumps(diag)}")
    print(f"lossless (identical texts vs no-SD at temperature 0): {lossless_detail}")
    print(f"wrote {args.out}/table.md, serve.png, results.json (wall {meta['wall_s']} s)")

    def fmt(k: str) -> str:
        return f"{ratios[k]:.3f}" if k in ratios else "nan"

    print(
        f"RESULT adaptive_vs_best_static_min={fmt('adaptive_vs_best_static_min')} "
        f"adaptive_vs_nosd_c1={fmt('adaptive_vs_nosd_c1')} adaptive_vs_nosd_sat={fmt('adaptive_vs_nosd_sat')} "
        f"lossless={'true' if lossless else 'false'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
