"""The simulator's source table against the real engine's committed bench-ngram cells."""

from __future__ import annotations

import pytest

from benchmarks.sources_fidelity import PAIRS, agreement, fidelity, measured_cells


def test_the_committed_bench_ngram_tables_parse():
    for pair, (table, _) in PAIRS.items():
        cells, groups = measured_cells(pair, table)
        assert set(groups) == {"repeats", "fresh"} and all(len(v) == 3 for v in groups.values())
        assert cells and all("nosd" in c.measured and any(a.startswith("ngram-") for a in c.measured) for c in cells)


@pytest.fixture(scope="module")
def rows():
    return fidelity()


def test_the_simulator_orders_the_sources_as_the_engine_on_the_bundled_pair(rows):
    """Bundled pair (its draft is never accepted): in every cell, measured and simulated, the best
    prompt-lookup arm beats plain decoding, which beats every draft arm."""
    cells: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["pair"] == "bundled":
            cells.setdefault((r["setting"], r["group"], r["c"]), {})[r["arm"]] = r
    assert len(cells) == 8
    for arms in cells.values():
        for key in ("measured", "simulated"):
            best_ngram = max(v[key] for a, v in arms.items() if a.startswith("ngram-"))
            drafts = [v[key] for a, v in arms.items() if a.startswith("draft-")]
            assert best_ngram > arms["nosd"][key] > max(drafts, default=0.0)


def test_most_arm_pairs_are_ordered_alike(rows):
    n, _, alike_pct = agreement(rows)
    assert n == 12 and alike_pct >= 70
