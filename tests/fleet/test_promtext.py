"""Prometheus text parsing and histogram_quantile semantics."""

from __future__ import annotations

import math

import pytest
from nightjar_operator.fleet.promtext import Histogram, PromParseError, parse

DOC = r"""
# HELP nightjar_steps_total Steps per gamma.
# TYPE nightjar_steps_total counter
nightjar_steps_total{gamma="0"} 10
nightjar_steps_total{gamma="2"} 5.5 1700000000000
vllm:num_requests_running{model_name="m",engine="0"} 3
weird{path="a\"b\\c\nd",x=""} -Inf
# TYPE lat histogram
lat_bucket{le="0.1"} 1
lat_bucket{le="0.2"} 3
lat_bucket{le="+Inf"} 4
lat_sum 0.9
lat_count 4
"""


def test_parse_samples_labels_and_escapes():
    s = parse(DOC)
    assert s.value("nightjar_steps_total") == 15.5
    assert s.value("nightjar_steps_total", gamma="2") == 5.5
    assert s.by_label("nightjar_steps_total", "gamma") == {"0": 10.0, "2": 5.5}
    assert s.value("vllm:num_requests_running") == 3
    (w,) = s.series("weird")
    assert w.label("path") == 'a"b\\c\nd' and w.label("x") == "" and w.value == -math.inf
    assert s.types["lat"] == "histogram"
    assert s.value("missing") is None


def test_parse_errors_name_the_line():
    with pytest.raises(PromParseError, match="line 2"):
        parse("ok 1\nbad{x=1} 2\n")
    with pytest.raises(PromParseError, match="bad value"):
        parse("m notanumber\n")
    with pytest.raises(PromParseError, match="missing value"):
        parse('m{a="b"}\n')


def test_roundtrip_with_prometheus_client():
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
    from prometheus_client import Histogram as PH

    reg = CollectorRegistry()
    c = Counter("nightjar_draft_tokens", "d", ["gamma"], registry=reg)
    g = Gauge("nightjar_planner_loss_seconds", "l", ["bucket", "gamma"], registry=reg)
    h = PH("vllm:time_to_first_token_seconds", "t", registry=reg, buckets=(0.1, 0.5, 1.0))
    c.labels(gamma="3").inc(7)
    g.labels(bucket="4", gamma="1").set(0.0125)
    for v in (0.05, 0.3, 0.3, 2.0):
        h.observe(v)
    s = parse(generate_latest(reg).decode())
    assert s.value("nightjar_draft_tokens_total", gamma="3") == 7
    assert s.value("nightjar_planner_loss_seconds", bucket="4", gamma="1") == 0.0125
    hist = s.histogram("vllm:time_to_first_token_seconds")
    assert hist is not None and hist.count == 4 and hist.observations == 4
    assert hist.buckets == ((0.1, 1.0), (0.5, 3.0), (1.0, 3.0), (math.inf, 4.0))
    assert hist.sum == pytest.approx(2.65)


def H(*pairs):
    return Histogram.from_buckets(pairs)


def test_histogram_quantile_matches_promql():
    h = H((0.1, 10), (0.2, 30), (0.4, 40), (math.inf, 40))
    # rank 20 lies in (0.1, 0.2]: 0.1 + 0.1 * (20 - 10) / 20
    assert h.quantile(0.5) == pytest.approx(0.15)
    # rank 4 in the first bucket, which starts at 0
    assert h.quantile(0.1) == pytest.approx(0.04)
    assert h.quantile(1.0) == pytest.approx(0.4)
    # rank in +Inf bucket -> largest finite bound
    h2 = H((0.1, 1), (0.2, 2), (math.inf, 10))
    assert h2.quantile(0.95) == 0.2
    assert h.quantile(-0.1) == -math.inf and h.quantile(1.1) == math.inf
    assert H((0.1, 0), (math.inf, 0)).quantile(0.5) is None
    assert H((0.1, 3)).quantile(0.5) is None  # no +Inf bucket


def test_fraction_le_inverts_quantile():
    h = H((0.1, 10), (0.2, 30), (0.4, 40), (math.inf, 50))
    for q in (0.05, 0.3, 0.5, 0.7):
        assert h.fraction_le(h.quantile(q)) == pytest.approx(q)
    assert h.fraction_le(10.0) == pytest.approx(0.8)  # +Inf observations are above any bound
    assert h.fraction_le(0.0) == 0.0


def test_sum_and_delta_with_reset():
    a = H((0.1, 1), (math.inf, 2))
    b = H((0.1, 3), (0.5, 4), (math.inf, 6))
    s = a + b
    assert s.buckets == ((0.1, 4.0), (0.5, 4.0), (math.inf, 8.0))
    later = Histogram(((0.1, 5.0), (math.inf, 9.0)), 3.0, 9.0)
    earlier = Histogram(((0.1, 2.0), (math.inf, 4.0)), 1.0, 4.0)
    d = later.delta(earlier)
    assert d.buckets == ((0.1, 3.0), (math.inf, 5.0)) and d.count == 5 and d.sum == 2.0
    # counter reset (worker restarted): the current values are the window's
    assert earlier.delta(later) is earlier
