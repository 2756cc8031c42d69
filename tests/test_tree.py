"""One supervision tree: the session registry and single sessions as children of a
`Supervisor`, restarting and escalating through the same machinery."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import pykka
import pytest
from bounds import SLOW_BOUND as BOUND
from structlog.testing import capture_logs

from nous_actor import (
    ChildSpec,
    MemoryStore,
    RestartIntensityExceeded,
    RestartPolicy,
    Session,
    SessionCrashed,
    Sessions,
    SessionStopped,
    SQLiteStore,
    SupervisedActor,
    Supervisor,
)
from nous_actor.supervision import Exit, cell_of, start_monitored


def crash(handle: Session) -> None:
    """Crash the session behind ``handle`` (a BaseException in a handler); wait for its end."""
    ref = handle._actor()
    with pytest.raises(SessionCrashed):
        handle._call(lambda actor: (_ for _ in ()).throw(SystemExit())).get()
    assert ref is not None
    assert cell_of(ref).finished.wait(BOUND)


class Worker(SupervisedActor):
    """A user's actor beside the registry: counts its starts."""

    starts: ClassVar[list[int]] = []

    def on_start(self) -> None:
        Worker.starts.append(1)

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError("worker failed")
        return "ok"


@pytest.fixture(autouse=True)
def _reset_worker() -> None:
    Worker.starts = []


def child_ref(parent: pykka.ActorRef[Any], child: str = "sessions") -> Any:
    return parent.proxy().child_ref(child).get(timeout=BOUND)


def wait_for(predicate: Any, what: str) -> None:
    done = threading.Event()
    for _ in range(2000):
        if predicate():
            return
        done.wait(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_session_beyond_its_intensity_escalates_to_the_parent_supervisor() -> None:
    """Under a parent, a session crashing past its intensity crashes the registry with
    RestartIntensityExceeded: the parent sees the crash and restarts the registry."""
    sessions = Sessions(MemoryStore(), max_restarts=1, max_seconds=60, backoff=None, start=False)
    parent = Supervisor.start([sessions.child_spec("sessions")], max_restarts=5)
    first = parent.proxy().child_ref("sessions").get(timeout=BOUND)
    chat = sessions.open("chat")
    chat.append("user_message", {"content": "kept"}).get()
    with capture_logs() as logs:
        crash(chat)  # restarted (1 of 1)
        crash(chat)  # beyond: the registry escalates
        assert cell_of(first).finished.wait(BOUND)
        wait_for(lambda: child_ref(parent) is not first, "the parent's restart of the registry")
    assert [e["event"] for e in logs if e["event"].startswith("session.")].count(
        "session.escalated"
    ) == 1
    assert any(
        e["event"] == "supervisor.restart" and "RestartIntensityExceeded" in e["reason"]
        for e in logs
    )
    wait_for(
        lambda: parent.proxy().child_ref("sessions").get(timeout=BOUND) is not first, "restart"
    )
    # The new registry serves the old handle: the session is recovered from the store.
    wait_for(lambda: sessions._ref is not None and sessions._ref.is_alive(), "the new registry")
    assert [e.data["content"] for e in chat.events().get()] == ["kept"]
    parent.stop()


def test_a_standalone_registry_gives_the_session_up_and_runs_on() -> None:
    """On its own, the registry logs session.gave_up and keeps serving other sessions."""
    sessions = Sessions(MemoryStore(), max_restarts=0, max_seconds=60, backoff=None)
    chat = sessions.open("chat")
    other = sessions.open("other")
    with capture_logs() as logs:
        crash(chat)
    assert [e["event"] for e in logs if e["event"] == "session.gave_up"] == ["session.gave_up"]
    with pytest.raises(SessionStopped, match="gave up"):
        chat.count().get()
    assert other.append("user_message", {"content": "fine"}).get().seq == 0
    sessions.close()


def test_the_registry_restarts_with_its_sibling_and_recovers_every_session(
    tmp_path: Path,
) -> None:
    """one_for_all: a sibling's crash restarts the registry too; every session's handle
    then reaches a session recovered from the store with all it acknowledged."""
    store = SQLiteStore(tmp_path / "tree.db")
    sessions = Sessions(store, start=False)
    parent = Supervisor.start(
        [sessions.child_spec("sessions"), ChildSpec("worker", Worker.start)],
        strategy="one_for_all",
        max_restarts=3,
    )
    handles = [sessions.open(f"agent-{k}") for k in range(5)]
    for k, h in enumerate(handles):
        for i in range(3):
            h.append("user_message", {"content": f"{k}.{i}"}).get()
    first = parent.proxy().child_ref("sessions").get(timeout=BOUND)
    worker = parent.proxy().child_ref("worker").get(timeout=BOUND)
    worker.tell("crash")
    assert cell_of(first).finished.wait(BOUND)
    wait_for(lambda: len(Worker.starts) == 2, "the worker's restart")
    wait_for(lambda: sessions._ref is not first and sessions._ref is not None, "the registry")
    for k, h in enumerate(handles):
        assert [e.data["content"] for e in h.events().get()] == [f"{k}.{i}" for i in range(3)]
    assert sorted(sessions.live()) == [f"agent-{k}" for k in range(5)]
    parent.stop()
    store.close()


def test_a_session_child_of_a_users_supervisor_recovers_after_a_crash(tmp_path: Path) -> None:
    """Session.child gives a spec and a handle; a crash restarts the session from its
    store, and the handle reaches the restarted session."""
    store = SQLiteStore(tmp_path / "child.db")
    chat, spec = Session.child("chat", store=store)
    parent = Supervisor.start([spec, ChildSpec("worker", Worker.start)], strategy="one_for_one")
    chat.append("user_message", {"content": "before"}).get()
    before = chat._actor()
    crash(chat)
    wait_for(lambda: chat._resolve() is not before and chat._resolve().is_alive(), "restart")
    assert [e.data["content"] for e in chat.events().get()] == ["before"]
    assert chat.append("user_message", {"content": "after"}).get().seq == 1
    assert len(Worker.starts) == 1  # one_for_one: the sibling was left alone
    parent.stop()
    with pytest.raises(SessionStopped):
        chat.count().get()
    store.close()


def test_a_session_child_not_started_yet_answers_session_stopped() -> None:
    """Before its supervisor starts it, a child session's handle fails cleanly."""
    chat, _ = Session.child("early", store=MemoryStore(), timeout=0.05)
    with pytest.raises(SessionStopped, match="has not started it within"):
        chat.count().get()


def test_child_spec_is_refused_for_a_registry_running_on_its_own() -> None:
    """A started registry cannot also be a child; one spec per registry."""
    running = Sessions(MemoryStore())
    with pytest.raises(ValueError, match="start=False"):
        running.child_spec()
    running.close()
    waiting = Sessions(MemoryStore(), start=False)
    waiting.child_spec()
    with pytest.raises(ValueError, match="one parent"):
        waiting.child_spec()
    waiting.timeout = 0.05
    with pytest.raises(SessionStopped, match="has not started the registry"):
        waiting.open("x")


def test_restart_policy_counts_per_key_and_backs_off() -> None:
    """RestartPolicy: a window per key; beyond max_restarts, delay() is None."""
    now = [0.0]
    ran: list[float] = []
    from nous_actor import Backoff

    p = RestartPolicy(
        2, 10.0, Backoff(0.1, 1.0, 0.0), clock=lambda: now[0], scheduler=lambda d, f: ran.append(d)
    )
    assert [p.delay("a"), p.delay("a"), p.delay("a")] == [0.1, 0.2, None]
    assert p.delay("b") == 0.1
    now[0] = 11.0
    assert p.delay("a") == 0.1
    p.later(0.5, lambda: None)
    assert ran == [0.5]
    hit: list[int] = []
    p.later(0, lambda: hit.append(1))
    assert hit == [1]


def test_a_registry_crash_stops_its_sessions() -> None:
    """However the registry ends, none of its sessions outlives it."""
    sessions = Sessions(MemoryStore(), start=False)
    exits: list[Exit] = []
    ref = start_monitored(sessions.child_spec().start, exits.append)
    chat = sessions.open("chat")
    session_ref = chat._actor()
    assert session_ref is not None
    ref.tell(("exit",))  # a tell that raises (missing arguments) crashes it
    assert cell_of(ref).finished.wait(BOUND)
    assert cell_of(session_ref).finished.wait(BOUND)
    assert exits
    assert exits[0].reason is not None
    assert not pykka.ActorRegistry.get_by_urn(session_ref.actor_urn)


def test_escalation_error_names_the_session() -> None:
    """RestartIntensityExceeded from the registry says which session and why."""
    sessions = Sessions(MemoryStore(), max_restarts=0, max_seconds=60, backoff=None, start=False)
    exits: list[Exit] = []
    ref = start_monitored(sessions.child_spec().start, exits.append)
    chat = sessions.open("chat")
    crash(chat)
    assert cell_of(ref).finished.wait(BOUND)
    assert isinstance(exits[0].reason, RestartIntensityExceeded)
    assert "session 'chat'" in str(exits[0].reason)
