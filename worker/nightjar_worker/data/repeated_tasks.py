"""Prompts that repeat ACROSS requests, built deterministically from the bundled Spec-Bench questions.

Spec-Bench's categories are independent questions: what one request generates rarely helps the
next. Traffic that speculation from a cross-request cache (the suffix source) is made for repeats
itself between requests; three such categories, each a function of the request's index ``i``:

* ``same-task``: the same few questions asked again and again (a FAQ, a scheduled job): question
  ``(i // 3) % 2`` of two fixed Spec-Bench questions, word for word;
* ``code-edit``: edits of one file: the Python function of Spec-Bench's coding question 124, with
  edit ``i`` of a list (instruction x name), each answer the whole edited file;
* ``agent-loop``: an agent's loop re-sending its context: a fixed tool preamble, a Spec-Bench QA
  question and the transcript of the steps so far (``i % 4`` of them, observations from the
  bundled summarization articles), asking for the next step in the same format.

Qids are negative (``-1000 * category - i``) so they never collide with Spec-Bench's.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from functools import cache

from nightjar_worker.data import specbench_questions
from nightjar_worker.loadgen import Prompt

CATEGORIES = ("same-task", "code-edit", "agent-loop")
SAME_TASK_QIDS = (85, 137)  # a writing and an extraction question: long, structured answers
CODE_QID = 124  # the coding question whose prompt carries a Python function
AGENT_STEPS = 4

_EDITS = (
    "Rename the function to {name}.",
    "Rename the function to {name} and add a docstring.",
    "Rename the function to {name} and add type hints.",
    "Rename the function to {name} and rename dp to table.",
    "Rename the function to {name} and return 0 at once when either string is empty.",
    "Rename the function to {name} and add a comment above each loop.",
    "Rename the function to {name} and raise TypeError unless both inputs are strings.",
    "Rename the function to {name} and rename str1, str2 to a, b.",
)
_NAMES = ("lcs_length", "lcs_len", "common_subsequence_length", "lcs", "longest_common", "lcs_size")


@cache
def _questions() -> dict[int, dict]:
    return {q["question_id"]: q for q in specbench_questions()}


def _code() -> str:
    m = re.search(r"```\n(.*?)```", _questions()[CODE_QID]["prompt"], re.S)
    if m is None:
        raise ValueError(f"Spec-Bench question {CODE_QID} has no fenced code")
    return m.group(1).rstrip() + "\n"


def same_task(i: int) -> str:
    return _questions()[SAME_TASK_QIDS[(i // 3) % len(SAME_TASK_QIDS)]]["prompt"]


def code_edit(i: int) -> str:
    edit, name = next(itertools.islice(itertools.product(_EDITS, _NAMES), i % (len(_EDITS) * len(_NAMES)), None))
    return (f"Here is the file lcs.py:\n```python\n{_code()}```\n{edit.format(name=name)} "
            "Reply with the whole edited file in a Python code block and nothing else.")


def agent_loop(i: int) -> str:
    qs = [q for q in _questions().values() if q["category"] == "qa"]
    articles = [q["prompt"].removeprefix("Summarize: ") for q in _questions().values() if q["category"] == "summarization"]
    task, steps = qs[(i // AGENT_STEPS) % len(qs)]["prompt"], i % AGENT_STEPS
    lines = ["You are a research agent. Tools: search[query] returns a passage; lookup[term] finds the term in "
             "the last passage; finish[answer] ends the task. Answer in exactly this format:",
             "Thought: <one sentence>", "Action: <tool>[<argument>]", "", f"Task: {task}", ""]
    for k in range(steps):
        obs = articles[(i + k) % len(articles)].split(". ")[0]
        lines += [f"Thought: I need more facts to answer: {task}", f"Action: search[{task}]",
                  f"Observation: {obs}.", ""]
    lines.append("Write the next Thought and Action.")
    return "\n".join(lines)


_BUILDERS = {"same-task": same_task, "code-edit": code_edit, "agent-loop": agent_loop}


def repeated_task_prompts(n: int, categories: Sequence[str] = CATEGORIES, start: int = 0) -> list[Prompt]:
    """``n`` prompts per category (indices ``start`` .. ``start + n - 1``), categories interleaved."""
    for c in categories:
        if c not in _BUILDERS:
            raise ValueError(f"categories: unknown {c!r}; known: {', '.join(CATEGORIES)}")
    return [Prompt(-1000 * (CATEGORIES.index(c) + 1) - i, c, _BUILDERS[c](i))
            for i in range(start, start + n) for c in categories]
