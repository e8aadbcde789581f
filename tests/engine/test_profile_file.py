"""The measured CPU cost profile committed under benchmarks/profiles/ is a valid CostProfile."""

from __future__ import annotations


def test_committed_cpu_profiles_are_valid_cost_profiles() -> None:
    from pathlib import Path

    from nightjar_worker.sim.profile import CostProfile

    files = sorted(Path(__file__).resolve().parents[2].glob("benchmarks/profiles/cpu-*.json"))
    files = [f for f in files if not f.name.endswith(".details.json")]
    assert files, "no measured CPU profile committed under benchmarks/profiles/"
    for f in files:
        p = CostProfile.load(f)
        assert p.gammas[0] == 0 and len(p.gammas) >= 2
        assert p.kv_blocks_total > 0 and p.kv_block_bytes > 0 and p.draft_weight_bytes > 0
        assert "all" in p.acceptance
        # speculation costs more per step than a plain step at the same batch
        assert all(row[-1] > row[0] for row in p.step_time_s)
