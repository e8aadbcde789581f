"""Small data files shipped with the worker (see ``specbench_sample.json`` for source and license)."""

from __future__ import annotations

import json
from pathlib import Path

_DIR = Path(__file__).parent


def specbench_sample() -> list[dict]:
    """32 Spec-Bench first-turn prompts, 2-4 per category: ``{question_id, category, prompt}``."""
    return json.loads((_DIR / "specbench_sample.json").read_text())["questions"]
