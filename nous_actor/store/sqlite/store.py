"""`SQLiteStore`, the face of `nous_actor.store.sqlite`: the checks of its arguments,
the `Store` protocol, the batches, the index, and the optional methods of
`nous_actor.store.shared` (reads without a claim and watches on the follower's
connection, who holds a session and where it answers, hand-off requests in the
``handoffs`` table, the store's forwarding key).

It holds its connection, a `_Connection` (`connection`: the lock, the
translation of sqlite3's errors, write transactions, whether the store is
closed or failed), which holds its `_Opening` (`schema`: opening a file,
looking before writing, and whether it is still ours at each write); a write's
rows go in through `writes`, claims are taken and told live or dead by
`claims` (the claims this store object holds, and the address it advertises for
them, are its `claims._Holdings`), reads without a claim and watches go through
the connection's `follower`, the forwarding key is kept by `keys`, and
snapshots' drops are given back by `vacuum`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Final, Literal

from nous_actor._log import get_logger
from nous_actor.core.args import check_bound, check_flag, check_seconds
from nous_actor.core.codec import (
    CodecError,
    events_from_rows,
    passing_events_from_rows,
    surface_from_rows,
)
from nous_actor.core.event import Event
from nous_actor.core.message import Message
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store.base import (
    CALL_RECORD_SECONDS,
    CallRecords,
    ClosingStore,
    SessionInfo,
    events_by_session,
    valid_store_id,
    valid_store_ids,
)
from nous_actor.store.feed import DEFAULT_WATCH_BUFFER, _check_buffer, _check_from_seq
from nous_actor.store.sqlite.bulk import query_on, session_rows
from nous_actor.store.sqlite.claims import (
    _claim_all,
    _claim_row,
    _holder_name,
    _Holdings,
    _live_lock,
    _live_tokens,
    _pid_alive,
)
from nous_actor.store.sqlite.connection import _IN_CHUNK, _Connection, malformed
from nous_actor.store.sqlite.follower import close_follower, follower_of
from nous_actor.store.sqlite.keys import forwarding_key as _forwarding_key
from nous_actor.store.sqlite.vacuum import dropped_bytes, due, file_bytes
from nous_actor.store.sqlite.vacuum import vacuum as _vacuum_file
from nous_actor.store.sqlite.writes import (
    _session_rows,
    insert_batches,
    record_calls,
    rows_at_once,
    session_numbers,
)
from nous_actor.store.subscription import Subscription

__all__ = ["SQLiteStore"]

NUMBERS_KEPT: Final = 100_000
"""Session numbers (schema version 3) a store object remembers at most: past that, it
forgets them all and reads them again as its writes need them (a process that writes
to ever more sessions keeps its memory bounded)."""

logger = get_logger("nous_actor.store.sqlite")

_MAX_ADDRESS: Final = 1024
"""The longest address a store object advertises (`SQLiteStore.advertise`), in characters."""

_MAX_TIMEOUT_S: Final = 2_147_483
"""The longest `timeout`: SQLite's busy timeout is a 32-bit count of milliseconds."""

_FORGET_EVERY: Final = 60
"""Seconds between two forgettings of expired call records by one store object."""


_RELEASES_PER_DELETE: Final = 250
"""Claims given up by one ``DELETE`` (two parameters each)."""

_READ_APART: Final = 16
"""A batch of at most this many sessions reads each apart, a few steps of SQLite each
(`session_rows`); a bigger one (many sessions opened at once, with as many reads queued
behind) reads every row of the batch in one statement, a step a row, which costs a
quarter less CPU alone, and a switch interval a row in a process whose other threads
keep the GIL busy."""


_HANDOFFS_TABLE: Final = """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    until TEXT NOT NULL,
    PRIMARY KEY (session_id, pid)
)"""
"""Hand-off requests (`SQLiteStore.ask_handoff`): made on the first request."""


def _check_path(path: object) -> str:
    """``path`` as a str, if it names a file (or is ``":memory:"``).

    Raises:
        TypeError: not a str or an `os.PathLike` of str (bytes paths are refused).
        ValueError: empty, or holding a NUL character.
    """
    if isinstance(path, os.PathLike):
        text = os.fspath(path)
        if not isinstance(text, str):
            raise TypeError(
                "path must be a str or an os.PathLike of str, not bytes: decode it "
                "(os.fsdecode) or give a pathlib.Path"
            )
    elif isinstance(path, str):
        text = path
    else:
        raise TypeError(
            "path must be a str or an os.PathLike (e.g. a pathlib.Path) naming the database "
            f"file, or ':memory:', got {type(path).__name__}"
        )
    if not text:
        raise ValueError("path must not be empty: give a database file path, or ':memory:'")
    if "\x00" in text:
        raise ValueError(f"path must not hold a NUL character, got {text!r}")
    return text


def _check_address(address: object) -> str | None:
    """``address`` if it is one a store can keep (see `SQLiteStore.advertise`).

    Raises:
        TypeError: not a str or ``None``.
        ValueError: longer than 1024 characters, or not valid Unicode text.
    """
    if address is None:
        return None
    if not isinstance(address, str):
        raise TypeError(
            "address must be a str (where this process answers calls) or None (it answers "
            f"none), got {type(address).__name__}"
        )
    if len(address) > _MAX_ADDRESS:
        raise ValueError(
            f"address must be at most {_MAX_ADDRESS} characters, got {len(address)}: "
            "advertise a shorter address (a socket path, or a name that leads to one)"
        )
    try:
        address.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"address must be valid Unicode text, got {address!r} ({exc.reason}); "
            "encode a path of undecodable bytes with os.fsdecode"
        ) from None
    return str(address)


_HANDOFFS_MADE: Final = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'handoffs'"
_HANDOFF_ROWS: Final = (
    "SELECT h.session_id, w.token, h.pid, h.until FROM handoffs AS h JOIN writers AS w "
    "ON w.session_id = h.session_id WHERE w.pid = ? AND h.pid <> w.pid"
)


def _now_text(delta: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta)).isoformat()


_MAX_LIMIT: Final = 2**63 - 1
"""The largest ``LIMIT`` SQLite binds (a 64-bit integer): more lists every session anyway."""

_PAST_SURROGATES: Final = "\ue000"
"""The first code point after the surrogates (U+D800 to U+DFFF)."""


def _surrogate_at(text: str) -> int | None:
    """Where ``text``'s first lone surrogate is (SQLite cannot bind it as UTF-8), if any."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _info(session_id: str, count: int, top: object, last: object) -> SessionInfo:
    """One row of `SQLiteStore.index`, with what cannot be read put into `error`."""
    if not isinstance(top, int) or top < 0:
        return SessionInfo(session_id, count, 0, None, f"a stored seq is malformed: {top!r}")
    try:
        when = datetime.fromisoformat(str(last))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        return SessionInfo(
            session_id, count, top + 1, None, f"a stored time is malformed: {last!r}"
        )
    return SessionInfo(session_id, count, top + 1, when.astimezone(UTC), None)


class SQLiteStore(ClosingStore):
    """Sessions' events in one SQLite file (or `":memory:"`).

    Safe to share between threads: calls are serialised on one connection.
    Open the same file from several processes freely; each session still
    has one live writer (`claim`), enforced in the database.

    Which files become a store:

    * a missing path, a 0-byte file, or a SQLite database with nothing in it
      (no table, `user_version` and `application_id` 0) becomes a new store
      (unless `create=False`). The schema, `application_id` and
      `user_version` are written in one transaction, so a process killed
      while creating the store leaves either no store or a whole one;
    * a nous_actor store opens as it is (a store of an older release without
      `application_id`, or one left half-made by an older release, is
      completed; one of schema version 1 or 2 is migrated to version 3 in one
      write transaction, so a process killed in it leaves it as it was; a
      connection that cannot write reads a version-1 or -2 store as it is);
    * anything else (another application's SQLite database, a file that is
      not SQLite, a store of a newer schema version, a store of ours that
      holds a schema object we do not make: a trigger, view, index or table
      of someone else's, a directory) is refused
      with `StoreError` **before anything is written to it**: the file is
      left byte for byte as it was, and an unfinished transaction of the
      other application is not recovered. The journal is switched to WAL
      only once the file is known to be a store.

    While open, every write transaction checks (one `stat` per transaction) that
    the path still names the file that was opened; if the file or its folder
    was removed or replaced, the write fails with `StoreError` and so does
    every later call: nothing is acknowledged into a file that is gone. It
    also reads the schema version (``PRAGMA user_version``) and SQLite's schema
    cookie (about 2 us in all): once another process has changed the version,
    or added a schema object we do not make, the write fails with `StoreError`
    before anything is written, and so does every later call; a process never
    writes a file whose version it does not know.

    Args:
        path: the database file, or `":memory:"`.
        durability: `"full"` (default) or `"normal"`; see the module docs.
        timeout: seconds to wait for another process's write lock (0.001 to 2147483).
        create: make a new store where there is none (the default). With
            `create=False` a missing path, a 0-byte file or an empty SQLite
            database raises `StoreError` and is left as it is (no file is
            made): use it to open stores that must already exist.

    Every argument is checked before anything is opened: a refused argument
    makes no file and holds nothing.

    Raises:
        TypeError: `path` is not a str or an `os.PathLike` of str; `durability`
            is not a str; `timeout` is not an int or a float; `create` is not a bool.
        ValueError: `path` is empty or holds a NUL character; `durability` is
            not `"full"` or `"normal"`; `timeout` is not from 0.001 (SQLite waits in
            whole milliseconds) to 2147483 seconds (its wait is a 32-bit count
            of milliseconds).
        StoreError: the file cannot be opened, is not a nous_actor store, or
            (with `create=False`) holds no store yet.
    """

    _connection_type: type[_Connection] = _Connection
    """The class of the store's connection (the viewer's read-only store opens its own)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["full", "normal"] = "full",
        timeout: float = 5.0,
        create: bool = True,
    ) -> None:
        path = _check_path(path)
        if not isinstance(durability, str):
            raise TypeError(
                f"durability must be 'full' or 'normal' (a str), got {type(durability).__name__}"
            )
        if durability not in ("full", "normal"):
            raise ValueError(f"durability must be 'full' or 'normal', got {durability!r}")
        timeout = check_seconds(timeout, "timeout", 0.001, _MAX_TIMEOUT_S, low_open=False)
        check_flag(create, "create")
        self.path = path if path == ":memory:" else str(Path(path))
        self.durability = durability
        # Sessions this store asked for (store.shared), read and changed under the
        # connection's lock, as a claim reads them.
        self._asked: set[str] = set()
        self._handoffs_made = False  # the table of requests is known to exist
        self._holdings = _Holdings()  # the claims this object holds, and its address
        # The session numbers (schema version 3) this object's writes have committed:
        # a number never changes, so it is looked up once per session.
        self._numbers: dict[str, int] = {}
        self._forget_calls_at = 0  # when a write next forgets expired call records
        self._connection = self._connection_type(self.path, durability, timeout, create)
        self._forwarding_key: bytes | None = None  # read from the file once

    _valid_id = staticmethod(valid_store_id)

    handoff_poll: Final = 0.01
    """A holder looks for hand-off requests this often (`nous_actor.store.shared`'s
    ``handoff_poll``): a file says only that something changed, and a busy one changes
    at every commit of every process; waiting for changes, each worker's holder read
    the requests at each of them (5% of a CPU per worker in a 4-worker fleet, and its
    file poll as much again)."""

    # -- the Store protocol --------------------------------------------------------------

    def load(self, session_id: str) -> list[Event]:
        with self._connection.locked(session_id, "load the session") as conn:
            return events_from_rows(session_rows(query_on(conn), session_id))

    def write(
        self, appends: Mapping[str, Sequence[Event]], calls: CallRecords | None = None
    ) -> dict[str, StoreError]:
        """Store each session's events in one transaction (see `Store.write`), with the
        records of the forwarded ``calls`` that appended them (see `applied_call`).

        A session whose events cannot be stored (a seq not below 2**63, data the
        codec cannot encode, a time without a text form, a value SQLite cannot
        bind) is refused alone with `StoreError`, as a conflict is: the other
        sessions' events commit.

        Raises:
            StoreError: nothing was stored: a session id is not valid (see
                `nous_actor.core.ids`), the file was removed or replaced, or SQLite failed.
        """
        refused: dict[str, StoreError] = {}
        batches = []
        known = self._numbers  # ids this store committed: checked when first written
        for sid, evs in appends.items():
            if evs:
                if type(sid) is not str or sid not in known:
                    sid = self._valid_id(sid)
                rows = _session_rows(sid, evs, refused)
                if rows is not None:
                    batches.append((sid, rows))
        if not batches:
            return refused
        only = batches[0][0] if len(batches) == 1 else None
        now = int(time.time()) if calls else 0
        # The common write: one statement, if it can be its own transaction (a forwarded
        # call's record in it too, unless it is time to forget the old records).
        if not calls or now < self._forget_calls_at:
            at_once = rows_at_once(batches, known, calls, now)
            if at_once is not None and self._connection.write_at_once(
                only, "append events", *at_once
            ):
                return refused
        with self._connection.transaction(only, "append events") as conn:
            numbers = session_numbers(conn, [sid for sid, _ in batches], self._numbers)
            insert_batches(conn, batches, refused, numbers)
            if calls:
                forget = None
                if now >= self._forget_calls_at:
                    forget = now - CALL_RECORD_SECONDS
                    self._forget_calls_at = now + _FORGET_EVERY
                record_calls(conn, calls, numbers, refused, now, forget)
        if len(self._numbers) + len(numbers) > NUMBERS_KEPT:
            self._numbers.clear()  # a long-lived store: read again (one indexed SELECT)
        self._numbers.update(numbers)  # committed: they stand
        return refused

    def applied_call(self, session_id: str, call_id: str) -> tuple[int, int] | None:
        """The first and last seq of what the forwarded call ``call_id`` appended to
        ``session_id``, or ``None`` if no write recorded it (a record is kept
        `CALL_RECORD_SECONDS` at least). What the process holding the session answers
        ``session.applied(call_id)`` with: it holds the claim, so no earlier holder's
        write can still commit.

        Raises:
            StoreError: the session id is not valid, or SQLite failed.
        """
        session_id = self._valid_id(session_id)
        with self._connection.locked(session_id, "read a call's record") as conn:
            try:
                row = conn.execute(
                    "SELECT first, last FROM calls WHERE session = "
                    "(SELECT id FROM sessions WHERE session_id = ?) AND call = ?",
                    (session_id, call_id),
                ).fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" not in str(exc):
                    raise
                return None  # no call was ever forwarded to a holder of this file
        return None if row is None else (int(row[0]), int(row[1]))

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        """Delete the given seqs of one session (see `Store.drop`), then, once what
        snapshots dropped reaches a tenth of the file, give the space back: the
        file is rewritten packed (``VACUUM``), by itself for files up to 128 MiB
        (see `vacuum`). A vacuum that fails is logged; the drop stands.

        Only the session's holder drops its events: a session whose claim another live
        writer holds (another process, or another store object of this one) is refused
        in the same transaction, nothing dropped; a session nobody holds, or whose
        holder died, is dropped.

        Raises:
            ConflictError: another live writer holds the session (nothing is dropped).
            StoreError: the store failed.
        """
        if not seqs:
            return
        with self._connection.transaction(session_id, "drop snapshotted events") as conn:
            self._not_held_elsewhere(conn, session_id, "another writer holds this session's claim")
            dropped = dropped_bytes(conn, session_id, seqs)
            conn.executemany(
                "DELETE FROM event_rows WHERE session = "
                "(SELECT id FROM sessions WHERE session_id = ?) AND seq = ?",
                [(session_id, s) for s in seqs],
            )
        self._reclaim(session_id, dropped)

    def _reclaim(self, session_id: str, dropped: int) -> None:
        """Count bytes a drop deleted; vacuum the file if that is due (never raises)."""
        connection = self._connection
        with connection.lock:
            if connection.closed or connection.lost is not None:
                return
            connection.dropped += dropped
            try:
                if due(connection, file_bytes(connection.conn)):
                    _vacuum_file(connection, connection.conn)
            except (sqlite3.Error, StoreError) as exc:
                logger.warning(
                    "store.vacuum_failed",
                    session_id=session_id,
                    store=self.path,
                    reason=type(exc).__name__,
                    error=str(exc),
                )

    def vacuum(self) -> int:
        """Give the space that deletions left in the file back now: rewrite it packed
        (SQLite's ``VACUUM``, one transaction: a crash or a full disk during it
        leaves the file as it was), then empty the WAL; returns the file's size
        in bytes after.

        Snapshots call it by themselves for files up to 128 MiB; call it on a
        larger file at a quiet time: it holds the write lock while it copies
        the file (0.7 to 1.5 s per 100 MB on 2 CPUs), and every write
        meanwhile, from this process or another, waits (up to its ``timeout``).
        It needs free disk space of about the file's size.

        Raises:
            StoreError: the store is closed or failed, another process holds the
                write lock past ``timeout``, or SQLite failed (the file is unchanged).
        """
        with self._connection.locked(None, "vacuum the store") as conn:
            _vacuum_file(self._connection, conn)
            return file_bytes(conn)

    def sessions(self) -> list[str]:
        with self._connection.locked(None, "list sessions") as conn:
            rows = conn.execute("SELECT DISTINCT session_id FROM events ORDER BY session_id")
            return [r[0] for r in rows]

    def delete(self, session_id: str) -> None:
        """Delete every event of `session_id` and its claim (this store object's, or one
        `claim` would take over: its holder died), in one transaction.

        A holder is found live exactly as `claim` finds it: a claim of another process
        while that process runs, one of another store object of this process until it
        is released.

        Raises:
            ConflictError: another live writer holds the session (nothing is deleted).
            StoreError: the store failed.
        """
        with self._connection.transaction(session_id, "delete the session") as conn:
            self._not_held_elsewhere(
                conn, session_id, "cannot delete a session another writer holds"
            )
            conn.execute(  # (its number stays: a number is never given to another id)
                "DELETE FROM event_rows WHERE session = "
                "(SELECT id FROM sessions WHERE session_id = ?)",
                (session_id,),
            )
            conn.execute("DELETE FROM writers WHERE session_id = ?", (session_id,))

    def _not_held_elsewhere(self, conn: sqlite3.Connection, session_id: str, refusal: str) -> None:
        """Inside a write transaction on ``conn`` (so no claim can come between the look
        and the caller's change): nothing if `session_id` has no claim, has one of this
        store object, or one whose holder is dead (as `claim` judges it, and would take
        it over). Otherwise the caller's change would fork the session under its live
        writer: `ConflictError`, its message starting with ``refusal`` and naming the
        holder (the caller's transaction rolls back: nothing is changed)."""
        row = conn.execute(
            "SELECT pid, token FROM writers WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            return
        pid, token = row
        with _live_lock:
            if token in self._holdings.tokens:  # a claim this object took (and holds)
                return
            where = _holder_name(pid, token, os.getpid())
        if where is not None:
            raise ConflictError(
                f"{refusal}: it has a live writer in {where}; use that session's handle, "
                "or stop it first",
                session_id=session_id,
            )

    def claim(self, session_id: str) -> str:
        """Become the one writer of `session_id` (see `Store.claim`).

        A claim left by a process that has ended (exited, killed, or dead but
        not yet reaped by its parent) is taken over.

        Raises:
            ConflictError: a live writer holds the session, in this process or another.
            StoreError: `session_id` is not valid (see `nous_actor.core.ids`), or the store failed.
        """
        (got,) = self.claim_many([session_id])
        if isinstance(got, ConflictError):
            raise got
        return got

    # -- batches (optional methods: the sessions layer uses them when a store has them) ---

    def claim_many(self, session_ids: Sequence[str]) -> list[str | ConflictError]:
        """`claim` each of `session_ids` in one transaction: for each id, in order, its
        token or the `ConflictError` that refused it (an id given twice is refused the
        second time: its first claim holds it).

        Raises:
            StoreError: nothing was claimed: an id is not valid (see `nous_actor.core.ids`),
                or the store failed.
        """
        ids = valid_store_ids(session_ids)
        if not ids:
            return []
        return _claim_all(self._connection, self._asked, self._holdings, ids)

    def load_many(self, session_ids: Sequence[str]) -> dict[str, list[Event] | StoreError]:
        """`load` each of `session_ids` in one read: each id maps to its events in seq
        order, or to the `StoreError` that says why that session alone could not be
        read (a malformed row fails its own session, never the others).

        Raises:
            StoreError: nothing was read: an id is not valid, or the store failed.
        """
        ids = list(dict.fromkeys(valid_store_ids(session_ids)))
        if len(ids) <= _READ_APART:  # a few sessions: each in a few steps (`bulk`)
            return {sid: self._load_one(sid) for sid in ids}
        rows: list[tuple[str, int, str, str, str | bytes]] = []
        with self._connection.locked(None, "load the sessions") as conn:
            query = query_on(conn)  # (a text that is not UTF-8 fails its session alone)
            for lo in range(0, len(ids), _IN_CHUNK):
                chunk = ids[lo : lo + _IN_CHUNK]
                rows += query(
                    "SELECT session_id, seq, type, time, data FROM events WHERE session_id IN "
                    f"({','.join('?' * len(chunk))}) ORDER BY session_id, seq",
                    chunk,
                )
        return events_by_session(ids, rows, partial(malformed, self.path))

    def _load_one(self, session_id: str) -> list[Event] | StoreError:
        """`load_many` of one session: its events, or why they could not be read."""
        with self._connection.locked(session_id, "load the session") as conn:
            rows = session_rows(query_on(conn), session_id)
        try:  # decoded off the lock, as load_many's rows are
            return events_from_rows(rows)
        except CodecError as exc:
            return malformed(self.path, session_id, exc)

    def release(self, session_id: str, token: str) -> None:
        self._release([(session_id, token)], session_id, "release the session")

    def release_many(self, claims: Sequence[tuple[str, str]]) -> None:
        """`release` each ``(session id, token)`` of ``claims``, in one transaction (a
        registry closing gives up all its sessions' claims so)."""
        if claims:
            self._release(claims, None, "release the sessions")

    def _release(
        self, claims: Sequence[tuple[str, str]], session_id: str | None, doing: str
    ) -> None:
        with _live_lock:
            for sid, token in claims:
                if _live_tokens.get(token) == sid:  # a token frees its own session only
                    del _live_tokens[token]
                    self._holdings.tokens.pop(token, None)
        if self._connection.closed or self._connection.lost is not None:
            return
        with self._connection.transaction(session_id, doing, synced=False) as conn:
            # Many claims a statement: each step hands the GIL back (a registry closing
            # 10,000 sessions made 10,000 steps). A row whose session id and token are
            # both among the chunk's is one of its claims: a token is written with its
            # own session's id only.
            for lo in range(0, len(claims), _RELEASES_PER_DELETE):
                chunk = claims[lo : lo + _RELEASES_PER_DELETE]
                marks = ",".join("?" * len(chunk))
                conn.execute(
                    f"DELETE FROM writers WHERE session_id IN ({marks}) AND token IN ({marks})",
                    [sid for sid, _ in chunk] + [token for _, token in chunk],
                )

    # -- extras --------------------------------------------------------------------------

    def index(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """Every stored session's size, next seq, latest time and holder, sorted by id, in
        one query; only ids starting with ``prefix``, after ``after``, at most ``limit``.

        No event is decoded, so a session with a damaged row is still listed
        (a damaged time or seq is reported in its `error`). Used by
        `nous_actor.store.list_sessions` (which checks the arguments).

        The page is the one `MemoryStore` answers, for any arguments `list_sessions`
        lets through: a limit past SQLite's integers lists every session, and a
        ``prefix`` or ``after`` holding a lone surrogate (which SQLite cannot bind, and
        no stored id holds) is answered without binding it.

        Raises:
            StoreError: the store failed as a whole (closed, file gone, SQLite error).
        """
        where: list[str] = []
        params: list[object] = []
        if _surrogate_at(prefix) is not None:  # no stored id starts so
            with self._connection.locked(None, "list sessions"):  # (closed: still raises)
                return []
        if prefix:
            where.append("substr(session_id, 1, ?) = ?")
            params += [len(prefix), prefix]
        if after is not None:
            cut = _surrogate_at(after)
            if cut is None:
                where.append("session_id > ?")
                params.append(after)
            else:  # the ids after it are those from its text before the surrogate, followed
                # by the first code point past the surrogates (no stored id holds one)
                where.append("session_id >= ?")
                params.append(after[:cut] + _PAST_SURROGATES)
        params.append(-1 if limit is None else min(limit, _MAX_LIMIT))
        with self._connection.locked(None, "list sessions") as conn:
            # A time that is not UTF-8 is read as its bytes: listed as malformed (`_info`).
            rows = query_on(conn)(
                "SELECT g.session_id, g.n, g.top, g.last, w.pid, w.token FROM "
                "(SELECT session_id, COUNT(*) AS n, MAX(seq) AS top, MAX(time) AS last "
                f"FROM events {'WHERE ' + ' AND '.join(where) if where else ''} "
                "GROUP BY session_id ORDER BY session_id LIMIT ?) AS g "
                "LEFT JOIN writers AS w ON w.session_id = g.session_id ORDER BY g.session_id",
                params,
            )
        me = os.getpid()
        with _live_lock:
            return [
                dataclasses.replace(
                    _info(str(sid), count, top, last), holder=_holder_name(pid, token, me)
                )
                for sid, count, top, last, pid, token in rows
            ]

    # -- sharing with other processes (see nous_actor.store.shared) -------------------------

    def load_since(self, session_id: str, from_seq: int) -> list[Event]:
        """The stored events of `session_id` with ``seq >= from_seq``, in seq order, read
        without a claim, on a connection of their own (never behind this store's writes).

        Raises:
            StoreError: the id is not valid, the store is closed or failed.
        """
        session_id = valid_store_id(session_id)
        from_seq = _check_from_seq(from_seq)
        # On the follower's connection: a read never waits behind this process's writes
        # (which may be waiting for another process's write lock).
        rows = follower_of(self._connection).rows(session_id, from_seq)
        with self._connection.translate(session_id, "load the session"):  # read to be looked at
            return passing_events_from_rows(rows)

    def load_surface(self, session_id: str) -> tuple[list[int], list[Message]]:
        """The committed surface of `session_id`, projected: the seqs and the messages of
        ``Log.restore(load_since(session_id, 0)).derive_indexed()``, read as `load_since`
        reads (without a claim, on a connection of its own), without an event per row
        (`surface_from_rows`: a reader's cold read). Every row is checked when read.

        Raises:
            StoreError: the id is not valid, the store is closed or failed, or a stored
                row is malformed.
        """
        session_id = valid_store_id(session_id)
        rows = follower_of(self._connection).rows(session_id)
        with self._connection.translate(session_id, "load the session"):
            return surface_from_rows(rows)

    def watch(
        self,
        session_id: str,
        from_seq: int = 0,
        *,
        buffer: int = DEFAULT_WATCH_BUFFER,
        timeout: float = 30.0,
    ) -> Subscription:
        """Every committed event of `session_id` with ``seq >= from_seq``, exactly once, in
        seq order, from any process: the file is followed (``PRAGMA data_version``, every
        few milliseconds while anything watches it), so a commit is seen within ms.

        Raises:
            StoreError: the id is not valid, or the store is closed.
            TypeError, ValueError: `from_seq`, `buffer` or `timeout` (the gets' default
                bound: a number of seconds, not NaN) is not valid.
        """
        session_id = valid_store_id(session_id)
        from_seq = _check_from_seq(from_seq)
        buffer = _check_buffer(buffer)
        timeout = check_bound(timeout, "watch(timeout)")
        return follower_of(self._connection).add(session_id, from_seq, buffer, timeout)

    def next_seq(self, session_id: str) -> int:
        """The next seq of `session_id`'s stored history (0 if it has none), from any
        process, without a claim: one indexed read, nothing decoded.

        Raises:
            StoreError: the id is not valid, or the store is closed.
        """
        session_id = valid_store_id(session_id)
        rows = follower_of(self._connection).query(
            "SELECT max(seq) FROM events WHERE session_id = ?", (session_id,)
        )
        last = rows[0][0] if rows else None
        return 0 if last is None else int(last) + 1

    def held_by(self, session_id: str) -> str | None:
        """``"this process"`` or ``"process <pid>"`` holding a live claim on
        `session_id`, or `None`."""
        session_id = valid_store_id(session_id)
        rows = follower_of(self._connection).query(
            "SELECT pid, token FROM writers WHERE session_id = ?", (session_id,)
        )
        if not rows:
            return None
        pid, token = rows[0]
        with _live_lock:
            return _holder_name(pid, token, os.getpid())

    def advertise(self, address: str | None) -> None:
        """Where this store object's process answers calls for the sessions it holds
        (``None``: it answers none): written with every claim this store object takes
        from now on, in the claim's own transaction (`claim`, `claim_many`), and at once
        into the rows of the claims it holds now, in one transaction. Opaque text of at
        most 1024 characters.

        A claim and an advertise never cross: a claim committed before this call's
        transaction has its row updated by it, one after carries the new address.
        Claims of other store objects, of this process or another, keep theirs.
        If it raises `StoreError` after the checks, later claims still carry the new
        address, and the rows held now may not: call it again.

        Raises:
            TypeError: ``address`` is not a str or ``None``.
            ValueError: ``address`` is longer than 1024 characters or not valid
                Unicode text (nothing was changed).
            StoreError: the store is closed or failed.
        """
        self._holdings.address = _check_address(address)
        with self._connection.transaction(None, "advertise the address", synced=False) as conn:
            with _live_lock:
                held = self._holdings.live()
            now = self._holdings.address  # the last one set, if two advertises cross
            for lo in range(0, len(held), _IN_CHUNK):
                conn.executemany(
                    "UPDATE writers SET address = ? WHERE session_id = ? AND token = ?",
                    [(now, sid, token) for sid, token in held[lo : lo + _IN_CHUNK]],
                )

    def holder_address(self, session_id: str) -> tuple[str, str | None] | None:
        """Who holds a live claim on `session_id` and where it answers: ``(holder,
        address)``, ``holder`` as `held_by` names it, ``address`` as the holder
        advertised it when it took or last advertised the claim (``None``: none
        advertised, as in every claim of a release before schema version 2);
        ``None`` when no live claim (the liveness rule of `held_by`). Read on the
        follower's connection, without a claim.

        Raises:
            StoreError: the id is not valid, the store is closed or failed.
        """
        session_id = valid_store_id(session_id)
        connection = self._connection
        if connection.lost is not None:
            raise StoreError(connection.lost, session_id=session_id)
        row = _claim_row(follower_of(connection).query, session_id)
        if row is None:
            return None
        pid, token, address = row
        with _live_lock:
            holder = _holder_name(pid, token, os.getpid())
        if holder is None:
            return None
        return holder, address if isinstance(address, str) else None

    def write_turn(self) -> contextlib.AbstractContextManager[bool]:
        """This store's turn at writing the file among the processes that write it,
        taken ahead of a write (by the store's committer, before it fills a
        transaction): whether it came. A write made in the block by the same thread
        takes no other turn; other threads' writes wait for the block to end."""
        return self._connection.turn()

    def forwarding_key(self) -> bytes:
        """This store's shared secret: 32 random bytes (``os.urandom``), made once per
        store by the first process that asks, in a write transaction that stores a
        key only where none is (two processes asking at once get the same bytes), and
        kept in the file's ``keys`` table, so every process that opens the store reads
        the same bytes (this object reads it once). Whoever can read the file can
        read it.

        Raises:
            StoreError: the store is closed or failed, or it cannot be made (a store
                opened read-only at schema version 1 or 2: open it once for writing).
        """
        key = self._forwarding_key
        if key is None:  # read once: a process looks for it at each call it forwards
            key = self._forwarding_key = _forwarding_key(self._connection)
        return key

    def ask_handoff(self, session_id: str, seconds: float) -> None:
        """Ask whoever holds `session_id` to hand it over: a request of this process, in
        the file, standing for `seconds` (or until this process claims the session, or
        withdraws it)."""
        session_id = valid_store_id(session_id)
        seconds = check_seconds(seconds, "seconds")
        with self._connection.transaction(session_id, "ask for the session", synced=False) as conn:
            conn.execute(_HANDOFFS_TABLE)
            conn.execute(
                "INSERT OR REPLACE INTO handoffs (session_id, pid, until) VALUES (?, ?, ?)",
                (session_id, os.getpid(), _now_text(seconds)),
            )
            self._asked.add(session_id)  # (under the store's lock, as a claim reads it)

    def withdraw_handoff(self, session_id: str) -> None:
        """Take this process's request for `session_id` back."""
        session_id = valid_store_id(session_id)
        if session_id not in self._asked:
            return  # never asked, or withdrawn by the claim that took the session
        with self._connection.transaction(
            session_id, "withdraw the request", synced=False
        ) as conn:
            conn.execute(
                "DELETE FROM handoffs WHERE session_id = ? AND pid = ?", (session_id, os.getpid())
            )
            self._asked.discard(session_id)

    def handoff_requests(self) -> list[str]:
        """The sessions this process holds that a live process asks for."""
        follower = follower_of(self._connection)
        if not self._handoffs_made:
            # The first request of any process makes the table: until then nobody asked,
            # and a look (every `handoff_poll` while this process holds a session) reads
            # one row of the schema instead of failing a statement.
            if not follower.query(_HANDOFFS_MADE):
                return []
            self._handoffs_made = True
        rows = follower.query(_HANDOFF_ROWS, (os.getpid(),))
        if not rows:
            return []  # the common case: no request, and no clock read
        now = _now_text()  # a request stands until its time (text, compared as SQL would)
        rows = [row[:3] for row in rows if isinstance(row[3], str) and row[3] > now]
        with _live_lock:
            # Several processes may ask for one session: one row each.
            held = [(str(sid), pid) for sid, token, pid in rows if token in _live_tokens]
            stale = {(str(sid), str(token)) for sid, token, _ in rows if token not in _live_tokens}
        for sid, token in sorted(stale):  # a claim of this process that no session holds any
            self.release(sid, token)  # more (its release failed): let the asker have it
        alive: dict[int, bool] = {}
        # An asker that died asks nothing, and never hides the request of one that lives.
        return sorted({sid for sid, pid in held if alive.setdefault(pid, _pid_alive(pid))})

    def wait_changed(self, after: int, timeout: float) -> int:
        """Wait at most `timeout` s for a commit to the file (by any process) after the
        change counter `after`; returns the counter now."""
        return follower_of(self._connection).wait_changed(after, timeout)

    def close(self) -> None:
        """Close the file; the claims this object still holds are given up first (its
        sessions can write no more), so another store object of this process, or
        another process, may claim them at once."""
        with _live_lock:
            held = self._holdings.live()
        if held:
            try:
                self._release(held, None, "release the sessions")
            except StoreError:  # the file is gone or failing: the tokens are let go
                pass
        self._connection.close()
        close_follower(self._connection)
        self._connection.release_file()

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` result (``"ok"`` when healthy)."""
        with self._connection.locked(None, "check integrity") as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r} durability={self.durability}>"
