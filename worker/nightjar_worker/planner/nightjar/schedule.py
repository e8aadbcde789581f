"""The paper's hierarchical exploration schedule, per bucket, and the bin in progress.

The steps that fall in a bucket form blocks of 2^(b-1) steps, each split into bins of about
sqrt(block length) steps; a bin is an exploration bin with probability
max(floor, scale / sqrt(bin index)); the arm is held fixed for the whole bin (no thrashing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Schedule:
    block_exp: int = 0
    block_left: int = 0
    bin_size: int = 1
    bin_idx: int = 0
    handed_out: int = 0  # steps the schedule has handed out
    # the bin in progress
    arm: int = 0  # arm index held
    left: int = 0  # steps left after the current one
    exploring: bool = False
    best: int = -1  # the exploit arm at the last bin (for the monotone prior), -1 if none

    def next_bin(self, max_block_exp: int) -> int:
        """Advance by one bin; returns its length."""
        if self.block_left <= 0:
            b = min(self.block_exp + 1, max_block_exp + 1)
            self.block_exp = b
            length = 1 << (b - 1)
            self.block_left = length
            self.bin_size = max(1, round(math.sqrt(length)))
        size = min(self.bin_size, self.block_left)
        self.block_left -= size
        self.bin_idx += 1
        self.handed_out += size
        return size

    def advance(self, steps: int, max_block_exp: int) -> None:
        """Move on by about ``steps`` steps (whole bins), as if they had been played: later bins
        are longer and explore with lower probability."""
        while steps > 0:
            steps -= self.next_bin(max_block_exp)

    def explore_probability(self, scale: float, floor: float) -> float:
        return max(floor, scale / math.sqrt(self.bin_idx))

    def hold(self, arm: int, steps: int, exploring: bool = False) -> None:
        """Hold ``arm`` for this step and ``steps`` more: the bin's decision."""
        self.arm, self.left, self.exploring = arm, steps, exploring

    def held(self) -> int | None:
        """The arm the bin in progress holds for this step, or None when the bin is over."""
        if self.left <= 0:
            return None
        self.left -= 1
        return self.arm

    def end_bin(self) -> None:
        """End the bin in progress: the next step starts a new one (re-decides)."""
        self.left = 0

    def replace_arm(self, arm: int) -> None:
        """Play ``arm`` instead for the rest of the bin."""
        self.arm = arm

    def note_best(self, arm: int) -> None:
        """The exploit arm at this bin (what neighbours' monotone prior reads)."""
        self.best = arm
