"""One version: nightjar_contract.__version__. What cannot import it (the chart) must agree with it."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import yaml
from nightjar_contract import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_the_chart_and_the_default_images_carry_the_contract_version():
    assert version("nightjar") == __version__
    chart = yaml.safe_load((ROOT / "charts" / "nightjar" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    from nightjar_operator.crd.models import NightjarDeploymentSpec

    assert NightjarDeploymentSpec.model_fields["image"].default.endswith(f":{__version__}")
    crd = (ROOT / "manifests" / "crds" / "nightjar.dev_nightjardeployments.yaml").read_text()
    assert f"nightjar-worker:{__version__}" in crd
