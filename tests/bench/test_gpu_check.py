"""``make gpu-check`` runs on a GPU machine this CI does not have; its dry run (tiny shapes on CPU)
executes the same code paths here, and what it writes must load as the simulator's CostProfile.
The dry run runs without the packages a bare GPU machine lacks (vLLM, pydantic, ...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nightjar_worker.sim.profile import CostProfile

ROOT = Path(__file__).resolve().parents[2]
# the GPU machine has PyTorch, Triton and cuda-bindings: importing anything else must fail there as here
BARE = ("import runpy, sys\n"
        "for m in ('vllm', 'pydantic', 'yaml', 'prometheus_client', 'httpx', 'kopf', 'kubernetes'):\n"
        "    sys.modules[m] = None\n"
        "runpy.run_module('benchmarks.gpu_check', run_name='__main__')")


def test_gpu_check_dry_run_writes_loadable_profiles(tmp_path):
    env = {**os.environ, "GPU_CHECK_DRY": "1", "NIGHTJAR_GPU_CHECK_OUT": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", BARE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("RESULT gpu=cpu-dry-run ")
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    kv = summary["kv_release"]  # the CUDA steps on a host arena: RSS falls by the released blocks' bytes
    assert kv["arena"] == "HostArena" and kv["base_data_intact"] and kv["remapped_blocks_writable"]
    assert kv["released_bytes"] == kv["mapped_bytes"] == kv["released_blocks"] * kv["block_bytes"]
    assert 0.9 < kv["returned_share_of_block"] <= 1.05
    from benchmarks.gpu_check import kv_release_passed

    assert kv_release_passed(kv) and not kv_release_passed({**kv, "base_data_intact": False})
    assert summary["offload"]["reload_bytes"] == summary["offload"]["draft_bytes"] > 0
    (path,) = summary["profiles"]
    prof = CostProfile.load(tmp_path / path)
    assert prof.gammas == [0, 1, 2] and prof.batch_sizes == [1, 2, 4]
    # a step is the target's verify plus gamma draft steps (timings on tiny shapes are noise: not compared)
    verify, draft = summary["profile"]["verify_s"]["1"], summary["profile"]["draft_step_s"][prof.draft]["1"]
    assert prof.step_time(1, 2) == pytest.approx(verify["2"] + 2 * draft) and prof.step_time(1, 0) == verify["0"] > 0
    assert prof.acceptance["all"] > 0 and "cpu-dry-run" in prof.device


def test_gpu_check_refuses_without_a_gpu_unless_dry():
    env = {k: v for k, v in os.environ.items() if k != "GPU_CHECK_DRY"}
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "GPU_CHECK_DRY=1" in r.stderr
