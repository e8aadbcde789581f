"""``make bench-ngram``: prompt lookup (n-gram) drafts beside the draft model, on the real worker.

One Nightjar-scheduler server per memory setting (K=4), its policy switched through the admin
endpoint between runs (bench-serve's switch mode), every policy on the same prompts and loads:

* ``nosd``            gamma 0 every step;
* ``draft-k``         the draft model, gamma k, every step;
* ``ngram-k``         prompt lookup, gamma k, every step (vLLM's ngram method, in the same engine);
* ``nightjar-draft``  Nightjar over gamma 0 and the draft model's arms;
* ``nightjar-both``   Nightjar over gamma 0, the draft's arms and the n-gram arms.

Prompts: Spec-Bench categories split by how much their answers repeat their prompt, measured in the
run: a calibration pass plays static n-gram gamma 3 on ``CALIBRATE`` prompts of every category at
concurrency 1 and reads the n-gram drafts' acceptance per category; the ``GROUP_SIZE`` categories
with the highest acceptance form ``repeats``, those with the lowest ``fresh`` (the same groups for
both settings). Loads: closed loop at concurrency 1 and 8 (QUICK: 1 and 4), max(6, 3c) requests
(QUICK: 3c) after an unmeasured wave of c requests in which the policy adapts to the load. Settings:
``resident`` (the draft's weights in memory) and ``tight`` (elastic memory pinned offloaded: the
draft cannot run, its bytes are KV cache; draft arms fall back to gamma 0, n-gram arms still run).
Lossless: a fixed prompt set at c=1, greedy, under every policy and setting, compared with plain
decoding's tokens up to a bf16 tie (``engine/lossless.py``).

A part of the run (a slow pair: the Qwen pair decodes about 10x slower than the bundled one on 2
cores): ``POLICIES`` (names above, comma-separated; ``nosd`` always runs, it is the baseline),
``LOADS`` (concurrencies) and ``SETTINGS`` (``resident``, ``tight``); such a run writes to
``.../subset`` (``.../quick-subset``) and its RESULT line has the keys its cells can give.

Writes ``benchmarks/results/ngram[-pair]/{results.json,table.md}`` (QUICK: ``.../quick/``). Last line:
``RESULT ngram_vs_nosd_c1=... both_vs_best_single_source=... tight_both_vs_nosd_c1=... lossless=...``
(``both_vs_best_single_source``: geometric mean over groups and loads of nightjar-both's tok/s over
the best of the other adaptive and static policies in that cell, so the static oracle of each cell).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightjar_contract.planner import DEFAULT_MAX_GAMMA
from nightjar_worker import loadgen
from nightjar_worker.engine.lossless import lossless_mismatch, top2_margin
from nightjar_worker.models import add_pair_argument, elastic_memory_env
from nightjar_worker.serve import ServerProcess

from benchmarks.common import is_quick, print_result, print_table, results_dir, write_json
from benchmarks.serving import ADMIN_TOKEN, openai_client, pair_args, set_cpu_env

K = DEFAULT_MAX_GAMMA
CALIBRATE = 2  # prompts per category in the calibration pass
GROUP_SIZE = 3  # categories per group
SETTINGS = ("resident", "tight")


def policy_bodies(quick: bool) -> dict[str, dict]:
    gammas = (2, 4) if quick else (1, 2, 3, 4)
    out: dict[str, dict] = {"nosd": {"policy": "nosd"}}
    for k in gammas:
        out[f"draft-{k}"] = {"policy": "static", "static_gamma": k}
    for k in gammas:
        out[f"ngram-{k}"] = {"policy": "static", "static_gamma": k, "static_source": "ngram"}
    out["nightjar-draft"] = {"policy": "nightjar"}
    out["nightjar-both"] = {"policy": "nightjar", "ngram_arms": list(range(1, K + 1))}
    return {name: {"planner": {"max_gamma": K, **body}} for name, body in out.items()}


@dataclass(frozen=True)
class Scope:
    """The cells a run measures: every policy x load x setting, or the part asked for."""

    policies: tuple[str, ...]
    loads: tuple[int, ...]
    settings: tuple[str, ...]
    subset: bool


def parse_scope(quick: bool, policies: str = "", loads: str = "", settings: str = "") -> Scope:
    """``POLICIES``/``LOADS``/``SETTINGS`` (comma-separated; empty: all) to a ``Scope``; an unknown
    name is a ``ValueError`` naming the knob. ``nosd`` always runs (every ratio and the lossless
    check are against it)."""
    known, all_loads = tuple(policy_bodies(quick)), ((1, 4) if quick else (1, 8))

    def items(text: str) -> set[str]:
        return {x.strip() for x in text.split(",") if x.strip()}

    for knob, asked, names in (("POLICIES", policies, known), ("SETTINGS", settings, SETTINGS)):
        if bad := sorted(items(asked) - set(names)):
            raise ValueError(f"{knob}: unknown {bad}; known: {', '.join(names)}")
    if not all(x.isdigit() and int(x) >= 1 for x in items(loads)):
        raise ValueError(f"LOADS: concurrencies are integers >= 1 (got {loads!r})")
    want_pols, want_sets = items(policies), items(settings)
    pols = tuple(p for p in known if not want_pols or p in want_pols | {"nosd"})
    conc = tuple(sorted(int(x) for x in items(loads))) or all_loads
    sets = tuple(x for x in SETTINGS if not want_sets or x in want_sets)
    return Scope(pols, conc, sets, (pols, conc, sets) != (known, all_loads, SETTINGS))


def switch(url: str, body: dict) -> None:
    import httpx

    r = httpx.post(url + "/nightjar/v1/config", json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                   timeout=60)
    if r.status_code != 200 or r.json().get("status") != "applied":
        raise RuntimeError(f"switching to {body} failed: {r.status_code} {r.text}")


def _delta(before: dict, after: dict, name: str, **labels: str) -> float:
    return loadgen.metric_sum(after, name, **labels) - loadgen.metric_sum(before, name, **labels)


async def measure(srv: ServerProcess, prompts: list, c: int, n: int, max_tokens: int) -> dict[str, Any]:
    import httpx

    client = openai_client(srv.url)
    model = srv.model_name()
    async with httpx.AsyncClient(timeout=30) as http:
        await loadgen.run_closed_loop(client, model, prompts[n:], c, c, max_tokens=max_tokens)  # unmeasured wave
        before = await loadgen.scrape(http, srv.url)
        recs = await loadgen.run_closed_loop(client, model, prompts[:n], c, n, max_tokens=max_tokens)
        after = await loadgen.scrape(http, srv.url)
    await client.close()
    s = loadgen.summarize(recs).as_dict()
    for src in ("draft", "ngram"):
        drafted = _delta(before, after, "nightjar_draft_tokens_total", source=src)
        s[f"{src}_drafted"] = drafted
        s[f"{src}_acceptance"] = _delta(before, after, "nightjar_accepted_tokens_total", source=src) / drafted \
            if drafted else None
    return s


def groups_by_repetition(acceptance: dict[str, float | None], size: int = GROUP_SIZE) -> dict[str, tuple[str, ...]]:
    """``repeats``: the ``size`` categories whose n-gram drafts were accepted most; ``fresh``: least
    (a category that drafted nothing repeats nothing). Ties go by name, so the split is reproducible."""
    ranked = sorted(acceptance, key=lambda cat: (-(acceptance[cat] or 0.0), cat))
    if len(ranked) < 2 * size:
        raise ValueError(f"need {2 * size} categories to split, got {len(ranked)}")
    return {"repeats": tuple(ranked[:size]), "fresh": tuple(ranked[-size:])}


def _calibration_prompts(pool: list) -> dict[str, list]:
    by_cat: dict[str, list] = {}
    for p in pool:
        if len(by_cat.setdefault(p.category, [])) < CALIBRATE:
            by_cat[p.category].append(p)
    return dict(sorted(by_cat.items()))


def group_prompts(pool: list, groups: dict[str, tuple[str, ...]]) -> dict[str, list]:
    """Each group's prompts, categories interleaved until each runs out (none twice: a repeat would
    hit the prefix cache), without the calibration's (they warmed it)."""
    seen = {p.qid for ps in _calibration_prompts(pool).values() for p in ps}
    out = {}
    for g, cats in groups.items():
        rows = itertools.zip_longest(*([p for p in pool if p.category == cat and p.qid not in seen] for cat in cats))
        out[g] = [p for row in rows for p in row if p is not None]
    return out


async def calibrate(srv: ServerProcess, pool: list, max_tokens: int) -> dict[str, float | None]:
    """n-gram acceptance per category (static n-gram gamma 3, ``CALIBRATE`` prompts each, c=1)."""
    import httpx

    switch(srv.url, {"planner": {"max_gamma": K, "policy": "static", "static_gamma": 3, "static_source": "ngram"}})
    client, model, out = openai_client(srv.url), srv.model_name(), {}
    async with httpx.AsyncClient(timeout=30) as http:
        for cat, ps in _calibration_prompts(pool).items():
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


def run_setting(setting: str, pair: str, out: Path, scope: Scope, quick: bool, max_tokens: int,
                groups: dict[str, tuple[str, ...]] | None) -> dict[str, Any]:
    """The scope's policies and loads on one server; ``groups`` None: calibrate them first
    (``res["groups"]``)."""
    env = {"NIGHTJAR_ADMIN_TOKEN": ADMIN_TOKEN}
    if setting == "tight":
        env.update(elastic_memory_env(pair, {"enabled": True, "mode": "offloaded"}))
    t0 = time.perf_counter()
    print(f"[{setting}] starting the server ...", flush=True)
    res: dict[str, Any] = {"cells": {}, "texts": {}}
    with ServerProcess([*pair_args(pair), "--scheduler", "nightjar", "--num-speculative-tokens", str(K)], env=env,
                       log_path=out / f"server-{setting}.log") as srv:
        res["server_start_s"] = round(time.perf_counter() - t0, 1)
        pool = loadgen.fit_to_context(srv.url, srv.model_name(), loadgen.load_prompts(), max_tokens)
        if groups is None:
            res["calibration"] = asyncio.run(calibrate(srv, pool, max_tokens))
            groups = groups_by_repetition(res["calibration"])
            print("  n-gram acceptance per category: " + ", ".join(
                f"{k} {_acc(a)}" for k, a in res["calibration"].items())
                  + f"; groups {groups}", flush=True)
        res["groups"] = groups
        sets = group_prompts(pool, groups)
        lossless = [ps[0] for ps in sets.values()] + [ps[1] for ps in sets.values()]
        bodies = policy_bodies(quick)
        for name in scope.policies:
            body = bodies[name]
            if setting == "tight" and name.startswith("draft-"):
                continue  # the draft cannot run: these are nosd
            switch(srv.url, body)
            res["texts"][name] = asyncio.run(texts(srv, lossless, max_tokens))
            for g, ps in sets.items():
                for c in scope.loads:
                    n = 3 * c if quick else max(6, 3 * c)
                    s = asyncio.run(measure(srv, ps, c, n, max_tokens))
                    res["cells"][f"{name}|{g}|{c}"] = s
                    acc = s["ngram_acceptance"] if s["ngram_drafted"] else s["draft_acceptance"]
                    print(f"  {name:15s} {g:8s} c={c}  {s['output_tok_s']:7.1f} tok/s  "
                          f"acceptance {'-' if acc is None else f'{acc:.2f}'}", flush=True)
    return res


def _acc(a: float | None) -> str:
    return "-" if a is None else f"{a:.2f}"


def tok_s(results: dict[str, Any], setting: str, pol: str, g: str, c: int) -> float | None:
    cell = results.get(setting, {}).get("cells", {}).get(f"{pol}|{g}|{c}")
    return cell["output_tok_s"] if cell else None


def headline(results: dict[str, Any]) -> dict[str, float | None]:
    """The RESULT ratios from the cells a run measured (None: it measured none that give it)."""
    def ratio(num: list[float | None], den: float | None) -> float | None:
        num_ = [v for v in num if v is not None]
        return max(num_) / den if num_ and den else None

    ngram_pols = [p for p in policy_bodies(False) if p.startswith("ngram-")]
    cells = results.get("resident", {}).get("cells", {})
    ratios = []  # nightjar-both over the best other policy, per (group, load)
    for key, both in cells.items():
        pol, *where = key.split("|")
        if pol == "nightjar-both":
            best = max(v["output_tok_s"] for k, v in cells.items() if k.split("|")[1:] == where and k != key)
            ratios.append(both["output_tok_s"] / best)
    return {
        "ngram_vs_nosd_c1": ratio([tok_s(results, "resident", p, "repeats", 1) for p in ngram_pols],
                                  tok_s(results, "resident", "nosd", "repeats", 1)),
        "both_vs_best_single_source": math.prod(ratios) ** (1 / len(ratios)) if ratios else None,
        "tight_both_vs_nosd_c1": ratio([tok_s(results, "tight", "nightjar-both", "repeats", 1)],
                                       tok_s(results, "tight", "nosd", "repeats", 1)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_argument(ap)
    ap.add_argument("--max-tokens", type=int, default=None)
    args = ap.parse_args(argv)
    quick = is_quick()
    try:
        scope = parse_scope(quick, *(os.environ.get(k, "") for k in ("POLICIES", "LOADS", "SETTINGS")))
    except ValueError as e:
        ap.error(str(e))
    set_cpu_env()
    max_tokens = args.max_tokens or (48 if quick else 128)
    name = "ngram" if args.pair == "bundled" else f"ngram-{args.pair}"
    part = "-".join(x for x, on in (("quick", quick), ("subset", scope.subset)) if on)
    out = results_dir(f"{name}/{part}" if part else name)
    results: dict[str, Any] = {}
    for s in scope.settings:
        groups = next(iter(results.values()))["groups"] if results else None
        results[s] = run_setting(s, args.pair, out, scope, quick, max_tokens, groups)
        write_json(out / "results.json", {"pair": args.pair, "partial": True, "results": results})  # kept if a later setting fails
    first = next(iter(results.values()))

    text = []
    for setting, res in results.items():
        pols = [p for p in scope.policies if any(k.startswith(p + "|") for k in res["cells"])]
        rows = []
        for g, c in sorted({tuple(k.split("|")[1:]) for k in res["cells"]}):
            base = tok_s(results, setting, "nosd", g, int(c)) or float("nan")
            acc = max((res["cells"][f"{p}|{g}|{c}"]["ngram_acceptance"] or 0.0 for p in pols if p.startswith("ngram-")),
                      default=0.0)
            vals = [tok_s(results, setting, p, g, int(c)) for p in pols]
            rows.append([setting, g, c, f"{acc:.2f}", *("-" if v is None else f"{v:.1f} ({v / base:.2f})" for v in vals)])
        text.append(print_table(
            f"bench-ngram ({args.pair}, {setting}): output tok/s (ratio to nosd)",
            ["setting", "group", "c", "n-gram acc", *pols], rows,
            notes="n-gram acc: the best static n-gram arm's acceptance in that cell (how much the group repeats "
                  "its prompt). Groups, by the calibration's n-gram acceptance per category: " + "; ".join(
                      f"{g} = " + ", ".join(f"{cat} {_acc(first['calibration'].get(cat))}" for cat in cats)
                      for g, cats in first["groups"].items()) + "."))
    (out / "table.md").write_text("\n\n".join(text) + "\n")

    heads = headline(results)
    report = lossless_report(results)
    lossless = not any(report.values())
    texts_all = [[o["text"] for o in t] for s in results.values() for t in s["texts"].values()]
    identical = sum(t == texts_all[0] for t in texts_all)
    print(f"lossless: {identical} of {len(texts_all)} policy runs gave plain decoding's exact text; "
          + ("the others part from it only where its top-2 tokens tied within a bf16 rounding" if lossless else
             "; ".join(f"{k}: {v}" for k, v in report.items() if v)), flush=True)
    summary = {"pair": args.pair, "quick": quick, "max_tokens": max_tokens, "K": K,
               "scope": {"policies": scope.policies, "loads": scope.loads, "settings": scope.settings},
               **heads, "lossless": lossless, "lossless_report": report, "identical_texts": identical,
               "results": results}
    write_json(out / "results.json", summary)
    if missing := [k for k, v in heads.items() if v is None]:
        print(f"not in this run's cells: {', '.join(missing)}", flush=True)
    print_result(**{k: f"{v:.3f}" for k, v in heads.items() if v is not None}, lossless=str(lossless).lower())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
