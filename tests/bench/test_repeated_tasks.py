"""The prompts that repeat across requests (``nightjar_worker.data.repeated_tasks``)."""

from __future__ import annotations

import pytest
from nightjar_worker.data.repeated_tasks import CATEGORIES, repeated_task_prompts


def test_prompts_are_deterministic_interleaved_and_repeat_across_requests():
    ps = repeated_task_prompts(8)
    assert ps == repeated_task_prompts(8) and len(ps) == 24
    assert [p.category for p in ps[:3]] == list(CATEGORIES)
    assert len({p.qid for p in ps}) == 24 and all(p.qid < 0 for p in ps)  # never a Spec-Bench qid
    by = {c: [p.text for p in ps if p.category == c] for c in CATEGORIES}
    assert by["same-task"][0] == by["same-task"][2] != by["same-task"][3]  # asked again, word for word
    code = by["code-edit"]
    assert len(set(code)) == 8 and all("def longest_common_subsequence_length" in t for t in code)  # one file, 8 edits
    loop = by["agent-loop"]
    assert loop[1].startswith(loop[0].rsplit("\n", 1)[0].rsplit("\n", 1)[0])  # the next step re-sends the context
    assert loop[3].count("Observation:") == 3 and loop[4].count("Observation:") == 0  # a new task's loop
    assert repeated_task_prompts(2, start=6)[0].text == by["same-task"][6]
    with pytest.raises(ValueError, match="unknown"):
        repeated_task_prompts(1, ("chat",))
