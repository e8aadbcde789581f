"""The model-runner side of Nightjar, installed into vLLM's V1 ``GPUModelRunner`` (which the CPU runner
subclasses) by the plugin. No vLLM file is modified; two methods are wrapped, version-pinned to
vLLM 0.32 (``version.py``); ``hooks.py`` says why V1 and checks at start-up that they run:

* ``propose_draft_token_ids``: with the Nightjar scheduler and a ``draft_model`` speculative config,
  routed through ``DraftCatchup.on_propose``: at ``num_spec_tokens_to_schedule == 0`` it returns an
  empty draft tensor without running the draft at all; at > 0 it first catches the draft KV up on
  positions missed during gamma == 0 steps, then runs vLLM's normal proposal.
* ``sample_tokens``: once vLLM's bookkeeping has appended the sampled tokens, adds them to the
  suffix trees (every step, ``suffix.py``), and on a step whose source is "ngram" or "suffix"
  (``scheduler_output.nightjar_source``) fills in that source's drafts (``ngram.py``,
  ``suffix.py``); then attaches what the worker measured (catch-up seconds and tokens, draft
  forward count, suffix lookups and cache size) to the returned ``ModelRunnerOutput`` as a
  ``WorkerStepStats`` (the contract's ``nightjar_contract.engine``), where ``NightjarScheduler``
  reads it.

Runners whose engine does not use ``NightjarScheduler`` are left on vLLM's code paths.
"""

from __future__ import annotations

import logging
from typing import Any

from nightjar_contract.engine import WORKER_STATS_ATTR, WorkerStepStats

from nightjar_worker.engine.hooks import is_hook, nightjar_enabled

log = logging.getLogger("nightjar.engine")

def _catchup(runner: Any) -> Any:
    c = runner.__dict__.get("_nightjar_catchup", False)
    if c is False:
        c = None
        if nightjar_enabled(runner.vllm_config) and getattr(runner, "drafter", None) is not None:
            from nightjar_worker.engine.catchup import DraftCatchup

            c = DraftCatchup(runner)
            log.info("nightjar: draft KV catch-up installed (gamma == 0 skips the draft)")
        runner._nightjar_catchup = c
    return c


def _ngram(runner: Any) -> Any:
    d = runner.__dict__.get("_nightjar_ngram")
    if d is None:
        from nightjar_worker.engine.ngram import NgramDrafter

        d = runner._nightjar_ngram = NgramDrafter(runner.vllm_config, runner.speculative_config.num_speculative_tokens)
    return d


def _suffix(runner: Any) -> Any:
    """The runner's suffix trees, or None where arctic-inference is not installed (a suffix step
    then fails with the reason: ``suffix_step``)."""
    d = runner.__dict__.get("_nightjar_suffix", False)
    if d is False:
        from nightjar_worker.engine.suffix import SuffixDrafter, arctic_available, settings_from_env

        d = None
        if arctic_available():
            d = SuffixDrafter(settings_from_env(), runner.vllm_config.model_config.max_model_len)
            log.info("nightjar: suffix trees installed (%s)", d.settings)
        runner._nightjar_suffix = d
    return d


def suffix_step(runner: Any, k: int, sampled: list[list[int]], stats: WorkerStepStats) -> list[list[int]]:
    d = _suffix(runner)
    if d is None:
        from nightjar_worker.engine.suffix import SuffixDrafter

        SuffixDrafter.require_arctic()
    drafts, found = d.propose(k, sampled, runner.input_batch)
    stats.suffix_k, stats.suffix_lookups, stats.suffix_hits = k, found.lookups, found.hits
    return drafts  # type: ignore[no-any-return]


def install() -> bool:
    """Wrap the two runner methods (idempotent). Returns True if this call patched them."""
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if is_hook(GPUModelRunner.sample_tokens):
        return False
    orig_propose = GPUModelRunner.propose_draft_token_ids
    orig_sample = GPUModelRunner.sample_tokens

    def propose_draft_token_ids(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        c = _catchup(self)
        if c is None:
            return orig_propose(self, scheduler_output, *args, **kwargs)
        cad = kwargs.get("common_attn_metadata", args[6] if len(args) > 6 else None)
        stats = self.__dict__.setdefault("_nightjar_step_stats", WorkerStepStats())
        return c.on_propose(scheduler_output, cad, lambda: orig_propose(self, scheduler_output, *args, **kwargs), stats)

    def sample_tokens(self: Any, grammar_output: Any) -> Any:
        self._nightjar_step_stats = stats = WorkerStepStats()
        so = getattr(getattr(self, "execute_model_state", None), "scheduler_output", None)
        k = int(so.num_spec_tokens_to_schedule) if so is not None else 0
        source = getattr(so, "nightjar_source", "draft") if k > 0 else "draft"
        out = orig_sample(self, grammar_output)
        if isinstance(out, ModelRunnerOutput) and out is not EMPTY_MODEL_RUNNER_OUTPUT and (c := _catchup(self)):
            if not stats.hook_ran and so is not None:
                c.on_skipped(so, stats)  # the draft's KV missed this step: caught up at the next resume
            sfx = _suffix(self)
            if sfx is not None:  # every step's tokens, whichever source drafted them
                sfx.observe(out.sampled_token_ids, self.input_batch)
            # vLLM skips the proposal hook when the draft cannot take the step (while its weights
            # are offloaded, the memory agent's guard) and hands the scheduler zeros as drafts; an
            # n-gram or suffix step needs no draft, so its drafts are filled in whether the hook ran
            if source == "ngram":
                stats.ngram_k = k
                self._draft_token_ids = _ngram(self).propose(k, out.sampled_token_ids, self.input_batch)
            elif source == "suffix":
                self._draft_token_ids = suffix_step(self, k, out.sampled_token_ids, stats)
            elif not stats.hook_ran:
                # the draft proposed nothing: without this the next step (an n-gram one, say)
                # would verify vLLM's zeros, a wasted verification counted as the draft's drafts
                self._draft_token_ids = [[] for _ in self.input_batch.req_ids]
            if sfx is not None:
                stats.suffix_cache_bytes, stats.suffix_cached_requests = sfx.measure()
            setattr(out, WORKER_STATS_ATTR, stats)
        return out

    propose_draft_token_ids.__wrapped__ = orig_propose  # type: ignore[attr-defined]
    sample_tokens.__wrapped__ = orig_sample  # type: ignore[attr-defined]
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    GPUModelRunner.sample_tokens = sample_tokens
    return True
