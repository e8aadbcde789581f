"""docs/results.md's real-engine tables are generated from the committed results (make readme-results)."""

from __future__ import annotations

import json

import pytest

from benchmarks import readme_results


def test_readme_results_block_is_current():
    assert readme_results.main(["--check"]) == 0, "run `make readme-results` after committing new results"


def test_generated_block_follows_the_results(tmp_path):
    (tmp_path / "serve-x").mkdir()
    row = {"output_tok_s": 2.0, "tpot_p50_s": 0.35}
    (tmp_path / "serve-x" / "summary.json").write_text(json.dumps({
        "meta": {"pair": "qwen", "dtype": "float32", "quick": True, "concurrencies": [1], "max_tokens": 32,
                 "warmup": True, "lossless": {"nightjar": "2/3"}},
        "ratios": {"adaptive_vs_nosd_c1": 1.25},
        "results": {"nosd": {"1": {**row, "output_tok_s": 1.6}}, "nightjar": {"1": row}},
    }))
    block = readme_results.generate(tmp_path)
    assert "| nightjar | 2.00 (350) |" in block
    assert "RESULT adaptive_vs_nosd_c1=1.250 lossless=false" in block
    with pytest.raises(SystemExit, match="markers"):
        readme_results.splice("no markers here", block)


def _dynamic(quick: bool, tok_s: float) -> str:
    ph = {"output_tok_s": tok_s, "requests": 3, "tpot_p99_s": 0.5, "ttft_p99_s": 2.25}
    return json.dumps({
        "meta": {"pair": "qwen", "dtype": "float32", "quick": quick},
        "ratios": {"overall_vs_nosd": 1.0},
        "results": {"nosd": {"low": ph, "overall": ph}},
        "steps": {"nosd": {"overall": {"mean_gamma": 0.0}}},
    })


def test_every_dynamic_pair_has_a_section_full_run_first(tmp_path):
    """bench-dynamic writes a full run to results/dynamic[-pair]/ and QUICK to .../quick/."""
    (tmp_path / "dynamic" / "quick").mkdir(parents=True)
    (tmp_path / "dynamic" / "quick" / "summary.json").write_text(_dynamic(True, 1.0))
    (tmp_path / "dynamic-qwen" / "quick").mkdir(parents=True)
    (tmp_path / "dynamic-qwen" / "quick" / "summary.json").write_text(_dynamic(True, 2.0))
    (tmp_path / "dynamic-qwen" / "summary.json").write_text(_dynamic(False, 3.0))
    block = readme_results.generate(tmp_path)
    assert "`benchmarks/results/dynamic/quick/`" in block
    assert "`benchmarks/results/dynamic-qwen/`" in block and "dynamic-qwen/quick" not in block
    rows = [" ".join(line.split()) for line in block.splitlines()]
    assert "| nosd | 3.0 | 3.0 | 1.000 | 2.2 | 500 | 0.00 |" in rows  # the full run's figures
