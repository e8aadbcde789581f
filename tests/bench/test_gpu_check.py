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
    result = r.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT gpu=cpu-dry-run passed=true ") and " reload_passed=skipped " in result
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    kv = summary["kv_release"]  # the CUDA steps on a host arena: RSS falls by the released blocks' bytes
    assert kv["arena"] == "HostArena" and kv["base_data_intact"] and kv["remapped_blocks_writable"]
    # the GPU sample pair's layout as vLLM makes it: 64 layers (36 + 28) of 64 KiB pages
    assert kv["pair"] == "Qwen3-8B/Qwen3-0.6B" and kv["block_bytes"] == 64 * 2 * 16 * 8 * 128 * 2
    assert kv["released_bytes"] == kv["mapped_bytes"] == kv["released_blocks"] * kv["block_bytes"] > 0
    assert 0.9 < kv["returned_share_of_released"] <= 1.05
    assert summary["passed"] is True and summary["criteria"]["reload"] is None
    assert summary["offload"]["reload_bytes"] == summary["offload"]["draft_bytes"] > 0
    (path,) = summary["profiles"]
    prof = CostProfile.load(tmp_path / path)
    assert prof.gammas == [0, 1, 2] and prof.batch_sizes == [1, 2, 4]
    # a step is the target's verify plus gamma draft steps (timings on tiny shapes are noise: not compared)
    verify, draft = summary["profile"]["verify_s"]["1"], summary["profile"]["draft_step_s"][prof.draft]["1"]
    assert prof.step_time(1, 2) == pytest.approx(verify["2"] + 2 * draft) and prof.step_time(1, 0) == verify["0"] > 0
    assert prof.acceptance["all"] > 0 and "cpu-dry-run" in prof.device


def test_a_failed_criterion_fails_make_gpu_check(tmp_path):
    """The whole ``make gpu-check`` (script, then the gpu-marked tests) on CPU with one criterion forced
    to fail: the exit status is non-zero and the RESULT line says passed=false."""
    env = {**os.environ, "GPU_CHECK_DRY": "1", "GPU_CHECK_FAIL": "kv_release"}
    r = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}", f"GPU_CHECK_OUT={tmp_path}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    (result,) = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert " passed=false " in result and " kv_release_passed=false " in result
    assert "FAILED: kv_release (injected: kv_release)" in r.stderr
    assert "gpu-check: wall " in r.stdout and json.loads((tmp_path / "gpu-check.json").read_text())["passed"] is False


def test_every_criterion_can_fail():
    from benchmarks import gpu_check as gc

    kv = {"returned_share_of_released": 0.99, "base_data_intact": True, "released_bytes": 8, "mapped_bytes": 8,
          "whole_granule_bytes": 8, "remapped_blocks_writable": True, "cuda_graph_replays_after_remap": True}
    off = {"reload_max_step_ratio": 1.2}
    good = gc.verdict(kv, off, False, 300.0)
    assert gc.passed(good) and set(good) == set(gc.CRITERIA)
    bad = [gc.verdict({**kv, "returned_share_of_released": 0.5}, off, False, 300.0),
           gc.verdict({**kv, "base_data_intact": False}, off, False, 300.0),
           gc.verdict({**kv, "whole_granule_bytes": 16}, off, False, 300.0),  # the arena kept a granule it could free
           gc.verdict({**kv, "cuda_graph_replays_after_remap": False}, off, False, 300.0),
           gc.verdict({**kv, "bytes_not_back_after_close": 65 << 20}, off, False, 300.0),  # a leak
           gc.verdict({}, off, False, 300.0),  # the stage raised
           gc.verdict(kv, {"reload_max_step_ratio": 1.6}, False, 300.0),
           gc.verdict(kv, {}, False, 300.0),
           gc.verdict(kv, off, True, 300.0),
           gc.verdict(kv, off, False, 481.0),
           gc.verdict(kv, off, False, 300.0, inject="reload")]
    assert not any(gc.passed(v) for v in bad)
    assert gc.passed(gc.verdict(kv, {}, False, 300.0, timed=False))  # the dry run does not judge timings
    with pytest.raises(ValueError, match="GPU_CHECK_FAIL.*kv_relase"):
        gc.verdict(kv, off, False, 1.0, inject="kv_relase")


def test_the_kv_layout_file_is_vllms_layout_of_the_sample_pair():
    """benchmarks/kv-layout-*.json (what the GPU check, without vLLM, releases blocks of) equals what
    vLLM 0.32 computes from the pair's config.json files, and its views are vLLM's own views of a pool
    allocated as the worker allocates it (``allocate_kv_cache`` inside ``kv_pool_in_arena``)."""
    import torch
    from nightjar_worker.memory.kv_elastic import KVPageReleaser
    from nightjar_worker.memory.kv_pool import kv_pool_in_arena
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_bytes_per_block
    from vllm.v1.worker.utils import allocate_kv_cache

    from benchmarks import gpu_check as gc

    assert json.loads(gc.KV_LAYOUT_FILE.read_text()) == json.loads(json.dumps(gc.derive_kv_layouts())), (
        "vLLM lays the pair's KV cache out differently now: run python -m benchmarks.gpu_check --write-kv-layout")
    n = gc.KV_BLOCKS["dry"]
    kc, layout, specs = gc.vllm_kv_cache_config(n)
    lay = gc.load_kv_layout(n)
    assert layout.name == lay["layout"] == "LBNHC" and lay["block_size"] == 16 and len(specs) == 36 + 28
    (group,) = kc.kv_cache_groups  # the draft's layers share the target's pool and block table
    page = {s.page_size_bytes for s in specs.values()}
    assert page == {2 * 16 * 8 * 128 * 2} and {t["page_size_bytes"] for t in lay["tensors"]} == page
    block_bytes = _get_kv_cache_bytes_per_block(kc.kv_cache_groups, layout)
    assert block_bytes == sum(t["page_size_bytes"] * len(t["layers"]) for t in lay["tensors"])
    with kv_pool_in_arena() as proxy:
        theirs = allocate_kv_cache(kc, torch.device("cpu"), layout)
    arena = proxy.arena
    raw = arena.tensor()[:lay["size"]].view(torch.int8)
    ours = gc.kv_views(raw, lay)
    names = [name for t in lay["tensors"] for name in t["layers"]]
    assert names == list(group.layer_names) and len(ours) == len(theirs)
    for name, v in zip(names, ours, strict=True):
        t = theirs[name]
        assert (v.shape, v.stride(), v.dtype, v.data_ptr()) == (t.shape, t.stride(), t.dtype, t.data_ptr()), name
    # released blocks are whole pages of every layer: one byte range per layer, the draft's and the target's
    base = n - 5
    ranges = KVPageReleaser(arena, list(theirs.values())).ranges(base)
    assert len(ranges) == len(names) and all(e - s == 5 * next(iter(page)) for s, e in ranges)
    arena.close()


def test_gpu_check_refuses_without_a_gpu_unless_dry():
    env = {k: v for k, v in os.environ.items() if k != "GPU_CHECK_DRY"}
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "GPU_CHECK_DRY=1" in r.stderr
