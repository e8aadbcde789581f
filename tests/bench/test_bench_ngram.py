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
