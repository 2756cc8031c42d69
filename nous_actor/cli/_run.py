"""The commands that run something: ``demo`` (on a SQLite file or a PostgreSQL server),
``tour`` and ``bench``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

from nous_actor.cli._console import _emit, _err, _fail, _log_to_file, _out, _stdout_failed
from nous_actor.cli._stores import _is_dsn, _not_a_file
from nous_actor.store.sqlite.writelock import SUFFIX as WRITE_QUEUE_SUFFIX

if TYPE_CHECKING:
    from nous_actor.cli.agents_demo import DemoReport


def _demo_dsn(args: argparse.Namespace) -> str | None:
    """The server the demo runs on, or None for a SQLite file (``--db``)."""
    dsn: str | None = args.dsn or (args.db if _is_dsn(args.db) else None)
    if args.store == "sqlite" and dsn is not None:
        _fail("--store sqlite takes a file (--db FILE), not a DSN; or use --store postgres")
    if args.store == "postgres" and dsn is None:
        _fail(
            "--store postgres needs the server: --dsn postgresql://user@host/dbname "
            "(or --dsn 'host=HOST dbname=DB user=USER')"
        )
    return dsn


def cmd_demo(args: argparse.Namespace) -> int:
    from nous_actor.cli.agents_demo import check_demo_paths, run_demo

    dsn = _demo_dsn(args)
    if dsn is not None:
        return _demo_postgres(args, dsn)
    db = Path(args.db)
    why = _not_a_file(args.db)
    if why is not None:
        _fail(why)
    refusal = check_demo_paths(db, keep=args.keep, agents=args.agents)
    if refusal is not None:
        _fail(refusal)
    if not args.keep:
        for suffix in ("", "-wal", "-shm", WRITE_QUEUE_SUFFIX):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    return _run_demo(args, str(db), Path(f"{db}.log"), partial(run_demo, db))


def _demo_postgres(args: argparse.Namespace, dsn: str) -> int:
    """The demo on a PostgreSQL server, in a schema of its own (``--schema``)."""
    try:
        from nous_actor.cli.agents_demo import (
            check_demo_log,
            check_demo_schema,
            run_demo_postgres,
        )
        from nous_actor.store.postgres import PostgresStore
    except ImportError as exc:  # says which extra to install
        _fail(str(exc))
    where = PostgresStore.describe(dsn, args.schema)  # refuses a malformed DSN, connects not
    log_path = Path(f"nous-demo-{args.schema}.log")
    refusal = check_demo_schema(dsn, args.schema, keep=args.keep) or check_demo_log(
        log_path, "pass another --schema"
    )
    if refusal is not None:
        _fail(refusal)
    run = partial(run_demo_postgres, dsn, schema=args.schema, keep=args.keep)
    return _run_demo(args, where, log_path, run)


def _run_demo(
    args: argparse.Namespace, where: str, log_path: Path, run: Callable[..., DemoReport]
) -> int:
    """The demo on either store, once it may run there: the runtime's events logged to
    ``log_path``, a header naming ``where``, ``run`` with the command's options, the report
    (exit status 1 if anything acknowledged was not found in the store)."""
    from nous_actor.cli.agents_demo import format_report

    _log_to_file(log_path)
    header = (
        f"nous-actor demo: {args.agents} agents x {args.turns} turns, crash rate "
        f"{args.crash_rate:g}, on {where} (events of the runtime logged to {log_path})"
    )
    if args.json:
        _err(header)
    else:
        _out(header + "\n")
    report = run(
        agents=args.agents,
        turns=args.turns,
        crash_rate=args.crash_rate,
        seed=args.seed,
        progress=None if args.json else sys.stderr,
    )
    payload = {**report.__dict__, "events_per_second": report.events_per_second, "ok": report.ok}
    _emit(args, payload, format_report(report, where))
    return 0 if report.ok else 1


def cmd_tour(args: argparse.Namespace) -> int:
    from nous_actor.cli import tour as demo

    try:
        status = demo.main([])
    except OSError as exc:  # it writes nothing but standard output
        _stdout_failed(exc)
    _out("")  # flush: a write error is the command's failure
    return status


# Runs the suite as ``python -m bench`` would; a package it needs that is missing ends it
# with one line naming the package and the extra (status 2), never a traceback.
_BENCH: Final = """
import runpy, sys
try:
    runpy.run_module("bench", run_name="__main__", alter_sys=True)
except ImportError as exc:
    missing = exc.name or "a package"
    sys.stderr.write(
        f"nous-actor: the benchmark suite needs {missing}, which it cannot import ({exc}); "
        "install the bench extra in this environment: pip install -e '.[bench]' "
        "(from the checkout), or run 'make bench' there\\n"
    )
    sys.exit(2)
"""


def cmd_bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[2]  # the checkout: nous_actor/cli/ is two down
    if not (root / "bench" / "__main__.py").is_file():
        _fail("the benchmark suite ships with the source tree: run 'make bench' in a checkout")
    cmd = [sys.executable, "-c", _BENCH, *[a for a in args.bench_args if a != "--"]]
    return subprocess.call(cmd, cwd=root)
