import os

import pytest
import torch
from nightjar_worker.memory.fault import FaultInjector
from nightjar_worker.memory.weight_mover import DraftWeightMover


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make(n_layers=4, dim=1024):
    torch.manual_seed(0)
    target = torch.nn.Sequential(torch.nn.Embedding(256, dim))
    draft = torch.nn.Sequential(*[torch.nn.Linear(dim, dim, bias=True) for _ in range(n_layers)])
    draft.emb = target[0]  # shared with the target: must never move
    return target, draft.to(torch.bfloat16)


def test_offload_reload_roundtrip_is_exact_and_skips_shared(tmp_path):
    target, draft = make()
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    mover = DraftWeightMover(draft, "cpu", shared_with=target, offload_dir=str(tmp_path))
    assert mover.shared_names == ["emb.weight"]
    assert mover.param_bytes == sum(p.numel() * p.element_size() for n, p in draft.named_parameters() if n != "emb.weight")
    t = mover.start_offload()
    assert t.wait(30) and t.error is None and t.kind == "offload"
    assert not mover.resident and mover.device_bytes() == 0
    assert draft.emb.weight.numel() > 0  # shared parameter untouched
    t = mover.start_reload()
    assert t.wait(30) and t.error is None
    assert mover.resident
    for n, p in draft.named_parameters():
        assert torch.equal(p, before[n]), n
    # second cycle reuses the host copy (nothing copied out again)
    t = mover.start_offload()
    t.wait(30)
    assert t.bytes_moved == 0 and not mover.resident
    mover.start_reload().wait(30)
    assert all(torch.equal(p, before[n]) for n, p in draft.named_parameters())
    mover.close()


def test_offload_gives_memory_back_to_the_os(tmp_path):
    _, draft = make(n_layers=16, dim=1536)  # ~75 MB of bf16 weights
    mover = DraftWeightMover(draft, "cpu", offload_dir=str(tmp_path))
    r0 = rss()
    mover.start_offload().wait(60)
    dropped = r0 - rss()
    assert dropped >= 0.8 * mover.param_bytes, (dropped, mover.param_bytes)
    mover.start_reload().wait(60)
    assert rss() - (r0 - dropped) >= 0.8 * mover.param_bytes
    mover.close()


def test_injected_reload_failure_leaves_draft_offloaded_then_retry_works(tmp_path):
    _, draft = make()
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    mover = DraftWeightMover(draft, "cpu", offload_dir=str(tmp_path), faults=FaultInjector(2))
    mover.start_offload().wait(30)
    for _ in range(2):
        t = mover.start_reload()
        t.wait(30)
        assert t.error and "injected" in t.error
        assert not mover.resident and mover.device_bytes() == 0
    t = mover.start_reload()
    t.wait(30)
    assert t.error is None and mover.resident
    assert all(torch.equal(p, before[n]) for n, p in draft.named_parameters())
    mover.close()


def test_state_errors_are_clear(tmp_path):
    _, draft = make(n_layers=1, dim=64)
    mover = DraftWeightMover(draft, "cpu", offload_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="resident"):
        mover.start_reload()
    with pytest.raises(ValueError, match="host_store"):
        DraftWeightMover(draft, "cpu", host_store="gpu")
    mover.close()


def test_memory_host_store(tmp_path):
    _, draft = make(n_layers=2, dim=128)
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    mover = DraftWeightMover(draft, "cpu", host_store="memory")
    mover.start_offload().wait(30)
    mover.start_reload().wait(30)
    assert all(torch.equal(p, before[n]) for n, p in draft.named_parameters())


def test_stepped_reload_works_only_when_advanced_in_bounded_items(tmp_path):
    _, draft = make(n_layers=3, dim=512)  # 0.5 MiB per weight: several 64 KiB reads each
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    mover = DraftWeightMover(draft, "cpu", offload_dir=str(tmp_path))
    mover.start_offload().wait(30)
    t = mover.start_reload(slice_bytes=64 << 10, stepped=True)
    assert not t.done and mover.device_bytes() == 0  # nothing runs until the engine loop advances it
    items = 0
    while not t.advance(0.0):  # budget 0: exactly one work item per call
        items += 1
        assert not mover.usable  # the draft must not run before the last item
        assert items < 1000
    assert items >= 3 * (512 * 512 * 2 // (64 << 10))  # the big weights were split
    assert t.error is None and t.slices == items + 1 and mover.resident and mover.usable
    assert all(torch.equal(p, before[n]) for n, p in draft.named_parameters())
    mover.close()


@pytest.mark.parametrize("phase_items", [1, 20])  # stopped early / late (this draft has ~27 items)
def test_cancelled_stepped_reload_frees_what_it_brought_back_and_can_run_again(tmp_path, phase_items):
    _, draft = make(n_layers=3, dim=512)
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    mover = DraftWeightMover(draft, "cpu", offload_dir=str(tmp_path))
    mover.start_offload().wait(30)
    t = mover.start_reload(slice_bytes=64 << 10, stepped=True)
    for _ in range(phase_items):
        assert not t.advance(0.0)
    t.cancel()
    assert t.done and t.cancelled and t.error == "cancelled"
    assert not mover.resident and not mover.usable and mover.device_bytes() == 0
    t = mover.start_reload(slice_bytes=64 << 10, stepped=True)
    assert t.wait() and t.error is None and mover.resident and mover.usable
    assert all(torch.equal(p, before[n]) for n, p in draft.named_parameters())
    mover.close()


def test_a_threaded_reload_is_not_cancelled(tmp_path):
    _, draft = make()
    mover = DraftWeightMover(draft, "cpu", offload_dir=str(tmp_path))
    mover.start_offload().wait(30)
    t = mover.start_reload(slice_bytes=4 << 10)
    assert not t.cancel()  # several workers' threads could not all stop at the same point
    assert t.wait(30) and t.error is None and not t.cancelled and mover.resident and mover.usable
    mover.close()


def test_stepped_reload_failure_is_reported_and_frees_everything(tmp_path):
    _, draft = make()
    mover = DraftWeightMover(draft, "cpu", offload_dir=str(tmp_path), faults=FaultInjector(1))
    mover.start_offload().wait(30)
    t = mover.start_reload(stepped=True)
    assert t.advance(1.0) and t.error and "injected" in t.error
    assert not mover.resident and not mover.usable and mover.device_bytes() == 0
    t = mover.start_reload(stepped=True)
    assert t.wait() and t.error is None and mover.resident  # wait() drives a stepped task to the end
    mover.close()


@pytest.mark.parametrize("remove_weight", [False, True])
def test_repack_in_row_blocks_gives_the_same_linear(remove_weight):
    """The CPU re-pack of a large draft weight in row blocks computes what vLLM's one packed GEMM does."""
    import vllm.model_executor.layers.utils as lu
    from nightjar_worker.memory import cpu_packed

    torch.manual_seed(0)
    w = torch.randn(3000, 256, dtype=torch.bfloat16)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    bias = torch.randn(3000, dtype=torch.bfloat16)
    dispatch = getattr(lu.dispatch_cpu_unquantized_gemm, "__wrapped__", lu.dispatch_cpu_unquantized_gemm)
    ref_layer = torch.nn.Module()
    ref_layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    dispatch(ref_layer, remove_weight)
    ref = ref_layer.cpu_linear(x, ref_layer.weight, bias)

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.empty(0, dtype=w.dtype) if remove_weight else w.clone(), requires_grad=False)
    layer._nightjar_packed = cpu_packed.PackedInfo(remove_weight, shape=tuple(w.shape), dtype=w.dtype)
    n = sum(1 for _ in cpu_packed.repack_steps(layer, w.clone() if remove_weight else None, max_chunk_bytes=256 * 2 * 1000))
    if cpu_packed._onednn_path(w):
        assert n == 3  # 1000 rows per block
    # the weight is gone exactly where vLLM's own dispatch drops it (its torch-linear fallback, on a
    # CPU where oneDNN cannot pack bfloat16, keeps it)
    assert (layer.weight.numel() == 0) == (ref_layer.weight.numel() == 0)
    out = layer.cpu_linear(x, layer.weight, bias)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
