"""bench-sources' pure parts: the split of Spec-Bench categories, the prompt slices, the scope, the
ratios with their spread across blocks (the bench itself runs the real worker: ``make bench-sources``)."""

from __future__ import annotations

import pytest
from nightjar_worker.loadgen import Prompt

from benchmarks.bench_sources import (
    _calibration_prompts,
    aggregate,
    best_static,
    cell_prompts,
    group_prompts,
    groups_by_repetition,
    headline,
    parse_scope,
    policy_bodies,
    replay_gap,
    resolution,
    suffix_cache_size,
)


def test_groups_are_the_most_and_least_repeating_categories():
    acc = {"summarization": 0.6, "coding": 0.5, "extraction": 0.55, "qa": 0.1, "writing": 0.05,
           "roleplay": None, "math": 0.3, "stem": 0.1}
    g = groups_by_repetition(acc)
    assert g["repeats"] == ("summarization", "extraction", "coding")
    # no drafts at all counts as no repetition; the tie of qa and stem goes by name
    assert g["fresh"] == ("stem", "writing", "roleplay")
    with pytest.raises(ValueError, match="need 6 categories"):
        groups_by_repetition({"a": 0.1, "b": 0.2})


def test_calibration_takes_the_first_prompts_of_every_category():
    pool = [Prompt(i, "qa" if i % 3 else "coding", f"p{i}") for i in range(12)]
    cal = _calibration_prompts(pool, 2)
    assert list(cal) == ["coding", "qa"]
    assert [p.qid for p in cal["coding"]] == [0, 3] and [p.qid for p in cal["qa"]] == [1, 2]
    sets = group_prompts(pool + [Prompt(20, "math", "m")], {"repeats": ("coding", "qa"), "fresh": ("math",)}, 2)
    assert sorted(p.qid for p in sets["repeats"]) == [4, 5, 6, 7, 8, 9, 10, 11]  # the calibration's left out
    assert sets["repeats"][0].category != sets["repeats"][1].category  # interleaved
    assert [p.qid for p in sets["fresh"]] == []  # its only prompt calibrated


def test_every_cell_has_its_own_prompts_and_tasks_warm_one_of_each():
    ps = [Prompt(i, "x", f"p{i}") for i in range(40)]
    cells, lossless = cell_prompts("fresh", ps, (1, 4), quick=True)
    (w1, m1), (w4, m4) = cells[1], cells[4]
    assert (len(w1), len(m1), len(w4), len(m4)) == (1, 3, 4, 8)
    used = [p.qid for p in [*w1, *m1, *w4, *m4, *lossless]]
    assert len(used) == len(set(used))  # disjoint: no cell replays another's prompts
    assert len(cell_prompts("tasks", ps, (1, 4), quick=True)[0][1][0]) == 3  # one per task category
    with pytest.raises(ValueError, match="its cells need"):
        cell_prompts("fresh", ps[:10], (1, 4), quick=False)


def test_scope_takes_a_part_and_names_the_knob_it_cannot_read():
    full = parse_scope(quick=True)
    assert not full.subset and full.loads == (1, 4) and full.settings == ("resident",) and full.blocks == 2
    assert full.groups == ("tasks", "fresh")
    assert {"suffix-2", "suffix-4", "nightjar-all", "nightjar-both"} <= set(full.policies)
    part = parse_scope(False, "nightjar-all, ngram-2", "8,1,1", "tight", "tasks,fresh", "5")
    # nosd joins (the baseline), the policies keep the table's order, loads are sorted and distinct
    assert part.policies == ("nosd", "ngram-2", "nightjar-all") and part.loads == (1, 8) and part.subset
    assert part.settings == ("tight",) and part.groups == ("tasks", "fresh") and part.blocks == 5
    for kw, knob in (({"policies": "ngram-9"}, "POLICIES"), ({"settings": "roomy"}, "SETTINGS"),
                     ({"loads": "1,x"}, "LOADS"), ({"loads": "0"}, "LOADS"), ({"groups": "old"}, "GROUPS"),
                     ({"blocks": "0"}, "BLOCKS")):
        with pytest.raises(ValueError, match=knob):
            parse_scope(True, **kw)


def test_policies_name_their_source_and_keep_the_suffix_cache_bounded():
    bodies = policy_bodies(quick=False)
    assert bodies["suffix-4"]["planner"] == {"max_gamma": 4, "policy": "static", "static_gamma": 4, "static_source": "suffix"}
    assert "static_source" not in bodies["draft-2"]["planner"]
    assert bodies["nightjar-all"]["planner"]["suffix_arms"] == [1, 2, 3, 4]
    assert "suffix_arms" not in bodies["nightjar-both"]["planner"]
    # a replayed Spec-Bench prompt must find its answer evicted from the cache
    assert replay_gap(parse_scope(True), True) > bodies["nosd"]["suffix"]["cache_requests"]
    assert replay_gap(parse_scope(True, groups="fresh", loads="1"), True) == 0
    assert suffix_cache_size(parse_scope(True), True) == 16
    assert suffix_cache_size(parse_scope(True, loads="1"), True) == 3  # tasks 3 + 3, fresh 1 + 3: gap 4
    with pytest.raises(ValueError, match="its own answer"):
        suffix_cache_size(parse_scope(True, groups="fresh", loads="1"), True)


def _cells(**blocks: list[float]) -> dict:
    out = {}
    for k, tok in blocks.items():
        out[k.replace("__", "|").replace("_", "-")] = aggregate(
            [{"output_tok_s": t, **{f"{s}_{x}": 1.0 for s in ("draft", "ngram", "suffix") for x in ("drafted", "accepted", "steps")}}
             for t in tok])
    return out


def test_ratios_are_taken_block_by_block_against_the_best_arm_in_hindsight():
    cells = _cells(nosd__tasks__1=[10.0, 20.0], suffix_4__tasks__1=[20.0, 30.0], ngram_2__tasks__1=[12.0, 22.0],
                   draft_2__tasks__1=[5.0, 10.0], nightjar_all__tasks__1=[18.0, 33.0], nightjar_both__tasks__1=[11.0, 24.0])
    assert cells["nosd|tasks|1"]["output_tok_s"] == 15.0 and cells["nosd|tasks|1"]["block_tok_s"] == [10.0, 20.0]
    assert best_static(cells, "tasks", 1) == "suffix-4"
    assert best_static(cells, "tasks", 1, ("draft", "ngram")) == "ngram-2"
    h = headline({"resident": {"cells": cells}})
    assert h["suffix_vs_nosd_c1"] == pytest.approx([2.0, 1.5])
    assert h["suffix_vs_lookup_c1"] == pytest.approx([20 / 12, 30 / 22])
    assert h["all_vs_best_single_arm"] == pytest.approx([0.9, 1.1])  # one cell: its per-block ratios
    assert h["both_vs_best_single_source"] == pytest.approx([11 / 12, 24 / 22])
    assert h["ngram_vs_nosd_c1"] is None and h["tight_both_vs_nosd_c1"] is None  # no repeats group, no tight setting
    # half-ranges of the per-block ratios to nosd: suffix 0.25, ngram 0.05, draft 0, all 0.075, both 0.05
    assert resolution({"resident": {"cells": cells}}) == pytest.approx(0.05)


def test_lossless_report_allows_a_bf16_tie_and_nothing_else():
    from benchmarks.bench_sources import lossless_report

    def out(tokens, margins=None):
        return {"text": "".join(tokens), "tokens": tokens, "margins": margins or [5.0] * len(tokens)}

    ref = out(["a", "b", "c"], [5.0, 0.125, 5.0])  # positions 1: plain decoding's top two tied
    res = {"resident": {"texts": {"nosd": [ref], "suffix-4": [out(["a", "x", "y"])]}},
           "tight": {"texts": {"nosd": [out(["a", "b", "c"])], "ngram-2": [out(["a", "b", "z"])]}}}
    report = lossless_report(res)
    assert report["resident/nosd"] == [] and report["resident/suffix-4"] == [] and report["tight/nosd"] == []
    assert report["tight/ngram-2"] == ["prompt 0: differs at token 2 where plain decoding's top-2 margin was 5.000"]
