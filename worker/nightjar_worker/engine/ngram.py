"""Prompt-lookup (n-gram) drafts inside a draft-model engine, for the steps whose source is "ngram".

vLLM fixes one proposer per engine; Nightjar's engine keeps the draft model's and adds vLLM's own
``NgramProposer`` beside it. The n-gram proposer reads the request's tokens on the CPU after the
step's bookkeeping has appended the tokens just sampled (where vLLM's ngram method runs too), so
the runner hook hands vLLM an empty proposal at drafting time and fills it in when ``sample_tokens``
returns (``runner_hooks.py``). The draft model does not run on such a step: for the draft's KV
cache it is a gamma 0 step, caught up on when the draft next proposes (``catchup.py``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

# n-gram sizes matched against the request's own tokens (vLLM's prompt_lookup_min / _max): the
# longest match of 4..2 tokens proposes the tokens that followed it.
NGRAM_MIN, NGRAM_MAX = 2, 4


class NgramDrafter:
    """vLLM's ``NgramProposer`` configured for this runner, whatever its speculative method."""

    def __init__(self, vllm_config: Any, k: int) -> None:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        shim = SimpleNamespace(
            speculative_config=SimpleNamespace(prompt_lookup_min=NGRAM_MIN, prompt_lookup_max=NGRAM_MAX,
                                               num_speculative_tokens=k),
            model_config=SimpleNamespace(max_model_len=vllm_config.model_config.max_model_len),
            scheduler_config=SimpleNamespace(max_num_seqs=vllm_config.scheduler_config.max_num_seqs),
            parallel_config=SimpleNamespace(tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size),
        )
        self.proposer = NgramProposer(shim)  # reads only the fields above

    def propose(self, k: int, sampled: list[list[int]], input_batch: Any) -> list[list[int]]:
        """Up to ``k`` drafts per request of the batch (none for a request that sampled nothing)."""
        drafts: list[list[int]] = self.proposer.propose(k, sampled, input_batch.num_tokens_no_spec, input_batch.token_ids_cpu)
        return drafts
