"""Nightjar's executor inside vLLM V1 (no fork): a scheduler subclass picks gamma every step, a
model-runner hook skips the draft entirely at gamma == 0 and catches the draft's KV cache up when
speculation resumes. See ``docs/engine.md``.

Modules (one job each):
  version.py      supported vLLM range check (``vllm[-cpu]==0.32.*``)
  pair_check.py   refuse a draft whose tokenizer/vocabulary differs from the target's
  step_stats.py   the step log (StepFeedback as JSON lines)
  forced.py       a forced, cycled gamma schedule (tests, profiler)
  control.py      policy construction, runtime config watch, metrics, listeners (cross-area glue)
  scheduler.py    ``NightjarScheduler``: per-step gamma, feedback to the policy
  catchup.py      draft KV catch-up (worker side), C_switch measurement
  hooks.py        what the plugin attaches to vLLM, the V1 runner pin, the start-up checks
  runner_hooks.py the model-runner patches the plugin installs
  engine_args.py  vLLM engine kwargs for a Nightjar pair
"""
