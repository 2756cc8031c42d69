"""PostgresStore under real server faults, as a user running it meets them: the server
restarted or down while sessions are held, a store opened during a restart, a role
whose transactions are SERIALIZABLE, the store's schema dropped.

These tests restart the server, so they run on a cluster of their own (started for
this module, stopped after it), never on the shared test server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from postgres_server import (  # noqa: E402
    Server,
    Worker,
    _binaries,
    _unavailable,
    start_server,
    stop_server,
)

from nous_actor.core.event import Event  # noqa: E402
from nous_actor.errors import ConflictError, StoreError  # noqa: E402
from nous_actor.sessions.registry import Sessions  # noqa: E402
from nous_actor.store.postgres import PostgresStore  # noqa: E402

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
WAIT = 20.0
"""The bound of every wait for something another process or the server does."""


def ev(seq: int) -> Event:
    return Event(seq, "user_message", T0, {"content": f"event {seq}"})


@pytest.fixture(scope="module")
def own_server() -> Iterator[Server]:
    """A PostgreSQL cluster of this module's own, which its tests may restart."""
    if not _binaries():
        _unavailable(
            "no PostgreSQL server binaries (apt-get install -y postgresql): these tests "
            "restart a server of their own"
        )
    try:
        dsn, folder = start_server()
    except (subprocess.SubprocessError, OSError) as exc:
        _unavailable(f"could not start a PostgreSQL server: {exc}")
    try:
        yield Server(dsn, folder)
    finally:
        stop_server(folder)


class _Stores:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.schema = f"test_{uuid.uuid4().hex[:12]}"
        self.made: list[PostgresStore] = []
        self.workers: list[Worker] = []

    def __call__(self, dsn: str | None = None, **kwargs: Any) -> PostgresStore:
        kwargs.setdefault("schema", self.schema)
        store = PostgresStore(dsn or self.server.dsn, **kwargs)
        self.made.append(store)
        return store

    def worker(self, **options: Any) -> Worker:
        w = Worker(self.server.dsn, self.schema, **options)
        self.workers.append(w)
        return w

    def claim_row(self, session_id: str) -> tuple[Any, ...]:
        rows = self.server.sql(
            f'SELECT holder, epoch, lease_until FROM "{self.schema}".claims WHERE session_id = %s',
            (session_id,),
        )
        assert len(rows) == 1, rows
        return rows[0]


@pytest.fixture
def stores(own_server: Server) -> Iterator[_Stores]:
    made = _Stores(own_server)
    try:
        yield made
    finally:
        for w in made.workers:
            w.kill()
        for store in made.made:
            store.close()
        own_server.drop_schema(made.schema)


# -- a live holder keeps its sessions across a server restart -------------------------------


def test_a_live_holder_is_not_taken_over_after_a_server_restart(stores: _Stores) -> None:
    """A server restart drops every connection, so every claim's advisory lock, though
    the holders live on: a claim right after it must not take the session from its live
    holder (which would fail that holder's next append with FencedError) but be refused
    while the holder's lease lasts; the holder writes on."""
    a = stores(holder="host-a", lease=60, timeout=5)
    b = stores(holder="host-b", lease=60, timeout=5)
    a.claim("chat")
    assert a.write({"chat": [ev(0)]}) == {}
    stores.server.restart()
    with pytest.raises(ConflictError, match="host-a holds its lease"):
        b.claim("chat")
    assert a.write({"chat": [ev(1)]}) == {}
    assert [e.seq for e in b.load("chat")] == [0, 1]
    assert stores.claim_row("chat")[0] == "host-a"


def test_a_holder_that_dies_after_a_restart_is_still_taken_over_at_once(
    stores: _Stores,
) -> None:
    """Once the holder renewed its claim after the restart (taking its lock again), its
    death frees the session at once, as before the restart: not after its lease."""
    worker = stores.worker(holder="host-a", lease=3.0, timeout=2.0)
    assert worker.ask(op="claim", sid="chat") == {"ok": True}
    stores.server.restart()
    before = stores.claim_row("chat")[2]
    deadline = time.monotonic() + WAIT
    while stores.claim_row("chat")[2] == before:  # renewed since the restart
        assert time.monotonic() < deadline, "the holder did not renew its lease"
        time.sleep(0.05)
    worker.kill()
    b = stores(holder="host-b", lease=60, timeout=5)
    deadline = time.monotonic() + WAIT
    with capture_logs() as logs:
        while True:  # the server notices the dead connection quickly, not at once
            try:
                b.claim("chat")
                break
            except ConflictError:
                assert time.monotonic() < deadline, "the dead holder was never taken over"
                time.sleep(0.02)
    taken = [e for e in logs if e["event"] == "store.claim_taken_over"]
    assert [e["reason"] for e in taken] == ["holder_connection_gone"]  # not lease_expired
    assert stores.claim_row("chat")[0] == "host-b"


# -- shutting down while the server is down ----------------------------------------------------


@contextlib.contextmanager
def _outage(server: Server) -> Iterator[None]:
    """The server is down in the ``with`` body (it keeps its data), and up after it."""
    server.down()
    try:
        yield
    finally:
        server.up()


def test_releases_during_an_outage_do_not_each_wait_the_timeout(stores: _Stores) -> None:
    """A process giving its sessions up while the server is down (a registry closing, a
    deploy during maintenance) releases them one by one: each release waited the whole
    timeout before, so closing a process holding N sessions took N timeouts. Once the
    server was found unreachable, the next releases fail at once (a release is best
    effort: the lease lapses by itself), saying so."""
    store = stores(holder="host-a", lease=60, timeout=0.5)
    tokens = {f"s{i}": store.claim(f"s{i}") for i in range(10)}
    with _outage(stores.server):
        started = time.monotonic()
        for sid, token in tokens.items():
            with pytest.raises(StoreError, match="lapses by itself") as caught:
                store.release(sid, token)
            assert caught.value.session_id == sid
        took = time.monotonic() - started
    assert took < 2.5, f"10 releases took {took:.2f} s (the timeout is 0.5 s)"
    # The server is back: the store connects again at once (nothing is refused for long).
    assert store.claim("again")
    assert store.write({"again": [ev(0)]}) == {}


def test_a_registry_closes_within_a_few_timeouts_while_the_server_is_down(
    stores: _Stores,
) -> None:
    """Closing a registry of many sessions during an outage ends within a few timeouts,
    not one timeout per session; its sessions are taken over once their leases lapse."""
    store = stores(holder="host-a", lease=60, timeout=0.5)
    registry = Sessions(store, timeout=10)
    handles = [registry.open(f"s{i}") for i in range(10)]
    for h in handles:
        h.append("user_message", {"content": "hello"}).get()
    with _outage(stores.server):
        started = time.monotonic()
        registry.close()
        took = time.monotonic() - started
    assert took < 4.0, f"the registry took {took:.2f} s to close (the timeout is 0.5 s)"
    rows = stores.server.sql(f'SELECT count(*) FROM "{stores.schema}".events')
    assert rows == [(10,)]


# -- a role's settings do not change the store's transactions ----------------------------------


@pytest.fixture
def strict_role(stores: _Stores) -> Iterator[str]:
    """The DSN of a role whose transactions are SERIALIZABLE by default (a database or a
    role set so by its administrator)."""
    role = f"strict_{uuid.uuid4().hex[:8]}"
    stores.server.sql(f"CREATE ROLE {role} LOGIN SUPERUSER")
    stores.server.sql(f"ALTER ROLE {role} SET default_transaction_isolation = 'serializable'")
    try:
        yield stores.server.dsn.replace("user=postgres", f"user={role}")
    finally:
        for store in stores.made:
            store.close()
        stores.server.drop_schema(stores.schema)
        stores.server.sql(f"DROP ROLE {role}")


def test_a_claim_that_waited_for_a_renewal_is_refused_as_held_under_a_serializable_role(
    stores: _Stores, strict_role: str
) -> None:
    """A role whose transactions are SERIALIZABLE (or REPEATABLE READ) by default made a
    claim that waited for the holder's renewal of the claim row fail with a
    serialization failure (a plain `StoreError`, which a registry's open does not route
    to the holder) instead of `ConflictError` naming the holder. The store's
    transactions are READ COMMITTED whatever the role says."""
    assert "strict_" in strict_role
    a = stores(dsn=strict_role, holder="host-a", lease=60, timeout=5)
    b = stores(dsn=strict_role, holder="host-b", lease=60, timeout=5)
    a.claim("chat")
    got: list[BaseException] = []
    with stores.server.connect() as renewal:  # the holder's renewal, under way
        renewal.execute("BEGIN")
        renewal.execute(
            f'UPDATE "{stores.schema}".claims SET lease_until = lease_until + '
            "interval '1 second' WHERE session_id = 'chat'"
        )

        def claim() -> None:
            try:
                b.claim("chat")
            except BaseException as exc:
                got.append(exc)

        claimer = threading.Thread(target=claim)
        claimer.start()
        deadline = time.monotonic() + WAIT
        while not stores.server.sql(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            ("%claims%",),
        ):
            assert time.monotonic() < deadline, "the claim never waited for the row"
            time.sleep(0.01)
        renewal.execute("COMMIT")
        claimer.join(WAIT)
    assert not claimer.is_alive()
    assert len(got) == 1
    assert isinstance(got[0], ConflictError), got[0]
    assert "host-a holds its lease" in str(got[0])


# -- the store's tables dropped under it --------------------------------------------------------


def test_a_dropped_schema_is_told_with_what_to_do(stores: _Stores) -> None:
    """The store's schema (or its whole database) dropped and made again under an open
    store: each call says a table is gone and how to make the store again; a store
    opened anew works."""
    store = stores(timeout=5)
    assert store.write({"chat": [ev(0)]}) == {}
    stores.server.drop_schema(stores.schema)
    with pytest.raises(StoreError, match="is gone") as caught:
        store.load("chat")
    assert "open a new PostgresStore" in str(caught.value)
    again = stores(timeout=5)
    assert again.write({"chat": [ev(0)]}) == {}
    assert [e.seq for e in again.load("chat")] == [0]


# -- a store opened while the server restarts ----------------------------------------------------


def _pg_ctl(server: Server, *args: str) -> None:
    """Run the server's ``pg_ctl`` on its data folder (as its user when run as root)."""
    assert server.folder is not None
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    pg_ctl = str(found[-1]) if found else (shutil.which("pg_ctl") or "pg_ctl")
    command = [pg_ctl, "-D", str(server.folder / "data"), *args]
    if os.getuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, timeout=60, capture_output=True)


def _refusals(server: Server) -> int:
    """How many connections the server refused so far as shutting down (its log says)."""
    assert server.folder is not None
    log = (server.folder / "server.log").read_text(errors="replace")
    return log.count("the database system is shutting down")


def test_a_store_opened_while_the_server_restarts_waits_for_it(stores: _Stores) -> None:
    """A process starting while the server restarts (deployed together, a maintenance
    window) failed at once with "the database system is shutting down": the server
    said it would be back, and the store gave up anyway. Once the server has said so,
    the store tries again within its timeout (through the moment the server is down)."""
    server = stores.server
    folder = server.folder
    assert folder is not None
    holder = server.connect()  # keeps a smart shutdown going: new connections are refused
    _pg_ctl(server, "stop", "-m", "smart", "-W")
    deadline = time.monotonic() + WAIT
    while True:
        try:
            server.sql("SELECT 1")
        except psycopg.OperationalError as exc:
            if "shutting down" in str(exc):
                break
        assert time.monotonic() < deadline, "the server never refused as shutting down"
        time.sleep(0.02)
    before = _refusals(server)

    def finish_the_restart() -> None:
        wait = time.monotonic() + WAIT
        try:
            while _refusals(server) < before + 1 and time.monotonic() < wait:
                time.sleep(0.02)  # until the store tried, and was refused
            holder.close()  # the shutdown ends
            pid = folder / "data" / "postmaster.pid"
            while pid.exists() and time.monotonic() < wait:
                time.sleep(0.02)
        finally:
            server.up()

    restarting = threading.Thread(target=finish_the_restart)
    restarting.start()
    try:
        store = stores(timeout=15)
    finally:
        restarting.join(2 * WAIT)
    assert store.write({"chat": [ev(0)]}) == {}
    assert [e.seq for e in store.load("chat")] == [0]


def test_a_live_holder_is_not_taken_over_after_the_server_reinitialises_from_a_crash(
    stores: _Stores,
) -> None:
    """One server process killed (the system's out-of-memory killer) makes the server end
    every connection and reinitialise without a new postmaster: the locks are gone as
    after a restart, and so a claim must not take a live holder's session then either."""
    a = stores(holder="host-a", lease=60, timeout=5)
    b = stores(holder="host-b", lease=60, timeout=5)
    a.claim("chat")
    victim = stores.server.connect()
    os.kill(victim.info.backend_pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT
    while True:  # the server ends every connection, recovers, and takes new ones
        try:
            victim.execute("SELECT 1")
        except psycopg.OperationalError:
            break
        assert time.monotonic() < deadline, "the server did not reinitialise"
        time.sleep(0.02)
    victim.close()
    while True:
        try:
            stores.server.sql("SELECT 1")
            break
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, "the server did not come back"
            time.sleep(0.05)
    with pytest.raises(ConflictError, match="host-a holds its lease"):
        b.claim("chat")
    assert a.write({"chat": [ev(0)]}) == {}
