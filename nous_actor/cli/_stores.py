"""Opening the store a command names: a SQLite file, or a PostgreSQL server by URI or
libpq key/value DSN (and a schema), never made by a command that reads; loading a
session, and the note that a snapshot left its history partial."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from nous_actor.cli._console import _fail, _note
from nous_actor.core.log import Log
from nous_actor.errors import StoreError
from nous_actor.store import Store
from nous_actor.store.sqlite import SQLiteStore

_LISTED = 10  # sessions named in a "no session" error
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
    except ImportError as exc:  # says which extra to install
        _fail(str(exc))
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
