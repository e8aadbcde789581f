"""A /metrics target fed by the worker's real metrics code, without a vLLM engine.

Run as ``python metrics_target.py PORT WORKDIR``. It drives ``nightjar_worker.engine.control.EngineControl``
(the scheduler-side glue the Nightjar scheduler calls every step: real Nightjar policy, real config
watcher, real ``nightjar_*`` metrics) with step costs and acceptance from the analytic cost profile
(the simulator's model), a load that swings between batch 1 and 48, a rejected and an accepted
config update, and a draft offload/reload cycle through the memory manager's recording calls; and
serves prometheus_client's registry on 127.0.0.1:PORT. vLLM's own ``vllm:*`` series are NOT here
(they need an engine). Timed events start once WORKDIR/go exists.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

from prometheus_client import start_http_server

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "benchmarks" / "profiles" / "roofline-h100-7b.json"

CONFIG = """planner:
  policy: nightjar
  max_gamma: 4
slo:
  ttft_p95_ms: 500
  tpot_p95_ms: 50
"""


def main() -> int:
    port, workdir = int(sys.argv[1]), Path(sys.argv[2])
    from nightjar_worker.engine.control import EngineControl
    from nightjar_worker.planner.policy import StepFeedback
    from nightjar_worker.sim.profile import CostProfile

    cfg = workdir / "nightjar.yaml"
    cfg.write_text(CONFIG)
    profile = CostProfile.load(PROFILE)
    ctl = EngineControl(4, config_path=cfg, profile=profile, poll_s=0.2, snapshot_every_s=0.5)
    m = ctl.metrics
    m.draft_state_changed(None, "resident")
    m.set_offload_enabled(True, "enabled")  # as a worker whose elastic memory manager started
    m.set_kv_blocks(profile.kv_blocks_total, 0)
    start_http_server(port, addr="127.0.0.1")
    print(f"serving on 127.0.0.1:{port}", flush=True)

    rng = random.Random(0)
    alpha = profile.alpha()
    go = workdir / "go"  # the test creates it once Prometheus scrapes us: events after that are seen
    t0 = time.monotonic()
    prev_gamma, steps_at_zero, n = None, 0, 0
    phase_done: set[str] = set()
    while True:
        t = time.monotonic() - t0
        # Load swings between light and heavy every 6 s (the planner should lower gamma under load).
        batch = max(1, int(round(24 + 23 * math.sin(t * 2 * math.pi / 12))))
        gamma, _ = ctl.decide(batch)
        step = profile.step_time(batch, gamma)
        accepted = sum(1 for _ in range(gamma * batch) if rng.random() < alpha) if gamma else 0
        switch = 0.0
        if prev_gamma == 0 and gamma > 0:
            switch = profile.switch_cost(steps_at_zero)
        steps_at_zero = steps_at_zero + 1 if gamma == 0 else 0
        n += 1
        ctl.observe(StepFeedback(step=n, batch_size=batch, num_reqs=batch, gamma=gamma, step_time_s=step,
                              tokens_emitted=batch + accepted, num_draft_tokens=gamma * batch,
                              num_accepted_tokens=accepted, switch_cost_s=switch))
        prev_gamma = gamma
        # The suffix trees look up every request each step (the engine reports it with the step).
        m.observe_suffix(batch, sum(1 for _ in range(batch) if rng.random() < 0.3), 8192 * batch, batch)
        if not go.exists():
            time.sleep(0.004)
            t0 = time.monotonic()
            continue
        # A forced switch pair early on, so C_switch is observed even if the planner never idles.
        if "switch" not in phase_done and t > 1.0:
            m.observe_switch_cost(profile.switch_cost(8))
            phase_done.add("switch")
        # A malformed config update (rejected, old config kept), then a valid one.
        if "bad-config" not in phase_done and t > 2.0:
            cfg.write_text("planner:\n  max_gamma: -3\n")
            phase_done.add("bad-config")
        if "good-config" not in phase_done and t > 3.0:
            cfg.write_text(CONFIG.replace("tpot_p95_ms: 50", "tpot_p95_ms: 40"))
            phase_done.add("good-config")
        # Memory pressure: the draft goes out (its bytes become KV blocks) and comes back.
        if "offload" not in phase_done and t > 2.5:
            m.draft_state_changed("resident", "offloading")
            m.observe_offload(0.12)
            m.draft_state_changed("offloading", "offloaded")
            m.set_kv_blocks(profile.kv_blocks_total + profile.draft_blocks(), profile.draft_blocks())
            phase_done.add("offload")
        if "reload" not in phase_done and t > 5.0:
            m.draft_state_changed("offloaded", "reloading")
            m.observe_reload(0.2, ok=True)
            m.draft_state_changed("reloading", "resident")
            m.set_kv_blocks(profile.kv_blocks_total, 0)
            phase_done.add("reload")
        time.sleep(0.004)  # ~200 steps/s: plenty of samples, little CPU


if __name__ == "__main__":
    sys.exit(main())
