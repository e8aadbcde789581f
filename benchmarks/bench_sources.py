"""``make bench-sources`` (alias ``make bench-ngram``): the speculation sources on the real worker.

One Nightjar-scheduler server per memory setting (K=4), its policy switched through the admin
endpoint, every policy on the same prompts and loads:

* ``nosd``            gamma 0 every step;
* ``draft-k``         the draft model, gamma k, every step;
* ``ngram-k``         prompt lookup, gamma k, every step (vLLM's ngram method, in the same engine);
* ``suffix-k``        suffix-tree drafts (Arctic Inference), up to k per step, every step;
* ``nightjar-draft``  Nightjar over gamma 0 and the draft model's arms;
* ``nightjar-both``   Nightjar over gamma 0, the draft's arms and the n-gram arms;
* ``nightjar-all``    Nightjar over gamma 0 and the draft's, the n-gram and the suffix arms.

Gammas: 2 and 4 (QUICK: the draft 2 only; the draft runs at 0.4-0.6x nosd on the bundled pair).

Prompts, three groups: ``tasks`` repeats ACROSS requests (``data/repeated_tasks.py``: the same
question asked again, edits of one file, an agent loop re-sending its context); ``repeats`` and
``fresh`` are Spec-Bench categories split by how much an answer repeats its own prompt, measured in
the run: a calibration pass plays static n-gram gamma 3 on ``calibrate`` prompts of every category
at c=1 and ranks the categories by the n-gram drafts' acceptance (top ``GROUP_SIZE``: ``repeats``,
bottom: ``fresh``; the same groups for both settings). Every (group, load) has its own prompts,
the same for every policy and block.

Blocks: each policy runs ``BLOCKS`` times (QUICK 2, else 3), interleaved (ABC ABC ...), so drift of
the shared machine lands on every policy alike; a ratio is taken per block (policy over nosd, or over
the cell's best static arm, in the same block) and printed as its median [min-max] over blocks.

The suffix cache: the server keeps ``SUFFIX_CACHE`` (16) outputs in its cross-request tree (runtime
config ``suffix.cache_requests``), fewer where the scope has fewer requests between two policies'
runs of the same prompts (at least 3, one per task category; ``suffix_cache_size``): a Spec-Bench prompt replayed for the next policy must not find its own
earlier answer (the default 1000 would hand it over). The ``tasks`` prompts repeat within a cell, so
the cache serves them from the cell's own earlier requests (and its unmeasured wave).

Loads: closed loop at c = 1 and 4, 64 output tokens (QUICK: 48); a cell is an unmeasured wave of c
requests (the policy adapts; ``tasks``: at least 3, one per category, so the cache warms) then 2c + 2
measured ones (QUICK: max(3, 2c)). Settings: ``resident`` (the draft's weights in memory) and
``tight`` (elastic memory pinned offloaded: draft arms fall back to gamma 0 and are skipped; n-gram
and suffix arms still run). QUICK: ``resident`` only, groups ``tasks`` and ``fresh``.
Lossless: a fixed prompt set (the last of each group) at c=1, greedy, under every policy and setting,
compared with plain decoding's tokens up to a bf16 tie (``engine/lossless.py``).

A part of the run: ``POLICIES`` (names above; ``nosd`` always runs), ``LOADS``, ``SETTINGS``,
``GROUPS``, ``BLOCKS``; such a run writes to ``.../subset`` (``.../quick-subset``).

Writes ``build/results/sources[-pair]/{results.json,table.md}`` (QUICK: ``.../quick/``). Last line:
``RESULT suffix_vs_nosd_c1=... suffix_vs_lookup_c1=... all_vs_best_single_arm=...
both_vs_best_single_source=... ngram_vs_nosd_c1=... tight_both_vs_nosd_c1=... block_spread=... lossless=...``
(``*_c1``: the best arm of a source over nosd / over the best n-gram arm on its group at c=1
(``tasks`` for suffix, ``repeats`` for n-gram); ``all_vs_best_single_arm`` and
``both_vs_best_single_source``: geometric mean over the cells of nightjar-all (nightjar-both) over the
best static arm it can play, in hindsight per cell; ``block_spread``: the median half-range of the
per-block ratios over every cell and policy, what the run resolves).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightjar_contract.planner import DEFAULT_MAX_GAMMA
from nightjar_worker import loadgen
from nightjar_worker.data.repeated_tasks import CATEGORIES, repeated_task_prompts
from nightjar_worker.engine.lossless import lossless_mismatch, top2_margin
from nightjar_worker.models import add_pair_argument, elastic_memory_env
from nightjar_worker.serve import ServerProcess

from benchmarks.common import is_quick, print_result, print_table, results_dir, write_json
from benchmarks.serving import ADMIN_TOKEN, openai_client, pair_args, set_cpu_env

K = DEFAULT_MAX_GAMMA
GROUP_SIZE = 3  # Spec-Bench categories per group
SETTINGS = ("resident", "tight")
GROUPS = ("tasks", "repeats", "fresh")
SOURCES = ("draft", "ngram", "suffix")
SUFFIX_CACHE = 16  # outputs in the suffix cache at most (see the docstring and ``suffix_cache_size``)
LOSSLESS_PER_GROUP = 1


def policy_bodies(quick: bool, cache: int = SUFFIX_CACHE) -> dict[str, dict]:
    out: dict[str, dict] = {"nosd": {"policy": "nosd"}}
    for src in SOURCES:
        for k in (2,) if quick and src == "draft" else (2, 4):
            out[f"{src}-{k}"] = {"policy": "static", "static_gamma": k,
                                 **({} if src == "draft" else {"static_source": src})}
    arms = list(range(1, K + 1))
    out["nightjar-draft"] = {"policy": "nightjar"}
    out["nightjar-both"] = {"policy": "nightjar", "ngram_arms": arms}
    out["nightjar-all"] = {"policy": "nightjar", "ngram_arms": arms, "suffix_arms": arms}
    return {name: {"planner": {"max_gamma": K, **body}, "suffix": {"cache_requests": cache}}
            for name, body in out.items()}


def static_arms(policy: str) -> tuple[str, ...] | None:
    """The sources whose static arms (and nosd) an adaptive policy can play; None: a static policy."""
    return {"nightjar-draft": ("draft",), "nightjar-both": ("draft", "ngram"),
            "nightjar-all": SOURCES}.get(policy)


def is_static(policy: str) -> bool:
    return static_arms(policy) is None


@dataclass(frozen=True)
class Scope:
    """The cells a run measures: every policy x group x load x setting, or the part asked for."""

    policies: tuple[str, ...]
    loads: tuple[int, ...]
    settings: tuple[str, ...]
    groups: tuple[str, ...]
    blocks: int
    subset: bool


def parse_scope(quick: bool, policies: str = "", loads: str = "", settings: str = "", groups: str = "",
                blocks: str = "") -> Scope:
    """``POLICIES``/``LOADS``/``SETTINGS``/``GROUPS`` (comma-separated; empty: all) and ``BLOCKS`` to a
    ``Scope``; an unknown name is a ``ValueError`` naming the knob. ``nosd`` always runs (every ratio
    and the lossless check are against it)."""
    known, all_loads = tuple(policy_bodies(quick)), (1, 4)
    all_sets = ("resident",) if quick else SETTINGS
    all_groups = ("tasks", "fresh") if quick else GROUPS

    def items(text: str) -> set[str]:
        return {x.strip() for x in text.split(",") if x.strip()}

    for knob, asked, names in (("POLICIES", policies, known), ("SETTINGS", settings, SETTINGS), ("GROUPS", groups, GROUPS)):
        if bad := sorted(items(asked) - set(names)):
            raise ValueError(f"{knob}: unknown {bad}; known: {', '.join(names)}")
    if not all(x.isdigit() and int(x) >= 1 for x in items(loads)):
        raise ValueError(f"LOADS: concurrencies are integers >= 1 (got {loads!r})")
    if blocks and not (blocks.isdigit() and int(blocks) >= 1):
        raise ValueError(f"BLOCKS: an integer >= 1 (got {blocks!r})")
    want_pols, want_sets, want_groups = items(policies), items(settings), items(groups)
    pols = tuple(p for p in known if not want_pols or p in want_pols | {"nosd"})
    conc = tuple(sorted(int(x) for x in items(loads))) or all_loads
    sets = tuple(x for x in SETTINGS if x in want_sets) if want_sets else all_sets
    grps = tuple(g for g in GROUPS if g in want_groups) if want_groups else all_groups
    n_blocks = int(blocks) if blocks else (2 if quick else 3)
    return Scope(pols, conc, sets, grps, n_blocks, (pols, conc, sets, grps) != (known, all_loads, all_sets, all_groups))


def measured(quick: bool, c: int) -> int:
    """Measured requests of a cell at concurrency c (2 cores: a few per slot)."""
    return max(3, 2 * c) if quick else 2 * c + 2


def wave(group: str, c: int) -> int:
    """Unmeasured requests before a cell: c (the policy adapts to the load); ``tasks`` at least one
    per category, so the cache holds an earlier instance of each task when measuring starts."""
    return max(c, 3) if group == "tasks" else c


def replay_gap(scope: Scope, quick: bool) -> int:
    """The fewest requests that finish between two policies' runs of one cell's prompts: every other
    cell of a policy (its wave and measured requests) runs in between."""
    per_cell = [wave(g, c) + measured(quick, c) for g in scope.groups for c in scope.loads]
    return sum(per_cell) - max(per_cell)


def suffix_cache_size(scope: Scope, quick: bool) -> int:
    """The suffix cache's bound for this scope: ``SUFFIX_CACHE``, below the replay gap; at least 3 (one
    earlier instance of each task category). Too small a gap is a ``ValueError``."""
    size = min(SUFFIX_CACHE, replay_gap(scope, quick) - 1)
    if size < 3:
        raise ValueError(f"this scope replays a cell's prompts after {replay_gap(scope, quick)} other requests: "
                         "a replay would find its own answer in the suffix cache (run more groups or loads)")
    return size


def switch(url: str, body: dict) -> None:
    import httpx

    r = httpx.post(url + "/nightjar/v1/config", json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                   timeout=60)
    if r.status_code != 200 or r.json().get("status") != "applied":
        raise RuntimeError(f"switching to {body} failed: {r.status_code} {r.text}")


def _delta(before: dict, after: dict, name: str, **labels: str) -> float:
    return loadgen.metric_sum(after, name, **labels) - loadgen.metric_sum(before, name, **labels)


async def measure(srv: ServerProcess, warm: list, prompts: list, c: int, max_tokens: int) -> dict[str, Any]:
    """``wave`` unmeasured at concurrency c, then ``prompts`` measured: the load summary and each
    source's drafted and accepted tokens."""
    import httpx

    client = openai_client(srv.url)
    model = srv.model_name()
    async with httpx.AsyncClient(timeout=30) as http:
        await loadgen.run_closed_loop(client, model, warm, c, len(warm), max_tokens=max_tokens)
        before = await loadgen.scrape(http, srv.url)
        recs = await loadgen.run_closed_loop(client, model, prompts, c, len(prompts), max_tokens=max_tokens)
        after = await loadgen.scrape(http, srv.url)
    await client.close()
    s = loadgen.summarize(recs).as_dict()
    for src in SOURCES:
        s[f"{src}_drafted"] = _delta(before, after, "nightjar_draft_tokens_total", source=src)
        s[f"{src}_accepted"] = _delta(before, after, "nightjar_accepted_tokens_total", source=src)
        s[f"{src}_steps"] = _delta(before, after, "nightjar_steps_total", source=src)
        s[f"{src}_acceptance"] = s[f"{src}_accepted"] / s[f"{src}_drafted"] if s[f"{src}_drafted"] else None
    # one lookup per request per suffix step (hit: at least one draft token): the per-request step
    # count the simulator's calibration needs (drafts are ragged, 0..gamma)
    s["suffix_lookups"] = _delta(before, after, "nightjar_suffix_lookups_total")
    s["suffix_hits"] = _delta(before, after, "nightjar_suffix_lookups_total", result="hit")
    return s


def groups_by_repetition(acceptance: dict[str, float | None], size: int = GROUP_SIZE) -> dict[str, tuple[str, ...]]:
    """``repeats``: the ``size`` categories whose n-gram drafts were accepted most; ``fresh``: least
    (a category that drafted nothing repeats nothing). Ties go by name, so the split is reproducible."""
    ranked = sorted(acceptance, key=lambda cat: (-(acceptance[cat] or 0.0), cat))
    if len(ranked) < 2 * size:
        raise ValueError(f"need {2 * size} categories to split, got {len(ranked)}")
    return {"repeats": tuple(ranked[:size]), "fresh": tuple(ranked[-size:])}


def _calibration_prompts(pool: list, per_category: int) -> dict[str, list]:
    by_cat: dict[str, list] = {}
    for p in pool:
        if len(by_cat.setdefault(p.category, [])) < per_category:
            by_cat[p.category].append(p)
    return dict(sorted(by_cat.items()))


def group_prompts(pool: list, groups: dict[str, tuple[str, ...]], per_category: int) -> dict[str, list]:
    """Each group's prompts, categories interleaved until each runs out, without the calibration's."""
    seen = {p.qid for ps in _calibration_prompts(pool, per_category).values() for p in ps}
    out = {}
    for g, cats in groups.items():
        rows = itertools.zip_longest(*([p for p in pool if p.category == cat and p.qid not in seen] for cat in cats))
        out[g] = [p for row in rows for p in row if p is not None]
    return out


def cell_prompts(group: str, ps: list, loads: tuple[int, ...], quick: bool, lossless: int = LOSSLESS_PER_GROUP
                 ) -> tuple[dict[int, tuple[list, list]], list]:
    """Disjoint slices of a group's prompts: per load c its (wave, measured), and the last
    ``lossless`` for the lossless check. Too few prompts is a ``ValueError``."""
    need = sum(wave(group, c) + measured(quick, c) for c in loads) + lossless
    if len(ps) < need:
        raise ValueError(f"group {group} has {len(ps)} prompts, its cells need {need}")
    out, i = {}, 0
    for c in loads:
        w, n = wave(group, c), measured(quick, c)
        out[c] = (ps[i:i + w], ps[i + w:i + w + n])
        i += w + n
    return out, ps[len(ps) - lossless:]


async def calibrate(srv: ServerProcess, pool: list, per_category: int, max_tokens: int, cache: int
                    ) -> dict[str, float | None]:
    """n-gram acceptance per category (static n-gram gamma 3, ``per_category`` prompts each, c=1)."""
    import httpx

    switch(srv.url, {"planner": {"max_gamma": K, "policy": "static", "static_gamma": 3, "static_source": "ngram"},
                     "suffix": {"cache_requests": cache}})  # the file the worker's trees read keeps the bound
    client, model, out = openai_client(srv.url), srv.model_name(), {}
    async with httpx.AsyncClient(timeout=30) as http:
        for cat, ps in _calibration_prompts(pool, per_category).items():
            before = await loadgen.scrape(http, srv.url)
            await loadgen.run_closed_loop(client, model, ps, 1, len(ps), max_tokens=max_tokens)
            after = await loadgen.scrape(http, srv.url)
            drafted = _delta(before, after, "nightjar_draft_tokens_total", source="ngram")
            out[cat] = _delta(before, after, "nightjar_accepted_tokens_total", source="ngram") / drafted if drafted else None
    await client.close()
    return out


async def texts(srv: ServerProcess, prompts: list, max_tokens: int) -> list[dict[str, Any]]:
    """Greedy output of each prompt, one at a time: its text, tokens and each position's top-2
    logprob margin (what ``lossless_mismatch`` reads)."""
    client, model, out = openai_client(srv.url), srv.model_name(), []
    for p in prompts:
        r = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": p.text}],
                                                 max_tokens=max_tokens, temperature=0.0, logprobs=True, top_logprobs=2)
        content = r.choices[0].logprobs.content or []
        out.append({"text": r.choices[0].message.content, "tokens": [c.token for c in content],
                    "margins": [top2_margin(t.logprob for t in c.top_logprobs) for c in content]})
    await client.close()
    return out


def lossless_report(results: dict[str, Any]) -> dict[str, list[str]]:
    """Per setting/policy, how its outputs differ from plain decoding's (``nosd`` in the first
    setting run, resident unless only tight ran) beyond a bf16 tie (``lossless_mismatch``); empty
    lists: lossless."""
    ref = next(iter(results.values()))["texts"]["nosd"]
    return {f"{s}/{pol}": [f"prompt {i}: {why}" for i, (got, want) in enumerate(zip(outs, ref, strict=True))
                           if (why := lossless_mismatch(got["tokens"], want["tokens"], want["margins"]))]
            for s, res in results.items() for pol, outs in res["texts"].items()}


def aggregate(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell over its blocks: median tok/s and latencies, acceptance pooled (accepted / drafted
    summed), the per-block tok/s kept."""
    out: dict[str, Any] = {}
    for k, v in blocks[0].items():
        if isinstance(v, (int, float)) and all(isinstance(b.get(k), (int, float)) for b in blocks):
            out[k] = statistics.median(b[k] for b in blocks)
    for src in SOURCES:
        d, a = sum(b[f"{src}_drafted"] for b in blocks), sum(b[f"{src}_accepted"] for b in blocks)
        out[f"{src}_drafted"], out[f"{src}_accepted"] = d, a
        out[f"{src}_acceptance"] = a / d if d else None
    for k in ("suffix_lookups", "suffix_hits"):
        out[k] = sum(b.get(k, 0.0) for b in blocks)
    out["block_tok_s"] = [b["output_tok_s"] for b in blocks]
    return out


async def suffix_cache(srv: ServerProcess) -> dict[str, float]:
    """The suffix trees' memory and cached outputs as the engine last reported them."""
    import httpx

    async with httpx.AsyncClient(timeout=30) as http:
        m = await loadgen.scrape(http, srv.url)
    return {"bytes": loadgen.metric_sum(m, "nightjar_suffix_cache_bytes"),
            "cached_requests": loadgen.metric_sum(m, "nightjar_suffix_cached_requests")}


def _config_file(out: Path, cache: int) -> Path:
    p = out / "nightjar-runtime.json"
    p.write_text(json.dumps({"suffix": {"cache_requests": cache}}) + "\n")
    return p


def run_setting(setting: str, pair: str, out: Path, scope: Scope, quick: bool, max_tokens: int,
                groups: dict[str, tuple[str, ...]] | None) -> dict[str, Any]:
    """The scope's policies, groups and loads on one server, in ``scope.blocks`` interleaved blocks;
    ``groups`` None: calibrate them first (``res["groups"]``)."""
    env = {"NIGHTJAR_ADMIN_TOKEN": ADMIN_TOKEN}
    if setting == "tight":
        env.update(elastic_memory_env(pair, {"enabled": True, "mode": "offloaded"}))
    t0 = time.perf_counter()
    print(f"[{setting}] starting the server ...", flush=True)
    res: dict[str, Any] = {"cells": {}, "blocks": {}, "texts": {}}
    per_cal = 1 if quick else 2
    cache = suffix_cache_size(scope, quick)
    args = [*pair_args(pair), "--scheduler", "nightjar", "--num-speculative-tokens", str(K),
            "--config", str(_config_file(out, cache))]
    with ServerProcess(args, env=env, log_path=out / f"server-{setting}.log") as srv:
        res["server_start_s"] = round(time.perf_counter() - t0, 1)
        pool = loadgen.fit_to_context(srv.url, srv.model_name(), loadgen.load_prompts(), max_tokens)
        if groups is None:
            res["calibration"] = asyncio.run(calibrate(srv, pool, per_cal, max_tokens, cache))
            groups = groups_by_repetition(res["calibration"])
            print("  n-gram acceptance per category: " + ", ".join(
                f"{k} {_acc(a)}" for k, a in res["calibration"].items()) + f"; groups {groups}", flush=True)
        res["groups"] = groups
        need = sum(wave("tasks", c) + measured(quick, c) for c in scope.loads) + LOSSLESS_PER_GROUP
        spec = group_prompts(pool, groups, per_cal)
        tasks = loadgen.fit_to_context(srv.url, srv.model_name(), repeated_task_prompts(need // 3 + 1), max_tokens)
        sets = {g: cell_prompts(g, tasks if g == "tasks" else spec[g], scope.loads, quick) for g in scope.groups}
        lossless = [p for g in scope.groups for p in sets[g][1]]
        bodies = policy_bodies(quick, cache)
        pols = [p for p in scope.policies if not (setting == "tight" and p.startswith("draft-"))]  # draft: nosd there
        for b in range(scope.blocks):
            for name in pols:
                switch(srv.url, bodies[name])
                if b == 0:
                    res["texts"][name] = asyncio.run(texts(srv, lossless, max_tokens))
                for g in scope.groups:
                    for c in scope.loads:
                        warm, ps = sets[g][0][c]
                        s = asyncio.run(measure(srv, warm, ps, c, max_tokens))
                        res["blocks"].setdefault(f"{name}|{g}|{c}", []).append(s)
                        acc = next((s[f"{src}_acceptance"] for src in ("suffix", "ngram", "draft") if s[f"{src}_drafted"]), None)
                        print(f"  [{b + 1}/{scope.blocks}] {name:15s} {g:8s} c={c}  {s['output_tok_s']:7.1f} tok/s  "
                              f"acceptance {_acc(acc)}", flush=True)
            write_json(out / f"blocks-{setting}.json", res["blocks"])  # what a cut-short run keeps
        res["cells"] = {k: aggregate(v) for k, v in res["blocks"].items()}
        res["suffix_cache"] = asyncio.run(suffix_cache(srv))
        res["duration_s"] = round(time.perf_counter() - t0, 1)
    return res


def _acc(a: float | None) -> str:
    return "-" if a is None else f"{a:.2f}"


def block_ratios(cells: dict[str, Any], pol: str, g: str, c: int | str, den: str) -> list[float] | None:
    """``pol`` over ``den`` in one cell, block by block (None: a cell not measured)."""
    a, b = cells.get(f"{pol}|{g}|{c}"), cells.get(f"{den}|{g}|{c}")
    if not a or not b:
        return None
    return [x / y for x, y in zip(a["block_tok_s"], b["block_tok_s"], strict=False) if y]


def best_static(cells: dict[str, Any], g: str, c: int | str, sources: tuple[str, ...] = SOURCES) -> str | None:
    """The static arm (nosd or a ``sources`` arm) with the highest median tok/s in the cell."""
    arms = [p for p in {k.split("|")[0] for k in cells}
            if is_static(p) and (p == "nosd" or p.split("-")[0] in sources) and f"{p}|{g}|{c}" in cells]
    return max(sorted(arms), key=lambda p: cells[f"{p}|{g}|{c}"]["output_tok_s"], default=None)


def spread(xs: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(xs), min(xs), max(xs)


def _geo_by_block(per_cell: list[list[float]]) -> list[float]:
    """Geometric mean over cells, block by block (blocks every cell has)."""
    n = min(len(r) for r in per_cell)
    return [math.prod(r[b] for r in per_cell) ** (1 / len(per_cell)) for b in range(n)]


def headline(results: dict[str, Any]) -> dict[str, list[float] | None]:
    """Each RESULT ratio per block (None: this run measured no cells that give it); the RESULT value
    is the median over blocks."""
    res = results.get("resident", {}).get("cells", {})
    where = sorted({tuple(k.split("|")[1:]) for k in res})

    def best_of(cells: dict, src: str, g: str, c: int) -> list[float] | None:
        """Per block: the best (by median) arm of ``src`` over nosd."""
        arms = [k.split("|")[0] for k in cells if k.startswith(f"{src}-") and k.endswith(f"|{g}|{c}")]
        if not arms or f"nosd|{g}|{c}" not in cells:
            return None
        top = max(sorted(arms), key=lambda p: cells[f"{p}|{g}|{c}"]["output_tok_s"])
        return block_ratios(cells, top, g, c, "nosd")

    def vs_best(pol: str) -> list[float] | None:
        rs = [r for g, c in where if (arm := best_static(res, g, c, static_arms(pol) or ()))
              and (r := block_ratios(res, pol, g, c, arm))]
        return _geo_by_block(rs) if rs else None

    sfx, ngr = best_of(res, "suffix", "tasks", 1), best_of(res, "ngram", "tasks", 1)
    tight = results.get("tight", {}).get("cells", {})
    return {
        "suffix_vs_nosd_c1": sfx,
        "suffix_vs_lookup_c1": [a / b for a, b in zip(sfx, ngr, strict=False)] if sfx and ngr else None,
        "all_vs_best_single_arm": vs_best("nightjar-all"),
        "both_vs_best_single_source": vs_best("nightjar-both"),
        "ngram_vs_nosd_c1": best_of(res, "ngram", "repeats", 1),
        "tight_both_vs_nosd_c1": block_ratios(tight, "nightjar-both", "repeats", 1, "nosd"),
    }


def resolution(results: dict[str, Any]) -> float | None:
    """The median half-range of the per-block ratios to nosd over every cell and policy: differences
    smaller than this are within the run's block-to-block spread."""
    halves = []
    for res in results.values():
        cells = res["cells"]
        for key in cells:
            pol, g, c = key.split("|")
            r = block_ratios(cells, pol, g, c, "nosd") if pol != "nosd" else None
            if r and len(r) > 1:
                halves.append((max(r) - min(r)) / 2)
    return statistics.median(halves) if halves else None


def _fmt(r: list[float] | None) -> str:
    if not r:
        return "-"
    m, lo, hi = spread(r)
    return f"{m:.2f} [{lo:.2f}-{hi:.2f}]" if len(r) > 1 else f"{m:.2f}"


def tables(results: dict[str, Any], scope: Scope, pair: str) -> list[str]:
    first = next(iter(results.values()))
    notes_groups = "Groups: tasks = " + ", ".join(CATEGORIES) + " (repeat across requests); " + "; ".join(f"{g} = " + ", ".join(f"{cat} {_acc(first.get('calibration', {}).get(cat))}" for cat in cats)
                           for g, cats in first["groups"].items()) + " (n-gram acceptance in the calibration pass)."
    text = []
    for setting, res in results.items():
        cells = res["cells"]
        pols = [p for p in scope.policies if any(k.startswith(p + "|") for k in cells)]
        where = sorted({tuple(k.split("|")[1:]) for k in cells}, key=lambda w: (GROUPS.index(w[0]), int(w[1])))
        rows, rows_best = [], []
        for g, c in where:
            best = best_static(cells, g, c)
            acc = {src: max((cells[f"{p}|{g}|{c}"][f"{src}_acceptance"] or 0.0 for p in pols
                             if p.startswith(f"{src}-") and f"{p}|{g}|{c}" in cells), default=None) for src in ("ngram", "suffix")}
            rows.append([g, c, _acc(acc["ngram"]), _acc(acc["suffix"]), *(
                "-" if (cell := cells.get(f"{p}|{g}|{c}")) is None else
                f"{cell['output_tok_s']:.1f} ({_fmt(block_ratios(cells, p, g, c, 'nosd'))})" for p in pols)])
            rows_best.append([g, c, best or "-", *(
                _fmt(block_ratios(cells, p, g, c, arm)) if (arm := best_static(cells, g, c, static_arms(p) or ()))
                else "-" for p in pols if not is_static(p))])
        text.append(print_table(
            f"bench-sources ({pair}, {setting}): output tok/s, median of {scope.blocks} blocks (ratio to nosd: median [min-max] of the per-block ratios)",
            ["group", "c", "n-gram acc", "suffix acc", *pols], rows,
            notes="acc: the best static arm's acceptance of that source in the cell. " + notes_groups))
        text.append(print_table(
            f"bench-sources ({pair}, {setting}): each Nightjar policy over the best static arm it can play (chosen per cell in hindsight), median [min-max] over blocks",
            ["group", "c", "best static arm", *(p for p in pols if not is_static(p))], rows_best,
            notes="nightjar-draft plays nosd and draft-k; nightjar-both also ngram-k; nightjar-all also suffix-k."))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_argument(ap)
    ap.add_argument("--max-tokens", type=int, default=None)
    args = ap.parse_args(argv)
    quick = is_quick()
    try:
        scope = parse_scope(quick, *(os.environ.get(k, "") for k in ("POLICIES", "LOADS", "SETTINGS", "GROUPS", "BLOCKS")))
    except ValueError as e:
        ap.error(str(e))
    try:
        cache_size = suffix_cache_size(scope, quick)
    except ValueError as e:
        ap.error(str(e))
    set_cpu_env()
    max_tokens = args.max_tokens or (48 if quick else 64)
    name = "sources" if args.pair == "bundled" else f"sources-{args.pair}"
    part = "-".join(x for x, on in (("quick", quick), ("subset", scope.subset)) if on)
    out = results_dir(f"{name}/{part}" if part else name)
    results: dict[str, Any] = {}
    for s in scope.settings:
        groups = next(iter(results.values()))["groups"] if results else None
        results[s] = run_setting(s, args.pair, out, scope, quick, max_tokens, groups)
        write_json(out / "results.json", {"pair": args.pair, "partial": True, "results": results})  # kept if a later setting fails

    text = tables(results, scope, args.pair)
    heads = headline(results)
    res_spread = resolution(results)
    cache = {s: r["suffix_cache"] for s, r in results.items()}
    report = lossless_report(results)
    lossless = not any(report.values())
    texts_all = [[o["text"] for o in t] for s in results.values() for t in s["texts"].values()]
    identical = sum(t == texts_all[0] for t in texts_all)
    lines = [
        f"Blocks: {scope.blocks} per policy, interleaved. This run resolves differences above "
        + ("-" if res_spread is None else f"±{100 * res_spread:.0f} %")
        + " (the median half-range of a cell's per-block ratios to nosd); smaller ones are noise here.",
        "Nightjar over both sources (draft, n-gram) vs the best static arm (issue 50 item 6): "
        + _fmt(heads["both_vs_best_single_source"]) + " (geometric mean over cells, median [min-max] over blocks); "
        "over all three sources: " + _fmt(heads["all_vs_best_single_arm"]) + ".",
        "Suffix cache at the end: " + "; ".join(f"{s} {c['bytes'] / 2**20:.2f} MiB, {c['cached_requests']:.0f} outputs"
                                                 for s, c in cache.items())
        + f" (cache_requests {cache_size}).",
        f"lossless: {identical} of {len(texts_all)} policy runs gave plain decoding's exact text; "
        + ("the others part from it only where its top-2 tokens tied within a bf16 rounding" if lossless else
           "; ".join(f"{k}: {v}" for k, v in report.items() if v)),
    ]
    held = all(c["cached_requests"] <= cache_size for c in cache.values())
    if not held:  # then a replayed prompt could find its own answer: the suffix figures are not fresh ones
        lines.insert(3, f"WARNING: the engine kept more outputs than the bound {cache_size}: the suffix cache did not "
                        "take the runtime config's suffix.cache_requests, and replayed prompts could draft their own "
                        "earlier answers (suffix and nightjar-all figures over-state fresh traffic).")
    for line in lines:
        print(line, flush=True)
    (out / "table.md").write_text("\n\n".join([*text, "\n\n".join(lines)]) + "\n")
    summary = {"pair": args.pair, "quick": quick, "max_tokens": max_tokens, "K": K, "suffix_cache_requests": cache_size,
               "scope": {"policies": scope.policies, "loads": scope.loads, "settings": scope.settings,
                         "groups": scope.groups, "blocks": scope.blocks},
               **{k: (spread(v)[0] if v else None) for k, v in heads.items()},
               "blocks_of": heads, "block_spread": res_spread, "suffix_cache": cache, "suffix_cache_bound_held": held,
               "lossless": lossless, "lossless_report": report, "identical_texts": identical, "results": results}
    write_json(out / "results.json", summary)
    if missing := [k for k, v in heads.items() if not v]:
        print(f"not in this run's cells: {', '.join(missing)}", flush=True)
    print_result(**{k: f"{spread(v)[0]:.3f}" for k, v in heads.items() if v},
                 **({"block_spread": f"{res_spread:.3f}"} if res_spread is not None else {}),
                 lossless=str(lossless).lower())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
