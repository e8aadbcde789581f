"""``make demo``: the worker on the bundled pair under low -> high -> low load, watched live.

Starts ``nightjar-worker serve`` (Nightjar scheduler), drives three phases of Poisson arrivals with
the async load generator, and once a second reads ``/metrics`` to show what the planner does: the
gamma it chose (mean over the last second and the latest), the decoding batch size and the output
throughput. Ends with a per-phase summary table and a PNG of gamma, batch size and throughput over
time under ``benchmarks/results/demo/``. Sized to finish in a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nightjar_worker import loadgen
from nightjar_worker.loadgen import Phase

DEFAULT_OUT = Path("benchmarks/results/demo")


@dataclass
class Tick:
    t: float
    phase: str
    gamma_mean: float | None  # mean chosen gamma over the interval (from the histogram)
    gamma_now: float | None
    batch: float  # vllm:num_requests_running
    mean_batch: float | None  # mean decoding batch over the interval (nightjar_batch_size)
    tok_s: float
    steps: float
    acceptance: float | None


def phases(scale: float) -> list[Phase]:
    return [
        Phase(duration_s=35 * scale, rate=0.4, max_concurrency=2, name="low", drop_late=True),
        Phase(duration_s=50 * scale, rate=8.0, max_concurrency=32, name="high", drop_late=True),
        Phase(duration_s=35 * scale, rate=0.4, max_concurrency=2, name="low-again", drop_late=True),
    ]


async def monitor(url: str, ph: list[Phase], t0: float, stop: asyncio.Event, ticks: list[Tick], live: bool) -> None:
    import httpx

    ends = []
    acc = 0.0
    for p in ph:
        acc += p.duration_s
        ends.append((acc, p.name))
    prev, prev_t = None, None
    async with httpx.AsyncClient(timeout=10) as http:
        while not stop.is_set():
            try:
                cur = await loadgen.scrape(http, url)
            except Exception:  # noqa: BLE001 - keep watching
                await asyncio.sleep(1)
                continue
            now = time.perf_counter() - t0
            if prev is not None:
                dt = max(now - prev_t, 1e-6)

                def d(name: str, cur=cur, prev=prev) -> float:
                    return loadgen.metric_sum(cur, name) - loadgen.metric_sum(prev, name)

                n = d("nightjar_gamma_chosen_count")
                drafted = d("vllm:spec_decode_num_draft_tokens_total")
                phase = next((nm for e, nm in ends if now <= e), "drain")
                tick = Tick(
                    t=now,
                    phase=phase,
                    gamma_mean=d("nightjar_gamma_chosen_sum") / n if n else None,
                    gamma_now=loadgen.metric_sum(cur, "nightjar_gamma_current") if n else None,
                    batch=loadgen.metric_sum(cur, "vllm:num_requests_running"),
                    mean_batch=d("nightjar_batch_size_sum") / n if n else None,
                    tok_s=d("vllm:generation_tokens_total") / dt,
                    steps=n,
                    acceptance=d("vllm:spec_decode_num_accepted_tokens_total") / drafted if drafted else None,
                )
                ticks.append(tick)
                line = (
                    f"t={now:6.1f}s  phase={phase:<9s} gamma={_f(tick.gamma_mean)} (now {_f(tick.gamma_now, 0)})  "
                    f"batch={tick.batch:4.0f}  throughput={tick.tok_s:6.1f} tok/s  accept={_f(tick.acceptance)}"
                )
                print(("\r" + line) if live else line, end="" if live else "\n", flush=True)
            prev, prev_t = cur, now
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
    if live:
        print()


def _f(x: float | None, nd: int = 2) -> str:
    return "  -" if x is None else f"{x:.{nd}f}"


async def drive(url: str, model: str, ph: list[Phase], max_tokens: int, live: bool):
    from openai import AsyncOpenAI

    prompts = loadgen.mixed_prompts(loadgen.fit_to_context(url, model, loadgen.load_prompts(), max_tokens), 400, seed=3)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="demo", timeout=600, max_retries=0)
    ticks: list[Tick] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    mon = asyncio.create_task(monitor(url, ph, t0, stop, ticks, live))
    records = await loadgen.run_load(client, model, prompts, ph, max_tokens=max_tokens, temperature=0.0, seed=11)
    stop.set()
    await mon
    await client.close()
    return records, ticks


def summary_table(records, ticks: list[Tick], ph: list[Phase]) -> str:
    rows = ["| phase | requests | output tok/s | TTFT p50 ms | TPOT p50 ms | E2E p99 s | mean gamma | mean batch |",
            "|---|---|---|---|---|---|---|---|"]
    for p in ph:
        recs = [r for r in records if r.phase == p.name]
        s = loadgen.summarize(recs)
        tk = [t for t in ticks if t.phase == p.name and t.steps > 0]
        steps = sum(t.steps for t in tk)
        g = sum((t.gamma_mean or 0) * t.steps for t in tk) / steps if steps else None
        b = sum((t.mean_batch or 0) * t.steps for t in tk) / steps if steps else None
        tput = sum(t.tok_s for t in ticks if t.phase == p.name) / max(1, len([t for t in ticks if t.phase == p.name]))
        rows.append(
            f"| {p.name} | {s.requests} | {tput:.1f} | {_ms(s.ttft_p50_s)} | {_ms(s.tpot_p50_s)} | "
            f"{_f(s.e2e_p99_s)} | {_f(g)} | {_f(b, 1)} |"
        )
    return "\n".join(rows) + "\n"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def plot(ticks: list[Tick], ph: list[Phase], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [k.t for k in ticks]
    fig, axes = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True)
    axes[0].step(t, [k.gamma_mean if k.gamma_mean is not None else float("nan") for k in ticks], where="post")
    axes[0].set_ylabel("chosen gamma\n(mean per s)")
    axes[1].plot(t, [k.batch for k in ticks], color="tab:orange")
    axes[1].set_ylabel("running requests")
    axes[2].plot(t, [k.tok_s for k in ticks], color="tab:green")
    axes[2].set_ylabel("output tok/s")
    axes[2].set_xlabel("time (s)")
    x = 0.0
    for i, p in enumerate(ph):
        for ax in axes:
            if i % 2 == 1:
                ax.axvspan(x, x + p.duration_s, color="grey", alpha=0.12)
        axes[0].text(x + 1, 0.02, p.name, transform=axes[0].get_xaxis_transform(), fontsize=9)
        x += p.duration_s
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("Nightjar demo: load low -> high -> low on the bundled CPU pair")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightjar-worker demo", description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="use a running worker instead of starting one")
    ap.add_argument("--scale", type=float, default=float(os.environ.get("DEMO_SCALE", "1.0")),
                    help="multiply the phase durations (default 1: about 2 minutes of load)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-live", action="store_true", help="one line per second instead of an updating line")
    ap.add_argument("serve_args", nargs="*", help="extra arguments for `nightjar-worker serve` (after --)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    live = sys.stdout.isatty() and not args.no_live
    ph = phases(args.scale)

    server = None
    if args.url:
        url = args.url.rstrip("/")
    else:
        from nightjar_worker.serve import ServerProcess

        print("starting the worker on the bundled pair (about a minute on 2 cores) ...", flush=True)
        server = ServerProcess(["--scheduler", "nightjar", *args.serve_args], log_path=args.out / "server.log")
        server.start()
        url = server.url
    try:
        import httpx

        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        print(f"worker ready at {url} (model {model}); phases: "
              + ", ".join(f"{p.name} {p.duration_s:.0f}s @ {p.rate}/s" for p in ph), flush=True)
        records, ticks = asyncio.run(drive(url, model, ph, args.max_tokens, live))
    finally:
        if server is not None:
            server.stop()

    table = summary_table(records, ticks, ph)
    print("\n" + table)
    (args.out / "summary.md").write_text(table)
    (args.out / "timeline.json").write_text(json.dumps([t.__dict__ for t in ticks]))
    plot(ticks, ph, args.out / "demo.png")
    errors = [r.error for r in records if r.error and not r.dropped]
    print(f"wrote {args.out}/summary.md, timeline.json, demo.png; {len(records)} requests "
          f"({sum(r.dropped for r in records)} dropped as late), {len(errors)} errors")
    for e in sorted(set(errors))[:3]:
        print(f"  error: {e}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
