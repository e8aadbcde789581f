"""vLLM ``general_plugins`` entry point (declared in pyproject): ``register()`` runs in every vLLM
process (API server, EngineCore, workers) and is the one installer of what Nightjar attaches to vLLM
(the list and the start-up checks: ``engine/hooks.py``); the hooks stay inert unless the engine runs
``NightjarScheduler`` with a draft model, and then a worker whose runner lacks them refuses to start.
With ``NIGHTJAR_FLUSH_DENORMAL=1`` (``serve --dtype float32``) it flushes denormals in the process.
It caps numba's thread pool at one thread (``pin_numba_threads``) and keeps llvmlite's library
wrapper out of the way of vLLM's CPU kernel scan (``shield_llvmlite_from_kernel_scan``). It refuses to start a process
where another package's plugin would patch vLLM under the hooks (``engine/hooks.py``).
On an unsupported vLLM version it installs nothing and says so; the scheduler then refuses to
start with the same message (``engine/version.py``).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("nightjar.plugin")


def pin_numba_threads() -> None:
    """One numba thread unless the operator chose otherwise (``NUMBA_NUM_THREADS``). vLLM's n-gram
    proposer (prompt-lookup steps) runs a ``parallel=True`` numba kernel with at most one thread, but
    launching numba's pool starts one thread per core for the life of the process; on CPU those left
    every later step slower, gamma 0 included (bundled pair, 2 cores: TPOT 62 -> 83 ms after the
    first n-gram steps, 59 ms throughout with one thread)."""
    import sys

    if os.environ.setdefault("NUMBA_NUM_THREADS", "1") == "1" and "numba" in sys.modules:
        from numba.core import config

        config.reload_config()  # numba read its settings at import; its pool has not started yet


def shield_llvmlite_from_kernel_scan() -> None:
    """vLLM CPU (no Triton) rebinds Triton kernels at every worker start by scanning each module's
    globals and reading ``vars(value).get("kernel")`` (``triton_utils/dispatcher._rebind_kernels``).
    llvmlite's ``ffi.lib`` answers any attribute, ``__dict__`` included, with a wrapped C symbol, so
    once numba is imported (vLLM's n-gram proposer imports it) a second in-process engine fails with
    "'_lib_fn_wrapper' object has no attribute 'get'". An empty ``__dict__`` entry in the wrapper's
    symbol table makes ``vars()`` answer ``{}``: nothing else looks up that name."""
    try:
        from llvmlite.binding import ffi
    except ImportError:  # no numba, no llvmlite: nothing to shield
        return
    fntab = getattr(ffi.lib, "_fntab", None)
    if isinstance(fntab, dict):
        fntab.setdefault("__dict__", {})


def register() -> None:
    pin_numba_threads()
    shield_llvmlite_from_kernel_scan()
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
    from nightjar_worker.engine.hooks import foreign_plugin_problem, install_worker_check, require

    require(foreign_plugin_problem())
    from nightjar_worker.engine.runner_hooks import install
    from nightjar_worker.memory.cpu_packed import install as install_memory_hooks
    from nightjar_worker.memory.kv_pool import install as install_kv_pool

    install()
    install_memory_hooks()  # inert unless elastic memory is enabled (memory area)
    install_kv_pool()  # the KV pool in an arena when elastic memory releases pages
    install_worker_check()  # last: it checks that the runner carries the hooks above
