"""The plugin caps numba's pool at one thread (vLLM's n-gram proposer would otherwise start one per
core for the life of the worker: every later step slower on CPU, see vllm_plugin.pin_numba_threads)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import numba
before = numba.config.NUMBA_NUM_THREADS
from nightjar_worker.vllm_plugin import pin_numba_threads
pin_numba_threads()
import os
print(before, numba.config.NUMBA_NUM_THREADS, os.environ["NUMBA_NUM_THREADS"])
"""


def _run(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**base, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def test_one_numba_thread_even_when_numba_was_imported_first():
    before, after, env = _run()
    assert int(before) >= 1 and int(after) == 1 and env == "1"  # numba defaults to one per core


def test_the_operators_choice_is_kept():
    assert _run(NUMBA_NUM_THREADS="2")[1:] == ["2", "2"]


SCAN = """
import numba  # imports llvmlite.binding, whose ffi.lib answers any attribute with a C symbol
from vllm.triton_utils.dispatcher import _rebind_kernels
{shield}
try:
    _rebind_kernels([])  # the module scan vLLM CPU runs at every worker start, with nothing to rebind
    print("ok")
except AttributeError as e:
    print("failed:", e)
"""


def test_vllm_cpu_kernel_scan_survives_numba_once_the_plugin_shields_llvmlite():
    """A second in-process engine after an n-gram step failed to start on CPU (CI, this module's
    neighbour tests/memory/test_sources_offload_lossless.py) until the plugin shielded llvmlite."""
    def scan(shield: str) -> str:
        out = subprocess.run([sys.executable, "-c", SCAN.format(shield=shield)], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()

    assert scan("").startswith("failed:")  # the upstream behaviour the shield exists for
    assert scan("from nightjar_worker.vllm_plugin import shield_llvmlite_from_kernel_scan\n"
                "shield_llvmlite_from_kernel_scan()") == "ok"
