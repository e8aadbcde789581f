"""Does the simulator rank the static arms as the real engine does? Measured vs simulated tok/s.

Measured: the committed ``make bench-ngram`` tables (``benchmarks/results/ngram*/.../table.md``:
closed loop at concurrency c, 48 output tokens at most, prompts of two groups of Spec-Bench
categories, settings ``resident`` and ``tight`` (the draft offloaded)). Simulated: the same cell in
``sim/`` on the pair's measured CPU profile with the source table (``sim/sources.json``): every
request arrives at t=0 and ``max_batch`` = c (a closed loop), 4c requests (the stationary rate, the
first wave included), prompts drawn from the group's categories, 48 output tokens, acceptance per
category from the calibration. tok/s = output tokens / time to the last finish (4 request draws).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from nightjar_contract.planner import DEFAULT_MAX_GAMMA
from nightjar_worker.planner import PlannerConfig, build_policy
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.sources import SourceTable
from nightjar_worker.sim.workload import Request, Workload

ROOT = Path(__file__).resolve().parent
PAIRS = {  # pair -> (committed bench-ngram table, measured CPU profile)
    "bundled": (ROOT / "results/ngram/quick/table.md", ROOT / "profiles/cpu-smollm2-135m.json"),
    "qwen": (ROOT / "results/ngram-qwen/quick-subset/table.md", ROOT / "profiles/cpu-qwen2.5-coder-1.5b-0.5b-fp32.json"),
}
OUTPUT_TOKENS = 48  # bench-ngram QUICK's max_tokens
_GROUPS = re.compile(r"repeats = ([^;]+); fresh = ([^\n]+)")


@dataclass(frozen=True)
class Cell:
    pair: str
    setting: str
    group: str
    conc: int
    measured: dict[str, float]  # static arm ("nosd", "draft-2", "ngram-4", ...) -> tok/s


def measured_cells(pair: str, table: Path) -> tuple[list[Cell], dict[str, list[str]]]:
    """The static arms' tok/s per cell of a committed bench-ngram table, and its category groups."""
    text = table.read_text(encoding="utf-8")
    m = _GROUPS.search(text)
    if m is None:
        raise ValueError(f"{table}: no category groups in its notes")
    groups = {g: [x.split()[0] for x in part.rstrip(".").split(", ")] for g, part in zip(("repeats", "fresh"), m.groups(), strict=True)}
    cells = []
    for block in text.split("### ")[1:]:
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        head = [h.strip() for h in lines[0].strip("|").split("|")]
        for ln in lines[2:]:
            row = dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=True))
            arms = {k: float(v.split()[0]) for k, v in row.items()
                    if k == "nosd" or re.fullmatch(r"(draft|ngram)-\d+", k)}
            cells.append(Cell(pair, row["setting"], row["group"], int(row["c"]), arms))
    return cells, groups


def _requests(categories: list[str], n: int, seed: int) -> list[Request]:
    wl = Workload()
    rng = random.Random(seed)
    return [Request(i, i * 1e-6, c, rng.choice(wl.spec[c]["prompt_tokens"]), OUTPUT_TOKENS)
            for i, c in enumerate(rng.choice(categories) for _ in range(n))]


def simulate(profile: CostProfile, sources: SourceTable, cell: Cell, arm: str, categories: list[str],
             seeds: int = 4) -> float:
    """Simulated tok/s of one static arm in one cell (mean over ``seeds`` request draws)."""
    if arm == "nosd":
        spec: dict = {"policy": "nosd"}
    else:
        src, g = arm.split("-")
        spec = {"policy": "static", "static_gamma": int(g), "static_source": src}
    c = cell.conc
    out = []
    for seed in range(seeds):
        pol = build_policy(PlannerConfig(max_gamma=DEFAULT_MAX_GAMMA, max_batch=c, **spec), profile)
        reqs = _requests(categories, 4 * c, seed)
        sim = Simulator(profile, reqs, max_batch=c, seed=seed, sources=sources, record_steps=False,
                        draft_resident=cell.setting == "resident")
        res = sim.run(pol)
        out.append(res.total_tokens / res.busy_s)  # a closed loop never idles: busy time is wall time
    return sum(out) / len(out)


def fidelity() -> list[dict]:
    """One row per (cell, static arm): measured and simulated tok/s, and their rank in the cell."""
    rows = []
    for pair, (table, prof_path) in PAIRS.items():
        profile = CostProfile.load(prof_path)
        sources = SourceTable.for_profile(profile)
        cells, groups = measured_cells(pair, table)
        for cell in cells:
            sim = {a: simulate(profile, sources, cell, a, groups[cell.group]) for a in cell.measured}
            rank_m = sorted(cell.measured, key=lambda a: -cell.measured[a])
            rank_s = sorted(sim, key=lambda a: -sim[a])
            for a in cell.measured:
                rows.append({"pair": pair, "setting": cell.setting, "group": cell.group, "c": cell.conc, "arm": a,
                             "measured": cell.measured[a], "simulated": sim[a],
                             "rank_measured": rank_m.index(a) + 1, "rank_simulated": rank_s.index(a) + 1})
    return rows


def agreement(rows: list[dict]) -> tuple[int, int, int]:
    """(cells, cells whose best arm agrees, arm pairs ordered alike / all pairs in %)."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["pair"], r["setting"], r["group"], r["c"]), []).append(r)
    best = sum(1 for rs in cells.values() if min(rs, key=lambda r: r["rank_measured"])["arm"]
               == min(rs, key=lambda r: r["rank_simulated"])["arm"])
    pairs = alike = 0
    for rs in cells.values():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                pairs += 1
                alike += (a["measured"] - b["measured"]) * (a["simulated"] - b["simulated"]) > 0
    return len(cells), best, round(100 * alike / max(pairs, 1))
