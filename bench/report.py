"""Print the results table and the goals summary, and write every number to a JSON file.

The table has one block per benchmark (columns: goal id, what, ours,
baseline, ratio, goal, verdict) followed by that benchmark's footnotes,
wrapped for a terminal. After it, :func:`print_goals` lists each DESIGN.md §8
goal of :data:`bench.harness.GOALS` with its rows and one verdict: PASS when
every row judging it passes, FAIL when one fails, NOT RUN when none ran. The
JSON file (``bench/results/latest.json`` for a full run of every benchmark,
``bench/results/partial/latest.json`` for a quick or partial one, unless ``--json``
says otherwise) holds the same rows, the per-goal verdicts, the raw figures behind them and a
description of the machine and run.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

from bench import harness as h

__all__ = [
    "COLUMNS",
    "DEFAULT_JSON",
    "PARTIAL_JSON",
    "Outcome",
    "goal_verdicts",
    "machine",
    "print_goals",
    "print_table",
    "write_json",
]

COLUMNS: Final = ("id", "what", "ours", "baseline", "ratio", "goal", "verdict")
DEFAULT_JSON: Final = Path(__file__).resolve().parent / "results" / "latest.json"
PARTIAL_JSON: Final = Path(__file__).resolve().parent / "results" / "partial" / "latest.json"
"""Where a quick run, or one of some benchmarks only (``--only``), writes unless told: never
over the whole suite's results (`DEFAULT_JSON`, its table and figures)."""
WIDTHS: Final = (3, 44, 24, 26, 17, 15, 7)
"""Column widths (characters); a longer cell is wrapped within its column."""
NOTE_WIDTH: Final = 118


@dataclass(frozen=True)
class Outcome:
    """A benchmark together with what it returned and how long it took (wall seconds)."""

    benchmark: h.Benchmark
    section: h.Section
    seconds: float


def _verdict_text(v: str) -> str:
    return {"pass": "PASS", "fail": "FAIL", "info": "info"}.get(v, v)


def _cells(row: h.Row) -> tuple[str, ...]:
    return (
        row.goal_id or "-",
        row.benchmark,
        row.ours,
        row.baseline,
        row.ratio,
        row.goal,
        _verdict_text(row.verdict),
    )


def _lines(cells: Sequence[str], widths: Sequence[int]) -> list[str]:
    """One table row, each cell wrapped within its column width."""
    wrapped = [textwrap.wrap(c, w) or [""] for c, w in zip(cells, widths, strict=True)]
    height = max(len(x) for x in wrapped)
    out = []
    for i in range(height):
        parts = [
            (x[i] if i < len(x) else "").ljust(w) for x, w in zip(wrapped, widths, strict=True)
        ]
        out.append(" | ".join(parts).rstrip())
    return out


def _widths(outcomes: Sequence[Outcome]) -> list[int]:
    rows = [_cells(r) for o in outcomes for r in o.section.rows]
    return [
        min(cap, max([len(name)] + [len(r[i]) for r in rows]))
        for i, (name, cap) in enumerate(zip(COLUMNS, WIDTHS, strict=True))
    ]


def print_table(
    outcomes: Sequence[Outcome],
    out: TextIO = sys.stdout,
    loadavg: Sequence[float] | None = None,
) -> None:
    """Print one table for all ``outcomes``, a titled block each, footnotes underneath.

    ``loadavg`` (as before the run) adds a line on how busy the machine was.
    """
    widths = _widths(outcomes)
    rule = "-+-".join("-" * w for w in widths)
    for line in _lines(COLUMNS, widths):
        print(line, file=out)
    print(rule, file=out)
    for o in outcomes:
        print(f"== {o.benchmark.name}: {o.benchmark.title} ({o.seconds:.1f} s)", file=out)
        for r in o.section.rows:
            for line in _lines(_cells(r), widths):
                print(line, file=out)
        for k, note in enumerate(o.section.notes, start=1):
            text = textwrap.fill(
                note, NOTE_WIDTH, initial_indent=f"   [{k}] ", subsequent_indent="       "
            )
            print(text, file=out)
        print(rule, file=out)
    counts = _verdict_counts(outcomes)
    print(
        f"rows: {counts['pass']} PASS, {counts['fail']} FAIL, "
        f"{counts['info']} info (context, no goal)",
        file=out,
    )
    if loadavg is not None:
        print(
            f"machine: {os.cpu_count()} CPUs, load average {loadavg[0]:.2f} before the run, "
            f"{os.getloadavg()[0]:.2f} after (shared machine: trust ratios, not absolutes)",
            file=out,
        )


def goal_verdicts(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Per goal id of :data:`~bench.harness.GOALS`: its text, its rows, one verdict.

    The verdict is ``pass`` when every row judging the goal passes, ``fail``
    when one fails, ``not run`` when none ran.
    """
    out: dict[str, dict[str, Any]] = {}
    rows = [(o.benchmark.name, r) for o in outcomes for r in o.section.rows]
    for gid, text in h.GOALS.items():
        mine = [(b, r) for b, r in rows if r.goal_id == gid]
        verdicts = {r.verdict for _, r in mine}
        verdict = "not run" if not mine else ("fail" if "fail" in verdicts else "pass")
        out[gid] = {
            "text": text,
            "verdict": verdict,
            "rows": [
                {"benchmark": b, "what": r.benchmark, "verdict": r.verdict, "value": r.value}
                for b, r in mine
            ],
        }
    return out


def print_goals(outcomes: Sequence[Outcome], out: TextIO = sys.stdout) -> dict[str, int]:
    """Print the end summary, one block per goal: its rows (figure vs goal), its verdict.

    Returns the counts of the goals' verdicts.
    """
    goals = goal_verdicts(outcomes)
    rows = {(r.goal_id, r.benchmark): r for o in outcomes for r in o.section.rows if r.goal_id}
    counts = {"pass": 0, "fail": 0, "not run": 0}
    print(file=out)
    print("summary: the DESIGN.md §8 goals (GC on in every timed section)", file=out)
    for gid, g in goals.items():
        counts[g["verdict"]] += 1
        head = f"{gid:>3} {g['verdict'].upper():7} "
        print(textwrap.fill(g["text"], NOTE_WIDTH, initial_indent=head,
                            subsequent_indent=" " * len(head)), file=out)  # fmt: skip
        for item in g["rows"]:
            r = rows[(gid, item["what"])]
            figure = _value(r.value, r.unit)
            target = f"{r.sense} {_value(r.target, r.unit)}"
            print(
                f"            {_verdict_text(r.verdict):4}  {figure:>12} vs {target:<14} "
                f"{r.benchmark}",
                file=out,
            )
    print(
        f"summary: {counts['pass']} goals PASS, {counts['fail']} FAIL, "
        f"{counts['not run']} not run",
        file=out,
    )
    return counts


def _value(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "ev/s":
        return h.fmt_rate(x)
    return f"{x:.3g}{unit}" if unit == "x" else f"{x:.3g} {unit}"


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
        "gc_enabled_in_timed_sections": True,
    }


def write_json(
    path: Path,
    outcomes: Sequence[Outcome],
    *,
    quick: bool,
    started: datetime,
    argv: list[str],
    loadavg_before: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Write the run description, the goals and every benchmark's rows, notes and raw data."""
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
        "goals": goal_verdicts(outcomes),
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
    return doc
