"""The simulator's suffix entry from a bench-sources run (``benchmarks/sources_calibration.py``)."""

from __future__ import annotations

import json

import pytest
from nightjar_worker.sim.profile import expected_tokens
from nightjar_worker.sim.sources import SOURCES_PATH, rate_at

from benchmarks import sources_calibration as sc


def _cell(tok_s, accepted=0.0, lookups=0.0):
    return {"output_tok_s": tok_s, "suffix_accepted": accepted, "suffix_lookups": lookups}


def _results(cells):
    return {"pair": "bundled", "quick": True, "scope": {"blocks": 2},
            "results": {"resident": {"groups": {"repeats": ["qa"], "fresh": ["coding", "math"]}, "cells": cells}}}


def test_suffix_alpha_counts_accepted_tokens_per_lookup_and_fits_the_verification():
    a_tasks, a_fresh = 0.8, 0.3
    cells = {
        "nosd|tasks|1": _cell(20.0), "nosd|fresh|1": _cell(20.0),
        # accepted per lookup at gamma 4 = 4 rate_at(4, alpha): ragged drafts count as rejected slots
        "suffix-4|tasks|1": _cell(36.0, 4 * rate_at(4, a_tasks) * 100, 100),
        "suffix-4|fresh|1": _cell(21.0, 4 * rate_at(4, a_fresh) * 100, 100),
        "suffix-4|fresh|4": _cell(60.0, 4 * rate_at(4, 0.5) * 50, 50),
        "ngram-4|tasks|1": _cell(25.0),
    }
    e = sc.suffix_entry(_results(cells), "test", lookup_s=1e-4)
    for cat in ("same-task", "code-edit", "agent-loop"):
        assert e["alpha"][cat] == pytest.approx(a_tasks, abs=1e-3)
    # the fresh group's categories pool its c=1 and c=4 cells, equal weight
    assert e["alpha"]["coding"] == pytest.approx((a_fresh + 0.5) / 2, abs=1e-3)
    assert "qa" not in e["alpha"]  # its group ran no suffix cell
    assert e["alpha"]["all"] == pytest.approx(e["alpha"]["coding"])  # Spec-Bench categories only
    # v from the c=1 cells: speedup = E / (1 + v g + lookup x nosd tok/s)
    want = [(expected_tokens(4, a) / s - 1 - 1e-4 * 20.0) / 4 for a, s in ((a_fresh, 21 / 20), (a_tasks, 36 / 20))]
    assert e["verify_per_draft_token"] == pytest.approx(sum(want) / 2, abs=2e-3)
    assert e["lookup_s_per_request"] == 1e-4 and e["proposer"] == "host"
    with pytest.raises(ValueError, match="no static suffix cells"):
        sc.suffix_entry(_results({"nosd|tasks|1": _cell(20.0)}), "test", 1e-4)


def test_the_lookup_is_timed_on_arctics_tree():
    pytest.importorskip("arctic_inference.suffix_decoding")
    t = sc.lookup_seconds(cached=4, n=200)
    assert 1e-7 < t < 1e-2


def test_build_adds_a_suffix_entry_where_a_pair_has_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(sc, "lookup_seconds", lambda: 3e-5)
    cells = {"nosd|tasks|1": _cell(20.0), "suffix-2|tasks|1": _cell(30.0, 2 * rate_at(2, 0.9) * 10, 10),
             "nosd|fresh|1": _cell(20.0), "suffix-2|fresh|1": _cell(20.0, 2 * rate_at(2, 0.2) * 10, 10)}
    run = tmp_path / "bundled.json"
    run.write_text(json.dumps(_results(cells)))
    monkeypatch.setattr(sc, "suffix_run", lambda pair: None)
    # no bench-ngram run given: wherever none is under build/results, the committed n-gram entries stay
    monkeypatch.setattr(sc, "PAIRS", {pair: (prof, tmp_path / f"no-{pair}.json") for pair, (prof, _) in sc.PAIRS.items()})
    committed = json.loads(SOURCES_PATH.read_text(encoding="utf-8"))
    data = sc.build({}, {"bundled": run}, committed)
    bundled, qwen, roof = (data["profiles"][p]["sources"] for p in ("cpu-smollm2-135m", "cpu-qwen2.5-coder-1.5b-0.5b-fp32",
                                                                    "roofline-h100-7b"))
    assert "suffix" in bundled and "suffix" not in qwen  # the Qwen pair has no run here
    assert roof["suffix"]["alpha"] == bundled["suffix"]["alpha"]  # the mean over the one pair that has it
    assert roof["suffix"]["lookup_s_per_request"] == 3e-5 and roof["suffix"]["verify_step_time_s"] == roof["ngram"]["verify_step_time_s"]
    for prof in ("cpu-smollm2-135m", "cpu-qwen2.5-coder-1.5b-0.5b-fp32"):
        assert data["profiles"][prof]["sources"]["ngram"] == committed["profiles"][prof]["sources"]["ngram"]
        assert data["profiles"][prof]["prefill_s_per_token"] == committed["profiles"][prof]["prefill_s_per_token"]
    assert roof["ngram"] == committed["profiles"]["roofline-h100-7b"]["sources"]["ngram"]  # recomputed, the same
    with pytest.raises(FileNotFoundError, match="no bench-ngram run of this pair.*make bench-ngram"):
        sc.build({}, {"bundled": run}, {})
    # a later n-gram-only calibration (no bench-sources run here) keeps the suffix entries it finds
    again = sc.build({}, {}, data)
    assert again["profiles"]["cpu-smollm2-135m"]["sources"]["suffix"] == bundled["suffix"]
    assert again["profiles"]["roofline-h100-7b"]["sources"]["suffix"] == roof["suffix"]
