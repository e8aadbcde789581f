"""The prompt tokens a step will prefill, estimated before vLLM schedules it (``step_prompt.py``)."""

from __future__ import annotations

from types import SimpleNamespace

from nightjar_worker.engine.step_prompt import pending_prompt_tokens


def req(num_tokens: int, computed: int = 0, rid: str = "") -> SimpleNamespace:
    return SimpleNamespace(num_tokens=num_tokens, num_computed_tokens=computed, rid=rid)


def test_decoding_requests_prefill_nothing_and_new_prompts_count_less_their_sampling_position() -> None:
    running = [req(120, 119), req(300, 299)]  # decoding: one token each
    assert pending_prompt_tokens(running, [], max_seqs=8, token_budget=2048) == 0
    # two prompts admitted: each computes its positions, the last of which samples its first token
    assert pending_prompt_tokens(running, [req(200), req(50)], max_seqs=8, token_budget=2048) == 199 + 49


def test_admission_stops_at_free_batch_slots_and_the_token_budget() -> None:
    running = [req(10, 9)] * 3
    waiting = [req(100), req(100), req(100)]
    assert pending_prompt_tokens(running, waiting, max_seqs=5, token_budget=2048) == 2 * 99  # 2 free slots
    # 3 decode tokens + 100 + 47 of the second prompt (a chunk: the rest waits for the next step)
    assert pending_prompt_tokens(running, waiting, max_seqs=8, token_budget=150) == 99 + 46
    # a partly prefilled running prompt continues first, then a preempted request recomputes its
    # prompt and outputs
    assert pending_prompt_tokens([req(500, 256)], [req(80, 0)], max_seqs=8, token_budget=2048) == 243 + 79


def test_prefix_cache_hits_of_waiting_requests_are_not_prefilled() -> None:
    waiting = [req(200, rid="hit"), req(100, rid="miss")]
    hit = {"hit": 192, "miss": 0}
    assert pending_prompt_tokens([], waiting, 8, 2048, cached=lambda r: hit[r.rid]) == 7 + 99
