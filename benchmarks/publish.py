"""``make publish-results NAME=<name>``: keep a benchmark run in the tree.

Every benchmark writes under ``build/results/<name>/`` (ignored by git). This copies what
docs/results.md shows into ``benchmarks/results/<name>/``, then regenerates docs/results.md:

* tables (``*.md``);
* figures (``*.png``), re-encoded with a 32-colour palette (a plot needs no more; 4x smaller);
* ``results.json`` as ``summary.json``: the meta, ratios, per-phase results and mean gammas the
  generated tables read, without timelines, step statistics, request texts and error logs;
* other JSON under 16 KB (profiles, ratios).

Step logs, request records, timelines and server logs stay in ``build/``: the command that made
them makes them again. ``NAME`` is a folder under ``build/results`` (``dynamic-qwen``,
``planner/quick``; ``.`` for the files at its top); only the files directly in it are copied.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks import readme_results
from benchmarks.common import PUBLISHED_ROOT, RESULTS_ROOT

SMALL_JSON = 16 * 1024
PALETTE = 32
_SUMMARY_KEYS = ("meta", "ratios", "results", "steps")
_DROPPED_FIELDS = ("extra", "error_messages")  # per-phase detail no table reads


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """What docs/results.md reads of a ``results.json``."""
    out = {k: results[k] for k in _SUMMARY_KEYS if k in results}
    if isinstance(out.get("steps"), dict):  # the step log's summary: the tables show the mean gamma
        out["steps"] = {pol: {ph: {"mean_gamma": row.get("mean_gamma")} for ph, row in per.items()}
                        for pol, per in out["steps"].items()}
    if isinstance(out.get("results"), dict):
        out["results"] = {
            pol: {ph: {k: v for k, v in row.items() if k not in _DROPPED_FIELDS} if isinstance(row, dict) else row
                  for ph, row in per.items()} if isinstance(per, dict) else per
            for pol, per in out["results"].items()
        }
    return out


def shrink_png(src: Path, dst: Path) -> None:
    from PIL import Image

    with Image.open(src) as im:
        q = im.convert("RGB").quantize(colors=PALETTE, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        q.save(dst, "PNG", optimize=True)


def publish(name: str, src_root: Path = RESULTS_ROOT, dst_root: Path = PUBLISHED_ROOT,
            tables_only: bool = False) -> list[Path]:
    """Copy run ``name``'s kept files from ``src_root`` to ``dst_root``; returns what was written.
    ``tables_only``: a run kept for the record (an earlier or QUICK run beside a full one), which no
    figure or generated table shows."""
    src, dst = src_root / name, dst_root / name
    if not src.is_dir():
        raise SystemExit(f"NAME: {src} is not a folder (run the benchmark first)")
    dst.mkdir(parents=True, exist_ok=True)
    wrote = []
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        if f.suffix == ".md":
            shutil.copyfile(f, dst / f.name)
        elif tables_only:
            continue
        elif f.suffix == ".png":
            shrink_png(f, dst / f.name)
        elif f.name == "results.json" and "meta" in (d := json.loads(f.read_text())):
            (dst / "summary.json").write_text(json.dumps(summary(d), separators=(",", ":")) + "\n")
            wrote.append(dst / "summary.json")
            continue
        elif f.suffix == ".json" and f.stat().st_size <= SMALL_JSON:
            shutil.copyfile(f, dst / f.name)
        else:
            continue
        wrote.append(dst / f.name)
    return wrote


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="+", help="folders under build/results")
    ap.add_argument("--tables-only", action="store_true", help="tables only: a run kept for the record")
    args = ap.parse_args(argv)
    for name in args.names:
        for p in publish(name, tables_only=args.tables_only):
            print(f"kept {p.relative_to(PUBLISHED_ROOT.parent.parent)} ({p.stat().st_size / 1024:.0f} KB)")
    return readme_results.main([])


if __name__ == "__main__":
    sys.exit(main())
