"""Draft KV catch-up (worker side): what makes gamma == 0 steps free and resuming speculation safe.

vLLM's ``draft_model`` proposer keeps the draft's KV cache in the same blocks as the target's
(separate layers, same block table and slot mapping). Each proposing step its first pass runs the
draft over the tokens the target processed in that step, so the draft KV stays in sync only if the
draft runs *every* step. vLLM's own dynamic SD therefore still runs that pass at K=0. Nightjar's
gamma == 0 skips the draft entirely (a true autoregressive step); the positions processed meanwhile
are missing from the draft's KV cache, and drafting on top of that hole makes acceptance collapse
(vLLM issue #49548). So on the first proposing step after gamma == 0 steps, before the normal
proposal, we run the draft once over every request's missed tokens ``[synced, computed)`` (a
chunked-prefill-like forward writing their KV into the request's blocks). Its wall time is the
switching cost C_switch, reported to the scheduler with the step's output.

Tracking (per request, in the runner's process): ``synced[r]`` = number of leading positions whose
draft KV is valid. After a proposing step every request in it is valid up to the next step's
``num_computed_tokens`` (the first pass covers all tokens of the step; rejected drafts beyond that
are overwritten later). A request first seen with ``c`` computed tokens is trusted up to ``c``
(prefix-cache hits keep the draft KV written when those blocks were filled, as in vLLM).

Correctness never depends on this (the target verifies every draft); only acceptance does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from nightjar_contract.engine import WorkerStepStats

# Sources that run no draft model (prompt lookup, suffix trees): for the draft's KV a gamma 0 step.
MODEL_FREE_SOURCES = frozenset({"ngram", "suffix"})


@dataclass
class DraftKVTracker:
    """Pure bookkeeping of which positions the draft's KV covers (unit-testable without vLLM)."""

    synced: dict[str, int] = field(default_factory=dict)
    proposed_last_step: set[str] = field(default_factory=set)

    def begin_step(self, rows: list[tuple[str, int]], finished: set[str] | frozenset[str] = frozenset()) -> None:
        """``rows``: (request id, num_computed_tokens before this step) of the requests in this step."""
        for r in finished:
            self.synced.pop(r, None)
        for rid, c in rows:
            if rid in self.proposed_last_step or rid not in self.synced:
                self.synced[rid] = c
            else:
                self.synced[rid] = min(self.synced[rid], c)  # preempted and recomputed: restart lower

    def missing(self, rows: list[tuple[str, int]]) -> list[tuple[int, int, int]]:
        """(row, start, end) ranges the draft must process before proposing in this step."""
        out = []
        for i, (rid, c) in enumerate(rows):
            s = self.synced.get(rid, c)
            if s < c:
                out.append((i, s, c))
        return out

    def end_step(self, rows: list[tuple[str, int]], proposed: bool) -> None:
        self.proposed_last_step = {rid for rid, _ in rows} if proposed else set()


class DraftCatchup:
    """Runs the catch-up forward of vLLM's ``DraftModelProposer`` for one model runner."""

    def __init__(self, runner: Any, max_chunk_tokens: int | None = None) -> None:
        self.runner = runner
        self.drafter = runner.drafter
        self.tracker = DraftKVTracker()
        self.max_chunk_tokens = max_chunk_tokens or int(runner.scheduler_config.max_num_batched_tokens)
        self.forward_count = 0
        # Diagnostic switch (tests' negative control): False skips the catch-up forward, reproducing
        # vLLM #49548; the tracker keeps running so re-enabling resumes correct behaviour.
        self.enabled = True
        self.drafter.model.register_forward_pre_hook(self._count_forward)

    def _count_forward(self, *_: Any) -> None:
        self.forward_count += 1

    def rows(self) -> list[tuple[str, int]]:
        ib = self.runner.input_batch
        return [(rid, int(ib.num_computed_tokens_cpu[i])) for i, rid in enumerate(ib.req_ids)]

    def catch_up(self, ranges: list[tuple[int, int, int]], common_attn_metadata: Any) -> int:
        """Run the draft over ``ranges`` ((row, start, end) in input-batch rows). Returns tokens."""
        total = 0
        with torch.inference_mode():
            for chunk in _chunks(ranges, self.max_chunk_tokens):
                self._forward(chunk, common_attn_metadata.block_table_tensor)
                total += sum(e - s for _, s, e in chunk)
        return total

    def _forward(self, chunk: list[tuple[int, int, int]], block_table: torch.Tensor) -> None:
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import set_forward_context
        from vllm.v1.attention.backend import CommonAttentionMetadata

        d = self.drafter
        dev = d.device
        bs = d.block_size
        ib = self.runner.input_batch
        ids_l, pos_l, qsl, seq_lens, rows = [], [], [0], [], []
        for row, s, e in chunk:
            ids_l.append(ib.token_ids_cpu[row, s:e])
            pos_l.append(np.arange(s, e, dtype=np.int64))
            qsl.append(qsl[-1] + (e - s))
            seq_lens.append(e)
            rows.append(row)
        n = qsl[-1]
        input_ids = torch.from_numpy(np.concatenate(ids_l).astype(np.int32)).to(dev)
        positions = torch.from_numpy(np.concatenate(pos_l)).to(dev)
        rows_t = torch.tensor(rows, dtype=torch.long, device=block_table.device)
        bt = block_table[rows_t]
        req_of_tok = torch.repeat_interleave(
            torch.arange(len(rows), device=dev), torch.tensor([e - s for _, s, e in chunk], device=dev)
        )
        slot_mapping = (bt.to(dev)[req_of_tok, positions // bs] * bs + positions % bs).to(torch.int64)
        qsl_cpu = torch.tensor(qsl, dtype=torch.int32)
        seq_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        cad = CommonAttentionMetadata(
            query_start_loc=qsl_cpu.to(dev),
            query_start_loc_cpu=qsl_cpu,
            seq_lens=seq_cpu.to(dev),
            num_reqs=len(rows),
            num_actual_tokens=n,
            max_query_len=max(e - s for _, s, e in chunk),
            max_seq_len=max(seq_lens),
            block_table_tensor=bt,
            slot_mapping=slot_mapping,
            causal=True,
            positions=positions,
            seq_lens_cpu_upper_bound=seq_cpu,
        )
        _, per_layer = d.build_per_group_and_layer_attn_metadata(cad)
        with set_forward_context(
            per_layer,
            d.vllm_config,
            num_tokens=n,
            cudagraph_runtime_mode=CUDAGraphMode.NONE,
            slot_mapping={name: slot_mapping for name in d._draft_attn_layer_names},
        ):
            d.model(input_ids=input_ids, positions=positions, inputs_embeds=None)

    def on_propose(self, scheduler_output: Any, common_attn_metadata: Any, propose: Any, stats: WorkerStepStats) -> Any:
        """Replaces the runner's ``propose_draft_token_ids`` body for the draft model."""
        stats.hook_ran = True
        rows = self.rows()
        self.tracker.begin_step(rows, set(scheduler_output.finished_req_ids or ()))
        k = int(scheduler_output.num_spec_tokens_to_schedule)
        model_free = k > 0 and getattr(scheduler_output, "nightjar_source", "draft") in MODEL_FREE_SOURCES
        f0 = self.forward_count
        if k <= 0 or model_free:
            # gamma == 0: a true autoregressive step, the draft does not run at all. What a resume
            # would have to catch up on (running requests only) goes to the planner's C_switch model.
            # An n-gram or suffix step is the same for the draft; its drafts come after the bookkeeping.
            stats.draft_lag_tokens = sum(e - s for _, s, e in self.tracker.missing(rows))
            self.tracker.end_step(rows, proposed=False)
            stats.draft_forwards += self.forward_count - f0
            if model_free:  # the sampling hook fills them in (runner_hooks.py)
                return [[] for _ in rows]
            return torch.empty((len(rows), 0), dtype=torch.int64, device=self.drafter.device)
        ranges = self.tracker.missing(rows)
        if ranges and self.enabled:
            t0 = time.perf_counter()
            stats.catchup_tokens += self.catch_up(ranges, common_attn_metadata)
            stats.catchup_s += time.perf_counter() - t0
        out = propose()
        stats.proposed = True
        self.tracker.end_step(rows, proposed=True)
        stats.draft_forwards += self.forward_count - f0
        return out

    def on_skipped(self, scheduler_output: Any, stats: WorkerStepStats) -> None:
        """A step vLLM ran without the proposal hook (the draft's weights away: elastic memory): the
        bookkeeping of a gamma 0 step, so a resume after the reload catches up on its positions
        (without it the requests of the last proposing step stayed "in sync" across the offload)."""
        rows = self.rows()
        self.tracker.begin_step(rows, set(scheduler_output.finished_req_ids or ()))
        stats.draft_lag_tokens = sum(e - s for _, s, e in self.tracker.missing(rows))
        self.tracker.end_step(rows, proposed=False)


def _chunks(ranges: list[tuple[int, int, int]], budget: int) -> list[list[tuple[int, int, int]]]:
    """Split ranges into forwards of at most ``budget`` tokens (long ranges are split by position)."""
    out: list[list[tuple[int, int, int]]] = []
    cur: list[tuple[int, int, int]] = []
    used = 0
    for row, s, e in ranges:
        while s < e:
            take = min(e - s, budget - used)
            cur.append((row, s, s + take))
            used += take
            s += take
            if used >= budget:
                out.append(cur)
                cur, used = [], 0
    if cur:
        out.append(cur)
    return out
