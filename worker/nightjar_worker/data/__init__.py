"""Small data files shipped with the worker: Spec-Bench prompts (source and license in each file).

``specbench_questions.json``: the 400 Spec-Bench questions, first turn only (what ``loadgen`` and the
serving benchmarks send); ``specbench_sample.json``: 32 of them, 2-4 per category (engine tests).
"""

from __future__ import annotations

import json
from pathlib import Path

_DIR = Path(__file__).parent


def specbench_sample() -> list[dict]:
    """32 Spec-Bench first-turn prompts, 2-4 per category: ``{question_id, category, prompt}``."""
    return json.loads((_DIR / "specbench_sample.json").read_text())["questions"]


def specbench_questions() -> list[dict]:
    """All 400 bundled Spec-Bench first-turn prompts, file order: ``{question_id, category, prompt}``."""
    return json.loads((_DIR / "specbench_questions.json").read_text())["questions"]
