"""The simulator's source table (``worker/nightjar_worker/sim/sources.json``) from the real engine.

``python -m benchmarks.sources_calibration [bundled.json] [qwen.json]`` reads the n-gram runs of
``make bench-ngram`` (now ``make bench-sources``; defaults: the QUICK runs under
``build/results/ngram*/``) and, for the suffix source, the newest ``make bench-sources`` run of each
pair under ``build/results/sources*/`` (``--suffix bundled=PATH``), and writes, per CPU profile
(a pair with no bench-ngram or bench-sources run on this machine keeps its committed n-gram entry and
prefill cost, or suffix entry):

* the n-gram source's acceptance per Spec-Bench category: bench-ngram's calibration pass (static
  n-gram gamma 3, concurrency 1, accepted / drafted per category), as a geometric alpha
  (``alpha_from_rate``), pooled with the acceptance each static n-gram cell measured on its group's
  categories (the pass has two prompts per category: the groups it picks as least repetitive
  repeat their prompts 2-3x more in the cells);
* the engine's prefill cost per prompt token (``prefill_s_per_token``): the slope of nosd's TTFT
  over the two groups' mean prompt lengths at concurrency 1 (the profile's decode steps,
  extrapolated to hundreds of tokens, over-price a CPU prefill several times);
* its verification cost: one scalar per pair, ``verify_per_draft_token``, fitted on the static
  n-gram cells at concurrency 1 (per-token speed-up over nosd = E[tokens] / (1 + v g), E[tokens] from
  the cell's measured acceptance), averaged over the cells; the host-side lookup is inside it;
* the suffix source (where the pair has a bench-sources run): acceptance per category from the
  static suffix cells (each cell's accepted tokens per lookup, one lookup per request per step, as a
  geometric alpha at the arm's gamma: its drafts are ragged, 0..gamma, so accepted / drafted would
  over-state what a step of gamma yields), pooled over the cells of each group's categories (``tasks``:
  the categories that repeat across requests); its lookup cost per request measured here on
  Arctic's tree (``lookup_seconds``: a speculate and an append on a cache like the bench's); its
  verification cost fitted as the n-gram's, at c=1, less the lookup.

The roofline profile has no engine: it gets the mean of the pairs' alphas per category (n-gram:
both pairs; suffix: the pairs that have it), the roofline's own target-only verification
(``sim/roofline.py``, ``verify_grid``) and, for the suffix, the lookup cost measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from nightjar_worker.data.repeated_tasks import CATEGORIES as TASK_CATEGORIES
from nightjar_worker.sim.profile import expected_tokens
from nightjar_worker.sim.roofline import verify_grid
from nightjar_worker.sim.sources import SOURCES_PATH, alpha_from_rate
from nightjar_worker.sim.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {  # bench-ngram pair -> (cost profile name, default results)
    "bundled": ("cpu-smollm2-135m", ROOT / "build/results/ngram/quick/results.json"),
    "qwen": ("cpu-qwen2.5-coder-1.5b-0.5b-fp32", ROOT / "build/results/ngram-qwen/quick-subset/results.json"),
}
SUFFIX_RUNS = ("sources{pair}/results.json", "sources{pair}/subset/results.json", "sources{pair}/quick/results.json",
               "sources{pair}/quick-subset/results.json")  # bench-sources runs, under build/results/
CALIBRATION_GAMMA = 3  # bench-ngram's calibration pass plays static n-gram gamma 3
ALPHA_CAP = 0.95


def ngram_entry(results: dict, origin: str) -> dict:
    """The n-gram source of one pair from one bench-ngram results.json (see the module docstring)."""
    res = results["results"]["resident"]
    rates = {c: r for c, r in res["calibration"].items() if r is not None}
    if not rates:
        raise ValueError(f"{origin}: the calibration pass drafted nothing")
    # two prompts per category cannot tell 1.0 from 0.95; alpha 1 would accept every draft forever
    alpha = {c: min(alpha_from_rate(r, CALIBRATION_GAMMA), ALPHA_CAP) for c, r in sorted(rates.items())}
    cells = res["cells"]
    # two prompts per category are few: each static n-gram cell's acceptance (3c requests of a group
    # of categories) is one more measurement of its group's categories, pooled with equal weight
    pooled: dict[str, list[float]] = {c: [a] for c, a in alpha.items()}
    for key, cell in cells.items():
        pol, group, _ = key.split("|")
        if pol.startswith("ngram-") and cell.get("ngram_acceptance") is not None:
            a = min(alpha_from_rate(cell["ngram_acceptance"], int(pol.split("-")[1])), ALPHA_CAP)
            for c in res["groups"].get(group, ()):
                pooled.setdefault(c, []).append(a)
    alpha = {c: round(statistics.fmean(v), 4) for c, v in sorted(pooled.items())}
    alpha["all"] = round(statistics.fmean(alpha.values()), 4)
    fits = []
    for key, cell in cells.items():
        pol, group, conc = key.split("|")
        if not pol.startswith("ngram-") or conc != "1" or not cell.get("ngram_acceptance"):
            continue
        g = int(pol.split("-")[1])
        base = cells.get(f"nosd|{group}|1")
        if not base:
            continue
        speedup = cell["output_tok_s"] / base["output_tok_s"]
        e = expected_tokens(g, alpha_from_rate(cell["ngram_acceptance"], g))
        fits.append(max((e / speedup - 1.0) / g, 0.0))
    if not fits:
        raise ValueError(f"{origin}: no static n-gram cell at concurrency 1 to fit the verification cost")
    return {
        "proposer": "host",
        "alpha": alpha,
        "verify_per_draft_token": round(statistics.fmean(fits), 4),
        "lookup_s_per_request": 0.0,
        "measured": f"make bench-ngram (pair {results.get('pair')}, QUICK={int(bool(results.get('quick')))}): "
                    f"calibration pass (static n-gram gamma {CALIBRATION_GAMMA}, c=1) for alpha; "
                    f"{len(fits)} static n-gram cells at c=1 for the verification cost",
    }


def prefill_slope(results: dict) -> float:
    """Seconds per prompt token of a prefill: the slope of nosd's median TTFT at concurrency 1 over
    the groups' mean prompt lengths (the sim's Spec-Bench lengths; the fixed part is the step's)."""
    res = results["results"]["resident"]
    wl = Workload()
    pts = []
    for group, cats in res["groups"].items():
        cell = res["cells"].get(f"nosd|{group}|1")
        if cell:
            mean_prompt = statistics.fmean(statistics.fmean(wl.spec[c]["prompt_tokens"]) for c in cats)
            pts.append((mean_prompt, cell["ttft_p50_s"]))
    if len(pts) < 2 or pts[0][0] == pts[1][0]:
        return 0.0
    (x0, y0), (x1, y1) = pts[:2]
    return round(max((y1 - y0) / (x1 - x0), 0.0), 7)


def suffix_run(pair: str) -> Path | None:
    """The newest bench-sources results of ``pair`` under build/results (None: no run)."""
    suffix = "" if pair == "bundled" else f"-{pair}"
    runs = [p for r in SUFFIX_RUNS if (p := ROOT / "build/results" / r.format(pair=suffix)).is_file()]
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)


def lookup_seconds(cached: int = 16, n: int = 2000) -> float:
    """Seconds of the host work one request adds to a suffix step: Arctic's ``speculate`` (4 tokens)
    and ``add_active_response`` on a tree of ``cached`` outputs of 100 tokens over prompts of 200,
    as the engine calls them (``engine/suffix.py``); the median of 5 runs of ``n``."""
    import random

    import numpy as np
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    rnd = random.Random(0)
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=cached)
    base = [rnd.randrange(2000) for _ in range(300)]
    for r in range(cached):  # outputs that mostly repeat one another, as a repeated task's do
        toks = [t if rnd.random() < 0.8 else rnd.randrange(2000) for t in base]
        cache.start_request(f"r{r}", toks[:200])
        cache.add_active_response(f"r{r}", toks[200:])
        cache.stop_request(f"r{r}")
    cache.start_request("q", base[:200])
    ctx = np.array(base[176:200], dtype=np.int32)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            cache.speculate("q", ctx, max_spec_tokens=4, max_spec_factor=1.0, min_token_prob=0.1)
            cache.add_active_response("q", [base[200 + i % 100]])
        runs.append((time.perf_counter() - t0) / n)
    return round(statistics.median(runs), 7)


def suffix_entry(results: dict, origin: str, lookup_s: float) -> dict:
    """The suffix source of one pair from one bench-sources results.json (see the module docstring)."""
    res = results["results"]["resident"]
    cells, groups = res["cells"], {**res["groups"], "tasks": TASK_CATEGORIES}
    pooled: dict[str, list[float]] = {}
    fits = []
    for key, cell in sorted(cells.items()):
        pol, group, conc = key.split("|")
        if not pol.startswith("suffix-") or not cell.get("suffix_lookups"):
            continue
        g = int(pol.split("-")[1])
        a = min(alpha_from_rate(min(cell["suffix_accepted"] / (cell["suffix_lookups"] * g), 1.0), g), ALPHA_CAP)
        for c in groups.get(group, ()):
            pooled.setdefault(c, []).append(a)
        base = cells.get(f"nosd|{group}|1")
        if conc == "1" and base:
            # at c=1 a step is one request's: T0 (1 + v g) + lookup, T0 = nosd's seconds per token
            speedup = cell["output_tok_s"] / base["output_tok_s"]
            fits.append(max((expected_tokens(g, a) / speedup - 1.0 - lookup_s * base["output_tok_s"]) / g, 0.0))
    if not pooled or not fits:
        raise ValueError(f"{origin}: no static suffix cells (at c=1) to calibrate from")
    alpha = {c: round(statistics.fmean(v), 4) for c, v in sorted(pooled.items())}
    # the fallback for a Spec-Bench category the run did not group: the mean of those it did
    alpha["all"] = round(statistics.fmean(a for c, a in alpha.items() if c not in TASK_CATEGORIES), 4)
    return {
        "proposer": "host",
        "alpha": alpha,
        "verify_per_draft_token": round(statistics.fmean(fits), 4),
        "lookup_s_per_request": lookup_s,
        "measured": f"make bench-sources (pair {results.get('pair')}, QUICK={int(bool(results.get('quick')))}, "
                    f"{results.get('scope', {}).get('blocks')} blocks): static suffix cells' accepted tokens per lookup "
                    f"for alpha (tasks = {', '.join(TASK_CATEGORIES)}); {len(fits)} static suffix cells at c=1 for the "
                    "verification cost; lookup: Arctic's speculate + append per request, timed here",
    }


def kept_ngram(kept: dict, profile: str, missing: Path) -> dict:
    """The committed n-gram entry and prefill slope of ``profile`` (``kept``: its committed entry),
    for a pair whose bench-ngram run (``missing``) is not on this machine: a suffix-only calibration
    must not need hours of n-gram runs."""
    if "ngram" not in kept.get("sources", {}) or "prefill_s_per_token" not in kept:
        raise FileNotFoundError(f"{missing}: no bench-ngram run of this pair, and {SOURCES_PATH.name} has no "
                                f"n-gram entry for {profile} to keep; run make bench-ngram (QUICK=1) first")
    return {"prefill_s_per_token": kept["prefill_s_per_token"], "sources": {"ngram": kept["sources"]["ngram"]}}


def build(paths: dict[str, Path], suffix_paths: dict[str, Path] | None = None, committed: dict | None = None) -> dict:
    """The table from the runs given (``paths``: bench-ngram per pair, default its QUICK run under
    build/results; ``suffix_paths``: bench-sources per pair, default its newest run). A pair with no
    bench-ngram (bench-sources) run given or found keeps its n-gram (suffix) entry in ``committed``
    (the table as committed)."""
    suffix_paths = suffix_paths or {}
    profiles: dict[str, dict] = {}
    alphas, suffix_alphas = [], []
    lookup_s = None
    for pair, (profile, default) in PAIRS.items():
        kept = (committed or {}).get("profiles", {}).get(profile, {})
        path = Path(paths.get(pair, default))
        if pair in paths or path.is_file():
            results = json.loads(path.read_text(encoding="utf-8"))
            profiles[profile] = {"prefill_s_per_token": prefill_slope(results),
                                 "sources": {"ngram": ngram_entry(results, str(path))}}
        else:
            profiles[profile] = kept_ngram(kept, profile, path)
        alphas.append(profiles[profile]["sources"]["ngram"]["alpha"])
        run = suffix_paths.get(pair) or suffix_run(pair)
        kept_sfx = kept.get("sources", {}).get("suffix")
        if run is not None:
            lookup_s = lookup_s if lookup_s is not None else lookup_seconds()
            sfx = suffix_entry(json.loads(Path(run).read_text(encoding="utf-8")), str(run), lookup_s)
        elif kept_sfx is not None:  # no bench-sources run here: the committed entry stays, as the n-gram's
            sfx = kept_sfx
            lookup_s = lookup_s if lookup_s is not None else sfx["lookup_s_per_request"]
        else:
            continue
        profiles[profile]["sources"]["suffix"] = sfx
        suffix_alphas.append(sfx["alpha"])
    cats = sorted(set(alphas[0]) & set(alphas[1]))
    roofline: dict[str, dict] = {"ngram": {
        "proposer": "host",
        "alpha": {c: round(statistics.fmean(a[c] for a in alphas), 4) for c in cats},
        "verify_step_time_s": verify_grid(),
        "lookup_s_per_request": 5e-6,
        "measured": "alpha: mean of the two CPU pairs' calibration per category (no GPU engine run); "
                    "verification: the roofline's target-only forward; lookup: 5 us per request (assumed)",
    }}
    if suffix_alphas:
        cats = sorted(set.intersection(*(set(a) for a in suffix_alphas)))
        roofline["suffix"] = {
            "proposer": "host",
            "alpha": {c: round(statistics.fmean(a[c] for a in suffix_alphas), 4) for c in cats},
            "verify_step_time_s": verify_grid(),
            "lookup_s_per_request": lookup_s,
            "measured": f"alpha: mean of the {len(suffix_alphas)} CPU pair(s) with a bench-sources run, per category "
                        "(no GPU engine run); verification: the roofline's target-only forward; lookup: Arctic's "
                        "speculate + append per request timed on this host's CPU",
        }
    profiles["roofline-h100-7b"] = {"sources": roofline}
    return {"about": __doc__.splitlines()[0] + " Regenerate: python -m benchmarks.sources_calibration",
            "profiles": profiles}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ngram", nargs="*", help="bench-ngram results.json per pair, in order: " + ", ".join(PAIRS))
    ap.add_argument("--suffix", action="append", default=[], metavar="PAIR=PATH",
                    help="bench-sources results.json of a pair (default: its newest run under build/results)")
    args = ap.parse_args(argv)
    paths = {pair: Path(p) for pair, p in zip(PAIRS, args.ngram, strict=False)}
    suffix_paths = {}
    for item in args.suffix:
        pair, _, p = item.partition("=")
        if pair not in PAIRS or not p:
            ap.error(f"--suffix: PAIR=PATH with PAIR one of {', '.join(PAIRS)} (got {item!r})")
        suffix_paths[pair] = Path(p)
    committed = json.loads(SOURCES_PATH.read_text(encoding="utf-8")) if SOURCES_PATH.is_file() else {}
    data = build(paths, suffix_paths, committed)
    SOURCES_PATH.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    for prof, d in data["profiles"].items():
        for name, e in d["sources"].items():
            print(f"{prof} {name}: alpha(all)={e['alpha'].get('all')} verify_per_draft_token={e.get('verify_per_draft_token', 'grid')}"
                  f" lookup_s_per_request={e.get('lookup_s_per_request')}")
    print(f"wrote {SOURCES_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
