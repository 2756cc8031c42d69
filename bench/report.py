"""Print the results table and write every number to a JSON file.

The table has one block per benchmark (columns: benchmark, ours, baseline,
ratio, goal, verdict) followed by that benchmark's footnotes. The JSON file
(``bench/results/latest.json`` unless ``--json`` says otherwise; the folder is
git-ignored) holds the same rows plus the raw figures behind them and a
description of the machine and run.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from bench.harness import Benchmark, Row, Section

__all__ = ["COLUMNS", "DEFAULT_JSON", "Outcome", "machine", "print_table", "write_json"]

COLUMNS = ("benchmark", "ours", "baseline", "ratio", "goal", "verdict")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


@dataclass(frozen=True)
class Outcome:
    """A benchmark together with what it returned and how long it took (wall seconds)."""

    benchmark: Benchmark
    section: Section
    seconds: float


def _cells(row: Row) -> tuple[str, ...]:
    return (row.benchmark, row.ours, row.baseline, row.ratio, row.goal, row.verdict)


def print_table(
    outcomes: Sequence[Outcome],
    out: TextIO = sys.stdout,
    loadavg: Sequence[float] | None = None,
) -> None:
    """Print one table for all ``outcomes``, a titled block each, footnotes underneath.

    ``loadavg`` (as before the run) adds a line on how busy the machine was.
    """
    rows = [_cells(r) for o in outcomes for r in o.section.rows]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    print(line(COLUMNS), file=out)
    print(rule, file=out)
    for o in outcomes:
        print(f"== {o.benchmark.name}: {o.benchmark.title} ({o.seconds:.1f} s)", file=out)
        for r in o.section.rows:
            print(line(_cells(r)), file=out)
        for k, note in enumerate(o.section.notes, start=1):
            print(f"   [{k}] {note}", file=out)
        print(rule, file=out)
    counts = _verdict_counts(outcomes)
    print(
        f"verdicts: {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['info']} info (context, no goal)",
        file=out,
    )
    if loadavg is not None:
        print(
            f"machine: {os.cpu_count()} CPUs, load average {loadavg[0]:.2f} before the run, "
            f"{os.getloadavg()[0]:.2f} after (shared machine: trust ratios, not absolutes)",
            file=out,
        )


def _verdict_counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "info": 0}
    for o in outcomes:
        for r in o.section.rows:
            counts[r.verdict] += 1
    return counts


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def machine() -> dict[str, Any]:
    """What the numbers were measured on (load average included: the machine is shared)."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_commit": _git("rev-parse", "HEAD") or None,
        # Uncommitted changes to the library mean the numbers are of the working tree.
        "library_dirty": bool(_git("status", "--porcelain", "--", "nous_actor")),
    }


def write_json(
    path: Path,
    outcomes: Sequence[Outcome],
    *,
    quick: bool,
    started: datetime,
    argv: list[str],
    loadavg_before: Sequence[float] | None = None,
) -> None:
    """Write the run description and every benchmark's rows, notes and raw data to ``path``."""
    doc: dict[str, Any] = {
        "meta": {
            **machine(),
            "quick": quick,
            "argv": argv,
            "loadavg_before": None if loadavg_before is None else list(loadavg_before),
            "started": started.isoformat(timespec="seconds"),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        },
        "summary": _verdict_counts(outcomes),
        "benchmarks": {
            o.benchmark.name: {
                "title": o.benchmark.title,
                "seconds": round(o.seconds, 3),
                "rows": [asdict(r) for r in o.section.rows],
                "notes": o.section.notes,
                "data": o.section.data,
            }
            for o in outcomes
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)
