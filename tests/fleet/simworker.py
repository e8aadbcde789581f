"""A simulated worker's ``/metrics`` on a pod IP, for the fleet tests on the real apiserver.

Containers never run on the test cluster, so something must answer at each pod's loopback IP. This
process serves real Prometheus text built from the worker's own metrics module
(``nightjar_worker.metrics``: the same ``nightjar_*`` names and labels) plus the ``vllm:*`` series the
fleet loop reads, driven by the step-level simulator:

- every ``--chunk-s`` of wall time it simulates one chunk of evenly spaced arrivals (``--rate``
  req/s, roofline profile) with a *persistent* Nightjar planner wrapped so that every simulated step is recorded
  (``nightjar_steps_total``, drafts/accepted tokens, C_switch, batch size, planner snapshot gauges);
- the request latencies vLLM would export are derived from the chunk: TPOT around the simulated mean
  TPOT, TTFT from the profile's prefill time, both multiplied by ``latency_scale`` (read from the
  ``--control`` JSON file on every chunk, so a test can push latency over the SLO at run time).

Run: ``python tests/fleet/simworker.py --host 127.0.0.7 --port 18123 [--control f.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profiles" / "roofline-h100-7b.json"

# vLLM 0.32's default bucket bounds (vllm/v1/metrics/buckets.py), copied so that this helper does not
# import vLLM (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)


class RecordingPolicy:
    """Forwards the step contract to the planner and records every step in the worker metrics."""

    def __init__(self, inner, wm) -> None:
        self.inner, self.wm = inner, wm
        self.name = inner.name
        self.steps = 0

    @property
    def arms(self):
        return self.inner.arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        t0 = time.perf_counter()
        g = self.inner.decide(batch_size, prompt_tokens)
        self.wm.observe_decision(time.perf_counter() - t0)
        return g

    def observe(self, fb) -> None:
        self.inner.observe(fb)
        self.wm.observe_step(fb.gamma, fb.batch_size, fb.num_draft_tokens, fb.num_accepted_tokens)
        if fb.switch_cost_s > 0:
            self.wm.observe_switch_cost(fb.switch_cost_s)
        self.steps += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rate", type=float, default=40.0, help="simulated requests per second")
    ap.add_argument("--chunk-s", type=float, default=0.25, help="wall seconds per simulated chunk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--control", default=None, help="JSON file with {latency_scale: float}")
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--offload-reason", default="enabled",
                    help="what nightjar_memory_offload_enabled reports (a GPU worker: cuda_kv_release_unverified)")
    args = ap.parse_args(argv)

    from nightjar_worker import metrics as wmod
    from nightjar_worker.planner import PlannerConfig, build_policy
    from nightjar_worker.sim.profile import CostProfile
    from nightjar_worker.sim.simulator import Simulator
    from nightjar_worker.sim.workload import Workload
    from prometheus_client import Counter, Gauge, Histogram, start_http_server

    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", ["model_name"], buckets=TTFT_BUCKETS)
    tpot = Histogram("vllm:request_time_per_output_token_seconds", "TPOT per request", ["model_name"], buckets=ITL_BUCKETS)
    gen = Counter("vllm:generation_tokens", "Generation tokens", ["model_name"])
    running = Gauge("vllm:num_requests_running", "Running requests", ["model_name"])
    waiting = Gauge("vllm:num_requests_waiting", "Waiting requests", ["model_name"])
    model = "sim"

    profile = CostProfile.load(args.profile)
    workload = Workload()
    policy = RecordingPolicy(build_policy(PlannerConfig(max_gamma=4, max_batch=profile.max_batch, seed=args.seed)),
                             wmod.worker_metrics())
    wm = wmod.worker_metrics()
    wm.draft_state_changed(None, "resident")
    wm.set_kv_blocks(profile.kv_blocks_total)
    wm.set_offload_enabled(args.offload_reason == "enabled", args.offload_reason)
    start_http_server(args.port, addr=args.host)
    print(f"simworker serving http://{args.host}:{args.port}/metrics", flush=True)

    rng = random.Random(args.seed)
    chunk = 0
    while True:
        t0 = time.monotonic()
        scale = 1.0
        if args.control:
            try:
                scale = float(json.loads(Path(args.control).read_text()).get("latency_scale", 1.0))
            except (OSError, ValueError):
                pass
        # Evenly spaced arrivals, same chunk seeds on every simworker: equal offered load and tokens
        # per pod, so a rollout's throughput comparison sees the revisions, not arrival noise.
        crng = random.Random(chunk)
        n = max(1, round(args.rate * args.chunk_s))
        reqs = [workload.sample(crng, i, i * args.chunk_s / n) for i in range(n)]
        chunk += 1
        if reqs:
            res = Simulator(profile, reqs, seed=chunk).run(policy)
            gen.labels(model).inc(res.output_tokens)
            for r in reqs:
                noise = math.exp(0.25 * rng.gauss(0.0, 1.0))
                tpot.labels(model).observe(max(res.mean_tpot_s, 1e-4) * noise * scale)
                prefill = profile.step_time(max(1, r.prompt_tokens), 0)
                ttft.labels(model).observe(prefill * math.exp(0.25 * rng.gauss(0.0, 1.0)) * scale)
            running.labels(model).set(min(len(reqs), profile.max_batch))
            waiting.labels(model).set(0)
        wm.set_planner_snapshot(policy.inner.snapshot())
        time.sleep(max(0.0, args.chunk_s - (time.monotonic() - t0)))


if __name__ == "__main__":
    sys.exit(main())
