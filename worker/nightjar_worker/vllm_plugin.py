"""vLLM ``general_plugins`` entry point (declared in pyproject): ``register()`` runs in every vLLM
process (API server, EngineCore, workers). It installs Nightjar's model-runner hooks
(``engine/runner_hooks.py``); they stay inert unless the engine runs ``NightjarScheduler``.
With ``NIGHTJAR_FLUSH_DENORMAL=1`` (``serve --dtype float32``) it flushes denormals in the process.
On an unsupported vLLM version it installs nothing and says so; the scheduler then refuses to
start with the same message (``engine/version.py``).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("nightjar.plugin")


def register() -> None:
    if os.environ.get("NIGHTJAR_FLUSH_DENORMAL") == "1":
        # float32 on CPU: denormal arithmetic runs 20-50x slower on x86 (docs/engine.md);
        # set per process here, before any model runs in this process's main thread.
        import torch

        torch.set_flush_denormal(True)
    from nightjar_worker.engine.version import UnsupportedVLLMVersion, check_vllm_version

    try:
        check_vllm_version()
    except UnsupportedVLLMVersion as e:
        log.warning("%s (Nightjar hooks not installed)", e)
        return
    from nightjar_worker.engine.runner_hooks import install

    install()
    from nightjar_worker.memory.cpu_packed import install as install_memory_hooks

    install_memory_hooks()  # inert unless elastic memory is enabled (memory area)
