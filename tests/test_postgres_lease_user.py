"""PostgresStore as a user holding and watching sessions meets it when the server ends
a connection of a live store: the lease connection terminated by an administrator, an
idle-connection reaper or a network blip must not let another process take the live
holder's sessions, and a holder whose claim was taken over meanwhile must not write; a
watch whose database is gone for good ends with an error instead of waiting for ever.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from bounds import BOUND, wait_until

if TYPE_CHECKING:
    from postgres_server import Server, Stores

# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.core.event import Event  # noqa: E402
from nous_actor.errors import (  # noqa: E402
    CallTimeout,
    ConflictError,
    FencedError,
    SessionStopped,
    StoreError,
)
from nous_actor.store.postgres import PostgresStore  # noqa: E402

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

RETAKE_S = 2.0
"""How soon a live holder must hold its claims' locks again after the server ended its
lease connection (measured well under a tenth of a second; the lease here is 30 s, whose
first renewal would come after 10 s)."""


def ev(seq: int) -> Event:
    return Event(seq, "user_message", T0, {"content": f"event {seq}"})


def _lease_pid(store: Any) -> int:
    conn = store._leases.link.conn
    assert conn is not None
    return int(conn.info.backend_pid)


def _relocked(store: Any, sid: str, old_pid: int) -> bool:
    """Whether ``store`` holds its claim's lock again, on a lease connection other than
    the backend ``old_pid``."""
    conn = store._leases.link.conn
    claim = store._leases.get(sid)
    return (
        conn is not None
        and not conn.closed
        and conn.info.backend_pid != old_pid
        and claim is not None
        and claim.locked
    )


def test_a_live_holder_whose_lease_connection_the_server_ended_keeps_its_session(
    pg_stores: Stores,
) -> None:
    """The server ends a live holder's idle lease connection: the holder takes its
    claim's lock back on a new connection at once (not at its next renewal), so a claim
    elsewhere is refused, and the holder goes on writing."""
    a = pg_stores(lease=30, holder="live-one")
    b = pg_stores(lease=30)
    a.claim("chat")
    assert a.write({"chat": [ev(0)]}) == {}
    old = _lease_pid(a)
    ended = time.monotonic()
    pg_stores.server.terminate(pid=old)
    wait_until(lambda: _relocked(a, "chat", old), RETAKE_S, "the holder took its lock back")
    window = time.monotonic() - ended
    assert window < RETAKE_S
    with pytest.raises(ConflictError, match="live-one"):
        b.claim("chat")
    assert a.write({"chat": [ev(1)]}) == {}
    assert [e.seq for e in b.load("chat")] == [0, 1]


def test_a_holder_taken_over_before_its_lease_connection_ended_is_fenced_not_revived(
    pg_stores: Stores,
) -> None:
    """A paused holder's lease expired and another writer took the session over; then
    the server ends the old holder's lease connection. Taking its lock back on a new
    connection must not make it a writer again: its writes are fenced, the new
    writer's go through, and a third claim is refused (the new writer lives)."""
    a, b, c = pg_stores(lease=30), pg_stores(lease=30, holder="new-writer"), pg_stores(lease=30)
    a.claim("chat")
    pg_stores.server.sql(
        f"UPDATE \"{pg_stores.schema}\".claims SET lease_until = now() - interval '1 second'"
    )
    b.claim("chat")
    old = _lease_pid(a)
    pg_stores.server.terminate(pid=old)
    claim = a._leases.get("chat")
    assert claim is not None
    wait_until(
        lambda: claim.lost is not None or a._leases.get("chat") is None,
        RETAKE_S,
        "the old holder found its claim taken over",
    )
    assert isinstance(a.write({"chat": [ev(0)]})["chat"], FencedError)
    assert b.write({"chat": [ev(0)]}) == {}
    with pytest.raises(ConflictError, match="new-writer"):
        c.claim("chat")
    assert [e.seq for e in c.load("chat")] == [0]


def test_the_renewer_of_a_store_without_claims_lets_an_ended_connection_go(
    pg_stores: Stores,
) -> None:
    """A store that held claims and gave them up: the server ending its idle lease
    connection closes it on the client too (no busy wait on a dead socket), and the
    next claim works on a new connection."""
    a = pg_stores(lease=30)
    token = a.claim("chat")
    a.release("chat", token)
    old = _lease_pid(a)
    pg_stores.server.terminate(pid=old)
    wait_until(lambda: a._leases.link.conn is None, BOUND, "the ended connection was let go")
    a.claim("chat")
    assert _lease_pid(a) != old


def _end_of(watch: Any, within: float) -> StoreError | None:
    """Read ``watch`` until it ends; the error it ended with (`None`: it ended cleanly).
    Fails if it has not ended within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"the watch did not end within {within} s")
        try:
            watch.get(min(left, 0.5))
        except CallTimeout:
            continue
        except SessionStopped:
            return None
        except StoreError as exc:
            return exc


def test_a_watch_on_a_dropped_database_ends_with_a_store_error(pg_server: Server) -> None:
    """The database a store watches is dropped: after a few refused reconnects spread over
    the store's timeout the watch ends with a StoreError saying why and what to do,
    instead of retrying for ever; the store's next watch tries anew (and ends so too)."""
    name = f"gone_{uuid.uuid4().hex[:10]}"
    pg_server.sql(f'CREATE DATABASE "{name}"')
    dsn = pg_server.dsn.replace("/nous_actor_test?", f"/{name}?")
    assert dsn != pg_server.dsn
    store = PostgresStore(dsn, timeout=1.0)
    try:
        store.claim("s")
        assert store.write({"s": [ev(0)]}) == {}
        watch = store.watch("s")
        assert watch.get(BOUND).seq == 0
        pg_server.sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        started = time.monotonic()
        err = _end_of(watch, BOUND)
        assert err is not None
        assert time.monotonic() - started >= 1.0  # refused over the store's timeout first
        assert "the watch has ended" in str(err)
        assert "does not exist" in str(err)
        assert "watch again" in str(err)
        again = store.watch("s")
        err = _end_of(again, BOUND)
        assert err is not None
        assert "does not exist" in str(err)
    finally:
        store.close()
        pg_server.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_watch_outlives_a_server_restart_longer_than_the_stores_timeout(
    pg_stores: Stores,
) -> None:
    """A server restarting refuses nothing for good: a watch of a store whose timeout is
    shorter than the restart goes on, and reads what is written after it."""
    if pg_stores.server.folder is None:
        pytest.skip("the test server cannot be restarted here (no data folder given)")
    store = pg_stores(timeout=0.2)
    writer = pg_stores()
    writer.claim("s")
    assert writer.write({"s": [ev(0)]}) == {}
    watch = store.watch("s")
    assert watch.get(BOUND).seq == 0
    pg_stores.server.restart()
    assert writer.write({"s": [ev(1)]}) == {}
    assert watch.get(BOUND).seq == 1
