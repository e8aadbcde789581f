"""`make images REGISTRY=... push`: the documented way to get the images into a user's registry.
No registry is reachable here, so what it would run is checked: `make -n` and the push script's
DRY_RUN, both with a registry of the user's."""

from __future__ import annotations

import os
import subprocess

from helmutil import ROOT

REGISTRY = "registry.example.com/team/nightjar"


def test_make_images_push_builds_and_pushes_under_the_users_registry():
    p = subprocess.run(["make", "-n", "images", "push", f"REGISTRY={REGISTRY}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    build = next(ln for ln in lines if "scripts/images/build.sh" in ln)
    push = next(ln for ln in lines if "scripts/images/push.sh" in ln)
    assert f"REGISTRY={REGISTRY}" in build and f"REGISTRY={REGISTRY}" in push
    assert lines.index(build) < lines.index(push)  # built under those names first
    assert push.endswith("push.sh operator worker-cpu models")  # the local pause image stays local


def test_push_script_pushes_each_image_once_and_says_how_to_use_them():
    env = {**os.environ, "DRY_RUN": "1", "BUILDER": "podman", "REGISTRY": REGISTRY, "VERSION": "0.1.0"}
    p = subprocess.run(["bash", "scripts/images/push.sh", "operator", "worker-cpu", "models"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    pushes = [ln for ln in p.stdout.splitlines() if ln.startswith("podman push")]
    assert pushes == [f"podman push {REGISTRY}/nightjar-operator:0.1.0",
                      f"podman push {REGISTRY}/nightjar-worker:0.1.0-cpu",
                      f"podman push {REGISTRY}/nightjar-models:smollm2-135m"]
    assert f"--set operator.image.repository={REGISTRY}/nightjar-operator" in p.stdout
    bad = subprocess.run(["bash", "scripts/images/push.sh", "pause"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "local-only" in bad.stderr
