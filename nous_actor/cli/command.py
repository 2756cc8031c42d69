"""The ``nous-actor`` command: the demo, and a look inside a session store.

argparse (stdlib) on purpose: the runtime depends on pykka and structlog
only, and these commands need nothing more than subcommands and flags.

Exit status: 0 on success, 1 when the command failed (a missing session, a
conflict, a failed check, a closed standard stream), 2 for bad usage. An
error is one line on stderr (when stderr is open), never a traceback; the
library's own log records of a failed command are not shown beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import structlog

from nous_actor._version import __version__
from nous_actor.core import history
from nous_actor.core.codec import CodecError, event_to_dict, loads, message_to_dict
from nous_actor.core.event import Event
from nous_actor.core.ids import check_session_id
from nous_actor.core.log import Log
from nous_actor.core.message import tool_call_parts
from nous_actor.errors import NousActorError, StoreError
from nous_actor.store import SessionInfo, Store, export_session, import_session, list_sessions
from nous_actor.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from nous_actor.sessions.handle import Session

__all__ = ["main"]

T = TypeVar("T")

_LISTED = 10  # sessions named in a "no session" error


class _Failure(Exception):
    """A command failed in a way the user can act on (exit status 1)."""


class _PipeClosed(Exception):
    """The reader of standard output went away (e.g. ``| head``): stop quietly."""


def _fail(message: str) -> NoReturn:
    raise _Failure(message)


# -- standard streams ------------------------------------------------------------------


def _closed_standard_fds() -> frozenset[int]:
    """The standard fds that are closed (``<&-``, ``>&-``), each reopened on /dev/null.

    Reopening keeps a file the command opens later (a database, a log) from
    landing on fd 0, 1 or 2, where a stray write would corrupt it.
    """
    streams = (sys.stdin, sys.stdout, sys.stderr)
    closed = set()
    for fd, stream in enumerate(streams):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        else:
            if stream is None:
                closed.add(fd)
    return frozenset(closed)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so that the interpreter's last flush cannot fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


def _stdout_failed(exc: OSError) -> NoReturn:
    """A write to standard output failed: quiet for a closed pipe, else the failure."""
    _silence_stdout()
    if isinstance(exc, BrokenPipeError):
        raise _PipeClosed from None
    _fail(f"cannot write to standard output ({exc.strerror or exc}); redirect it to a file")


def _out(text: str) -> None:
    """Write ``text`` to standard output, now (errors become the command's failure)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        _stdout_failed(exc)


def _err(line: str) -> None:
    """Write one line to standard error, if it is open."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _note(text: str) -> None:
    _err(f"nous-actor: note: {text}")


# -- opening a database ----------------------------------------------------------------

_DSN_PREFIXES = ("postgresql://", "postgres://")
DEFAULT_SCHEMA = "nous_actor"
DEMO_SCHEMA = "nous_actor_demo"

# The keywords of a libpq connection string (PostgreSQL 18's list, deprecated ones included).
LIBPQ_KEYWORDS = frozenset(
    {
        "application_name",
        "channel_binding",
        "client_encoding",
        "connect_timeout",
        "dbname",
        "fallback_application_name",
        "gssdelegation",
        "gssencmode",
        "gsslib",
        "host",
        "hostaddr",
        "keepalives",
        "keepalives_count",
        "keepalives_idle",
        "keepalives_interval",
        "krbsrvname",
        "load_balance_hosts",
        "max_protocol_version",
        "min_protocol_version",
        "oauth_client_id",
        "oauth_client_secret",
        "oauth_issuer",
        "oauth_scope",
        "options",
        "passfile",
        "password",
        "port",
        "replication",
        "require_auth",
        "requirepeer",
        "requiressl",
        "scram_client_key",
        "scram_server_key",
        "service",
        "ssl_max_protocol_version",
        "ssl_min_protocol_version",
        "sslcert",
        "sslcertmode",
        "sslcompression",
        "sslcrl",
        "sslcrldir",
        "sslkey",
        "sslkeylogfile",
        "sslmode",
        "sslnegotiation",
        "sslpassword",
        "sslrootcert",
        "sslsni",
        "target_session_attrs",
        "tcp_user_timeout",
        "user",
    }
)
# One ``keyword = value`` pair of a libpq key/value connection string: the value is
# single-quoted or runs to the next whitespace; a backslash escapes the next character.
_CONNINFO_PAIR = re.compile(
    r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)+)(?=\s|$)""",
    re.DOTALL,
)


def _conninfo_keywords(db: str) -> list[str] | None:
    """The keywords of ``db`` read as ``keyword=value`` pairs, or None if it is not such."""
    keywords: list[str] = []
    pos, end = 0, len(db.rstrip())
    while pos < end:
        match = _CONNINFO_PAIR.match(db, pos)
        if match is None:
            return None
        keywords.append(match.group(1))
        pos = match.end()
    return keywords or None


def _is_dsn(db: str) -> bool:
    """Whether ``db`` names a PostgreSQL server, not a file: a ``postgresql://`` (or
    ``postgres://``) URI, or a libpq key/value string (``host=... dbname=...``) whose
    every keyword is one libpq knows. ``./host=x`` is a file."""
    if db.startswith(_DSN_PREFIXES):
        return True
    keywords = _conninfo_keywords(db)
    return keywords is not None and all(k in LIBPQ_KEYWORDS for k in keywords)


def _not_quite_a_dsn(db: str) -> str | None:
    """Why ``db`` is refused: key/value pairs that name libpq keywords but also some that
    are not (a typo would otherwise make a SQLite file of that name). None otherwise."""
    keywords = _conninfo_keywords(db)
    if keywords is None or not any(k in LIBPQ_KEYWORDS for k in keywords):
        return None
    unknown = sorted({k for k in keywords if k not in LIBPQ_KEYWORDS})
    if not unknown:
        return None
    return (
        f"{db!r} reads as a PostgreSQL key/value DSN, but {', '.join(map(repr, unknown))} "
        f"{'is not a libpq keyword' if len(unknown) == 1 else 'are not libpq keywords'} "
        "(host, port, dbname, user, password, sslmode, ...); fix the DSN, or give "
        f"{'./' + db!r} for a SQLite file of that name"
    )


def _open_postgres(dsn: str, schema: str, *, create: bool) -> Store:
    try:
        from nous_actor.store.postgres import PostgresStore
    except ImportError as exc:
        _fail(
            f"{exc.msg if hasattr(exc, 'msg') else exc}; a PostgreSQL DSN needs the postgres "
            "extra: pip install 'nous-actor[postgres]'"
        )
    try:
        return PostgresStore(dsn, schema=schema, create=create)
    except StoreError as exc:
        if create or "there is no nous_actor store" not in str(exc):
            raise
        _fail(
            f"no nous_actor store in {PostgresStore.describe(dsn, schema)}: "
            "pass the store's schema with --schema (or import a session there to make one)"
        )


def _where(store: Store) -> str:
    """How a message names the store: its file, or its server and schema."""
    return str(getattr(store, "path", None) or getattr(store, "location", None) or store)


def _not_a_file(db: str) -> str | None:
    """Why ``db`` cannot be a database file, or None if it can (it may not exist yet)."""
    if _is_dsn(db):
        return None
    almost = _not_quite_a_dsn(db)
    if almost is not None:
        return almost
    path = Path(db)
    if path.is_dir():
        return f"{db!r} is a directory, not a database file; give the path of a file in it"
    if path.exists() and not path.is_file():
        return f"{db!r} is not a regular file; give the path of a database file"
    if not path.parent.is_dir():
        return f"no directory {str(path.parent)!r} for the database {db!r}; create it first"
    return None


def _open_existing(db: str, schema: str = DEFAULT_SCHEMA, *, read_only: bool = False) -> Store:
    """The store at ``db`` (a file, or a DSN, URI or key/value, and a schema), never made here;
    with ``read_only``, wrapped so that it refuses every write (a SQLite file is opened
    with read-only connections)."""
    if read_only:
        from nous_actor.viewer.source import ReadOnlyStore, read_only_sqlite
    if _is_dsn(db):
        store = _open_postgres(db, schema, create=False)
        return ReadOnlyStore(store) if read_only else store
    why = _not_a_file(db)
    if why is not None:
        _fail(why)
    path = Path(db)
    if not path.is_file() or path.stat().st_size == 0:
        what = "" if not path.exists() else ": it is an empty file"
        _fail(
            f"no database at {db!r}{what} (run 'nous-actor demo --db {shlex.quote(db)}' "
            "to make one)"
        )
    if read_only:
        return read_only_sqlite(db)
    return SQLiteStore(db, create=False)  # a command that reads never makes a store


def _load(store: Store, session_id: str) -> Log:
    events = store.load(session_id)
    if not events:
        ids = store.sessions()
        known = ", ".join(ids[:_LISTED]) or "none"
        if len(ids) > _LISTED:
            known += f" and {len(ids) - _LISTED} more; 'nous-actor sessions' lists them"
        _fail(f"no session {session_id!r} in {_where(store)} (sessions: {known})")
    log = Log()
    for ev in events:
        log = log.append_event(ev)
    return log


def _partial(log: Log, upto: int | None = None) -> None:
    """Note that a snapshot dropped events at seqs <= ``upto`` (default: anywhere)."""
    top = log.count() - 1 if upto is None else upto
    seqs = [ev.seq for ev in log.events() if ev.seq <= top]
    missing = top + 1 - len(seqs)
    if missing <= 0:
        return
    whole_from = top  # the lowest seq from which every event up to ``top`` is retained
    for seq in reversed(seqs):
        if seq != whole_from:
            break
        whole_from -= 1
    were = "event was" if missing == 1 else "events were"
    _note(
        f"{missing} {were} dropped by a snapshot; history before seq {whole_from + 1} is partial"
    )


# -- formatting ------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [headers, ["-" * w for w in widths], *cells]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _short(value: Any, width: int = 60) -> str:
    text = _json_text(value).replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def _calls_text(calls: Any) -> str:
    """Tool calls as ``-> name(arguments)``, in any shape (flat, OpenAI's, custom: its input)."""
    parts = []
    for call in calls if isinstance(calls, list | tuple) else [calls]:
        if not isinstance(call, Mapping):
            parts.append(_json_text(call))
            continue
        _, name, args = tool_call_parts(call)
        parts.append(
            f"{'?' if name is None else name}({'' if args is None else _json_text(args)})"
        )
    return "-> " + ", ".join(parts)


def _content_text(content: Any, calls: Any) -> str:
    """What a message says: its content, then its tool calls."""
    parts = [] if content is None else [_json_text(content)]
    if calls:
        parts.append(_calls_text(calls))
    return " ".join(parts)


def _event_rows(events: Sequence[Event]) -> list[list[Any]]:
    rows = []
    for ev in events:
        op = ev.surface_op
        data = {k: v for k, v in ev.data.items() if k != "surface_op"}
        text = _content_text(data.get("content"), data.get("tool_calls"))
        rows.append(
            [
                ev.seq,
                ev.type.value,
                ev.position,
                f"{op.start}..{op.stop}" if op else "",
                _short(text or data),
            ]
        )
    return rows


def _emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    if args.json:
        _out(json.dumps(payload, ensure_ascii=False, indent=2) + "\n")
    else:
        _out(text + "\n")


# -- commands ----------------------------------------------------------------------------


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
    from nous_actor.cli.agents_demo import check_demo_paths, format_report, run_demo

    dsn = _demo_dsn(args)
    if dsn is not None:
        return _demo_postgres(args, dsn)
    db = Path(args.db)
    why = _not_a_file(args.db)
    if why is not None:
        _fail(why)
    refusal = check_demo_paths(db, keep=args.keep)
    if refusal is not None:
        _fail(refusal)
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    log_path = Path(f"{db}.log")
    _log_to_file(log_path)
    _demo_header(args, str(db), log_path)
    report = run_demo(db, **_demo_options(args))
    return _demo_report(args, report, format_report(report, db))


def _demo_header(args: argparse.Namespace, where: str, log_path: Path) -> None:
    header = (
        f"nous-actor demo: {args.agents} agents x {args.turns} turns, crash rate "
        f"{args.crash_rate:g}, on {where} (events of the runtime logged to {log_path})"
    )
    if args.json:
        _err(header)
    else:
        _out(header + "\n")


def _demo_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "agents": args.agents,
        "turns": args.turns,
        "crash_rate": args.crash_rate,
        "seed": args.seed,
        "progress": None if args.json else sys.stderr,
    }


def _demo_report(args: argparse.Namespace, report: Any, text: str) -> int:
    payload = {**report.__dict__, "events_per_second": report.events_per_second, "ok": report.ok}
    _emit(args, payload, text)
    return 0 if report.ok else 1


def _demo_postgres(args: argparse.Namespace, dsn: str) -> int:
    """The demo on a PostgreSQL server, in a schema of its own (``--schema``)."""
    try:
        from nous_actor.cli.agents_demo import (
            check_demo_log,
            check_demo_schema,
            format_report,
            run_demo_postgres,
        )
        from nous_actor.store.postgres import PostgresStore
    except ImportError as exc:
        _fail(f"{exc}; the demo on PostgreSQL needs: pip install 'nous-actor[postgres]'")
    where = PostgresStore.describe(dsn, args.schema)  # refuses a malformed DSN, connects not
    log_path = Path(f"nous-demo-{args.schema}.log")
    refusal = check_demo_schema(dsn, args.schema, keep=args.keep) or check_demo_log(
        log_path, "pass another --schema"
    )
    if refusal is not None:
        _fail(refusal)
    _log_to_file(log_path)
    _demo_header(args, where, log_path)
    report = run_demo_postgres(dsn, schema=args.schema, keep=args.keep, **_demo_options(args))
    return _demo_report(args, report, format_report(report, where))


def cmd_tour(args: argparse.Namespace) -> int:
    from nous_actor.cli import tour as demo

    try:
        status = demo.main([])
    except OSError as exc:  # it writes nothing but standard output
        _stdout_failed(exc)
    _out("")  # flush: a write error is the command's failure
    return status


def _session_row(info: SessionInfo) -> list[Any]:
    if info.error is not None:
        return [info.session_id, "?", "?", "unreadable: " + info.error.replace("\n", " ")]
    when = "" if info.last_time is None else info.last_time.isoformat()
    return [info.session_id, info.events, info.next_seq, when]


def cmd_sessions(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    infos = list_sessions(store)  # from the index: no session is loaded in full
    payload = [
        {
            "session_id": i.session_id,
            "retained": i.events,
            "count": i.next_seq,
            "last_time": None if i.last_time is None else i.last_time.isoformat(),
            "error": i.error,
        }
        for i in infos
    ]
    rows = [_session_row(i) for i in infos]
    _emit(args, payload, _table(["session", "retained", "count", "last event"], rows))
    bad = [i.session_id for i in infos if i.error is not None]
    if bad:
        named = ", ".join(bad[:_LISTED])
        if len(bad) > _LISTED:
            named += f" and {len(bad) - _LISTED} more"
        _fail(
            f"{len(bad)} of {len(infos)} sessions could not be read ({named}): see their "
            "rows; the others are listed"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    log = _load(store, args.session_id)
    if args.as_of is not None:
        try:
            log = log.as_of(args.as_of)
        except ValueError as exc:
            _fail(str(exc))
        _partial(log, args.as_of)
    if args.events or args.since is not None:
        events = log.events() if args.since is None else log.since(args.since)
        payload: Any = [event_to_dict(e) for e in events]
        text = _table(["seq", "type", "pos", "replaces", "content"], _event_rows(events))
    else:
        pairs = log.derive_indexed()
        payload = [{"seq": seq, **message_to_dict(m)} for seq, m in pairs]
        rows = [
            [seq, m.role.value, _short(_content_text(m.content, m.tool_calls))] for seq, m in pairs
        ]
        text = _table(["seq", "role", "content"], rows)
    _emit(args, payload, text)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    _load(store, args.session_id)
    _out(export_session(store, args.session_id))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    if 0 in args.closed_fds:
        _fail(
            "standard input is closed; pipe the session in: "
            "nous-actor import DB SESSION < EXPORT.jsonl"
        )
    why = _not_a_file(args.db)
    if why is not None:
        _fail(why)
    text = sys.stdin.read()
    if not text.strip():
        _fail("nothing on standard input: pipe a JSON Lines export (or a v1 JSON list) in")
    # Everything that can be refused without the database is, before it is opened:
    # a failed import never leaves a new empty store behind.
    check_session_id(args.session_id)
    if not loads(text).events():
        _fail("the input holds no events, so there is no session to import")
    store = (
        _open_postgres(args.db, args.schema, create=True)
        if _is_dsn(args.db)
        else SQLiteStore(args.db)
    )
    try:
        n = import_session(store, args.session_id, text)
    finally:
        store.close()
    _emit(
        args,
        {"session_id": args.session_id, "events": n},
        f"imported {n} events into {args.session_id}",
    )
    return 0


def _with_session(args: argparse.Namespace, work: Callable[[Session], T]) -> tuple[Log, T]:
    """Run ``work`` on the stored session ``args.session_id``, started and stopped here.

    Returns the session's log as it was stored before, and what ``work`` returned.
    """
    from nous_actor.sessions.handle import Session

    store = _open_existing(args.db, args.schema)
    log = _load(store, args.session_id)
    session = Session.start(args.session_id, store=store)
    try:
        return log, work(session)
    finally:
        session.stop()


def cmd_fork(args: argparse.Namespace) -> int:
    log, forked = _with_session(args, lambda s: s.fork(args.through, args.new_id).get())
    _partial(log, args.through)
    _emit(
        args,
        {
            "session_id": args.new_id,
            "from": args.session_id,
            "through_seq": args.through,
            "count": forked.count(),
        },
        f"forked {args.session_id} through seq {args.through} into {args.new_id} "
        f"({len(forked.events())} events)",
    )
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    _, (dropped, kept) = _with_session(args, lambda s: (s.snapshot().get(), len(s.events().get())))
    _emit(
        args,
        {"session_id": args.session_id, "dropped": dropped, "retained": kept},
        f"snapshot of {args.session_id}: dropped {dropped} shadowed events, {kept} retained",
    )
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    log = _load(store, args.session_id)
    try:
        info = history.explain(log, args.seq)
    except KeyError as exc:
        _fail(str(exc.args[0]))
    _partial(log)
    info["compactions"] = history.compactions(log)
    lines = [f"{k:24} {v}" for k, v in info.items() if k != "compactions"]
    lines.append(f"{'compactions in session':24} {len(info['compactions'])}")
    for c in info["compactions"]:
        lines.append(
            f"  seq {c['seq']}: estimate {c['estimate_before']} -> {c['estimate_after']}, "
            f"pruned {c['pruned']}, summarised {c['summarised']}"
        )
    _emit(args, info, "\n".join(lines))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from nous_actor.viewer import serve
    except ImportError as exc:
        _fail(f"{exc}; the viewer needs the serve extra: pip install 'nous-actor[serve]'")
    store = _open_existing(args.db, args.schema, read_only=True)
    host = f"[{args.host}]" if ":" in args.host else args.host
    where = getattr(store, "where", None) or _where(store)
    _out(f"nous-actor: serving {where} read-only at http://{host}:{args.port}/ (Ctrl-C stops)\n")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        _note(f"bound to {args.host}: whoever reaches this machine can read every session")
    try:
        listened = serve(store, host=args.host, port=args.port)
    except KeyboardInterrupt:  # Ctrl-C is how it stops (after a clean shutdown)
        return 0
    if not listened:
        _fail(f"could not listen on {host}:{args.port}; pick another --port")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parent.parent
    if not (root / "bench" / "__main__.py").is_file():
        _fail("the benchmark suite ships with the source tree: run 'make bench' in a checkout")
    cmd = [sys.executable, "-m", "bench", *[a for a in args.bench_args if a != "--"]]
    return subprocess.call(cmd, cwd=root)


# -- where the library's log records go ----------------------------------------------------


class _Held(logging.Handler):
    """Holds the library's records until the command is over: shown on success only,
    since a failed command's one-line error already says what went wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def show(self) -> None:
        records, self.records = self.records, []
        for record in records:
            _err(f"nous-actor: {record.levelname.lower()}: {record.getMessage()}")


def _log_to_file(path: Path) -> None:
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(message)s"))
    _configure_logging(handler, logging.INFO, stamped=True)


def _configure_logging(handler: logging.Handler, level: int, *, stamped: bool) -> None:
    """The command is an application: it decides where the library's events go."""
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("pykka").setLevel(logging.CRITICAL)
    processors: list[Any] = (
        [
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"]),
        ]
        if stamped
        else [structlog.processors.KeyValueRenderer(key_order=["event"])]  # level leads
    )
    structlog.configure(
        processors=processors,
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )


# -- arguments ---------------------------------------------------------------------------


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
    d.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
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


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
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
    return n


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
