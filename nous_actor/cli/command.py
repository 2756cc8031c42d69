"""The ``nous-actor`` command: the demo, and a look inside a session store.

argparse (stdlib) on purpose: the runtime depends on pykka and structlog
only, and these commands need nothing more than subcommands and flags.

Exit status: 0 on success, 1 when the command failed (a missing session, a
conflict, a failed check, a closed standard stream), 2 for bad usage. An
error is one line on stderr (when stderr is open), never a traceback; the
library's own log records of a failed command are not shown beside it.

This module parses the arguments and runs a command (`main`); the rest of the
package, each module importing only those above it: ``_console`` (failing, the
standard streams, output, logging), ``_stores`` (opening the store a command
names), then the commands: ``_run`` (demo, tour, bench), ``_reading``
(sessions, show, export, audit, langgraph, serve) and ``_writing`` (import, fork,
snapshot).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Final

from nous_actor._version import __version__
from nous_actor.cli._console import _closed_standard_fds as _closed_standard_fds
from nous_actor.cli._console import _configure_logging, _err, _fail, _Failure, _Held, _PipeClosed
from nous_actor.cli._reading import cmd_audit as cmd_audit
from nous_actor.cli._reading import cmd_export as cmd_export
from nous_actor.cli._reading import cmd_langgraph as cmd_langgraph
from nous_actor.cli._reading import cmd_serve as cmd_serve
from nous_actor.cli._reading import cmd_sessions as cmd_sessions
from nous_actor.cli._reading import cmd_show as cmd_show
from nous_actor.cli._run import cmd_bench as cmd_bench
from nous_actor.cli._run import cmd_demo as cmd_demo
from nous_actor.cli._run import cmd_tour as cmd_tour
from nous_actor.cli._stores import DEFAULT_SCHEMA as DEFAULT_SCHEMA
from nous_actor.cli._stores import DEMO_SCHEMA as DEMO_SCHEMA
from nous_actor.cli._stores import LIBPQ_KEYWORDS as LIBPQ_KEYWORDS
from nous_actor.cli._stores import _is_dsn as _is_dsn
from nous_actor.cli._writing import cmd_fork as cmd_fork
from nous_actor.cli._writing import cmd_import as cmd_import
from nous_actor.cli._writing import cmd_snapshot as cmd_snapshot
from nous_actor.core.codec import CodecError
from nous_actor.errors import NousActorError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nous-actor",
        description="Supervised, durable agent-session logs: the demo and a look inside a store.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, json_flag: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        if json_flag:
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    d = add("demo", "run the supervised multi-agent demo on a SQLite file or a PostgreSQL server")
    d.add_argument(
        "--db",
        default="nous-demo.db",
        help="database file (default: nous-demo.db); only a database an earlier demo made "
        "is replaced; a PostgreSQL DSN here (postgresql://... or 'host=... dbname=...') is "
        "the same as --dsn",
    )
    d.add_argument(
        "--store",
        choices=["sqlite", "postgres"],
        help="where the sessions live (default: sqlite, or postgres with --dsn)",
    )
    d.add_argument(
        "--dsn",
        help="the PostgreSQL server for --store postgres: a URI, e.g. "
        "postgresql://user@host/db, or libpq key/value pairs, e.g. 'host=/run/postgresql "
        "dbname=agents'",
    )
    d.add_argument(
        "--schema",
        default=DEMO_SCHEMA,
        help=f"the schema on the server (default {DEMO_SCHEMA}); only a schema an earlier "
        "demo made is replaced",
    )
    d.add_argument("--agents", type=_positive, default=8, help="concurrent agents (default 8)")
    d.add_argument("--turns", type=_positive, default=12, help="turns per agent (default 12)")
    d.add_argument("--crash-rate", type=_rate, default=0.02, help="crash chance per append (0.02)")
    d.add_argument("--seed", type=_seed, default=7, help="random seed (default 7)")
    d.add_argument(
        "--keep",
        action="store_true",
        help="add to an existing nous_actor store (default: replace the demo's database)",
    )
    d.set_defaults(func=cmd_demo)

    add("tour", "a printed walkthrough of the pure core", json_flag=False).set_defaults(
        func=cmd_tour
    )

    s = add("sessions", "list the sessions in a database")
    _db_argument(s)
    s.set_defaults(func=cmd_sessions)

    sh = add("show", "show a session: its messages (default) or events")
    _db_argument(sh)
    sh.add_argument("session_id")
    g = sh.add_mutually_exclusive_group()
    g.add_argument("--surface", action="store_true", help="the model-visible messages (default)")
    g.add_argument("--events", action="store_true", help="every retained event")
    g.add_argument("--since", type=_seq, metavar="N", help="retained events with seq >= N")
    sh.add_argument("--as-of", type=_seq, metavar="SEQ", help="as the session was right after SEQ")
    sh.set_defaults(func=cmd_show)

    e = add("export", "write a session as JSON Lines to standard output", json_flag=False)
    _db_argument(e)
    e.add_argument("session_id")
    e.set_defaults(func=cmd_export)

    i = add("import", "read a session (JSON Lines, or a v1 JSON message list) from standard input")
    _db_argument(i)
    i.add_argument("session_id")
    i.set_defaults(func=cmd_import)

    f = add("fork", "copy a session's prefix into a new session")
    _db_argument(f)
    f.add_argument("session_id")
    f.add_argument("new_id")
    f.add_argument("--through", type=_seq, required=True, metavar="SEQ", help="last seq to keep")
    f.set_defaults(func=cmd_fork)

    sn = add("snapshot", "drop a session's shadowed events")
    _db_argument(sn)
    sn.add_argument("session_id")
    sn.set_defaults(func=cmd_snapshot)

    a = add("audit", "explain one event: what shadows it, what it replaced; the compactions")
    _db_argument(a)
    a.add_argument("session_id")
    a.add_argument("seq", type=_seq)
    a.set_defaults(func=cmd_audit)

    lg = add("langgraph", "show a LangGraph thread: its checkpoints as a tree, and messages")
    _db_argument(lg)
    lg.add_argument("thread", help="the thread id (or its session id, langgraph/...)")
    lg.add_argument(
        "--checkpoint",
        metavar="ID",
        help="whose messages to show (default: the head, the latest LangGraph still sees)",
    )
    lg.add_argument(
        "--ns", default="", help="the checkpoint namespace (a subgraph's; default the graph's)"
    )
    lg.add_argument("--channel", default="messages", help="the channel (default messages)")
    lg.set_defaults(func=cmd_langgraph)

    v = add("serve", "a local, read-only web page of the store's sessions", json_flag=False)
    _db_argument(v)
    v.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)"
    )
    v.add_argument("--port", type=_port, default=8470, help="the port (default 8470)")
    v.set_defaults(func=cmd_serve)

    b = add("bench", "run the benchmark suite (from a source checkout)", json_flag=False)
    b.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="passed to the suite, e.g. --quick"
    )
    b.set_defaults(func=cmd_bench)
    return p


def _db_argument(sp: argparse.ArgumentParser) -> None:
    """The store a command reads: a SQLite file, or a PostgreSQL DSN and its schema."""
    sp.add_argument(
        "db",
        metavar="FILE|DSN",
        help="a SQLite file, or a PostgreSQL DSN: postgresql://user@host/dbname, or "
        "libpq key/value pairs such as 'host=/run/postgresql dbname=agents' (a file "
        "whose name reads as such pairs: ./host=...)",
    )
    sp.add_argument(
        "--schema",
        default=DEFAULT_SCHEMA,
        help=f"with a DSN: the schema holding the store (default {DEFAULT_SCHEMA})",
    )


_STORABLE: Final = 2**63 - 1
"""The largest whole number SQLite stores (a 64-bit signed INTEGER): a count, a seq or a
seed past it cannot be stored or compared there, so it is bad usage, not a failure."""


def _storable(n: int) -> int:
    """``n``, if SQLite can store it (`_STORABLE`, either sign)."""
    if n > _STORABLE:
        raise argparse.ArgumentTypeError(
            f"expected a number SQLite can store (at most {_STORABLE}), got {n}"
        )
    if n < -_STORABLE - 1:
        raise argparse.ArgumentTypeError(
            f"expected a number SQLite can store (at least {-_STORABLE - 1}), got {n}"
        )
    return n


def _seed(text: str) -> int:
    """A whole number SQLite can store (``--seed``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return _storable(n)


def _positive(text: str) -> int:
    """`_seed`, and at least 1 (counts: ``--turns``, ``--agents``)."""
    n = _seed(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < n < 65536:
        raise argparse.ArgumentTypeError(f"a port is from 1 to 65535, got {n}")
    return n


def _seq(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a seq (a whole number >= 0), got {text!r}"
        ) from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"a seq is >= 0, got {n}")
    return _storable(n)


def _rate(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability, got {text!r}") from None
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"expected 0 <= rate < 1, got {x}")
    return x


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status."""
    closed = _closed_standard_fds()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # everything after it belongs to the benchmark suite
        argv = ["bench", "--", *argv[1:]] if len(argv) > 1 and argv[1] != "--" else argv
    args = _parser().parse_args(argv)
    args.closed_fds = closed
    held = _Held()
    _configure_logging(held, logging.WARNING, stamped=False)
    try:
        if 1 in closed:
            _fail(
                "standard output is closed; redirect it to a file or /dev/null "
                "instead of closing it"
            )
        status = int(args.func(args))
    except _Failure as exc:
        _err(f"nous-actor: {exc}")
        return 1
    except _PipeClosed:  # the reader went away (e.g. `| head`): not an error
        return 0
    except (NousActorError, CodecError, ValueError, OSError) as exc:
        _err(f"nous-actor: {type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        _err("nous-actor: interrupted")
        return 130
    held.show()
    return status


if __name__ == "__main__":
    sys.exit(main())
