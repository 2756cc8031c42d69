"""Calls go to the holder: a session held by another registry (another process, or another
registry of this process on the same store) is called through it, never refused, and calls
that land while it moves or restarts are held and delivered in order, exactly once.

Two registries on one `MemoryStore` stand for two processes (as in a simulation); two
`SQLiteStore` objects on one file in this process likewise (their claims name this process,
the holder's address its endpoint). The tests with real processes are in
tests/test_processes.py.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND
from crashes import crash_behind
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nous_actor import InvalidEvent, Sessions, SessionStopped, SQLiteStore, TurnBusy
from nous_actor.sessions import handoff
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.forwarding import LocalLink, Route
from nous_actor.sessions.forwarding import endpoint as endpoint_module
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.registry import _sessions as registry_module
from nous_actor.store import MemoryStore, shared
from nous_actor.store.base import Store

ROOT = Path(__file__).resolve().parent.parent


class Boom(BaseException):
    pass


def _pair_on(kind: str, tmp_path: Path) -> tuple[Store, Store]:
    """Two stores standing for two processes' views of one store."""
    if kind == "memory":
        store = MemoryStore()
        return store, store
    path = tmp_path / "app.db"
    return SQLiteStore(path), SQLiteStore(path)


@pytest.fixture(params=["memory", "sqlite"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Sessions, Sessions]]:
    """Two registries on one store: ``a`` (the holder) and ``b`` (the caller)."""
    store_a, store_b = _pair_on(request.param, tmp_path)
    a, b = Sessions(store_a), Sessions(store_b)
    yield a, b
    b.close()
    a.close()
    for store in {id(store_a): store_a, id(store_b): store_b}.values():
        store.close()


def contents(handle: Any) -> list[str]:
    return [m.content for m in handle.derive_messages().get(timeout=BOUND)]


def route_of(handle: Any) -> Route:
    route = handle._route
    assert isinstance(route, Route)
    return route


def test_a_session_another_registry_holds_is_called_through_it(
    pair: tuple[Sessions, Sessions],
) -> None:
    """``b.open`` of a session ``a`` holds neither raises nor moves it: ``b``'s calls run
    in ``a``'s actor, pipelined calls in the order sent, each read seeing every earlier
    write of either side."""
    a, b = pair
    in_a = a.open("chat")
    in_a.append("user_message", {"content": "a0"}).get(timeout=BOUND)
    in_b = b.open("chat")
    assert isinstance(route_of(in_b).target(), LocalLink)
    assert (a.live(), b.live()) == (["chat"], [])
    sent = [in_b.append("user_message", {"content": f"b{i}"}) for i in range(100)]
    assert [f.get(timeout=BOUND).seq for f in sent] == list(range(1, 101))
    in_a.append("assistant_message", {"content": "a1"}).get(timeout=BOUND)
    assert contents(in_b) == ["a0", *(f"b{i}" for i in range(100)), "a1"]
    assert contents(in_a) == contents(in_b)
    assert route_of(in_b).moves == 0  # a forwarded call costs no lookup of where it goes
    assert in_b.is_alive()
    assert (a.live(), b.live()) == (["chat"], [])


def test_bad_input_through_a_forwarding_handle_changes_nothing(
    pair: tuple[Sessions, Sessions],
) -> None:
    """A refused event is refused at the call, as on any handle; the session runs on."""
    a, b = pair
    a.open("chat").append("user_message", {"content": "kept"}).get(timeout=BOUND)
    in_b = b.open("chat")
    with pytest.raises(InvalidEvent):
        in_b.append("no_such_type", {"content": "x"}).get(timeout=BOUND)
    with pytest.raises(TypeError):
        in_b.since("0")  # type: ignore[arg-type]
    assert contents(in_b) == ["kept"]
    assert in_b.count().get(timeout=BOUND) == 1


def test_calls_queued_behind_a_crash_of_the_holders_session_are_delivered_in_order(
    pair: tuple[Sessions, Sessions],
) -> None:
    """``b`` pipelines appends while the session crashes in ``a`` (a `BaseException` in
    a handler): every call behind the crash reaches the restarted session, in the order
    sent, exactly once; none is refused."""
    a, b = pair
    in_a = a.open("chat")
    in_b = b.open("chat")
    crashing, sent = crash_behind(
        in_a,
        lambda: [in_b.append("user_message", {"content": f"m{i}"}) for i in range(50)],
        Boom("crash with forwarded calls queued"),
    )
    with pytest.raises(SessionStopped):
        crashing.get(timeout=BOUND)
    assert [f.get(timeout=BOUND).seq for f in sent] == list(range(50))
    assert contents(in_b) == [f"m{i}" for i in range(50)]
    stored = shared.load_since(a.store, "chat")
    assert [e.data["content"] for e in stored] == [f"m{i}" for i in range(50)]
    assert_idle(route_of(in_b))


def assert_idle(route: Route) -> None:
    """``route`` keeps nothing of its moves: what a move needs (the queues of held and
    handed-back calls, the count of hand-backs) is made when one starts and let go once
    it delivered everything, so an idle session's route stays small."""
    with route.lock:
        assert (route.held, route.rerouted, route.bounced, route._tries) == (None,) * 4


def test_a_route_keeps_nothing_of_a_move_once_it_is_over(
    pair: tuple[Sessions, Sessions],
) -> None:
    """Calls queued in the holder's own actor behind a crash are handed back to its
    route, delivered to the restarted session, and the route is left as small as before
    the crash."""
    a, _ = pair
    in_a = a.open("chat")
    in_a.count().get(timeout=BOUND)
    assert_idle(route_of(in_a))
    assert route_of(in_a)._cond is None
    crashing, sent = crash_behind(
        in_a,
        lambda: [in_a.append("user_message", {"content": f"m{i}"}) for i in range(20)],
        Boom("crash with calls queued"),
    )
    with pytest.raises(SessionStopped):
        crashing.get(timeout=BOUND)
    assert [f.get(timeout=BOUND).seq for f in sent] == list(range(20))
    assert route_of(in_a).moves == 1
    assert_idle(route_of(in_a))


def test_a_handed_back_call_its_caller_gave_up_on_is_not_counted() -> None:
    """A call handed back after its future was settled (its caller gave up on it) is
    counted and forgotten at once: nothing is kept for it, and the hand-back does not
    fail (it once did, with the route's count let go under it)."""
    route = Route("chat", lambda _: pytest.fail("no move here"), BOUND)
    fut: SessionFuture[Any] = SessionFuture("chat", BOUND)
    fut._fail(SessionStopped("chat", "given up"))
    with route.lock:
        assert route._may_try_again((SessionActor.h_snapshot, (), fut))
    assert_idle(route)


def test_when_the_holder_closes_the_next_call_moves_the_session_to_the_caller(
    pair: tuple[Sessions, Sessions],
) -> None:
    """The holder's registry closes (its sessions let go): the caller's next call opens
    the session in the caller's registry, with everything acknowledged."""
    a, b = pair
    a.open("chat").append("user_message", {"content": "a0"}).get(timeout=BOUND)
    in_b = b.open("chat")
    in_b.append("user_message", {"content": "b0"}).get(timeout=BOUND)
    a.close()
    assert in_b.append("user_message", {"content": "b1"}).get(timeout=BOUND).seq == 2
    assert b.live() == ["chat"]
    assert contents(in_b) == ["a0", "b0", "b1"]
    assert route_of(in_b).moves == 1


def test_calls_in_flight_when_the_holder_passivates_are_delivered_where_it_goes(
    pair: tuple[Sessions, Sessions],
) -> None:
    """The holder stops the session (a passivation) while ``b`` pipelines calls: the
    calls it did not apply go back to the route that sent them, which delivers them in
    order; every call is applied exactly once, none refused."""
    first, b = pair
    a = Sessions(first.store, idle_timeout=3600)  # passivated below, by hand
    first.close()
    in_a = a.open("chat")
    in_b = b.open("chat")
    results: list[Any] = []
    gate = threading.Event()

    def writer() -> None:
        gate.wait(BOUND)
        futs = [in_b.append("user_message", {"content": f"m{i}"}) for i in range(300)]
        results.extend(f.get(timeout=BOUND).seq for f in futs)

    t = threading.Thread(target=writer)
    t.start()
    gate.set()
    # Forwarded calls do not touch the holder's idleness: it passivates mid-stream.
    assert a.passivate_idle(a.clock() + 7200) == ["chat"]
    t.join(BOUND)
    assert not t.is_alive()
    assert results == list(range(300))
    assert contents(in_b) == [f"m{i}" for i in range(300)]
    assert contents(in_a) == contents(in_b)
    a.close()


def test_a_turn_opened_through_a_forwarding_handle_holds_the_holders_writers(
    pair: tuple[Sessions, Sessions],
) -> None:
    """A turn is held by the caller that opened it, wherever the session runs: while
    ``b``'s turn is open, ``a``'s plain write waits for it, and a ``reject`` turn of
    ``a`` is refused naming ``b``'s turn."""
    a, b = pair
    in_a = a.open("chat")
    in_b = b.open("chat")
    with in_b.turn(owner="caller-b") as turn:
        turn.append("user_message", {"content": "q"}).get(timeout=BOUND)
        # (From another thread: this one is inside the turn's block, where a plain write
        # fails at once rather than wait for its own turn.)
        sent: list[Any] = []
        other = threading.Thread(
            target=lambda: sent.append(in_a.append("user_message", {"content": "after the turn"}))
        )
        other.start()
        other.join(BOUND)
        (waiting,) = sent
        with pytest.raises(TurnBusy, match="caller-b"), in_a.turn("reject"):
            pass
        turn.append("assistant_message", {"content": "a"}).get(timeout=BOUND)
        assert not waiting.done()
    assert waiting.get(timeout=BOUND).seq == 4  # after turn_start, q, a, turn_end
    assert contents(in_a) == ["q", "a", "after the turn"]


def test_a_subscription_through_a_forwarding_handle_sees_every_commit(
    pair: tuple[Sessions, Sessions],
) -> None:
    """Subscribing where the session is held elsewhere follows the store: every committed
    event exactly once, in seq order."""
    a, b = pair
    in_a = a.open("chat")
    in_a.append("user_message", {"content": "before"}).get(timeout=BOUND)
    in_b = b.open("chat")
    with in_b.subscribe(0) as sub:
        for i in range(5):
            in_a.append("user_message", {"content": f"m{i}"}).get(timeout=BOUND)
        seen = [sub.get(timeout=BOUND) for _ in range(6)]
    assert [e.seq for e in seen] == list(range(6))
    assert [e.data["content"] for e in seen] == ["before", *(f"m{i}" for i in range(5))]


def test_closing_the_callers_registry_fails_its_calls_and_leaves_the_holder_alone(
    pair: tuple[Sessions, Sessions],
) -> None:
    """The caller's registry closes: its handles' calls fail with `SessionStopped` (the
    registry is closed); the session goes on in its holder."""
    a, b = pair
    in_a = a.open("chat")
    in_b = b.open("chat")
    in_b.append("user_message", {"content": "b0"}).get(timeout=BOUND)
    b.close()
    with pytest.raises(SessionStopped, match="registry is closed"):
        in_b.append("user_message", {"content": "late"}).get(timeout=BOUND)
    assert in_a.append("user_message", {"content": "a0"}).get(timeout=BOUND).seq == 1
    assert contents(in_a) == ["b0", "a0"]


def test_a_handle_per_request_looks_the_holder_up_once(
    pair: tuple[Sessions, Sessions], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A web worker opens a handle per request and drops it: the route to the session's
    holder is kept, so the store is asked where the session is once, not per request;
    a kept route whose holder let go meanwhile still delivers (its session moves)."""
    a, b = pair
    a.open("chat").append("user_message", {"content": "a0"}).get(timeout=BOUND)
    looks: list[str] = []
    real = shared.holder_address

    def counted(store: Store, session_id: str) -> Any:
        looks.append(session_id)
        return real(store, session_id)

    monkeypatch.setattr(shared, "holder_address", counted)
    for n in range(5):
        handle = b.open("chat")
        handle.append("user_message", {"content": f"b{n}"}).get(timeout=BOUND)
        del handle
        gc.collect()
        if n == 0:
            assert looks  # located at the first open
            first = len(looks)
    assert len(looks) == first  # and never again
    assert b.live() == []
    a.close()
    handle = b.open("chat")  # the kept route: its first call finds the session gone
    assert handle.append("user_message", {"content": "b5"}).get(timeout=BOUND).seq == 6
    assert b.live() == ["chat"]
    assert contents(handle) == ["a0"] + [f"b{n}" for n in range(6)]


def test_the_routes_kept_to_other_holders_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the last few routes located in another process outlive their handles: a
    process that calls many sessions elsewhere over its life keeps no route of each."""
    monkeypatch.setattr(registry_module, "LINKED_KEPT", 2)
    store = MemoryStore()
    a, b = Sessions(store), Sessions(store)
    try:
        for sid in ("s0", "s1", "s2"):
            a.open(sid).append("user_message", {"content": sid}).get(timeout=BOUND)
            b.open(sid).count().get(timeout=BOUND)
        gc.collect()
        assert sorted(b._routes) == ["s1", "s2"]
        assert contents(b.open("s0")) == ["s0"]  # located again, through its holder
        gc.collect()
        assert sorted(b._routes) == ["s0", "s2"]
    finally:
        b.close()
        a.close()


def test_open_with_wait_still_moves_the_session_here() -> None:
    """``open(id, wait=...)`` is the explicit request to move a session: the holder
    hands it over once idle, and the caller's registry holds it. (On SQLite a request
    stands per process: tests/test_processes.py asks across processes.)"""
    store = MemoryStore()
    a, b = Sessions(store), Sessions(store)
    a.open("chat").append("user_message", {"content": "a0"}).get(timeout=BOUND)
    in_b = b.open("chat", wait=BOUND)
    assert (a.live(), b.live()) == ([], ["chat"])
    assert in_b.append("user_message", {"content": "b0"}).get(timeout=BOUND).seq == 1
    b.close()
    a.close()


def test_stop_through_a_forwarding_handle_stops_the_session_in_its_holder(
    pair: tuple[Sessions, Sessions],
) -> None:
    """``stop()`` on a handle whose session is held elsewhere stops it there; the next
    call from either side opens it again, with everything acknowledged."""
    a, b = pair
    in_a = a.open("chat")
    in_b = b.open("chat")
    in_b.append("user_message", {"content": "b0"}).get(timeout=BOUND)
    in_b.stop()
    assert in_a.append("user_message", {"content": "a0"}).get(timeout=BOUND).seq == 1
    assert contents(in_b) == ["b0", "a0"]


# -- a model of two processes and a session that moves between them --------------------------


class TwoRegistries(RuleBasedStateMachine):
    """Two registries on one store; writes through either, while the session is stopped,
    crashed, handed over or let go by its holder at any moment: the log is the model."""

    store_kind = "memory"

    @initialize()
    def start(self) -> None:
        if self.store_kind == "memory":
            shared_store = MemoryStore()
            self.stores = [shared_store, shared_store]
        else:
            import tempfile

            self.folder = tempfile.TemporaryDirectory()
            path = Path(self.folder.name) / "app.db"
            self.stores = [SQLiteStore(path), SQLiteStore(path)]
        self.regs = [Sessions(s, max_restarts=10_000) for s in self.stores]
        self.handles = [reg.open("chat") for reg in self.regs]
        self.model: list[str] = []

    @rule(side=st.integers(0, 1), n=st.integers(1, 20))
    def append(self, side: int, n: int) -> None:
        base = len(self.model)
        futs = [
            self.handles[side].append("user_message", {"content": f"{base + i}"}) for i in range(n)
        ]
        for i, fut in enumerate(futs):
            assert fut.get(timeout=BOUND).seq == base + i
        self.model.extend(f"{base + i}" for i in range(n))

    @rule(side=st.integers(0, 1))
    def holder_lets_go(self, side: int) -> None:
        """The registry that holds it passivates it (if ``side`` holds it)."""
        reg = self.regs[side]
        if "chat" in reg.live():
            ref = self.handles[side]._ref
            if ref is not None:
                route_of(self.handles[side]).release_actor()
                ref.stop(block=True, timeout=BOUND)

    @rule(side=st.integers(0, 1))
    def crash(self, side: int) -> None:
        """The session crashes in its holder (if ``side`` holds it)."""
        if "chat" not in self.regs[side].live():
            return

        def boom(actor: SessionActor) -> None:
            raise Boom("crash")

        with pytest.raises(SessionStopped):
            self.handles[side]._call(boom).get(timeout=BOUND)

    @rule(side=st.integers(0, 1))
    def move_here(self, side: int) -> None:
        if self.store_kind != "memory":
            return  # (SQLite's requests stand per process: two objects here are one)
        self.handles[side] = self.regs[side].open("chat", wait=BOUND)
        assert "chat" in self.regs[side].live()

    @invariant()
    def both_sides_read_the_model(self) -> None:
        if not hasattr(self, "handles"):
            return
        for handle in self.handles:
            assert contents(handle) == self.model
        assert sum("chat" in reg.live() for reg in self.regs) <= 1

    def teardown(self) -> None:
        if not hasattr(self, "regs"):
            return
        for reg in reversed(self.regs):
            reg.close()
        for store in {id(s): s for s in self.stores}.values():
            store.close()
        if hasattr(self, "folder"):
            self.folder.cleanup()


class TwoRegistriesOnSQLite(TwoRegistries):
    store_kind = "sqlite"


_MACHINE = {
    "max_examples": 25,
    "stateful_step_count": 12,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow],
}
TestTwoRegistries = TwoRegistries.TestCase
TestTwoRegistries.settings = settings(**_MACHINE)  # type: ignore[arg-type]
TestTwoRegistriesOnSQLite = TwoRegistriesOnSQLite.TestCase
TestTwoRegistriesOnSQLite.settings = settings(**_MACHINE)  # type: ignore[arg-type]


class _SlowTaker(MemoryStore):
    """A store whose first claim that would succeed once armed (the asker's, once the
    holder let go) waits for a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def claim(self, session_id: str) -> str:
        if self.armed and session_id not in self._claims:  # a claim that would succeed
            self.armed = False
            self.waiting.set()
            self.gate.wait(BOUND)
        return super().claim(session_id)


class _SlowWithdrawal(MemoryStore):
    """A store that, once armed, takes a request back only after the hand-over threads
    looked at the standing requests twice more (the asker's request still stands just
    after it took the session)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.looks = 0
        self.looked = threading.Condition()

    def handoff_requests(self) -> list[str]:
        asked = super().handoff_requests()
        with self.looked:
            self.looks += 1
            self.looked.notify_all()
        return asked

    def withdraw_handoff(self, session_id: str) -> None:
        if self.armed:
            self.armed = False
            with self.looked:
                start = self.looks
                assert self.looked.wait_for(lambda: self.looks >= start + 2, BOUND)
        super().withdraw_handoff(session_id)


def test_a_session_taken_on_request_is_not_handed_on_by_the_asker_to_its_own_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asker's request still stands for a moment after it took the session (it is
    taken back after the claim): the asker's hand-over must not take it for another
    process's and hand the session straight over, to nobody."""
    monkeypatch.setattr(handoff, "GRACE_FOR", 0.0)  # a session is offered at the first look
    store = _SlowWithdrawal()
    a, b = Sessions(store), Sessions(store)
    try:
        a.open("chat").append("user_message", {"content": "a0"}).get(timeout=BOUND)
        b.open("other")  # b's hand-over thread runs (and looks) before b takes "chat"
        store.armed = True
        in_b = b.open("chat", wait=BOUND)
        assert not store.armed  # the slow withdrawal happened
        assert b._handover.handed == 0  # "chat" was never handed on
        assert contents(in_b) == ["a0"]
        assert (a.live(), sorted(b.live())) == ([], ["chat", "other"])
        assert not isinstance(route_of(in_b).target(), LocalLink)
    finally:
        b.close()
        a.close()


def test_a_session_handed_to_an_asker_is_not_claimed_back_by_the_holders_next_call() -> None:
    """The holder hands the session to a process that asked for it (``wait=``); its own
    next call, made before the asker took the session, waits for the asker to take it
    and then goes there: the session does not bounce back."""
    store = _SlowTaker()
    a, b = Sessions(store), Sessions(store)
    try:
        in_a = a.open("chat")
        in_a.append("user_message", {"content": "a0"}).get(timeout=BOUND)
        opened: list[Any] = []
        asker = threading.Thread(target=lambda: opened.append(b.open("chat", wait=BOUND)))
        store.armed = True
        asker.start()
        # The holder hands over at the asker's request; the asker's claim waits at the gate.
        assert store.waiting.wait(BOUND)
        # The holder's next call (from a thread of its own: it waits for the asker).
        sent: list[Any] = []
        caller = threading.Thread(
            target=lambda: sent.append(in_a.append("user_message", {"content": "a1"}))
        )
        caller.start()
        store.gate.set()
        asker.join(BOUND)
        caller.join(BOUND)
        (in_b,) = opened
        (late,) = sent
        assert late.get(timeout=BOUND).seq == 1
        assert (a.live(), b.live()) == ([], ["chat"])
        assert contents(in_b) == ["a0", "a1"]
        assert isinstance(route_of(in_a).target(), LocalLink)
    finally:
        b.close()
        a.close()


def test_the_socket_folder_a_killed_process_left_is_removed_by_the_next_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed process cannot remove its socket folder: the next endpoint of this
    user removes every such folder whose process is gone, and leaves the others."""
    gone = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"])
    assert gone.wait(BOUND) == -9
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(endpoint_module, "_swept", False)
    left = tmp_path / f"nous-actor-{gone.pid}-k1ll3d"
    left.mkdir(mode=0o700)
    (left / "calls").touch()
    alive = tmp_path / f"nous-actor-{os.getpid()}-l1ve"
    alive.mkdir(mode=0o700)
    unnamed = tmp_path / "nous-actor-12345678"  # not named for a process: not ours to judge
    unnamed.mkdir(mode=0o700)
    with Sessions(SQLiteStore(tmp_path / "s.db")) as reg:
        reg.open("chat").count().get(timeout=BOUND)
        assert (left.exists(), alive.exists(), unnamed.exists()) == (False, True, True)
        (mine,) = tmp_path.glob(f"nous-actor-{os.getpid()}-*/calls")
        assert mine.is_socket()


def _long_folder(tmp_path: Path) -> Path:
    """A folder whose path leaves no room for a socket's in it (a Unix socket's path
    has at most 107 bytes)."""
    folder = tmp_path / ("t" * (120 - len(str(tmp_path))))
    folder.mkdir()
    return folder


def test_a_temp_folder_too_long_for_a_socket_gives_way_to_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temp folder whose path is too long for a socket's (a nested one, as CI runners
    and sandboxes make): the endpoint listens in ``/tmp`` instead, and answers there."""
    from nous_actor.sessions.forwarding import links

    monkeypatch.setattr(tempfile, "tempdir", str(_long_folder(tmp_path)))
    with Sessions(SQLiteStore(tmp_path / "s.db"), timeout=BOUND) as reg:
        reg.open("chat").append("user_message", {"content": "x"}).get(timeout=BOUND)
        assert reg._endpoint is not None
        path = links.socket_path(reg._endpoint.address)
        assert path is not None
        assert path.startswith(f"/tmp/nous-actor-{os.getpid()}-")
        assert Path(path).is_socket()
        key = shared.forwarding_key(reg.store)
        assert key is not None
        hello = pickle.dumps((links.PROTOCOL, "t"))
        conn = links._connect(path, key, BOUND, hello)  # as another process connects
        try:
            conn.send_bytes(pickle.dumps([(7, pickle.dumps(("chat", 0, "__alive__", ())))]))
            assert conn.poll(BOUND)
            [(cid, status, answer)] = pickle.loads(conn.recv_bytes())
            assert (cid, status, pickle.loads(answer)) == (7, links.OK, True)
        finally:
            conn.close()
    assert not Path(path).exists()  # its folder went with the registry


def test_a_process_that_cannot_listen_runs_its_sessions_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No folder where a socket can be made: the sessions of this process still work
    (its own registries reach each other), ``forwarding.unavailable`` says why and what to
    do, and another process that opens one of them is refused with the holder named
    (``ConflictError``, as by a holder of an older release), never sent elsewhere."""
    from structlog.testing import capture_logs

    long = str(_long_folder(tmp_path))
    monkeypatch.setattr(endpoint_module, "_roots", lambda: [long])
    store = SQLiteStore(tmp_path / "s.db")
    try:
        with capture_logs() as logs, Sessions(store, timeout=BOUND) as reg:
            chat = reg.open("chat")
            chat.append("user_message", {"content": "x"}).get(timeout=BOUND)
            assert reg._endpoint is not None
            assert reg._endpoint.address.startswith(endpoint_module.LOCAL)
            with Sessions(store, timeout=BOUND) as beside:  # this process: it is called
                assert beside.open("chat").count().get(timeout=BOUND) == 1
            other = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys\n"
                    "from nous_actor import Sessions, SQLiteStore, ConflictError\n"
                    "with Sessions(SQLiteStore(sys.argv[1]), timeout=5) as reg:\n"
                    "    try:\n"
                    "        reg.open('chat')\n"
                    "    except ConflictError as exc:\n"
                    "        print('refused:', exc)\n",
                    str(tmp_path / "s.db"),
                ],
                capture_output=True,
                text=True,
                timeout=BOUND,
            )
            assert chat.count().get(timeout=BOUND) == 1
        assert other.returncode == 0, other.stderr
        assert other.stdout.startswith("refused:"), other.stdout
        assert f"process {os.getpid()}" in other.stdout
        assert "not a process of this host" not in other.stdout
        (said,) = [e for e in logs if e["event"] == "forwarding.unavailable"]
        assert said["log_level"] == "warning"
        assert "too long" in said["error"]
        assert "TMPDIR" in said["fix"]
    finally:
        store.close()


def test_a_holder_letting_its_claims_go_is_waited_for_not_refused(tmp_path: Path) -> None:
    """A registry that closes says so on the claims it still holds (``ENDING``) until
    they are let go: another process's ``open`` waits for them and then takes the
    session, rather than take the holder for one it cannot call (``ConflictError``)."""
    from nous_actor.sessions.forwarding import ENDING

    path = tmp_path / "app.db"
    store_a, store_b = SQLiteStore(path), SQLiteStore(path)
    a, b = Sessions(store_a), Sessions(store_b)
    try:
        a.open("chat").append("user_message", {"content": "a0"}).get(timeout=BOUND)
        b.open("other")  # b's endpoint is up, as in a live worker
        shared.advertise(store_a, ENDING)  # where a's close stands before its claims go
        waiting = threading.Event()
        reach = b._reach

        def noting(session_id: str, found: Any) -> Any:
            got = reach(session_id, found)
            if found is not None and found[1] == ENDING:
                waiting.set()
            return got

        b._reach = noting  # type: ignore[method-assign]
        outcome: list[Any] = []
        opener = threading.Thread(target=lambda: outcome.append(_open_or_error(b, "chat")))
        opener.start()
        assert waiting.wait(BOUND), "b never looked at a's claim"
        assert outcome == []  # still waiting: not refused
        a.close()
        opener.join(BOUND)
        assert not opener.is_alive()
        (handle,) = outcome
        assert not isinstance(handle, BaseException), handle
        assert handle.append("user_message", {"content": "b0"}).get(timeout=BOUND).seq == 1
        assert b.live() == ["chat", "other"]
        found = shared.holder_address(store_a, "chat")  # b's claim, with b's address
        assert found is not None
        assert found[1] not in (None, ENDING)
    finally:
        b.close()
        a.close()
        store_b.close()
        store_a.close()


def _open_or_error(registry: Sessions, session_id: str) -> Any:
    try:
        return registry.open(session_id)
    except BaseException as exc:
        return exc


# -- telling the holder ----------------------------------------------------------------------


class _Looks:
    """Counts a SQLite store's looks at its hand-off requests."""

    def __init__(self, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.several = threading.Event()
        real = store.handoff_requests

        def counting() -> list[str]:
            self.count += 1
            if self.count >= 3:
                self.several.set()
            return real()

        monkeypatch.setattr(store, "handoff_requests", counting)


def test_an_idle_sqlite_holder_does_not_poll_for_hand_off_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that holds sessions on a SQLite file and is asked for none does no
    work: askers tell it (at the address of its claims), so it does not read the
    requests every ``handoff_poll`` (10 ms: about 90 looks in the time waited here)."""
    store = SQLiteStore(tmp_path / "app.db")
    looks = _Looks(store, monkeypatch)
    with Sessions(store) as holder:
        holder.open("chat").append("user_message", {"content": "x"}).get(timeout=BOUND)
        assert not looks.several.wait(handoff.TOLD_REST * 0.9)
        assert holder.live() == ["chat"]
    store.close()


_HOLDER = """
import sys
from nous_actor import Sessions, SQLiteStore
from nous_actor.sessions import handoff
handoff.TOLD_REST = 3600.0  # untold, it never looks: only the asker's word moves it
sessions = Sessions(SQLiteStore(sys.argv[1]))
sessions.open("chat").append("user_message", {"content": "one"}).get()
print("ready", flush=True)
sys.stdin.read()  # holds the session until the test lets it end
sessions.close()
"""


def test_an_asker_tells_the_holder_process_which_hands_over_at_once(tmp_path: Path) -> None:
    """``open(id, wait=...)`` on a session another process holds on a SQLite file: the
    asker leaves its request in the file and tells the holder over the holder's socket;
    the holder looks at the requests when told (here it never looks otherwise) and
    hands the idle session over."""
    path = tmp_path / "app.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ready = threading.Event()

        def read_ready() -> None:
            assert holder.stdout is not None
            if holder.stdout.readline() == "ready\n":
                ready.set()

        threading.Thread(target=read_ready, daemon=True).start()
        assert ready.wait(BOUND)
        store = SQLiteStore(path)
        try:
            with Sessions(store) as asker:
                moved = asker.open("chat", wait=BOUND)
                moved.append("user_message", {"content": "two"}).get(timeout=BOUND)
                assert asker.live() == ["chat"]
                assert shared.held_by(store, "chat") == "this process"
                contents = [m.content for m in moved.derive_messages().get(timeout=BOUND)]
                assert contents == ["one", "two"]
        finally:
            store.close()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        try:
            holder.wait(BOUND)
        finally:
            holder.kill()
            holder.wait(BOUND)
            assert holder.stdout is not None
            holder.stdout.close()
