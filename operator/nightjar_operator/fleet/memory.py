"""The ``ElasticMemory`` condition (pure): what the workers say about offloading the draft.

Each worker exports ``nightjar_memory_offload_enabled{reason}``: 1 with reason ``enabled`` when it
offloads and reloads the draft by itself, 0 with the reason it does not (``disabled``, or why the
device cannot, e.g. ``cuda_kv_release_unverified``). A spec that asks for offload (policy Auto) on
workers that cannot do it still serves; this condition is where the user reads that it did not.
"""

from __future__ import annotations

from nightjar_operator.fleet.slo import ConditionVerdict as MemoryEvaluation

CONDITION_TYPE = "ElasticMemory"
ENABLED = "enabled"


def evaluate_memory(policy: str, offload: dict[str, int]) -> MemoryEvaluation:
    """``policy``: spec.speculation.offload.policy; ``offload``: reason -> pods (FleetStats.offload)."""
    if policy != "Auto":
        return MemoryEvaluation("False", "Disabled", f"spec.speculation.offload.policy is {policy}: the draft stays resident")
    total = sum(offload.values())
    if total == 0:
        return MemoryEvaluation("Unknown", "NotMeasured", "no worker has reported its elastic memory state yet")
    on = offload.get(ENABLED, 0)
    if on == total:
        return MemoryEvaluation("True", "Active", f"{on}/{total} pods offload the draft under KV pressure and reload it")
    off = ", ".join(f"{n} pods: {r}" for r, n in sorted(offload.items()) if r != ENABLED)
    return MemoryEvaluation(
        "False", "Unavailable",
        f"offload policy Auto, but {total - on}/{total} pods serve with the draft always resident ({off}); "
        "speculation still adapts per step. See docs/memory.md for what each reason means",
    )
