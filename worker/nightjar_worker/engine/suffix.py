"""Suffix-tree drafts (SuffixDecoding, arXiv 2411.04975) for the steps whose source is "suffix".

The trees are Arctic Inference's ``SuffixDecodingCache``, the implementation vLLM's own
``method: suffix`` calls (``vllm/v1/spec_decode/suffix_decoding.py``): a tree per running request
over its prompt and output, and one global tree over the outputs of the last ``cache_requests``
requests (evicted oldest first), so a request drafts from what earlier requests generated. Each
draft's length follows its match (at most ``spec_factor`` x the matched length, tokens whose
estimated probability is below ``min_token_prob`` cut): proposals are ragged, 0..gamma per request.
Arctic's vLLM plugin is never loaded (``nightjar-worker serve`` allowlists vLLM plugins); only
its suffix-tree core is imported.

Step contract (``runner_hooks.py``, in ``sample_tokens`` once vLLM's bookkeeping has appended the
step's sampled tokens to ``input_batch.token_ids_cpu``):
  * ``observe(sampled, input_batch)`` on *every* step, whatever its source: the trees must hold
    every token, also those the draft model's or prompt lookup's steps produced; a request first
    seen gets its prompt and output so far (a preempted request restarts), one that left the batch
    stops (its output stays in the global tree until evicted);
  * ``propose(k, sampled, input_batch)`` on a suffix step, after ``observe``: up to ``k`` drafts per
    request, none for a request that sampled nothing (a partial prefill) or is at ``max_model_len``.
The draft model does not run on a suffix step: for its KV cache it is a gamma 0 step (``catchup.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# estimate_memory walks every tree node (about 20 ms for 1000 cached requests on the test machine):
# measured at most this often, not per step
MEMORY_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class SuffixSettings:
    """The runtime config's ``suffix`` block (``nightjar_contract.runtime.SuffixConfig``), as read
    when the worker builds its trees. Defaults are vLLM's except the cache bound (see the contract)."""

    cache_requests: int = 1000  # outputs kept in the global tree (0: none, each request drafts from itself)
    tree_depth: int = 24  # longest context matched and longest draft
    spec_factor: float = 1.0  # draft length <= spec_factor x matched length
    min_token_prob: float = 0.1  # stop drafting at a token estimated less likely than this

    @classmethod
    def from_config(cls, cfg: Any) -> SuffixSettings:
        return cls(cfg.cache_requests, cfg.tree_depth, cfg.spec_factor, cfg.min_token_prob)


@dataclass(slots=True)
class SuffixLookups:
    """What one suffix step's ``propose`` found."""

    lookups: int = 0  # requests drafted for
    hits: int = 0  # of which with at least one draft token


def settings_from_env() -> SuffixSettings:
    """The ``suffix`` block of the runtime config file the engine runs with (``NIGHTJAR_CONFIG``)."""
    from nightjar_worker.runtime_config import config_path_from_env, load_runtime_config

    return SuffixSettings.from_config(load_runtime_config(config_path_from_env()).suffix)


def arctic_available() -> bool:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return False
    return True


class SuffixDrafter:
    """One runner's suffix trees."""

    @staticmethod
    def require_arctic() -> None:
        if not arctic_available():
            raise RuntimeError("nightjar: the suffix source needs arctic-inference, which is not installed "
                               "(make install builds it; the worker image has it)")

    def __init__(self, settings: SuffixSettings, max_model_len: int) -> None:
        self.require_arctic()
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.settings = settings
        self.max_model_len = max_model_len
        self.cache = SuffixDecodingCache(max_tree_depth=settings.tree_depth,
                                         max_cached_requests=settings.cache_requests)
        self._measured_at = float("-inf")

    def observe(self, sampled: list[list[int]], input_batch: Any) -> None:
        """Add this step's sampled tokens to the trees (see the step contract)."""
        cache = self.cache
        for i, ids in enumerate(sampled):
            if not ids:
                continue
            rid = input_batch.req_ids[i]
            if rid not in cache.active_requests:
                n_prompt = int(input_batch.num_prompt_tokens[i])
                n = int(input_batch.num_tokens_no_spec[i])
                # start_request drops a cached output of the same id (a preempted request restarts)
                cache.start_request(rid, input_batch.token_ids_cpu[i, :n_prompt])
                cache.add_active_response(rid, input_batch.token_ids_cpu[i, n_prompt:n])
            else:
                cache.add_active_response(rid, ids)
        for rid in cache.active_requests - input_batch.req_id_to_index.keys():
            cache.stop_request(rid)

    def propose(self, k: int, sampled: list[list[int]], input_batch: Any) -> tuple[list[list[int]], SuffixLookups]:
        """Up to ``k`` drafts per request of the batch, and what the lookups found."""
        s = self.settings
        stats = SuffixLookups()
        drafts: list[list[int]] = []
        for i, ids in enumerate(sampled):
            n = int(input_batch.num_tokens_no_spec[i])
            room = min(k, self.max_model_len - n - 1)
            if not ids or room <= 0:
                drafts.append([])
                continue
            ctx = input_batch.token_ids_cpu[i, max(0, n - s.tree_depth):n]
            d = self.cache.speculate(input_batch.req_ids[i], ctx, max_spec_tokens=room,
                                     max_spec_factor=s.spec_factor, min_token_prob=s.min_token_prob)
            drafts.append(list(d.token_ids))
            stats.lookups += 1
            stats.hits += bool(d.token_ids)
        return drafts, stats

    def measure(self, now: float | None = None) -> tuple[int | None, int]:
        """(the trees' bytes if the last measurement is older than ``MEMORY_EVERY_S``, else None;
        outputs in the global tree)."""
        now = time.monotonic() if now is None else now
        size = None
        if now - self._measured_at >= MEMORY_EVERY_S:
            self._measured_at = now
            size = self.cache_bytes()
        return size, len(self.cache.cached_requests)

    def cache_bytes(self) -> int:
        """Bytes of the global tree and the running requests' trees (Arctic's own estimate; the
        trees are private attributes of ``SuffixDecodingCache``, pinned with its version)."""
        c = self.cache
        trees = [c._global_tree, *c._local_trees.values()]
        return int(sum(t.estimate_memory() for t in trees))
