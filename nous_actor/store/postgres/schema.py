"""The tables of `nous_actor.store.postgres`, and opening a schema: look before writing.

Holds the schema's version, its tables' definitions (`_DDL`), the statements
taking a store of an older version to the next one (`_UPGRADES`), the guard
that keeps a process of another version from writing (`_guard_ddl`), the
statements' table names of one schema (`_Sql`), and `prepare_schema`, which
opens the store in a schema, making it in one transaction if the schema is
missing or empty, migrating it in one transaction if it is of an older
version, and refusing (changing nothing) a schema holding another
application's objects, a newer store or a damaged one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

import psycopg
import psycopg.errors
from psycopg import sql

from nous_actor._log import get_logger
from nous_actor.errors import StoreError
from nous_actor.store.postgres.connection import _Context, _transaction
from nous_actor.store.postgres.failures import _describe


@dataclass(frozen=True)
class _Sql:
    """The statements of one schema, composed once."""

    events: str
    claims: str
    meta: str
    epochs: str
    channel: str
    """Where a store says what changes hands: hand-off requests, withdrawals, releases.
    Every store's listener hears it."""
    guard: str
    calls: str
    commits: str
    """Where a commit says which sessions it wrote (``"<last seq> <session id>"``): heard
    only by the listeners of stores that watch a session (version 3; before it, commits
    were said on `channel`, so every process holding a session woke at every commit)."""

    @classmethod
    def of(cls, schema: str, conn: psycopg.Connection[Any]) -> _Sql:
        def name(table: str) -> str:
            return sql.Identifier(schema, table).as_string(conn)

        return cls(
            name("events"),
            name("claims"),
            name("meta"),
            name("epochs"),
            _channel(schema),
            name(_GUARD),
            name("calls"),
            _commit_channel(schema),
        )

    def names(self) -> dict[str, str]:
        """The objects' qualified names, for the ``{...}`` of `_DDL` and `_UPGRADES`."""
        return {
            "events": self.events,
            "claims": self.claims,
            "meta": self.meta,
            "epochs": self.epochs,
            "guard": self.guard,
            "calls": self.calls,
        }


logger = get_logger("nous_actor.store.postgres")  # the package's name


def _channel(schema: str) -> str:
    return f"nous_actor:{schema}"


def _commit_channel(schema: str) -> str:
    return f"nous_actor.{schema}"  # as long as `_channel`'s: both fit PostgreSQL's 63 bytes


SCHEMA_VERSION: Final = 3
APPLICATION: Final = "nous_actor"
MIN_SERVER_VERSION: Final = 130000  # pg_current_xact_id / pg_xact_status

VERSION_SETTING: Final = "nous_actor.schema_version"
"""The setting a write transaction of this release sets (``SET LOCAL``) to the schema
version it writes; the schema's guard refuses a write without it, or of another version."""

BEGIN_WRITE: Final = f"BEGIN; SET LOCAL {VERSION_SETTING} = '{SCHEMA_VERSION}'"
"""How every transaction that inserts events or takes a claim begins (one round trip)."""

_GUARD: Final = "refuse_other_version"  # the guard's function, in the store's schema

# The objects (relations, and functions) of the store at each version, by name.
_V1_OBJECTS: Final = frozenset(
    {"events", "events_pkey", "claims", "claims_pkey", "epochs", "meta", "meta_pkey"}
)
_LAYOUT: Final = {
    1: _V1_OBJECTS,
    2: _V1_OBJECTS | {_GUARD},
    3: _V1_OBJECTS | {_GUARD, "calls", "calls_pkey", "calls_at"},
}
_OUR_RELATIONS: Final = _LAYOUT[SCHEMA_VERSION]


def _guard_ddl(version: int) -> tuple[str, ...]:
    """The guard of a store of ``version``: statement-level triggers refusing a
    transaction that did not set `VERSION_SETTING` to ``version`` (a process of an
    older release, or one that opened the store before another process migrated it)
    when it inserts events, takes a claim (an insert) or takes one over (an update of
    its epoch or token). Renewals of the claims such a process holds, its releases
    and deletes, and its reads are let through: it cannot write, nor claim anew, and
    its claims end with it."""
    return (
        f"""CREATE OR REPLACE FUNCTION {{guard}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('{VERSION_SETTING}', true) IS DISTINCT FROM '{version}' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = format('the nous_actor store in schema %s is of schema version '
                '{version}, and this process writes as version %s (it opened the store '
                'before another process migrated it, or is of an older release): nothing '
                'was written; upgrade nous_actor in this process and restart it',
                TG_TABLE_SCHEMA,
                coalesce(nullif(current_setting('{VERSION_SETTING}', true), ''), '1'));
    END IF;
    RETURN NULL;
END
$$""",
        "CREATE TRIGGER version_guard BEFORE INSERT ON {events} "
        "FOR EACH STATEMENT EXECUTE FUNCTION {guard}()",
        "CREATE TRIGGER version_guard BEFORE INSERT OR UPDATE OF epoch, token ON {claims} "
        "FOR EACH STATEMENT EXECUTE FUNCTION {guard}()",
    )


CALLS_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {calls} (
    at bigint NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    call text NOT NULL,
    first bigint NOT NULL,
    last bigint NOT NULL,
    PRIMARY KEY (session_id, call)
)""",
    "CREATE INDEX IF NOT EXISTS calls_at ON {calls} (at)",
)
"""Version 3: the calls other processes forwarded to this store's holders, each with the
seqs of what it appended (`PostgresStore.applied_call`), written in the transaction of
those events and kept `CALL_RECORD_SECONDS` at least (``at``: the write's Unix time, in
seconds)."""

_DDL: Final = (
    """CREATE TABLE {events} (
    session_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL CHECK (seq >= 0),
    epoch bigint NOT NULL,
    type text NOT NULL,
    time timestamptz NOT NULL,
    data text NOT NULL,
    PRIMARY KEY (session_id, seq)
)""",
    """CREATE TABLE {claims} (
    session_id text COLLATE "C" PRIMARY KEY,
    epoch bigint NOT NULL,
    token text NOT NULL,
    holder text NOT NULL,
    claimed_at timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    locked boolean NOT NULL,
    address text
)""",
    "CREATE SEQUENCE {epochs} AS bigint MINVALUE 1",
    "CREATE TABLE {meta} (key text PRIMARY KEY, value text NOT NULL)",
    *CALLS_DDL,
    *_guard_ddl(SCHEMA_VERSION),
)


_UPGRADES: Final = {
    # Version 1 to 2: the address where a claim's holder answers (NULL for the claims
    # of version 1: their holders advertised none), and the guard of version 2. The
    # store's shared secret ('forwarding_key') is a row of meta, made on first use.
    1: (
        "ALTER TABLE {claims} ADD COLUMN address text",
        *_guard_ddl(2),
        "UPDATE {meta} SET value = '2' WHERE key = 'schema_version'",
    ),
    # Version 2 to 3: the table of forwarded calls' records, and the guard of version 3
    # (its triggers stand: the function they call is replaced). Commits are said on a
    # channel of their own from now on: a process of version 2 would not hear them, nor
    # would this release hear its commits, so the guard keeps it from writing.
    2: (
        *CALLS_DDL,
        _guard_ddl(3)[0],
        "UPDATE {meta} SET value = '3' WHERE key = 'schema_version'",
    ),
}
"""The statements that take a store from the version (the key) to the next one, run in
the opening transaction (PostgreSQL's DDL is transactional: a migration cut anywhere
leaves the schema as it was)."""


def open_schema(ctx: _Context, create: bool) -> tuple[psycopg.Connection[Any], _Sql]:
    """A first connection to ``ctx``'s server, failing at once (no retry, unless the server
    says it is restarting: see `_Context.connect`), with the store
    opened in its schema (see `prepare_schema`); and the schema's statements.

    The connection is made within ``ctx.timeout``, and the schema opened within
    ``ctx.timeout`` more (on the client too: see `connection._Watchdog`).

    Raises:
        StoreError: the server cannot be reached or refuses, is older than PostgreSQL
            13, or refuses the schema (see `prepare_schema`). Nothing is changed.
    """
    conn = ctx.connect()  # the first connection fails fast (unless the server restarts)
    deadline = time.monotonic() + ctx.timeout
    try:
        with (
            ctx.translate(None, "open the store", conn),
            ctx.bounded(conn, deadline, "main", "open the store"),
        ):
            if conn.info.server_version < MIN_SERVER_VERSION:
                raise StoreError(
                    f"{ctx.location}: PostgreSQL {conn.info.server_version // 10000} "
                    "is too old; PostgresStore needs PostgreSQL 13 or newer"
                )
            q = _Sql.of(ctx.schema, conn)
            prepare_schema(conn, ctx, q, create)
    except BaseException:
        conn.close()
        raise
    return conn, q


def prepare_schema(conn: psycopg.Connection[Any], ctx: _Context, q: _Sql, create: bool) -> None:
    """Open the store in ``ctx.schema``, making it in one transaction if missing or empty,
    or migrating a store of an older version to `SCHEMA_VERSION` in one transaction.

    One process at a time makes or migrates a schema (a transaction-level advisory
    lock of the schema's name); a process that waited for another finds the store
    made or migrated, and only opens it. A migration cut anywhere (the process
    killed, the connection lost, a lock not had within ``timeout``) is rolled back:
    the schema is wholly of its old version, and the next opening migrates it.

    Raises:
        StoreError: the schema holds another application's objects, a store of a
            newer version or a damaged one, or (with ``create=False``) no store; or
            it holds an older store and this role may not migrate it (it does not
            own the tables).
        psycopg.Error: the server refused (the caller translates it).
    """
    with _transaction(conn):
        # One creator at a time (two processes opening a new store at once).
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"nous_actor schema {ctx.schema}",),
        )
        state, version = _inspect(conn, ctx, q)
        if state != "ours":
            if not create:
                raise StoreError(
                    f"there is no nous_actor store in {ctx.location} (the schema is "
                    f"{state}); check the schema name, or open it with create=True"
                )
            _create(conn, ctx.schema, q, state)
            return
        while version < SCHEMA_VERSION:
            try:
                for statement in _UPGRADES[version]:
                    conn.execute(statement.format(**q.names()))
            except psycopg.errors.InsufficientPrivilege as exc:
                raise StoreError(
                    f"{ctx.location} is a nous_actor store of schema version {version}, and "
                    f"this role may not migrate it to version {SCHEMA_VERSION} ({exc}; only "
                    "the owner of its tables may alter them): open it once as that role, "
                    "then again as this one; nothing was changed"
                ) from exc
            version += 1
            logger.info("store.schema_migrated", store=ctx.location, schema_version=version)


def _inspect(conn: psycopg.Connection[Any], ctx: _Context, q: _Sql) -> tuple[str, int]:
    """``"missing"``, ``"empty"`` or ``"ours"``, and the store's schema version (0 when
    not ours); raises for anything else."""
    row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (ctx.schema,)).fetchone()
    if row is None:
        return "missing", 0
    oid = row[0]
    names = {
        str(r[0])
        for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s "
            "UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = %s "
            "UNION ALL SELECT typname FROM pg_type WHERE typnamespace = %s "
            "AND typrelid = 0 AND typelem = 0",
            (oid, oid, oid),
        )
    }
    if not names:
        return "empty", 0
    app = version = None
    if "meta" in names:
        meta = dict(conn.execute(f"SELECT key, value FROM {q.meta}").fetchall())
        app, version = meta.get("application"), meta.get("schema_version")
    if app != APPLICATION:
        shown = ", ".join(sorted(names)[:5]) + (" ..." if len(names) > 5 else "")
        raise StoreError(
            f"schema {ctx.schema!r} in {_describe(ctx.dsn)} holds another "
            f"application's objects ({shown}), not a nous_actor store; it was left "
            "unchanged: pass another schema="
        )
    known = {str(v): v for v in _LAYOUT}
    if version not in known:
        raise StoreError(
            f"{ctx.location} is a nous_actor store of schema version {version}; this "
            f"nous_actor reads version {SCHEMA_VERSION}: upgrade nous_actor"
        )
    missing = sorted(_LAYOUT[known[version]] - names)
    if missing:
        raise StoreError(
            f"{ctx.location} is a damaged nous_actor store: {', '.join(missing)} "
            "is missing; restore it from a backup or use another schema"
        )
    return "ours", known[version]


def _create(conn: psycopg.Connection[Any], schema: str, q: _Sql, state: str) -> None:
    if state == "missing":
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for statement in _DDL:
        conn.execute(statement.format(**q.names()))
    conn.execute(
        f"INSERT INTO {q.meta} (key, value) VALUES ('application', %s), ('schema_version', %s)",
        (APPLICATION, str(SCHEMA_VERSION)),
    )
