"""The planner's arms: (source, gamma) pairs.

Gamma 0 is plain decoding, one arm whatever the source. Draft-model arms come first, in the
config's order (so their indices are the gammas' positions in ``PlannerConfig.resolved_arms()``),
then the host sources' arms (prompt lookup, suffix trees). Only a draft arm with gamma > 0 runs the draft model
(``drafting``): what C_switch, the draft's prefill charge and elastic memory are about.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Key = tuple[str, int]


@dataclass(frozen=True)
class ArmSet:
    keys: tuple[Key, ...]
    gamma: tuple[int, ...] = field(init=False)
    source: tuple[str, ...] = field(init=False)
    drafting: tuple[bool, ...] = field(init=False)
    _index: dict[Key, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gamma", tuple(g for _, g in self.keys))
        object.__setattr__(self, "source", tuple(s for s, _ in self.keys))
        object.__setattr__(self, "drafting", tuple(s == "draft" and g > 0 for s, g in self.keys))
        object.__setattr__(self, "_index", {k: i for i, k in enumerate(self.keys)})

    @classmethod
    def build(cls, draft: tuple[int, ...], host: Mapping[str, tuple[int, ...]] | None = None) -> ArmSet:
        """Draft-model arms, then each host source's (``PlannerConfig.host_arms()``) in its order."""
        hosted = tuple((src, g) for src, gs in (host or {}).items() for g in gs if g > 0)
        return cls(tuple(("draft", g) for g in draft) + hosted)

    def __len__(self) -> int:
        return len(self.keys)

    def of(self, source: str, gamma: int) -> int | None:
        """The arm index of a (source, gamma) step; gamma 0 is the plain arm whatever the source."""
        return self._index.get(("draft", 0) if gamma == 0 else (source, gamma))

    def draft_index(self) -> dict[int, int]:
        """gamma -> index of the draft-model arms (what priors are about)."""
        return {g: i for i, (s, g) in enumerate(self.keys) if s == "draft"}

    def gammas(self) -> tuple[int, ...]:
        """Every gamma an arm may return, ascending."""
        return tuple(sorted(set(self.gamma)))
