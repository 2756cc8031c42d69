"""Connections of `nous_actor.store.postgres`: one reopened with backoff, the watchdog that
bounds every statement on the client, and the context.

`_Connection` is psycopg's connection with a way to cut it from another thread;
`_Watchdog` cuts a connection whose call outlives its deadline (psycopg waits for an
answer for ever: a network partition, a stopped server); `_Link` is one connection
used under a lock and reopened (with backoff) when lost; `_Context` is what every
part of a store shares: how to connect within a deadline, with the session settings
each call relies on, how to word a backend error as a `StoreError` (the one place
psycopg's errors are translated), and how to run a call that is retried on a new
connection.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Final, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg.pq
from psycopg.types.string import TextLoader

from nous_actor.core.codec import CodecError
from nous_actor.errors import StoreError
from nous_actor.runtime import forks
from nous_actor.store.postgres.failures import (
    _PERMANENT_CONNECT_SQLSTATES,
    _connection_lost,
    _describe,
    _first_line,
    _lost_connection,
    _sqlstate,
)

T = TypeVar("T")

# -- transactions ---------------------------------------------------------------------------


def _rollback(conn: psycopg.Connection[Any]) -> bool:
    """Roll back the transaction an error left open, quietly; whether it was rolled back
    (never on a connection that is gone)."""
    if conn.broken or conn.closed:
        return False
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        return False
    return True


@contextlib.contextmanager
def _transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """BEGIN ... COMMIT, rolled back on an error (unless the connection is gone)."""
    conn.execute("BEGIN")
    try:
        yield
    except BaseException:
        _rollback(conn)
        raise
    conn.execute("COMMIT")


# -- a connection that another thread can cut, and the watchdog that does -----------------

_CUT_MARGIN_S: Final = 0.5
"""How long past a call's deadline its connection is cut, at most (``timeout`` itself when
shorter): the server's own bounds of a statement (``statement_timeout`` and
``lock_timeout``, both ``timeout``) fire first and answer on a live connection, which is
kept; only a server that does not answer at all loses it."""


def _cut_margin(timeout: float) -> float:
    return min(timeout, _CUT_MARGIN_S)


class _Connection(psycopg.Connection[Any]):
    """A store's connection: psycopg's, which another thread can cut (`cut`).

    It keeps a duplicate of its socket (``twin``, made when connected): shutting the
    twin down ends the connection for libpq at once (its wait for an answer returns,
    and the connection is broken), whatever the server or the network does. Being a
    duplicate, the twin names this connection's socket even after libpq closed its own
    descriptor (whose number may then be another connection's).
    """

    twin: socket.socket | None = None
    cut_after: float | None = None
    """Set once cut: how long (seconds) its call had waited."""

    def keep_twin(self) -> None:
        with contextlib.suppress(OSError):  # (where a socket cannot be duplicated: see cut)
            self.twin = socket.socket(fileno=os.dup(self.fileno()))

    def cut(self, waited: float) -> None:
        self.cut_after = waited
        with contextlib.suppress(OSError, psycopg.Error):
            if self.twin is not None:
                self.twin.shutdown(socket.SHUT_RDWR)
            else:  # libpq's own descriptor: still this connection's while its call waits
                sock = socket.socket(fileno=self.fileno())
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                finally:
                    sock.detach()

    def close(self) -> None:
        try:
            super().close()
        finally:
            twin, self.twin = self.twin, None
            if twin is not None:
                twin.close()


def _was_cut(conn: psycopg.Connection[Any] | None) -> float | None:
    """How long the call of ``conn`` had waited when the watchdog cut it (`None`: not cut)."""
    return conn.cut_after if isinstance(conn, _Connection) else None


class _Watchdog:
    """Bounds every call of a store on the client: a connection whose call outlives its
    deadline is cut (`_Connection.cut`), so psycopg's wait for the answer ends with an
    error (a lost connection, which the caller handles as it handles any: reconnect and
    retry what cannot have committed, read a commit's outcome back) whatever the server
    or the network does (a partition that drops every packet, a stopped server).

    One thread per store, started by its first call and asleep until the soonest
    deadline; after `stop` it ends once no call is bounded. (A store made before a fork
    refuses calls in the child, so the child never needs its parent's thread.)
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.cond = threading.Condition(threading.Lock())
        # key -> (deadline, when armed, connection, its name, what the call does)
        self.armed: dict[int, tuple[float, float, psycopg.Connection[Any], str, str]] = {}
        self.keys = itertools.count()
        self.wake_at = math.inf
        self.running = False
        self.stopped = False

    @contextlib.contextmanager
    def bound(
        self, conn: psycopg.Connection[Any], until: float, name: str, doing: str
    ) -> Iterator[None]:
        """Run the ``with`` body; ``conn`` is cut if it has not ended by ``until``
        (`time.monotonic`)."""
        key = next(self.keys)
        with self.cond:
            self.armed[key] = (until, time.monotonic(), conn, name, doing)
            if not self.running:
                self.running = True
                threading.Thread(
                    target=self._run, name="nous-postgres-watchdog", daemon=True
                ).start()
            elif until < self.wake_at:
                self.cond.notify()
        try:
            yield
        finally:
            with self.cond:
                self.armed.pop(key, None)  # (gone once cut)

    def _run(self) -> None:
        cut: list[tuple[str, str, float]] = []
        while True:
            for name, doing, waited in cut:  # logged off the lock
                _connection_lost(
                    self.where,
                    name,
                    doing,
                    TimeoutError(f"no answer from the server in {waited:.3g} s: cut off"),
                )
            with self.cond:
                cut = self._cut_due()
                if cut:
                    continue
                if self.stopped and not self.armed:
                    self.running = False
                    return
                now = time.monotonic()
                self.cond.wait(None if self.wake_at == math.inf else self.wake_at - now)

    def _cut_due(self) -> list[tuple[str, str, float]]:
        """Under the lock: cut every connection past its deadline (its owner, which
        closes it only once its bound ended, cannot close it meanwhile); note the
        soonest deadline left in ``wake_at``."""
        now = time.monotonic()
        soonest = math.inf
        cut = []
        for key, (until, armed, conn, name, doing) in list(self.armed.items()):
            if until > now:
                soonest = min(soonest, until)
                continue
            del self.armed[key]
            if isinstance(conn, _Connection):
                conn.cut(now - armed)
            cut.append((name, doing, now - armed))
        self.wake_at = soonest
        return cut

    def stop(self) -> None:
        """End the thread once no call is bounded (a later call starts it again)."""
        with self.cond:
            self.stopped = True
            self.cond.notify()


# -- connecting within a deadline ------------------------------------------------------------


class _Opening:
    """One connection being made on a thread of its own (see `_within`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.conn: _Connection | None = None
        self.error: BaseException | None = None
        self.abandoned = False

    def run(self, make: Callable[[], _Connection]) -> None:
        conn: _Connection | None = None
        error: BaseException | None = None
        try:
            conn = make()
        except BaseException as exc:
            error = exc
        with self.lock:
            keep = not self.abandoned
            if keep:
                self.conn, self.error = conn, error
        if not keep and conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self.done.set()

    def take(self) -> _Connection | None:
        """The connection if made (raising its error if it failed), else `None`, and
        then whatever is made later is closed."""
        with self.lock:
            if not self.done.is_set():
                self.abandoned = True
                return None
        if self.error is not None:
            raise self.error
        return self.conn


def _within(
    make: Callable[[], _Connection], deadline: float, closing: threading.Event | None = None
) -> _Connection:
    """``make()``, waited for until ``deadline`` (`time.monotonic`): it runs on a thread of
    its own, because psycopg's own bound of a connection attempt (``connect_timeout``)
    is whole seconds, 2 at least, for each of the DSN's hosts, and the host name's
    resolution has none. A connection made too late is closed as soon as it is made
    (the attempt ends within its own bounds). The wait ends early once ``closing`` is
    set (the store closes).

    Raises:
        psycopg.Error: ``make`` failed, or had not succeeded by ``deadline``.
    """
    opening = _Opening()
    started = time.monotonic()
    threading.Thread(
        target=opening.run, args=(make,), name="nous-postgres-connect", daemon=True
    ).start()
    try:
        while not opening.done.wait(min(_CLOSING_POLL_S, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or (closing is not None and closing.is_set()):
                break
    finally:
        conn = opening.take()
    if conn is None:
        raise _NotInTime(
            f"no connection within {time.monotonic() - started:.3g} s (the server or the "
            "network does not answer)"
        )
    return conn


class _NotInTime(psycopg.OperationalError):
    """No connection was made by the deadline (`_within`): nothing the server said."""


_CLOSING_POLL_S: Final = 0.05  # how often a wait for a connection looks whether the store closes


def _refusal(exc: BaseException) -> str | None:
    """The SQLSTATE of why the server refused a connection, if known: libpq gives none
    for a connection it could not make, so it is read from the server's words."""
    state = _sqlstate(exc)
    if state is not None:
        return state
    text = str(exc)
    if any(w in text for w in ("too many connections", "too many clients", "slots are reserved")):
        return "53300"
    if any(w in text for w in ("is starting up", "is shutting down", "not yet accepting")):
        return "57P03"
    if any(w in text for w in ("password authentication failed", "no pg_hba.conf entry")):
        return "28P01"
    if "does not exist" in text and 'role "' in text:
        return "28000"
    if "does not exist" in text and 'database "' in text:
        return "3D000"
    if "permission denied for database" in text:
        return "42501"
    return None


def _connect_advice(exc: BaseException) -> str:
    """What to do when a connection cannot be made, by the server's reason."""
    state = _refusal(exc)
    if state == "53300":
        return (
            "the server has no connection free (max_connections, or the role's or the "
            "database's connection limit, is reached; nothing was lost): close idle "
            "clients or raise the limit (each PostgresStore keeps up to three connections)"
        )
    if state == "57P03":
        return "the server is starting up or shutting down: retry once it is up"
    if state in ("28000", "28P01"):
        return "check the role and its password (and the server's pg_hba.conf)"
    if state == "3D000":
        return "the database does not exist: create it, or fix the DSN"
    if state == "42501":
        return "the role may not connect to this database: grant it CONNECT on it"
    return "check the DSN, and that the server is up and reachable"


# -- one connection, reopened with backoff --------------------------------------------------


class _Link:
    """One connection to the server, used under ``lock``, reopened with backoff when lost."""

    def __init__(
        self,
        name: str,
        ctx: _Context,
        closing: threading.Event,
        on_connect: Callable[[psycopg.Connection[Any]], None] | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> None:
        self.name = name
        self.lock = threading.RLock()
        self.conn = conn
        self._ctx = ctx
        # How a new connection is made: ``_connect(deadline)`` (see `_Context.reconnect`).
        self._connect: Callable[[float], psycopg.Connection[Any]] = partial(
            ctx.reconnect, closing=closing, name=name
        )
        self._where = ctx.location
        self._closing = closing
        self._on_connect = on_connect
        self.reconnects = 0
        self.connected = conn is not None  # once connected, a failure to connect is a loss
        # When (`time.monotonic`) a `get` last found the server unreachable until its
        # deadline, if no connection was made since (see `unreachable_for`).
        self.unreachable_at: float | None = None

    def get(self, deadline: float) -> psycopg.Connection[Any]:
        """The open connection, reconnecting (with backoff, until ``deadline``) if needed.

        Raises:
            StoreError: no connection could be made before ``deadline``, or the
                server refused for good (wrong password, no such database).
        """
        conn = self.conn
        if conn is not None and not conn.broken and not conn.closed and not _was_cut(conn):
            return conn
        self.drop()
        delay = 0.02
        said: psycopg.Error | None = None  # the last reason the server gave
        while True:
            if self._closing.is_set():
                raise StoreError(f"the store on {self._where} is closed; open a new one")
            try:
                conn = self._connect(deadline)
                if self._on_connect is not None:
                    with self._ctx.bounded(conn, deadline, self.name, "set up a new connection"):
                        self._on_connect(conn)
            except psycopg.Error as failed:
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
                # The last attempt, begun with little time left, says less than the one
                # the server refused before it.
                exc = said if isinstance(failed, _NotInTime) and said is not None else failed
                said = exc
                again = "reconnect to" if self.connected else "connect to"
                if _refusal(exc) in _PERMANENT_CONNECT_SQLSTATES:
                    raise StoreError(
                        f"could not {again} {self._where}: {_first_line(exc)}; "
                        f"{_connect_advice(exc)}"
                    ) from failed
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.unreachable_at = time.monotonic()
                    lost = (
                        f"lost the connection to {self._where} and could not reconnect"
                        if self.connected
                        else f"could not connect to {self._where}"
                    )
                    raise StoreError(
                        f"{lost} in time ({_first_line(exc)}); {_connect_advice(exc)}. The "
                        "store tries again on the next call"
                    ) from failed
                self._closing.wait(min(delay, remaining))
                delay = min(delay * 2, 1.0)
                continue
            self.conn = conn
            self.unreachable_at = None
            self.reconnects += 1
            self.connected = True
            return conn

    def unreachable_for(self, within: float) -> float | None:
        """How long ago a call found the server unreachable (it could not connect by its
        deadline), if that was less than ``within`` s ago and no connection was made
        since; else `None`."""
        when = self.unreachable_at
        if when is None or self.conn is not None:
            return None
        ago = time.monotonic() - when
        return ago if ago < within else None

    def drop(self) -> None:
        """Forget the connection (closing it quietly): the next `get` opens a new one."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


# -- what every part of a store shares ---------------------------------------------------------


def _ceil_seconds(seconds: float, low: int, high: int) -> int:
    return min(max(math.ceil(seconds), low), high)


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
        self.born = forks.born()  # a forked child refuses the store (`here`)
        self.watchdog = _Watchdog(self.location)
        self.margin = _cut_margin(timeout)
        self.role = str(psycopg.conninfo.conninfo_to_dict(dsn).get("user") or "<role>")

    def here(self, session_id: str | None = None) -> None:
        """`StoreError` if this process forked from the one that opened the store (its
        connections are that process's: see `nous_actor.runtime.forks`)."""
        if forks.forked_since(self.born):
            refused = forks.refusal(f"the store on {self.location}", self.born)
            raise StoreError(refused, session_id=session_id)

    def bounded(
        self, conn: psycopg.Connection[Any], deadline: float, name: str, doing: str
    ) -> contextlib.AbstractContextManager[None]:
        """The ``with`` body's statements on ``conn`` end by ``deadline`` plus the margin
        the server's own bounds need (see `_CUT_MARGIN_S`), or ``conn`` is cut."""
        return self.watchdog.bound(conn, deadline + self.margin, name, doing)

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection (see `reconnect`) within ``timeout``, failing at once: a
        wrong DSN, a server that is not there, is told at once. Unless the server said
        it is starting up or shutting down (a restart): then it is tried again, with
        backoff, until ``timeout`` (also while it is down in between).

        Raises:
            StoreError: the server cannot be reached or refuses the connection.
        """
        deadline = time.monotonic() + self.timeout
        delay = 0.02
        restarting: psycopg.Error | None = None  # what the server said of its restart
        while True:
            try:
                return self.reconnect(deadline)
            except psycopg.Error as exc:
                if _refusal(exc) == "57P03":
                    restarting = exc
                if restarting is None or time.monotonic() + delay >= deadline:
                    said = restarting if isinstance(exc, _NotInTime) and restarting else exc
                    raise StoreError(
                        f"could not connect to {self.location}: {_first_line(said)}; "
                        f"{_connect_advice(said)}"
                    ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def reconnect(
        self, deadline: float, closing: threading.Event | None = None, name: str = "main"
    ) -> psycopg.Connection[Any]:
        """A new connection (``name``: ``"main"``, ``"lease"``, ``"listen"``) with the
        session settings every call relies on, made by ``deadline`` (`time.monotonic`), or
        until ``closing`` is set (see `_within`).

        Raises:
            psycopg.Error: the server cannot be reached in time or refuses the connection.
        """
        return _within(lambda: self._open(deadline, name), deadline, closing)

    def options(self, deadline: float) -> dict[str, Any]:
        """The connection parameters the store adds to its DSN's (a parameter the DSN
        gives is kept as given): a connection attempt bounded by the time left (psycopg
        waits 2 s at least), the application's name, and, on TCP (libpq ignores them on
        a Unix socket), keepalives and ``tcp_user_timeout``: an idle connection whose
        server is gone is found dead, and data left unacknowledged for ``timeout`` ends
        the connection, without waiting for the system's retransmissions (15 minutes)."""
        left = max(deadline - time.monotonic(), 0.0)
        extra: dict[str, Any] = {
            "connect_timeout": _ceil_seconds(left, 2, 2_147_483),
            "application_name": "nous_actor",
            "keepalives": 1,
            "keepalives_idle": _ceil_seconds(self.timeout, 1, 60),
            "keepalives_interval": _ceil_seconds(self.timeout / 3, 1, 20),
            "keepalives_count": 3,
        }
        if psycopg.pq.version() >= 120000:  # libpq 12 and newer know it
            extra["tcp_user_timeout"] = _ceil_seconds(self.timeout * 1000, 1000, 2_147_483_647)
        return extra

    def _open(self, deadline: float, name: str) -> _Connection:
        params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        extra = {k: v for k, v in self.options(deadline).items() if k not in params}
        conn = _Connection.connect(self.dsn, autocommit=True, **extra)
        try:
            conn.keep_twin()
            with self.bounded(conn, deadline, name, "set up a new connection"):
                conn.execute(self.session_settings(conn.info.server_version))
            # Times come back as text: the codec reads them as it reads every stored time.
            conn.adapters.register_loader("timestamptz", TextLoader)
        except BaseException:
            conn.close()
            raise
        return conn

    def session_settings(self, server_version: int) -> str:
        """The settings of every connection of the store, in one round trip. Each bound
        the server keeps is the store's own, whatever the role or the database sets: a
        statement, and a lock wait, end after ``timeout`` (a role's short
        ``statement_timeout`` would cancel the store's statements at random; a long one
        is cut on the client anyway, see `_Watchdog`); a transaction left idle by a
        paused process is ended (it would keep a claim row locked); neither an idle
        connection (the lease connection holds the claims' advisory locks) nor a whole
        transaction is ended by the server's clock; and transactions are READ
        COMMITTED (the store's statements rely on it: under a role's REPEATABLE READ or
        SERIALIZABLE default, a claim that waited for a renewal of the claim row would
        fail with a serialization failure instead of naming the holder)."""
        ms = max(1, int(self.timeout * 1000))
        settings = [
            f"SET statement_timeout = {ms}",
            "SET TIME ZONE 'UTC'",
            f"SET idle_in_transaction_session_timeout = {self.idle_tx_ms}",
            f"SET lock_timeout = {ms}",
            "SET default_transaction_isolation = 'read committed'",
        ]
        if server_version >= 140000:
            settings.append("SET idle_session_timeout = 0")
        if server_version >= 170000:
            settings.append("SET transaction_timeout = 0")
        return "; ".join(settings)

    def grants(self) -> str:
        """What a role needs to be granted to use the store, as the words of a hint."""
        s, role = self.schema, self.role
        return (
            f"the role lacks a right in schema {s!r}: grant it, as the owner of the "
            f"store's tables, what the store needs (GRANT USAGE ON SCHEMA {s} TO {role}; "
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {role}; "
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {role}), and, to make the "
            "store, CREATE on the schema (or on the database, for a new schema)"
        )

    def error(
        self,
        exc: BaseException,
        session_id: str | None,
        doing: str,
        conn: psycopg.Connection[Any] | None = None,
    ) -> StoreError:
        """The `StoreError` that tells a user what ``exc`` (met on ``conn``) means and
        what to do."""
        if isinstance(exc, CodecError):
            return StoreError(
                f"stored event is malformed in {self.location}: {exc}", session_id=session_id
            )
        waited = _was_cut(conn)
        if waited is not None:
            return StoreError(
                f"could not {doing} in {self.location}: the server did not answer in "
                f"{waited:.3g} s (the store's timeout is {self.timeout:g} s), so the "
                "connection was closed (a network partition, or a stopped or overloaded "
                "server?); the store reconnects on the next call",
                session_id=session_id,
            )
        state = _sqlstate(exc)
        text = _first_line(exc)
        hint = ""
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            hint = f"; {self.grants()}"
        elif isinstance(exc, psycopg.errors.LockNotAvailable):
            hint = "; another writer held a lock too long: retry, or raise timeout="
        elif isinstance(exc, psycopg.errors.QueryCanceled) and "statement timeout" in text:
            hint = (
                f"; the statement ran longer than the store's timeout ({self.timeout:g} s, "
                "its statement_timeout): raise timeout=, or find what slows the server"
            )
        elif isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedObject):
            hint = (
                f"; a table of the store is gone from schema {self.schema!r} (the schema or "
                "the database was dropped?): restore it from a backup, or open a new "
                "PostgresStore, which makes an empty store (create=True)"
            )
        elif isinstance(exc, psycopg.errors.DiskFull):
            hint = "; the server's disk is full: free space, then restart the sessions"
        elif state == "25006":  # read-only transaction
            hint = _read_only_hint(conn, self.role)
        elif _lost_connection(exc, None):
            hint = "; the connection was lost (server restarted?): the store reconnects"
        return StoreError(
            f"could not {doing} in {self.location}: {type(exc).__name__}: {text}{hint}",
            session_id=session_id,
        )

    @contextlib.contextmanager
    def translate(
        self, session_id: str | None, doing: str, conn: psycopg.Connection[Any] | None = None
    ) -> Iterator[None]:
        """Run the ``with`` body; a psycopg or codec error leaves it as `error` words it."""
        try:
            yield
        except StoreError:
            raise
        except (psycopg.Error, CodecError) as exc:
            raise self.error(exc, session_id, doing, conn) from exc

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
        error leaves as a `StoreError`. The whole call, reconnections included, is
        bounded by ``timeout`` (its statements on the client too: see `_Watchdog`).
        """
        self.here(session_id)  # (before its lock: a parent's thread may hold it)
        deadline = time.monotonic() + self.timeout
        delay = 0.0
        while True:
            with link.lock:
                if closing.is_set():
                    raise StoreError(f"the store on {self.location} is closed; open a new one")
                conn = link.get(deadline)
                try:
                    with self.bounded(conn, deadline, link.name, doing):
                        return work(conn)
                except (psycopg.Error, CodecError) as exc:
                    lost = isinstance(exc, psycopg.Error) and _lost_connection(exc, conn)
                    if lost:
                        link.drop()
                    if not lost or time.monotonic() + delay >= deadline or closing.is_set():
                        raise self.error(exc, session_id, doing, conn) from exc
                    _connection_lost(self.location, link.name, doing, exc)
            closing.wait(delay)
            delay = min(max(delay * 2, 0.02), 1.0)


def _read_only_hint(conn: psycopg.Connection[Any] | None, role: str) -> str:
    """Why the server refused to write (SQLSTATE 25006), from what it reports of the
    connection (PostgreSQL 14 and newer report both settings)."""
    standby = read_only = None
    if conn is not None:
        with contextlib.suppress(Exception):
            standby = conn.info.parameter_status("in_hot_standby")
            read_only = conn.info.parameter_status("default_transaction_read_only")
    if standby == "on":
        return "; the server is a standby (read-only while in recovery): connect to the primary"
    by_default = (
        "default_transaction_read_only = on (set for the role, the database or the server) "
        f"makes every transaction read-only: turn it off for this role (ALTER ROLE {role} SET "
        "default_transaction_read_only = off) or connect as a role that may write"
    )
    if read_only == "on":
        return f"; the server is writable, but {by_default}"
    return f"; either the server is a standby (connect to the primary), or {by_default}"
