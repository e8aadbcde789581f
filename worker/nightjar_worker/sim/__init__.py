"""Step-level serving simulator and cost profiles (pure Python; no torch or vllm)."""

from nightjar_worker.sim.profile import CostProfile, expected_tokens

__all__ = ["CostProfile", "expected_tokens"]
