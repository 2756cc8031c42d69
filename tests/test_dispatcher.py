"""The dispatcher's guarantees: one thread per actor at a time, order, fairness, no deadlock
with one thread, threads that do not grow with the actors, parking only when idle, and
every ask answered (see nous_actor/runtime/dispatcher.py and DESIGN.md §4)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from bounds import BOUND
from pykka._envelope import Envelope

from nous_actor import (
    DispatchedActor,
    Dispatcher,
    Event,
    MemoryStore,
    Session,
    SessionCrashed,
    Sessions,
    SessionStopped,
    SQLiteStore,
    Store,
)
from nous_actor.runtime.dispatcher import Inbox
from nous_actor.sessions.actor import SessionActor
from nous_actor.testing import DelegatingStore


@pytest.fixture
def dispatchers() -> Iterator[Callable[..., Dispatcher]]:
    """Make dispatchers for a test; their actors are stopped and their threads ended after it."""
    made: list[Dispatcher] = []

    def make(threads: int, **kwargs: Any) -> Dispatcher:
        d = Dispatcher(threads, **kwargs)
        made.append(d)
        return d

    yield make
    pykka.ActorRegistry.stop_all(block=True, timeout=BOUND)  # before their threads end
    for d in made:
        d.close(timeout=BOUND)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every few microseconds, so that any overlap has a chance to show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def _store(kind: str, tmp_path: Path) -> Store:
    return MemoryStore() if kind == "memory" else SQLiteStore(str(tmp_path / "sessions.db"))


def _interrupt(actor: SessionActor) -> None:
    raise KeyboardInterrupt("crashed by the test")


def _current_thread(actor: SessionActor) -> threading.Thread:
    return threading.current_thread()


class Probe(DispatchedActor):
    """Counts how many threads are inside its handler at once and checks each sender's order."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self._use_dispatcher = dispatcher
        self.lock = threading.Lock()
        self.inside = 0
        self.overlaps = 0
        self.last: dict[int, int] = {}
        self.out_of_order: list[tuple[int, int, int]] = []
        self.handled = 0  # a plain += : updates are lost if two threads run it at once

    def on_receive(self, message: Any) -> Any:
        if message == "stats":
            return self.overlaps, self.out_of_order, self.handled
        sender, n = message
        with self.lock:
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1
        try:
            last = self.last.get(sender, -1)
            if n != last + 1:
                self.out_of_order.append((sender, last, n))
            self.last[sender] = n
            handled = self.handled
            for _ in range(100):  # a little work between the read and the write
                pass
            self.handled = handled + 1
        finally:
            with self.lock:
                self.inside -= 1
        return None


@pytest.mark.usefixtures("fast_switching")
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_an_actor_is_never_run_by_two_threads_and_each_senders_order_is_kept(
    threads: int, dispatchers: Callable[..., Dispatcher]
) -> None:
    """Many senders on many threads to a few actors: no handler overlaps itself, no
    message is lost, and each sender's messages are handled in the order sent."""
    d = dispatchers(threads, throughput=4)
    probes = [Probe.start(d) for _ in range(3)]
    senders, per_sender = 8, 400
    go = threading.Barrier(senders, timeout=BOUND)

    def send(sender: int) -> None:
        go.wait()
        for n in range(per_sender):
            for ref in probes:
                ref.tell((sender, n))

    workers = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(BOUND)
        assert not t.is_alive()
    for ref in probes:
        overlaps, out_of_order, handled = ref.ask("stats", timeout=BOUND)
        assert overlaps == 0
        assert out_of_order == []
        assert handled == senders * per_sender


class Gate(DispatchedActor):
    """Holds its dispatcher thread until released (a test's way to queue work behind it)."""

    def __init__(
        self, dispatcher: Dispatcher, entered: threading.Event, release: threading.Event
    ) -> None:
        super().__init__()
        self._use_dispatcher = dispatcher
        self.entered = entered
        self.release = release

    def on_receive(self, message: Any) -> Any:
        self.entered.set()
        assert self.release.wait(BOUND)


class Recorder(DispatchedActor):
    """Appends ``(name, message)`` to a shared list for every message it handles."""

    def __init__(self, dispatcher: Dispatcher, name: str, order: list[tuple[str, Any]]) -> None:
        super().__init__()
        self._use_dispatcher = dispatcher
        self.name = name
        self.order = order

    def on_receive(self, message: Any) -> Any:
        self.order.append((self.name, message))


def test_a_flooded_actor_yields_after_its_throughput_and_does_not_starve_another(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """With throughput=N, a message to B sent after a flood of 1000 to A is handled after
    at most N of A's, not after the whole flood."""
    throughput = 8
    d = dispatchers(1, throughput=throughput)
    order: list[tuple[str, Any]] = []
    entered, release = threading.Event(), threading.Event()
    gate = Gate.start(d, entered, release)
    a = Recorder.start(d, "a", order)
    b = Recorder.start(d, "b", order)
    for ref in (a, b):
        ref.ask("ready", timeout=BOUND)
    order.clear()
    gate.tell("hold")
    assert entered.wait(BOUND)  # the one thread is busy: what follows queues up
    for n in range(1000):
        a.tell(n)
    b.tell("b's one message")
    release.set()
    a.ask("done", timeout=BOUND)
    b.ask("done", timeout=BOUND)
    position = order.index(("b", "b's one message"))
    assert position == throughput
    assert [m for who, m in order if who == "a"] == [*range(1000), "done"]


class SelfFeeder(DispatchedActor):
    """Sends itself its next message for as long as it runs (a flood that never ends)."""

    def __init__(self, dispatcher: Dispatcher, stop_feeding: threading.Event) -> None:
        super().__init__()
        self._use_dispatcher = dispatcher
        self.stop_feeding = stop_feeding
        self.fed = 0

    def on_receive(self, message: Any) -> Any:
        if message == "feed" and not self.stop_feeding.is_set():
            self.fed += 1
            self.actor_ref.tell("feed")


def test_an_actor_that_keeps_sending_itself_messages_does_not_starve_another(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """A message to B is handled while A, on the same one thread, never runs out of work."""
    d = dispatchers(1, throughput=16)
    stop_feeding = threading.Event()
    feeder = SelfFeeder.start(d, stop_feeding)
    order: list[tuple[str, Any]] = []
    b = Recorder.start(d, "b", order)
    feeder.tell("feed")
    try:
        assert b.ask("ping", timeout=BOUND) is None
    finally:
        stop_feeding.set()
    assert ("b", "ping") in order


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_one_thread_dispatcher_runs_a_registry_through_open_crash_stop_and_close(
    kind: str, tmp_path: Path, dispatchers: Callable[..., Dispatcher]
) -> None:
    """Sessions(dispatcher=Dispatcher(1)) opens, appends to, crashes (and restarts), stops,
    reopens and closes many sessions with every wait bounded: one thread never deadlocks."""
    d = dispatchers(1)
    store = _store(kind, tmp_path)
    registry = Sessions(store, dispatcher=d, timeout=BOUND, backoff=None, max_restarts=100)
    try:
        ids = [f"s{i}" for i in range(24)]
        handles = [registry.open(sid) for sid in ids]
        futures = [
            h.append("user_message", {"content": f"{h.session_id}/{k}"})
            for k in range(3)
            for h in handles
        ]
        for f in futures:
            f.get(timeout=BOUND)
        (thread,) = d.threads()
        assert {h._call(_current_thread).get(timeout=BOUND) for h in handles} == {thread}
        for h in handles[::2]:
            with pytest.raises(SessionCrashed):
                h._call(_interrupt).get(timeout=BOUND)
        for h in handles:  # the crashed ones were restarted from the store
            assert h.count().get(timeout=BOUND) == 3
        for h in handles[1::2]:
            h.stop(timeout=BOUND)
        for h in handles:  # a stopped session reopens on its next call
            assert h.append("assistant_message", {"content": "again"}).get(timeout=BOUND).seq == 3
        assert registry.live() == sorted(ids)
        assert {h._call(_current_thread).get(timeout=BOUND) for h in handles} == {thread}
    finally:
        registry.close(timeout=BOUND)
    assert registry.live() == []
    store.close()


class SlowLoad(DelegatingStore):
    """A store whose ``load`` of one session id waits (bounded) until the test releases it."""

    def __init__(self, inner: Store, slow_id: str) -> None:
        super().__init__(inner)
        self.slow_id = slow_id
        self.entered = threading.Event()
        self.unblock = threading.Event()

    def load(self, session_id: str) -> list[Event]:
        if session_id == self.slow_id:
            self.entered.set()
            if not self.unblock.wait(BOUND):
                raise TimeoutError("the test never released the load")
        return super().load(session_id)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread of its own; the list gets its result or what it raised."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _appends_and_reads(handle: Session, n: int) -> None:
    before = handle.count().get(timeout=BOUND)
    futures = [handle.append("user_message", {"content": f"m{k}"}) for k in range(n)]
    got = [f.get(timeout=BOUND) for f in futures]
    assert [ev.seq for ev in got] == list(range(before, before + n))
    assert handle.events().get(timeout=BOUND)[before:] == got


def test_a_standalone_session_whose_recovery_blocks_does_not_stall_others_on_one_thread(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """While session a's load is blocked, b (already running) and c (started meanwhile)
    append and read on the same Dispatcher(1); released, a opens with its stored events."""
    d = dispatchers(1)
    inner = MemoryStore()
    seed = Session.start("a", store=inner, dispatcher=d, timeout=BOUND)
    seed.append("user_message", {"content": "stored"}).get(timeout=BOUND)
    seed.stop(timeout=BOUND)
    store = SlowLoad(inner, "a")
    b = Session.start("b", store=store, dispatcher=d, timeout=BOUND)
    opener, box = _in_thread(lambda: Session.start("a", store=store, dispatcher=d, timeout=BOUND))
    try:
        assert store.entered.wait(BOUND)
        _appends_and_reads(b, 50)
        c = Session.start("c", store=store, dispatcher=d, timeout=BOUND)
        _appends_and_reads(c, 50)
        assert not box  # a is still recovering
    finally:
        store.unblock.set()
    opener.join(BOUND)
    (a,) = box
    assert isinstance(a, Session)
    assert a.count().get(timeout=BOUND) == 1
    _appends_and_reads(a, 5)


def test_a_registry_session_whose_recovery_blocks_does_not_stall_open_sessions(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """Through one registry on a Dispatcher(1): while a's load is blocked, the running
    session b appends and reads; released, a opens."""
    d = dispatchers(1)
    store = SlowLoad(MemoryStore(), "a")
    registry = Sessions(store, dispatcher=d, timeout=BOUND)
    try:
        b = registry.open("b")
        b.count().get(timeout=BOUND)  # the handle has found its actor
        opener, box = _in_thread(lambda: registry.open("a"))
        try:
            assert store.entered.wait(BOUND)
            _appends_and_reads(b, 50)
            assert not box
        finally:
            store.unblock.set()
        opener.join(BOUND)
        (a,) = box
        assert isinstance(a, Session)
        _appends_and_reads(a, 5)
    finally:
        registry.close(timeout=BOUND)


def test_a_registry_opens_another_session_while_one_sessions_recovery_blocks(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """While a's load is blocked, the same registry opens c promptly (it does not wait for a)."""
    d = dispatchers(1)
    store = SlowLoad(MemoryStore(), "a")
    registry = Sessions(store, dispatcher=d, timeout=BOUND)
    try:
        opener, _ = _in_thread(lambda: registry.open("a"))
        try:
            assert store.entered.wait(BOUND)
            other, got = _in_thread(lambda: registry.open("c"))
            other.join(2.0)  # far more than an open takes; far less than a's blocked load
            assert got, "open('c') waited for a's recovery"
            assert isinstance(got[0], Session)
        finally:
            store.unblock.set()
        opener.join(BOUND)
        other.join(BOUND)
    finally:
        registry.close(timeout=BOUND)


def test_threads_do_not_grow_with_the_number_of_sessions(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """500 sessions in memory on one Dispatcher(2) add its 2 threads, not 500."""
    d = dispatchers(2)
    before = threading.active_count()
    sessions = [Session.start(f"s{i}", dispatcher=d, timeout=BOUND) for i in range(500)]
    futures = [s.append("user_message", {"content": "hi"}) for s in sessions]
    assert [f.get(timeout=BOUND).seq for f in futures] == [0] * 500
    assert len(d.threads()) == 2
    assert threading.active_count() <= before + 2
    for s in sessions:
        s.stop(timeout=BOUND)


def test_threads_do_not_grow_with_the_number_of_sessions_of_a_registry(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """500 sessions of a registry on a store add the dispatcher's 2 threads and a bounded
    few (the registry, the store's committer, at most 8 readers), not 500."""
    d = dispatchers(2)
    store = MemoryStore()
    before = threading.active_count()
    with Sessions(store, dispatcher=d, timeout=BOUND) as registry:
        handles = [registry.open(f"s{i}") for i in range(500)]
        futures = [h.append("user_message", {"content": "hi"}) for h in handles]
        assert [f.get(timeout=BOUND).seq for f in futures] == [0] * 500
        assert len(registry.live()) == 500
        assert threading.active_count() <= before + 2 + 2 + 8


@pytest.mark.parametrize("kind", ["no store", "memory"])
def test_a_dispatcher_thread_parks_only_when_nothing_is_runnable(
    kind: str, dispatchers: Callable[..., Dispatcher]
) -> None:
    """One session on a Dispatcher(1): 1000 pipelined appends cost far fewer parks and turns
    than appends, and appends made one by one at most about one park each."""
    d = dispatchers(1)
    store = None if kind == "no store" else MemoryStore()
    s = Session.start("s", store=store, dispatcher=d, timeout=BOUND)
    n = 1000
    parks, turns = d.parks, d.turns
    futures = [s.append("user_message", {"content": f"m{k}"}) for k in range(n)]
    assert [f.get(timeout=BOUND).seq for f in futures] == list(range(n))
    pipelined_parks, pipelined_turns = d.parks - parks, d.turns - turns
    assert pipelined_parks < 100
    assert pipelined_turns < n / 4  # batched: many appends per turn
    parks = d.parks
    for k in range(n):
        s.append("user_message", {"content": f"one by one {k}"}).get(timeout=BOUND)
    assert d.parks - parks <= 1.5 * n
    s.stop(timeout=BOUND)


class Echo(DispatchedActor):
    def __init__(self, dispatcher: Dispatcher | None = None, pinned: bool = False) -> None:
        super().__init__()
        self._use_dispatcher = dispatcher
        self._pin = pinned

    def on_receive(self, message: Any) -> Any:
        return message


class WhereRun(DispatchedActor):
    """Answers each message with the name of the thread that ran its turn."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self._use_dispatcher = dispatcher

    def on_receive(self, message: Any) -> Any:
        return threading.current_thread().name


def test_a_caller_waiting_on_each_call_is_served_by_one_warm_thread(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """On a Dispatcher(4), 300 asks one after another wake the thread that parked last,
    not each thread in turn: one thread runs (almost) every turn, so a round trip stays
    on a warm CPU; and no more wake-ups than calls."""
    d = dispatchers(4)
    ref = WhereRun.start(d)
    ref.ask("warm-up", timeout=BOUND)
    parks = d.parks
    names = [ref.ask(k, timeout=BOUND) for k in range(300)]
    top = max(names.count(n) for n in set(names))
    assert top >= 0.9 * len(names), {n: names.count(n) for n in set(names)}
    assert d.parks - parks <= len(names) + 1
    ref.stop()


def _late_ask(ref: pykka.ActorRef[Any], message: Any) -> pykka.Future[Any]:
    """What ``ref.ask`` does once its liveness check has passed: the envelope lands in the
    inbox however the actor has ended meanwhile (Pykka's stop race, made deterministic)."""
    future: pykka.Future[Any] = pykka.ThreadingFuture()
    ref.actor_inbox.put(Envelope(message, reply_to=future))
    return future


def test_an_ask_landing_after_a_dispatched_actor_stopped_is_answered(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """An ask whose envelope lands after the actor stopped fails with ActorDeadError."""
    ref = Echo.start(dispatchers(1))
    assert ref.ask("hi", timeout=BOUND) == "hi"
    ref.stop(block=True, timeout=BOUND)
    with pytest.raises(pykka.ActorDeadError):
        _late_ask(ref, "late").get(timeout=BOUND)


def test_an_ask_landing_after_a_pinned_actor_stopped_is_answered() -> None:
    """An ask whose envelope lands after a pinned actor stopped fails with ActorDeadError."""
    ref = Echo.start(pinned=True)
    assert ref.ask("hi", timeout=BOUND) == "hi"
    ref.stop(block=True, timeout=BOUND)
    with pytest.raises(pykka.ActorDeadError):
        _late_ask(ref, "late").get(timeout=2.0)


def _race_with_stop(call: Callable[[int, int], Any], stop: Callable[[], None]) -> list[Any]:
    """``call(caller, k)`` from 4 threads, 50 times each, while ``stop()`` runs in this one;
    what the calls returned (a call refused at once with ActorDeadError returns nothing)."""
    callers, calls = 4, 50
    go = threading.Barrier(callers + 1, timeout=BOUND)
    out: list[Any] = []
    lock = threading.Lock()

    def run(caller: int) -> None:
        go.wait()
        for k in range(calls):
            try:
                result = call(caller, k)
            except pykka.ActorDeadError:
                continue
            with lock:
                out.append(result)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(callers)]
    for t in threads:
        t.start()
    go.wait()
    stop()
    for t in threads:
        t.join(BOUND)
        assert not t.is_alive()
    return out


@pytest.mark.parametrize("pinned", [False, True], ids=["shared", "pinned"])
def test_every_ask_racing_a_stop_is_answered(
    pinned: bool, dispatchers: Callable[..., Dispatcher]
) -> None:
    """Asks from several threads while the actor stops, many times over: each one is
    answered, with the message or ActorDeadError, never left waiting."""
    d = dispatchers(2)
    for _ in range(40):
        ref = Echo.start(None if pinned else d, pinned)
        futures = _race_with_stop(
            lambda caller, k, ref=ref: ref.ask((caller, k), block=False),
            lambda ref=ref: ref.stop(block=False),
        )
        for f in futures:
            try:
                f.get(timeout=BOUND)
            except pykka.ActorDeadError:
                pass


@pytest.mark.parametrize("kind", ["no store", "memory"])
def test_every_session_call_racing_a_stop_is_answered(
    kind: str, dispatchers: Callable[..., Dispatcher]
) -> None:
    """Appends from several threads while the session stops, many times over: each is
    acknowledged or fails with SessionStopped; with a store, exactly the acknowledged
    ones are kept, in order."""
    d = dispatchers(2)
    store = None if kind == "no store" else MemoryStore()
    for r in range(30):
        s = Session.start(f"s{r}", store=store, dispatcher=d, timeout=BOUND)
        futures = _race_with_stop(
            lambda caller, k, s=s: s.append("user_message", {"content": f"{caller}/{k}"}),
            lambda s=s: s.stop(timeout=BOUND),
        )
        acked: list[Event] = []
        for f in futures:
            try:
                acked.append(f.get(timeout=BOUND))
            except SessionStopped:
                pass
        if store is not None:
            again = Session.start(f"s{r}", store=store, dispatcher=d, timeout=BOUND)
            assert again.events().get(timeout=BOUND) == sorted(acked, key=lambda ev: ev.seq)
            again.stop(timeout=BOUND)


def test_a_pinned_session_has_a_thread_of_its_own_that_ends_when_it_stops() -> None:
    """pinned=True runs the session on a new thread, used by nothing else, that ends (and
    the thread count comes back down) when the session stops."""
    shared = Session.start("shared", timeout=BOUND)
    shared_thread = shared._call(_current_thread).get(timeout=BOUND)
    before = set(threading.enumerate())
    one = Session.start("one", pinned=True, timeout=BOUND)
    two = Session.start("two", pinned=True, timeout=BOUND)
    t1 = one._call(_current_thread).get(timeout=BOUND)
    t2 = two._call(_current_thread).get(timeout=BOUND)
    assert len({t1, t2, shared_thread}) == 3
    # the two new threads are theirs (a set, not a count: an earlier test's thread may end)
    assert {t1, t2} <= set(threading.enumerate()) - before
    assert one.append("user_message", {"content": "hi"}).get(timeout=BOUND).seq == 0
    one.stop(timeout=BOUND)
    t1.join(BOUND)
    assert not t1.is_alive()
    assert t2.is_alive()
    two.stop(timeout=BOUND)
    t2.join(BOUND)
    assert not t2.is_alive()
    shared.stop(timeout=BOUND)


def test_a_call_made_after_a_crash_was_reported_reaches_the_restarted_session(
    dispatchers: Callable[..., Dispatcher],
) -> None:
    """Once a caller has seen SessionCrashed, its next call on the handle reaches the session
    the registry restarted (it is not refused by the actor that crashed)."""
    d = dispatchers(2)
    with Sessions(MemoryStore(), dispatcher=d, timeout=BOUND, backoff=None) as registry:
        h = registry.open("s")
        h.append("user_message", {"content": "kept"}).get(timeout=BOUND)
        called = threading.Event()  # the next call was put in an inbox, or went to the registry
        resolve = h._resolve

        def resolving() -> Any:
            called.set()
            return resolve()

        h._resolve = resolving
        armed = threading.Event()

        def crash(actor: SessionActor) -> None:
            assert armed.wait(BOUND)
            _interrupt(actor)

        crashed = h._call(crash)
        # Runs on the dispatcher thread once the crash is answered: it holds that thread
        # (bounded) until the caller, woken by the same answer, has made its next call.
        crashed.add_done_callback(lambda: called.wait(BOUND))
        armed.set()
        with pytest.raises(SessionCrashed):
            crashed.get(timeout=BOUND)
        later = h.count()
        called.set()
        assert later.get(timeout=BOUND) == 1


# -- the inbox's token ---------------------------------------------------------------------


def test_an_inbox_token_is_taken_by_one_thread_at_a_time() -> None:
    """The token says an actor is scheduled: of threads that take it at once, one gets
    it until it is given back. Four threads take and give it 20,000 times each; none
    ever finds another inside, and every take that failed found it held."""
    inbox = Inbox()
    inbox.give()  # free, as once the actor is bound and started
    inside: list[int] = []
    clashes: list[int] = []
    taken = [0] * 4
    start = threading.Barrier(4, timeout=BOUND)

    def work(k: int) -> None:
        start.wait()
        for _ in range(20_000):
            if inbox.take():
                if inside:
                    clashes.append(k)
                inside.append(k)
                inside.pop()
                taken[k] += 1
                inbox.give()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as the interpreter lets them
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads)
    assert clashes == []
    assert sum(taken) > 0
    assert inbox.take()  # given back by the last taker
    assert not inbox.take()  # and now held


def test_an_inbox_token_given_back_twice_is_an_error() -> None:
    """Two givers would let two threads run one actor at once: refused, not counted."""
    inbox = Inbox()
    assert not inbox.take()  # held from the start, until the actor is bound
    inbox.give()
    with pytest.raises(RuntimeError, match="given back twice"):
        inbox.give()
    assert inbox.take()
    assert not inbox.take()
