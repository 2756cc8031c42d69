"""Claims of `nous_actor.store.postgres`: leases, their renewer, and taking a claim over.

`_Leases` holds one store's claims on its own connection: it takes a claim
(a new epoch from the database's sequence, and the claim's own advisory
lock), decides whether another writer's claim may be taken over (its lease
expired, or its holder's connection is gone), releases claims, and renews
them all from one thread, failing a claim closed before its lease runs out
when it cannot be renewed (until a renewal finds its lease unchanged).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from nous_actor._log import get_logger
from nous_actor.errors import ConflictError, StoreError
from nous_actor.runtime.unique import unique_hex
from nous_actor.store.postgres.connection import T, _Context, _Link, _rollback
from nous_actor.store.postgres.failures import _fenced, _first_line, _held_elsewhere
from nous_actor.store.postgres.schema import BEGIN_WRITE, _Sql

_RENEW_FRACTION: Final = 1 / 3  # renew this far into a lease

logger = get_logger("nous_actor.store.postgres")  # the package's name

_FAIL_CLOSED_FRACTION: Final = 2 / 3  # refuse writes this long after the last renewal began

_UNREACHABLE_S: Final = 1.0
"""How long after a call found the server unreachable a release fails at once (at most
the store's timeout): long enough for a registry giving up its sessions one after the
other during an outage, short enough that releases go through again soon after it."""


def _in_order(table: str, mode: str) -> str:
    """The head of a statement that updates or deletes several claim rows of the sessions
    ``%b`` (its first parameter): the CTE ``o``, which locks them (``FOR`` ``mode``) in
    session id order, the order in which a batch of claims and a write lock them. The
    statement waits for ``o`` with `_AFTER_O`, so that it holds none of the rows before
    it holds them all in that order: in the rows' stored order it could wait for one
    another process holds while holding one that process waits for (a deadlock the
    server ends by failing one of them)."""
    return (
        f"WITH o AS MATERIALIZED (SELECT session_id FROM {table} "
        f"WHERE session_id = ANY(%b) ORDER BY session_id FOR {mode}) "
    )


_SERVER_STARTED: Final = (
    "GREATEST(pg_postmaster_start_time(), (SELECT max(backend_start) FROM "
    "pg_stat_get_activity(NULL) WHERE backend_type = 'checkpointer'))"
)
"""When the server last started, for its locks: a restart, or a reinitialisation after a
server process crashed (a new checkpointer, the same postmaster). A role that may not
see the server's own processes (neither a superuser nor granted ``pg_read_all_stats``)
sees only the restarts."""

_LOCK_TELLS: Final = f"locked AND claimed_at > {_SERVER_STARTED}"
"""Of a claim row: whether its holder's advisory lock, if free, means the holder died. Its
holder must have taken the lock (``locked``) since the server last started (``claimed_at``:
when the claim was taken, or its holder last took its lock back after the server
restarted): a restart drops every lock, also the live holders' (until each takes its own
back, at its next renewal)."""

_RETOOK: Final = (
    f"claimed_at = CASE WHEN u.l AND c.claimed_at <= {_SERVER_STARTED} "
    "THEN clock_timestamp() ELSE c.claimed_at END"
)
"""In a renewal: a claim taken before the server last started, whose lock this store holds
now (taken back on a new connection), says so (see `_LOCK_TELLS`)."""

_AFTER_O: Final = "(SELECT count(*) FROM o) >= 0"
"""The condition of a statement headed by `_in_order`: it holds once ``o`` locked its
rows (the count is read once, before the statement's first row)."""

_ONE_BY_ONE: Final = (
    psycopg.errors.LockNotAvailable,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
)
"""What fails a batch of claims as a whole and yet is one session's: each is then claimed
alone, and the one that still meets it is refused with it."""


@dataclass
class _Claim:
    token: str
    epoch: int
    deadline: float  # time.monotonic() from which writes are refused unless renewed
    locked: bool = False  # holds the claim's advisory lock on the lease connection
    lost: StoreError | None = None  # once set, every write under this claim gets it
    # The deadline a write found passed (failed closed, logged once): not lost, still
    # renewed; writes resume when a renewal finds the lease unchanged and moves it on.
    lapsed: float | None = None


@dataclass(frozen=True, slots=True)
class _ClaimRow:
    """A session's row in the claims table, as `_Leases.claim_row` reads it."""

    epoch: int
    token: str
    holder: str
    until: object  # lease_until, as the server's text
    live: bool  # lease_until > clock_timestamp(), by the database's clock
    locked: bool  # its holder took the claim's advisory lock since the server started
    # (so a free lock means it died: see `_LOCK_TELLS`)


def _taken_over(session_id: str, reason: str, row: _ClaimRow) -> None:
    logger.warning(
        "store.claim_taken_over",
        session_id=session_id,
        reason=reason,
        holder=row.holder,
        epoch=row.epoch,
    )


class _Leases:
    """The claims of one store: its lease connection, and the thread that renews them.

    Holds no reference to the store itself, so that a store nobody uses is
    collected (and its finalizer stops the renewer).
    """

    def __init__(
        self,
        ctx: _Context,
        q: _Sql,
        closing: threading.Event,
        *,
        holder: str,
        lease: float,
        detect_dead: bool,
        claim_wait_ms: int,
    ) -> None:
        self.ctx = ctx
        self.lease = lease
        self.timeout = ctx.timeout
        self.holder = holder
        self.where = ctx.location
        self.detect_dead = detect_dead
        self.claim_wait_ms = claim_wait_ms
        self.claims_table = q.claims
        self.epochs_name = q.epochs
        self.key_prefix = f"{ctx.schema}\x1f"
        self.channel = q.channel
        self.closing = closing
        self.mutex = threading.Lock()
        self.claims: dict[str, _Claim] = {}
        self.pending: dict[str, str] = {}  # the sessions being claimed: their new tokens
        self.address: str | None = None  # written with every claim (see `advertise`)
        self.link = _Link("lease", self.ctx, self.closing, self._relock)
        self.thread: threading.Thread | None = None
        # Wakes the renewer's wait when the store closes (made with the renewer).
        self.wake: tuple[socket.socket, socket.socket] | None = None
        self.renewals = 0

    @property
    def begin(self) -> str:
        """How a claim's transaction begins, in one round trip: it waits for a claim row's
        lock at most ``claim_wait_ms``."""
        return f"{BEGIN_WRITE}; SET LOCAL lock_timeout = {self.claim_wait_ms}"

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
        self._log_lost(session_id, claim, err)

    def lapse(self, session_id: str, claim: _Claim, err: StoreError) -> None:
        """A write found ``claim``'s deadline passed (its renewals failed): the claim is
        failed closed until a renewal finds its lease unchanged (the same epoch, still
        live) and moves the deadline on; it is not lost, and is still renewed. Logged
        once a deadline."""
        with self.mutex:
            if claim.lapsed == claim.deadline or claim.lost is not None:
                return
            claim.lapsed = claim.deadline
        self._log_lost(session_id, claim, err)

    def _log_lost(self, session_id: str, claim: _Claim, err: StoreError) -> None:
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
            self._unlock(session_id, claim.token)

    # -- one call on the lease connection ----------------------------------------------------

    def _call(
        self, session_id: str | None, doing: str, work: Callable[[psycopg.Connection[Any]], T]
    ) -> T:
        return self.ctx.call(self.link, self.closing, session_id, doing, work)

    def _key(self, sid: str, token: str) -> str:
        """The name of a claim's advisory lock (hashed by the server): one lock per claim,
        not per session, so a writer that takes over a paused holder's claim never needs
        the lock that holder still has, and its own death frees a lock that is its alone."""
        return f"{self.key_prefix}{sid}\x1f{token}"

    def _relock(self, conn: psycopg.Connection[Any]) -> None:
        """A new lease connection holds no advisory lock: take those of our claims again."""
        with self.mutex:
            held = list(self.claims.items())
        for sid, claim in held:
            claim.locked = self._try_lock(conn, sid, claim.token)

    def _unlock(self, session_id: str, token: str) -> None:
        with contextlib.suppress(StoreError, psycopg.Error), self.link.lock:
            conn = self.link.conn
            if conn is not None and not conn.broken and not conn.closed:
                deadline = time.monotonic() + self.timeout
                with self.ctx.bounded(conn, deadline, self.link.name, "release a claim's lock"):
                    self._unlock_on(conn, session_id, token)

    def _unlock_on(self, conn: psycopg.Connection[Any], sid: str, token: str) -> None:
        """Give a claim's advisory lock up (session-level: taken by `_try_lock`)."""
        key = self._key(sid, token)
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))

    # -- where this store answers: written with its claims ------------------------------------

    def advertise(self, address: str | None) -> None:
        """Write ``address`` into the claim rows this store holds now (those whose token
        is ours: a claim taken over meanwhile is not touched) in one statement (one
        transaction), and with every claim it takes from now on.

        Runs on the lease connection, under its lock, as claims do: a claim is either
        taken before (its row is updated here, also when this store has not yet
        recorded it) or after (it writes ``address`` itself). ``address`` becomes this
        store's only once the update committed: a failed call changes nothing.

        Raises:
            StoreError: the store is closed, or the server failed.
        """

        def work(conn: psycopg.Connection[Any]) -> None:
            with self.mutex:
                held = {sid: c.token for sid, c in self.claims.items()}
                held.update(self.pending)
            if held:
                table = self.claims_table
                conn.execute(
                    f"{_in_order(table, 'NO KEY UPDATE')}UPDATE {table} AS c SET address = %s "
                    "FROM unnest(%b::text[], %b::text[]) AS u(s, t) "
                    f"WHERE c.session_id = u.s AND c.token = u.t AND {_AFTER_O}",
                    (list(held), address, list(held), list(held.values())),
                )
            self.address = address

        self._call(None, "advertise the store's address", work)

    # -- claim and release -------------------------------------------------------------------

    def claim(self, session_id: str) -> str:
        with self.mutex:
            if session_id in self.claims or session_id in self.pending:
                raise self._held_here(session_id)
            token = unique_hex()
            self.pending[session_id] = token
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
                self.pending.pop(session_id, None)
        self._start_renewer()
        return token

    def _take(self, conn: psycopg.Connection[Any], sid: str, token: str) -> tuple[int, bool]:
        """One claim transaction: returns (epoch, advisory lock held).

        The claim row records whether its holder holds the claim's advisory
        lock (``locked``): only then does a free lock mean a dead holder. The
        lock is the claim's own (see `_key`), so a claim takes it at once, also
        when it takes over an expired lease whose old holder (paused, not dead)
        still holds its own; it records ``false`` only without dead-holder
        detection, or when the lock could not be had (then a renewal takes it).
        """
        table = self.claims_table
        lease = f"clock_timestamp() + make_interval(secs => {self.lease!r})"
        locked = tried = False

        def lock() -> bool:
            nonlocal locked, tried
            if self.detect_dead and not tried:
                tried = True
                locked = self._try_lock(conn, sid, token)
            return locked

        try:
            conn.execute(self.begin)
            for _ in range(3):
                row = self.claim_row(conn, sid)
                if row is None:
                    new = conn.execute(
                        f"INSERT INTO {table} (session_id, epoch, token, holder, claimed_at, "
                        f"lease_until, locked, address) VALUES (%s, nextval(%s::regclass), %s, "
                        f"%s, clock_timestamp(), {lease}, %s, %s) ON CONFLICT (session_id) "
                        "DO NOTHING RETURNING epoch",
                        (sid, self.epochs_name, token, self.holder, lock(), self.address),
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
                        f"UPDATE {table} SET locked = %s, address = %s, "
                        "claimed_at = clock_timestamp() WHERE session_id = %s",
                        (lock(), self.address, sid),
                    )
                    break
                reason = self.may_take_over(conn, sid, row, "already has a live writer elsewhere")
                lock()  # the new claim holds its own lock
                _taken_over(sid, reason, row)
                new = conn.execute(
                    f"UPDATE {table} SET epoch = nextval(%s::regclass), token = %s, "
                    f"holder = %s, claimed_at = clock_timestamp(), lease_until = {lease}, "
                    "locked = %s, address = %s WHERE session_id = %s RETURNING epoch",
                    (self.epochs_name, token, self.holder, locked, self.address, sid),
                ).fetchone()
                assert new is not None
                epoch = int(new[0])
                break
            else:
                raise StoreError("the claim row kept changing; retry", session_id=sid)
            conn.execute("COMMIT")
        except BaseException:
            if _rollback(conn) and locked:
                with contextlib.suppress(psycopg.Error):
                    self._unlock_on(conn, sid, token)
            raise
        return epoch, locked

    def claim_many(self, ids: Sequence[str]) -> list[str | StoreError]:
        """`claim` each of ``ids`` (valid ids) in one transaction of a few statements,
        whatever their number: for each id, in order, its token or the error that
        refused it (`ConflictError`: held here or by a live writer elsewhere; an id given
        twice is refused the second time). An id another claimer inserted meanwhile,
        or every id of a transaction that failed as a whole (a lock wait past
        ``claim_wait_ms``, a deadlock with another claimer), is claimed alone.

        Raises:
            StoreError: nothing was claimed: the store is closed, or the server could not
                be reached in ``timeout``.
        """
        out: list[str | StoreError | None] = [None] * len(ids)
        todo: dict[str, str] = {}  # the ids to claim here, sorted: their new tokens
        with self.mutex:
            for i, sid in enumerate(ids):
                if sid in self.claims or sid in self.pending or sid in todo:
                    out[i] = self._held_here(sid)
                else:
                    todo[sid] = unique_hex()
            todo = dict(sorted(todo.items()))  # rows locked in one order: no deadlock
            self.pending.update(todo)
        got: dict[str, str | StoreError] = {}
        alone: list[str] = []
        try:
            if todo:
                started = time.monotonic()
                taken, alone = self._call(
                    None, "claim the sessions", lambda conn: self._take_many(conn, todo)
                )
                deadline = started + self.lease * _FAIL_CLOSED_FRACTION
                with self.mutex:
                    for sid, won in taken.items():
                        if isinstance(won, ConflictError):
                            got[sid] = won
                        else:
                            self.claims[sid] = _Claim(todo[sid], won[0], deadline, won[1])
                            got[sid] = todo[sid]
        finally:
            with self.mutex:
                for sid in todo:
                    self.pending.pop(sid, None)
        for sid in alone:
            try:
                got[sid] = self.claim(sid)
            except StoreError as exc:
                if self.closing.is_set():
                    raise
                got[sid] = exc
        if len(got) > len(alone):
            self._start_renewer()
        # The ids refused up front keep their refusal; each other id was claimed once.
        return [got.pop(sid) if done is None else done for sid, done in zip(ids, out, strict=True)]

    def _held_here(self, sid: str) -> ConflictError:
        return ConflictError(
            f"already has a live writer through this store object ({self.holder}); "
            "use that session's handle, or stop it first",
            session_id=sid,
            holder=self.holder,
        )

    def _take_many(
        self, conn: psycopg.Connection[Any], todo: dict[str, str]
    ) -> tuple[dict[str, tuple[int, bool] | ConflictError], list[str]]:
        """One claim transaction for the ids of ``todo`` (sorted, with their tokens):
        (epoch and advisory lock held, or the refusal, by id; the ids another claimer
        inserted meanwhile, for `claim` alone). Safe to run again on a new connection:
        a row holding our token is a claim of ours whose commit's answer was lost."""
        table = self.claims_table
        lease = f"clock_timestamp() + make_interval(secs => {self.lease!r})"
        sids = list(todo)
        out: dict[str, tuple[int, bool] | ConflictError] = {}
        locked: list[str] = []  # session-level advisory locks taken here (undone on failure)
        try:
            conn.execute(self.begin)
            rows = {
                str(r[0]): _ClaimRow(int(r[1]), str(r[2]), str(r[3]), r[4], bool(r[5]), bool(r[6]))
                for r in conn.execute(
                    "SELECT session_id, epoch, token, holder, lease_until, "
                    f"lease_until > clock_timestamp(), {_LOCK_TELLS} FROM {table} "
                    "WHERE session_id = ANY(%b::text[]) ORDER BY session_id FOR UPDATE",
                    (sids,),
                ).fetchall()
            }
            # A live lease whose holder recorded its lock is a dead holder's if that lock
            # is free: looked at for all of them in one statement (held until COMMIT).
            telling = [
                sid
                for sid, row in rows.items()
                if row.token != todo[sid] and row.live and row.locked and self.detect_dead
            ]
            gone: set[str] = set()
            if telling:
                gone = {
                    str(r[0])
                    for r in conn.execute(
                        "SELECT u.s FROM unnest(%b::text[], %b::text[]) AS u(s, k) "
                        "WHERE pg_try_advisory_xact_lock(hashtextextended(u.k, 0))",
                        (telling, [self._key(sid, rows[sid].token) for sid in telling]),
                    ).fetchall()
                }
            own: list[str] = []
            over: dict[str, str] = {}  # taken over: why
            for sid, row in rows.items():
                if row.token == todo[sid]:
                    own.append(sid)
                elif not row.live:
                    over[sid] = "lease_expired"
                elif sid in gone:
                    over[sid] = "holder_connection_gone"
                else:
                    out[sid] = _held_elsewhere(
                        sid, row.holder, row.until, "already has a live writer elsewhere"
                    )
            new = [sid for sid in sids if sid not in rows]
            kept = [sid for sid in sids if sid in rows and sid not in out]  # own, taken over
            has_lock = dict.fromkeys(sids, False)
            if self.detect_dead and kept:
                for r in conn.execute(
                    "SELECT u.s, pg_try_advisory_lock(hashtextextended(u.k, 0)) "
                    "FROM unnest(%b::text[], %b::text[]) AS u(s, k)",
                    (kept, [self._key(sid, todo[sid]) for sid in kept]),
                ).fetchall():
                    has_lock[str(r[0])] = bool(r[1])
                locked = [sid for sid in kept if has_lock[sid]]
            if new:
                # The new claims take their locks in the statement that inserts them (the
                # lock is the claim's own: free), also those another claimer inserted
                # meanwhile, which are let go below.
                take = "pg_try_advisory_lock(hashtextextended(u.k, 0))"
                if self.detect_dead:
                    locked += new
                for r in conn.execute(
                    f"INSERT INTO {table} (session_id, epoch, token, holder, claimed_at, "
                    "lease_until, locked, address) SELECT u.s, nextval(%s::regclass), u.t, "
                    f"%s, clock_timestamp(), {lease}, {take if self.detect_dead else 'false'}, "
                    "%s FROM unnest(%b::text[], %b::text[], %b::text[]) AS u(s, t, k) "
                    "ORDER BY u.s ON CONFLICT (session_id) DO NOTHING "
                    "RETURNING session_id, epoch, locked",
                    (
                        self.epochs_name,
                        self.holder,
                        self.address,
                        new,
                        [todo[sid] for sid in new],
                        [self._key(sid, todo[sid]) for sid in new],
                    ),
                ).fetchall():
                    sid = str(r[0])
                    has_lock[sid] = bool(r[2])
                    out[sid] = (int(r[1]), has_lock[sid])
            if over:
                for sid, reason in over.items():
                    _taken_over(sid, reason, rows[sid])
                taken = list(over)
                for r in conn.execute(
                    f"UPDATE {table} AS c SET epoch = nextval(%s::regclass), token = u.t, "
                    f"holder = %s, claimed_at = clock_timestamp(), lease_until = {lease}, "
                    "locked = u.l, address = %s "
                    "FROM unnest(%b::text[], %b::text[], %b::bool[]) AS u(s, t, l) "
                    "WHERE c.session_id = u.s RETURNING c.session_id, c.epoch",
                    (
                        self.epochs_name,
                        self.holder,
                        self.address,
                        taken,
                        [todo[sid] for sid in taken],
                        [has_lock[sid] for sid in taken],
                    ),
                ).fetchall():
                    out[str(r[0])] = (int(r[1]), has_lock[str(r[0])])
            if own:
                conn.execute(
                    f"UPDATE {table} AS c SET locked = u.l, address = %s, "
                    "claimed_at = clock_timestamp() "
                    "FROM unnest(%b::text[], %b::bool[]) AS u(s, l) WHERE c.session_id = u.s",
                    (self.address, own, [has_lock[sid] for sid in own]),
                )
                for sid in own:
                    out[sid] = (rows[sid].epoch, has_lock[sid])
            # Inserted by another claimer since the look above: claimed alone, after this
            # (their locks, taken by the insert, let go).
            alone = [sid for sid in new if sid not in out]
            if self.detect_dead:
                for sid in alone:
                    self._unlock_on(conn, sid, todo[sid])
                    locked.remove(sid)
            conn.execute("COMMIT")
        except BaseException as exc:
            if _rollback(conn):
                with contextlib.suppress(psycopg.Error):
                    for sid in locked:
                        self._unlock_on(conn, sid, todo[sid])
            if isinstance(exc, _ONE_BY_ONE):
                return {}, sids  # each claimed alone: the wait or deadlock is its own
            raise
        return out, alone

    def _try_lock(
        self, conn: psycopg.Connection[Any], sid: str, token: str, *, until_commit: bool = False
    ) -> bool:
        """Take the advisory lock of the claim ``token`` of ``sid`` if it is free:
        session-level (it outlives the transaction, until unlocked), or with
        ``until_commit`` only until the transaction ends.
        """
        take = "pg_try_advisory_xact_lock" if until_commit else "pg_try_advisory_lock"
        row = conn.execute(
            f"SELECT {take}(hashtextextended(%s, 0))", (self._key(sid, token),)
        ).fetchone()
        return bool(row and row[0])

    # -- whether a claim may be taken over: one check, for claim and delete ---------------------

    def claim_row(self, conn: psycopg.Connection[Any], sid: str) -> _ClaimRow | None:
        """Inside the caller's transaction: the session's claim row, locked ``FOR UPDATE``
        (so no other claim, renewal or delete changes it until the transaction ends), or
        `None` if nobody claims the session."""
        row = conn.execute(
            "SELECT epoch, token, holder, lease_until, lease_until > clock_timestamp(), "
            f"{_LOCK_TELLS} FROM {self.claims_table} WHERE session_id = %s FOR UPDATE",
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
    ) -> str:
        """Whether another writer's claim ``row`` (from `claim_row`, in the same
        transaction) may be taken over or removed; returns why it may:
        ``"lease_expired"`` (by the database's clock) or ``"holder_connection_gone"``.

        A live lease's holder is dead when its row records that it took its
        claim's advisory lock since the server last started (`_LOCK_TELLS`) and
        this connection can take that lock now: the server drops a connection's
        locks when its process dies, while a paused or partitioned holder keeps its
        own. A restart drops every lock, also a live holder's, so until the holder
        takes its lock back (at its next renewal) its lease alone decides. Never so
        with dead-holder detection off.
        The lock is taken only to look, until the caller's transaction ends.

        Raises:
            ConflictError: the lease is live and its holder's connection is not known
                to be gone (the message starts with ``refusal`` and names the holder).
        """
        if not row.live:
            return "lease_expired"
        telling = row.locked and self.detect_dead  # its free lock would mean it died
        if telling and self._try_lock(conn, sid, row.token, until_commit=True):
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
        # Best effort: a process giving its sessions up while the server is down (a
        # registry closing during an outage) must not wait the whole timeout for each.
        ago = self.link.unreachable_for(min(self.timeout, _UNREACHABLE_S))
        if ago is not None:
            raise self._unreleased(
                session_id, f"the server could not be reached {ago:.2g} s ago (not tried again)"
            )
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
                self._unlock_on(conn, session_id, token)

        try:
            self._call(session_id, "release the session", work)
        except StoreError as exc:
            if self.closing.is_set():
                raise
            raise self._unreleased(session_id, exc._message) from exc

    def _unreleased(self, session_id: str, why: str) -> StoreError:
        return StoreError(
            f"could not release the claim ({why}); nothing to do: its lease lapses by "
            f"itself within {self.lease:g} s, and the session may be claimed again then",
            session_id=session_id,
        )

    def release_all(self) -> None:
        """Closing: give every claim up at once (best effort: a lease left lapses by itself)."""
        with self.mutex:
            claims, self.claims = self.claims, {}
        if not claims:
            return
        table = self.claims_table
        deadline = time.monotonic() + self.timeout
        # Within the store's timeout, all told: a renewal holding the connection ends
        # within its own bound (see _Watchdog), and the release is bounded as a call.
        if not self.link.lock.acquire(timeout=self.timeout + self.ctx.margin):
            return
        try:
            conn = self.link.conn
            if conn is not None and not conn.broken and not conn.closed:
                with (
                    contextlib.suppress(Exception),
                    self.ctx.bounded(conn, deadline, self.link.name, "release the claims"),
                ):
                    conn.execute(
                        f"{_in_order(table, 'UPDATE')}DELETE FROM {table} AS c "
                        "USING unnest(%b::text[], %b::text[]) AS u(s, t) "
                        f"WHERE c.session_id = u.s AND c.token = u.t AND {_AFTER_O}",
                        (list(claims), list(claims), [c.token for c in claims.values()]),
                    )
        finally:
            self.link.lock.release()

    # -- renewing ---------------------------------------------------------------------------

    def _start_renewer(self) -> None:
        with self.mutex:
            if self.thread is not None:
                return
            self.wake = socket.socketpair()
            for end in self.wake:
                end.setblocking(False)
            self.thread = threading.Thread(
                target=self._run, name="nous-postgres-leases", daemon=True
            )
        self.thread.start()

    def _run(self) -> None:
        interval = self.lease * _RENEW_FRACTION
        delay = interval
        while not self._pause(delay):
            delay = self._renew_held(interval)

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` before the next renewal, or less; whether the store closes.

        The wait ends early when the server ended the idle lease connection (a
        terminated backend, an idle-connection reaper, a server shutting down),
        which dropped the claims' advisory locks while their holder lives. The
        renewal then runs at once, on a new connection that takes the locks back:
        until it does, a claim elsewhere would take this store's sessions over as a
        dead holder's. A lock another claimer took meanwhile is not taken back, and
        the renewal finds that claim's new epoch: the claim here is fenced.
        """
        assert self.wake is not None
        until = time.monotonic() + seconds
        while not self.closing.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return False
            conn = self.link.conn
            watched: list[Any] = [self.wake[0]]
            with contextlib.suppress(psycopg.Error, OSError, ValueError):
                if conn is not None and not conn.closed:
                    watched.append(conn.fileno())
            try:
                ready, _, _ = select.select(watched, [], [], left)
            except (OSError, ValueError):  # the connection was closed meanwhile
                ready = []
                self.closing.wait(min(left, 0.05))
            with contextlib.suppress(OSError):
                while self.wake[0].recv(4096):
                    pass
            if conn is not None and len(watched) > 1 and watched[1] in ready and self._ended(conn):
                with self.mutex:
                    renewing = any(c.lost is None for c in self.claims.values())
                if renewing:
                    return self.closing.is_set()
                with self.link.lock:  # no lock to take back: just let it go
                    if self.link.conn is conn:
                        self.link.drop()
        return True

    def _ended(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the server ended the idle lease connection ``conn``, which has
        something to read that no call asked for: read it (under the link's lock and the
        connection's own, so no call runs on it meanwhile; a call reads its answer
        itself) and see whether the connection is gone. Anything else the server sent
        (a notice) stays for the next call to see."""
        if not self.link.lock.acquire(timeout=self.timeout + self.ctx.margin):
            return False
        try:
            if self.link.conn is not conn or conn.closed:
                return False  # another call found it gone, and reconnected or will
            with conn.lock:
                ready, _, _ = select.select([conn.fileno()], [], [], 0)
                if not ready:
                    return False
                conn.pgconn.consume_input()
                return conn.pgconn.status != psycopg.pq.ConnStatus.OK
        except (psycopg.Error, OSError, ValueError):
            return True
        finally:
            self.link.lock.release()

    def _renew_held(self, interval: float) -> float:
        """Renew every claim held now; the wait before the next renewal. (A method of its
        own: what it looked at is let go before the wait, not kept until the next one.)"""
        with self.mutex:
            items = [(sid, c) for sid, c in self.claims.items() if c.lost is None]
        if not items:
            return interval
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
            return min(interval, max(0.05, interval / 4))
        self.renewals += 1
        for sid, claim in items:
            with self.mutex:
                if self.claims.get(sid) is not claim:
                    continue  # released meanwhile
                if sid in renewed:
                    claim.deadline = started + self.lease * _FAIL_CLOSED_FRACTION
                    continue
            self.lose(sid, claim, _fenced(sid, claim.epoch, current.get(sid)))
        return interval

    def _renew(self, items: list[tuple[str, _Claim]]) -> tuple[set[str], dict[str, Any]]:
        table = self.claims_table
        sids = [sid for sid, _ in items]
        epochs = [c.epoch for _, c in items]

        def work(conn: psycopg.Connection[Any]) -> tuple[set[str], dict[str, Any]]:
            if self.detect_dead:  # a lock lost with a connection, and not taken back since
                for sid, claim in items:
                    if not claim.locked:
                        claim.locked = self._try_lock(conn, sid, claim.token)
            # The rows are locked first, in session id order (`_in_order`).
            rows = conn.execute(
                f"{_in_order(table, 'NO KEY UPDATE')}UPDATE {table} AS c SET lease_until = "
                f"clock_timestamp() + make_interval(secs => {self.lease!r}), locked = u.l, "
                f"{_RETOOK} "
                "FROM unnest(%b::text[], %b::bigint[], %b::bool[]) AS u(s, e, l) "
                "WHERE c.session_id = u.s AND c.epoch = u.e "
                f"AND c.lease_until > clock_timestamp() AND {_AFTER_O} "
                "RETURNING c.session_id",
                (sids, sids, epochs, [c.locked for _, c in items]),
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
        wake = self.wake
        if wake is not None:
            with contextlib.suppress(OSError):
                wake[1].send(b"x")
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.timeout)
        with self.link.lock:
            self.link.drop()
        if wake is not None and (thread is None or not thread.is_alive()):
            for end in wake:
                with contextlib.suppress(OSError):
                    end.close()
