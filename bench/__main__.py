"""Entry point: ``python -m bench [--quick] [--only NAME] [--json PATH]`` (``make bench``).

Runs the registered benchmarks one after the other, prints progress on
stderr, then the results table and the summary of the DESIGN.md §8 goals on
stdout (the same text also in a ``.txt`` beside the JSON file), writes every
number to the JSON file and draws the figures (:mod:`bench.plot`, needs
matplotlib: ``goals.png``, ``scaling.png``) next to it: ``bench/results/`` for a
full run of every benchmark, ``bench/results/partial/`` for a quick run or one of
some benchmarks only (``--json`` chooses). The cyclic GC stays on in every timed
section.
"""

from __future__ import annotations

import argparse
import gc
import io
import logging
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import structlog

from bench import (
    adk,
    cluster,
    core,
    durable,
    flood,
    langgraph,
    lifetime,
    location,
    plot,
    postgres,
    processes,
    runtime,
    schema,
    session,
    simulation,
    telemetry,
    vacuum,
    viewer,
)
from bench.harness import Benchmark, Config, progress
from bench.report import DEFAULT_JSON, PARTIAL_JSON, Outcome, print_goals, print_table, write_json

MODULES: Final[tuple[ModuleType, ...]] = (
    core,
    session,
    durable,
    runtime,
    telemetry,
    lifetime,
    postgres,
    processes,
    cluster,
    adk,
    langgraph,
    simulation,
    vacuum,
    viewer,
    flood,
    location,
    schema,
)
"""Benchmark modules, in run order; each exposes ``BENCHMARKS``. Add new modules here."""


def registered() -> list[Benchmark]:
    """Every benchmark of every module in :data:`MODULES`, in run order."""
    found: list[Benchmark] = []
    for module in MODULES:
        found.extend(module.BENCHMARKS)
    return found


def select(benchmarks: Sequence[Benchmark], only: Sequence[str]) -> list[Benchmark]:
    """The benchmarks named in ``only`` (full ``core.fold``, short ``fold``, or a whole
    module ``core``), else all.

    Raises:
        SystemExit: a name matches nothing; the message lists the valid names.
    """
    if not only:
        return list(benchmarks)
    wanted = {n for item in only for n in item.split(",") if n}
    chosen = [b for b in benchmarks if {b.name, b.short, b.module} & wanted]
    unknown = wanted - {n for b in chosen for n in (b.name, b.short, b.module)}
    if unknown:
        names = ", ".join(b.name for b in benchmarks)
        raise SystemExit(f"bench: unknown benchmark(s) {', '.join(sorted(unknown))}; use {names}")
    return chosen


def draw(doc: dict[str, Any], folder: Path) -> str:
    """Draw the figures of ``doc`` into ``folder``; a line saying where (or why not)."""
    try:
        written = plot.draw_all(doc, folder)
    except ImportError as exc:
        return f"plot: not drawn ({exc}); install the bench extra: pip install -e '.[bench]'"
    if not written:
        return "plot: none (no goal row, sweep or long session in this run)"
    return "plot: " + ", ".join(str(p) for p in written)


def _route_library_logs() -> None:
    """The bench is an application: the library's events go to stderr (warnings and up),
    never into the table on stdout (structlog's own defaults print to stdout)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[structlog.stdlib.add_log_level, structlog.processors.KeyValueRenderer()],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def results_path(*, quick: bool, whole: bool) -> Path:
    """Where a run writes unless ``--json`` says: a full run of every benchmark
    (``whole``) replaces the suite's results; a quick or partial one never does."""
    return DEFAULT_JSON if whole and not quick else PARTIAL_JSON


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print, write; always 0 (a failed goal is a result to read, not a crash)."""
    _route_library_logs()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes: a smoke run in well under a minute"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this benchmark or module (repeatable or comma-separated); see --list",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"where to write all numbers (default: {DEFAULT_JSON} for a full run of "
        f"every benchmark, else {PARTIAL_JSON})",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)

    benchmarks = registered()
    if args.list:
        for b in benchmarks:
            print(f"{b.name:24} {b.title}")
        return 0
    chosen = select(benchmarks, args.only)
    if args.json is None:
        args.json = results_path(quick=args.quick, whole=len(chosen) == len(benchmarks))
    config = Config(quick=args.quick)
    started = datetime.now(UTC)
    t_start = time.perf_counter()
    loadavg = os.getloadavg() if hasattr(os, "getloadavg") else None
    outcomes: list[Outcome] = []
    for i, b in enumerate(chosen, start=1):
        size = "quick" if config.quick else "full"
        progress(f"[{i}/{len(chosen)}] {b.name}: {b.title}: start ({size})")
        if config.quick:
            # A smoke run: what earlier sections left (above all every peer's imports,
            # about 200k objects by the end) is moved out of the collector's sight, so
            # that the collections between runs do not scan it again (0.1-0.3 s each:
            # most of a smoke run's time). A full run never does this: its timed code
            # runs beside a heap such as a user's process has.
            gc.freeze()
        t0 = time.perf_counter()
        section = b.run(config)
        outcomes.append(Outcome(b, section, time.perf_counter() - t0))
        progress(f"{b.name}: done in {outcomes[-1].seconds:.1f} s")
    text = io.StringIO()
    print_table(outcomes, out=text, loadavg=loadavg)
    print_goals(outcomes, out=text)
    print(text.getvalue(), end="")
    doc = write_json(
        args.json,
        outcomes,
        quick=config.quick,
        started=started,
        # As typed (``python -m bench ...``), never the machine's path of this file.
        argv=["python -m bench", *(sys.argv[1:] if argv is None else argv)],
        loadavg_before=loadavg,
    )
    table = args.json.with_suffix(".txt")
    table.write_text(text.getvalue(), encoding="utf-8")
    progress(f"wrote {args.json} and {table}")
    progress("drawing the figures")
    print(draw(doc, args.json.parent))
    print(f"results: {args.json}; total run time {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
