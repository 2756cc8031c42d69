"""Connections of `nous_actor.store.postgres`: one reopened with backoff, and the context.

`_Link` is one connection used under a lock and reopened (with backoff)
when lost; `_Context` is what every part of a store shares: how to connect
with the session settings each call relies on, how to word a backend error
as a `StoreError` (the one place psycopg's errors are translated), and how
to run a call that is retried on a new connection.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.errors
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

    def here(self, session_id: str | None = None) -> None:
        """`StoreError` if this process forked from the one that opened the store (its
        connections are that process's: see `nous_actor.runtime.forks`)."""
        if forks.forked_since(self.born):
            refused = forks.refusal(f"the store on {self.location}", self.born)
            raise StoreError(refused, session_id=session_id)

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

    @contextlib.contextmanager
    def translate(self, session_id: str | None, doing: str) -> Iterator[None]:
        """Run the ``with`` body; a psycopg or codec error leaves it as `error` words it."""
        try:
            yield
        except StoreError:
            raise
        except (psycopg.Error, CodecError) as exc:
            raise self.error(exc, session_id, doing) from exc

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
        self.here(session_id)  # (before its lock: a parent's thread may hold it)
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
