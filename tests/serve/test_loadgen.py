"""Load generator: Poisson arrivals per phase, prompt mixing, summaries, /metrics parsing."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest
from nightjar_worker import loadgen
from nightjar_worker.loadgen import Phase, RequestRecord


def test_poisson_arrivals_follow_each_phase_rate():
    ph = [Phase(200.0, 2.0, name="a"), Phase(100.0, 0.0, name="idle"), Phase(200.0, 10.0, name="b")]
    arr = loadgen.arrival_times(ph, seed=3)
    a = [t for t, p in arr if p.name == "a"]
    b = [t for t, p in arr if p.name == "b"]
    assert not [t for t, p in arr if p.name == "idle"]
    assert all(0 <= t < 200 for t in a) and all(300 <= t < 500 for t in b)
    assert len(a) == pytest.approx(400, rel=0.15) and len(b) == pytest.approx(2000, rel=0.1)
    gaps = [y - x for x, y in zip(b, b[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert cv == pytest.approx(1.0, abs=0.1)  # exponential gaps
    assert loadgen.arrival_times(ph, seed=3) == arr  # deterministic under the seed


def test_prompts_are_spec_bench_and_mixed_by_category():
    ps = loadgen.load_prompts()
    assert len(ps) == 400 and len({p.category for p in ps}) >= 5
    mixed = loadgen.mixed_prompts(ps, 26, seed=0)
    cats = sorted({p.category for p in ps})
    assert [p.category for p in mixed[: len(cats)]] == cats
    with pytest.raises(ValueError, match="categories"):
        loadgen.load_prompts(categories=["no-such-category"])


def test_summary_percentiles_and_throughput():
    recs = []
    for i in range(10):
        r = RequestRecord(i, i, "x", "p", start_s=float(i), ttft_s=0.1 * (i + 1), e2e_s=1.0 + 0.1 * (i + 1),
                          output_tokens=11)
        recs.append(r)
    recs.append(RequestRecord(10, 10, "x", "p", start_s=0.0, error="boom"))
    recs.append(RequestRecord(11, 11, "x", "p", start_s=0.0, dropped=True))
    s = loadgen.summarize(recs)
    assert s.requests == 11 and s.errors == 1 and s.extra == {"dropped": 1}
    assert s.output_tokens == 110
    assert s.duration_s == pytest.approx(9 + 2.0)  # first start 0 .. last end 9 + 2.0
    assert s.output_tok_s == pytest.approx(110 / 11.0)
    assert s.ttft_p50_s == pytest.approx(0.55)
    assert s.tpot_p50_s == pytest.approx(0.1)  # (e2e - ttft) / (tokens - 1) = 1.0 / 10


def test_metrics_parsing_and_label_filtered_sums():
    text = (
        "# TYPE nightjar_steps_total counter\n"
        'nightjar_steps_total{gamma="0"} 3.0\n'
        'nightjar_steps_total{gamma="4"} 5.0\n'
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 42.0\n'
    )
    m = loadgen.parse_metrics(text)
    assert loadgen.metric_sum(m, "nightjar_steps_total") == 8
    assert loadgen.metric_sum(m, "nightjar_steps_total", gamma="4") == 5
    assert loadgen.metric_sum(m, "vllm:generation_tokens_total") == 42
    # absent (a server without Nightjar) is None, not 0: a timeline gap rather than a fake "resident"
    assert loadgen.metric_or_none(m, "nightjar_draft_state") is None
    assert loadgen.metric_or_none(m, "nightjar_steps_total") == 8


class _StreamingServer:
    """Stands in for the OpenAI client: each request streams ``tokens`` chunks ``per_token_s`` apart,
    then a usage chunk; with ``continuous_usage_stats`` asked, every chunk carries the count so far (as vLLM's)."""

    def __init__(self, per_token_s: float, tokens: int = 4) -> None:
        self.per_token_s, self.tokens = per_token_s, tokens
        self.chat = self
        self.completions = self

    async def create(self, **kw):
        continuous = kw.get("stream_options", {}).get("continuous_usage_stats", False)

        async def stream():
            for i in range(self.tokens):
                await asyncio.sleep(self.per_token_s)
                usage = SimpleNamespace(completion_tokens=i + 1) if continuous else None
                yield SimpleNamespace(choices=[SimpleNamespace(delta=SimpleNamespace(content="x"))], usage=usage)
            yield SimpleNamespace(choices=[], usage=SimpleNamespace(completion_tokens=self.tokens))

        return stream()


def test_each_token_is_dated_from_the_run_start():
    phases = [Phase(5.0, 0.4, name="a")]
    prompts = [loadgen.Prompt(q, "c", f"prompt {q}") for q in range(10)]
    recs = asyncio.run(loadgen.run_load(_StreamingServer(0.02, tokens=5), "m", prompts, phases, seed=1))
    done = [r for r in recs if r.error is None]
    assert done
    for r in done:
        assert [n for _, n in r.token_times] == [1, 2, 3, 4, 5] and r.output_tokens == 5
        times = [t for t, _ in r.token_times]
        assert times == sorted(times) and r.start_s + r.ttft_s <= times[0] + 1e-6
        assert times[-1] <= r.end_s + 1e-6 and times[-1] - times[0] >= 4 * 0.02 * 0.9


def test_capped_phases_serve_the_same_prompt_sequence_at_any_speed():
    """A cap of 1 with drop_late: the slower server admits fewer requests, but both serve the phase's
    prompts in the same order from the phase's first arrival index (by arrival index, the slow one
    would skip the prompts of the requests that arrived while it was busy)."""
    prompts = [loadgen.Prompt(q, f"c{q % 3}", f"prompt {q}") for q in range(500)]
    phases = [Phase(0.6, 30.0, 1, name="a", drop_late=True), Phase(0.6, 30.0, 1, name="b", drop_late=True)]
    firsts = {}
    for i, (_, ph) in enumerate(loadgen.arrival_times(phases, seed=4)):
        firsts.setdefault(ph.name, i)
    served = {}
    for speed, per_token in (("fast", 0.01), ("slow", 0.03)):
        recs = asyncio.run(loadgen.run_load(_StreamingServer(per_token), "m", prompts, phases, seed=4))
        assert all(r.qid == -1 for r in recs if r.dropped) and any(r.dropped for r in recs)
        served[speed] = {n: [r.qid for r in recs if r.phase == n and not r.dropped] for n in ("a", "b")}
    for n in ("a", "b"):
        fast, slow = served["fast"][n], served["slow"][n]
        assert len(fast) > len(slow) >= 2
        assert fast == list(range(firsts[n], firsts[n] + len(fast)))
        assert slow == fast[: len(slow)]
