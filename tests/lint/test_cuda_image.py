"""The CUDA worker image and the ``gpu`` extra agree with the vLLM they run on: the vLLM minor the
hooks are pinned to, and that vLLM's CUDA major for what is installed beside it (cuda-bindings). Only
read here: the image is never built on these machines (no registry, no GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from nightjar_worker.engine.version import CUDA_MAJOR, SUPPORTED_MINOR
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def containerfile_args() -> dict[str, str]:
    text = (ROOT / "images/worker-cuda.Containerfile").read_text()
    return {m[0]: m[1] for m in re.findall(r'^ARG (\w+)="?([^"\n]*)"?$', text, re.M)}


def gpu_extra() -> dict[str, Requirement]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {r.name: r for r in map(Requirement, extras["gpu"])}


def admits_only_major(req: Requirement, major: int) -> bool:
    """Every release the specifier admits in [major - 1, major + 2) has ``major`` as its major."""
    probes = [Version(f"{m}.{n}") for m in range(major - 1, major + 2) for n in (0, 6, 99)]
    return {v.major for v in probes if req.specifier.contains(v)} == {major}


def test_the_cuda_image_runs_the_vllm_the_hooks_are_pinned_to():
    tag = containerfile_args()["BASE_IMAGE"].rsplit(":v", 1)[1]
    assert tuple(int(x) for x in tag.split(".")[:2]) == SUPPORTED_MINOR
    vllm = gpu_extra()["vllm"]
    assert Version(tag) in vllm.specifier
    assert Version(f"{SUPPORTED_MINOR[0]}.{SUPPORTED_MINOR[1] + 1}.0") not in vllm.specifier


def test_cuda_bindings_match_vllms_cuda_major_in_the_image_and_the_extra():
    image = Requirement(containerfile_args()["CUDA_BINDINGS"])
    assert image.name == "cuda-bindings" and admits_only_major(image, CUDA_MAJOR)
    assert admits_only_major(gpu_extra()["cuda-bindings"], CUDA_MAJOR)


def test_the_check_tells_a_wrong_major():
    assert not admits_only_major(Requirement("cuda-bindings==12.*"), 13)
    assert not admits_only_major(Requirement("cuda-bindings>=12.6"), 13)
