"""Claims of a SQLite store: taking them, which still have a live writer, and where
their holders answer.

A claim is a row of the ``writers`` table naming a process, a token and (schema
version 2) the address its holder advertised (`SQLiteStore.advertise`). A row
of another process is live while that process runs (`_pid_alive`); a row of
this process is live while its token is in `_live_tokens`, the claims held by
live writers of this process, whatever store object made them. That set and
its lock are module state: one object each for the process, read by the
store's claims, its index and its hand-off requests alike. The claims one
store object took, and the address it advertises for them, are its
`_Holdings`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from nous_actor._log import get_logger
from nous_actor.errors import ConflictError, StoreError
from nous_actor.runtime import forks
from nous_actor.runtime.unique import unique_hex
from nous_actor.store.sqlite.connection import _IN_CHUNK, _Connection
from nous_actor.store.sqlite.writes import insert_rows

logger = get_logger("nous_actor.store.sqlite")

# Claim tokens held by live writers of this process, whatever store object made them,
# each with the session it claims (a release names both: a token frees its own session).
_live_tokens: dict[str, str] = {}
_live_lock = forks.lock()


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs; a zombie (dead, not yet reaped) does not.

    Where `/proc` exists the process state is read from `/proc/<pid>/stat`;
    elsewhere a zombie still counts as alive (see docs/persistence.md).
    """
    if not 0 < pid < 2**31:  # kill(0 or -n) would signal a group; no real pid is this big
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except FileNotFoundError:  # gone meanwhile, or no /proc here (then trust kill)
        return not os.path.exists("/proc/self")
    except OSError:
        return True
    # The state follows the command name, which is in parentheses and may hold any byte.
    fields = text.rpartition(b")")[2].split()
    return not (fields and fields[0] in (b"Z", b"X", b"x"))


def _holder_alive(holder_pid: int, holder_token: str, pid: int) -> bool:
    """Whether the claim row (``holder_pid``, ``holder_token``) still has a live writer:
    a token of this process that was not released, or another process that has not ended.
    Call it under ``_live_lock``."""
    return holder_token in _live_tokens if holder_pid == pid else _pid_alive(holder_pid)


def _holder_name(pid: object, token: object, me: int) -> str | None:
    """Who a ``writers`` row names, if it is live (call under ``_live_lock``)."""
    if not isinstance(pid, int) or not isinstance(token, str):
        return None
    if not _holder_alive(pid, token, me):
        return None
    return "this process" if pid == me else f"process {pid}"


class _Holdings:
    """The claims one store object took and still holds, and the address it
    advertises for them (`SQLiteStore.advertise`).

    Attributes:
        tokens: the session id of each token this object took, read and changed
            under ``_live_lock``; a token released by any store object of the
            process (gone from `_live_tokens`) is forgotten by `live`.
        address: what every claim this object takes is written with, read by a
            claim inside its write transaction, so that an `advertise` and a
            claim never cross: the claim writes the address set before it
            commits, and an advertise's transaction, after, updates its row.
    """

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.address: str | None = None

    def live(self) -> list[tuple[str, str]]:
        """``(session id, token)`` of each claim this object holds now (call under
        ``_live_lock``); those released since are forgotten."""
        for token in [t for t in self.tokens if t not in _live_tokens]:
            del self.tokens[token]
        return [(sid, token) for token, sid in self.tokens.items()]


def _claim_all(
    connection: _Connection, asked: set[str], holdings: _Holdings, ids: list[str]
) -> list[str | ConflictError]:
    """`_claim_once`, made once more if SQLite rolled its transaction back by itself
    (its ``COMMIT`` found no transaction: nothing of it was written, and its tokens
    were forgotten), which is logged (``store.transaction_rolled_back``). Seen once,
    unexplained, where a batch of claims had waited behind another connection's write
    lock; a claim is safe to make again."""
    try:
        return _claim_once(connection, asked, holdings, ids)
    except StoreError as exc:
        if not rolled_back(exc):
            raise
        logger.warning(
            "store.transaction_rolled_back",
            store=connection.path,
            doing="claim the sessions",
            sessions=len(ids),
            error=str(exc),
        )
    return _claim_once(connection, asked, holdings, ids)


def rolled_back(exc: StoreError) -> bool:
    """Whether ``exc`` says SQLite had rolled a transaction back before its ``COMMIT``
    (nothing of it was written)."""
    cause = exc.__cause__
    return isinstance(cause, sqlite3.OperationalError) and "no transaction is active" in str(cause)


def _claim_once(
    connection: _Connection, asked: set[str], holdings: _Holdings, ids: list[str]
) -> list[str | ConflictError]:
    """Claim each of ``ids`` (valid, at least one) in one transaction on ``connection``:
    for each id, in order, its token or the `ConflictError` that refused it (see
    `SQLiteStore.claim_many`). Each row is written with ``holdings.address``, and its
    token kept in ``holdings``. The hand-off requests of ``asked`` (the sessions the
    store asked for, read and changed under the connection's lock) that a claim
    takes are withdrawn."""
    out: list[str | ConflictError] = []
    pid = os.getpid()
    since = datetime.now(UTC).isoformat()
    taken: list[str] = []
    only = ids[0] if len(ids) == 1 else None
    try:
        with connection.transaction(only, "claim the session", synced=False) as conn, _live_lock:
            held: dict[str, tuple[int, str]] = {}
            for lo in range(0, len(ids), _IN_CHUNK):
                chunk = ids[lo : lo + _IN_CHUNK]
                held.update(
                    (sid, (holder_pid, holder_token))
                    for sid, holder_pid, holder_token in conn.execute(
                        "SELECT session_id, pid, token FROM writers WHERE session_id IN "
                        f"({','.join('?' * len(chunk))})",
                        chunk,
                    )
                )
            address = holdings.address  # under the connection's lock, as advertise sets it
            rows: list[tuple[str, int, str, str, str | None]] = []
            for sid in ids:
                holder = held.get(sid)
                where = None if holder is None else _holder_name(*holder, pid)
                if where is not None:
                    out.append(
                        ConflictError(
                            f"already has a live writer in {where}; use that session's "
                            "handle, or stop it first",
                            session_id=sid,
                        )
                    )
                    continue
                token = unique_hex()
                # Under _live_lock and before COMMIT: another store object of this
                # process that reads the row next also finds the token live.
                _live_tokens[token] = sid
                holdings.tokens[token] = sid
                taken.append(token)
                held[sid] = (pid, token)
                rows.append((sid, pid, token, since, address))
                out.append(token)
            # Many rows a statement: each step hands the GIL back (see `insert_rows`).
            insert_rows(
                conn,
                "INSERT OR REPLACE INTO writers (session_id, pid, token, since, address)",
                rows,
            )
            taken_asked = asked & {row[0] for row in rows}
            if taken_asked:  # a claim withdraws this process's own hand-off requests
                conn.executemany(
                    "DELETE FROM handoffs WHERE session_id = ? AND pid = ?",
                    [(sid, pid) for sid in taken_asked],
                )
        if taken_asked:  # once committed (a transaction SQLite rolled back withdrew none)
            with connection.lock:
                asked.difference_update(taken_asked)
    except BaseException:
        with _live_lock:
            for token in taken:
                _live_tokens.pop(token, None)
                holdings.tokens.pop(token, None)
        raise
    return out


def _claim_row(
    query: Callable[[str, Sequence[object]], list[Any]], session_id: str
) -> tuple[object, object, object] | None:
    """The ``writers`` row of ``session_id``, as ``(pid, token, address)``, read with
    ``query``; a file still at schema version 1 (opened read-only, not migrated yet)
    has no address column: its rows have the address ``None``."""
    try:
        rows = query("SELECT pid, token, address FROM writers WHERE session_id = ?", (session_id,))
    except StoreError as exc:
        if "no such column" not in str(exc):
            raise
        rows = query("SELECT pid, token, NULL FROM writers WHERE session_id = ?", (session_id,))
    if not rows:
        return None
    pid, token, address = rows[0]
    return pid, token, address
