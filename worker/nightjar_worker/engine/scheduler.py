"""``NightjarScheduler``: vLLM's V1 scheduler with a gamma decision per decoding step.

Enable with ``LLM(..., scheduler_cls="nightjar_worker.engine.scheduler.NightjarScheduler")`` or
``--scheduler-cls nightjar_worker.engine.scheduler.NightjarScheduler`` and a ``speculative_config``
whose ``num_speculative_tokens`` is K (the largest arm). The ``vllm.general_plugins`` entry point
(``nightjar_worker.vllm_plugin``) installs the model-runner side in the worker process.

Step contract (see ``nightjar_worker.planner.policy``):
  1. ``schedule()``: gamma = policy.decide(batch, prompt_tokens) with batch = requests running or
     waiting before this step and prompt_tokens = what it is expected to prefill (``step_prompt.py``;
     a ``QueueAware`` policy is told the prompts waiting for their first token first);
     every running request's proposed drafts are trimmed to gamma (limits verification), and the
     output's ``num_spec_tokens_to_schedule = gamma`` tells the model runner how many drafts to
     propose for the next step. gamma == 0 makes the runner skip the draft model entirely (no
     forward); when gamma > 0 follows gamma == 0 the runner first catches the draft's KV cache up
     on the tokens it missed (``catchup.py``).
  2. ``update_from_output()``: the step's one record, a ``StepFeedback``, is built (wall time from
     the start of ``schedule`` to the start of ``update_from_output``, catch-up excluded; tokens
     emitted by the whole batch; drafts verified and accepted; ``switch_cost_s`` = the worker's
     catch-up time, C_switch) and goes to the policy, the metrics, the listeners and the step log.

vLLM marks the scheduler interface as not public: ``version.py`` pins ``0.32.*`` and refuses others.
CPU (and our hooks) run the synchronous scheduler; async scheduling must be off (``engine_args.py``).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from nightjar_contract.engine import worker_stats
from vllm.v1.core.sched.scheduler import Scheduler

from nightjar_worker.engine import hooks
from nightjar_worker.engine.step_prompt import plan_prefill
from nightjar_worker.engine.version import check_vllm_version

log = logging.getLogger("nightjar.engine")

NIGHTJAR_SCHEDULER_CLS = "nightjar_worker.engine.scheduler.NightjarScheduler"


@dataclass(frozen=True, slots=True)
class InflightStep:
    """What ``schedule()`` decided for the step ``update_from_output()`` will report on."""

    output: Any  # vLLM's SchedulerOutput of the step
    start: float  # perf_counter at the start of schedule()
    gamma: int
    batch: int  # the context gamma was decided at
    decide_s: float
    prompt_tokens: int  # the prefill estimate gamma was decided with
    source: str  # where this step's proposals come from
    verified_source: str  # whose proposals this step verifies (the previous step's source)


class NightjarScheduler(Scheduler):
    record_per_request = False  # the profiler switches it on; serving must not need it set

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        check_vllm_version()
        # the runner half of Nightjar must run in the workers (hooks.py); each step's output proves it
        self._hooks_required = hooks.nightjar_enabled(vllm_config)
        if self._hooks_required:
            hooks.require(hooks.config_problem(vllm_config))
        _check_pair(vllm_config)
        super().__init__(vllm_config, *args, **kwargs)
        spec = vllm_config.speculative_config
        self.nightjar_enabled = spec is not None and self.num_spec_tokens > 0
        self.nightjar_step = 0
        self._inflight: InflightStep | None = None
        self._proposal_source = "draft"  # of the last step's proposals (verified by the next step)
        self.nightjar_control: Any = None
        # Per-request draft/accept counts, filled only while ``record_per_request`` is set (profiler):
        # req_id -> [prompt token ids, drafted, accepted].
        self.request_acceptance: dict[str, list[Any]] = {}
        self.nightjar_memory: Any = None  # ElasticMemoryManager (memory area), when enabled
        if not self.nightjar_enabled:
            log.warning("nightjar: no speculative_config (K=0): NightjarScheduler acts as vLLM's scheduler")
            return
        if getattr(self, "dynamic_sd_lookup", None) is not None:  # vLLM's table, when configured
            log.warning("nightjar: num_speculative_tokens_per_batch_size is ignored; the Nightjar policy decides")
        # A non-None lookup turns off vLLM's padding of resumed requests to K placeholder drafts
        # (a CUDA-graph aid): with gamma < K it would verify drafts the policy did not ask for.
        self.dynamic_sd_lookup = [self.num_spec_tokens] * (self.scheduler_config.max_num_seqs + 1)
        from nightjar_worker.engine.control import EngineControl

        self.nightjar_control = EngineControl(self.num_spec_tokens)
        self.nightjar_control.run_scheduler_hook(self)
        log.info("nightjar: NightjarScheduler active, K=%d, policy=%s", self.num_spec_tokens,
                 getattr(self.nightjar_control.policy, "name", "?"))
        from nightjar_worker.memory.manager import ElasticMemoryManager

        self.nightjar_memory = ElasticMemoryManager.attach_if_enabled(self, vllm_config)

    @property
    def gamma_policy(self) -> Any:
        """The live gamma policy (``Scheduler.policy`` is vLLM's FCFS/priority policy)."""
        return None if self.nightjar_control is None else self.nightjar_control.policy

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self.nightjar_enabled:
            return super().schedule(*args, **kwargs)
        t0 = time.perf_counter()
        # The context is the step's batch as vLLM's own per-batch-size table counts it (requests
        # scheduled, newly admitted prompts included), estimated before scheduling: a wave of new
        # prompts is decided at the batch it creates, so the draft's prefill of them is charged
        # to the arms of that batch size, not to the few requests decoding before it arrived.
        max_seqs = self.scheduler_config.max_num_seqs
        batch = min(len(self.running) + len(self.waiting), max_seqs)
        budget = min(self.max_num_scheduled_tokens, self.scheduler_config.max_num_batched_tokens)
        waiting = itertools.chain(getattr(self, "kv_holding_waiting", ()), self.waiting)
        ctl = self.nightjar_control
        # a policy that prices the queue (each waiting prompt's wait) is told it over the prompt
        # steps after this one too
        plan = plan_prefill(self.running, waiting, max_seqs, budget, self._prefix_hit, time.time(),
                            horizon=16 if ctl.wants_queue() else 1)
        prompt = plan.prompt_tokens
        gamma, decide_s = ctl.decide(batch, prompt, plan.queue)
        source = self.nightjar_control.source
        if self.nightjar_memory is not None:
            # the draft model's gamma is 0 unless its weights are fully resident; n-gram drafts
            # need no weights. The memory manager is told what the planner wants of the draft
            # (while it is away: what the planner would play with it).
            gain_s, switch_s = self.nightjar_control.outlook(batch)
            demand = self.nightjar_control.draft_demand(gamma, batch)
            directive = self.nightjar_memory.on_step(demand, gain_s, switch_s)
            if source == "draft":
                gamma = directive.clamp(gamma)
            self.nightjar_control.set_draft_available(directive.draft_available)
        for req in self.running:
            if len(req.spec_token_ids) > gamma:
                req.spec_token_ids = req.spec_token_ids[:gamma]
        out = super().schedule(*args, **kwargs)
        out.num_spec_tokens_to_schedule = gamma
        out.nightjar_source = source  # read by the model runner's proposal hook (runner_hooks.py)
        # This step verifies what the previous one proposed and proposes for the next one.
        verified = self._proposal_source
        if out.total_num_scheduled_tokens > 0:
            self._proposal_source = source
        self._inflight = InflightStep(out, t0, gamma, batch, decide_s, prompt, source, verified)
        return out

    def _prefix_hit(self, request: Any) -> int:
        """Tokens of a waiting request its admission will find in the prefix cache (a pure lookup:
        vLLM records hit statistics separately, at admission)."""
        kvm = self.kv_cache_manager
        if request.num_computed_tokens or not kvm.prefix_cache_lookup_enabled(request):
            return 0
        return int(kvm.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)[1])

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        t1 = time.perf_counter()
        result = super().update_from_output(scheduler_output, model_runner_output)
        inflight, self._inflight = self._inflight, None
        if inflight is not None and inflight.output is scheduler_output and scheduler_output.total_num_scheduled_tokens > 0:
            self._feedback(inflight, t1, scheduler_output, model_runner_output)
        return result

    def _feedback(self, step: InflightStep, t1: float, so: Any, mro: Any) -> None:
        from nightjar_worker.planner.policy import StepFeedback

        worker = worker_stats(mro)
        if worker is None and self._hooks_required:
            hooks.require(
                "the model runner returned a step without Nightjar's stats: its hooks did not run in the worker "
                "(the nightjar vLLM plugin was not loaded there: VLLM_PLUGINS?)"
            )
        tokens = drafts = accepted = prefill = 0
        sampled = mro.sampled_token_ids or []
        index = mro.req_id_to_index or {}
        for req_id, n_sched in so.num_scheduled_tokens.items():
            i = index.get(req_id)
            gen = sampled[i] if i is not None and i < len(sampled) else []
            n_spec = len(so.scheduled_spec_decode_tokens.get(req_id, ()))
            if gen:
                tokens += len(gen)
                if n_spec:
                    drafts += n_spec
                    accepted += max(0, len(gen) - 1)
                    if self.record_per_request:
                        acc = self.request_acceptance.get(req_id)
                        if acc is None:
                            req = self.requests.get(req_id)
                            prompt_ids = tuple(req.prompt_token_ids or ()) if req is not None else ()
                            acc = self.request_acceptance[req_id] = [prompt_ids, 0, 0]
                        acc[1] += n_spec
                        acc[2] += max(0, len(gen) - 1)
            prefill += max(0, n_sched - 1 - n_spec)
        catchup_s = worker.catchup_s if worker is not None else 0.0
        rec = StepFeedback(
            batch_size=max(1, step.batch),
            gamma=step.gamma,
            step_time_s=max(1e-9, (t1 - step.start) - catchup_s),
            tokens_emitted=tokens,
            num_draft_tokens=drafts,
            num_accepted_tokens=accepted,
            switch_cost_s=catchup_s,
            prefill_tokens=prefill,
            draft_lag_tokens=worker.draft_lag_tokens if worker is not None else None,
            catchup_tokens=worker.catchup_tokens if worker is not None else None,
            step=self.nightjar_step,
            num_reqs=len(so.num_scheduled_tokens),
            draft_forwards=worker.draft_forwards if worker is not None else 0,
            decide_prompt_tokens=step.prompt_tokens,
            decide_s=step.decide_s,
            time=time.time(),
            source=step.source if step.gamma > 0 else "draft",
            drafts_source=step.verified_source if drafts else None,
        )
        self.nightjar_step += 1
        self.nightjar_control.observe(rec)
        metrics = getattr(self.nightjar_control, "metrics", None)
        if worker is not None and metrics is not None and worker.suffix_cached_requests is not None:
            metrics.observe_suffix(worker.suffix_lookups, worker.suffix_hits, worker.suffix_cache_bytes,
                                   worker.suffix_cached_requests)

    def shutdown(self) -> None:
        if self.nightjar_control is not None:
            self.nightjar_control.close()
        if self.nightjar_memory is not None:
            self.nightjar_memory.close()
        super().shutdown()


def _check_pair(vllm_config: Any) -> None:
    """Refuse a draft whose tokenizer/vocabulary differs from the target's: folders as they are, Hub
    models from vLLM's download cache (the scheduler starts after the workers loaded the weights)."""
    spec = vllm_config.speculative_config
    if spec is None or getattr(spec, "draft_model_config", None) is None or spec.method in ("ngram", "suffix"):
        return
    from nightjar_worker.engine.pair_check import check_model_pair

    mc, dc = vllm_config.model_config, spec.draft_model_config
    # vLLM hands the draft the target's tokenizer: compare the draft's own files
    check_model_pair(mc.tokenizer or mc.model, dc.model, target_revision=mc.tokenizer_revision or mc.revision,
                     draft_revision=dc.revision, cache_dir=vllm_config.load_config.download_dir)
