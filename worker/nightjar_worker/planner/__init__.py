"""Gamma policies: Nightjar's contextual-bandit planner and the baselines it is measured against.

Pure Python (no torch, no vllm). ``build_policy(config, profile)`` is the single factory the engine,
the simulator and the benchmarks use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nightjar_contract.planner import PlannerConfig, PlannerPriors, PriorEntry

from nightjar_worker.planner.policy import GammaPolicy, StepFeedback

if TYPE_CHECKING:
    from nightjar_worker.sim.profile import CostProfile

__all__ = ["GammaPolicy", "PlannerConfig", "PlannerPriors", "PriorEntry", "StepFeedback", "build_policy"]


def build_policy(config: PlannerConfig, profile: CostProfile | None = None) -> GammaPolicy:
    """Instantiate the policy named by ``config.policy``.

    ``profile`` is required by 'oracle' (the true cost surface) and used by 'dsd' (its latency
    model); the others ignore it.
    """
    arms = config.resolved_arms()
    p = config.policy
    if p == "nightjar":
        from nightjar_worker.planner.nightjar import NightjarPolicy

        return NightjarPolicy(config)
    if p == "nosd":
        from nightjar_worker.planner.nosd import NoSDPolicy

        return NoSDPolicy()
    if p == "static":
        from nightjar_worker.planner.static import StaticPolicy

        g = config.static_gamma if config.static_gamma is not None else max(arms)
        return StaticPolicy(g, arms, config.static_source)
    if p == "table":
        from nightjar_worker.planner.table import TablePolicy

        assert config.gamma_table is not None  # enforced by PlannerConfig
        return TablePolicy(config.gamma_table, arms)
    if p == "dsd":
        from nightjar_worker.planner.dsd import DSDPolicy

        if profile is None:
            raise ValueError("policy: 'dsd' needs a CostProfile (its profiled latency model)")
        return DSDPolicy(config, profile)
    if p == "ucb":
        from nightjar_worker.planner.ucb import UCBPolicy

        return UCBPolicy(config)
    if p == "oracle":
        from nightjar_worker.planner.oracle import OraclePolicy

        if profile is None:
            raise ValueError("policy: 'oracle' needs a CostProfile (the true cost surface)")
        return OraclePolicy(config, profile)
    raise ValueError(f"policy: unknown policy {p!r}")
