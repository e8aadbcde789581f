"""The simulator's source table (``worker/nightjar_worker/sim/sources.json``) from the real engine.

``python -m benchmarks.sources_calibration [bundled.json] [qwen.json]`` reads ``make bench-ngram``'s
results (defaults: the QUICK runs under ``build/results/ngram*/``) and writes, per CPU profile:

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
  the cell's measured acceptance), averaged over the cells; the host-side lookup is inside it.

The roofline profile has no engine: it gets the mean of the two pairs' n-gram alphas per category
and the roofline's own target-only verification (``sim/roofline.py``, ``verify_grid``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from nightjar_worker.sim.profile import expected_tokens
from nightjar_worker.sim.roofline import verify_grid
from nightjar_worker.sim.sources import SOURCES_PATH, alpha_from_rate
from nightjar_worker.sim.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {  # bench-ngram pair -> (cost profile name, default results)
    "bundled": ("cpu-smollm2-135m", ROOT / "build/results/ngram/quick/results.json"),
    "qwen": ("cpu-qwen2.5-coder-1.5b-0.5b-fp32", ROOT / "build/results/ngram-qwen/quick-subset/results.json"),
}
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


def build(paths: dict[str, Path]) -> dict:
    profiles: dict[str, dict] = {}
    alphas = []
    for pair, (profile, default) in PAIRS.items():
        path = paths.get(pair, default)
        results = json.loads(Path(path).read_text(encoding="utf-8"))
        entry = ngram_entry(results, str(path))
        profiles[profile] = {"prefill_s_per_token": prefill_slope(results), "sources": {"ngram": entry}}
        alphas.append(entry["alpha"])
    cats = sorted(set(alphas[0]) & set(alphas[1]))
    profiles["roofline-h100-7b"] = {"sources": {"ngram": {
        "proposer": "host",
        "alpha": {c: round(statistics.fmean(a[c] for a in alphas), 4) for c in cats},
        "verify_step_time_s": verify_grid(),
        "lookup_s_per_request": 5e-6,
        "measured": "alpha: mean of the two CPU pairs' calibration per category (no GPU engine run); "
                    "verification: the roofline's target-only forward; lookup: 5 us per request (assumed)",
    }}}
    return {"about": __doc__.splitlines()[0] + " Regenerate: python -m benchmarks.sources_calibration",
            "profiles": profiles}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = {pair: Path(p) for pair, p in zip(PAIRS, argv, strict=False)}
    data = build(paths)
    SOURCES_PATH.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    for prof, d in data["profiles"].items():
        for name, e in d["sources"].items():
            print(f"{prof} {name}: alpha(all)={e['alpha'].get('all')} verify_per_draft_token={e.get('verify_per_draft_token', 'grid')}")
    print(f"wrote {SOURCES_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
