"""The model pairs are defined once (nightjar_worker.models.PAIR_SETTINGS): every command reads them."""

from __future__ import annotations

import argparse

import pytest
from nightjar_worker.models import PAIRS, add_pair_argument, elastic_memory_env, get_pair

from benchmarks.bench_dynamic import trace_spec


def test_every_pair_has_a_valid_dynamic_trace_and_demo_settings():
    for name in PAIRS:
        p = get_pair(name)
        spec = trace_spec(name)  # TraceSpec validates rates and caps
        assert spec.low_rate < spec.high_rate and p.demo_requests >= 1 and p.dynamic_max_tokens > 0


def test_an_unknown_pair_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="PAIR: expected one of"):
        get_pair("llama")
    with pytest.raises(ValueError, match="PAIR"):
        elastic_memory_env("llama", {})


def test_the_pair_argument_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("PAIR", "qwen")
    ap = argparse.ArgumentParser()
    add_pair_argument(ap)
    assert ap.parse_args([]).pair == "qwen"
    with pytest.raises(SystemExit):
        ap.parse_args(["--pair", "llama"])
