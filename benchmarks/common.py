"""Helpers shared by the benchmarks: quick mode, result folders, markdown tables, PNG plots, and
the final ``RESULT key=value ...`` line (always the last line a benchmark prints).

Every benchmark writes under ``build/results/<name>/`` (ignored by git: step logs, raw runs); what
the tree keeps, each benchmark's summary table and figure, is copied to ``benchmarks/results/`` by
``make publish-results NAME=<name>`` (``benchmarks/publish.py``)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_ROOT = REPO_ROOT / "build" / "results"  # where the benchmarks write
PUBLISHED_ROOT = REPO_ROOT / "benchmarks" / "results"  # what the tree keeps (benchmarks/publish.py)


def is_quick() -> bool:
    """``QUICK=1`` (make passes it through) selects the short version of a benchmark."""
    return os.environ.get("QUICK", "0").strip().lower() not in ("", "0", "false", "no")


def results_dir(name: str) -> Path:
    """``build/results/<name>/``, created if needed."""
    d = RESULTS_ROOT / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def fmt(v: Any, digits: int = 4) -> str:
    """Compact number formatting for tables and RESULT lines (4 significant digits)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == 0:
            return "0"
        mag = math.floor(math.log10(abs(v)))
        if -4 <= mag < 6:
            return f"{v:.{max(digits - 1 - mag, 0)}f}"
        return f"{v:.{digits - 1}e}"
    return str(v)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) if not isinstance(c, str) else c for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def print_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    path: str | Path | None = None,
    notes: str | None = None,
) -> str:
    """Print a titled markdown table and, with ``path``, write it there (a .md file)."""
    text = f"### {title}\n\n{markdown_table(headers, rows)}\n"
    if notes:
        text += f"\n{notes}\n"
    print(text, flush=True)
    if path is not None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return text


def save_plot(
    path: str | Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    logy: bool = False,
) -> Path | None:
    """Line plot of ``{label: (xs, ys)}`` saved as PNG (headless). Returns the path, or None when
    matplotlib is missing (the benchmark still prints its tables)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(matplotlib missing: plot {path} skipped)")
        return None
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, label=label)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def write_json(path: str | Path, obj: Any) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj, indent=1, default=str) + "\n", encoding="utf-8")


def result_line(**kv: Any) -> str:
    """``RESULT k1=v1 k2=v2`` with compact numbers, in the given order."""
    return "RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in kv.items())


def print_result(**kv: Any) -> str:
    line = result_line(**kv)
    print(line, flush=True)
    return line
