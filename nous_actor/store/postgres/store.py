"""The store of `nous_actor.store.postgres`: `PostgresStore`, the face over its parts.

`PostgresStore` checks its arguments, opens the schema, and answers the
`Store` protocol and its extras on its main connection; it hands a write to
`_Write` (`nous_actor.store.postgres.writes`), its claims to `_Leases`
(`.leases`) and its watches to `_Listener` (`.watch`), and stops them all
when closed or collected (`_shutdown`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import psycopg

from nous_actor.core.args import check_bound, check_flag, check_seconds
from nous_actor.core.codec import CodecError, event_from_row, surface_from_rows
from nous_actor.core.event import Event
from nous_actor.core.ids import check_session_id
from nous_actor.core.message import Message
from nous_actor.errors import StoreError
from nous_actor.runtime import forks
from nous_actor.store.base import (
    CALL_RECORD_SECONDS,
    CallRecords,
    ClosingStore,
    SessionInfo,
    events_by_session,
    valid_store_id,
    valid_store_ids,
)
from nous_actor.store.postgres.connection import T, _Context, _Link, _transaction, _Watchdog
from nous_actor.store.postgres.failures import _describe, _parse_time
from nous_actor.store.postgres.leases import _RENEW_FRACTION, _Leases
from nous_actor.store.postgres.schema import open_schema
from nous_actor.store.postgres.watch import PostgresWatch, _Listener
from nous_actor.store.postgres.writes import _MAX_SEQ, _batches, _fence, _Write

# -- the checks of the constructor's arguments ------------------------------------------------

_MAX_SCHEMA_BYTES: Final = 63 - len("nous_actor:")  # the channel name must fit 63 bytes

_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_dsn(dsn: object) -> None:
    """Refuse a DSN that is not a str (its content is checked when connecting).

    Raises:
        TypeError: not a str.
    """
    if not isinstance(dsn, str):
        raise TypeError(
            "dsn must be a str (a libpq connection string such as 'host=/run/postgresql "
            f"dbname=agents', or a URI such as postgresql://user@host/db), got "
            f"{type(dsn).__name__}"
        )


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


_MAX_ADDRESS: Final = 1024  # characters of an advertised address
_FORGET_EVERY: Final = 60  # seconds between two forgettings of expired call records


def _check_address(address: object) -> str | None:
    """Refuse an address that cannot be advertised (see `PostgresStore.advertise`).

    Raises:
        TypeError: not ``None`` or a str.
        ValueError: longer than 1024 characters, or not storable as PostgreSQL text
            (a NUL character, a lone surrogate).
    """
    if address is None:
        return None
    if not isinstance(address, str):
        raise TypeError(
            "address must be None or a str saying where this process answers calls (e.g. "
            f"'/run/agents/worker-a.sock'), got {type(address).__name__}"
        )
    if len(address) > _MAX_ADDRESS:
        raise ValueError(
            f"address must be at most {_MAX_ADDRESS} characters, got {len(address)}: "
            "advertise a shorter name (a socket path, host:port) and keep the rest elsewhere"
        )
    if "\x00" in address:
        raise ValueError(f"address must not hold a NUL character, got {address!r}")
    try:
        address.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"address must be text PostgreSQL can store (UTF-8), got {address!r}: {exc.reason}"
        ) from None
    return address


_KEY_BYTES: Final = 32  # the forwarding key: os.urandom(32), kept as 64 hex digits

_MIN_LEASE_S: Final = 0.1  # renewed every lease / 3: a round trip to the server each time
_MAX_LEASE_S: Final = 86_400  # a paused writer keeps its sessions at most a day
_MAX_TIMEOUT_S: Final = 2_147_483  # lock_timeout is a 32-bit count of milliseconds


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
        timeout: seconds a call may take, reconnecting, retrying and waiting
            for locks included, before it fails with `StoreError` (0.001 to
            2147483). Each statement is bounded by it on the server
            (``statement_timeout``, ``lock_timeout``), and on the client: a
            connection still without an answer ``min(timeout, 0.5)`` s after
            the call's deadline (a network partition, a stopped server) is cut.
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
        StoreError: the DSN is invalid, the server cannot be reached (at once;
            a server that says it is restarting is waited for, within
            ``timeout``), the role lacks the rights to create or read the schema, the schema holds
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
        _check_dsn(dsn)
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
        try:
            conn, self._sql = open_schema(self._ctx, create)
        except BaseException:
            self._ctx.watchdog.stop()  # (its thread ends: nothing is bounded any more)
            raise
        self._main = _Link("main", self._ctx, self._closing, conn=conn)
        self._leases = _Leases(
            self._ctx,
            self._sql,
            self._closing,
            holder=self.holder,
            lease=self.lease,
            detect_dead=self.detect_dead_holders,
            claim_wait_ms=self._claim_wait_ms,
        )
        self._listeners: list[_Listener] = []  # at most one, made on the first watch
        self._forwarding_key: bytes | None = None  # read from the store once
        self._forget_calls_at = 0  # when a write next forgets expired call records
        self._listener_lock = threading.Lock()

        # A store nobody uses any more stops its threads and closes its connections
        # (its claims then lapse, and dead-holder detection frees them at once).
        self._finalizer = weakref.finalize(
            self,
            _shutdown,
            self._closing,
            self._main,
            self._leases,
            self._listeners,
            self._ctx.born,
            self._ctx.watchdog,
        )
        # Never at interpreter exit: `weakref.finalize`'s exit hook runs before the
        # runtime's (atexit is last in, first out) and would close the store under the
        # appends still in flight, which the runtime waits for (nous_actor.runtime.exit);
        # it could also wait on the main connection's lock behind a blocked write. The
        # process's end closes the connections; the server then drops the claims' locks.
        self._finalizer.atexit = False

    @staticmethod
    def describe(dsn: str, schema: str = "nous_actor") -> str:
        """How messages name the store at ``dsn``/``schema`` (never with the password).

        Raises:
            StoreError: ``dsn`` is not a valid connection string.
        """
        return f"{_describe(dsn)}, schema {schema}"

    # -- one call, its errors translated in one place (the context's) ------------------------

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

    # -- the Store protocol ----------------------------------------------------------------

    def load(self, session_id: str) -> list[Event]:
        """The stored events of `session_id` in seq order (`[]` for an id no store can hold).

        Raises:
            StoreError: the store is closed, the server could not be reached in
                `timeout`, or a stored event is malformed.
        """
        return self.load_since(session_id, 0)

    def write(
        self, appends: Mapping[str, Sequence[Event]], calls: CallRecords | None = None
    ) -> dict[str, StoreError]:
        """Store each session's events in one transaction; acknowledged once it committed.
        The records of the forwarded ``calls`` that appended them are written in it too
        (see `applied_call`).

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
          the session was failed closed; its writes are refused until a
          renewal finds the lease unchanged (the same epoch, still live),
          and then stored again (if the session was taken over meanwhile,
          the renewal finds the new epoch: `FencedError` from then on).

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
        todo, refused = _batches(appends)
        if todo:
            forget = None
            if calls:
                now = int(time.time())
                if now >= self._forget_calls_at:
                    forget = now - CALL_RECORD_SECONDS
                    self._forget_calls_at = now + _FORGET_EVERY
            write = _Write(
                todo,
                ctx=self._ctx,
                q=self._sql,
                main=self._main,
                leases=self._leases,
                closing=self._closing,
                check_open=self._check_open,
                calls=calls,
                forget_before=forget,
            )
            refused.update(write.run())
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
            with _transaction(conn):
                err = _fence(conn, self._leases, [session_id])[0].get(session_id)
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
        process died, so the server dropped its connection and its claim's lock.

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
            with _transaction(conn):
                row = self._leases.claim_row(conn, session_id)
                if row is not None and row.epoch != mine:
                    self._leases.may_take_over(
                        conn, session_id, row, "cannot delete a session another writer holds"
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

    def claim_many(self, session_ids: Sequence[str]) -> list[str | StoreError]:
        """`claim` each of `session_ids` in one transaction (the opens of many sessions at
        once take their claims together, in a few statements whatever their number):
        for each id, in order, its token or the error that refused it, a
        `ConflictError` as `claim` raises it (an id given twice is refused the second
        time: its first claim holds it). A claim that meets a lock wait or a deadlock
        with another claimer is taken alone, and refused with that error if it
        meets it again.

        Raises:
            StoreError: nothing was claimed: an id is not valid (see `nous_actor.core.ids`),
                the store is closed, or the server could not be reached in `timeout`.
        """
        self._check_open()
        ids = valid_store_ids(session_ids)
        if not ids:
            return []
        return self._leases.claim_many(ids)

    def load_many(self, session_ids: Sequence[str]) -> dict[str, list[Event] | StoreError]:
        """`load` each of `session_ids` in one query: each id maps to its events in seq
        order, or to the `StoreError` that says why that session alone could not be
        read (a malformed row fails its own session, never the others).

        Raises:
            StoreError: nothing was read: an id is not valid, or the store failed.
        """
        self._check_open()
        ids = list(dict.fromkeys(valid_store_ids(session_ids)))
        query = (
            f"SELECT session_id, seq, type, time, data FROM {self._sql.events} "
            "WHERE session_id = ANY(%b::text[]) ORDER BY session_id, seq"
        )

        def work(conn: psycopg.Connection[Any]) -> list[Any]:
            return conn.execute(query, (ids,)).fetchall()

        rows = self._call(self._main, None, "load the sessions", work) if ids else []
        return events_by_session(  # decoded off the connection's lock
            ids, rows, lambda sid, exc: self._ctx.error(exc, sid, "load the session")
        )

    def release(self, session_id: str, token: str) -> None:
        """Give up a claim (a no-op if `token` no longer holds it, or the store is closed).

        Best effort: the claim is this store's no more, whatever happens. While the
        server is unreachable (a call of the lease connection could not connect by its
        deadline less than a second ago, or less than ``timeout`` if shorter), the call
        fails at once rather than wait ``timeout`` again: a registry closing during an
        outage gives up each of its sessions without waiting ``timeout`` for each.

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

    # -- forwarding: where a holder answers, and the store's secret ---------------------------

    def advertise(self, address: str | None) -> None:
        """The address where this store object's process answers calls for the sessions
        it holds (``None``: it answers none).

        Written with every claim this store object takes from now on, in the claim's
        own transaction, and at once into the claim rows it holds now (one
        transaction; only rows whose token is this store's, so a claim taken over
        meanwhile keeps its new holder's address). Opaque text of at most 1024
        characters. A refused or failed call changes nothing.

        Raises:
            TypeError: ``address`` is not ``None`` or a str.
            ValueError: ``address`` is longer than 1024 characters, or holds a NUL
                character or a lone surrogate (PostgreSQL text cannot).
            StoreError: the store is closed or failed.
        """
        address = _check_address(address)
        self._check_open()
        self._leases.advertise(address)

    def holder_address(self, session_id: str) -> tuple[str, str | None] | None:
        """Who holds a live claim on ``session_id`` and where it answers: ``(holder,
        address)``, or ``None`` when nobody holds a live claim.

        ``holder`` is named as `held_by` names it (the claim's holder, this store's
        `holder` for its own claims); ``address`` as the holder advertised it when it
        took the claim or since (``None``: it advertised none, or its claim was
        written by a release of schema version 1). Live means what it means for
        `held_by`: the lease has not expired by the database's clock (a holder whose
        process died is named until a claim takes the session over).

        Raises:
            StoreError: ``session_id`` is not valid, or the store is closed or failed.
        """
        self._check_open()
        session_id = self._valid_id(session_id)
        query = (
            f"SELECT holder, address FROM {self._sql.claims} "
            "WHERE session_id = %s AND lease_until > clock_timestamp()"
        )

        def work(conn: psycopg.Connection[Any]) -> tuple[str, str | None] | None:
            row = conn.execute(query, (session_id,)).fetchone()
            if row is None:
                return None
            return str(row[0]), None if row[1] is None else str(row[1])

        return self._call(self._main, session_id, "read the session's claim", work)

    def forwarding_key(self) -> bytes:
        """This store's shared secret: 32 random bytes (`os.urandom`), made by the first
        process that asks and kept in the store (the row ``forwarding_key`` of the
        schema's ``meta`` table, as hex), so every process that opens the store reads
        the same bytes.

        Race-free: two processes asking at once insert with ``ON CONFLICT DO
        NOTHING`` and then both read the one row that won. Whoever can read the
        schema can read the key, and so may call its sessions.

        Raises:
            StoreError: the store is closed or failed, or the stored key is damaged.
        """
        self._check_open()
        if self._forwarding_key is not None:
            return self._forwarding_key
        meta = self._sql.meta
        read = f"SELECT value FROM {meta} WHERE key = 'forwarding_key'"

        def work(conn: psycopg.Connection[Any]) -> str:
            row = conn.execute(read).fetchone()
            if row is None:
                conn.execute(
                    f"INSERT INTO {meta} (key, value) VALUES ('forwarding_key', %s) "
                    "ON CONFLICT (key) DO NOTHING",
                    (os.urandom(_KEY_BYTES).hex(),),
                )
                row = conn.execute(read).fetchone()  # a new snapshot: the row that won
            assert row is not None
            return str(row[0])

        text = self._call(self._main, None, "read the forwarding key", work)
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) != _KEY_BYTES:
            raise StoreError(
                f"the forwarding key of {self.location} is damaged (not {2 * _KEY_BYTES} hex "
                "digits); delete the row 'forwarding_key' of its meta table to make a new "
                "one, then restart every process on the store"
            )
        self._forwarding_key = key
        return key

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
            TypeError, ValueError: `timeout` (the gets' default bound) is not a number
                of seconds, or NaN.
        """
        self._check_open()
        session_id = self._valid_id(session_id)
        if not isinstance(from_seq, int) or isinstance(from_seq, bool) or from_seq < 0:
            raise ValueError(f"from_seq must be an int >= 0, got {from_seq!r}")
        timeout = check_bound(timeout, "watch(timeout)")
        return self._listener().add(session_id, from_seq, buffer, timeout)

    def _listener(self) -> _Listener:
        with self._listener_lock:
            self._check_open()
            if self._listeners and self._listeners[0].ended is not None:
                # It ended (the server refused it for good): the next watch tries anew.
                self._listeners.pop().discard()
            if not self._listeners:
                self._listeners.append(_Listener(self._ctx, self._sql, self._closing, self.holder))
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

    def load_surface(self, session_id: str) -> tuple[list[int], list[Message]]:
        """The committed surface of `session_id`, projected: the seqs and the messages of
        ``Log.restore(load_since(session_id, 0)).derive_indexed()``, read as `load_since`
        reads (without a claim), without an event per row (`surface_from_rows`: a
        reader's cold read). Every row is checked when read.

        Raises:
            StoreError: the store is closed or failed, or a stored row is malformed.
        """
        self._check_open()
        if not self._storable(session_id):
            return [], []
        query = (
            f"SELECT seq, type, time, data FROM {self._sql.events} "
            "WHERE session_id = %s ORDER BY seq"
        )

        def work(conn: psycopg.Connection[Any]) -> list[Any]:
            return conn.execute(query, (session_id,)).fetchall()

        rows = self._call(self._main, session_id, "load the session", work)
        try:  # decoded off the connection's lock
            return surface_from_rows(rows)
        except CodecError as exc:
            raise self._ctx.error(exc, session_id, "load the session") from exc

    def applied_call(self, session_id: str, call_id: str) -> tuple[int, int] | None:
        """The first and last seq of what the forwarded call ``call_id`` appended to
        ``session_id``, or ``None`` if no write recorded it (a record is kept
        `CALL_RECORD_SECONDS` at least). What the process holding the
        session answers ``session.applied(call_id)`` with: its claim fences every
        earlier holder's write, so none can still commit.

        Raises:
            StoreError: the store is closed or failed.
        """
        self._check_open()
        if not self._storable(session_id):
            return None
        query = f"SELECT first, last FROM {self._sql.calls} WHERE session_id = %s AND call = %s"

        def work(conn: psycopg.Connection[Any]) -> tuple[int, int] | None:
            row = conn.execute(query, (session_id, call_id)).fetchone()
            return None if row is None else (int(row[0]), int(row[1]))

        return self._call(self._main, session_id, "read a call's record", work)

    def next_seq(self, session_id: str) -> int:
        """The next seq of `session_id`'s stored history (0 if it has none), read without
        a claim: one read of the primary key's index, nothing decoded (a reader's
        ``count()``, which loaded and decoded the whole session before).

        Raises:
            StoreError: the store is closed or failed.
        """
        self._check_open()
        if not self._storable(session_id):
            return 0
        query = f"SELECT max(seq) FROM {self._sql.events} WHERE session_id = %s"

        def work(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(query, (session_id,)).fetchone()
            last = None if row is None else row[0]
            return 0 if last is None else int(last) + 1

        return self._call(self._main, session_id, "read the next seq", work)

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
        """Wait at most `timeout` s for a notification (a release, a request; a commit
        only while this store watches a session: see `watch`) after the counter
        `after`; returns the counter now.

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


def _shutdown(
    closing: threading.Event,
    main: _Link,
    leases: _Leases,
    listeners: list[_Listener],
    born: int,
    watchdog: _Watchdog,
) -> None:
    """Stop a store's threads and close its connections (on close, or when collected).
    In a process forked from the one that opened them, only marks the store closed: the
    connections are that process's (closing one would end it for that process too)."""
    closing.set()
    if forks.forked_since(born):
        return
    leases.stop()
    for listener in listeners:
        listener.stop()
    with main.lock:  # (its holder's call ends within its bound: see _Watchdog)
        main.drop()
    watchdog.stop()
