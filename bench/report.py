"""Print the results table and write every number to a JSON file.

The table has one block per benchmark (columns: benchmark, ours, baseline,
ratio, goal, verdict) followed by that benchmark's footnotes; after it, a
summary (goal, measured, verdict) of the rows behind each DESIGN.md §8 goal
(:func:`print_goals`). The JSON file
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from bench.harness import Benchmark, Row, Section

__all__ = [
    "COLUMNS",
    "DEFAULT_JSON",
    "GOALS",
    "Outcome",
    "machine",
    "print_goals",
    "print_table",
    "write_json",
]

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


# -- the end summary: one block per DESIGN.md §8 goal -------------------------------------


@dataclass(frozen=True)
class Goal:
    """A DESIGN.md §8 goal: which rows of which benchmark judge it, and what they measured."""

    text: str
    benchmark: str
    pick: Callable[[Row], bool]
    measured: Callable[[Row], str]


def _judged(row: Row) -> bool:
    return row.verdict != "info"


def _ratio(row: Row) -> str:
    return row.ratio


def _ours(row: Row) -> str:
    return row.ours


def _ours_and_ratio(row: Row) -> str:
    return f"{row.ours} ({row.ratio})"


def _versus(row: Row) -> str:
    return f"{row.ours} vs {row.baseline} ({row.ratio})"


GOALS: tuple[Goal, ...] = (
    Goal(
        "session append round trip <= 1.5x a bare Pykka ask",
        "session.round_trip",
        _judged,
        _ratio,
    ),
    Goal(
        "pipelined appends to one in-memory session >= 100k events/s",
        "session.pipelined",
        _judged,
        _ours,
    ),
    Goal(
        "durable appends, SQLite file, acked after commit >= 20k events/s",
        "durable.appends",
        lambda r: _judged(r) and "store" in r.numbers,
        _ours,
    ),
    Goal(
        "durable appends >= 5x eventsourcing and the Agents SDK SQLiteSession",
        "durable.appends",
        lambda r: _judged(r) and "store" not in r.numbers,
        _ratio,
    ),
    Goal(
        "derive_messages after one append on a 100k-event log <= 1 ms",
        "core.append_derive",
        lambda r: _judged(r) and r.numbers.get("n") == 100_000,
        _ours,
    ),
    Goal(
        "... and flat as the log grows (<= 2x from the smallest size to the largest)",
        "core.append_derive",
        lambda r: _judged(r) and "growth" in r.numbers,
        _ours_and_ratio,
    ),
    Goal(
        "full fold, 100k events x 1k replaces >= 20x the O(n*r) reference",
        "core.fold",
        _judged,
        _ratio,
    ),
    Goal(
        "recovery of a 100k-event session from SQLite <= 1 s",
        "durable.recovery",
        _judged,
        _ours,
    ),
    Goal(
        "memory per stored small event: reported, vs a plain list of dicts",
        "core.memory",
        lambda r: True,
        _versus,
    ),
)
"""The §8 goals in DESIGN.md order; the summary lists, under each, the rows ``pick`` selects."""


def print_goals(
    outcomes: Sequence[Outcome], out: TextIO = sys.stdout, goals: Sequence[Goal] = GOALS
) -> dict[str, int]:
    """Print the end summary (goal | measured | verdict), one block per §8 goal.

    Under each goal, the rows that judge it, by their table title; a goal whose
    benchmark did not run says ``not run``. Returns the counts of its verdicts.
    """
    by_name = {o.benchmark.name: o for o in outcomes}
    lines: list[tuple[str, str, str]] = []
    counts = {"pass": 0, "fail": 0, "info": 0, "not run": 0}
    for g in goals:
        o = by_name.get(g.benchmark)
        if o is None:
            lines.append((g.text, f"- ({g.benchmark} not run)", "not run"))
            counts["not run"] += 1
            continue
        rows = [r for r in o.section.rows if g.pick(r)]
        lines.append((g.text, "", ""))
        if not rows:
            lines.append(("  (no row for this goal at these sizes)", "-", "not run"))
            counts["not run"] += 1
        for r in rows:
            lines.append((f"  {r.benchmark}", g.measured(r), r.verdict))
            counts[r.verdict] += 1
    header = ("goal (DESIGN.md §8)", "measured", "verdict")
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(3)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    print(file=out)
    print("summary: the DESIGN.md §8 goals", file=out)
    print(line(header), file=out)
    print(rule, file=out)
    for cells in lines:
        if cells[1:] == ("", ""):
            print(cells[0], file=out)  # a goal heading: no cells to align
        else:
            print(line(cells), file=out)
    print(rule, file=out)
    print(
        f"summary: {counts['pass']} pass, {counts['fail']} fail, {counts['info']} reported, "
        f"{counts['not run']} not run",
        file=out,
    )
    return counts


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
