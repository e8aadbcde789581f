"""The README's real-engine tables are generated from the committed results (make readme-results)."""

from __future__ import annotations

import json

import pytest

from benchmarks import readme_results


def test_readme_results_block_is_current():
    assert readme_results.main(["--check"]) == 0, "run `make readme-results` after committing new results"


def test_generated_block_follows_the_results(tmp_path):
    (tmp_path / "serve-x").mkdir()
    row = {"output_tok_s": 2.0, "tpot_p50_s": 0.35}
    (tmp_path / "serve-x" / "results.json").write_text(json.dumps({
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
