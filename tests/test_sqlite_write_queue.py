"""The write queue of a SQLite file (`nous_actor.store.sqlite.writelock`): writers take
turns through a ``flock`` on ``<file>-wlock`` instead of polling SQLite's lock.

Two `WriteLock`s (or two stores) on one file in one process stand for two processes:
each holds its own open file description, so they exclude each other as processes do.
A child process that holds the lock and is SIGKILLed stands for a worker that dies.
"""

from __future__ import annotations

import gc
import os
import queue
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from bounds import end_child
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from nous_actor import SQLiteStore
from nous_actor.core.event import Event
from nous_actor.errors import StoreError
from nous_actor.store.committer import committer_for
from nous_actor.store.sqlite import writelock
from nous_actor.store.sqlite.writelock import NO_QUEUE, SUFFIX, WriteLock

WAIT = 10.0  # the bound of every wait that should end (a hang fails the test)


def _event(seq: int, text: str = "x") -> Event:
    return Event(seq, "user_message", datetime.now(UTC), {"content": text})


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "s.db")


def test_a_turn_is_exclusive_and_a_waiter_gives_up_at_its_bound(db: str) -> None:
    a, b = WriteLock(db), WriteLock(db)
    try:
        assert a.acquire(WAIT)
        t0 = time.monotonic()
        assert not b.acquire(0.05)  # held by "the other process"
        assert 0.04 <= time.monotonic() - t0 < WAIT
        a.release()
        assert b.acquire(WAIT)
        assert not a.acquire(0.01)
        b.release()
    finally:
        a.close()
        b.close()
    assert os.path.exists(db + SUFFIX)


def test_a_waiter_gets_the_turn_when_its_holder_lets_go(db: str) -> None:
    a, b = WriteLock(db), WriteLock(db)
    got: list[bool] = []
    try:
        assert a.acquire(WAIT)
        waiter = threading.Thread(target=lambda: got.append(b.acquire(WAIT)))
        waiter.start()
        # It waits (through its helper, in the kernel) while the turn is a's.
        deadline = time.monotonic() + WAIT
        while not b._inflight and time.monotonic() < deadline:
            time.sleep(0.001)
        assert b._inflight
        assert not got
        a.release()
        waiter.join(WAIT)
        assert got == [True]
        assert not a.acquire(0.01)  # b holds it now
        b.release()
        assert a.acquire(WAIT)
        a.release()
    finally:
        a.close()
        b.close()


def test_a_turn_that_comes_after_its_waiter_gave_up_is_let_go(db: str) -> None:
    a, b, c = WriteLock(db), WriteLock(db), WriteLock(db)
    try:
        assert a.acquire(WAIT)
        assert not b.acquire(0.02)  # b's helper is left waiting in the kernel
        assert b._inflight
        a.release()
        # b's helper gets the lock for nobody and lets it go: c gets it.
        assert c.acquire(WAIT)
        c.release()
        # b's next turn comes through its helper, which is still the one thread.
        helper = b._helper
        assert b.acquire(WAIT)
        assert b._helper is helper
        b.release()
    finally:
        for lock in (a, b, c):
            lock.close()


def test_close_ends_a_helper_that_waits_in_the_kernel(db: str) -> None:
    a, b = WriteLock(db), WriteLock(db)
    assert a.acquire(WAIT)
    assert not b.acquire(0.01)
    helper = b._helper
    assert helper is not None
    assert helper.is_alive()
    b.close()
    assert helper.is_alive()  # still in flock: a holds the lock
    a.release()
    helper.join(WAIT)
    assert not helper.is_alive()
    assert b._fd is None  # it closed the descriptor as it ended
    assert a.acquire(WAIT)  # and did not keep the lock
    a.release()
    a.close()
    b.close()  # twice: nothing


def test_an_idle_helper_ends_and_the_next_wait_starts_another(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writelock, "IDLE_S", 0.02)
    a, b = WriteLock(db), WriteLock(db)
    try:
        assert a.acquire(WAIT)
        assert not b.acquire(0.01)
        first = b._helper
        assert first is not None
        a.release()
        first.join(WAIT)  # it let the lock go, then found nothing asked
        assert not first.is_alive()
        assert b._helper is None
        assert a.acquire(WAIT)  # the lock was not kept
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(b.acquire(WAIT)))
        waiter.start()
        deadline = time.monotonic() + WAIT
        while b._helper in (None, first) and time.monotonic() < deadline:
            time.sleep(0.001)
        a.release()
        waiter.join(WAIT)
        assert got == [True]
        b.release()
    finally:
        a.close()
        b.close()


def test_a_forgotten_lock_closes_its_file(db: str) -> None:
    lock = WriteLock(db)
    assert lock.acquire(WAIT)
    lock.release()
    closer = lock._closer
    assert closer is not None
    assert closer.alive
    del lock
    gc.collect()
    assert not closer.alive


def test_a_forgotten_store_closes_its_connections(db: str) -> None:
    """A store collected without `close` (a registry's, dropped with it) closes every
    connection it made, its follower's too: one freed open warns (`ResourceWarning`,
    Python 3.13 on), an error under ``-W error``."""
    from nous_actor import Sessions

    store = SQLiteStore(db)
    with Sessions(store) as sessions:
        sessions.open("s").append("user_message", {"content": "x"}).get(timeout=WAIT)
        assert sessions.read("s").count().get(timeout=WAIT) == 1  # (the follower's)
    made = list(store._connection._made)
    assert len(made) == 3  # read, write, follow
    del store, sessions
    gc.collect()
    for conn in made:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")


_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def test_the_turn_of_a_process_killed_while_holding_it_passes_on(db: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, db + SUFFIX],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lock = WriteLock(db)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        assert not lock.acquire(0.02)
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(lock.acquire(WAIT)))
        waiter.start()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(WAIT)
        waiter.join(WAIT)
        assert got == [True]
        lock.release()
    finally:
        end_child(holder, WAIT)
        lock.close()


def test_a_lock_file_that_cannot_be_opened_leaves_the_store_polling(
    tmp_path: Path, db: str
) -> None:
    os.mkdir(db + SUFFIX)  # not a file: it cannot be opened for writing
    with structlog.testing.capture_logs() as logs:
        store = SQLiteStore(db)
        try:
            assert store.write({"s": [_event(0)]}) == {}
            assert store.write({"s": [_event(1)]}) == {}
            assert [e.seq for e in store.load("s")] == [0, 1]
        finally:
            store.close()
    unused = [e for e in logs if e["event"] == "store.write_lock_unused"]
    assert len(unused) == 1  # said once, not at each write
    assert unused[0]["log_level"] == "info"


def test_an_in_memory_store_makes_no_lock_file(tmp_path: Path) -> None:
    assert NO_QUEUE.acquire(0.0)
    assert NO_QUEUE.path == ""
    NO_QUEUE.release()
    store = SQLiteStore(":memory:")
    try:
        assert store.write({"s": [_event(0)]}) == {}
    finally:
        store.close()
    assert not list(tmp_path.iterdir())
    assert not NO_QUEUE._closed  # the shared queue of every in-memory store stays open


def test_a_store_only_read_makes_no_lock_file(db: str) -> None:
    SQLiteStore(db).close()  # makes the file (its schema)
    store = SQLiteStore(db)
    try:
        assert store.load("s") == []
    finally:
        store.close()
    assert not os.path.exists(db + SUFFIX)


def test_a_store_waits_for_its_turn_at_most_its_timeout(db: str) -> None:
    store = SQLiteStore(db, timeout=0.2)
    other = WriteLock(db)
    try:
        assert store.write({"s": [_event(0)]}) == {}
        assert other.acquire(WAIT)  # "another process" keeps its turn
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="another process holds the write lock: retry"):
            store.write({"s": [_event(1, "late")]})
        assert 0.15 <= time.monotonic() - t0 < WAIT
        other.release()
        assert [e.seq for e in store.load("s")] == [0]  # the refused write left nothing
        assert store.write({"s": [_event(1)]}) == {}  # and the next goes in
        assert [e.seq for e in store.load("s")] == [0, 1]
    finally:
        other.close()
        store.close()


def test_a_committer_whose_turn_does_not_come_waits_for_it_once(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer takes the file's turn ahead of its write: when it does not come
    within the store's timeout, the write fails at once with the reason (nothing is
    written), instead of waiting out the timeout a second time; the next goes in."""
    store = SQLiteStore(db, timeout=0.2)
    other = WriteLock(db)
    committer = committer_for(store)
    mine = store._connection._queue
    waits: list[float] = []
    real = WriteLock.acquire

    def counted(self: WriteLock, timeout: float) -> bool:
        if self is mine:
            waits.append(timeout)
        return real(self, timeout)

    monkeypatch.setattr(WriteLock, "acquire", counted)
    answers: queue.SimpleQueue[StoreError | None] = queue.SimpleQueue()
    try:
        assert other.acquire(WAIT)  # "another process" keeps its turn
        committer.submit("s", [_event(0)], answers.put)
        err = answers.get(timeout=WAIT)
        assert isinstance(err, StoreError)
        assert "another process holds the write lock: retry" in str(err)
        assert waits == [0.2]  # one wait, at the store's bound
        assert store.load("s") == []
        other.release()
        committer.reset("s")
        committer.submit("s", [_event(0)], answers.put)
        assert answers.get(timeout=WAIT) is None
        assert [e.seq for e in store.load("s")] == [0]
    finally:
        other.close()
        store.close()


def test_what_comes_while_another_process_writes_goes_in_the_same_commit(db: str) -> None:
    """The committer takes the file's turn before it fills a transaction: appends sent
    while another process holds the turn all go in the one commit made when it comes,
    not the first alone and the rest in a second commit, after a second wait; the turn
    is let go once the file is written, before the answers."""
    store = SQLiteStore(db)
    other = WriteLock(db)
    committer = committer_for(store)
    answered: list[tuple[str, StoreError | None]] = []
    came = threading.Condition()

    free: list[bool] = []  # whether another process could take the turn at each answer

    def notify(sid: str) -> Callable[[StoreError | None], None]:
        def done(err: StoreError | None) -> None:
            free.append(other.acquire(0.0))
            other.release()
            with came:
                answered.append((sid, err))
                came.notify_all()

        return done

    try:
        assert other.acquire(WAIT)  # "another process" writes the file
        before = committer.commits
        committer.submit("s0", [_event(0)], notify("s0"))
        deadline = time.monotonic() + WAIT
        while not store._connection._queue._inflight and time.monotonic() < deadline:
            time.sleep(0.001)
        assert store._connection._queue._inflight  # the committer waits for the turn
        for k in range(1, 5):
            committer.submit(f"s{k}", [_event(0), _event(1)], notify(f"s{k}"))
        other.release()
        with came:
            assert came.wait_for(lambda: len(answered) == 5, WAIT)
        assert committer.commits - before == 1
        assert sorted(answered) == [(f"s{k}", None) for k in range(5)]
        assert free == [True] * 5  # the turn was let go before the answers
        assert {sid: len(store.load(sid)) for sid in store.sessions()} == {
            "s0": 1, "s1": 2, "s2": 2, "s3": 2, "s4": 2
        }  # fmt: skip
    finally:
        other.close()
        store.close()


def test_stores_writing_one_file_take_turns_without_polling(db: str) -> None:
    """Two stores (two processes' worth) write from 4 threads each: every write lands,
    each transaction begins at its first try (no BEGIN refused and tried again), and
    every write of a session already numbered is one statement that found the file free
    (none went the transaction's way instead)."""
    stores = [SQLiteStore(db), SQLiteStore(db)]
    begins: list[int] = [0, 0]
    busy: list[int] = [0, 0]
    at_once: list[int] = [0, 0]
    for i, store in enumerate(stores):
        conn = store._connection.writer()

        def trace(sql: str, i: int = i) -> None:
            if sql.startswith("BEGIN IMMEDIATE"):
                begins[i] += 1

        conn.set_trace_callback(trace)
    real_begin = [s._connection.begin for s in stores]

    def counting(i: int):  # type: ignore[no-untyped-def]
        def begin(conn: sqlite3.Connection, deadline: float) -> None:
            busy[i] += 1
            real_begin[i](conn, deadline)

        return begin

    real_at_once = [s._connection.write_at_once for s in stores]

    def counting_at_once(i: int):  # type: ignore[no-untyped-def]
        def write_at_once(*args: Any) -> bool:
            wrote = real_at_once[i](*args)
            at_once[i] += wrote
            return wrote

        return write_at_once

    for i, store in enumerate(stores):
        store._connection.begin = counting(i)  # type: ignore[method-assign]
        store._connection.write_at_once = counting_at_once(i)  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        store = stores[k % 2]
        try:
            for j in range(25):
                assert store.write({f"s{k}": [_event(j)]}) == {}
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 6)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        for k in range(8):
            assert [e.seq for e in stores[0].load(f"s{k}")] == list(range(25))
        # A session's first write numbers it (a transaction); the rest are one statement.
        assert busy == [4, 4]
        assert at_once == [96, 96]
        assert begins == busy  # each BEGIN IMMEDIATE went through at its first try
    finally:
        for store in stores:
            store.close()


class _Watched:
    """A store's `WriteLock`, seen: whether the turn is held now, and the statements the
    store's connection ran in each turn (one list per turn)."""

    def __init__(self, lock: WriteLock) -> None:
        self.lock = lock
        self.path = lock.path
        self.held = False
        self.turns: list[list[str]] = []

    def acquire(self, timeout: float) -> bool:
        came = self.lock.acquire(timeout)
        if came:
            self.held = True
            self.turns.append([])
        return came

    def release(self) -> None:
        self.held = False
        self.lock.release()

    def close(self) -> None:
        self.lock.close()

    def trace(self, sql: str) -> None:
        # (SQLite traces a statement again at each step of a trigger it fires, among the
        # comments it traces for pragma functions: one statement, however many times.)
        if self.held:
            statements = [s for s in self.turns[-1] if s[:2] != "--"]
            if statements[-1:] != [sql]:
                self.turns[-1].append(sql)


def _statements_in_turn(store: SQLiteStore) -> list[list[str]]:
    """Record the statements ``store`` runs while it holds the file's turn."""
    watched = _Watched(store._connection._queue)
    store._connection._queue = watched  # type: ignore[assignment]
    store._connection.conn.set_trace_callback(watched.trace)
    store._connection.writer().set_trace_callback(watched.trace)
    return watched.turns


@pytest.mark.parametrize("through", ["write", "committer"])
def test_a_turn_holds_only_the_transaction(db: str, through: str) -> None:
    """While a store holds the file's turn it runs its write and nothing else (each
    statement hands the GIL back and takes it again while other processes wait for the
    turn): a write of known sessions is one statement, which is its own transaction and
    looks at the file's schema itself, with forwarded calls' records (into the view whose
    trigger stores them) or without; no statement switches SQLite's busy handler (the
    connection that writes has it off, the one that reads on), and ``synchronous``,
    relaxed for a claim, changes before the turn is taken and back after it is let go."""
    store = SQLiteStore(db)
    try:
        # The session's number, known; the table of call records, made (the file's first
        # forwarded call makes it), and the schema as it is now, seen by a write.
        assert store.write({"s": [_event(0)]}, calls={"s": [("first", 0, 0)]}) == {}
        assert store.write({"t": [_event(0)]}) == {}
        turns = _statements_in_turn(store)
        events = [_event(k + 1) for k in range(3)]
        if through == "write":
            assert store.write({"s": events}, calls={"s": [("call", 1, 3)]}) == {}
        else:
            done: queue.SimpleQueue[StoreError | None] = queue.SimpleQueue()
            committer_for(store).submit("s", events, done.put, call="call")
            assert done.get(timeout=WAIT) is None
        store.claim("other")  # a claim: committed with synchronous relaxed
        if through == "write":
            assert store.write({"t": [_event(1), _event(2)]}) == {}
        else:
            committer_for(store).submit("t", [_event(1), _event(2)], done.put)
            assert done.get(timeout=WAIT) is None
        conn = store._connection.writer()
        conn.set_trace_callback(None)
        assert len(turns) == 3
        # (SQLite traces what a pragma function runs as a comment: not a statement.)
        write, _, alone = (
            [sql.split(" (")[0].split(" VALUES")[0] for sql in turn if sql[:2] != "--"]
            for turn in turns
        )
        assert write == ["INSERT INTO call_events"]
        assert alone == ["INSERT INTO event_rows"]
        for turn in (turns[0], turns[2]):
            assert "WHERE (SELECT user_version = 3 AND schema_version = " in turn[0]
        for turn in turns:
            assert not [sql for sql in turn if sql.startswith("PRAGMA")]
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        reader = store._connection.conn
        assert reader.execute("PRAGMA busy_timeout").fetchone()[0] == store._connection.busy_ms
        assert [e.seq for e in store.load("s")] == [0, 1, 2, 3]
        assert [e.seq for e in store.load("t")] == [0, 1, 2]
        assert store.applied_call("s", "call") == (1, 3)
        assert store.applied_call("s", "first") == (0, 0)
    finally:
        store.close()


def test_a_writer_that_does_not_queue_is_waited_for_and_the_settings_come_back(db: str) -> None:
    """Another tool writing the file (it takes SQLite's lock, not the turn): the write
    waits for it (SQLite's handler is off on the connection that writes: the one
    statement of a write of known sessions finds the lock taken and writes nothing, then
    the write's transaction looks again in short steps) and commits once it is done; the
    connection that reads keeps its busy handler."""
    store = SQLiteStore(db)
    tool = sqlite3.connect(db, isolation_level=None)
    try:
        assert store.write({"s": [_event(0)]}) == {}  # numbered: the next goes at once
        tool.execute("BEGIN IMMEDIATE")
        done: list[dict[str, StoreError]] = []
        t = threading.Thread(target=lambda: done.append(store.write({"s": [_event(1)]})))
        t.start()
        t.join(0.05)
        assert t.is_alive()  # waits for the tool's lock
        tool.execute("COMMIT")
        t.join(WAIT)
        assert done == [{}]
        conn = store._connection.conn
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == store._connection.busy_ms
        assert [e.seq for e in store.load("s")] == [0, 1]
    finally:
        tool.close()
        store.close()


class WriteQueueMachine(RuleBasedStateMachine):
    """Three stores' locks on one file against a model of who holds the turn: a turn is
    never had by two at once, and a turn let go (or given up waiting for) is never lost
    (the next one asked for with time to spare comes)."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp()
        db = os.path.join(self.folder, "m.db")
        self.locks = [WriteLock(db) for _ in range(3)]
        self.holder: int | None = None

    @rule(i=st.integers(0, 2))
    def ask(self, i: int) -> None:
        if self.holder is None:
            assert self.locks[i].acquire(WAIT)
            self.holder = i
        elif self.holder != i:
            assert not self.locks[i].acquire(0.005)

    @precondition(lambda self: self.holder is not None)
    @rule()
    def let_go(self) -> None:
        assert self.holder is not None
        self.locks[self.holder].release()
        self.holder = None

    @rule(i=st.integers(0, 2))
    def reopen(self, i: int) -> None:
        """A store closed and opened again (its helper, if any, ends on its own)."""
        if self.holder == i:
            self.locks[i].release()
            self.holder = None
        self.locks[i].close()
        self.locks[i] = WriteLock(self.locks[i].path[: -len(SUFFIX)])

    def teardown(self) -> None:
        if self.holder is not None:
            self.locks[self.holder].release()
        for lock in self.locks:
            lock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


TestWriteQueueMachine = WriteQueueMachine.TestCase
TestWriteQueueMachine.settings = settings(stateful_step_count=20)


def test_the_lock_file_has_the_database_file_s_permissions(db: str) -> None:
    """As SQLite's -wal and -shm, whatever the umask: whoever may write the database
    may queue for it."""
    SQLiteStore(db).close()
    os.chmod(db, 0o664)
    old = os.umask(0o022)
    try:
        store = SQLiteStore(db)
        try:
            assert store.write({"s": [_event(0)]}) == {}
        finally:
            store.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(db + SUFFIX).st_mode) == 0o664
    if os.path.exists(db + "-wal"):  # (SQLite's own, for comparison)
        assert stat.S_IMODE(os.stat(db + "-wal").st_mode) == 0o664
