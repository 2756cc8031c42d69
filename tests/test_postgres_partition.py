"""PostgresStore when the server stops answering over an open connection: every call is
bounded by the store's timeout on the client.

The faults are real: a TCP proxy of this test's own (`BlackHole`) between the store
and the server, which stops passing bytes (a network partition: no reset, no FIN,
new connections accepted and never answered), and a ``SIGSTOP`` of the server
process serving the store's connection. Before the watchdog, psycopg waited for the
answer until the fault ended (for ever, for an idle read in a partition).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from bounds import BOUND, INTERPRETER_BOUND, end_child
from structlog.testing import capture_logs

from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError

if TYPE_CHECKING:
    from postgres_server import Server, Stores

# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.store.postgres import PostgresStore, _Write  # noqa: E402

TIMEOUT = 0.5
"""The stores' timeout here: a call that gets no answer is cut off within it plus the
margin below."""

CUT_BY = TIMEOUT + min(TIMEOUT, 0.5)
"""When a call without an answer is cut off, at the latest (see connection._Watchdog)."""

SLACK = 2.0
"""What a loaded machine may add to `CUT_BY` (a bound, not an expectation)."""

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def ev(seq: int) -> Event:
    return Event(seq, "user_message", T0, {"content": f"event {seq}"})


# -- a network that can be cut ----------------------------------------------------------------


class BlackHole:
    """A TCP proxy on 127.0.0.1 to the test server, on a thread of its own.

    It passes bytes both ways until `partition` (then it passes none and refuses
    none: the peers see no reset and no end, as behind a partitioned network; a new
    connection is accepted and never answered) or `drop_answers` (the server's bytes
    are held, the client's still pass), until `heal`. What a partition holds is passed
    once healed (as TCP sends it again), unless it was made with ``lose=True``: then
    every byte sent meanwhile is lost (and a peer's end is passed on at once).
    """

    def __init__(self, server: Server) -> None:
        params = psycopg.conninfo.conninfo_to_dict(server.dsn)
        host = str(params.get("host") or "/var/run/postgresql")
        port = int(params.get("port") or 5432)
        self.target: tuple[socket.AddressFamily, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        params.update(host="127.0.0.1", port=str(self.listener.getsockname()[1]))
        params.pop("hostaddr", None)
        self.dsn = psycopg.conninfo.make_conninfo(**params)
        self.up = self.down = True  # client -> server, server -> client bytes pass
        self.lose = False  # what does not pass is lost (else held)
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = socket.socketpair()
        self.other: dict[socket.socket, socket.socket] = {}
        self.servers: set[socket.socket] = set()
        self.held: list[socket.socket] = []  # accepted in a partition, not yet connected
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="test-black-hole", daemon=True)
        self.thread.start()

    def partition(self, *, lose: bool = False) -> None:
        self._set(up=False, down=False, lose=lose)

    def drop_answers(self) -> None:
        self._set(up=True, down=False)

    def heal(self) -> None:
        self._set(up=True, down=True)

    def _set(self, *, up: bool, down: bool, lose: bool = False) -> None:
        with self.lock:
            self.up, self.down, self.lose = up, down, lose
        self.wake_w.send(b"x")

    def close(self) -> None:
        self.closed = True
        self.wake_w.send(b"x")
        self.thread.join(BOUND)
        for s in [self.listener, self.wake_r, self.wake_w, *self.other, *self.held]:
            s.close()

    def _run(self) -> None:
        while not self.closed:
            with self.lock:
                up, down, lose = self.up, self.down, self.lose
            if up and down:
                for client in self.held:
                    self._connect(client)
                self.held = []
            reads = [self.listener, self.wake_r]
            reads += [s for s in self.other if lose or (down if s in self.servers else up)]
            ready, _, _ = select.select(reads, [], [])
            for s in ready:
                if s is self.wake_r:
                    self.wake_r.recv(4096)
                elif s is self.listener:
                    client, _ = self.listener.accept()
                    if up and down:
                        self._connect(client)
                    else:
                        self.held.append(client)
                elif s in self.other:
                    self._pass(s)

    def _connect(self, client: socket.socket) -> None:
        upstream = socket.socket(self.target[0], socket.SOCK_STREAM)
        try:
            upstream.connect(self.target[1])
        except OSError:
            upstream.close()
            client.close()
            return
        self.other[client], self.other[upstream] = upstream, client
        self.servers.add(upstream)

    def _pass(self, s: socket.socket) -> None:
        with self.lock:  # as it is now: set before the test sends what it must hold
            passes = self.down if s in self.servers else self.up
            lose = self.lose
        if not passes and not lose:
            return
        try:
            data = s.recv(65536)
            if data:
                if passes:
                    self.other[s].sendall(data)
                return
        except OSError:
            pass
        peer = self.other.pop(s)
        self.other.pop(peer, None)
        self.servers.discard(s)
        self.servers.discard(peer)
        s.close()
        peer.close()


@pytest.fixture
def black_hole(pg_server: Server) -> Iterator[BlackHole]:
    proxy = BlackHole(pg_server)
    try:
        yield proxy
    finally:
        proxy.heal()
        proxy.close()


@pytest.fixture
def proxied(pg_stores: Stores, black_hole: BlackHole) -> Iterator[Callable[..., PostgresStore]]:
    """``proxied(**kwargs)`` -> a store in the test's schema, reached through the proxy."""
    made: list[PostgresStore] = []

    def make(**kwargs: Any) -> PostgresStore:
        kwargs.setdefault("schema", pg_stores.schema)
        kwargs.setdefault("timeout", TIMEOUT)
        store = PostgresStore(black_hole.dsn, **kwargs)
        made.append(store)
        return store

    try:
        yield make
    finally:
        black_hole.heal()
        for store in made:
            closed, _ = _timed(store.close)  # (a call that never ends would hold it)
            assert closed is None or isinstance(closed, StoreError), closed


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()`` on a thread of its own, waited for within `BOUND`: (what it returned or
    raised, seconds it took). A call still waiting at the bound fails the test (the
    fixture's heal then lets it end)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # reported in the test's thread
            out.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    took = time.monotonic() - started
    assert not thread.is_alive(), f"the call still waited after {BOUND} s"
    return out[0], took


def _cut_off(call: Callable[[], Any]) -> StoreError:
    """``call()`` fails with a StoreError that says the server did not answer, by `CUT_BY`."""
    got, took = _timed(call)
    assert isinstance(got, StoreError), got
    assert "did not answer" in str(got), got
    assert took < CUT_BY + SLACK, f"cut off after {took:.2f} s"
    return got


# -- a partition: every call ends within the timeout ---------------------------------------


def test_in_a_partition_every_call_fails_within_the_timeout(
    proxied: Callable[..., PostgresStore], black_hole: BlackHole
) -> None:
    """The network stops passing bytes over the store's open connections: reads, writes,
    claims and the registry's look-ups each fail with StoreError within the timeout
    (plus a margin); once the network heals, the store reconnects and nothing that was
    acknowledged is lost."""
    store = proxied()
    store.claim("s")
    assert store.write({"s": [ev(0)]}) == {}
    black_hole.partition()
    with capture_logs() as logs:
        _cut_off(lambda: store.load("s"))  # the main connection
        _cut_off(lambda: store.claim("t"))  # the lease connection
    assert any(
        e["event"] == "store.connection_lost" and "no answer" in e["reason"] for e in logs
    ), logs
    # The cut connections are gone; a new one is not answered either, and its wait is
    # bounded as well.
    got, took = _timed(lambda: store.write({"s": [ev(1)]}))
    assert isinstance(got, StoreError), got
    assert took < CUT_BY + SLACK
    black_hole.heal()
    assert store.write({"s": [ev(1)]}) == {}
    assert [e.seq for e in store.load("s")] == [0, 1]
    assert store.claim("t")


def test_a_commit_whose_answer_is_lost_in_a_partition_is_read_back_never_doubled(
    proxied: Callable[..., PostgresStore],
    black_hole: BlackHole,
    pg_stores: Stores,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """COMMIT reaches the server, its answer never comes back: the write is cut off
    within the timeout and goes through the commit's read-back (its outcome is unknown:
    a StoreError, never an acknowledgement); the events are stored exactly once."""
    store = proxied()
    store.claim("s")
    real = _Write._commit

    def answer_lost(self: _Write, conn: Any, xid: str) -> None:
        black_hole.drop_answers()
        real(self, conn, xid)

    monkeypatch.setattr(_Write, "_commit", answer_lost)
    with capture_logs() as logs:
        got = _cut_off(lambda: store.write({"s": [ev(0), ev(1)]}))
    assert "outcome could not be read back" in str(got), got
    assert "store.commit_outcome_unknown" in [e["event"] for e in logs], logs
    monkeypatch.undo()
    black_hole.heal()
    reader = pg_stores()
    assert [e.seq for e in reader.load("s")] == [0, 1]  # it did commit: stored, once
    refused = store.write({"s": [ev(1)]})
    assert isinstance(refused["s"], ConflictError)  # a retry is never stored twice


def test_a_commit_cut_off_before_the_server_got_it_stores_nothing(
    proxied: Callable[..., PostgresStore],
    black_hole: BlackHole,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partition starts as COMMIT is sent, and loses it: the write is cut off within
    the timeout, unacknowledged (its outcome unknown); nothing of it is stored, and
    writing it again stores it once."""
    store = proxied()
    store.claim("s")
    real = _Write._commit

    def cut(self: _Write, conn: Any, xid: str) -> None:
        black_hole.partition(lose=True)
        real(self, conn, xid)

    monkeypatch.setattr(_Write, "_commit", cut)
    _cut_off(lambda: store.write({"s": [ev(0)]}))
    monkeypatch.undo()
    black_hole.heal()
    assert store.load("s") == []
    assert store.write({"s": [ev(0)]}) == {}
    assert [e.seq for e in store.load("s")] == [0]


def test_a_connection_in_a_partition_is_given_up_within_the_timeout(
    black_hole: BlackHole, pg_stores: Stores
) -> None:
    """Opening a store while the network drops everything fails within its timeout,
    even one under the 2 s least connect_timeout of libpq."""
    black_hole.partition()
    got, took = _timed(lambda: PostgresStore(black_hole.dsn, schema=pg_stores.schema, timeout=0.3))
    assert isinstance(got, StoreError), got
    assert "could not connect" in str(got)
    assert took < 0.3 + SLACK / 2, f"gave up after {took:.2f} s"


def test_closing_a_store_in_a_partition_is_bounded(
    proxied: Callable[..., PostgresStore], black_hole: BlackHole
) -> None:
    """A store with claims and a watch, closed while the network drops everything:
    close() returns within its bounds (its claims then lapse by themselves)."""
    store = proxied()
    store.claim("s")
    watch = store.watch("s")
    black_hole.partition()
    got, took = _timed(store.close)
    assert got is None
    assert took < 2 * CUT_BY + SLACK, f"closed after {took:.2f} s"
    with pytest.raises(StoreError, match="closed"):
        watch.get(BOUND)


def test_tcp_connections_carry_keepalives_and_a_user_timeout(
    proxied: Callable[..., PostgresStore],
) -> None:
    """On TCP the store asks for keepalives and a tcp_user_timeout of its timeout (data
    left unacknowledged that long ends the connection, not the system's 15 minutes);
    what the DSN sets itself is kept."""
    store = proxied(timeout=3)
    conn = store._main.conn
    assert conn is not None
    params = psycopg.conninfo.conninfo_to_dict(conn.info.dsn)
    assert params["keepalives"] == "1"
    assert params["tcp_user_timeout"] == "3000"
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # as the system has it
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # (Linux)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 3000
    own = PostgresStore(f"{store._ctx.dsn} tcp_user_timeout=7000", schema=store.schema, timeout=3)
    try:
        kept = own._main.conn
        assert kept is not None
        assert psycopg.conninfo.conninfo_to_dict(kept.info.dsn)["tcp_user_timeout"] == "7000"
    finally:
        own.close()


# -- a stopped server process -----------------------------------------------------------------


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """``SIGSTOP`` the server process ``pid`` for the ``with`` body (``SIGCONT`` after)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except PermissionError:
        pytest.skip("this test may not signal the server's processes")
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_stopped_server_process_bounds_the_call_and_the_store_reconnects(
    pg_stores: Stores,
) -> None:
    """The server process serving the store's connection is stopped (``SIGSTOP``: it
    neither answers nor closes): the call fails within the timeout, and the next one
    works on a new connection while that process is still stopped."""
    if pg_stores.server.folder is None:
        pytest.skip("stopping a server process needs a server of this machine")
    store = pg_stores(timeout=TIMEOUT)
    assert store.write({"s": [ev(0)]}) == {}
    conn = store._main.conn
    assert conn is not None
    with _stopped(conn.info.backend_pid):
        _cut_off(lambda: store.load("s"))
        assert [e.seq for e in store.load("s")] == [0]
        assert store.write({"s": [ev(1)]}) == {}
    assert [e.seq for e in store.load("s")] == [0, 1]


# -- the program's exit --------------------------------------------------------------------

CHILD = """
import sys
from nous_actor import Sessions
from nous_actor.store.postgres import PostgresStore

store = PostgresStore({dsn!r}, schema={schema!r}, timeout={timeout!r})
sessions = Sessions(store, timeout=10)
chat = sessions.open("chat")
chat.append("user_message", {{"content": "acknowledged"}}).get()
print("READY", flush=True)
sys.stdin.readline()
for i in range(20):
    chat.append("user_message", {{"content": f"in flight {{i}}"}})
print("LAST", flush=True)
"""


def test_a_program_ending_in_a_partition_exits_within_the_stores_timeout(
    pg_stores: Stores, black_hole: BlackHole
) -> None:
    """A program ends with appends in flight while the network drops everything: its
    exit waits for them only as long as the store's timeout (plus the margin), not the
    30 s the exit gives a store that stops answering, and counts them as lost."""
    code = textwrap.dedent(CHILD).format(
        dsn=black_hole.dsn, schema=pg_stores.schema, timeout=TIMEOUT
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        ready, _, _ = select.select([child.stdout], [], [], INTERPRETER_BOUND)
        assert ready
        assert child.stdout.readline().strip() == "READY"
        black_hole.partition()
        child.stdin.write("go\n")
        child.stdin.flush()
        ready, _, _ = select.select([child.stdout], [], [], BOUND)
        assert ready
        assert child.stdout.readline().strip() == "LAST"
        started = time.monotonic()
        child.wait(BOUND)
        took = time.monotonic() - started
        err = child.stderr.read() if child.stderr is not None else ""
    finally:
        end_child(child)
        if child.stderr is not None:
            child.stderr.close()
    assert child.returncode == 0, err
    assert "session.exit_lost" in err, err
    assert took < CUT_BY + SLACK, f"the exit took {took:.2f} s"
