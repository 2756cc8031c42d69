"""Several processes on one store: reads without taking a session, watches that follow
another process's commits, hand-off on request, and web workers SIGKILLed mid-traffic.

The worker processes are `bench.fleet` workers (a `Sessions` each, serving requests
on a Unix socket); every wait is bounded.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fleet import SERVERS, Fleet, Worker, ask, check_histories, open_store, run_clients
from nous_actor import ConflictError, Sessions, SQLiteStore
from nous_actor.core.compaction import Compactor
from nous_actor.store import MemoryStore, shared

SESSIONS = 20
REQUESTS = 1000
CLIENTS = 32


@pytest.fixture
def fleet_on(tmp_path: Path) -> Iterator[Any]:
    """``fleet_on(store_spec, n)`` -> a started `Fleet` of ``n`` workers, stopped after."""
    made: list[Fleet] = []

    def make(spec: str, n: int, wait: float = 10.0, server: str = "threads") -> Fleet:
        open_store(spec).close()  # the store exists before the workers race to make it
        fleet = Fleet(spec, tmp_path, wait=wait, server=server)
        made.append(fleet)
        fleet.start(n)
        return fleet

    yield make
    for fleet in made:
        fleet.stop()


def _traffic_with_kills(fleet: Fleet, spec: str) -> None:
    rng = random.Random(22)
    requests = [(f"s{rng.randrange(SESSIONS)}", f"r{i}") for i in range(REQUESTS)]
    kills = [REQUESTS // 3, 2 * REQUESTS // 3]
    killed: list[int] = []
    killer_threads: list[threading.Thread] = []
    lock = threading.Lock()

    def progress(done: int) -> None:
        with lock:
            if not kills or done < kills[0]:
                return
            kills.pop(0)
        t = threading.Thread(target=lambda: killed.append(fleet.kill_one(rng)), daemon=True)
        killer_threads.append(t)
        t.start()

    out = run_clients(fleet, requests, CLIENTS, seed=22, on_progress=progress)
    for t in killer_threads:
        t.join(60)
    assert len(killed) == 2, "the workers were not killed mid-traffic"
    # Every request is answered by a live worker, and stored (a client retries one whose
    # worker died): none waits out its bound, however the kills fall.
    assert out.errors == []
    assert len(out.acked) == REQUESTS
    store = open_store(spec)
    try:
        histories = {sid: shared.load_since(store, sid) for sid in store.sessions()}
    finally:
        store.close()
    sent = {rid: sid for sid, rid in requests}
    assert check_histories(histories, out.acked, sent) == []
    assert sum(len(h) for h in histories.values()) >= 4 * len(out.acked)


def test_four_sqlite_workers_serve_every_request_while_two_are_killed(
    fleet_on: Any, tmp_path: Path
) -> None:
    """4 worker processes on one SQLite file serve 1,000 requests for 20 sessions from 32
    clients in random order; two workers are SIGKILLed mid-traffic (and replaced): every
    request is answered (a client retries one whose worker died), and every session's
    history is whole turns, in order, never interleaved, each acknowledged request
    stored once."""
    spec = f"sqlite:{tmp_path / 'app.db'}"
    _traffic_with_kills(fleet_on(spec, 4), spec)


def test_four_postgres_workers_serve_every_request_while_two_are_killed(
    fleet_on: Any, pg_server: Any
) -> None:
    """The same traffic and kills on PostgreSQL (leases, fencing and LISTEN/NOTIFY)."""
    schema = pg_server.fresh_schema()
    spec = f"postgres:{schema}:{pg_server.dsn}"
    try:
        _traffic_with_kills(fleet_on(spec, 4), spec)
    finally:
        pg_server.drop_schema(schema)


def test_a_request_to_the_holder_of_another_worker_is_handed_over(
    fleet_on: Any, tmp_path: Path
) -> None:
    """A session written by one worker is written next by another: the first hands it
    over on request (it is idle), and the history holds both turns in order."""
    spec = f"sqlite:{tmp_path / 'app.db'}"
    fleet = fleet_on(spec, 2)
    a, b = fleet.live()
    first = ask(a, "chat", "one")
    second = ask(b, "chat", "two")
    assert first is not None
    assert first["ok"]
    assert first["seq"] == 0
    assert second is not None
    assert second["ok"]
    assert second["seq"] == 4
    assert second["seen"] == 4  # b read the committed prefix before it took the session
    store = open_store(spec)
    try:
        assert shared.held_by(store, "chat") == f"process {b.pid}"
        rids = [e.data["rid"] for e in store.load("chat") if e.type == "turn_start"]
    finally:
        store.close()
    assert rids == ["one", "two"]


def _a_worker_holding(fleet_on: Any, tmp_path: Path, session_id: str) -> Worker:
    """One worker on ``app.db`` that served one request (``"one"``) for ``session_id``,
    so it holds that session now."""
    (worker,) = fleet_on(f"sqlite:{tmp_path / 'app.db'}", 1).live()
    reply = ask(worker, session_id, "one")
    assert reply is not None
    assert reply["ok"]
    return worker  # type: ignore[no-any-return]


def test_open_without_wait_calls_the_session_through_the_process_that_holds_it(
    fleet_on: Any, tmp_path: Path
) -> None:
    """Without ``wait``, a session another live process holds is not refused: the handle
    sends each call to that process (appends, reads, turns, a subscription), which keeps
    the session; nothing moves."""
    worker = _a_worker_holding(fleet_on, tmp_path, "chat")
    with Sessions(SQLiteStore(tmp_path / "app.db")) as sessions:
        chat = sessions.open("chat")
        assert sessions.live() == []  # not opened here
        assert chat.append("user_message", {"content": "via holder"}).get().seq == 4
        pipelined = [chat.append("user_message", {"content": f"p{i}"}) for i in range(50)]
        assert [f.get().seq for f in pipelined] == list(range(5, 55))
        with chat.turn(owner="here") as turn:
            turn.append("assistant_message", {"content": "in a turn"}).get()
        messages = [m.content for m in chat.derive_messages().get()]
        assert messages[:3] == ["question one", "answer one", "via holder"]
        assert messages[-1] == "in a turn"
        with chat.subscribe(0) as sub:
            assert [sub.get(timeout=10).seq for _ in range(3)] == [0, 1, 2]
        assert chat.is_alive()
        assert shared.held_by(sessions.store, "chat") == f"process {worker.pid}"
        assert sessions.live() == []
        # ... and reading never needs the session:
        read = sessions.read("chat").derive_messages().get()
        assert [m.content for m in read] == messages


def test_the_next_call_moves_a_session_whose_holder_was_killed(
    fleet_on: Any, tmp_path: Path
) -> None:
    """The holder process is SIGKILLed while a handle elsewhere forwards to it: the
    next call opens the session in the caller's process, with every acknowledged
    event, and nothing is refused."""
    fleet = fleet_on(f"sqlite:{tmp_path / 'app.db'}", 1)
    (worker,) = fleet.live()
    assert (ask(worker, "chat", "one") or {}).get("ok")
    with Sessions(SQLiteStore(tmp_path / "app.db")) as sessions:
        chat = sessions.open("chat")
        acked = [chat.append("user_message", {"content": f"m{i}"}).get().seq for i in range(5)]
        assert acked == [4, 5, 6, 7, 8]
        fleet.kill_one(random.Random(1))
        after = chat.append("user_message", {"content": "after"}).get()
        assert after.seq == 9
        assert sessions.live() == ["chat"]  # moved here
        seqs = [e.seq for e in sessions.read("chat").events().get()]
        assert seqs == list(range(10))


def _forwarded_traffic_with_kills(fleet: Fleet, spec: str) -> None:
    """As `_traffic_with_kills`, and no call is refused by a live worker."""
    rng = random.Random(32)
    requests = [(f"s{rng.randrange(SESSIONS)}", f"r{i}") for i in range(REQUESTS)]
    kills = [REQUESTS // 3, 2 * REQUESTS // 3]
    killed: list[int] = []
    killer_threads: list[threading.Thread] = []
    lock = threading.Lock()

    def progress(done: int) -> None:
        with lock:
            if not kills or done < kills[0]:
                return
            kills.pop(0)
        t = threading.Thread(target=lambda: killed.append(fleet.kill_one(rng)), daemon=True)
        killer_threads.append(t)
        t.start()

    out = run_clients(fleet, requests, CLIENTS, seed=32, on_progress=progress)
    for t in killer_threads:
        t.join(60)
    assert len(killed) == 2, "the workers were not killed mid-traffic"
    assert out.errors == []
    assert out.stopped == 0, "a live worker saw a call refused"
    assert len(out.acked) == REQUESTS
    store = open_store(spec)
    try:
        histories = {sid: shared.load_since(store, sid) for sid in store.sessions()}
    finally:
        store.close()
    sent = {rid: sid for sid, rid in requests}
    assert check_histories(histories, out.acked, sent) == []


@pytest.mark.parametrize("server", SERVERS)
def test_four_sqlite_workers_forward_every_request_while_two_are_killed(
    fleet_on: Any, tmp_path: Path, server: str
) -> None:
    """4 workers on one SQLite file that forward calls to a session's holder (no
    ``wait``): 1,000 requests from 32 clients routed at random, two workers SIGKILLed
    mid-traffic: every request answered, none refused by a live worker, every history
    whole turns in order, each acknowledged request stored once. Workers that serve a
    thread per connection (blocking ``get``), and workers that serve every connection
    from one asyncio loop (``aopen``, every call awaited)."""
    spec = f"sqlite:{tmp_path / 'app.db'}"
    _forwarded_traffic_with_kills(fleet_on(spec, 4, wait=0.0, server=server), spec)


@pytest.mark.parametrize("server", SERVERS)
def test_four_postgres_workers_forward_every_request_while_two_are_killed(
    fleet_on: Any, pg_server: Any, server: str
) -> None:
    """The same forwarded traffic and kills on PostgreSQL, from either server."""
    schema = pg_server.fresh_schema()
    spec = f"postgres:{schema}:{pg_server.dsn}"
    try:
        _forwarded_traffic_with_kills(fleet_on(spec, 4, wait=0.0, server=server), spec)
    finally:
        pg_server.drop_schema(schema)


def test_a_watch_sees_another_process_commit_within_50_ms(fleet_on: Any, tmp_path: Path) -> None:
    """A watch on a SQLite file in this process follows a worker's commits: each turn
    arrives whole, within 50 ms of its acknowledgement."""
    spec = f"sqlite:{tmp_path / 'app.db'}"
    fleet = fleet_on(spec, 1)
    (worker,) = fleet.live()
    store = SQLiteStore(tmp_path / "app.db")
    delays = []
    try:
        with shared.watch(store, "chat") as feed:
            for i in range(5):
                reply = ask(worker, "chat", f"r{i}")
                acked = time.monotonic()
                assert reply is not None
                assert reply["ok"]
                got = [feed.get(timeout=5) for _ in range(4)]
                delays.append(time.monotonic() - acked)
                assert [e.seq for e in got] == list(range(4 * i, 4 * i + 4))
                assert {e.data["rid"] for e in got} == {f"r{i}"}
    finally:
        store.close()
    assert max(delays) <= 0.05, delays


# -- in one process, on one MemoryStore: two registries -----------------------------------


class _Gate:
    """A summariser that waits until the test opens the gate (bounded)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, messages: Any) -> str:
        self.entered.set()
        assert self.opened.wait(30)
        return "summary"


def test_a_busy_holder_keeps_the_session_until_the_askers_bound_then_hands_it_over() -> None:
    """While the holder writes a compaction the asker's bound runs out (ConflictError
    naming the holder, after the bound); once the holder is idle, it is handed over."""
    store = MemoryStore()
    gate = _Gate()
    with Sessions(store) as holder_reg, Sessions(store) as asker_reg:
        held = holder_reg.open("chat")
        for i in range(4):
            held.append("user_message", {"content": f"m{i}"}).get()
        compaction = held.compact(Compactor(budget=1, keep_recent=1, summarise=gate), force=True)
        assert gate.entered.wait(10)
        started = time.monotonic()
        with pytest.raises(ConflictError, match="still held by this process") as caught:
            asker_reg.open("chat", wait=0.3)
        assert time.monotonic() - started >= 0.3
        assert caught.value.holder == "this process"
        gate.opened.set()
        compaction.get()
        chat = asker_reg.open("chat", wait=10)
        chat.append("user_message", {"content": "after"}).get()
        assert [e.seq for e in asker_reg.read("chat").events().get()][-1] == chat.count().get() - 1
        assert holder_reg.live() == []  # it let go
        assert shared.handoff_requests(store) == []  # the asker withdrew its request


def test_a_handle_of_the_old_holder_asks_for_the_session_back() -> None:
    """After a hand-off, a handle of the registry that gave the session up reopens it by
    asking for it back (its registry's ``handoff_wait``); nothing acknowledged is lost."""
    store = MemoryStore()
    with Sessions(store, handoff_wait=10) as a, Sessions(store, handoff_wait=10) as b:
        in_a = a.open("chat")
        in_a.append("user_message", {"content": "a1"}).get()
        in_b = b.open("chat")  # taken from a
        in_b.append("user_message", {"content": "b1"}).get()
        in_a.append("user_message", {"content": "a2"}).get()  # taken back from b
        contents = [m.content for m in b.read("chat").derive_messages().get()]
        assert contents == ["a1", "b1", "a2"]
        assert a.live() == ["chat"]
        assert b.live() == []


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait", "error"), [(-1, ValueError), (float("nan"), ValueError), ("1", TypeError)]
)
def test_open_refuses_a_bad_wait_and_opens_nothing(wait: Any, error: type) -> None:
    """``wait`` must be a number of seconds >= 0; the session is not opened."""
    with Sessions() as sessions:
        with pytest.raises(error, match="wait"):
            sessions.open("chat", wait=wait)
        assert sessions.live() == []


def test_a_registry_refuses_a_bad_handoff_wait() -> None:
    """``handoff_wait`` must be None or a number of seconds >= 0."""
    with pytest.raises(ValueError, match="handoff_wait"):
        Sessions(handoff_wait=-0.5)
    with pytest.raises(TypeError, match="handoff_wait"):
        Sessions(handoff_wait="5")  # type: ignore[arg-type]


def test_nous_session_get_items_reads_a_session_another_worker_holds(
    fleet_on: Any, tmp_path: Path
) -> None:
    """The Agents SDK session reads a session another worker process holds, without
    taking it: the holder keeps it."""
    import asyncio

    from nous_actor.integrations.openai_agents import NousSession

    worker = _a_worker_holding(fleet_on, tmp_path, "user-1")
    with Sessions(SQLiteStore(tmp_path / "app.db")) as sessions:
        nous = NousSession("user-1", sessions)
        items = asyncio.run(nous.get_items())
        assert [item.get("content") for item in items] == ["question one", "answer one"]
        assert sessions.live() == []
        assert shared.held_by(sessions.store, "user-1") == f"process {worker.pid}"


_ASKER = """
import os, signal, sys
from nous_actor import SQLiteStore
store = SQLiteStore(sys.argv[1])
store.ask_handoff("chat", 60)
print("asked", flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), signal.SIGKILL)  # dies with its request standing
sys.stdin.readline()
"""


def test_a_dead_askers_request_never_hides_a_live_askers(tmp_path: Path) -> None:
    """Two processes ask for a session on SQLite; the one that asked last is SIGKILLed
    with its request still standing: the holder still sees the live asker's request
    (a dead asker's row once shadowed it, and the session stalled until it lapsed)."""
    import subprocess
    import sys

    path = tmp_path / "app.db"
    holder = SQLiteStore(path)
    holder.claim("chat")
    live = subprocess.Popen(
        [sys.executable, "-c", _ASKER, str(path), "live"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert live.stdout is not None
        assert live.stdout.readline() == "asked\n"
        dead = subprocess.run(
            [sys.executable, "-c", _ASKER, str(path), "die"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dead.returncode == -9
        assert dead.stdout == "asked\n"
        assert holder.handoff_requests() == ["chat"]
        assert live.stdin is not None
        live.stdin.close()
        live.wait(30)
        # Both askers are gone now, their requests with them.
        assert holder.handoff_requests() == []
    finally:
        live.kill()
        live.wait(30)
        live.stdout.close()  # type: ignore[union-attr]
        holder.close()


def test_a_holder_looks_for_requests_at_its_pace_and_rests_when_it_holds_nothing(
    tmp_path: Path,
) -> None:
    """While its registry holds a session, the hand-over side reads the SQLite file's
    requests every `handoff_poll` (not at every commit of every process, and without
    keeping the file polled: no follower poll while nobody else waits); once it holds
    none it rests and reads nothing; an open wakes it. Counted in reads and polls."""
    store = SQLiteStore(tmp_path / "app.db")
    reads = [0]
    real = store.handoff_requests

    def counted_reads() -> list[str]:
        reads[0] += 1
        return real()

    store.handoff_requests = counted_reads  # type: ignore[method-assign]
    with Sessions(store) as sessions:
        chat = sessions.open("chat")
        chat.append("user_message", {"content": "hi"}).get(timeout=10)
        follower = shared.follower_of(store._connection)
        polls = [0]
        mark = follower._mark

        def counted() -> int:
            polls[0] += 1
            return mark()

        follower._mark = counted  # type: ignore[method-assign]
        handover = sessions._handover
        deadline = time.monotonic() + 10
        while reads[0] < 3:  # holding a session: requests are looked for
            assert time.monotonic() < deadline, "the requests are never read"
            handover._stop.wait(0.01)
        before_reads, before_polls = reads[0], polls[0]
        started = time.monotonic()
        for i in range(40):  # commits do not make it look more often than its pace
            chat.append("user_message", {"content": f"m{i}"}).get(timeout=10)
        handover._stop.wait(0.1)
        took = time.monotonic() - started
        assert reads[0] - before_reads <= took / store.handoff_poll + 2
        assert polls[0] - before_polls <= 1  # nobody waits on the file: not polled
        chat.stop()
        deadline = time.monotonic() + 10
        while not handover.resting:
            assert time.monotonic() < deadline, "the hand-over side never rests"
            handover._stop.wait(0.01)
        before = reads[0]
        handover._stop.wait(0.3)  # a look would come every handoff_poll
        assert reads[0] - before <= 1  # (one already under way)
        sessions.open("chat").append("user_message", {"content": "again"}).get(timeout=10)
        deadline = time.monotonic() + 10
        while reads[0] - before < 3:  # holding again: looked for again
            assert time.monotonic() < deadline, "an open did not wake the hand-over side"
            handover._stop.wait(0.01)


_FORWARDER = """
import sys
from nous_actor import Sessions, SQLiteStore
sessions = Sessions(SQLiteStore(sys.argv[1]))
chat = sessions.open("chat")
assert sessions.live() == [], "expected the session to stay with its holder"
for i in range(int(sys.argv[2])):
    chat.append("user_message", {"content": f"m{i}"})  # never awaited
print("sent", flush=True)
"""


def test_forwarded_appends_not_awaited_are_stored_when_the_caller_exits(
    fleet_on: Any, tmp_path: Path
) -> None:
    """A process forwards 500 appends to the holder without awaiting any and ends: every
    append whose call returned is stored, in order, before it goes."""
    import subprocess
    import sys

    worker = _a_worker_holding(fleet_on, tmp_path, "chat")
    proc = subprocess.run(
        [sys.executable, "-c", _FORWARDER, str(tmp_path / "app.db"), "500"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "sent"
    store = SQLiteStore(tmp_path / "app.db")
    try:
        events = shared.load_since(store, "chat")
        assert shared.held_by(store, "chat") == f"process {worker.pid}"
    finally:
        store.close()
    sent = [e.data["content"] for e in events if e.type == "user_message"][1:]
    assert sent == [f"m{i}" for i in range(500)]


_HOLDER = """
import sys
from nous_actor import Sessions, SQLiteStore
sessions = Sessions(SQLiteStore(sys.argv[1]))
sessions.open("chat").append("user_message", {"content": "first"}).get()
print("holding", flush=True)
sys.stdin.readline()
sessions.close()  # a worker shutting down while another forwards to it
print("closed", flush=True)
sys.stdin.readline()
"""


def test_a_holder_that_closes_mid_stream_refuses_none_of_the_forwarded_calls(
    tmp_path: Path,
) -> None:
    """The holder process closes its registry while this one pipelines forwarded appends
    to it: every append is applied once, in the order sent; none is refused (those the
    closing holder did not apply come back as not held and go where the session goes:
    here)."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "app.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "holding"
        with Sessions(SQLiteStore(tmp_path / "app.db")) as sessions:
            chat = sessions.open("chat")
            assert sessions.live() == []
            futs = [chat.append("user_message", {"content": f"m{i}"}) for i in range(300)]
            holder.stdin.write("\n")
            holder.stdin.flush()
            futs += [chat.append("user_message", {"content": f"m{i}"}) for i in range(300, 600)]
            assert [f.get(timeout=60).seq for f in futs] == list(range(1, 601))
            assert holder.stdout.readline().strip() == "closed"
            contents = [m.content for m in chat.derive_messages().get()]
            assert contents == ["first", *(f"m{i}" for i in range(600))]
    finally:
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()


def test_a_holder_reads_requests_that_stand_and_only_those(tmp_path: Path) -> None:
    """A look before anyone asked fails no statement and finds nothing; a request is seen
    while it stands and not once its time has passed (compared with the clock only when
    there is a request)."""
    import os
    import sqlite3
    from datetime import UTC, datetime, timedelta

    path = tmp_path / "asks.db"
    store = SQLiteStore(path)
    failed: list[str] = []
    with Sessions(store) as sessions:
        sessions.open("chat").append("user_message", {"content": "hi"}).get(timeout=10)
        follower = shared.follower_of(store._connection)
        real = follower.query

        def watched(sql: str, params: Any = ()) -> list[Any]:
            try:
                return real(sql, params)
            except Exception as exc:
                failed.append(f"{sql}: {exc}")
                raise

        follower.query = watched  # type: ignore[method-assign]
        offered: list[str] = []  # the registry's own looks see the request too: keep it
        sessions._handover._offer = lambda sid, *_: offered.append(sid) or False  # type: ignore[method-assign]
        assert store.handoff_requests() == []
        assert failed == []
        asker = os.getppid()  # a live process other than this one
        now = datetime.now(UTC)
        with sqlite3.connect(path) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS handoffs (session_id TEXT NOT NULL, "
                "pid INTEGER NOT NULL, until TEXT NOT NULL, PRIMARY KEY (session_id, pid))"
            )
            conn.execute(
                "INSERT INTO handoffs VALUES (?, ?, ?)",
                ("chat", asker, (now - timedelta(seconds=5)).isoformat()),
            )
        assert store.handoff_requests() == []  # its time has passed
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE handoffs SET until = ? WHERE session_id = 'chat'",
                ((now + timedelta(seconds=60)).isoformat(),),
            )
        assert store.handoff_requests() == ["chat"]
        assert failed == []
