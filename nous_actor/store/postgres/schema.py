"""The tables of `nous_actor.store.postgres`, and opening a schema: look before writing.

Holds the schema's version, its tables' definitions (`_DDL`), the statements'
table names of one schema (`_Sql`), and
`prepare_schema`, which opens the store in a schema, making it in one
transaction if the schema is missing or empty, and refuses (changing
nothing) a schema holding another application's objects, a newer store or a
damaged one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import sql

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

    @classmethod
    def of(cls, schema: str, conn: psycopg.Connection[Any]) -> _Sql:
        def name(table: str) -> str:
            return sql.Identifier(schema, table).as_string(conn)

        return cls(name("events"), name("claims"), name("meta"), name("epochs"), _channel(schema))


def _channel(schema: str) -> str:
    return f"nous_actor:{schema}"


SCHEMA_VERSION: Final = 1
APPLICATION: Final = "nous_actor"
MIN_SERVER_VERSION: Final = 130000  # pg_current_xact_id / pg_xact_status
_OUR_RELATIONS: Final = frozenset(
    {"events", "events_pkey", "claims", "claims_pkey", "epochs", "meta", "meta_pkey"}
)
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
    locked boolean NOT NULL
)""",
    "CREATE SEQUENCE {epochs} AS bigint MINVALUE 1",
    "CREATE TABLE {meta} (key text PRIMARY KEY, value text NOT NULL)",
)


def open_schema(ctx: _Context, create: bool) -> tuple[psycopg.Connection[Any], _Sql]:
    """A first connection to ``ctx``'s server, failing at once (no retry), with the store
    opened in its schema (see `prepare_schema`); and the schema's statements.

    Raises:
        StoreError: the server cannot be reached or refuses, is older than PostgreSQL
            13, or refuses the schema (see `prepare_schema`). Nothing is changed.
    """
    conn = ctx.connect()  # the first connection fails fast: no retry
    try:
        with ctx.translate(None, "open the store"):
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
    """Open the store in ``ctx.schema``, making it in one transaction if missing or empty.

    Raises:
        StoreError: the schema holds another application's objects, a store of a
            newer version or a damaged one, or (with ``create=False``) no store.
        psycopg.Error: the server refused (the caller translates it).
    """
    with _transaction(conn):
        # One creator at a time (two processes opening a new store at once).
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"nous_actor schema {ctx.schema}",),
        )
        state = _inspect(conn, ctx, q)
        if state != "ours":
            if not create:
                raise StoreError(
                    f"there is no nous_actor store in {ctx.location} (the schema is "
                    f"{state}); check the schema name, or open it with create=True"
                )
            _create(conn, ctx.schema, q, state)


def _inspect(conn: psycopg.Connection[Any], ctx: _Context, q: _Sql) -> str:
    """``"missing"``, ``"empty"`` or ``"ours"``; raises for anything else."""
    row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (ctx.schema,)).fetchone()
    if row is None:
        return "missing"
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
        return "empty"
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
    if version != str(SCHEMA_VERSION):
        raise StoreError(
            f"{ctx.location} is a nous_actor store of schema version {version}; this "
            f"nous_actor reads version {SCHEMA_VERSION}: upgrade nous_actor"
        )
    missing = sorted(_OUR_RELATIONS - names)
    if missing:
        raise StoreError(
            f"{ctx.location} is a damaged nous_actor store: {', '.join(missing)} "
            "is missing; restore it from a backup or use another schema"
        )
    return "ours"


def _create(conn: psycopg.Connection[Any], schema: str, q: _Sql, state: str) -> None:
    if state == "missing":
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    names = {"events": q.events, "claims": q.claims, "epochs": q.epochs, "meta": q.meta}
    for statement in _DDL:
        conn.execute(statement.format(**names))
    conn.execute(
        f"INSERT INTO {q.meta} (key, value) VALUES ('application', %s), ('schema_version', %s)",
        (APPLICATION, str(SCHEMA_VERSION)),
    )
