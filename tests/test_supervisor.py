"""Supervision (DESIGN.md §5): SupervisedActor, Backoff, RestartIntensity, ChildSpec, Supervisor.

The children here are real actors that crash. Every wait is bounded and
synchronised on something the code under test does (a start call, an exit
report, a scheduler call, a reply), never on a sleep:

* a child's *spawn* is recorded by its ``ChildSpec.start`` (which the
  supervisor calls in its own thread, in order), so spawn order is exact;
* a child's *exit* is recorded after its exit has been reported to its
  supervisor; an ask to the supervisor after that is answered only once the
  supervisor has handled the exit (its inbox is FIFO).

"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pykka
import pytest
from bounds import BOUND
from fake_clock import FakeClock
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from nous_actor import (
    Backoff,
    ChildSpec,
    RestartIntensityExceeded,
    SupervisedActor,
    Supervisor,
)
from nous_actor.supervision import Exit, RestartIntensity, cell_of, start_monitored

# -- test doubles ----------------------------------------------------------------------------


class Boom(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


@dataclass
class Journal:
    """What the workers did, in order, with bounded waits on it."""

    entries: list[tuple[str, str, str]] = field(default_factory=list)  # (what, name, urn)
    fail_start: dict[str, int] = field(default_factory=dict)  # name -> on_start failures left
    cond: threading.Condition = field(default_factory=threading.Condition)

    def add(self, what: str, name: str, urn: str) -> None:
        with self.cond:
            self.entries.append((what, name, urn))
            self.cond.notify_all()

    def names(self, what: str) -> list[str]:
        with self.cond:
            return [n for w, n, _ in self.entries if w == what]

    def urns(self, what: str, name: str) -> list[str]:
        with self.cond:
            return [u for w, n, u in self.entries if w == what and n == name]

    def wait(self, what: str, name: str, count: int = 1) -> None:
        """Wait (bounded) until ``name`` has done ``what`` at least ``count`` times."""
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.urns(what, name)) >= count, BOUND)
        assert ok, f"{name} did not {what} {count} time(s) within {BOUND} s: {self.entries}"

    def wait_exit(self, urn: str) -> None:
        """Wait (bounded) until the actor ``urn`` has exited and reported it."""
        with self.cond:
            ok = self.cond.wait_for(
                lambda: any(e[2] == urn for e in self.entries if e[0] == "exit"), BOUND
            )
        assert ok, f"{urn} did not exit within {BOUND} s"


class Worker(SupervisedActor):
    """A child that crashes on request (tell ``"crash"``), fails ``on_start`` on demand,
    raises any BaseException it is told, and blocks in a handler on request."""

    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__()
        self.name = name
        self.journal = journal

    def on_start(self) -> None:
        self.journal.add("start", self.name, self.actor_urn)
        with self.journal.cond:
            left = self.journal.fail_start.get(self.name, 0)
            if left:
                self.journal.fail_start[self.name] = left - 1
        if left:
            raise RuntimeError(f"{self.name} failed to start")

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError(f"{self.name} crashed")
        if isinstance(message, BaseException):
            raise message
        if isinstance(message, tuple) and message[0] == "block":
            _, entered, release = message
            entered.set()
            release.wait(BOUND)
            return None
        return super().on_receive(message)

    def ping(self) -> str:
        return self.name

    def raise_base(self) -> None:
        raise Boom("in an ask")

    def on_stop(self) -> None:
        self.journal.add("stop", self.name, self.actor_urn)

    def _actor_loop(self) -> None:
        try:
            super()._actor_loop()  # reports the exit to the supervisor in its finally
        finally:
            self.journal.add("exit", self.name, self.actor_urn)


class BaseOnStart(SupervisedActor):
    threads: ClassVar[list[threading.Thread]] = []

    def on_start(self) -> None:
        BaseOnStart.threads.append(threading.current_thread())
        raise Boom("in on_start")


class Plain(pykka.ThreadingActor):
    """An unrelated, unsupervised actor."""

    def ping(self) -> str:
        return "plain"


@dataclass
class ManualScheduler:
    """Records ``scheduler(delay, fn)`` calls; the test fires them by hand."""

    calls: queue.Queue[tuple[float, Callable[[], None]]] = field(default_factory=queue.Queue)

    def __call__(self, delay: float, fn: Callable[[], None]) -> None:
        self.calls.put((delay, fn))

    def next(self) -> tuple[float, Callable[[], None]]:
        return self.calls.get(timeout=BOUND)


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def journal() -> Journal:
    return Journal()


_started: list[pykka.ActorRef[Any]] = []


@pytest.fixture(autouse=True)
def _stop_supervisors() -> Iterator[None]:
    """Stop this test's supervisors top-down, so that none restarts a child mid-teardown."""
    yield
    while _started:
        _started.pop().stop(block=True, timeout=BOUND)


def spec(journal: Journal, name: str, restart: str = "permanent", **kw: Any) -> ChildSpec:
    def start() -> pykka.ActorRef[Any]:
        ref = Worker.start(name, journal)
        journal.add("spawn", name, ref.actor_urn)  # in the supervisor's thread, in order
        return ref

    return ChildSpec(name, start, restart=restart, **kw)  # type: ignore[arg-type]


@dataclass
class Sup:
    ref: pykka.ActorRef[Any]
    exits: queue.Queue[Exit]

    @property
    def proxy(self) -> Any:
        return self.ref.proxy()

    def urn(self, child: str) -> str:
        ref = self.proxy.child_ref(child).get(timeout=BOUND)
        assert ref is not None, f"{child} has no ref"
        return str(ref.actor_urn)

    def urns(self) -> dict[str, str]:
        return {c: self.urn(c) for c, _ in self.children()}

    def children(self) -> list[tuple[str, bool]]:
        return list(self.proxy.which_children().get(timeout=BOUND))

    def restarts(self) -> int:
        return int(self.proxy.restart_count().get(timeout=BOUND))

    def exit(self) -> Exit:
        return self.exits.get(timeout=BOUND)


def start_sup(children: list[ChildSpec], *, sync: bool = True, **kw: Any) -> Sup:
    """Start a top-level supervisor whose own exit lands in ``Sup.exits``.

    With ``sync`` it returns once the supervisor has started (spawned) its children.
    """
    exits: queue.Queue[Exit] = queue.Queue()
    ref = start_monitored(lambda: Supervisor.start(children, **kw), exits.put)
    _started.append(ref)
    sup = Sup(ref, exits)
    if sync:
        sup.children()  # answered after on_start
    return sup


def crash(sup: Sup, journal: Journal, child: str, how: Any = "crash") -> str:
    """Crash ``child`` with a tell; return after the supervisor has handled its exit."""
    urn = sup.urn(child)
    sup.proxy.child_ref(child).get(timeout=BOUND).tell(how)
    journal.wait_exit(urn)
    sup.children()  # answered after the exit report, which was sent before it
    return urn


def spawns_after(journal: Journal, mark: int) -> list[str]:
    return journal.names("spawn")[mark:]


def stops_after(journal: Journal, mark: int) -> list[str]:
    with journal.cond:
        return [n for w, n, _ in journal.entries[mark:] if w == "stop"]


def restart_logs(logs: Sequence[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "supervisor.restart"]


# -- strategies ------------------------------------------------------------------------------


def test_one_for_one_restarts_only_the_crashed_child(journal: Journal) -> None:
    """one_for_one: only the crashed child gets a new actor; its siblings are untouched."""
    sup = start_sup([spec(journal, n) for n in "abc"], strategy="one_for_one")
    before = sup.urns()
    mark = len(journal.names("spawn"))
    crash(sup, journal, "b")
    after = sup.urns()
    assert {c for c in "abc" if after[c] != before[c]} == {"b"}
    assert spawns_after(journal, mark) == ["b"]
    assert sup.children() == [("a", True), ("b", True), ("c", True)]
    assert sup.restarts() == 1


def test_one_for_all_restarts_every_child_in_start_order(journal: Journal) -> None:
    """one_for_all: the siblings stop in reverse start order, then all restart in start order."""
    sup = start_sup([spec(journal, n) for n in "abc"], strategy="one_for_all")
    before = sup.urns()
    with journal.cond:
        mark = len(journal.entries)
    spawn_mark = len(journal.names("spawn"))
    crash(sup, journal, "b")
    after = sup.urns()
    assert all(after[c] != before[c] for c in "abc")
    assert stops_after(journal, mark) == ["c", "a"]
    assert spawns_after(journal, spawn_mark) == ["a", "b", "c"]
    assert sup.children() == [("a", True), ("b", True), ("c", True)]
    assert sup.restarts() == 1


def test_rest_for_one_restarts_the_child_and_those_started_after_it(journal: Journal) -> None:
    """rest_for_one: the crashed child and later ones restart in start order; earlier ones stay."""
    sup = start_sup([spec(journal, n) for n in "abcd"], strategy="rest_for_one")
    before = sup.urns()
    with journal.cond:
        mark = len(journal.entries)
    spawn_mark = len(journal.names("spawn"))
    crash(sup, journal, "b")
    after = sup.urns()
    assert {c for c in "abcd" if after[c] != before[c]} == {"b", "c", "d"}
    assert stops_after(journal, mark) == ["d", "c"]
    assert spawns_after(journal, spawn_mark) == ["b", "c", "d"]
    assert sup.restarts() == 1


def test_rest_for_one_on_the_last_child_restarts_only_it(journal: Journal) -> None:
    """rest_for_one on the last child restarts just that child."""
    sup = start_sup([spec(journal, n) for n in "abc"], strategy="rest_for_one")
    before = sup.urns()
    mark = len(journal.names("spawn"))
    crash(sup, journal, "c")
    assert {c for c, u in sup.urns().items() if u != before[c]} == {"c"}
    assert spawns_after(journal, mark) == ["c"]


def test_one_for_all_does_not_restart_a_temporary_sibling(journal: Journal) -> None:
    """one_for_all: a temporary sibling is stopped with the others but never restarted."""
    sup = start_sup(
        [spec(journal, "a"), spec(journal, "t", restart="temporary")], strategy="one_for_all"
    )
    mark = len(journal.names("spawn"))
    crash(sup, journal, "a")
    assert spawns_after(journal, mark) == ["a"]
    assert sup.children() == [("a", True)]


def test_each_child_finishes_on_start_before_the_next_one_starts() -> None:
    """A child's on_start has finished before its next sibling's on_start begins."""
    order: list[str] = []
    b_started = threading.Event()

    class First(SupervisedActor):
        def on_start(self) -> None:
            order.append("a begins")
            b_started.wait(0.5)  # with in-order starts this times out; b has not begun
            order.append("a ends")

    class Second(SupervisedActor):
        def on_start(self) -> None:
            order.append("b begins")
            b_started.set()

    sup = start_sup([ChildSpec("a", First.start), ChildSpec("b", Second.start)])
    assert b_started.wait(BOUND)
    sup.children()
    assert order[:3] == ["a begins", "a ends", "b begins"]


# -- restart types ---------------------------------------------------------------------------


def test_permanent_child_is_restarted_after_a_normal_stop(journal: Journal) -> None:
    """A permanent child that stops normally is restarted (reason 'normal')."""
    sup = start_sup([spec(journal, "p")])
    urn = sup.urn("p")
    with capture_logs() as logs:
        sup.proxy.child_ref("p").get(timeout=BOUND).stop()
        journal.wait_exit(urn)
        assert sup.children() == [("p", True)]
    assert sup.urn("p") != urn
    assert [(e["child"], e["reason"]) for e in restart_logs(logs)] == [("p", "normal")]


def test_transient_child_is_not_restarted_after_a_normal_stop(journal: Journal) -> None:
    """A transient child that stops normally stays down but keeps its place."""
    sup = start_sup([spec(journal, "t", restart="transient")])
    urn = sup.urn("t")
    with capture_logs() as logs:
        sup.proxy.child_ref("t").get(timeout=BOUND).stop()
        journal.wait_exit(urn)
        assert sup.children() == [("t", False)]
    assert journal.names("spawn") == ["t"]
    assert sup.restarts() == 0
    assert restart_logs(logs) == []
    exited = [e for e in logs if e["event"] == "supervisor.child_exited"]
    assert [(e["child"], e["reason"]) for e in exited] == [("t", "normal")]


def test_transient_child_is_restarted_after_a_crash(journal: Journal) -> None:
    """A transient child that crashes is restarted."""
    sup = start_sup([spec(journal, "t", restart="transient")])
    urn = crash(sup, journal, "t")
    assert sup.children() == [("t", True)]
    assert sup.urn("t") != urn
    assert sup.restarts() == 1


def test_temporary_child_is_never_restarted_and_is_removed(journal: Journal) -> None:
    """A temporary child that crashes is not restarted and disappears from which_children."""
    sup = start_sup([spec(journal, "a"), spec(journal, "tmp", restart="temporary")])
    crash(sup, journal, "tmp")
    assert sup.children() == [("a", True)]
    assert sup.proxy.child_ref("tmp").get(timeout=BOUND) is None
    assert journal.names("spawn") == ["a", "tmp"]
    assert sup.restarts() == 0


# -- what counts as a crash ------------------------------------------------------------------


def test_exception_in_on_start_counts_as_a_crash(journal: Journal) -> None:
    """A child whose on_start raises is restarted, each failure counted as a restart."""
    journal.fail_start["w"] = 2
    with capture_logs() as logs:
        sup = start_sup([spec(journal, "w")], max_restarts=5, sync=False)
        journal.wait("start", "w", 3)
        w = sup.proxy.child_ref("w").get(timeout=BOUND)
        assert w.proxy().ping().get(timeout=BOUND) == "w"
    assert sup.restarts() == 2
    reasons = [e["reason"] for e in restart_logs(logs)]
    assert reasons == ["RuntimeError: w failed to start"] * 2


def test_on_start_failing_for_ever_escalates(journal: Journal) -> None:
    """A child whose on_start always fails exhausts the intensity and the supervisor exits."""
    journal.fail_start["w"] = 1_000
    sup = start_sup([spec(journal, "w")], max_restarts=3, sync=False)
    exit = sup.exit()
    assert isinstance(exit.reason, RestartIntensityExceeded)
    assert len(journal.urns("start", "w")) == 4  # the first start and 3 restarts


def test_exception_in_a_tell_is_reported_as_a_crash_to_the_monitor(journal: Journal) -> None:
    """start_monitored's monitor gets an Exit whose reason is the exception of the tell."""
    exits: queue.Queue[Exit] = queue.Queue()
    ref = start_monitored(lambda: Worker.start("w", journal), exits.put)
    ref.tell("crash")
    exit = exits.get(timeout=BOUND)
    assert exit.urn == ref.actor_urn
    assert not exit.normal
    assert isinstance(exit.reason, RuntimeError)
    assert str(exit.reason) == "w crashed"


def test_normal_stop_is_reported_as_a_normal_exit(journal: Journal) -> None:
    """start_monitored's monitor gets a normal Exit when the actor is stopped."""
    exits: queue.Queue[Exit] = queue.Queue()
    ref = start_monitored(lambda: Worker.start("w", journal), exits.put)
    ref.stop(timeout=BOUND)
    exit = exits.get(timeout=BOUND)
    assert exit.normal
    assert exit.reason is None


def test_the_monitor_watches_the_actor_whose_ref_start_returned(journal: Journal) -> None:
    """An actor that ``start()`` makes on the way (a helper, made first) is not the child:
    the monitor watches the actor whose ref ``start()`` returned."""
    exits: queue.Queue[Exit] = queue.Queue()
    helpers: list[pykka.ActorRef[Any]] = []

    def start() -> pykka.ActorRef[Any]:
        helpers.append(Worker.start("helper", journal))
        return Worker.start("w", journal)

    ref = start_monitored(start, exits.put)
    helpers[0].stop(timeout=BOUND)
    ref.stop(timeout=BOUND)
    exit = exits.get(timeout=BOUND)
    assert exit.urn == ref.actor_urn
    assert exits.empty()


def test_an_exit_before_start_returned_is_handed_to_the_monitor(journal: Journal) -> None:
    """An actor that ended before ``start()`` returned still reports its exit: to the
    monitor once it is given, with ``finished`` already set."""
    exits: queue.Queue[Exit] = queue.Queue()

    def start() -> pykka.ActorRef[Any]:
        ref = Worker.start("w", journal)
        ref.tell("crash")
        assert cell_of(ref).finished.wait(BOUND)  # ended, nobody watching yet
        return ref

    ref = start_monitored(start, exits.put)
    exit = exits.get(timeout=BOUND)
    assert exit.urn == ref.actor_urn
    assert isinstance(exit.reason, RuntimeError)


def test_start_monitored_of_an_unsupervised_actor_says_what_to_do() -> None:
    """``start()`` returning the ref of an actor that reports no exit is refused, and that
    actor is stopped (nothing would ever report its end)."""
    refs: list[pykka.ActorRef[Any]] = []

    def start() -> pykka.ActorRef[Any]:
        refs.append(Plain.start())
        return refs[0]

    with pytest.raises(TypeError, match="start a SupervisedActor"):
        start_monitored(start, lambda exit: None)
    assert refs[0].actor_stopped.wait(BOUND)


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt("ki"), SystemExit("bye"), Boom("custom")],
    ids=lambda e: type(e).__name__,
)
def test_base_exception_in_one_child_stops_only_that_child(
    journal: Journal, exc: BaseException
) -> None:
    """A BaseException stops only that child: siblings and unrelated actors keep answering."""
    plain = Plain.start()
    loner = Worker.start("loner", journal)
    sup = start_sup([spec(journal, "a"), spec(journal, "b")])
    a = sup.proxy.child_ref("a").get(timeout=BOUND)
    with capture_logs() as logs:
        crash(sup, journal, "b", exc)
    assert a.proxy().ping().get(timeout=BOUND) == "a"
    assert plain.proxy().ping().get(timeout=BOUND) == "plain"
    assert loner.proxy().ping().get(timeout=BOUND) == "loner"
    assert sup.children() == [("a", True), ("b", True)]
    [log] = restart_logs(logs)
    assert log["reason"] == f"{type(exc).__name__}: {exc}"


def test_base_exception_is_reported_to_the_monitor_with_its_reason(journal: Journal) -> None:
    """A BaseException in a tell ends the actor as a crash whose reason is that exception."""
    exits: queue.Queue[Exit] = queue.Queue()
    ref = start_monitored(lambda: Worker.start("w", journal), exits.put)
    err = Boom("boom")
    ref.tell(err)
    exit = exits.get(timeout=BOUND)
    assert exit.reason is err
    assert not ref.is_alive()


def test_ask_whose_handler_raises_base_exception_fails_the_caller(journal: Journal) -> None:
    """An ask (proxy call) whose handler raises a BaseException fails instead of returning None."""
    ref = start_monitored(lambda: Worker.start("w", journal), lambda exit: None)
    with pytest.raises(BaseException, match=r"in an ask|stopped"):
        ref.proxy().raise_base().get(timeout=BOUND)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_base_exception_in_on_start_is_a_crash() -> None:
    """A BaseException in on_start is reported as a crash and leaves no live-looking actor."""
    exits: queue.Queue[Exit] = queue.Queue()
    ref = start_monitored(BaseOnStart.start, exits.put)
    try:
        exit = exits.get(timeout=BOUND)
        assert isinstance(exit.reason, Boom)
        assert not ref.is_alive()
    finally:
        pykka.ActorRegistry.unregister(ref)  # a zombie would hang the autouse stop_all
        for t in BaseOnStart.threads:  # its thread's exception is reported in this test
            t.join(BOUND)


def test_a_crashing_supervisor_takes_its_children_down(journal: Journal) -> None:
    """A supervisor that crashes stops its children instead of orphaning them."""

    def broken_scheduler(delay: float, fn: Callable[[], None]) -> None:
        raise RuntimeError("cannot start a timer")

    sup = start_sup(
        [spec(journal, "a"), spec(journal, "b")],
        backoff=Backoff(0.1, 0.1, 0.0),
        scheduler=broken_scheduler,
    )
    b = sup.proxy.child_ref("b").get(timeout=BOUND)
    sup.proxy.child_ref("a").get(timeout=BOUND).tell("crash")
    exit = sup.exit()
    assert isinstance(exit.reason, RuntimeError)
    assert not b.is_alive()


# -- intensity and escalation ----------------------------------------------------------------


def test_intensity_exceeded_stops_the_children_and_exits_abnormally(journal: Journal) -> None:
    """One restart beyond max_restarts: every child is stopped and the supervisor crashes."""
    sup = start_sup(
        [spec(journal, "a"), spec(journal, "b")], max_restarts=2, max_seconds=60, name="top"
    )
    with capture_logs() as logs:
        crash(sup, journal, "b")
        crash(sup, journal, "b")
        assert sup.restarts() == 2
        urn = sup.urn("b")
        sup.proxy.child_ref("b").get(timeout=BOUND).tell("crash")
        exit = sup.exit()
    journal.wait_exit(urn)
    assert isinstance(exit.reason, RestartIntensityExceeded)
    assert "more than 2 restarts in 60 s" in str(exit.reason)
    assert "'b'" in str(exit.reason)
    assert not sup.ref.is_alive()
    assert journal.urns("stop", "a") == [journal.urns("spawn", "a")[0]]
    assert pykka.ActorRegistry.get_all() == []
    [esc] = [e for e in logs if e["event"] == "supervisor.escalate"]
    assert esc["supervisor"] == "top"
    assert esc["child"] == "b"
    assert esc["reason"] == "RuntimeError: b crashed"
    assert esc["restart_count"] == 2


def test_restarts_older_than_max_seconds_no_longer_count(journal: Journal) -> None:
    """With an injected clock, restarts that left the window do not count toward the intensity."""
    clock = FakeClock()
    sup = start_sup([spec(journal, "w")], max_restarts=2, max_seconds=10, clock=clock)
    crash(sup, journal, "w")
    clock.now = 5
    crash(sup, journal, "w")
    clock.now = 10.5  # the restart at 0 has left the window, the one at 5 has not
    crash(sup, journal, "w")
    assert sup.ref.is_alive()
    assert sup.restarts() == 3
    assert sup.exits.empty()


def test_restarts_inside_max_seconds_escalate(journal: Journal) -> None:
    """With an injected clock, the same crashes inside the window exceed the intensity."""
    clock = FakeClock()
    sup = start_sup([spec(journal, "w")], max_restarts=2, max_seconds=10, clock=clock)
    crash(sup, journal, "w")
    clock.now = 5
    crash(sup, journal, "w")
    clock.now = 10  # exactly max_seconds after the first: still inside
    urn = sup.urn("w")
    sup.proxy.child_ref("w").get(timeout=BOUND).tell("crash")
    journal.wait_exit(urn)
    assert isinstance(sup.exit().reason, RestartIntensityExceeded)


def test_restart_intensity_sliding_window() -> None:
    """RestartIntensity allows max_restarts in any window of max_seconds and slides."""
    clock = FakeClock()
    window = RestartIntensity(max_restarts=2, max_seconds=10, clock=clock)
    assert window.allow()
    clock.now = 4
    assert window.allow()
    assert not window.allow()  # a refused restart is not recorded
    assert window.recent == 2
    clock.now = 10.001
    assert window.recent == 1
    assert window.allow()
    assert not window.allow()
    clock.now = 100
    assert window.recent == 0


def test_zero_max_restarts_never_restarts(journal: Journal) -> None:
    """max_restarts=0: the first crash escalates at once."""
    sup = start_sup([spec(journal, "w")], max_restarts=0)
    sup.proxy.child_ref("w").get(timeout=BOUND).tell("crash")
    assert isinstance(sup.exit().reason, RestartIntensityExceeded)
    assert journal.names("spawn") == ["w"]


def test_restart_that_fails_to_start_escalates(journal: Journal) -> None:
    """A ChildSpec.start that raises on restart makes the supervisor escalate with that reason."""
    calls = 0

    def start() -> pykka.ActorRef[Any]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError("no more threads")
        return Worker.start("w", journal)

    sup = start_sup([ChildSpec("w", start)], name="sup")
    with capture_logs() as logs:
        sup.proxy.child_ref("w").get(timeout=BOUND).tell("crash")
        exit = sup.exit()
    assert isinstance(exit.reason, RestartIntensityExceeded)
    [esc] = [e for e in logs if e["event"] == "supervisor.escalate"]
    assert esc["reason"] == "restart failed: OSError: no more threads"


def _two_level(journal: Journal, top_restarts: int) -> Sup:
    def start_sub() -> pykka.ActorRef[Any]:
        ref = Supervisor.start(
            [spec(journal, "w1"), spec(journal, "w2")], max_restarts=1, name="sub"
        )
        journal.add("spawn", "sub", ref.actor_urn)
        return ref

    return start_sup([ChildSpec("sub", start_sub)], max_restarts=top_restarts, name="top")


def _crash_sub_twice(top: Sup, journal: Journal) -> Any:
    """Crash w1 under sub twice: the second crash exceeds sub's intensity (1)."""
    sub = top.proxy.child_ref("sub").get(timeout=BOUND).proxy()
    w1 = sub.child_ref("w1").get(timeout=BOUND)
    w1.tell("crash")
    journal.wait_exit(w1.actor_urn)
    sub.which_children().get(timeout=BOUND)
    sub.child_ref("w1").get(timeout=BOUND).tell("crash")
    return sub


def test_child_supervisor_escalation_restarts_it_with_fresh_children(journal: Journal) -> None:
    """A child supervisor beyond its intensity escalates; the parent restarts it, all fresh."""
    top = _two_level(journal, top_restarts=3)
    journal.wait("spawn", "w2")
    old_sub = top.urn("sub")
    old_w = {w: journal.urns("spawn", w)[-1] for w in ("w1", "w2")}
    with capture_logs() as logs:
        _crash_sub_twice(top, journal)
        journal.wait("spawn", "sub", 2)
        journal.wait("spawn", "w2", 2)
        assert top.children() == [("sub", True)]
    new_sub = top.proxy.child_ref("sub").get(timeout=BOUND)
    assert new_sub.actor_urn != old_sub
    sub = new_sub.proxy()
    assert sub.which_children().get(timeout=BOUND) == [("w1", True), ("w2", True)]
    assert sub.restart_count().get(timeout=BOUND) == 0
    for w in ("w1", "w2"):
        assert sub.child_ref(w).get(timeout=BOUND).actor_urn not in (
            old_w[w],
            *journal.urns("exit", w),
        )
    assert journal.urns("stop", "w2") == [old_w["w2"]]  # sub stopped it when it escalated
    assert top.restarts() == 1
    [esc] = [e for e in logs if e["event"] == "supervisor.escalate"]
    assert esc["supervisor"] == "sub"
    [restart] = [e for e in restart_logs(logs) if e["supervisor"] == "top"]
    assert restart["child"] == "sub"
    assert restart["reason"].startswith("RestartIntensityExceeded: supervisor 'sub'")


def test_top_level_supervisor_gives_up_and_logs_the_escalation(journal: Journal) -> None:
    """A top-level supervisor beyond its own intensity logs supervisor.escalate and stays down."""
    top = _two_level(journal, top_restarts=0)
    with capture_logs() as logs:
        _crash_sub_twice(top, journal)
        exit = top.exit()
    assert isinstance(exit.reason, RestartIntensityExceeded)
    assert "supervisor 'top'" in str(exit.reason)
    assert not top.ref.is_alive()
    escalations = [
        (e["supervisor"], e["child"]) for e in logs if e["event"] == "supervisor.escalate"
    ]
    assert escalations == [("sub", "w1"), ("top", "sub")]
    assert journal.names("spawn").count("sub") == 1
    assert pykka.ActorRegistry.get_all() == []


# -- backoff ---------------------------------------------------------------------------------


def test_backoff_delays_are_exponential_and_capped(journal: Journal) -> None:
    """Restart delays double from min and stop growing at max; nothing restarts before it fires."""
    sched = ManualScheduler()
    sup = start_sup(
        [spec(journal, "w")],
        backoff=Backoff(min=0.1, max=0.5, jitter=0.0),
        scheduler=sched,
        max_restarts=10,
        clock=FakeClock(),
    )
    delays = []
    for i in range(5):
        crash(sup, journal, "w")
        delay, fire = sched.next()
        delays.append(delay)
        assert sup.children() == [("w", False)]  # waits for the scheduler
        assert len(journal.urns("spawn", "w")) == i + 1
        fire()
        journal.wait("spawn", "w", i + 2)
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert sup.children() == [("w", True)]


def test_backoff_delay_is_logged_with_the_restart(journal: Journal) -> None:
    """supervisor.restart carries the backoff delay."""
    sched = ManualScheduler()
    sup = start_sup([spec(journal, "w")], backoff=Backoff(0.25, 1.0, 0.0), scheduler=sched)
    with capture_logs() as logs:
        crash(sup, journal, "w")
    [log] = restart_logs(logs)
    assert log["delay"] == 0.25
    assert sched.next()[0] == 0.25


def test_backoff_jitter_stays_within_bounds_at_the_supervisor(journal: Journal) -> None:
    """With jitter, each scheduled delay is within ±jitter of the exponential base."""
    sched = ManualScheduler()
    sup = start_sup(
        [spec(journal, "w")],
        backoff=Backoff(min=0.1, max=1.0, jitter=0.5),
        scheduler=sched,
        max_restarts=10,
        clock=FakeClock(),
    )
    for i, base in enumerate([0.1, 0.2, 0.4, 0.8, 1.0, 1.0]):
        crash(sup, journal, "w")
        delay, fire = sched.next()
        assert base * 0.5 <= delay <= base * 1.5
        fire()
        journal.wait("spawn", "w", i + 2)


@given(
    n=st.integers(min_value=0, max_value=200),
    seed=st.integers(min_value=0, max_value=2**32),
    lo=st.floats(min_value=0, max_value=10),
    span=st.floats(min_value=0, max_value=100),
    jitter=st.floats(min_value=0, max_value=1),
)
def test_backoff_delay_bounds(n: int, seed: int, lo: float, span: float, jitter: float) -> None:
    """Backoff.delay(n) is min*2**(n-1) capped at max, within ±jitter, never negative."""
    b = Backoff(min=lo, max=lo + span, jitter=jitter)
    base = min(b.max, b.min * 2 ** max(0, n - 1))
    d = b.delay(n, random.Random(seed))
    assert d >= 0.0
    assert base * (1 - jitter) - 1e-9 <= d <= base * (1 + jitter) + 1e-9


def test_backoff_without_jitter_is_exact() -> None:
    """Backoff(jitter=0).delay is the plain capped exponential."""
    b = Backoff(min=0.01, max=0.05, jitter=0)
    assert [b.delay(n) for n in range(1, 6)] == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])


# -- shutdown --------------------------------------------------------------------------------


def test_shutdown_stops_children_in_reverse_start_order(journal: Journal) -> None:
    """Stopping the supervisor stops its children last-started first."""
    sup = start_sup([spec(journal, n) for n in "abcd"])
    sup.children()
    assert sup.ref.stop(timeout=BOUND) is True
    assert journal.names("stop") == ["d", "c", "b", "a"]
    assert sup.exit().normal
    assert pykka.ActorRegistry.get_all() == []


def test_shutdown_order_keeps_positions_after_restarts(journal: Journal) -> None:
    """A restarted child keeps its place in the start order for shutdown."""
    sup = start_sup([spec(journal, n) for n in "abc"], strategy="one_for_one")
    crash(sup, journal, "a")
    sup.ref.stop(timeout=BOUND)
    assert journal.names("stop") == ["c", "b", "a"]


def test_child_that_does_not_stop_in_time_is_abandoned_and_logged(journal: Journal) -> None:
    """A child blocked past its shutdown_timeout is abandoned, logged, and the rest still stop."""
    sup = start_sup(
        [
            spec(journal, "a"),
            spec(journal, "slow", shutdown_timeout=0.2),
            spec(journal, "c"),
        ],
        name="sup",
    )
    entered, release = threading.Event(), threading.Event()
    slow = sup.proxy.child_ref("slow").get(timeout=BOUND)
    slow.tell(("block", entered, release))
    assert entered.wait(BOUND)
    try:
        with capture_logs() as logs:
            assert sup.ref.stop(timeout=BOUND) is True
        assert journal.names("stop") == ["c", "a"]
        [log] = [e for e in logs if e["event"] == "supervisor.shutdown_timeout"]
        assert log["supervisor"] == "sup"
        assert log["child"] == "slow"
        assert "0.2 s" in log["reason"]
        assert log["log_level"] == "error"
    finally:
        release.set()
    journal.wait("stop", "slow")  # once released it honours the queued stop
    journal.wait_exit(slow.actor_urn)


# -- logging ---------------------------------------------------------------------------------


def test_every_restart_is_logged_with_child_reason_and_count(journal: Journal) -> None:
    """Each restart emits supervisor.restart with the child id, the reason and the count so far."""
    sup = start_sup([spec(journal, "a"), spec(journal, "b")], name="sup", max_restarts=5)
    with capture_logs() as logs:
        crash(sup, journal, "a")
        crash(sup, journal, "b", KeyboardInterrupt("stop it"))
        crash(sup, journal, "a")
    got = [
        (e["supervisor"], e["child"], e["reason"], e["restart_count"], e["strategy"])
        for e in restart_logs(logs)
    ]
    assert got == [
        ("sup", "a", "RuntimeError: a crashed", 1, "one_for_one"),
        ("sup", "b", "KeyboardInterrupt: stop it", 2, "one_for_one"),
        ("sup", "a", "RuntimeError: a crashed", 3, "one_for_one"),
    ]
    assert all(e["log_level"] == "warning" for e in restart_logs(logs))


# -- queries and arguments -------------------------------------------------------------------


def test_empty_supervisor_answers_queries() -> None:
    """A supervisor without children answers which_children, child_ref and restart_count."""
    sup = start_sup([])
    assert sup.children() == []
    assert sup.proxy.child_ref("nope").get(timeout=BOUND) is None
    assert sup.restarts() == 0


def test_unknown_strategy_is_refused() -> None:
    """An unknown strategy raises ValueError naming the three valid ones; nothing starts."""
    with pytest.raises(
        ValueError,
        match=r"strategy must be 'one_for_one', 'one_for_all' or 'rest_for_one', "
        r"got 'one_for_some'",
    ):
        Supervisor.start([], strategy="one_for_some")
    assert pykka.ActorRegistry.get_all() == []


def test_unknown_restart_type_is_refused() -> None:
    """An unknown restart type raises ValueError naming the three valid ones."""
    with pytest.raises(
        ValueError,
        match=r"restart must be 'permanent', 'transient' or 'temporary', got 'sometimes'",
    ):
        ChildSpec("x", Plain.start, restart="sometimes")  # type: ignore[arg-type]


def test_duplicate_child_ids_are_refused(journal: Journal) -> None:
    """Two children with one id raise ValueError listing the ids; nothing starts."""
    with pytest.raises(ValueError, match=r"child ids must be unique, got \['a', 'b', 'a'\]"):
        Supervisor.start([spec(journal, "a"), spec(journal, "b"), spec(journal, "a")])
    assert pykka.ActorRegistry.get_all() == []
    assert journal.names("spawn") == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min": -0.1},
        {"min": 2.0, "max": 1.0},
        {"jitter": 1.5},
        {"jitter": -0.1},
    ],
    ids=["negative-min", "min-above-max", "jitter-above-1", "negative-jitter"],
)
def test_bad_backoff_is_refused(kwargs: dict[str, float]) -> None:
    """A Backoff outside 0 <= min <= max, 0 <= jitter <= 1 raises ValueError saying so."""
    with pytest.raises(ValueError, match=r"Backoff needs 0 <= min <= max and 0 <= jitter <= 1"):
        Backoff(**kwargs)


@pytest.mark.parametrize(("max_restarts", "max_seconds"), [(-1, 5.0), (3, 0.0), (3, -1.0)])
def test_bad_intensity_is_refused(max_restarts: int, max_seconds: float) -> None:
    """A negative max_restarts or a non-positive max_seconds raises ValueError; nothing starts."""
    with pytest.raises(ValueError, match=r"max_restarts must be >= 0 and max_seconds > 0"):
        Supervisor.start([], max_restarts=max_restarts, max_seconds=max_seconds)
    assert pykka.ActorRegistry.get_all() == []
