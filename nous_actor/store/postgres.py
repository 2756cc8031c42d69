"""A `nous_actor.store.Store` shared by processes and machines: PostgreSQL (psycopg 3).

Install the extra: ``pip install 'nous-actor[postgres]'``. Nothing else in the
library imports this module or psycopg.

What it guarantees, beyond the `Store` protocol:

* **Acknowledged means committed.** `write` returns only after PostgreSQL
  committed the transaction holding every session's events of the call
  (one transaction for all of them: group commit). An event is never
  reported stored unless it is; a write is wholly stored or wholly absent.
  If the connection is lost during ``COMMIT``, the outcome is read back from
  the server (the transaction's status, then the rows with their epoch),
  never guessed.
* **One writer per session, by lease and fencing.** `claim` takes a lease
  on the session with an epoch that only grows (a database sequence); the
  database's clock decides when a lease expires. Every write transaction
  reads the claim row (``FOR KEY SHARE``) in the same transaction as its
  inserts, so a writer that was paused or partitioned and wakes up after
  its lease was taken over stores nothing and gets `FencedError`.
  Leases renew in the background (one thread per store, for all its
  claims); a session whose lease could not be renewed is failed closed
  before the lease runs out (its writes are refused with `StoreError`).
* **A dead writer is taken over at once.** Each claim also holds a
  session-level advisory lock on the store's lease connection; when a
  writer's process dies, the server drops its connection and that lock,
  and a new claim takes the session over without waiting for the lease
  (a paused or partitioned writer keeps its lock, so that one is taken
  over when its lease expires). Pass ``detect_dead_holders=False`` behind a
  transaction-pooling proxy (PgBouncer in transaction mode), which cannot
  keep session-level locks.
* **Live subscriptions across processes.** `PostgresStore.watch`
  delivers every committed event of a session with ``seq >= from_seq``,
  exactly once, in seq order, also in a process that never writes it:
  ``LISTEN``/``NOTIFY`` wakes the reader, rows are read by seq.
* **Lost connections are survived.** A lost connection (a restarted server,
  ``pg_terminate_backend``) is reopened with backoff; reads and writes known
  not to have committed are retried within ``timeout``, and anything else
  is a `StoreError`, never a psycopg exception.
* **Someone else's schema is left alone.** Every table lives in ``schema``,
  created (in one transaction) if missing or empty; a schema holding
  another application's tables is refused without changing anything.

Event data is stored as JSON text, not ``jsonb``: ``jsonb`` turns ``-0.0``
into ``0``, ``1e308`` into a 309-digit integer, refuses ``"\\u0000"`` and
reorders keys, so events would not load back equal (and text is faster,
see docs/persistence.md). Times are ``timestamptz`` (microseconds, UTC).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg import sql
from psycopg.types.string import TextLoader

from nous_actor._log import get_logger
from nous_actor.core.args import check_flag, check_seconds
from nous_actor.core.codec import CodecError, encode_data, event_from_row
from nous_actor.core.event import Event
from nous_actor.core.ids import check_session_id
from nous_actor.errors import ConflictError, FencedError, StoreError
from nous_actor.store.base import (
    ClosingStore,
    SessionInfo,
    valid_store_id,
)
from nous_actor.store.shared import FollowedWatch
from nous_actor.store.subscription import Subscription

__all__ = ["FencedError", "PostgresStore", "PostgresWatch"]

logger = get_logger(__name__)

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
APPLICATION: Final = "nous_actor"
MIN_SERVER_VERSION: Final = 130000  # pg_current_xact_id / pg_xact_status
_MAX_SEQ: Final = 2**63 - 1
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
_RENEW_FRACTION: Final = 1 / 3  # renew this far into a lease
_FAIL_CLOSED_FRACTION: Final = 2 / 3  # refuse writes this long after the last renewal began
_IDLE_CHECK_S: Final = 5.0  # the listener checks an idle connection this often

_MAX_SCHEMA_BYTES: Final = 63 - len("nous_actor:")  # the channel name must fit 63 bytes
_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MIN_LEASE_S: Final = 0.1  # renewed every lease / 3: a round trip to the server each time
_MAX_LEASE_S: Final = 86_400  # a paused writer keeps its sessions at most a day
_MAX_TIMEOUT_S: Final = 2_147_483  # lock_timeout is a 32-bit count of milliseconds

# Connection-level errors a retry on a new connection may cure (the server's own codes).
_TRANSIENT_SQLSTATES: Final = frozenset(
    {"57P01", "57P02", "57P03", "53300", "08000", "08003", "08006", "08001", "08004"}
)
_PERMANENT_CONNECT_SQLSTATES: Final = frozenset({"28000", "28P01", "3D000", "42501"})


# -- checking the constructor's arguments ----------------------------------------------------


def _check_schema(schema: object) -> None:
    """Refuse a schema name this store cannot use (see `PostgresStore` for the rule).

    Raises:
        TypeError: not a str.
        ValueError: not 1 to 52 ASCII letters, digits and ``_`` (not starting with a
            digit), or starting with ``pg_``.
    """
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str, got {type(schema).__name__}")
    size = len(schema.encode("utf-8", "surrogatepass"))
    if not 0 < size <= _MAX_SCHEMA_BYTES:
        raise ValueError(
            f"schema must be 1 to {_MAX_SCHEMA_BYTES} bytes long (the store's change feed "
            f"is the channel 'nous_actor:<schema>', and PostgreSQL names hold 63 bytes), "
            f"got {size} bytes: {schema!r}"
        )
    if not schema.isascii() or not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(
            "schema must be a plain SQL name: ASCII letters, digits and _, not starting "
            f"with a digit (e.g. 'nous_actor' or 'agents_2'), got {schema!r}"
        )
    if schema.startswith("pg_"):
        raise ValueError(
            "schema must not start with pg_ (the prefix pg_ is reserved for PostgreSQL's "
            f"own schemas), got {schema!r}"
        )


def _check_holder(holder: object) -> None:
    """Refuse a holder name that cannot be stored or shown.

    Raises:
        TypeError: not ``None`` or a str.
        ValueError: empty or blank, or holding a NUL character (PostgreSQL text cannot).
    """
    if holder is None:
        return
    if not isinstance(holder, str):
        raise TypeError(
            "holder must be None or a str naming this process to others (e.g. "
            f"'worker-a:8080'), got {type(holder).__name__}"
        )
    if not holder.strip():
        raise ValueError(
            "holder must not be empty: name this process (e.g. 'worker-a:8080'), or pass "
            "None for '<host> pid <pid>'"
        )
    if "\x00" in holder:
        raise ValueError(f"holder must not hold a NUL character, got {holder!r}")


# -- naming the server without its password ------------------------------------------------


def _describe(dsn: str) -> str:
    """The server, database and role of ``dsn``, for messages; never the password.

    Raises:
        StoreError: ``dsn`` is not a valid connection string.
    """
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise StoreError(
            f"not a valid PostgreSQL connection string ({_first_line(exc)}); give a URI "
            "such as postgresql://user@host/dbname or key=value pairs such as "
            "'host=/run/postgresql dbname=agents'"
        ) from None
    host = str(params.get("host") or params.get("hostaddr") or "the default socket")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    db = params.get("dbname") or params.get("user") or "the default database"
    user = params.get("user")
    return f"database {db!s} on {where}" + (f" as {user}" if user else "")


def _connection_lost(where: str, connection: str, doing: str, exc: BaseException) -> None:
    """Log that a connection was lost (the caller reconnects with backoff)."""
    logger.warning(
        "store.connection_lost",
        store=where,
        connection=connection,
        doing=doing,
        reason=_first_line(exc),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None)


def _lost_connection(exc: BaseException, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether ``exc`` means the connection is gone (a retry on a new one may work)."""
    if conn is not None and (conn.broken or conn.closed):
        return True
    if _sqlstate(exc) in _TRANSIENT_SQLSTATES:
        return True
    return isinstance(exc, psycopg.InterfaceError | psycopg.OperationalError) and (
        _sqlstate(exc) is None
    )


# -- one connection, reopened with backoff --------------------------------------------------


class _Link:
    """One connection to the server, used under ``lock``, reopened with backoff when lost."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], psycopg.Connection[Any]],
        where: str,
        closing: threading.Event,
        on_connect: Callable[[psycopg.Connection[Any]], None] | None = None,
    ) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.conn: psycopg.Connection[Any] | None = None
        self._connect = connect
        self._where = where
        self._closing = closing
        self._on_connect = on_connect
        self.reconnects = 0

    def get(self, deadline: float) -> psycopg.Connection[Any]:
        """The open connection, reconnecting (with backoff, until ``deadline``) if needed.

        Raises:
            StoreError: no connection could be made before ``deadline``, or the
                server refused for good (wrong password, no such database).
        """
        conn = self.conn
        if conn is not None and not conn.broken and not conn.closed:
            return conn
        self.drop()
        delay = 0.02
        while True:
            if self._closing.is_set():
                raise StoreError(f"the store on {self._where} is closed; open a new one")
            try:
                conn = self._connect()
                if self._on_connect is not None:
                    self._on_connect(conn)
            except psycopg.Error as exc:
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
                if _sqlstate(exc) in _PERMANENT_CONNECT_SQLSTATES:
                    raise StoreError(
                        f"could not reconnect to {self._where}: {_first_line(exc)}"
                    ) from exc
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreError(
                        f"lost the connection to {self._where} and could not reconnect in "
                        f"time ({_first_line(exc)}); is the server up? The store keeps "
                        "trying on the next call"
                    ) from exc
                self._closing.wait(min(delay, remaining))
                delay = min(delay * 2, 1.0)
                continue
            self.conn = conn
            self.reconnects += 1
            return conn

    def drop(self) -> None:
        """Forget the connection (closing it quietly): the next `get` opens a new one."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


@dataclass
class _Claim:
    token: str
    epoch: int
    deadline: float  # time.monotonic() from which writes are refused unless renewed
    locked: bool = False  # holds the session's advisory lock on the lease connection
    lost: StoreError | None = None  # once set, every write under this claim gets it


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


class _Context:
    """What every part of a store needs: how to connect, and how to word an error.

    Holds no reference to the store, so the store's threads never keep it alive.
    """

    def __init__(self, dsn: str, schema: str, timeout: float, idle_tx_ms: int) -> None:
        self.dsn = dsn
        self.schema = schema
        self.timeout = timeout
        self.idle_tx_ms = idle_tx_ms
        self.location = f"{_describe(dsn)}, schema {schema}"

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection (see `reconnect`), failing at once.

        Raises:
            StoreError: the server cannot be reached or refuses the connection.
        """
        try:
            return self.reconnect()
        except psycopg.Error as exc:
            raise StoreError(
                f"could not connect to {self.location}: {_first_line(exc)}; check the DSN "
                "and that the server is up"
            ) from exc

    def reconnect(self) -> psycopg.Connection[Any]:
        """A new connection with the session settings every call relies on.

        Raises:
            psycopg.Error: the server cannot be reached or refuses the connection.
        """
        params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        extra: dict[str, Any] = {}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = max(1, int(self.timeout))
        if "application_name" not in params:
            extra["application_name"] = "nous_actor"
        conn = psycopg.connect(self.dsn, autocommit=True, **extra)
        try:
            conn.execute(
                "SET TIME ZONE 'UTC'; "
                f"SET idle_in_transaction_session_timeout = {self.idle_tx_ms}; "
                f"SET lock_timeout = {int(self.timeout * 1000)}"
            )
            # Times come back as text: the codec reads them as it reads every stored time.
            conn.adapters.register_loader("timestamptz", TextLoader)
        except BaseException:
            conn.close()
            raise
        return conn

    def error(self, exc: BaseException, session_id: str | None, doing: str) -> StoreError:
        """The `StoreError` that tells a user what ``exc`` means and what to do."""
        if isinstance(exc, CodecError):
            return StoreError(
                f"stored event is malformed in {self.location}: {exc}", session_id=session_id
            )
        state = _sqlstate(exc)
        text = _first_line(exc)
        hint = ""
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            hint = (
                f"; the role may not do this in schema {self.schema!r}: grant it USAGE and "
                "CREATE on the schema (or CREATE on the database, for a new schema), and "
                "SELECT, INSERT, UPDATE, DELETE on its tables"
            )
        elif isinstance(exc, psycopg.errors.LockNotAvailable):
            hint = "; another writer held a lock too long: retry, or raise timeout="
        elif isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedObject):
            hint = f"; a table of the store is gone from schema {self.schema!r}"
        elif isinstance(exc, psycopg.errors.DiskFull):
            hint = "; the server's disk is full: free space, then restart the sessions"
        elif state in ("25006", "25P04"):  # read-only transaction / hot standby
            hint = "; the server is read-only (a standby?): connect to the primary"
        elif _lost_connection(exc, None):
            hint = "; the connection was lost (server restarted?): the store reconnects"
        return StoreError(
            f"could not {doing} in {self.location}: {type(exc).__name__}: {text}{hint}",
            session_id=session_id,
        )

    def call(
        self,
        link: _Link,
        closing: threading.Event,
        session_id: str | None,
        doing: str,
        work: Callable[[psycopg.Connection[Any]], T],
    ) -> T:
        """Run ``work`` on ``link``'s connection; on a lost connection reconnect and retry.

        ``work`` must be safe to run again after a lost connection (a read, or
        a transaction whose effect is the same when applied twice). Every
        error leaves as a `StoreError`.
        """
        deadline = time.monotonic() + self.timeout
        delay = 0.0
        while True:
            with link.lock:
                if closing.is_set():
                    raise StoreError(f"the store on {self.location} is closed; open a new one")
                conn = link.get(deadline)
                try:
                    return work(conn)
                except (psycopg.Error, CodecError) as exc:
                    lost = isinstance(exc, psycopg.Error) and _lost_connection(exc, conn)
                    if lost:
                        link.drop()
                    if not lost or time.monotonic() + delay >= deadline or closing.is_set():
                        raise self.error(exc, session_id, doing) from exc
                    _connection_lost(self.location, link.name, doing, exc)
            closing.wait(delay)
            delay = min(max(delay * 2, 0.02), 1.0)


# -- the store ------------------------------------------------------------------------------


class PostgresStore(ClosingStore):
    """Sessions' events in a PostgreSQL database, shared by any number of processes.

    Safe to share between threads. Each store object keeps up to three
    connections: one for reads and writes, one for claims and their leases
    (opened on the first claim), one listening for `watch` (opened on
    the first watch).

    Claims (see `claim`) are leases held by this store object: the
    ``Store`` protocol's `write` takes no token, so the store remembers the
    epoch of each session it claimed and checks it in every write of that
    session. A session this store has not claimed may still be written
    (the protocol allows writes without a claim) unless another writer holds
    a live lease on it: then the write is refused with `ConflictError`.

    Args:
        dsn: a libpq connection string or URI (``postgresql://user@host/db``).
        schema: the schema holding every table (created if missing or empty):
            ASCII letters, digits and ``_``, at most 52 bytes. Tests can
            isolate in a schema each.
        lease: seconds a claim's lease lasts (0.1 to 86400); renewed every
            ``lease / 3`` s. A writer whose process dies is taken over at once;
            one that stops answering (paused, partitioned) after at most
            ``lease`` s.
        timeout: seconds a call may spend reconnecting and retrying before
            it fails with `StoreError` (0.001 to 2147483); also bounds lock waits.
        create: make the schema and tables if missing. With ``create=False``
            a schema without a store is refused with `StoreError` (nothing made).
        holder: how this process is named to others in a `ConflictError`
            (default: ``"<host> pid <pid>"``), e.g. an address to route to.
        detect_dead_holders: take over a live lease at once when its holder's
            connection is gone (see the module docs). Turn off behind a
            transaction-pooling proxy.

    Every argument is checked before anything is opened: a refused argument
    connects to nothing and starts no thread.

    Raises:
        TypeError: ``dsn`` or ``schema`` is not a str; ``lease`` or ``timeout``
            is not an int or a float; ``holder`` is not ``None`` or a str;
            ``create`` or ``detect_dead_holders`` is not a bool.
        ValueError: ``schema`` is not a plain name (ASCII letters, digits and
            ``_``, not starting with a digit or with the reserved ``pg_``) of 1
            to 52 bytes (its change feed's channel, ``nous_actor:<schema>``,
            must fit PostgreSQL's 63-byte names); ``lease`` is not from 0.1 to
            86400 s; ``timeout`` is not from 0.001 s (lock waits are counted in
            whole milliseconds; 0 would mean no limit) to 2147483 s (a 32-bit
            count of milliseconds); ``holder`` is empty or holds a NUL character.
        StoreError: the DSN is invalid, the server cannot be reached, the role
            lacks the rights to create or read the schema, the schema holds
            another application's tables or a store of a newer version, or
            (with ``create=False``) there is no store in it. Nothing is changed.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "nous_actor",
        lease: float = 15.0,
        timeout: float = 10.0,
        create: bool = True,
        holder: str | None = None,
        detect_dead_holders: bool = True,
    ) -> None:
        if not isinstance(dsn, str):
            raise TypeError(
                "dsn must be a str (a libpq connection string such as 'host=/run/postgresql "
                f"dbname=agents', or a URI such as postgresql://user@host/db), got "
                f"{type(dsn).__name__}"
            )
        _check_schema(schema)
        self.lease = check_seconds(lease, "lease", _MIN_LEASE_S, _MAX_LEASE_S, low_open=False)
        self.timeout = check_seconds(timeout, "timeout", 0.001, _MAX_TIMEOUT_S, low_open=False)
        check_flag(create, "create")
        _check_holder(holder)
        self.detect_dead_holders = check_flag(detect_dead_holders, "detect_dead_holders")
        self.schema = schema
        self.holder = holder or f"{socket.gethostname()} pid {os.getpid()}"
        # Kill a transaction of ours left idle by a paused process (it holds a claim
        # row's lock); a takeover waits for at most that long, plus a margin.
        idle_tx_ms = int(1000 * min(max(self.lease * _RENEW_FRACTION, 1.0), 60.0))
        self._claim_wait_ms = int(1000 * min(self.timeout, idle_tx_ms / 1000 + 2.0))
        self._ctx = _Context(dsn, schema, self.timeout, idle_tx_ms)
        self.location = self._ctx.location
        self._closing = threading.Event()
        self._closed = False
        conn = self._ctx.connect()  # the first connection fails fast: no retry
        try:
            with self._translate(None, "open the store"):
                if conn.info.server_version < MIN_SERVER_VERSION:
                    raise StoreError(
                        f"{self.location}: PostgreSQL {conn.info.server_version // 10000} "
                        "is too old; PostgresStore needs PostgreSQL 13 or newer"
                    )
                self._sql = _Sql.of(schema, conn)
                self._prepare_schema(conn, create)
        except BaseException:
            conn.close()
            raise
        self._main = _Link("main", self._ctx.reconnect, self.location, self._closing)
        self._main.conn = conn
        self._leases = _Leases(self)
        self._listeners: list[_Listener] = []  # at most one, made on the first watch
        self._listener_lock = threading.Lock()

        # A store nobody uses any more stops its threads and closes its connections
        # (its claims then lapse, and dead-holder detection frees them at once).
        self._finalizer = weakref.finalize(
            self, _shutdown, self._closing, self._main, self._leases, self._listeners
        )

    @staticmethod
    def describe(dsn: str, schema: str = "nous_actor") -> str:
        """How messages name the store at ``dsn``/``schema`` (never with the password).

        Raises:
            StoreError: ``dsn`` is not a valid connection string.
        """
        return f"{_describe(dsn)}, schema {schema}"

    # -- the schema: look before writing --------------------------------------------------

    def _prepare_schema(self, conn: psycopg.Connection[Any], create: bool) -> None:
        """Open the store in ``schema``, making it in one transaction if missing or empty."""
        conn.execute("BEGIN")
        try:
            # One creator at a time (two processes opening a new store at once).
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"nous_actor schema {self.schema}",),
            )
            state = self._inspect(conn)
            if state != "ours":
                if not create:
                    raise StoreError(
                        f"there is no nous_actor store in {self.location} (the schema is "
                        f"{state}); check the schema name, or open it with create=True"
                    )
                self._create(conn, state)
            conn.execute("COMMIT")
        except BaseException:
            if not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise

    def _inspect(self, conn: psycopg.Connection[Any]) -> str:
        """``"missing"``, ``"empty"`` or ``"ours"``; raises for anything else."""
        row = conn.execute(
            "SELECT oid FROM pg_namespace WHERE nspname = %s", (self.schema,)
        ).fetchone()
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
            meta = dict(conn.execute(f"SELECT key, value FROM {self._sql.meta}").fetchall())
            app, version = meta.get("application"), meta.get("schema_version")
        if app != APPLICATION:
            shown = ", ".join(sorted(names)[:5]) + (" ..." if len(names) > 5 else "")
            raise StoreError(
                f"schema {self.schema!r} in {_describe(self._ctx.dsn)} holds another "
                f"application's objects ({shown}), not a nous_actor store; it was left "
                "unchanged: pass another schema="
            )
        if version != str(SCHEMA_VERSION):
            raise StoreError(
                f"{self.location} is a nous_actor store of schema version {version}; this "
                f"nous_actor reads version {SCHEMA_VERSION}: upgrade nous_actor"
            )
        missing = sorted(_OUR_RELATIONS - names)
        if missing:
            raise StoreError(
                f"{self.location} is a damaged nous_actor store: {', '.join(missing)} "
                "is missing; restore it from a backup or use another schema"
            )
        return "ours"

    def _create(self, conn: psycopg.Connection[Any], state: str) -> None:
        if state == "missing":
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
        names = {
            "events": self._sql.events,
            "claims": self._sql.claims,
            "epochs": self._sql.epochs,
            "meta": self._sql.meta,
        }
        for statement in _DDL:
            conn.execute(statement.format(**names))
        conn.execute(
            f"INSERT INTO {self._sql.meta} (key, value) VALUES "
            "('application', %s), ('schema_version', %s)",
            (APPLICATION, str(SCHEMA_VERSION)),
        )

    # -- one place to translate psycopg errors ----------------------------------------------

    def _error(self, exc: BaseException, session_id: str | None, doing: str) -> StoreError:
        return self._ctx.error(exc, session_id, doing)

    @contextlib.contextmanager
    def _translate(self, session_id: str | None, doing: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except (psycopg.Error, CodecError) as exc:
            raise self._error(exc, session_id, doing) from exc

    def _call(
        self,
        link: _Link,
        session_id: str | None,
        doing: str,
        work: Callable[[psycopg.Connection[Any]], T],
    ) -> T:
        self._check_open()
        return self._ctx.call(link, self._closing, session_id, doing, work)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store on {self.location} is closed; open a new one")

    _valid_id = staticmethod(valid_store_id)

    @staticmethod
    def _storable(session_id: object) -> bool:
        try:
            check_session_id(session_id)
        except (TypeError, ValueError):
            return False
        return True

    # -- transactions --------------------------------------------------------------------

    @staticmethod
    @contextlib.contextmanager
    def _transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
        """BEGIN ... COMMIT, rolled back on an error (unless the connection is gone)."""
        conn.execute("BEGIN")
        try:
            yield
        except BaseException:
            if not conn.broken and not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # -- the Store protocol ----------------------------------------------------------------

    def load(self, session_id: str) -> list[Event]:
        """The stored events of `session_id` in seq order (`[]` for an id no store can hold).

        Raises:
            StoreError: the store is closed, the server could not be reached in
                `timeout`, or a stored event is malformed.
        """
        self._check_open()
        if not self._storable(session_id):
            return []
        query = (
            f"SELECT seq, type, time, data FROM {self._sql.events} "
            "WHERE session_id = %s ORDER BY seq"
        )

        def work(conn: psycopg.Connection[Any]) -> list[Event]:
            rows = conn.execute(query, (session_id,)).fetchall()
            return [event_from_row(*row) for row in rows]

        return self._call(self._main, session_id, "load the session", work)

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        """Store each session's events in one transaction; acknowledged once it committed.

        Per session (see `Store.write`): the events are all stored or none is.
        A session is refused (in the returned dict, the others still commit)
        with:

        * `ConflictError`: a seq is already stored or repeated in the call,
          or another writer holds a live lease on a session this store has
          not claimed;
        * `FencedError` (a `ConflictError`): this store claimed the session
          but its claim was taken over or its lease expired. Checked inside
          the transaction, so nothing of it is stored, however long this
          writer was paused;
        * `StoreError`: the claim's lease could not be renewed in time, so
          the session was failed closed; every later write of it is refused.

        A lost connection before ``COMMIT`` is retried on a new one (nothing
        was stored); a lost connection during ``COMMIT`` is resolved by reading
        the transaction's outcome back from the server.

        Raises:
            StoreError: nothing was stored: a session id is not valid (see
                `nous_actor.core.ids`), a seq does not fit in 64 bits, the store is
                closed, the server was unreachable for `timeout`, or the
                outcome of a commit could not be read back (then the events
                are wholly stored or wholly absent: reload from the store).
        """
        self._check_open()
        batches: list[tuple[str, list[Event]]] = []
        for sid, evs in appends.items():
            if not evs:
                continue
            sid = self._valid_id(sid)
            events = list(evs)
            for ev in events:
                if ev.seq > _MAX_SEQ:
                    raise StoreError(
                        f"seq {ev.seq} does not fit in PostgreSQL's bigint; seqs must be "
                        "below 2**63",
                        session_id=sid,
                    )
            batches.append((sid, events))
        refused: dict[str, StoreError] = {}
        todo: list[tuple[str, list[Event]]] = []
        for sid, events in batches:
            seqs = [ev.seq for ev in events]
            if len(set(seqs)) != len(seqs):
                refused[sid] = ConflictError(
                    "a seq appears twice in this write; reopen the session to continue "
                    "from the store",
                    session_id=sid,
                )
            else:
                todo.append((sid, events))
        if todo:
            refused.update(_Write(self, todo).run())
        return refused

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        """Delete the given seqs of one session (snapshot); unknown seqs are ignored.

        Fenced like a write: under a claim that was taken over, nothing is deleted.

        Raises:
            FencedError: this store's claim on the session is no longer current.
            ConflictError: another writer holds a live lease on the session.
            StoreError: the store failed.
        """
        self._check_open()
        wanted = [s for s in seqs if isinstance(s, int) and 0 <= s <= _MAX_SEQ]
        if not wanted or not self._storable(session_id):
            return
        query = f"DELETE FROM {self._sql.events} WHERE session_id = %s AND seq = ANY(%b)"

        def work(conn: psycopg.Connection[Any]) -> None:
            with self._transaction(conn):
                err = self._fence(conn, [session_id])[0].get(session_id)
                if err is not None:
                    raise err
                conn.execute(query, (session_id, wanted))

        self._call(self._main, session_id, "drop snapshotted events", work)

    def sessions(self) -> list[str]:
        """Ids of every session with at least one stored event, in code point order.

        Raises:
            StoreError: the store failed.
        """
        self._check_open()
        query = f"SELECT DISTINCT session_id FROM {self._sql.events} ORDER BY session_id"
        return self._call(
            self._main,
            None,
            "list sessions",
            lambda conn: [str(r[0]) for r in conn.execute(query)],
        )

    def delete(self, session_id: str) -> None:
        """Delete every event of `session_id` and its claim (this store's, or one `claim`
        would take over: a lapsed lease, or one whose holder's connection is gone).

        A holder is found dead exactly as `claim` finds it (the same check): its
        process died, so the server dropped its connection and the session's lock.

        Raises:
            ConflictError: another live writer holds a lease on the session
                (nothing is deleted).
            StoreError: the store failed.
        """
        self._check_open()
        if not self._storable(session_id):
            return
        mine = self._leases.epoch_of(session_id)
        claims, events = self._sql.claims, self._sql.events

        def work(conn: psycopg.Connection[Any]) -> None:
            with self._transaction(conn):
                row = self._leases.claim_row(conn, session_id)
                if row is not None and row.epoch != mine:
                    self._leases.may_take_over(
                        conn,
                        session_id,
                        row,
                        "cannot delete a session another writer holds",
                        until_commit=True,
                    )
                conn.execute(f"DELETE FROM {events} WHERE session_id = %s", (session_id,))
                conn.execute(f"DELETE FROM {claims} WHERE session_id = %s", (session_id,))

        self._call(self._main, session_id, "delete the session", work)
        self._leases.forget(session_id)

    def claim(self, session_id: str) -> str:
        """Become the one writer of `session_id`: take its lease; returns the token.

        The lease has a new epoch, higher than any before it; from now on every
        write of the session through this store checks that epoch in its own
        transaction. It is renewed in the background while this store is open;
        if it cannot be renewed, the session's writes are refused (failed
        closed) before the lease runs out.

        A lease is taken over when it has expired (by the database's clock), or
        at once when its holder's connection is gone (its process died).

        Raises:
            ConflictError: another live writer holds the session (in this store
                object, or another one anywhere); `holder` and `lease_until`
                name it.
            StoreError: `session_id` is not valid (see `nous_actor.core.ids`), or the
                store failed.
        """
        self._check_open()
        session_id = self._valid_id(session_id)
        return self._leases.claim(session_id)

    def release(self, session_id: str, token: str) -> None:
        """Give up a claim (a no-op if `token` no longer holds it, or the store is closed).

        Raises:
            StoreError: the server could not be told (the lease then lapses by itself).
        """
        if self._closed or not self._storable(session_id):
            return
        self._leases.release(session_id, token)

    # -- extras ------------------------------------------------------------------------

    def index(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """Every stored session's size, next seq, latest time and holder (the name of a
        live lease's holder), sorted by id, in one query; only ids starting with
        ``prefix``, after ``after``, at most ``limit``.

        Used by `nous_actor.store.list_sessions` (which checks the arguments); no event
        is decoded.

        Raises:
            StoreError: the store failed as a whole.
        """
        self._check_open()
        query = (
            "SELECT g.session_id, g.n, g.top, g.last, c.holder FROM "
            f"(SELECT session_id, count(*) AS n, max(seq) AS top, max(time) AS last "
            f"FROM {self._sql.events} WHERE starts_with(session_id, %s) "
            "AND (%s::text IS NULL OR session_id > %s::text) "
            "GROUP BY session_id ORDER BY session_id LIMIT %s) AS g "
            f"LEFT JOIN {self._sql.claims} AS c ON c.session_id = g.session_id "
            "AND c.lease_until > clock_timestamp() ORDER BY g.session_id"
        )

        def work(conn: psycopg.Connection[Any]) -> list[SessionInfo]:
            return [
                SessionInfo(
                    str(sid),
                    int(n),
                    int(top) + 1,
                    _parse_time(last),
                    None,
                    None if holder is None else str(holder),
                )
                for sid, n, top, last, holder in conn.execute(query, (prefix, after, after, limit))
            ]

        return self._call(self._main, None, "list sessions", work)

    def holder_of(self, session_id: str) -> tuple[str, datetime] | None:
        """Who holds a live lease on `session_id` and until when, or `None` if nobody does.

        Raises:
            StoreError: the store failed.
        """
        self._check_open()
        if not self._storable(session_id):
            return None
        query = (
            f"SELECT holder, lease_until FROM {self._sql.claims} "
            "WHERE session_id = %s AND lease_until > clock_timestamp()"
        )

        def work(conn: psycopg.Connection[Any]) -> tuple[str, datetime] | None:
            row = conn.execute(query, (session_id,)).fetchone()
            if row is None:
                return None
            when = _parse_time(row[1])
            assert when is not None
            return str(row[0]), when

        return self._call(self._main, session_id, "read the session's claim", work)

    def watch(
        self, session_id: str, from_seq: int = 0, *, buffer: int = 1000, timeout: float = 30.0
    ) -> PostgresWatch:
        """A live feed of `session_id`'s committed events with ``seq >= from_seq``.

        Every committed event, exactly once, in seq order, from any process
        (this one need not write the session): first those already stored,
        then each one as its transaction commits. ``NOTIFY`` (sent by every
        write, in its transaction) wakes the store's listener connection,
        which reads the rows by seq. Up to ``buffer`` events are read ahead;
        a slow reader is never cut off and never slows a writer: the rows
        wait in the database until it asks for them. A lost listener
        connection is reopened and the feed resumes where it was. Events a
        snapshot dropped before the feed read them are skipped (they are no
        longer stored).

        Raises:
            StoreError: the store is closed or `session_id` is not valid.
            ValueError: `from_seq` is not an int >= 0 or `buffer` not >= 1.
        """
        self._check_open()
        session_id = self._valid_id(session_id)
        if not isinstance(from_seq, int) or isinstance(from_seq, bool) or from_seq < 0:
            raise ValueError(f"from_seq must be an int >= 0, got {from_seq!r}")
        return self._listener().add(session_id, from_seq, buffer, timeout)

    def _listener(self) -> _Listener:
        with self._listener_lock:
            self._check_open()
            if not self._listeners:
                self._listeners.append(_Listener(self))
            return self._listeners[0]

    # -- sharing with other processes (see nous_actor.store.shared) --------------------------

    def load_since(self, session_id: str, from_seq: int) -> list[Event]:
        """The stored events of `session_id` with ``seq >= from_seq``, in seq order, read
        without a claim.

        Raises:
            StoreError: the store is closed or failed, or a stored event is malformed.
        """
        self._check_open()
        if not self._storable(session_id):
            return []
        query = (
            f"SELECT seq, type, time, data FROM {self._sql.events} "
            "WHERE session_id = %s AND seq >= %s ORDER BY seq"
        )

        def work(conn: psycopg.Connection[Any]) -> list[Event]:
            rows = conn.execute(query, (session_id, min(from_seq, _MAX_SEQ))).fetchall()
            return [event_from_row(*row) for row in rows]

        return self._call(self._main, session_id, "load the session", work)

    def held_by(self, session_id: str) -> str | None:
        """The name of the process holding a live lease on `session_id`, or `None`.

        Raises:
            StoreError: the store failed.
        """
        held = self.holder_of(session_id)
        return None if held is None else held[0]

    def ask_handoff(self, session_id: str, seconds: float) -> None:
        """Ask the live holder of `session_id` to hand it over (a ``NOTIFY`` its
        listener hears; a holder that was not listening yet is asked again by the
        asker). ``seconds`` is how long the asker waits (the request itself is not stored).

        Raises:
            StoreError: the id is not valid, or the store failed.
        """
        seconds = check_seconds(seconds, "seconds", 0.0, _MAX_TIMEOUT_S, low_open=False)
        self._notify_request("handoff", session_id, seconds)

    def withdraw_handoff(self, session_id: str) -> None:
        """Take this store's request for `session_id` back (a ``NOTIFY``).

        Raises:
            StoreError: the id is not valid, or the store failed.
        """
        self._notify_request("withdraw", session_id, 0.0)

    def _notify_request(self, kind: str, session_id: str, seconds: float) -> None:
        self._check_open()
        session_id = self._valid_id(session_id)
        body = json.dumps({"s": session_id, "a": self.holder, "t": seconds})
        self._call(
            self._main,
            session_id,
            "ask for the session",
            lambda conn: conn.execute(
                "SELECT pg_notify(%s, %s)", (self._sql.channel, f"{kind} {body}")
            ),
        )

    def handoff_requests(self) -> list[str]:
        """The sessions this store holds that another process asks for (a request heard
        by this store's listener, which starts with the first call, or `wait_changed`,
        or `watch`; an asker asks again until it has the session).

        Raises:
            StoreError: the store is closed.
        """
        return [sid for sid in self._listener().requested() if self._leases.holds(sid)]

    def wait_changed(self, after: int, timeout: float) -> int:
        """Wait at most `timeout` s for a notification (a commit, a release, a request)
        after the counter `after`; returns the counter now.

        Raises:
            StoreError: the store is closed.
        """
        return self._listener().wait_changed(after, timeout)

    def close(self) -> None:
        """Release this store's claims, end its watches, close its connections.

        Later calls raise `StoreError` (`release` is a no-op). Claims that cannot
        be released (the server is gone) lapse by themselves.
        """
        if self._closed:
            return
        self._closed = True
        self._leases.release_all()
        self._finalizer()

    def __repr__(self) -> str:
        return f"<PostgresStore {self.location}>"

    # -- fencing: one check, used by every write transaction -------------------------------

    def _fence(
        self, conn: psycopg.Connection[Any], session_ids: Sequence[str]
    ) -> tuple[dict[str, StoreError], dict[str, int]]:
        """Inside the caller's transaction: lock the sessions' claim rows (``FOR KEY SHARE``)
        and say which sessions may not be written and why, and the epoch each other one
        is written under (its claim's, or 0 for a session this store has not claimed).

        The lock keeps a takeover (which locks the row ``FOR UPDATE``) from
        committing until this transaction ends, so what is checked here holds
        at commit.
        """
        rows = conn.execute(
            f"SELECT session_id, epoch, lease_until > clock_timestamp(), holder, lease_until "
            f"FROM {self._sql.claims} WHERE session_id = ANY(%b) FOR KEY SHARE",
            (list(session_ids),),
        ).fetchall()
        found = {str(r[0]): r for r in rows}
        now = time.monotonic()
        refused: dict[str, StoreError] = {}
        epochs: dict[str, int] = {}
        for sid in session_ids:
            row = found.get(sid)
            mine = self._leases.get(sid)
            if mine is None:
                if row is not None and row[2]:
                    refused[sid] = _held_elsewhere(
                        sid, row[3], row[4], "another writer holds this session's lease"
                    )
                else:
                    epochs[sid] = 0
            elif row is None or row[1] != mine.epoch or not row[2]:
                err: StoreError = _fenced(sid, mine.epoch, row)
                self._leases.lose(sid, mine, err)
                refused[sid] = err
            elif mine.lost is not None:
                refused[sid] = _again(mine.lost, sid)
            elif now >= mine.deadline:
                err = StoreError(
                    "its lease could not be renewed in time, so it was failed closed before "
                    "the lease ran out; restart the session (it reloads from the store)",
                    session_id=sid,
                )
                self._leases.lose(sid, mine, err)
                refused[sid] = err
            else:
                epochs[sid] = mine.epoch
        return refused, epochs


def _parse_time(value: object) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return when.astimezone(UTC) if when.tzinfo is not None else None


def _held_elsewhere(session_id: str, holder: object, until: object, what: str) -> ConflictError:
    when = _parse_time(until)
    shown = when.isoformat(timespec="milliseconds") if when else str(until)
    return ConflictError(
        f"{what}: {holder} holds its lease until {shown} (renewed while it lives); send "
        "the session's work there, or claim it after that writer stops",
        session_id=session_id,
        holder=str(holder),
        lease_until=when,
    )


def _fenced(session_id: str, epoch: int, row: Any) -> FencedError:
    if row is None:
        why = "its claim was removed (the session was deleted or released elsewhere)"
        holder = until = None
    elif row[1] != epoch:
        when = _parse_time(row[4])
        shown = when.isoformat(timespec="milliseconds") if when else str(row[4])
        why = f"{row[3]} took it over (epoch {row[1]}, lease until {shown})"
        holder, until = str(row[3]), when
    else:
        why = "its lease expired (by the database's clock) before it was renewed"
        holder = until = None
    return FencedError(
        f"this writer's claim (epoch {epoch}) is no longer current: {why}; nothing of this "
        "write was stored. Stop the session here: its current writer reloads it from the store",
        session_id=session_id,
        holder=holder,
        lease_until=until,
    )


def _again(err: StoreError, session_id: str) -> StoreError:
    """``err`` once more, for a later write under the same lost claim."""
    if isinstance(err, ConflictError):
        return type(err)(
            err._message,
            session_id=session_id,
            holder=err.holder,
            lease_until=err.lease_until,
        )
    return StoreError(err._message, session_id=session_id)


# -- one write transaction ---------------------------------------------------------------------


class _Unknown(Exception):
    """The connection was lost during COMMIT: the outcome must be read back."""

    def __init__(self, xid: str, cause: BaseException) -> None:
        super().__init__(xid)
        self.xid = xid
        self.cause = cause


class _Write:
    """One `PostgresStore.write`: fence, insert, notify, commit; retried or resolved."""

    def __init__(self, store: PostgresStore, batches: list[tuple[str, list[Event]]]) -> None:
        self.store = store
        self.sids = [sid for sid, _ in batches]
        self.encoded = {
            sid: [(ev.seq, ev.type.value, ev.time, encode_data(ev)) for ev in events]
            for sid, events in batches
        }
        # Of the attempt being committed: who was refused, and the epoch of each row.
        self.refused: dict[str, StoreError] = {}
        self.epochs: dict[str, int] = {}

    def run(self) -> dict[str, StoreError]:
        store = self.store
        deadline = time.monotonic() + store.timeout
        delay = 0.0
        sid = self.sids[0] if len(self.sids) == 1 else None
        while True:
            with store._main.lock:
                store._check_open()
                conn = store._main.get(deadline)
                try:
                    return self._attempt(conn)
                except _Unknown as unknown:
                    store._main.drop()
                    if self._resolve(unknown, deadline):
                        return self.refused
                    # It did not commit: nothing was stored, so try again.
                except (psycopg.Error, CodecError) as exc:
                    lost = isinstance(exc, psycopg.Error) and _lost_connection(exc, conn)
                    if lost:
                        store._main.drop()  # nothing was committed: try again
                    if not lost or time.monotonic() + delay >= deadline:
                        raise store._error(exc, sid, "append events") from exc
                    _connection_lost(store.location, "main", "append events", exc)
            store._closing.wait(delay)
            delay = min(max(delay * 2, 0.02), 1.0)

    def _attempt(self, conn: psycopg.Connection[Any]) -> dict[str, StoreError]:
        store = self.store
        conn.execute("BEGIN")
        try:
            self.refused, self.epochs = store._fence(conn, self.sids)
            if not self.epochs:
                conn.execute("ROLLBACK")
                return self.refused
            try:
                xid = self._insert(conn, list(self.epochs))
            except psycopg.errors.UniqueViolation:
                conn.execute("ROLLBACK")
                return self._one_by_one(conn)
        except BaseException:
            self._rollback(conn)
            raise
        self._commit(conn, xid)
        return self.refused

    @staticmethod
    def _rollback(conn: psycopg.Connection[Any]) -> None:
        if not conn.broken and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")

    def _commit(self, conn: psycopg.Connection[Any], xid: str) -> None:
        try:
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            if _lost_connection(exc, conn):
                raise _Unknown(xid, exc) from exc
            raise

    def _rows(self, sids: Sequence[str]) -> tuple[list[Any], ...]:
        cols: tuple[list[Any], ...] = ([], [], [], [], [], [])
        for sid in sids:
            epoch = self.epochs[sid]
            for seq, etype, when, data in self.encoded[sid]:
                cols[0].append(sid)
                cols[1].append(seq)
                cols[2].append(epoch)
                cols[3].append(etype)
                cols[4].append(when)
                cols[5].append(data)
        return cols

    def _wakeups(self, sids: Sequence[str]) -> list[str]:
        """The NOTIFY payloads: ``"<last seq> <session id>"`` for each session written."""
        return [f"{max(r[0] for r in self.encoded[sid])} {sid}" for sid in sids]

    def _insert(self, conn: psycopg.Connection[Any], sids: Sequence[str]) -> str:
        """Insert the sessions' rows and queue their wake-ups; returns the transaction id."""
        q = self.store._sql
        row = conn.execute(
            f"WITH ins AS (INSERT INTO {q.events} (session_id, seq, epoch, type, time, data) "
            "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::text[], "
            "%b::timestamptz[], %b::text[]) RETURNING 1), "
            "woke AS (SELECT pg_notify(%b, p) FROM unnest(%b::text[]) AS p) "
            "SELECT pg_current_xact_id()::text, (SELECT count(*) FROM ins), "
            "(SELECT count(*) FROM woke)",
            (*self._rows(sids), q.channel, self._wakeups(sids)),
        ).fetchone()
        assert row is not None
        return str(row[0])

    def _one_by_one(self, conn: psycopg.Connection[Any]) -> dict[str, StoreError]:
        """The slow path after a conflict: each session in a savepoint of its own."""
        store = self.store
        q = store._sql
        conn.execute("BEGIN")
        try:
            self.refused, self.epochs = store._fence(conn, self.sids)
            for sid in list(self.epochs):
                conn.execute("SAVEPOINT session_write")
                try:
                    conn.execute(
                        f"INSERT INTO {q.events} (session_id, seq, epoch, type, time, data) "
                        "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bigint[], "
                        "%b::text[], %b::timestamptz[], %b::text[])",
                        self._rows([sid]),
                    )
                except psycopg.errors.UniqueViolation:
                    conn.execute("ROLLBACK TO SAVEPOINT session_write")
                    del self.epochs[sid]
                    self.refused[sid] = ConflictError(
                        "a seq in this write is already stored (a second writer?); reopen "
                        "the session to continue from the store",
                        session_id=sid,
                    )
                conn.execute("RELEASE SAVEPOINT session_write")
            if not self.epochs:
                conn.execute("ROLLBACK")
                return self.refused
            row = conn.execute(
                "SELECT pg_current_xact_id()::text, count(pg_notify(%b, p)) "
                "FROM unnest(%b::text[]) AS p",
                (q.channel, self._wakeups(list(self.epochs))),
            ).fetchone()
            assert row is not None
        except BaseException:
            self._rollback(conn)
            raise
        self._commit(conn, str(row[0]))
        return self.refused

    def _resolve(self, unknown: _Unknown, deadline: float) -> bool:
        """Read back a commit whose answer was lost: whether it committed.

        First the transaction's status (``pg_xact_status``), then its rows with
        their epoch, which must agree.

        Raises:
            StoreError: the outcome could not be read back in time.
        """
        store = self.store
        q = store._sql
        logger.warning(
            "store.commit_outcome_unknown",
            store=store.location,
            xid=unknown.xid,
            reason=_first_line(unknown.cause),
        )
        cols = self._rows(list(self.epochs))
        want = len(cols[0])
        delay = 0.02
        last: BaseException = unknown.cause
        while time.monotonic() < deadline and not store._closing.is_set():
            try:
                conn = store._main.get(deadline)
                status_row = conn.execute(
                    "SELECT pg_xact_status(%s::xid8)", (unknown.xid,)
                ).fetchone()
                status = None if status_row is None else status_row[0]
                if status == "in progress":  # the old backend has not finished yet
                    store._closing.wait(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                found_row = conn.execute(
                    f"SELECT count(*) FROM {q.events} AS e JOIN unnest(%b::text[], "
                    "%b::bigint[], %b::bigint[]) AS u(sid, seq, epoch) "
                    "ON e.session_id = u.sid AND e.seq = u.seq AND e.epoch = u.epoch",
                    (cols[0], cols[1], cols[2]),
                ).fetchone()
                found = 0 if found_row is None else int(found_row[0])
            except psycopg.Error as exc:
                last = exc
                store._main.drop()
                store._closing.wait(delay)
                delay = min(delay * 2, 0.5)
                continue
            except StoreError as exc:
                last = exc
                break
            if status in ("committed", None) and found == want:
                logger.info("store.commit_outcome_read_back", xid=unknown.xid, committed=True)
                return True
            if status in ("aborted", None) and found == 0:
                logger.info("store.commit_outcome_read_back", xid=unknown.xid, committed=False)
                return False
            last = StoreError(
                f"transaction {unknown.xid} is {status!r} but {found} of its {want} rows "
                "are stored (dropped or deleted since?)"
            )
            break
        raise StoreError(
            f"the connection to {store.location} was lost while committing, and the outcome "
            f"could not be read back ({_first_line(last)}): the events are wholly stored or "
            "wholly absent; restart the sessions to reload them from the store"
        ) from unknown.cause


# -- claims and leases ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ClaimRow:
    """A session's row in the claims table, as `_Leases.claim_row` reads it."""

    epoch: int
    token: str
    holder: str
    until: object  # lease_until, as the server's text
    live: bool  # lease_until > clock_timestamp(), by the database's clock
    locked: bool  # its holder took the session's advisory lock (so a free lock means it died)


class _Leases:
    """The claims of one store: its lease connection, and the thread that renews them.

    Holds no reference to the store itself, so that a store nobody uses is
    collected (and its finalizer stops the renewer).
    """

    def __init__(self, store: PostgresStore) -> None:
        self.ctx = store._ctx
        self.lease = store.lease
        self.timeout = store.timeout
        self.holder = store.holder
        self.where = store.location
        self.detect_dead = store.detect_dead_holders
        self.claim_wait_ms = store._claim_wait_ms
        self.claims_table = store._sql.claims
        self.epochs_name = store._sql.epochs
        self.key_prefix = f"{store.schema}\x1f"
        self.channel = store._sql.channel
        self.closing = store._closing
        self.mutex = threading.Lock()
        self.claims: dict[str, _Claim] = {}
        self.pending: set[str] = set()
        self.link = _Link("lease", self.ctx.reconnect, self.where, self.closing, self._relock)
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.renewals = 0

    # -- the store's view ----------------------------------------------------------------

    def get(self, session_id: str) -> _Claim | None:
        with self.mutex:
            return self.claims.get(session_id)

    def holds(self, session_id: str) -> bool:
        """Whether this store holds a claim on ``session_id`` that is not known lost."""
        with self.mutex:
            c = self.claims.get(session_id)
            return c is not None and c.lost is None

    def epoch_of(self, session_id: str) -> int | None:
        with self.mutex:
            c = self.claims.get(session_id)
            return None if c is None else c.epoch

    def lose(self, session_id: str, claim: _Claim, err: StoreError) -> None:
        with self.mutex:
            if claim.lost is None:
                claim.lost = err
        logger.warning(
            "store.claim_lost",
            session_id=session_id,
            epoch=claim.epoch,
            reason=type(err).__name__,
            error=str(err),
        )

    def forget(self, session_id: str) -> None:
        """The session was deleted: its claim (if ours) is gone from the database too."""
        with self.mutex:
            claim = self.claims.pop(session_id, None)
        if claim is not None and claim.locked:
            self._unlock(session_id)

    # -- one call on the lease connection ----------------------------------------------------

    def _call(
        self, session_id: str | None, doing: str, work: Callable[[psycopg.Connection[Any]], T]
    ) -> T:
        return self.ctx.call(self.link, self.closing, session_id, doing, work)

    def _key(self) -> str:
        return "hashtextextended(%s || %s, 0)"

    def _relock(self, conn: psycopg.Connection[Any]) -> None:
        """A new lease connection holds no advisory lock: take those of our claims again."""
        with self.mutex:
            held = list(self.claims.items())
        for sid, claim in held:
            row = conn.execute(
                f"SELECT pg_try_advisory_lock({self._key()})", (self.key_prefix, sid)
            ).fetchone()
            claim.locked = bool(row and row[0])

    def _unlock(self, session_id: str) -> None:
        with contextlib.suppress(StoreError, psycopg.Error), self.link.lock:
            conn = self.link.conn
            if conn is not None and not conn.broken and not conn.closed:
                conn.execute(
                    f"SELECT pg_advisory_unlock({self._key()})", (self.key_prefix, session_id)
                )

    # -- claim and release -------------------------------------------------------------------

    def claim(self, session_id: str) -> str:
        with self.mutex:
            if session_id in self.claims or session_id in self.pending:
                raise ConflictError(
                    f"already has a live writer through this store object ({self.holder}); "
                    "use that session's handle, or stop it first",
                    session_id=session_id,
                    holder=self.holder,
                )
            self.pending.add(session_id)
        token = uuid.uuid4().hex
        try:
            started = time.monotonic()
            epoch, locked = self._call(
                session_id, "claim the session", lambda conn: self._take(conn, session_id, token)
            )
            with self.mutex:
                self.claims[session_id] = _Claim(
                    token, epoch, started + self.lease * _FAIL_CLOSED_FRACTION, locked
                )
        finally:
            with self.mutex:
                self.pending.discard(session_id)
        self._start_renewer()
        return token

    def _take(self, conn: psycopg.Connection[Any], sid: str, token: str) -> tuple[int, bool]:
        """One claim transaction: returns (epoch, advisory lock held).

        The claim row records whether its holder holds the session's advisory
        lock (``locked``): only then does a free lock mean a dead holder. A
        writer that took over an expired lease whose old holder still held the
        lock records ``false`` (and takes the lock later, at a renewal).
        """
        table = self.claims_table
        lease = f"clock_timestamp() + make_interval(secs => {self.lease!r})"
        locked = tried = False

        def lock() -> bool:
            nonlocal locked, tried
            if self.detect_dead and not tried:
                tried = True
                locked = self._try_lock(conn, sid)
            return locked

        conn.execute("BEGIN")
        try:
            conn.execute(f"SET LOCAL lock_timeout = {self.claim_wait_ms}")
            for _ in range(3):
                row = self.claim_row(conn, sid)
                if row is None:
                    new = conn.execute(
                        f"INSERT INTO {table} (session_id, epoch, token, holder, claimed_at, "
                        f"lease_until, locked) VALUES (%s, nextval(%s::regclass), %s, %s, "
                        f"clock_timestamp(), {lease}, %s) ON CONFLICT (session_id) DO NOTHING "
                        "RETURNING epoch",
                        (sid, self.epochs_name, token, self.holder, lock()),
                    ).fetchone()
                    if new is None:
                        continue  # another claimer inserted it meanwhile: look again
                    epoch = int(new[0])
                    break
                if (
                    row.token == token
                ):  # our own claim, committed by an attempt whose answer was lost
                    epoch = row.epoch
                    conn.execute(
                        f"UPDATE {table} SET locked = %s WHERE session_id = %s", (lock(), sid)
                    )
                    break
                reason = self.may_take_over(
                    conn, sid, row, "already has a live writer elsewhere", lock=lock
                )
                lock()  # the new claim holds the session's lock (taken above if its holder died)
                logger.warning(
                    "store.claim_taken_over",
                    session_id=sid,
                    reason=reason,
                    holder=row.holder,
                    epoch=row.epoch,
                )
                new = conn.execute(
                    f"UPDATE {table} SET epoch = nextval(%s::regclass), token = %s, "
                    f"holder = %s, claimed_at = clock_timestamp(), lease_until = {lease}, "
                    "locked = %s WHERE session_id = %s RETURNING epoch",
                    (self.epochs_name, token, self.holder, locked, sid),
                ).fetchone()
                assert new is not None
                epoch = int(new[0])
                break
            else:
                raise StoreError("the claim row kept changing; retry", session_id=sid)
            conn.execute("COMMIT")
        except BaseException:
            if not conn.broken and not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
                    if locked:
                        conn.execute(
                            f"SELECT pg_advisory_unlock({self._key()})", (self.key_prefix, sid)
                        )
            raise
        return epoch, locked

    def _try_lock(
        self, conn: psycopg.Connection[Any], sid: str, *, until_commit: bool = False
    ) -> bool:
        """Take the session's advisory lock if it is free: session-level (it outlives the
        transaction, until unlocked), or with ``until_commit`` only until the transaction ends.
        """
        take = "pg_try_advisory_xact_lock" if until_commit else "pg_try_advisory_lock"
        row = conn.execute(f"SELECT {take}({self._key()})", (self.key_prefix, sid)).fetchone()
        return bool(row and row[0])

    # -- whether a claim may be taken over: one check, for claim and delete ---------------------

    def claim_row(self, conn: psycopg.Connection[Any], sid: str) -> _ClaimRow | None:
        """Inside the caller's transaction: the session's claim row, locked ``FOR UPDATE``
        (so no other claim, renewal or delete changes it until the transaction ends), or
        `None` if nobody claims the session."""
        row = conn.execute(
            "SELECT epoch, token, holder, lease_until, lease_until > clock_timestamp(), "
            f"locked FROM {self.claims_table} WHERE session_id = %s FOR UPDATE",
            (sid,),
        ).fetchone()
        if row is None:
            return None
        return _ClaimRow(int(row[0]), str(row[1]), str(row[2]), row[3], bool(row[4]), bool(row[5]))

    def may_take_over(
        self,
        conn: psycopg.Connection[Any],
        sid: str,
        row: _ClaimRow,
        refusal: str,
        *,
        lock: Callable[[], bool] | None = None,
        until_commit: bool = False,
    ) -> str:
        """Whether another writer's claim ``row`` (from `claim_row`, in the same
        transaction) may be taken over or removed; returns why it may:
        ``"lease_expired"`` (by the database's clock) or ``"holder_connection_gone"``.

        A live lease's holder is dead when its row records that it holds the
        session's advisory lock and this connection can take that lock now: the
        server drops a connection's locks when its process dies, while a paused or
        partitioned holder keeps its own. Never so with dead-holder detection off.
        The lock is taken by ``lock`` (a claim's, which keeps it), or else until
        the transaction ends (``until_commit``) or until unlocked.

        Raises:
            ConflictError: the lease is live and its holder's connection is not known
                to be gone (the message starts with ``refusal`` and names the holder).
        """
        if not row.live:
            return "lease_expired"
        if row.locked and self.detect_dead:
            if lock is not None:
                gone = lock()
            else:
                gone = self._try_lock(conn, sid, until_commit=until_commit)
            if gone:
                return "holder_connection_gone"
        raise _held_elsewhere(sid, row.holder, row.until, refusal)

    def release(self, session_id: str, token: str) -> None:
        with self.mutex:
            claim = self.claims.get(session_id)
            if claim is not None and claim.token == token:
                del self.claims[session_id]
            else:
                claim = None
        if claim is None:
            return
        table = self.claims_table

        def work(conn: psycopg.Connection[Any]) -> None:
            # The release commits with its notice: an asker waiting for the session
            # (open(id, wait=...)) tries it at once.
            conn.execute(
                f"WITH gone AS (DELETE FROM {table} WHERE session_id = %s AND token = %s "
                "RETURNING session_id) SELECT pg_notify(%s, 'released ' || session_id) FROM gone",
                (session_id, token, self.channel),
            )
            if claim.locked:
                claim.locked = False
                conn.execute(
                    f"SELECT pg_advisory_unlock({self._key()})", (self.key_prefix, session_id)
                )

        self._call(session_id, "release the session", work)

    def release_all(self) -> None:
        """Closing: give every claim up at once (best effort: a lease left lapses by itself)."""
        with self.mutex:
            claims, self.claims = self.claims, {}
        if not claims:
            return
        table = self.claims_table
        with contextlib.suppress(Exception), self.link.lock:
            conn = self.link.conn
            if conn is not None and not conn.broken and not conn.closed:
                conn.execute(
                    f"DELETE FROM {table} AS c USING unnest(%b::text[], %b::text[]) AS u(s, t) "
                    "WHERE c.session_id = u.s AND c.token = u.t",
                    (list(claims), [c.token for c in claims.values()]),
                )

    # -- renewing ---------------------------------------------------------------------------

    def _start_renewer(self) -> None:
        with self.mutex:
            if self.thread is not None:
                return
            self.thread = threading.Thread(
                target=self._run, name="nous-postgres-leases", daemon=True
            )
        self.thread.start()

    def _run(self) -> None:
        interval = self.lease * _RENEW_FRACTION
        delay = interval
        while not self.closing.wait(delay):
            with self.mutex:
                items = [(sid, c) for sid, c in self.claims.items() if c.lost is None]
            if not items:
                delay = interval
                continue
            started = time.monotonic()
            try:
                renewed, current = self._renew(items)
            except Exception as exc:  # the connection is gone: retry soon, fail closed later
                logger.warning(
                    "store.lease_renewal_failed",
                    store=self.where,
                    sessions=len(items),
                    reason=type(exc).__name__,
                    error=_first_line(exc),
                )
                delay = min(interval, max(0.05, interval / 4))
                continue
            self.renewals += 1
            for sid, claim in items:
                with self.mutex:
                    if self.claims.get(sid) is not claim:
                        continue  # released meanwhile
                    if sid in renewed:
                        claim.deadline = started + self.lease * _FAIL_CLOSED_FRACTION
                        continue
                self.lose(sid, claim, _fenced(sid, claim.epoch, current.get(sid)))
            delay = interval

    def _renew(self, items: list[tuple[str, _Claim]]) -> tuple[set[str], dict[str, Any]]:
        table = self.claims_table
        sids = [sid for sid, _ in items]
        epochs = [c.epoch for _, c in items]

        def work(conn: psycopg.Connection[Any]) -> tuple[set[str], dict[str, Any]]:
            if self.detect_dead:  # a lock not taken at the claim (its old holder had it)
                for sid, claim in items:
                    if not claim.locked:
                        claim.locked = self._try_lock(conn, sid)
            rows = conn.execute(
                f"UPDATE {table} AS c SET lease_until = clock_timestamp() + "
                f"make_interval(secs => {self.lease!r}), locked = u.l "
                "FROM unnest(%b::text[], %b::bigint[], %b::bool[]) AS u(s, e, l) "
                "WHERE c.session_id = u.s AND c.epoch = u.e "
                "AND c.lease_until > clock_timestamp() RETURNING c.session_id",
                (sids, epochs, [c.locked for _, c in items]),
            ).fetchall()
            renewed = {str(r[0]) for r in rows}
            lost = [sid for sid in sids if sid not in renewed]
            current: dict[str, Any] = {}
            if lost:
                for r in conn.execute(
                    f"SELECT session_id, epoch, lease_until > clock_timestamp(), holder, "
                    f"lease_until FROM {table} WHERE session_id = ANY(%b)",
                    (lost,),
                ):
                    current[str(r[0])] = r
            return renewed, current

        return self._call(None, "renew leases", work)

    def stop(self) -> None:
        self.closing.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.timeout)
        with self.link.lock:
            self.link.drop()


# -- live feeds across processes ---------------------------------------------------------------


class PostgresWatch(FollowedWatch):
    """A live feed of one session's committed events, read from PostgreSQL.

    A `nous_actor.Subscription` (``get(timeout)``, ``get_nowait()``,
    ``for ev in watch``, ``async for``, ``close()``), fed by the store's
    listener: every committed event with ``seq >= from_seq`` exactly once, in
    seq order. At most ``buffer`` events are held in memory; the rest wait in
    the database, so the feed is never cut off as lagging. It ends (after the
    pending events) when closed, or when its store closes (then with
    `StoreError`).
    """

    def __init__(
        self,
        listener: _Listener,
        session_id: str,
        from_seq: int,
        buffer: int,
        timeout: float,
    ) -> None:
        super().__init__(session_id, from_seq, buffer, timeout, listener.remove, listener.poke)
        self.dirty = True  # the listener's: there may be rows to read


class _Listener:
    """One store's listening connection and its thread, feeding every watch of the store."""

    def __init__(self, store: PostgresStore) -> None:
        self.where = store.location
        self.channel = store._sql.channel
        self.events_table = store._sql.events
        self.closing = store._closing
        self.mutex = threading.Lock()
        self.watches: dict[str, list[PostgresWatch]] = {}
        self.link = _Link("listen", store._ctx.reconnect, store.location, store._closing)
        self.fresh = True
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.ended: StoreError | None = None
        # Change counter (every notification, every reconnect) for wait_changed, and the
        # sessions this store holds that another process asked for (ask_handoff).
        self.changed = threading.Condition(self.mutex)
        self.version = 0
        self.asked: dict[str, dict[str, float]] = {}  # id -> {asker: until (monotonic)}
        self.me = store.holder
        self.thread = threading.Thread(target=self._run, name="nous-postgres-listen", daemon=True)
        self.thread.start()

    def add(self, session_id: str, from_seq: int, buffer: int, timeout: float) -> PostgresWatch:
        w = PostgresWatch(self, session_id, from_seq, buffer, timeout)
        with self.mutex:
            if self.ended is not None:
                raise self.ended
            self.watches.setdefault(session_id, []).append(w)
        self.poke()
        return w

    def remove(self, sub: Subscription) -> None:
        with self.mutex:
            ws = self.watches.get(sub.session_id, [])
            if sub in ws:
                ws.remove(sub)
            if not ws:
                self.watches.pop(sub.session_id, None)

    def poke(self) -> None:
        with contextlib.suppress(OSError):
            self.wake_w.send(b"x")

    def _all(self) -> list[PostgresWatch]:
        with self.mutex:
            return [w for ws in self.watches.values() for w in ws]

    def _run(self) -> None:
        delay = 0.05
        while not self.closing.is_set():
            try:
                conn = self.link.get(time.monotonic() + 5.0)
            except StoreError as exc:
                _connection_lost(self.where, "listen", "watch sessions", exc)
                self.closing.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                if self.fresh:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.fresh = False
                    for w in self._all():  # notifications may have been missed: read again
                        w.dirty = True
                    self._bump()
                self._serve(conn)
                delay = 0.05
            except (psycopg.Error, OSError, CodecError) as exc:
                if self.closing.is_set():
                    break
                _connection_lost(self.where, "listen", "watch sessions", exc)
                self.link.drop()
                self.fresh = True
                self.closing.wait(delay)
                delay = min(delay * 2, 5.0)
        self._end(StoreError(f"the store on {self.where} was closed; the watch has ended"))

    def _serve(self, conn: psycopg.Connection[Any]) -> None:
        """Read notifications and rows until the connection fails or the store closes."""
        query = (
            f"SELECT seq, type, time, data FROM {self.events_table} "
            "WHERE session_id = %s AND seq >= %s ORDER BY seq LIMIT %s"
        )
        while not self.closing.is_set():
            for n in conn.notifies(timeout=0):
                self._note(n.payload)
            more = False
            for w in self._all():
                if not w.dirty:
                    continue
                room = w.room()
                if room <= 0:
                    continue
                rows = conn.execute(query, (w.session_id, w.next_fetch, room)).fetchall()
                events = [event_from_row(*r) for r in rows]
                if events:
                    w.next_fetch = events[-1].seq + 1
                    w.deliver(events)
                if len(rows) < room:
                    w.dirty = False
                else:
                    more = True
            if more:
                continue
            ready, _, _ = select.select(
                [conn.fileno(), self.wake_r.fileno()], [], [], _IDLE_CHECK_S
            )
            with contextlib.suppress(OSError):
                while self.wake_r.recv(4096):
                    pass
            if not ready:
                conn.execute("SELECT 1")  # an idle connection may be dead: find out

    def _bump(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def wait_changed(self, after: int, timeout: float) -> int:
        deadline = time.monotonic() + max(timeout, 0.0)
        with self.changed:
            while self.version <= after and self.ended is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(left)
            if self.ended is not None:
                raise self.ended
            return self.version

    def _note(self, payload: str) -> None:
        last, _, sid = payload.partition(" ")
        if last in ("handoff", "withdraw"):  # a request for a session (see ask_handoff)
            self._request(last, sid)
            self._bump()
            return
        self._bump()
        try:
            top = int(last)
        except ValueError:  # "released <id>": a change, nothing to read
            return
        with self.mutex:
            for w in self.watches.get(sid, ()):
                if top >= w.next_fetch:
                    w.dirty = True

    def _request(self, kind: str, body: str) -> None:
        try:
            req = json.loads(body)
            sid, asker, seconds = str(req["s"]), str(req["a"]), float(req["t"])
        except (ValueError, KeyError, TypeError):
            return  # not ours to read
        if asker == self.me:
            return  # this store's own request
        with self.mutex:
            now = time.monotonic()
            askers = self.asked.setdefault(sid, {})
            if kind == "withdraw":
                askers.pop(asker, None)
            else:
                askers[asker] = now + seconds
            for a in [a for a, until in askers.items() if until <= now]:
                del askers[a]
            if not askers:
                del self.asked[sid]

    def requested(self) -> list[str]:
        """The sessions some other store asks for now."""
        now = time.monotonic()
        with self.mutex:
            return sorted(
                sid for sid, askers in self.asked.items() if any(u > now for u in askers.values())
            )

    def _end(self, err: StoreError) -> None:
        with self.mutex:
            self.ended = err
            watches = [w for ws in self.watches.values() for w in ws]
            self.watches.clear()
            self.changed.notify_all()
        for w in watches:
            w._finish(err)

    def stop(self) -> None:
        self.closing.set()
        self.poke()
        if self.thread is not threading.current_thread():
            self.thread.join(5.0)
        self._end(StoreError(f"the store on {self.where} was closed; the watch has ended"))
        with self.link.lock:
            self.link.drop()
        for s in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                s.close()


def _shutdown(
    closing: threading.Event, main: _Link, leases: _Leases, listeners: list[_Listener]
) -> None:
    """Stop a store's threads and close its connections (on close, or when collected)."""
    closing.set()
    leases.stop()
    for listener in listeners:
        listener.stop()
    with main.lock:
        main.drop()
