"""Whether elastic memory runs in this engine, and if not, why: one decision for both processes.

The scheduler process (``manager.ElasticMemoryManager.attach_if_enabled``) and the worker process
(``kv_pool.install``: where vLLM allocates the KV pool) must agree, so both call ``availability``.
"""

from __future__ import annotations

from typing import Any

from nightjar_contract.memory import ElasticMemoryConfig

# Why elastic memory is off although it may have been asked for: the ``reason`` label of
# ``nightjar_memory_offload_enabled`` and of the operator's ElasticMemory condition.
UNAVAILABLE_MESSAGES = {
    "disabled": "not requested (memory.enabled false / offload policy Never)",
    "cuda_kv_release_unverified": (
        "returning the offloaded draft's bytes to the KV cache on CUDA needs the KV pool in CUDA virtual "
        "memory (memory/cuda_vmm.py), which has not passed on a GPU in this build; the draft stays "
        "resident and speculation still adapts per step (allow_unverified_cuda: true runs it anyway)"
    ),
    "vllm_memory_pool": (
        "vLLM's sleep mode (enable_cumem_allocator) allocates the KV cache in its own memory pool, so "
        "part of it cannot be returned; the draft stays resident"
    ),
    "unsupported_device": "elastic memory supports the cpu and cuda devices only",
}


def unavailable_reason(cfg: ElasticMemoryConfig, device_type: str, vllm_memory_pool: bool = False) -> str | None:
    """None when elastic memory runs on this device, else a key of ``UNAVAILABLE_MESSAGES``."""
    if not cfg.enabled:
        return "disabled"
    if device_type not in ("cpu", "cuda"):
        return "unsupported_device"
    if cfg.release_pages and vllm_memory_pool:
        return "vllm_memory_pool"
    if device_type == "cuda" and not cfg.allow_unverified_cuda:
        return "cuda_kv_release_unverified"
    return None


def availability(vllm_config: Any) -> tuple[ElasticMemoryConfig, str, str | None]:
    """(config, device type, unavailable reason) of the engine that ``vllm_config`` describes."""
    from .config import load_config

    cfg = load_config(getattr(vllm_config, "additional_config", None) or {})
    device = str(getattr(getattr(vllm_config, "device_config", None), "device_type", "cpu") or "cpu")
    pool = bool(getattr(getattr(vllm_config, "model_config", None), "enable_cumem_allocator", False))
    return cfg, device, unavailable_reason(cfg, device, pool)
