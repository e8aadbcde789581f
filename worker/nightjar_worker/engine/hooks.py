"""Nightjar in vLLM's loop, or the engine does not start: which runner the hooks are on, and the checks.

The plugin (``vllm_plugin.register``, in every vLLM process) is the one installer; on a supported
vLLM (``version.py``) it wraps, without modifying any vLLM file:

  V1 model runner ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` (the CPU runner subclasses it):
    ``propose_draft_token_ids``, ``sample_tokens``   runner_hooks.py: draft skip at gamma 0, draft KV
                                                      catch-up, n-gram drafts, the worker's step stats
    ``initialize_kv_cache``                           memory/kv_pool.py: the KV pool in an arena
  ``SpecDecodeBaseProposer.load_model``, the CPU GEMM dispatch   memory/cpu_packed.py
  ``vllm.v1.worker.gpu_worker.Worker.load_model``    ``install_worker_check`` below

Other packages' vLLM plugins that must stay off (``FOREIGN_PLUGINS``: Arctic Inference's, installed
with the suffix source's trees) are left out of ``VLLM_PLUGINS`` by ``nightjar-worker serve``
(``plugin_allowlist``), and the plugin refuses to start a process that would turn them on.

**Runner choice: V1, pinned.** vLLM 0.32 builds Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``,
another class with its own step loop) whenever Triton imports, i.e. on every CUDA install, and its
unsupported-feature list does not name draft models (``VllmConfig.use_v2_model_runner``). The CPU
build has no Triton and runs V1. Nightjar pins V1 through vLLM's own switch, ``RUNNER_ENV`` = 0, set by
``nightjar-worker serve`` and by the operator in every worker pod, rather than porting the hooks to
V2: V2 runs on no machine that tests this project (it needs Triton and a GPU), so hooks on it would
ship untested, while V1 is what every engine test here runs. The price: V2-only features (full CUDA
graphs for every speculative shape among them) stay off until the hooks are ported.

**In the loop or not at all.** When the engine runs ``NightjarScheduler`` with a draft model:
  * the scheduler refuses a configuration whose runner is V2 (``config_problem``);
  * every worker, once vLLM has built its runner and before the weights load, refuses a runner class
    that does not resolve the hooked methods to Nightjar's wrappers (``runner_problem``);
  * the scheduler refuses a step output that lacks the worker's stats: the hooks did not run.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from nightjar_contract.engine import RUNNER_ENV, RUNNER_ENV_VALUE

log = logging.getLogger("nightjar.engine")

HOOKED_RUNNER_METHODS = ("propose_draft_token_ids", "sample_tokens", "initialize_kv_cache")
# Subclass overrides of a hooked method known to call the hooked method through super()
# (tests/engine/test_runner_choice.py reads their source in the installed vLLM).
DELEGATING_OVERRIDES = frozenset({("vllm.v1.worker.cpu_model_runner.CPUModelRunner", "initialize_kv_cache")})


class NightjarNotInLoop(RuntimeError):
    """vLLM would serve this engine without Nightjar's hooks; the engine must not start."""


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_hook(fn: object) -> bool:
    """A method wrapped by Nightjar (every wrapper is defined in this package)."""
    return callable(fn) and str(getattr(fn, "__module__", "")).startswith("nightjar_worker.")


def nightjar_enabled(vllm_config: Any) -> bool:
    """The engine runs ``NightjarScheduler`` (or a subclass) with a draft model: the hooks must run."""
    if os.environ.get("NIGHTJAR_ENGINE", "1") == "0":
        return False
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or not spec.uses_draft_model():
        return False
    cls = vllm_config.scheduler_config.scheduler_cls
    name = cls if isinstance(cls, str) else f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', '')}"
    if not name:
        return False
    if name.endswith("NightjarScheduler"):
        return True
    # a subclass of ours under another name (by its MRO's names: scheduler.py imports this module)
    return isinstance(cls, type) and any(qualname(k) == "nightjar_worker.engine.scheduler.NightjarScheduler"
                                         for k in cls.__mro__)


def config_problem(vllm_config: Any) -> str | None:
    """Why this engine configuration would run without Nightjar's hooks, or None."""
    if getattr(vllm_config, "use_v2_model_runner", False):
        return (
            f"vLLM selected Model Runner V2, and Nightjar's hooks are on the V1 runner; set {RUNNER_ENV}="
            f"{RUNNER_ENV_VALUE} (nightjar-worker serve and the operator's pods do; HiSparse and watermarking "
            "force V2 and cannot be combined with Nightjar)"
        )
    return None


def runner_problem(cls: type) -> str | None:
    """Why a model runner of class ``cls`` would run without Nightjar's hooks, or None."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not issubclass(cls, GPUModelRunner):
        return (
            f"vLLM built the model runner {qualname(cls)}, not a subclass of {qualname(GPUModelRunner)} that "
            f"Nightjar's hooks are on (Model Runner V2? set {RUNNER_ENV}={RUNNER_ENV_VALUE})"
        )
    mro = cls.__mro__
    for meth in HOOKED_RUNNER_METHODS:
        if not is_hook(GPUModelRunner.__dict__.get(meth)):
            return f"{qualname(GPUModelRunner)}.{meth} is not hooked (the Nightjar vLLM plugin did not run in this process)"
        for k in mro[: mro.index(GPUModelRunner)]:
            if meth in k.__dict__ and (qualname(k), meth) not in DELEGATING_OVERRIDES:
                return f"{qualname(k)}.{meth} overrides Nightjar's hook on {qualname(GPUModelRunner)}.{meth}"
    return None


# vLLM plugins of other packages that must not load beside Nightjar: Arctic Inference (the suffix
# source's trees) registers one that patches vLLM's runner and spec decoding when
# ARCTIC_INFERENCE_ENABLED=1, and is a no-op otherwise; Nightjar imports only its suffix-tree core.
FOREIGN_PLUGINS = frozenset({"arctic_inference"})
ARCTIC_ENV = "ARCTIC_INFERENCE_ENABLED"


def plugin_allowlist() -> str:
    """``VLLM_PLUGINS`` for ``nightjar-worker serve``: every installed general plugin (Nightjar's,
    vLLM's own LoRA resolvers) but ``FOREIGN_PLUGINS``, which then are not even imported."""
    from importlib.metadata import entry_points

    names = {e.name for e in entry_points(group="vllm.general_plugins")} - FOREIGN_PLUGINS
    return ",".join(sorted(names))


def foreign_plugin_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why a foreign plugin would patch vLLM under Nightjar's hooks in this process, or None."""
    env = os.environ if environ is None else environ
    if env.get(ARCTIC_ENV, "0") == "1":
        return (f"{ARCTIC_ENV}=1 turns on Arctic Inference's vLLM plugin, whose patches replace the runner and "
                "speculative decoding code Nightjar hooks; unset it (Nightjar uses only Arctic's suffix trees)")
    return None


def require(problem: str | None) -> None:
    if problem is not None:
        raise NightjarNotInLoop(f"nightjar: refusing to start: {problem}")


def install_worker_check() -> bool:
    """Wrap vLLM's ``Worker.load_model`` (CPU and CUDA workers inherit it; the runner exists by then)
    so that a worker whose runner would skip the hooks fails start-up. Idempotent."""
    from vllm.v1.worker.gpu_worker import Worker

    orig = Worker.load_model
    if is_hook(orig):
        return False

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        if nightjar_enabled(self.vllm_config):
            require(runner_problem(type(self.model_runner)))
            log.info("nightjar: hooks on %s", qualname(type(self.model_runner)))
        return orig(self, *args, **kwargs)

    load_model.__wrapped__ = orig  # type: ignore[attr-defined]
    Worker.load_model = load_model
    return True
