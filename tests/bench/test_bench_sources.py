"""bench-ngram's split of Spec-Bench categories by measured repetition (the bench itself runs the
real worker: ``make bench-ngram``)."""

from __future__ import annotations

import pytest
from nightjar_worker.loadgen import Prompt

from benchmarks.bench_ngram import _calibration_prompts, group_prompts, groups_by_repetition


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
    cal = _calibration_prompts(pool)
    assert list(cal) == ["coding", "qa"]
    assert [p.qid for p in cal["coding"]] == [0, 3] and [p.qid for p in cal["qa"]] == [1, 2]
    sets = group_prompts(pool + [Prompt(20, "math", "m")], {"repeats": ("coding", "qa"), "fresh": ("math",)})
    assert sorted(p.qid for p in sets["repeats"]) == [4, 5, 6, 7, 8, 9, 10, 11]  # the calibration's left out
    assert sets["repeats"][0].category != sets["repeats"][1].category  # interleaved
    assert [p.qid for p in sets["fresh"]] == []  # its only prompt calibrated


def test_lossless_report_allows_a_bf16_tie_and_nothing_else():
    from benchmarks.bench_ngram import lossless_report

    def out(tokens, margins=None):
        return {"text": "".join(tokens), "tokens": tokens, "margins": margins or [5.0] * len(tokens)}

    ref = out(["a", "b", "c"], [5.0, 0.125, 5.0])  # positions 1: plain decoding's top two tied
    res = {"resident": {"texts": {"nosd": [ref], "ngram-4": [out(["a", "x", "y"])]}},
           "tight": {"texts": {"nosd": [out(["a", "b", "c"])], "ngram-2": [out(["a", "b", "z"])]}}}
    report = lossless_report(res)
    assert report["resident/nosd"] == [] and report["resident/ngram-4"] == [] and report["tight/nosd"] == []
    assert report["tight/ngram-2"] == ["prompt 0: differs at token 2 where plain decoding's top-2 margin was 5.000"]


def test_scope_takes_a_part_and_names_the_knob_it_cannot_read():
    from benchmarks.bench_ngram import parse_scope

    full = parse_scope(quick=True)
    assert not full.subset and full.loads == (1, 4) and full.settings == ("resident", "tight")
    part = parse_scope(False, "nightjar-both, ngram-2", "8,1,1", "tight")
    # nosd joins (the baseline), the policies keep the table's order, loads are sorted and distinct
    assert part.policies == ("nosd", "ngram-2", "nightjar-both") and part.loads == (1, 8) and part.subset
    assert part.settings == ("tight",)
    for kw, knob in (({"policies": "ngram-9"}, "POLICIES"), ({"settings": "roomy"}, "SETTINGS"),
                     ({"loads": "1,x"}, "LOADS"), ({"loads": "0"}, "LOADS")):
        with pytest.raises(ValueError, match=knob):
            parse_scope(True, **kw)


def test_headline_gives_the_ratios_its_cells_can_give():
    from benchmarks.bench_ngram import headline

    def cells(**tok_s):
        return {"cells": {k.replace("__", "|").replace("_", "-"): {"output_tok_s": v} for k, v in tok_s.items()}}

    res = {"resident": cells(nosd__repeats__1=10.0, ngram_2__repeats__1=14.0, nightjar_both__repeats__1=12.0,
                             nosd__repeats__4=30.0, nightjar_both__repeats__4=45.0)}
    h = headline(res)
    assert h["ngram_vs_nosd_c1"] == pytest.approx(1.4)
    assert h["both_vs_best_single_source"] == pytest.approx((12 / 14 * 45 / 30) ** 0.5)
    assert h["tight_both_vs_nosd_c1"] is None  # no tight setting in this run
    assert headline({"tight": cells(nosd__repeats__1=10.0, nightjar_both__repeats__1=13.0)}) == {
        "ngram_vs_nosd_c1": None, "both_vs_best_single_source": None, "tight_both_vs_nosd_c1": pytest.approx(1.3)}
