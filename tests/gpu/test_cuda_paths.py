"""The CUDA paths on a GPU (``pytest -m gpu``); skipped where torch sees no CUDA device, as in CI.

They run the checks of ``make gpu-check`` (which records their figures) and assert its criteria: the
KV pool in CUDA virtual memory returns the released blocks' bytes and keeps the base blocks' data
and a captured CUDA graph valid; the draft's reload on a side stream stretches no decode step past
1.5x. The same code runs in the dry run on CPU (``tests/bench/test_gpu_check.py``).
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu_check as gc

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check runs these checks)"),
]


def test_kv_pool_in_cuda_virtual_memory_returns_the_released_blocks_and_keeps_the_rest():
    kv = gc.check_kv_release(gc.Plan.for_run(dry=False))
    assert kv["arena"] == "VmmArena" and gc.kv_release_passed(kv), kv


def test_draft_reload_on_a_side_stream_does_not_stall_decoding():
    plan = gc.Plan.for_run(dry=False)
    tokens = plan.context + max(plan.gammas) + 1
    target = gc.Decoder(plan.target, 32, tokens, plan.device, plan.dtype)
    draft = gc.Decoder(plan.drafts[0], 32, tokens, plan.device, plan.dtype)
    off = gc.check_offload(plan, target, draft)
    assert gc.reload_passed(off), off
