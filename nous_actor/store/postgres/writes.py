"""Writes of `nous_actor.store.postgres`: fencing, one write transaction, and its settlement.

`_fence` is the one check every write transaction makes (and a snapshot's
drop): it locks the sessions' claim rows and says which may be written under
which epoch. `_Write` is one `PostgresStore.write`: fence, insert, notify,
commit (in the common case, all but the commit in one statement), retried on
a new connection when nothing can have committed, and settled by reading the
outcome back from the server when the connection was lost during ``COMMIT``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import psycopg
import psycopg.errors

from nous_actor._log import get_logger
from nous_actor.core._frozen import describe_error
from nous_actor.core.codec import CodecError, encode_data, format_time
from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store.base import CallRecords, valid_store_id
from nous_actor.store.postgres.connection import _Context, _Link, _rollback, _was_cut
from nous_actor.store.postgres.failures import (
    _again,
    _connection_lost,
    _fenced,
    _first_line,
    _held_elsewhere,
    _lost_connection,
)
from nous_actor.store.postgres.leases import _Leases
from nous_actor.store.postgres.schema import BEGIN_WRITE, _Sql

_MAX_SEQ: Final = 2**63 - 1

logger = get_logger("nous_actor.store.postgres")  # the package's name

# -- fencing: one check, used by every write transaction -------------------------------


_FENCE_COLUMNS: Final = (
    "session_id, epoch, lease_until > clock_timestamp() AS live, holder, lease_until"
)
"""A claim row as the fence reads it: its session, epoch, whether its lease is live, its
holder and the lease's end."""


_FENCED: Final = "(SELECT count(*) FROM f) >= 0"
"""In the one-statement write (`_Write._at_once`), a condition that holds once the claim
rows (the CTE ``f``) are read and locked: an insert or delete that waits for it takes
no row before those locks (the count is read once, before its first row), as the
step-by-step write does. A row inserted before them would let a takeover's new holder,
writing the same session, and this write each wait for a row of the other."""
_AFTER_THE_FENCE: Final = f" WHERE {_FENCED}"


_WAKE_UPS: Final = "woke AS (SELECT pg_notify(%b, p) FROM unnest(%b::text[]) AS p)"
"""The CTE that queues a write's wake-ups (the channel, then `_Write._wakeups`): its count
must be selected, or it does not run."""


def _lock_claims(claims: str) -> str:
    """The fence's read of the claim rows of the sessions ``%b``: locked ``FOR KEY SHARE``
    in session id order (see `_fence`), as every write reads them."""
    return (
        f"SELECT {_FENCE_COLUMNS} FROM {claims} "
        "WHERE session_id = ANY(%b) ORDER BY session_id FOR KEY SHARE"
    )


def _insert_rows(events: str, where: str = "") -> str:
    """The insert of a write's rows, one array a column (see `_Write._rows`)."""
    return (
        f"INSERT INTO {events} (session_id, seq, epoch, type, time, data) "
        "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::text[], "
        f"%b::timestamptz[], %b::text[]){where}"
    )


def _insert_calls(calls: str, where: str = "") -> str:
    """The insert of a write's call records: its Unix time, then one array a column of
    ``(session id, call id, first seq, last seq)``; a record already there is kept."""
    return (
        f"INSERT INTO {calls} (at, session_id, call, first, last) "
        "SELECT %b, * FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::bigint[])"
        f"{where} ON CONFLICT (session_id, call) DO NOTHING"
    )


def _fence(
    conn: psycopg.Connection[Any], leases: _Leases, session_ids: Sequence[str]
) -> tuple[dict[str, StoreError], dict[str, int]]:
    """Inside the caller's transaction: lock the sessions' claim rows (``FOR KEY SHARE``)
    and say which sessions may not be written and why, and the epoch each other one
    is written under (its claim in ``leases``, or 0 for a session the store has not
    claimed).

    The lock keeps a takeover (which locks the row ``FOR UPDATE``) from
    committing until this transaction ends, so what is checked here holds
    at commit. The rows are locked in session id order, the order in which a
    batch of claims locks them: in any other, a write and a batch of claims
    (another process opening the same sessions) could each wait for a row the
    other holds, and the server would end one of them (a deadlock).
    """
    rows = conn.execute(_lock_claims(leases.claims_table), (list(session_ids),)).fetchall()
    return _judge(rows, leases, session_ids, lose=True)


def _judge(
    rows: Sequence[Sequence[Any]], leases: _Leases, session_ids: Sequence[str], *, lose: bool
) -> tuple[dict[str, StoreError], dict[str, int]]:
    """`_fence`'s verdict on the claim ``rows`` it read; with ``lose``, a claim found
    taken over or expired is marked lost in ``leases``, and one whose deadline passed
    unrenewed is marked lapsed (refused until a renewal finds its lease unchanged).
    Without, nothing changes: a write that tried its luck checks again before it
    refuses anything."""
    found = {str(r[0]): r for r in rows}
    now = time.monotonic()
    refused: dict[str, StoreError] = {}
    epochs: dict[str, int] = {}
    for sid in session_ids:
        row = found.get(sid)
        mine = leases.get(sid)
        if mine is None:
            if row is not None and row[2]:
                refused[sid] = _held_elsewhere(
                    sid, row[3], row[4], "another writer holds this session's lease"
                )
            else:
                epochs[sid] = 0
        elif row is None or row[1] != mine.epoch or not row[2]:
            err: StoreError = _fenced(sid, mine.epoch, row)
            if lose:
                leases.lose(sid, mine, err)
            refused[sid] = err
        elif mine.lost is not None:
            refused[sid] = _again(mine.lost, sid)
        elif now >= mine.deadline:
            err = StoreError(
                "its lease could not be renewed in time, so it was failed closed before "
                "the lease ran out; nothing of this write was stored. Write again once the "
                "server answers (writes resume when a renewal finds the lease still this "
                "writer's), or restart the session (it reloads from the store)",
                session_id=sid,
            )
            if lose:
                leases.lapse(sid, mine, err)
            refused[sid] = err
        else:
            epochs[sid] = mine.epoch
    return refused, epochs


# -- one write transaction ---------------------------------------------------------------------


def _batches(
    appends: Mapping[str, Sequence[Event]],
) -> tuple[list[tuple[str, list[Event]]], dict[str, StoreError]]:
    """The sessions of a `PostgresStore.write` to write, with their events, and those
    refused at once: a seq repeated in the call (`ConflictError`), a seq that does
    not fit in 64 bits (`StoreError`; the other sessions are still written).

    Raises:
        StoreError: a session id is not valid.
    """
    batches: list[tuple[str, list[Event]]] = []
    for sid, evs in appends.items():
        if not evs:
            continue
        sid = valid_store_id(sid)
        batches.append((sid, list(evs)))
    refused: dict[str, StoreError] = {}
    todo: list[tuple[str, list[Event]]] = []
    for sid, events in batches:
        seqs = [ev.seq for ev in events]
        big = [s for s in seqs if not 0 <= s <= _MAX_SEQ]
        if big:
            refused[sid] = _unstorable(
                sid, OverflowError(f"seq {big[0]} does not fit in PostgreSQL's bigint")
            )
        elif len(set(seqs)) != len(seqs):
            refused[sid] = ConflictError(
                "a seq appears twice in this write; reopen the session to continue from the store",
                session_id=sid,
            )
        else:
            todo.append((sid, events))
    return todo, refused


def _unstorable(sid: str, exc: BaseException) -> StoreError:
    return StoreError(
        f"an event of this session cannot be stored ({describe_error(exc)}; seqs must be "
        "below 2**63), so none of this write's events of it were; the other sessions' "
        "events were: refuse such a value before appending it, and restart the session "
        "(it reloads from the store)",
        session_id=sid,
    )


def _plain_time(t: datetime) -> datetime:
    """``t`` as an exact `datetime` (a subclass's text form is checked, not trusted)."""
    if type(t) is datetime:
        return t
    back = datetime.fromisoformat(format_time(t))
    if back.tzinfo is None or back != t:
        raise ValueError(f"the time's text form {format_time(t)!r} is not it")
    return back


def _encode(
    batches: list[tuple[str, list[Event]]], refused: dict[str, StoreError]
) -> dict[str, list[tuple[int, str, datetime, str]]]:
    """Each session's rows (seq, type, time, data), made apart: a session whose rows
    cannot be made (data the codec cannot encode, a time without a text form) is
    put into ``refused`` alone."""
    encoded: dict[str, list[tuple[int, str, datetime, str]]] = {}
    for sid, events in batches:
        try:
            encoded[sid] = [
                (ev.seq, ev.type.value, _plain_time(ev.time), encode_data(ev)) for ev in events
            ]
        except Exception as exc:
            refused[sid] = _unstorable(sid, exc)
    return encoded


class _Unknown(Exception):
    """The connection was lost during COMMIT: the outcome must be read back."""

    def __init__(self, xid: str, cause: BaseException) -> None:
        super().__init__(xid)
        self.xid = xid
        self.cause = cause
        self.reason = _first_line(cause)  # as logged and told


class _Write:
    """One `PostgresStore.write`: fence, insert, notify, commit; retried or resolved."""

    def __init__(
        self,
        batches: list[tuple[str, list[Event]]],
        *,
        ctx: _Context,
        q: _Sql,
        main: _Link,
        leases: _Leases,
        closing: threading.Event,
        check_open: Callable[[], None],
        calls: CallRecords | None = None,
        forget_before: int | None = None,
    ) -> None:
        self.ctx = ctx
        # The forwarded calls to record, and the Unix time before which records are
        # forgotten in this write (None: not in this one).
        self.calls = calls or None
        self.forget_before = forget_before
        self.q = q
        self.main = main
        self.leases = leases
        self.closing = closing
        self.check_open = check_open
        # Sessions whose rows cannot be made are refused before any attempt.
        self.unstorable: dict[str, StoreError] = {}
        self.encoded = _encode(batches, self.unstorable)
        self.sids = [sid for sid, _ in batches if sid in self.encoded]
        # Of the attempt being committed: who was refused, and the epoch of each row.
        self.refused: dict[str, StoreError] = {}
        self.epochs: dict[str, int] = {}

    def run(self) -> dict[str, StoreError]:
        """Write the sessions; returns those refused (see `PostgresStore.write`)."""
        refused = self._run() if self.sids else {}
        return {**refused, **self.unstorable}

    def _run(self) -> dict[str, StoreError]:
        self.ctx.here()
        deadline = time.monotonic() + self.ctx.timeout
        delay = 0.0
        sid = self.sids[0] if len(self.sids) == 1 else None
        while True:
            with self.main.lock:
                self.check_open()
                conn = self.main.get(deadline)
                try:
                    # Bounded on the client too (see _Watchdog): a connection that does not
                    # answer is cut, which ends here as a lost connection (during COMMIT:
                    # `_Unknown`, and the outcome is read back).
                    with self.ctx.bounded(conn, deadline, self.main.name, "append events"):
                        return self._in_transaction(conn, self._at_once)
                except _Unknown as unknown:
                    waited = _was_cut(conn)
                    if waited is not None:
                        unknown.reason = (
                            f"the server did not answer in {waited:.3g} s, so the connection "
                            "was cut"
                        )
                    self.main.drop()
                    if self._resolve(unknown, deadline):
                        return self.refused
                    # It did not commit: nothing was stored, so try again.
                except (psycopg.Error, CodecError) as exc:
                    lost = isinstance(exc, psycopg.Error) and _lost_connection(exc, conn)
                    if lost:
                        self.main.drop()  # nothing was committed: try again
                    if not lost or time.monotonic() + delay >= deadline:
                        raise self.ctx.error(exc, sid, "append events", conn) from exc
                    _connection_lost(self.ctx.location, "main", "append events", exc)
            self.closing.wait(delay)
            delay = min(max(delay * 2, 0.02), 1.0)

    def _in_transaction(
        self,
        conn: psycopg.Connection[Any],
        body: Callable[[psycopg.Connection[Any]], str | dict[str, StoreError]],
    ) -> dict[str, StoreError]:
        """One write transaction: ``BEGIN``, then ``body``, which answers the transaction
        id to commit, or the write's answer once it ended the transaction itself (rolled
        back, with nothing to write or to go on in a slower path); whatever it raises
        rolls the transaction back. Once committed: the sessions refused. (Not
        `connection._transaction`: a write begins with `BEGIN_WRITE`, and a commit whose
        answer is lost is settled by `_resolve`.)"""
        conn.execute(BEGIN_WRITE)
        try:
            got = body(conn)
        except BaseException:
            _rollback(conn)
            raise
        if isinstance(got, dict):
            return got
        self._commit(conn, got)
        return self.refused

    def _at_once(self, conn: psycopg.Connection[Any]) -> str | dict[str, StoreError]:
        """The common case in one statement: lock and read the claim rows (the fence),
        insert every session's rows under the epoch its claim here says, record the
        forwarded calls (forgetting the expired records if this write is the one to)
        and queue the wake-ups. The transaction id if the fence lets every session be
        written; else (a session refused, a conflict, a refused value) it rolls back,
        so nothing of it is kept, and writes step by step, which says who is refused
        and why.

        Three round trips a write (begin, this, commit) where the steps take four or
        five: less work for the server and for the committer, most where small writes
        are many (several processes, each committing the sessions it holds)."""
        q = self.q
        epochs: dict[str, int] = {}
        for sid in self.sids:
            mine = self.leases.get(sid)
            epochs[sid] = 0 if mine is None else mine.epoch
        self.epochs = epochs
        calls = self._call_rows()
        params: list[Any] = [
            self.sids,
            *self._rows(self.sids),
            q.commits,
            self._wakeups(self.sids),
        ]
        record = ""
        if calls:
            record = f", rec AS ({_insert_calls(q.calls, _AFTER_THE_FENCE)})"
            params += [int(time.time()), *(list(col) for col in zip(*calls, strict=True))]
            if self.forget_before is not None:  # and the expired records forgotten
                record += f", gone AS (DELETE FROM {q.calls} WHERE at < %b AND {_FENCED})"
                params.append(self.forget_before)
        try:
            rows = conn.execute(
                f"WITH f AS MATERIALIZED ({_lock_claims(q.claims)}), "
                f"ins AS ({_insert_rows(q.events, _AFTER_THE_FENCE)} RETURNING 1), "
                f"{_WAKE_UPS}{record}, "
                "done AS (SELECT pg_current_xact_id()::text AS xid, "
                "(SELECT count(*) FROM ins) AS n, (SELECT count(*) FROM woke) AS w) "
                # Every count is selected: a column left out is not computed, and its
                # CTE (the wake-ups') would not run.
                "SELECT f.*, done.xid, done.n, done.w FROM done LEFT JOIN f ON true",
                params,
            ).fetchall()
        except (psycopg.errors.UniqueViolation, psycopg.DataError):
            return self._instead(conn, self._stepwise)
        refused, _ = _judge(
            [r for r in rows if r[0] is not None], self.leases, self.sids, lose=False
        )
        if refused:
            return self._instead(conn, self._stepwise)
        self.refused = {}
        return str(rows[0][5])

    def _instead(
        self,
        conn: psycopg.Connection[Any],
        body: Callable[[psycopg.Connection[Any]], str | dict[str, StoreError]],
    ) -> dict[str, StoreError]:
        """Roll this transaction back (nothing of it is kept) and write in ``body``'s
        transaction instead."""
        conn.execute("ROLLBACK")
        return self._in_transaction(conn, body)

    def _stepwise(self, conn: psycopg.Connection[Any]) -> str | dict[str, StoreError]:
        """A write whose sessions are not all written at once (an `_in_transaction` body):
        fence, then insert those the fence lets through (session by session after a
        conflict or a refused value), record."""
        self.refused, self.epochs = _fence(conn, self.leases, self.sids)
        if not self.epochs:
            conn.execute("ROLLBACK")
            return self.refused
        try:
            xid = self._insert(conn, list(self.epochs))
            self._record(conn)
        except (psycopg.errors.UniqueViolation, psycopg.DataError):
            # A conflict, or a value the server refuses: session by session, so that it
            # refuses its own session alone.
            return self._instead(conn, self._one_by_one)
        return xid

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
        q = self.q
        row = conn.execute(
            f"WITH ins AS ({_insert_rows(q.events)} RETURNING 1), {_WAKE_UPS} "
            "SELECT pg_current_xact_id()::text, (SELECT count(*) FROM ins), "
            "(SELECT count(*) FROM woke)",
            (*self._rows(sids), q.commits, self._wakeups(sids)),
        ).fetchone()
        assert row is not None
        return str(row[0])

    def _call_rows(self) -> list[tuple[str, str, int, int]]:
        """The forwarded calls to record: ``(session id, call id, first seq, last seq)`` of
        the sessions written (``epochs``)."""
        if self.calls is None:
            return []
        return [
            (sid, call, first, last)
            for sid, made in self.calls.items()
            if sid in self.epochs
            for call, first, last in made
        ]

    def _record(self, conn: psycopg.Connection[Any]) -> None:
        """Record the forwarded calls of the sessions written (``epochs``) in this
        transaction; forget the expired records if this write is the one to."""
        rows = self._call_rows()
        if not rows:
            return
        q = self.q
        conn.execute(
            _insert_calls(q.calls),
            (int(time.time()), *(list(col) for col in zip(*rows, strict=True))),
        )
        if self.forget_before is not None:
            conn.execute(f"DELETE FROM {q.calls} WHERE at < %b", (self.forget_before,))

    def _one_by_one(self, conn: psycopg.Connection[Any]) -> str | dict[str, StoreError]:
        """The slow path after a conflict or a refused value (an `_in_transaction` body):
        each session in a savepoint of its own."""
        q = self.q
        self.refused, self.epochs = _fence(conn, self.leases, self.sids)
        for sid in list(self.epochs):
            conn.execute("SAVEPOINT session_write")
            try:
                conn.execute(_insert_rows(q.events), self._rows([sid]))
            except psycopg.errors.UniqueViolation:
                conn.execute("ROLLBACK TO SAVEPOINT session_write")
                del self.epochs[sid]
                self.refused[sid] = ConflictError(
                    "a seq in this write is already stored (a second writer?); reopen "
                    "the session to continue from the store",
                    session_id=sid,
                )
            except psycopg.DataError as exc:
                conn.execute("ROLLBACK TO SAVEPOINT session_write")
                del self.epochs[sid]
                self.refused[sid] = _unstorable(sid, exc)
            conn.execute("RELEASE SAVEPOINT session_write")
        if not self.epochs:
            conn.execute("ROLLBACK")
            return self.refused
        self._record(conn)
        row = conn.execute(
            f"WITH {_WAKE_UPS} SELECT pg_current_xact_id()::text, (SELECT count(*) FROM woke)",
            (q.commits, self._wakeups(list(self.epochs))),
        ).fetchone()
        assert row is not None
        return str(row[0])

    def _resolve(self, unknown: _Unknown, deadline: float) -> bool:
        """Read back a commit whose answer was lost: whether it committed.

        First the transaction's status (``pg_xact_status``), then its rows with
        their epoch, which must agree.

        Raises:
            StoreError: the outcome could not be read back in time.
        """
        q = self.q
        logger.warning(
            "store.commit_outcome_unknown",
            store=self.ctx.location,
            xid=unknown.xid,
            reason=unknown.reason,
        )
        cols = self._rows(list(self.epochs))
        want = len(cols[0])
        delay = 0.02
        last: BaseException = unknown.cause
        while time.monotonic() < deadline and not self.closing.is_set():
            try:
                conn = self.main.get(deadline)
                with self.ctx.bounded(conn, deadline, self.main.name, "read a commit back"):
                    status_row = conn.execute(
                        "SELECT pg_xact_status(%s::xid8)", (unknown.xid,)
                    ).fetchone()
                    status = None if status_row is None else status_row[0]
                    if status == "in progress":  # the old backend has not finished yet
                        self.closing.wait(delay)
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
                self.main.drop()
                self.closing.wait(delay)
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
        reason = unknown.reason if last is unknown.cause else _first_line(last)
        raise StoreError(
            f"the connection to {self.ctx.location} was lost while committing, and the outcome "
            f"could not be read back in time ({reason}): the events are wholly stored or "
            "wholly absent; restart the sessions to reload them from the store"
        ) from unknown.cause
