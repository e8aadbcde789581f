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
