"""PlannerConfig / PlannerPriors validation: every bad field raises an error naming it."""

from __future__ import annotations

import pytest
from nightjar_contract.planner import bucket_index, default_bucket_edges
from nightjar_worker.planner import PlannerConfig, PlannerPriors, PriorEntry, build_policy
from pydantic import ValidationError


def test_defaults():
    c = PlannerConfig()
    assert c.policy == "nightjar" and c.max_gamma == 4
    assert c.resolved_arms() == (0, 1, 2, 3, 4)
    assert c.bucket_edges == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192]
    assert default_bucket_edges(1) == [1]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_gamma": -1}, "max_gamma"),
        ({"arms": []}, "arms"),
        ({"arms": [0, 5]}, "arms"),
        ({"arms": [1, 1]}, "arms"),
        ({"bucket_edges": [1, 4, 2]}, "bucket_edges"),
        ({"bucket_edges": [1, 2, 2]}, "bucket_edges"),
        ({"bucket_edges": [0, 2]}, "bucket_edges"),
        ({"bucket_edges": []}, "bucket_edges"),
        ({"max_batch": 0}, "max_batch"),
        ({"static_gamma": 7}, "static_gamma"),
        ({"policy": "table"}, "gamma_table"),
        ({"policy": "table", "gamma_table": {1: 9}}, "gamma_table"),
        ({"switch_cost_s": -1.0}, "switch_cost_s"),
        ({"slo_tpot_s": 0.0}, "slo_tpot_s"),
        ({"discount": 0.1}, "discount"),
        ({"explore_scale": -1.0}, "explore_scale"),
        ({"policy": "bogus"}, "policy"),
        ({"unknown_knob": 1}, "unknown_knob"),
    ],
)
def test_invalid_config_names_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        PlannerConfig(**kwargs)
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"bucket_edges": [2, 1], "entries": []}, "bucket_edges"),
        ({"bucket_edges": [1, 2], "entries": [{"bucket_lo": 3, "gamma": 1, "mean_loss_s": 0.1}]}, "bucket_lo"),
        ({"bucket_edges": [1], "entries": [{"bucket_lo": 1, "gamma": 1, "mean_loss_s": 0.0}]}, "mean_loss_s"),
        ({"bucket_edges": [1], "entries": [{"bucket_lo": 1, "gamma": 1, "mean_loss_s": 1, "count": -1}]}, "count"),
        ({"bucket_edges": [1], "entries": [{"bucket_lo": 1, "gamma": -1, "mean_loss_s": 1}]}, "gamma"),
    ],
)
def test_invalid_priors_name_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        PlannerPriors(**kwargs)
    assert field in str(e.value)


def test_bucket_index():
    edges = [1, 2, 4, 8]
    assert [bucket_index(edges, b) for b in (0, 1, 2, 3, 4, 7, 8, 500)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_build_policy_needs_profile_for_dsd_and_oracle():
    for name in ("dsd", "oracle"):
        with pytest.raises(ValueError, match="policy"):
            build_policy(PlannerConfig(policy=name))


def test_priors_round_trip():
    p = PlannerPriors(bucket_edges=[1, 8], entries=[PriorEntry(bucket_lo=8, gamma=2, mean_loss_s=0.01, count=3)])
    assert PlannerPriors.model_validate_json(p.model_dump_json()) == p
