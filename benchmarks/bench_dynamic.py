"""``make bench-dynamic``: the real worker under time-varying load, every policy in one run.

Load (``dynamic_lib.dynamic_trace``): Poisson arrivals following a rate trace, low -> high -> low then
a sawtooth (rates rising geometrically low -> high, dropping back), Spec-Bench prompts interleaved by
category, temperature 0, the same arrival times (seed) for every policy.

Two Nightjar-scheduler servers (K=4), the policy switched through the admin endpoint between runs
(bench-serve's switch mode: the planner's ``nosd``/``static``/``table`` policies have vLLM's step
semantics; start-up costs minutes here, so one server per policy is not affordable):

* server A (step log on): ``nosd``, ``static-1..4`` (the sweep), then ``vllm-table`` tuned from the
  sweep as vLLM's Dynamic SD docs suggest (per batch size the gamma with the best measured tokens/s
  of the static runs' decode steps, gamma 0 = no-SD), ``ucb`` (BanditSpec-style) and
  ``nightjar-no-offload`` (Nightjar, draft always resident);
* after the sweep a CostProfile is derived from A's step log (median decode step time per batch size
  and gamma, acceptance, C_switch; or ``--profile``); both Nightjar runs start from priors derived from
  it (``planner.profile_priors``: what a profiled pair or the fleet's priors give a worker in
  production, and no more than the tuned baselines get; ``--cold`` for none), and server B starts
  with it (``NIGHTJAR_PROFILE``) and with
  elastic draft memory (``NIGHTJAR_MEMORY``, pinned resident through its control file except for
  Nightjar): ``dsd`` (DSD-style goodput), ``oracle`` (per-batch oracle gamma from the profile) and
  ``nightjar`` (Nightjar with elastic memory, offload policy ``auto``).

``--kv-base-blocks N`` (memory-tight): both servers get the same memory, a KV pool of N blocks plus the
draft's bytes. Server A pins the draft resident, so every static gamma (gamma 0 included) and
``nightjar-no-offload`` decode in N blocks, as a speculative deployment whose draft holds its weights
does; on server B Nightjar may offload the draft and use the rest, and ``nosd-nodraft`` (the draft
pinned offloaded, gamma 0) stands for plain vLLM without a draft in the same memory: the honest
no-SD baseline there, reported as ``overall_vs_nosd_nodraft``.

Per phase and overall: output tokens/s, TTFT/TPOT/E2E p50/p99, mean gamma and acceptance from the step
log; gamma and draft-state timelines. Writes ``benchmarks/results/dynamic[/quick]/{table.md,dynamic.png,
results.json,records.jsonl}`` (``PAIR=qwen``: ``dynamic-qwen``; records: every request with its token times). Last line:
``RESULT worst_phase_vs_best_static=.. overall_vs_nosd=.. overall_vs_best_static=.. p99_tpot_vs_best_static=..
p99_ttft_vs_best_static=.. oracle_fraction=..`` (plus ``overall_vs_nosd_nodraft`` when memory-tight, and,
when the oracle ran, ``oracle_worst_phase_vs_best_static`` and ``oracle_p99_tpot_vs_best_static``: the
oracle's own figures on the same trace, a reference for those two targets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nightjar_worker import loadgen
from nightjar_worker.engine.step_stats import read_jsonl
from nightjar_worker.models import add_pair_argument, elastic_memory_env, get_pair
from nightjar_worker.serve import ServerProcess
from nightjar_worker.sim.profile import CostProfile

from benchmarks import common, dynamic_lib
from benchmarks.serving import (
    ADMIN_TOKEN,
    MetricTick,
    openai_client,
    pair_args,
    pair_dirs,
    pair_dtype,
    sample_metrics,
    set_cpu_env,
    switch_policy,
    warm_priors,
)

set_cpu_env()

STATICS = ["nosd", "static-1", "static-2", "static-3", "static-4"]
SERVER_A = [*STATICS, "vllm-table", "ucb", "nightjar-no-offload"]
SERVER_B = ["dsd", "oracle", "nightjar", "nosd-nodraft"]
ADAPTIVE = ("vllm-table", "ucb", "nightjar-no-offload", "dsd", "oracle", "nightjar")
DRAFT_STATES = ("resident", "offloading", "offloaded", "reloading", "draining")



def trace_spec(pair: str) -> dynamic_lib.TraceSpec:
    """The pair's offered load (its settings: ``nightjar_worker.models.PAIR_SETTINGS``)."""
    return dynamic_lib.TraceSpec(**get_pair(pair).dynamic_trace)


# Every policy replays the same prompts on the same server: with vLLM's prefix cache on, later policies
# would skip most of the prefill the first ones paid (measured: +55% tokens/s for the same gamma-0
# schedule run after the sweep). Off, so every policy pays the same prefill.
SERVER_ARGS = ["--scheduler", "nightjar", "--no-enable-prefix-caching"]


def planner_policy(name: str) -> str:
    return "nightjar" if name.startswith("nightjar") else "nosd" if name == "nosd-nodraft" else name


def draft_state(url: str) -> float | None:
    import httpx

    m = loadgen.parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    return loadgen.metric_or_none(m, "nightjar_draft_state")


async def drive_to_state(url: str, model: str, prompts, state: float, timeout_s: float = 300.0) -> None:
    """Short requests until the draft reaches ``state``: the memory manager moves it between engine
    steps only, so an idle server never applies a control-file change."""
    client = openai_client(url)
    t0 = time.perf_counter()
    try:
        while draft_state(url) != state:
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"draft state {draft_state(url)} after {timeout_s:.0f} s, waiting for {state}")
            await loadgen.run_closed_loop(client, model, prompts[:2], 2, 2, max_tokens=4)
    finally:
        await client.close()


def kv_block_bytes(target: Path, block_tokens: int, dtype: str) -> int:
    """Target KV bytes per block (K and V, in the served dtype: vLLM's "auto" cache dtype) from the
    model's config.json."""
    from nightjar_worker.profiler import ELEMENT_BYTES

    c = json.loads((target / "config.json").read_text())
    layers = c["num_hidden_layers"]
    heads = c.get("num_key_value_heads") or c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * layers * heads * head_dim * block_tokens * ELEMENT_BYTES.get(dtype, 2)


def cache_info(url: str) -> tuple[int, int]:
    """(KV blocks, block tokens) from vLLM's ``vllm:cache_config_info`` labels."""
    import httpx

    m = loadgen.parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    for (name, labels), _ in m.items():
        if name == "vllm:cache_config_info":
            d = dict(labels)
            return int(float(d.get("num_gpu_blocks") or 0)), int(float(d.get("block_size") or 16))
    return 0, 16


async def run_trace(url: str, model: str, prompts, phases, max_tokens: int) -> tuple[list, list[MetricTick], float]:
    client = openai_client(url)
    ticks: list[MetricTick] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    unix0 = time.time()
    mon = asyncio.create_task(sample_metrics(url, t0, stop, ticks))
    recs = await loadgen.run_load(client, model, prompts, phases, max_tokens=max_tokens, temperature=0.0, seed=11)
    stop.set()
    await mon
    await client.close()
    return recs, ticks, unix0


async def warm_up(url: str, model: str, prompts, concurrency: int) -> None:
    """Not measured: the first batches of each shape pay one-off kernel/allocator costs on the CPU
    backend (the first policy of a server ran visibly slower), so run bursts up to the trace's cap
    under the largest and the smallest gamma before the first policy."""
    client = openai_client(url)
    for pol in ("static-4", "nosd"):
        switch_policy(url, pol)
        await loadgen.run_closed_loop(client, model, prompts[-concurrency:], concurrency, concurrency, max_tokens=8)
    await client.close()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.spec = trace_spec(args.pair)
        self.phases = dynamic_lib.dynamic_trace(self.spec, args.scale)
        self.names = dynamic_lib.phase_names(self.phases)
        self.windows = dynamic_lib.phase_windows(self.phases)
        self.prompts = loadgen.mixed_prompts(
            dynamic_lib.short_prompts(loadgen.load_prompts(), args.max_prompt_chars), 400, seed=1)
        self.results: dict[str, dict[str, dict]] = {}
        self.steps: dict[str, dict[str, dict]] = {}
        self.timelines: dict[str, dict[str, list]] = {}
        self.meta: dict[str, Any] = {"pair": args.pair, "dtype": pair_dtype(args.pair), "quick": args.quick, "scale": args.scale,
                                     "max_tokens": args.max_tokens, "max_prompt_chars": args.max_prompt_chars, "trace": self.spec.model_dump(),
                                     "phases": [[n, round(a, 2), round(b, 2)] for n, a, b in self.windows],
                                     "server_start_s": {}, "notes": [], "server_args": SERVER_ARGS,
                                     "kv_base_blocks": args.kv_base_blocks}
        self.table: list[list[int]] | None = None
        self.profile_path: Path | None = None
        self.priors: dict | None = None  # Nightjar's warm start (PlannerPriors dump), from the profile

    def note(self, text: str) -> None:
        print(f"note: {text}", flush=True)
        self.meta["notes"].append(text)

    def start(self, tag: str, env: dict[str, str]) -> ServerProcess:
        t0 = time.perf_counter()
        print(f"[server {tag}] starting ({self.args.pair} pair) ...", flush=True)
        srv = ServerProcess([*pair_args(self.args.pair), *SERVER_ARGS],
                            env={"NIGHTJAR_ADMIN_TOKEN": ADMIN_TOKEN, **env},
                            log_path=self.out / f"server-{tag}.log").start()
        self.meta["server_start_s"][tag] = round(time.perf_counter() - t0, 1)
        print(f"[server {tag}] ready in {self.meta['server_start_s'][tag]} s", flush=True)
        asyncio.run(warm_up(srv.url, srv.model_name(), self.prompts, self.spec.high_cap))
        return srv

    def run_policy(self, srv: ServerProcess, name: str, step_log: Path) -> None:
        switch_policy(srv.url, planner_policy(name), self.table if name == "vllm-table" else None,
                      self.priors if name.startswith("nightjar") else None)
        print(f"[{name}] running the trace ({self.windows[-1][2]:.0f} s) ...", flush=True)
        recs, ticks, unix0 = asyncio.run(run_trace(srv.url, srv.model_name(), self.prompts, self.phases,
                                                   self.args.max_tokens))
        unix1 = time.time()
        res = dynamic_lib.per_phase_summary(recs, self.names)
        for ph, tok_s in dynamic_lib.own_window_tok_s(recs, self.windows, unix1 - unix0).items():
            res[ph]["own_window_tok_s"] = tok_s
        with (self.out / "records.jsonl").open("a") as f:  # every request, for the analysis of a run
            for r in recs:
                f.write(json.dumps({"policy": name, **dynamic_lib.record_row(r)}) + "\n")
        steps = dynamic_lib.steps_between(read_jsonl(step_log), unix0, unix1)
        self.results[name] = res
        self.steps[name] = dynamic_lib.step_phase_stats(steps, unix0, self.windows, unix1)
        self.timelines[name] = {
            "bins": dynamic_lib.binned(steps, unix0),
            "draft_state": [(round(t.unix - unix0, 2), t.draft_state) for t in ticks],
        }
        self.meta.setdefault("windows_unix", {})[name] = [unix0, unix1]
        o, st = res["overall"], self.steps[name]["overall"]
        print(f"  {name}: {o['output_tok_s']:.1f} tok/s overall ("
              + ", ".join(f"{n} {res[n]['output_tok_s']:.1f}" for n in self.names)
              + f"), TPOT p99 {fmt_ms(o['tpot_p99_s'])} ms, mean gamma {common.fmt(st['mean_gamma'])}, "
              f"requests {o['requests']} errors {o['errors']}", flush=True)

    # --- the two servers ------------------------------------------------------------------------
    def server_a(self) -> None:
        log = self.out / "steps-a.jsonl"
        log.unlink(missing_ok=True)
        if self.args.profile and not any(p in SERVER_A for p in self.args.policies):
            self.after_sweep(log)  # nothing to run on A: the given profile gives the priors
            return
        env = {"NIGHTJAR_STEP_LOG": str(log)}
        if self.args.kv_base_blocks:  # the draft pinned resident in the same memory as server B
            env.update(self.memory_env("resident", None))
        srv = self.start("a", env)
        try:
            self.meta["kv_blocks"], self.meta["block_tokens"] = cache_info(srv.url)
            swept = False
            for name in [p for p in SERVER_A if p in self.args.policies]:
                if name not in STATICS and not swept:
                    self.after_sweep(log)
                    swept = True
                self.run_policy(srv, name, log)
            if not swept:
                self.after_sweep(log)
        finally:
            srv.stop()

    def after_sweep(self, log: Path) -> None:
        """What the sweep's measurements give the adaptive policies that follow: vLLM's table, the
        CostProfile (DSD, oracle) and, unless ``--cold``, Nightjar's priors derived from it (what a
        fleet's priors or a profiled pair give a worker in production; docs/planner.md)."""
        if "vllm-table" in self.args.policies:
            self.tune_table(log)
        self.profile_path = self.profile(read_jsonl(log) if log.exists() else [])
        if self.profile_path is None or self.args.cold:
            self.meta["nightjar_start"] = "cold (no priors)"
            return
        self.priors = warm_priors(self.profile_path)
        entries = self.priors["entries"]
        self.meta["nightjar_start"] = (f"warm: priors from the profile ({len(entries)} entries, "
                                       f"{entries[0]['count']:g} observations each)" if entries else "cold (empty priors)")
        print(f"nightjar starts {self.meta['nightjar_start']}", flush=True)

    def tune_table(self, log: Path) -> None:
        sweep = [s for p in STATICS if p in self.meta.get("windows_unix", {})
                 for s in dynamic_lib.steps_between(read_jsonl(log), *self.meta["windows_unix"][p])]
        best = dynamic_lib.best_gamma_per_batch(sweep)
        self.table = dynamic_lib.table_from_best(best)
        self.meta["vllm_table_best_k"] = best
        self.meta["vllm_table"] = self.table
        print(f"vllm-table tuned from the sweep's decode steps: best K per batch {best} -> {self.table}", flush=True)

    def profile(self, steps_a: list) -> Path | None:
        if self.args.profile:
            self.meta["profile_source"] = str(self.args.profile)
            self.note_oracle(CostProfile.load(self.args.profile))
            return self.args.profile
        sweep = [s for p in STATICS if p in self.meta.get("windows_unix", {})
                 for s in dynamic_lib.steps_between(steps_a, *self.meta["windows_unix"][p])]
        target, draft = pair_dirs(self.args.pair)
        dtype = pair_dtype(self.args.pair)
        from nightjar_worker.profiler import draft_weight_bytes

        bt = self.meta.get("block_tokens", 16)
        try:
            prof = dynamic_lib.profile_from_steps(
                sweep, [0, 1, 2, 3, 4], name=f"cpu-{self.args.pair}-dynamic-run", device="CPU (this run's step log)",
                target=target.name, draft=draft.name, kv_blocks_total=self.meta.get("kv_blocks", 0),
                kv_block_bytes=kv_block_bytes(target, bt, dtype), draft_weight_bytes=draft_weight_bytes(draft, dtype),
                block_tokens=bt)
        except ValueError as e:
            self.note(f"no CostProfile from this run ({e}): dsd and oracle not measured")
            return None
        path = self.out / "profile.json"
        prof.save(path)
        self.meta["profile_source"] = "measured in this run (server A's no-SD/static step log)"
        self.meta["profile"] = {"batch_sizes": prof.batch_sizes, "alpha": prof.alpha(),
                                "switch_cost": [prof.switch_cost_fixed_s, prof.switch_cost_per_token_s],
                                "draft_prefill_s_per_token": prof.draft_prefill_s_per_token,
                                "prompt_tokens_per_output_token": prof.prompt_tokens_per_output_token}
        self.note_oracle(prof)
        return path

    def note_oracle(self, prof: CostProfile) -> None:
        self.meta["oracle_gamma_per_batch"] = dynamic_lib.oracle_gammas(prof, prof.batch_sizes)
        print(f"profile: batches {prof.batch_sizes}, alpha {prof.alpha():.3f}; oracle gamma per batch "
              f"{self.meta['oracle_gamma_per_batch']}", flush=True)

    def server_b(self, profile: Path | None) -> None:
        wanted = [p for p in SERVER_B if p in self.args.policies]
        if profile is None:
            wanted = [p for p in wanted if p not in ("dsd", "oracle")]
        if not wanted:
            return
        log = self.out / "steps-b.jsonl"
        log.unlink(missing_ok=True)
        ctl = Path(tempfile.mkdtemp(prefix="nightjar-dyn-")) / "memory-mode"
        ctl.write_text("resident")
        env = {"NIGHTJAR_STEP_LOG": str(log)}
        if profile is not None:
            env["NIGHTJAR_PROFILE"] = str(profile)
        memory = self.args.memory
        if memory:
            env.update(self.memory_env("resident", ctl))
        try:
            srv = self.start("b", env)
        except (RuntimeError, TimeoutError) as e:
            if not memory:
                raise
            tail = str(e).splitlines()[-3:]
            self.note(f"server B failed to start with elastic memory ({' / '.join(tail)}); restarted without it: "
                      "'nightjar' below is the same configuration as 'nightjar-no-offload'")
            env.pop("NIGHTJAR_MEMORY")
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
            memory = False
            srv = self.start("b-nomem", env)
        self.meta["elastic_memory"] = memory
        if not memory:
            wanted = [p for p in wanted if p != "nosd-nodraft"]
        try:
            for name in wanted:
                ctl.write_text({"nightjar": "auto", "nosd-nodraft": "offloaded"}.get(name, "resident"))
                time.sleep(1.5)  # the manager reads the control file's mtime once per step
                if name == "nosd-nodraft":
                    asyncio.run(drive_to_state(srv.url, srv.model_name(), self.prompts, 2.0))
                self.run_policy(srv, name, log)
        finally:
            srv.stop()
        if memory and "nightjar" in self.timelines:
            states = {s for _, s in self.timelines["nightjar"]["draft_state"] if s is not None}
            if states <= {0.0}:
                self.note("elastic memory on, but the draft stayed resident through the whole run (no KV "
                          "pressure at this load: the offload policy needs waiting requests or KV usage >= 90%); "
                          "'nightjar' and 'nightjar-no-offload' therefore ran the same configuration in effect")

    def memory_env(self, mode: str, control: Path | None) -> dict[str, str]:
        """NIGHTJAR_MEMORY (and the KV pool) for a server with elastic memory; ``--kv-base-blocks``
        caps what the draft-resident state may use."""
        cfg: dict[str, Any] = {"enabled": True, "mode": mode}
        if control is not None:
            cfg["control_file"] = str(control)
        if self.args.kv_base_blocks:
            cfg["base_blocks"] = self.args.kv_base_blocks
        env = elastic_memory_env(self.args.pair, cfg)
        self.meta["memory_config"] = json.loads(env["NIGHTJAR_MEMORY"])
        if "VLLM_CPU_KVCACHE_SPACE" in env:
            self.meta["kv_pool_gib"] = float(env["VLLM_CPU_KVCACHE_SPACE"])
        return env

    def reload(self) -> None:
        """A finished run's results.json, with the step-log figures derived again from its step logs
        (for a report whose step-log columns changed after the run)."""
        d = json.loads((self.out / "results.json").read_text())
        self.meta, self.results, self.timelines = d["meta"], d["results"], d["timelines"]
        if isinstance(self.meta.get("oracle_gamma_per_batch"), dict):  # JSON made the batch sizes strings
            self.meta["oracle_gamma_per_batch"] = {int(b): g for b, g in self.meta["oracle_gamma_per_batch"].items()}
        self.windows = [(n, a, b) for n, a, b in self.meta["phases"]]  # the run's trace, not today's
        self.names = list(dict.fromkeys(n for n, _, _ in self.windows))
        logs: dict[str, list] = {}
        for name, (unix0, unix1) in self.meta["windows_unix"].items():
            log = self.out / ("steps-a.jsonl" if name in SERVER_A else "steps-b.jsonl")
            steps = logs.setdefault(log.name, read_jsonl(log))
            self.steps[name] = dynamic_lib.step_phase_stats(
                dynamic_lib.steps_between(steps, unix0, unix1), unix0, self.windows, unix1)

    # --- output ---------------------------------------------------------------------------------
    def report(self) -> dict:
        ratios = dynamic_lib.dynamic_ratios(self.results, self.names,
                                            phase_s=dynamic_lib.phase_lengths(self.windows))
        per_phase_oracle = {}
        if "oracle" in self.results and "nightjar" in self.results:
            per_phase_oracle = {n: self.results["nightjar"][n]["output_tok_s"] / self.results["oracle"][n]["output_tok_s"]
                                for n in [*self.names, "overall"] if self.results["oracle"][n]["output_tok_s"] > 0}
        self.meta["oracle_fraction_per_phase"] = per_phase_oracle
        rows = []
        for pol, res in self.results.items():
            for ph in [*self.names, "overall"]:
                s, st = res[ph], self.steps[pol][ph]
                rows.append([pol, ph, s["requests"], s["errors"], round(s["output_tok_s"], 1),
                             round(st["window_tok_s"], 1) if st.get("window_tok_s") is not None else "-",
                             round(s["own_window_tok_s"], 1) if s.get("own_window_tok_s") is not None else "-",
                             f"{fmt_ms(s['ttft_p50_s'])}/{fmt_ms(s['ttft_p99_s'])}",
                             f"{fmt_ms(s['tpot_p50_s'])}/{fmt_ms(s['tpot_p99_s'])}",
                             f"{fmt_s(s['e2e_p50_s'])}/{fmt_s(s['e2e_p99_s'])}",
                             common.fmt(st["mean_gamma"], 3) if st["mean_gamma"] is not None else "-",
                             common.fmt(st["mean_batch"], 3) if st["mean_batch"] is not None else "-",
                             common.fmt(st["acceptance"], 3) if st["acceptance"] is not None else "-",
                             round(st["busy_s"], 1) if st.get("busy_s") is not None else "-",
                             f"{st['prompt_tokens_draft_on']:.0f}/{st['prompt_tokens']:.0f}"
                             if st.get("prompt_tokens") is not None else "-"])
        missing = [p for p in [*STATICS, "vllm-table", "dsd", "ucb", "oracle", "nightjar-no-offload", "nightjar",
                               *(["nosd-nodraft"] if self.meta.get("kv_base_blocks") else [])] if p not in self.results]
        notes = "\n".join(f"- {n}" for n in self.meta["notes"])
        notes += ("\n- not measured: " + ", ".join(missing)) if missing else ""
        notes += f"\n- prompts: Spec-Bench, every category, at most {self.args.max_prompt_chars} characters " \
                 "(prefill ~90 tokens/s here: long summarization inputs would make this a prefill benchmark)"
        notes += "\n- servers: " + " ".join(SERVER_ARGS) + " (prefix cache off: every policy replays the same prompts)"
        notes += ("\n- best static = the best fixed gamma in each phase, no-SD (gamma 0) included; "
                  "tok/s = output tokens of the requests arriving in the phase over their span; "
                  "window tok/s = tokens the server emitted while the phase lasted over its length (step log; "
                  "the last phase's window runs through the drain); own tok/s = the phase's own requests' "
                  "tokens that came out while the phase lasted over its length (client token times); "
                  "mean gamma/acceptance from the worker's step log (steps ending in the phase); busy s = step "
                  "times plus catch-ups in the phase; prompt tok = prompt tokens prefilled with the draft on / all")
        if self.meta.get("kv_base_blocks"):
            notes += (f"\n- memory-tight: {self.meta['kv_base_blocks']} KV blocks of {self.meta.get('block_tokens')} "
                      "tokens while the draft is resident (server A pins it: every static gamma, no-SD included, and "
                      "nightjar-no-offload decode in them), plus the draft's bytes once it is offloaded; nosd-nodraft = "
                      "the draft pinned offloaded at gamma 0, plain decoding with all the memory (no-SD without a draft)")
        notes += f"\n- vLLM table (tuned from the sweep): {self.meta.get('vllm_table', 'not tuned')}"
        notes += f"\n- nightjar start: {self.meta.get('nightjar_start', 'cold (no priors)')}"
        notes += f"\n- profile: {self.meta.get('profile_source', 'none')}; oracle gamma per batch: " \
                 f"{self.meta.get('oracle_gamma_per_batch', 'not measured')}"
        of = ratios.get("oracle_fraction")
        notes += f"\n- oracle gap: nightjar / oracle throughput overall = {common.fmt(of) if of else 'not measured'}" \
                 + (f", per phase {json.dumps({k: round(v, 3) for k, v in per_phase_oracle.items()})}" if of else "")
        notes += "\n- RESULT " + " ".join(f"{k}={common.fmt(v) if v is not None else 'nan'}" for k, v in ratios.items())
        common.print_table(
            f"bench-dynamic ({self.args.pair} pair{', QUICK' if self.args.quick else ''}, "
            f"trace {' -> '.join(self.names)}, {self.windows[-1][2]:.0f} s per policy)",
            ["policy", "phase", "req", "err", "tok/s", "window tok/s", "own tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "E2E p50/p99 s",
             "mean gamma", "mean batch", "accept", "busy s", "prompt tok"], rows, self.out / "table.md", notes=notes)
        self.plot()
        common.write_json(self.out / "results.json", {"meta": self.meta, "ratios": ratios, "results": self.results,
                                                      "steps": self.steps, "timelines": self.timelines})
        return ratios

    def plot(self) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        fig, axes = plt.subplots(4, 1, figsize=(12, 13), sharex=True)
        t, rates = [], []
        for p in self.phases:
            t0 = t[-1] if t else 0.0
            t += [t0, t0 + p.duration_s]
            rates += [p.rate, p.rate]
        axes[0].plot(t, rates, color="gray")
        axes[0].set_ylabel("offered req/s")
        axes[0].set_title("rate trace (Poisson arrivals)")
        for pol, tl in self.timelines.items():
            bins = tl["bins"]
            style = {"lw": 2.2, "color": "black"} if pol == "nightjar" else {"lw": 1.0, "alpha": 0.8}
            xs = [b[0] for b in bins]
            axes[1].plot(xs, _smooth([b[2] for b in bins]), label=pol, **style)
            if pol in ADAPTIVE:
                axes[2].plot(xs, _smooth([b[1] for b in bins]), label=pol, **style)
            if pol.startswith("nightjar") or pol in ("dsd", "oracle"):
                ds = [(x, s) for x, s in tl["draft_state"] if s is not None]
                if ds:
                    axes[3].step([x for x, _ in ds], [s for _, s in ds], where="post", label=pol)
        axes[1].set_ylabel("tokens/s (3 s mean)")
        axes[2].set_ylabel("gamma (3 s mean)")
        axes[3].set_ylabel("draft state")
        axes[3].set_yticks(range(len(DRAFT_STATES)), DRAFT_STATES)
        axes[3].set_xlabel("seconds since the trace started")
        for ax in axes:
            ax.grid(alpha=0.3)
            for _, a, _b in self.windows[1:]:
                ax.axvline(a, color="gray", lw=0.5, ls=":")
        for ax in axes[1:4]:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, ncol=4)
        fig.tight_layout()
        fig.savefig(self.out / "dynamic.png", dpi=100)
        plt.close(fig)


def _smooth(ys: list[float], k: int = 3) -> list[float]:
    return [sum(ys[max(0, i - k + 1): i + 1]) / len(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    quick = common.is_quick()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_argument(ap)
    ap.add_argument("--scale", type=float, default=None, help="trace duration factor (QUICK: 0.25)")
    ap.add_argument("--max-tokens", type=int, default=None, help="output tokens per request (default per pair; QUICK: 32)")
    ap.add_argument("--policies", nargs="*", default=[*SERVER_A, *SERVER_B])
    ap.add_argument("--max-prompt-chars", type=int, default=1200,
                    help="only Spec-Bench prompts this short (0: all); see dynamic_lib.short_prompts")
    ap.add_argument("--profile", type=Path, default=None, help="CostProfile JSON for dsd/oracle instead of measuring")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="server B without elastic memory")
    ap.add_argument("--kv-base-blocks", type=int, default=None,
                    help="memory-tight: KV blocks while the draft is resident, on both servers (module doc)")
    ap.add_argument("--cold", action="store_true",
                    help="start Nightjar without priors (default: priors derived from the run's profile)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite table.md, dynamic.png and results.json from the finished run in --out")
    args = ap.parse_args(argv)
    if args.kv_base_blocks and not args.memory:
        ap.error("--kv-base-blocks needs elastic memory (drop --no-memory)")
    args.quick = quick
    args.max_prompt_chars = args.max_prompt_chars or None
    if args.scale is None:
        args.scale = get_pair(args.pair).dynamic_quick_scale if quick else 1.0
    if args.max_tokens is None:
        args.max_tokens = 32 if quick else get_pair(args.pair).dynamic_max_tokens
    if args.out is None:
        sub = "dynamic" if args.pair == "bundled" else f"dynamic-{args.pair}"
        args.out = common.results_dir(sub) / ("quick" if quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bench = Bench(args)
    if args.report_only:
        bench.reload()
    else:
        (args.out / "records.jsonl").unlink(missing_ok=True)
        bench.server_a()
        bench.server_b(bench.profile_path)
        bench.meta["wall_s"] = round(time.perf_counter() - t0, 1)
    ratios = bench.report()
    print(f"wrote {args.out}/table.md, dynamic.png, results.json (wall {bench.meta['wall_s']} s)")
    common.print_result(**{k: (v if v is not None else float("nan")) for k, v in ratios.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
