"""The optional methods of `nous_actor.store.shared` on a `SQLiteStore`, which
delegates to these: reads without a claim and watches on the store's
follower's connection (`nous_actor.store.shared.follower_of`), who holds a
session, and hand-off requests (the ``handoffs`` table, made on the first
request).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from nous_actor.core.args import check_seconds as _check_seconds
from nous_actor.core.codec import passing_event_from_row
from nous_actor.core.event import Event
from nous_actor.errors import StoreError
from nous_actor.store.base import valid_store_id
from nous_actor.store.shared.feed import (
    DEFAULT_WATCH_BUFFER,
    FollowedWatch,
    _check_buffer,
    _check_from_seq,
)
from nous_actor.store.shared.follower import follower_of
from nous_actor.store.sqlite.claims import _holder_name, _live_lock, _live_tokens, _pid_alive

if TYPE_CHECKING:
    from nous_actor.store.sqlite.store import SQLiteStore

_HANDOFFS_TABLE: Final = """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    until TEXT NOT NULL,
    PRIMARY KEY (session_id, pid)
)"""


def _now_text(delta: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta)).isoformat()


def sqlite_load_since(store: SQLiteStore, session_id: str, from_seq: int) -> list[Event]:
    session_id = valid_store_id(session_id)
    from_seq = _check_from_seq(from_seq)
    # On the follower's connection: a read never waits behind this process's writes
    # (which may be waiting for another process's write lock).
    rows = follower_of(store).query(
        "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq",
        (session_id, min(from_seq, 2**63 - 1)),
    )
    with store._translate(session_id, "load the session"):  # read to be looked at
        return [passing_event_from_row(*row) for row in rows]


def sqlite_next_seq(store: SQLiteStore, session_id: str) -> int:
    session_id = valid_store_id(session_id)
    rows = follower_of(store).query(
        "SELECT max(seq) FROM events WHERE session_id = ?", (session_id,)
    )
    last = rows[0][0] if rows else None
    return 0 if last is None else int(last) + 1


def sqlite_held_by(store: SQLiteStore, session_id: str) -> str | None:
    session_id = valid_store_id(session_id)
    rows = follower_of(store).query(
        "SELECT pid, token FROM writers WHERE session_id = ?", (session_id,)
    )
    if not rows:
        return None
    pid, token = rows[0]
    with _live_lock:
        return _holder_name(pid, token, os.getpid())


def sqlite_ask_handoff(store: SQLiteStore, session_id: str, seconds: float) -> None:
    session_id = valid_store_id(session_id)
    seconds = _check_seconds(seconds, "seconds")
    with store._transaction(session_id, "ask for the session", synced=False) as conn:
        conn.execute(_HANDOFFS_TABLE)
        conn.execute(
            "INSERT OR REPLACE INTO handoffs (session_id, pid, until) VALUES (?, ?, ?)",
            (session_id, os.getpid(), _now_text(seconds)),
        )
        store._asked.add(session_id)  # (under the store's lock, as a claim reads it)


def sqlite_withdraw_handoff(store: SQLiteStore, session_id: str) -> None:
    session_id = valid_store_id(session_id)
    if session_id not in store._asked:
        return  # never asked, or withdrawn by the claim that took the session
    with store._transaction(session_id, "withdraw the request", synced=False) as conn:
        conn.execute(
            "DELETE FROM handoffs WHERE session_id = ? AND pid = ?", (session_id, os.getpid())
        )
        store._asked.discard(session_id)


def sqlite_handoff_requests(store: SQLiteStore) -> list[str]:
    try:
        rows = follower_of(store).query(
            "SELECT h.session_id, w.token, h.pid FROM handoffs AS h JOIN writers AS w "
            "ON w.session_id = h.session_id WHERE w.pid = ? AND h.pid <> w.pid "
            "AND h.until > ?",
            (os.getpid(), _now_text()),
        )
    except StoreError as exc:
        if "no such table" in str(exc):  # nobody ever asked
            return []
        raise
    with _live_lock:
        # Several processes may ask for one session: one row each.
        held = [(str(sid), pid) for sid, token, pid in rows if token in _live_tokens]
        stale = {(str(sid), str(token)) for sid, token, _ in rows if token not in _live_tokens}
    for sid, token in sorted(stale):  # a claim of this process that no session holds any
        store.release(sid, token)  # more (its release failed): let the asker have it
    alive: dict[int, bool] = {}
    # An asker that died asks nothing, and never hides the request of one that lives.
    return sorted({sid for sid, pid in held if alive.setdefault(pid, _pid_alive(pid))})


def sqlite_watch(
    store: SQLiteStore,
    session_id: str,
    from_seq: int = 0,
    *,
    buffer: int = DEFAULT_WATCH_BUFFER,
    timeout: float = 30.0,
) -> FollowedWatch:
    session_id = valid_store_id(session_id)
    from_seq = _check_from_seq(from_seq)
    buffer = _check_buffer(buffer)
    return follower_of(store).add(session_id, from_seq, buffer, timeout)


def sqlite_wait_changed(store: SQLiteStore, after: int, timeout: float) -> int:
    return follower_of(store).wait_changed(after, timeout)
