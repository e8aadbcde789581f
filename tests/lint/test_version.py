"""One version: nightjar_contract.__version__. What cannot import it (the chart) must agree with it."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import yaml
from nightjar_contract import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_the_chart_and_the_sample_images_carry_the_contract_version():
    assert version("nightjar") == __version__
    chart = yaml.safe_load((ROOT / "charts" / "nightjar" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    from nightjar_operator.crd.models import NightjarDeploymentSpec

    # No default worker image in the CRD (the CPU and CUDA builds differ): spec.image is required,
    # and every sample names a worker image of this version.
    assert NightjarDeploymentSpec.model_fields["image"].is_required()
    for sample in sorted((ROOT / "manifests" / "samples").glob("*.yaml")):
        image = yaml.safe_load(sample.read_text())["spec"]["image"]
        assert image.split(":")[-1] in (__version__, f"{__version__}-cpu"), (sample.name, image)
