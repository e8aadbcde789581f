"""Rule files and dashboards, statically: promtool (real), and every metric a query names exists."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from promutil import (
    DASHBOARDS,
    ROOT,
    RULE_FILES,
    metric_names,
    operator_metric_names,
    panel_queries,
    panels,
    recorded_names,
    rules,
    vllm_metric_names,
    worker_metric_names,
)


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: run `make prometheus`", pytrace=False)
    return exe


@pytest.mark.prometheus
def test_promtool_check_rules():
    p = subprocess.run([_promtool(), "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.prometheus
def test_promtool_unit_tests_of_alerts():
    """Alerts fire on a misbehaving deployment and stay silent on a healthy one (rules_test.yaml)."""
    p = subprocess.run([_promtool(), "test", "rules", "rules_test.yaml"], capture_output=True, text=True,
                       cwd=ROOT / "tests/observability")
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_alert_fires_in_a_unit_test():
    """Each shipped alert's expression is shown to fire (a non-empty exp_alerts in rules_test.yaml),
    so the e2e's "no alert pending or firing" after a healthy run is not silence by typo."""
    import yaml

    tests = yaml.safe_load((ROOT / "tests/observability/rules_test.yaml").read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts <= fired, f"never shown to fire: {sorted(alerts - fired)}"


def test_required_alerts_present():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    for needed in ("NightjarSLOBurnFast", "NightjarSLOBurnSlow", "NightjarConfigReloadFailing", "NightjarPlannerStuck",
                   "NightjarWorkerScrapeFailing", "NightjarOperatorScrapeFailing"):
        assert needed in alerts
    for r in rules():
        if "alert" in r:
            assert r["labels"]["severity"] in ("warning", "critical")
            assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_every_metric_named_is_really_exported():
    """A typo in a metric name gives an empty panel forever; check every name against the code."""
    known = worker_metric_names() | operator_metric_names() | vllm_metric_names() | recorded_names()
    assert "vllm:time_to_first_token_seconds_bucket" in known and "nightjar_steps_total" in known
    exprs = [e for _, e in panel_queries()] + [r["expr"] for r in rules()]
    unknown = {(n, e) for e in exprs for n in metric_names(e) if n not in known}
    assert not unknown, "\n".join(f"{n} in: {e}" for n, e in sorted(unknown))


def test_dashboard_structure():
    assert DASHBOARDS
    rows_needed = ["SLO", "Throughput", "gamma", "acceptance", "Switching", "Draft memory", "Queue", "Operator"]
    import json

    for f in DASHBOARDS:
        d = json.loads(f.read_text())
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), "panel ids must be unique"
        rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
        for needed in rows_needed:
            assert any(needed.lower() in r.lower() for r in rows), needed
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24
        assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "namespace", "deployment"}
    for _, p in panels():
        assert p["targets"], p["title"]
        assert p["description"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
    titles = " | ".join(p["title"] for _, p in panels())
    for needed in ("TTFT", "TPOT", "attainment", "Output tokens", "Gamma over time", "per batch bucket",
                   "Acceptance rate per arm", "Switches", "C_switch", "Draft state", "KV blocks", "waiting",
                   "Reconcile errors"):
        assert needed in titles, needed
