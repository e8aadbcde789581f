"""Nightjar's decisions, pinned: a refactoring of the planner must not change one of them.

Each case drives the planner through a shifting load in the simulator and hashes every decision
(gamma, source, draft demand) and the final snapshot. A change meant to alter the planner's
behaviour updates ``PINNED`` in the same commit (and says why, with bench-planner's figures).
"""

from __future__ import annotations

import hashlib

import pytest
from nightjar_worker.planner import PlannerConfig, build_policy
from nightjar_worker.planner.nightjar import NightjarPolicy
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.sources import SourceTable
from nightjar_worker.sim.workload import dynamic_trace, make_requests

CASES = {  # name -> PlannerConfig fields, toggling the draft's availability every n decisions (0: never)
    "default": ({}, 0),
    "paper": ({"paper_mode": True}, 0),
    "ngram-offload": ({"ngram_arms": [3]}, 700),
    "slo": ({"slo_tpot_s": 0.05}, 0),
    "priors": ({}, 0),
}
PINNED = {
    "default": "eb5f79920660527c",
    "paper": "ff8b78ca706caefd",
    "ngram-offload": "a8a03f170e41dc37",  # a resume amortised over the stay where speculation gains too (flips.py)
    "slo": "eb5f79920660527c",  # = default: a TPOT target alone changes no decision (planner/nightjar/objective.py)
    "priors": "83a9dc5c149fb1ca",
}


class _Recorder:
    """Passes the simulator's calls to the policy and hashes what it decides."""

    def __init__(self, policy: NightjarPolicy, toggle: int) -> None:
        self.p, self.toggle, self.n = policy, toggle, 0
        self.h = hashlib.sha256()
        self.name, self.arms, self.stats = policy.name, policy.arms, policy.stats

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        self.n += 1
        if self.toggle and self.n % self.toggle == 0:
            self.p.set_draft_available(not self.p.draft_available)
        g = self.p.decide(batch_size, prompt_tokens)
        self.h.update(f"{g}{self.p.source()}{self.p.draft_demand(batch_size)};".encode())
        return g

    def observe(self, feedback) -> None:
        self.p.observe(feedback)

    def source(self) -> str:
        return self.p.source()


def _policy(profile: CostProfile, seed: int, **fields) -> NightjarPolicy:
    pol = build_policy(PlannerConfig(policy="nightjar", max_gamma=4, max_batch=profile.max_batch, seed=seed, **fields),
                       profile)
    assert isinstance(pol, NightjarPolicy)
    return pol


def fingerprint(profile: CostProfile, case: str) -> str:
    fields, toggle = CASES[case]
    pol = _policy(profile, 0, **fields)
    if case == "priors":  # warm-started from another worker's snapshot
        warm = _policy(profile, 7)
        Simulator(profile, make_requests(dynamic_trace(0.6, 6.0, 20.0), 7), seed=7).run(warm)
        pol.set_priors(warm.snapshot())
    rec = _Recorder(pol, toggle)
    # n-gram steps cost and accept as the calibrated n-gram source (sim/sources.json)
    sources = SourceTable.for_profile(profile) if fields.get("ngram_arms") else None
    Simulator(profile, make_requests(dynamic_trace(0.6, 5.4, 30.0), 0), seed=0, sources=sources).run(rec)  # type: ignore[arg-type]
    rec.h.update(pol.snapshot().model_dump_json().encode())
    return rec.h.hexdigest()[:16]


@pytest.mark.parametrize("case", list(CASES))
def test_the_planner_decides_as_pinned(roofline, case):
    assert fingerprint(roofline, case) == PINNED[case]
