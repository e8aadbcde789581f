"""Async load generator for the worker's OpenAI API (used by the demo, bench-serve, bench-dynamic).

Arrivals are Poisson with a piecewise-constant rate (``Phase``), optionally capped by a maximum
number of requests in flight (``max_concurrency``: with a rate well above the service rate this is
the usual "concurrency c" operating point). Prompts are Spec-Bench first turns, sampled by category.
Each request is streamed so TTFT is measured at the first content chunk; the token count comes from
the usage vLLM reports on every chunk (``continuous_usage_stats``: with speculation one chunk can
carry several tokens), which also dates each token (``RequestRecord.token_times``).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SPEC_BENCH_ENV = "NIGHTJAR_SPECBENCH"


@dataclass(frozen=True)
class Prompt:
    qid: int
    category: str
    text: str


def load_prompts(path: str | Path | None = None, categories: Sequence[str] | None = None) -> list[Prompt]:
    """First turn of every Spec-Bench question (optionally only some categories), file order: the
    400 bundled with the worker (``nightjar_worker.data``), or Spec-Bench's own ``question.jsonl``
    at ``path`` / ``$NIGHTJAR_SPECBENCH``."""
    import os

    src = path or os.environ.get(SPEC_BENCH_ENV)
    if src:
        p = Path(src)
        if not p.exists():
            raise FileNotFoundError(f"Spec-Bench prompts not found at {p} ({SPEC_BENCH_ENV} or path)")
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        qs = [(int(q["question_id"]), q["category"], q["turns"][0]) for q in rows]
    else:
        from nightjar_worker.data import specbench_questions

        qs = [(int(q["question_id"]), q["category"], q["prompt"]) for q in specbench_questions()]
    out = [Prompt(i, c, t) for i, c, t in qs if not categories or c in categories]
    if not out:
        raise ValueError(f"categories: no Spec-Bench prompts match {categories}")
    return out


def fit_to_context(base_url: str, model: str, prompts: Sequence[Prompt], max_tokens: int) -> list[Prompt]:
    """The prompts whose chat-templated length plus ``max_tokens`` fits the served model's context
    (``max_model_len`` from ``/v1/models``, lengths from the server's own ``/tokenize``): a request
    that cannot fit gets a 400, which is the server being right, not a load result."""
    import httpx

    with httpx.Client(base_url=base_url.rstrip("/"), timeout=30) as http:
        card = next(m for m in http.get("/v1/models").json()["data"] if m["id"] == model)
        limit = int(card["max_model_len"]) - max_tokens
        out, seen = [], {}
        for p in prompts:
            if p.text not in seen:
                r = http.post("/tokenize", json={"model": model, "messages": [{"role": "user", "content": p.text}],
                                                 "add_generation_prompt": True})
                r.raise_for_status()
                seen[p.text] = r.json()["count"] <= limit
            if seen[p.text]:
                out.append(p)
    if not out:
        raise ValueError(f"max_tokens: no prompt fits the context with {max_tokens} tokens to generate")
    return out


def mixed_prompts(prompts: Sequence[Prompt], n: int, seed: int = 0) -> list[Prompt]:
    """``n`` prompts interleaving categories round-robin (so every load level sees every category)."""
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    rng = random.Random(seed)
    for v in by_cat.values():
        rng.shuffle(v)
    cats = sorted(by_cat)
    return [by_cat[cats[i % len(cats)]][(i // len(cats)) % len(by_cat[cats[i % len(cats)]])] for i in range(n)]


@dataclass
class Phase:
    """``duration_s`` of Poisson arrivals at ``rate`` req/s (``math.inf``: all at once), at most
    ``max_concurrency`` in flight (None: unbounded)."""

    duration_s: float
    rate: float
    max_concurrency: int | None = None
    name: str = ""
    drop_late: bool = False  # a request still waiting for a slot when its phase ends is dropped


@dataclass
class RequestRecord:
    idx: int
    qid: int
    category: str
    phase: str
    start_s: float  # relative to the run start
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    text: str = ""
    error: str | None = None
    dropped: bool = False
    # (seconds since the run start, completion tokens so far) at each chunk that moved the count: when
    # the request's tokens came out, e.g. which of them fell inside a phase's window
    token_times: list[tuple[float, int]] = field(default_factory=list)

    @property
    def tpot_s(self) -> float | None:
        if self.e2e_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def end_s(self) -> float | None:
        return None if self.e2e_s is None else self.start_s + self.e2e_s


def arrival_times(phases: Sequence[Phase], seed: int = 0) -> list[tuple[float, Phase]]:
    """Poisson arrival times (seconds from start) with each phase's rate."""
    rng = random.Random(seed)
    out: list[tuple[float, Phase]] = []
    t0 = 0.0
    for ph in phases:
        if ph.rate <= 0:
            t0 += ph.duration_s
            continue
        t = t0
        while True:
            t += 0.0 if math.isinf(ph.rate) else rng.expovariate(ph.rate)
            if t >= t0 + ph.duration_s:
                break
            out.append((t, ph))
            if math.isinf(ph.rate) and len(out) >= 100000:
                break
        t0 += ph.duration_s
    return out


async def one_request(
    client: Any, model: str, prompt: Prompt, rec: RequestRecord, *, max_tokens: int, temperature: float, t_run0: float
) -> RequestRecord:
    """Stream one chat completion and fill ``rec``."""
    t0 = time.perf_counter()
    rec.start_s = t0 - t_run0
    parts: list[str] = []
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt.text}],
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:
                delta = chunk.choices[0].delta.content or ""
                if delta and rec.ttft_s is None:
                    rec.ttft_s = now - t0
                parts.append(delta)
            usage = getattr(chunk, "usage", None)
            if usage and usage.completion_tokens > rec.output_tokens:
                rec.output_tokens = usage.completion_tokens
                rec.token_times.append((now - t_run0, rec.output_tokens))
        rec.e2e_s = time.perf_counter() - t0
        if rec.ttft_s is None:
            rec.ttft_s = rec.e2e_s
    except Exception as e:  # noqa: BLE001 - a failed request is data, not a crash
        rec.error = f"{type(e).__name__}: {e}"
    rec.text = "".join(parts)
    return rec


async def run_load(
    client: Any,
    model: str,
    prompts: Sequence[Prompt],
    phases: Sequence[Phase],
    *,
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    max_requests: int | None = None,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Drive the phases; returns one record per request (sorted by index). Requests still in flight
    when the last phase ends are awaited (their latency counts).

    A request's prompt is chosen when it is admitted, not when it arrives: the k-th request a phase
    admits gets prompt ``first + k``, ``first`` being the arrival index of the phase's first request.
    Where a phase's cap makes requests wait (and ``drop_late`` drops some), a faster server admits
    more of them, and picking by arrival index would give each policy a different subset of the
    phase's prompts (Spec-Bench categories accept 0.6-0.9 of the drafts); by admission, every policy
    serves the same sequence and a faster one just gets further along it. Without waiting both orders
    coincide. A dropped request is never sent and has no prompt (qid -1)."""
    arrivals = arrival_times(phases, seed)
    ends: dict[int, float] = {}
    acc = 0.0
    for ph in phases:
        acc += ph.duration_s
        ends[id(ph)] = acc
    if max_requests is not None:
        arrivals = arrivals[:max_requests]
    sems: dict[int, asyncio.Semaphore] = {}
    for _, ph in arrivals:
        if ph.max_concurrency is not None and id(ph) not in sems:
            sems[id(ph)] = asyncio.Semaphore(ph.max_concurrency)
    first: dict[int, int] = {}
    for i, (_, ph) in enumerate(arrivals):
        first.setdefault(id(ph), i)
    admitted: dict[int, int] = defaultdict(int)
    t_run0 = time.perf_counter()
    records: list[RequestRecord] = []

    async def admit(rec: RequestRecord, ph: Phase) -> None:
        p = prompts[(first[id(ph)] + admitted[id(ph)]) % len(prompts)]
        admitted[id(ph)] += 1
        rec.qid, rec.category = p.qid, p.category
        await one_request(client, model, p, rec, max_tokens=max_tokens, temperature=temperature, t_run0=t_run0)

    async def launch(i: int, at: float, ph: Phase) -> None:
        delay = at - (time.perf_counter() - t_run0)
        if delay > 0:
            await asyncio.sleep(delay)
        rec = RequestRecord(i, -1, "", ph.name, start_s=0.0)
        records.append(rec)
        sem = sems.get(id(ph))
        if sem is None:
            await admit(rec, ph)
        else:
            async with sem:
                if ph.drop_late and time.perf_counter() - t_run0 > ends[id(ph)]:
                    rec.dropped = True
                    rec.start_s = time.perf_counter() - t_run0
                else:
                    await admit(rec, ph)
        if on_done is not None:
            on_done(rec)

    await asyncio.gather(*(launch(i, at, ph) for i, (at, ph) in enumerate(arrivals)))
    return sorted(records, key=lambda r: r.idx)


async def run_closed_loop(
    client: Any,
    model: str,
    prompts: Sequence[Prompt],
    concurrency: int,
    num_requests: int,
    *,
    max_tokens: int = 128,
    temperature: float = 0.0,
    name: str = "",
) -> list[RequestRecord]:
    """Exactly ``num_requests`` requests, ``concurrency`` in flight (rate = inf)."""
    return await run_load(
        client,
        model,
        prompts,
        [Phase(duration_s=1.0, rate=math.inf, max_concurrency=concurrency, name=name)],
        max_tokens=max_tokens,
        temperature=temperature,
        max_requests=num_requests,
    )


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class Summary:
    requests: int
    errors: int
    output_tokens: int
    duration_s: float
    output_tok_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: Sequence[RequestRecord]) -> Summary:
    dropped = sum(1 for r in records if r.dropped)
    ok = [r for r in records if r.error is None and r.e2e_s is not None and not r.dropped]
    if ok:
        t0 = min(r.start_s for r in ok)
        t1 = max(r.end_s for r in ok)  # type: ignore[type-var]
        dur = max(t1 - t0, 1e-9)
    else:
        dur = 0.0
    toks = sum(r.output_tokens for r in ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok]
    return Summary(
        requests=len(records) - dropped,
        errors=len(records) - dropped - len(ok),
        output_tokens=toks,
        duration_s=dur,
        output_tok_s=toks / dur if dur > 0 else 0.0,
        ttft_p50_s=_pct(ttft, 0.5),
        ttft_p99_s=_pct(ttft, 0.99),
        tpot_p50_s=_pct(tpot, 0.5),  # type: ignore[arg-type]
        tpot_p99_s=_pct(tpot, 0.99),  # type: ignore[arg-type]
        e2e_p50_s=_pct(e2e, 0.5),  # type: ignore[arg-type]
        e2e_p99_s=_pct(e2e, 0.99),  # type: ignore[arg-type]
        extra={"dropped": dropped} if dropped else {},
    )


# --- /metrics scraping (for live displays and benchmarks) -------------------------------------------


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text -> {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric_sum(samples: dict, name: str, **labels: str) -> float:
    """Sum of all samples called ``name`` whose labels include ``labels``."""
    tot = 0.0
    for (n, lbls), v in samples.items():
        if n == name and all(dict(lbls).get(k) == val for k, val in labels.items()):
            tot += v
    return tot


def metric_or_none(samples: dict, name: str) -> float | None:
    """``metric_sum``, or None when the server exports no sample called ``name`` (e.g. no Nightjar)."""
    return metric_sum(samples, name) if any(n == name for n, _ in samples) else None


async def scrape(http: Any, base_url: str) -> dict:
    r = await http.get(base_url.rstrip("/") + "/metrics")
    r.raise_for_status()
    return parse_metrics(r.text)
