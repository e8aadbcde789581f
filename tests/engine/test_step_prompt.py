"""The prompt tokens a step will prefill, estimated before vLLM schedules it (``step_prompt.py``)."""

from __future__ import annotations

from types import SimpleNamespace

from nightjar_worker.engine.step_prompt import plan_prefill
from nightjar_worker.planner.policy import QueuedPrompt


def req(num_tokens: int, computed: int = 0, rid: str = "", arrival: float = 0.0, outputs: int = 0) -> SimpleNamespace:
    return SimpleNamespace(num_tokens=num_tokens, num_computed_tokens=computed, rid=rid, arrival_time=arrival,
                           num_output_tokens=outputs)


def pending_prompt_tokens(*args, **kwargs) -> int:
    return plan_prefill(*args, horizon=1, **kwargs).prompt_tokens


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


def test_the_queue_lists_each_waiting_prompt_with_its_wait_and_the_prompt_steps_before_its_own() -> None:
    running = [req(10, 9)] * 2 + [req(300, 100, arrival=9.0)]  # two decoding, one prompt mid-chunk
    # a preempted request (outputs out already) takes its slot and budget but is not listed
    waiting = [req(250, arrival=9.5), req(60, arrival=9.8, outputs=3), req(250, arrival=9.875), req(100, arrival=9.95)]
    plan = plan_prefill(running, waiting, max_seqs=6, token_budget=402, now=10.0)
    # step 0: 2 decode tokens, the chunk's 200, 200 of the first waiting prompt; step 1: its last
    # 50, the preempted one's 60, then 250; the fourth waiting request finds no slot
    assert plan.prompt_tokens == 199 + 199
    assert plan.queue == (QueuedPrompt(1.0, 0), QueuedPrompt(0.5, 1), QueuedPrompt(0.125, 1))
    # horizon 1: only the prompts this step completes
    assert plan_prefill(running, waiting, 6, 402, now=10.0, horizon=1).queue == (QueuedPrompt(1.0, 0),)
