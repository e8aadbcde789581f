"""``make demo``: one worker, the same prompts with and without speculation, then a load spike, watched live.

Starts ``nightjar-worker serve`` with the Nightjar scheduler over gamma 0, the draft model's arms
and prompt-lookup (n-gram) arms, with elastic draft memory on, and runs four segments:

1. ``gamma 0``    prompts whose answers quote them (summaries, extraction, code), one at a time,
                  the planner switched to plain decoding: the reference;
2. ``nightjar``   the same prompts with the planner in charge: speculation pays at low load;
3. ``load``       a spike of mixed Spec-Bench prompts, more than the worker's batch holds: requests
                  wait, the planner backs off (the draft model stops, gamma falls to what still pays),
                  the draft's weights leave and their bytes become KV-cache blocks;
4. ``nightjar again`` the first prompts once more. The draft's weights are back once the load has
                  fallen: because the planner asked for the draft, or as a recheck (offloaded for
                  ``recheck_after_s``, 30 s, with the KV cache calm: the planner's view of a draft
                  it could not run is stale).

Once a second it reads ``/metrics``: the gamma chosen per draft source, the running requests, output
tok/s, the draft's memory state and the KV blocks the target may use. Ends with a table per segment
(tok/s against the gamma-0 reference) and a PNG under ``build/results/demo/`` (``make publish-results
NAME=demo`` keeps them in the tree). About 3.5 minutes
on 2 cores with the bundled pair once installed (``--pair qwen``: the Qwen2.5-Coder pair, whose draft
pays: fewer, shorter requests, about 12 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nightjar_contract.planner import DEFAULT_MAX_GAMMA

from nightjar_worker import loadgen
from nightjar_worker.loadgen import Phase
from nightjar_worker.models import PAIR_SETTINGS, add_pair_argument, get_pair

DEFAULT_OUT = Path("build/results/demo")  # relative to the checkout make runs in; ignored by git
K = DEFAULT_MAX_GAMMA
REPEATING = ("summarization", "extraction", "coding")  # answers that quote their prompt
STATES = ("resident", "offloading", "offloaded", "reloading", "draining")  # nightjar_draft_state values
TRIGGERS = ("demand", "recheck")  # nightjar_draft_returns_total: why the draft came back


@dataclass
class Tick:
    t: float
    segment: str
    gamma: dict[str, float | None]  # source -> mean gamma of that source's speculating steps this second
    share: dict[str, float]  # source -> share of this second's steps that speculated with it
    drafted: dict[str, float]  # source -> draft tokens verified this second
    accepted: dict[str, float]
    running: float
    waiting: float
    tok_s: float
    draft_state: int | None
    kv_blocks: float | None
    returns: dict[str, float]  # trigger -> draft returns started so far


@dataclass
class Segment:
    name: str
    policy: dict  # planner fields for the admin endpoint
    requests: int = 0  # closed loop at concurrency 1 (0: the open-loop ``phase``)
    phase: Phase | None = None
    t0: float = 0.0
    t1: float = 0.0
    records: list = field(default_factory=list)


def segments(scale: float, n_low: int) -> list[Segment]:
    nightjar = {"policy": "nightjar", "max_gamma": K, "ngram_arms": list(range(1, K + 1))}
    spike = Phase(duration_s=60 * scale, rate=4.0, max_concurrency=32, name="load", drop_late=True)
    return [
        Segment("gamma 0", {"policy": "nosd", "max_gamma": K}, requests=n_low),
        Segment("nightjar", nightjar, requests=n_low),
        Segment("load", nightjar, phase=spike),
        Segment("nightjar again", nightjar, requests=n_low),
    ]


def _sources(before: dict, after: dict) -> tuple[dict[str, float | None], dict[str, float], float]:
    """(mean gamma per source, share of steps per source, steps) between two scrapes."""
    steps: dict[tuple[str, str], float] = {}
    for (name, labels), v in after.items():
        if name == "nightjar_steps_total":
            lab = dict(labels)
            steps[(lab.get("source", "draft"), lab.get("gamma", "0"))] = v - before.get((name, labels), 0.0)
    total = sum(steps.values())
    gamma, share = {}, {}
    for src in ("draft", "ngram"):
        spec = {int(g): n for (s, g), n in steps.items() if s == src and int(g) > 0 and n > 0}
        n = sum(spec.values())
        gamma[src] = sum(g * c for g, c in spec.items()) / n if n else None
        share[src] = n / total if total else 0.0
    return gamma, share, total


async def monitor(url: str, segs: list[Segment], t0: float, stop: asyncio.Event, ticks: list[Tick], live: bool) -> None:
    import httpx

    prev, prev_t = None, 0.0
    async with httpx.AsyncClient(timeout=10) as http:
        while not stop.is_set():
            try:
                cur = await loadgen.scrape(http, url)
            except Exception:  # noqa: BLE001 - the worker is busy; keep watching
                await asyncio.sleep(1)
                continue
            now = time.perf_counter() - t0
            if prev is not None:
                seg = next((s.name for s in reversed(segs) if s.t0 and s.t0 <= now), segs[0].name)
                gamma, share, _ = _sources(prev, cur)
                drafted, accepted = ({src: loadgen.metric_sum(cur, m, source=src) - loadgen.metric_sum(prev, m, source=src)
                                      for src in ("draft", "ngram")}
                                     for m in ("nightjar_draft_tokens_total", "nightjar_accepted_tokens_total"))
                state = loadgen.metric_or_none(cur, "nightjar_draft_state")
                tick = Tick(
                    t=now, segment=seg, gamma=gamma, share=share, drafted=drafted, accepted=accepted,
                    running=loadgen.metric_sum(cur, "vllm:num_requests_running"),
                    waiting=loadgen.metric_sum(cur, "vllm:num_requests_waiting"),
                    tok_s=(loadgen.metric_sum(cur, "vllm:generation_tokens_total")
                           - loadgen.metric_sum(prev, "vllm:generation_tokens_total")) / max(now - prev_t, 1e-6),
                    draft_state=None if state is None else int(state),
                    kv_blocks=loadgen.metric_or_none(cur, "nightjar_kv_blocks_total"),
                    returns={tr: loadgen.metric_sum(cur, "nightjar_draft_returns_total", trigger=tr) for tr in TRIGGERS},
                )
                ticks.append(tick)
                g = " ".join(f"{s}={_f(tick.gamma[s])}" for s in ("draft", "ngram"))
                line = (f"t={now:6.1f}s {seg:<14s} gamma {g}  running={tick.running:3.0f} waiting={tick.waiting:3.0f}  "
                        f"{tick.tok_s:6.1f} tok/s  draft {_state(tick.draft_state):<10s} KV blocks {_f(tick.kv_blocks, 0)}")
                print(("\r" + line) if live else line, end="" if live else "\n", flush=True)
            prev, prev_t = cur, now
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
    if live:
        print()


def _f(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _state(s: int | None) -> str:
    return "-" if s is None or not 0 <= s < len(STATES) else STATES[s]


def set_policy(url: str, token: str, planner: dict) -> None:
    import httpx

    r = httpx.post(url + "/nightjar/v1/config", json={"planner": planner}, timeout=60,
                   headers={"Authorization": f"Bearer {token}"})
    if r.status_code != 200 or r.json().get("status") != "applied":
        raise RuntimeError(f"the worker refused the planner {planner}: {r.status_code} {r.text}")


async def drive(url: str, model: str, token: str, segs: list[Segment], max_tokens: int, live: bool) -> list[Tick]:
    from openai import AsyncOpenAI

    pool = loadgen.fit_to_context(url, model, loadgen.load_prompts(), max_tokens)
    low = loadgen.mixed_prompts([p for p in pool if p.category in REPEATING], max(s.requests for s in segs), seed=5)
    mixed = loadgen.mixed_prompts(pool, 400, seed=3)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="demo", timeout=600, max_retries=0)
    ticks: list[Tick] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    mon = asyncio.create_task(monitor(url, segs, t0, stop, ticks, live))
    for s in segs:
        await asyncio.to_thread(set_policy, url, token, s.policy)
        s.t0 = time.perf_counter() - t0
        if s.phase is not None:
            s.records = await loadgen.run_load(client, model, mixed, [s.phase], max_tokens=max_tokens, seed=11)
        else:
            s.records = await loadgen.run_closed_loop(client, model, low, 1, s.requests, max_tokens=max_tokens,
                                                      name=s.name)
        s.t1 = time.perf_counter() - t0
    stop.set()
    await mon
    await client.close()
    return ticks


def summary_table(segs: list[Segment], ticks: list[Tick]) -> str:
    rows = ["| segment | requests | output tok/s | vs gamma 0 | TPOT p50 ms | steps with draft / n-gram "
            "| acceptance draft / n-gram | draft returns demand / recheck | draft at end | KV blocks at end |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    ref = None
    before = dict.fromkeys(TRIGGERS, 0.0)
    for s in segs:
        recs = [r for r in s.records if not r.dropped]
        toks = sum(r.output_tokens for r in recs)
        tput = toks / max(s.t1 - s.t0, 1e-6)
        ref = tput if s.name == "gamma 0" else ref
        tk = [t for t in ticks if t.segment == s.name]
        share = {src: sum(t.share[src] for t in tk) / len(tk) if tk else 0.0 for src in ("draft", "ngram")}
        last = tk[-1] if tk else None
        acc = {src: (sum(t.accepted[src] for t in tk) / d if (d := sum(t.drafted[src] for t in tk)) else None)
               for src in ("draft", "ngram")}
        rows.append(
            f"| {s.name} | {len(recs)} | {tput:.1f} | {_f(tput / ref if ref and s.requests else None)} | "
            f"{_ms(loadgen.summarize(recs).tpot_p50_s)} | {share['draft']:.0%} / {share['ngram']:.0%} | "
            f"{_f(acc['draft'])} / {_f(acc['ngram'])} | "
            + " / ".join(f"{(last.returns[tr] if last else before[tr]) - before[tr]:.0f}" for tr in TRIGGERS)
            + f" | {_state(last.draft_state if last else None)} | {_f(last.kv_blocks if last else None, 0)} |")
        before = last.returns if last else before
    return "\n".join(rows) + "\n"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def plot(ticks: list[Tick], segs: list[Segment], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [k.t for k in ticks]
    nan = float("nan")
    fig, axes = plt.subplots(4, 1, figsize=(11, 9.5), sharex=True)
    for src, color in (("draft", "tab:blue"), ("ngram", "tab:orange")):
        axes[0].step(t, [k.gamma[src] if k.gamma[src] is not None else 0.0 for k in ticks], where="post",
                     color=color, label=f"{src} (mean gamma of its steps)")
    axes[0].set_ylabel("gamma chosen")
    axes[0].legend(loc="center right", fontsize=8)
    axes[1].plot(t, [k.running for k in ticks], color="tab:green", label="running")
    axes[1].plot(t, [k.waiting for k in ticks], color="tab:red", label="waiting")
    axes[1].set_ylabel("requests")
    axes[1].legend(loc="upper right", fontsize=8)
    axes[2].plot(t, [k.tok_s for k in ticks], color="tab:purple")
    for s in segs:
        if s.requests:  # the closed-loop segments' mean, comparable across them
            toks = sum(r.output_tokens for r in s.records if not r.dropped)
            axes[2].hlines(toks / max(s.t1 - s.t0, 1e-6), s.t0, s.t1, colors="black", linestyles="dashed")
    axes[2].set_ylabel("output tok/s\n(dashed: segment mean)")
    axes[3].plot(t, [k.kv_blocks if k.kv_blocks is not None else nan for k in ticks], color="tab:brown")
    axes[3].set_ylabel("KV blocks of the target")
    ax2 = axes[3].twinx()
    ax2.step(t, [k.draft_state if k.draft_state is not None else nan for k in ticks], where="post", color="grey")
    ax2.set_yticks(range(len(STATES)), STATES, fontsize=7)
    ax2.set_ylabel("draft weights")
    for prev, k in itertools.pairwise(ticks):
        for tr in TRIGGERS:
            if k.returns[tr] > prev.returns[tr]:  # a return started: say why
                axes[3].axvline(k.t, color="tab:green", linestyle=":")
                axes[3].text(k.t, 0.5, f" draft returns ({tr})", transform=axes[3].get_xaxis_transform(),
                             fontsize=8, color="tab:green")
    axes[3].set_xlabel("time (s)")
    for i, s in enumerate(segs):
        for ax in axes:
            if i % 2 == 1:
                ax.axvspan(s.t0, s.t1, color="grey", alpha=0.10)
            ax.grid(alpha=0.3)
        axes[0].text(s.t0 + 1, 0.9, s.name, transform=axes[0].get_xaxis_transform(), fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(out: Path, segs: list[Segment], ticks: list[Tick], pair: str) -> str:
    """The demo's outputs in ``out``: summary.md, timeline.json and demo.png; returns the table."""
    out.mkdir(parents=True, exist_ok=True)
    table = summary_table(segs, ticks)
    (out / "summary.md").write_text(table)
    (out / "timeline.json").write_text(json.dumps([asdict(t) for t in ticks]))
    plot(ticks, segs, out / "demo.png", f"Nightjar demo ({pair} pair, K={K}, draft + n-gram arms, "
         "elastic draft memory)")
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``make demo``'s arguments, the pair's defaults filled in."""
    ap = argparse.ArgumentParser(prog="nightjar-worker demo", description=__doc__.split("\n")[0])

    def per_pair(name: str) -> str:
        return ", ".join(f"{p.name} {getattr(p, name)}" for p in PAIR_SETTINGS.values())

    add_pair_argument(ap)
    ap.add_argument("--scale", type=float, default=float(os.environ["DEMO_SCALE"]) if "DEMO_SCALE" in os.environ
                    else None, help=f"multiply the load spike's duration (60 s; default: {per_pair('demo_scale')})")
    ap.add_argument("--requests", type=int,
                    help=f"requests of each low-load segment (default: {per_pair('demo_requests')})")
    ap.add_argument("--max-tokens", type=int, help=f"default: {per_pair('demo_max_tokens')}")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="the worker's batch limit: the spike exceeds it")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-live", action="store_true", help="one line per second instead of an updating line")
    ap.add_argument("serve_args", nargs="*", help="extra arguments for `nightjar-worker serve` (after --)")
    args = ap.parse_args(argv)
    pair = get_pair(args.pair)
    for name, default in (("requests", pair.demo_requests), ("max_tokens", pair.demo_max_tokens),
                          ("scale", pair.demo_scale)):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    live = sys.stdout.isatty() and not args.no_live
    segs = segments(args.scale, args.requests)

    from nightjar_worker.models import elastic_memory_env, pair_args
    from nightjar_worker.serve import ServerProcess

    token = secrets.token_hex(8)
    env = {"NIGHTJAR_ADMIN_TOKEN": token, **elastic_memory_env(args.pair, {"enabled": True, "mode": "auto"})}
    print(f"starting the worker on the {args.pair} pair (about a minute on 2 cores) ...", flush=True)
    server = ServerProcess([*pair_args(args.pair), "--scheduler", "nightjar", "--num-speculative-tokens", str(K),
                            "--max-num-seqs", str(args.max_num_seqs), *args.serve_args], env=env,
                           log_path=args.out / "server.log")
    with server:
        model = server.model_name()
        print(f"worker ready at {server.url} (model {model}); segments: " + ", ".join(
            f"{s.name} ({s.requests} requests at c=1)" if s.requests else
            f"{s.name} ({s.phase.duration_s:.0f} s at {s.phase.rate}/s)" for s in segs), flush=True)
        ticks = asyncio.run(drive(server.url, model, token, segs, args.max_tokens, live))

    table = write_results(args.out, segs, ticks, args.pair)
    print("\n" + table)
    records = [r for s in segs for r in s.records]
    errors = [r.error for r in records if r.error and not r.dropped]
    print(f"wrote {args.out}/summary.md, timeline.json, demo.png; {len(records)} requests "
          f"({sum(r.dropped for r in records)} dropped as late), {len(errors)} errors")
    for e in sorted(set(errors))[:3]:
        print(f"  error: {e}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
