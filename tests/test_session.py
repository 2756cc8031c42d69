"""The session actor and its handle (DESIGN.md §4)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pykka
import pytest
from bounds import BOUND
from structlog.testing import capture_logs

from nous_actor import (
    CallTimeout,
    Event,
    InvalidEvent,
    Log,
    Message,
    Session,
    SessionCrashed,
    SessionFuture,
    SessionStopped,
)
from nous_actor.sessions.actor import SessionActor

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_append_resolves_to_the_event_with_its_seq(chat: Session) -> None:
    """append's future resolves to the appended Event, seqs counting from 0."""
    first = chat.append("user_message", {"content": "hi"}, T0).get()
    second = chat.append("assistant_message", {"content": "hello"}, T0).get()
    assert isinstance(first, Event)
    assert (first.seq, second.seq) == (0, 1)
    assert first.data == {"content": "hi"}
    assert first.time == T0


def test_append_returns_a_session_future(chat: Session) -> None:
    """Every call returns a SessionFuture, which is a Pykka future."""
    fut = chat.count()
    assert isinstance(fut, SessionFuture)
    assert isinstance(fut, pykka.Future)
    assert fut.get() == 0


def test_invalid_append_fails_the_future_and_the_session_keeps_running(chat: Session) -> None:
    """Bad input raises InvalidEvent through the future and changes nothing."""
    chat.append("user_message", {"content": "a"}).get()
    with pytest.raises(InvalidEvent) as info:
        chat.append("bogus", {}).get()
    assert info.value.reason == "unknown_event_type"
    with pytest.raises(InvalidEvent, match=r"data\['x'\]"):
        chat.append("user_message", {"x": {1}}).get()
    assert chat.count().get() == 1
    assert chat.append("user_message", {"content": "b"}).get().seq == 1


def test_append_or_log_drops_and_logs_with_session_id(chat: Session) -> None:
    """A refused append_or_log resolves to None and logs a warning naming the session."""
    with capture_logs() as logs:
        assert chat.append_or_log("bogus", {"content": "x"}).get() is None
    assert chat.count().get() == 0
    drops = [e for e in logs if e["event"] == "log.event_dropped"]
    assert len(drops) == 1
    assert drops[0]["log_level"] == "warning"
    assert drops[0]["session_id"] == "chat-42"
    assert drops[0]["type"] == "bogus"
    assert drops[0]["reason"] == "unknown_event_type"


def test_append_or_log_accepts_a_valid_event(chat: Session) -> None:
    """A valid append_or_log resolves to the Event."""
    ev = chat.append_or_log("user_message", {"content": "x"}).get()
    assert ev is not None
    assert ev.seq == 0


def test_append_at_restores_under_the_given_seq(chat: Session) -> None:
    """append_at keeps the seq and leaves count() at seq + 1; behind the head is refused."""
    assert chat.append_at(5, "user_message", {"content": "x"}, T0).get().seq == 5
    assert chat.count().get() == 6
    with pytest.raises(InvalidEvent) as info:
        chat.append_at(3, "user_message", {"content": "y"}).get()
    assert info.value.reason == "seq_behind_head"


def test_reads_match_the_log(chat: Session) -> None:
    """derive_messages, derive_indexed, surface, events, since, count and log agree with Log."""
    log = Log()
    for etype, data in [
        ("system_message", {"content": "sys"}),
        ("user_message", {"content": "q"}),
        ("turn_start", {}),
        ("assistant_message", {"content": "a"}),
        ("system_message", {"content": "sum", "surface_op": ("replace", 1, 3)}),
    ]:
        chat.append(etype, data, T0).get()
        log = log.append(etype, data, T0)
    assert chat.log().get() == log
    assert chat.derive_messages().get() == log.derive_messages()
    assert chat.derive_indexed().get() == log.derive_indexed()
    assert chat.surface().get() == log.surface()
    assert chat.events().get() == log.events()
    assert chat.since(2).get() == log.since(2)
    assert chat.count().get() == 5
    assert [m.content for m in chat.derive_messages().get()] == ["sys", "sum"]


def test_snapshot_drops_shadowed_and_reports_how_many(chat: Session) -> None:
    """snapshot resolves to the number of dropped events; surface and count stay."""
    chat.append("user_message", {"content": "a"}).get()
    chat.append("assistant_message", {"content": "b"}).get()
    chat.append("system_message", {"content": "s", "surface_op": ("replace", 0, 1)}).get()
    before = chat.derive_messages().get()
    assert chat.snapshot().get() == 2
    assert chat.derive_messages().get() == before
    assert chat.count().get() == 3
    assert [e.seq for e in chat.events().get()] == [2]


def test_log_value_does_not_change_after_later_appends(chat: Session) -> None:
    """The Log a caller got is a value: later appends to the session do not change it."""
    chat.append("user_message", {"content": "a"}).get()
    log = chat.log().get()
    chat.append("user_message", {"content": "b"}).get()
    assert log.count() == 1
    assert [m.content for m in log.derive_messages()] == ["a"]


def test_returned_lists_are_the_callers(chat: Session) -> None:
    """Mutating a returned list never changes the session."""
    chat.append("user_message", {"content": "a"}).get()
    msgs = chat.derive_messages().get()
    msgs.clear()
    events = chat.events().get()
    events.append(events[0]) if events else None
    assert len(chat.derive_messages().get()) == 1
    assert len(chat.events().get()) == 1


def test_start_with_an_existing_log() -> None:
    """A session started on a Log continues its seqs."""
    log = Log.seed([Message.user("hi", created_at=T0)])
    s = Session.start("seeded", log, timeout=BOUND)
    assert s.append("assistant_message", {"content": "yo"}).get().seq == 1
    assert [m.content for m in s.derive_messages().get()] == ["hi", "yo"]
    s.stop()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("",), {}, ValueError, "not a valid session id: it is empty"),
        ((42,), {}, TypeError, "session_id must be a str"),
        (("x", [1, 2]), {}, TypeError, "log must be a nous_actor.Log"),
        (("x",), {"timeout": 0}, ValueError, "timeout must be a finite number of seconds > 0"),
    ],
)
def test_start_rejects_bad_arguments(
    args: tuple[object, ...], kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    """Session.start refuses bad arguments with a typed error and starts nothing."""
    before = len(pykka.ActorRegistry.get_all())
    with pytest.raises(error, match=match):
        Session.start(*args, **kwargs)  # type: ignore[arg-type]
    assert len(pykka.ActorRegistry.get_all()) == before


def test_since_rejects_a_non_int(chat: Session) -> None:
    """since() with a non-int raises TypeError at once."""
    with pytest.raises(TypeError, match="since"):
        chat.since("3")  # type: ignore[arg-type]


def test_calls_on_a_stopped_session_fail_promptly() -> None:
    """After stop(), every call fails at once with SessionStopped."""
    s = Session.start("gone", timeout=BOUND)
    s.stop()
    assert not s.is_alive()
    with pytest.raises(SessionStopped, match="'gone'"):
        s.append("user_message", {"content": "x"}).get(timeout=1)
    with pytest.raises(SessionStopped):
        s.count().get(timeout=1)


def test_get_is_bounded_by_the_handle_timeout() -> None:
    """get() without a timeout waits at most the handle's bound, then CallTimeout."""
    gate = threading.Event()
    s = Session.start("slow", timeout=0.2)
    blocker = s._call(lambda actor: gate.wait(BOUND))
    with pytest.raises(CallTimeout, match=r"no answer within 0\.2 s"):
        s.count().get()
    gate.set()
    assert blocker.get(timeout=BOUND) is True
    assert s.count().get(timeout=BOUND) == 0
    s.stop()


def test_call_timeout_is_a_timeout_error() -> None:
    """CallTimeout can be caught as the builtin TimeoutError."""
    assert issubclass(CallTimeout, TimeoutError)


class Boom(BaseException):
    """A BaseException that is not an Exception."""


def test_base_exception_stops_only_that_session() -> None:
    """A BaseException in one session fails the call with SessionCrashed; others keep answering."""
    victim = Session.start("victim", timeout=BOUND)
    bystander = Session.start("bystander", timeout=BOUND)

    def explode(actor: SessionActor) -> None:
        raise Boom("kaput")

    with capture_logs() as logs, pytest.raises(SessionCrashed, match="Boom") as info:
        victim._call(explode).get()
    assert isinstance(info.value.__cause__, Boom)
    assert not victim.is_alive()
    assert bystander.append("user_message", {"content": "still here"}).get().seq == 0
    assert any(e["event"] == "session.crashed" and e["session_id"] == "victim" for e in logs)
    with pytest.raises(SessionStopped):
        victim.count().get(timeout=1)
    bystander.stop()


def test_calls_queued_behind_a_crash_are_answered() -> None:
    """Calls already queued when a session crashes fail with SessionCrashed, none hang."""
    gate = threading.Event()
    s = Session.start("crashy", timeout=BOUND)

    def explode(actor: SessionActor) -> None:
        gate.wait(BOUND)
        raise Boom("later")

    first = s._call(explode)
    queued = [s.append("user_message", {"content": str(i)}) for i in range(50)]
    gate.set()
    with pytest.raises(SessionCrashed):
        first.get()
    for fut in queued:
        with pytest.raises(SessionStopped):
            fut.get(timeout=BOUND)


def test_exception_in_a_handler_goes_to_the_caller_only(chat: Session) -> None:
    """An ordinary exception inside the actor reaches the caller; the session runs on."""

    def fail(actor: SessionActor) -> None:
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError, match="handler failed"):
        chat._call(fail).get()
    assert chat.count().get() == 0


def test_concurrent_appends_get_each_seq_exactly_once(chat: Session) -> None:
    """N threads x M appends get seqs 0..N*M-1, each exactly once, with no lost event."""
    n, m = 6, 200
    barrier = threading.Barrier(n)
    results: list[list[int]] = [[] for _ in range(n)]

    def worker(k: int) -> None:
        barrier.wait(BOUND)
        futs = [chat.append("user_message", {"content": f"{k}-{i}"}) for i in range(m)]
        results[k] = [f.get().seq for f in futs]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 3)
    assert not any(t.is_alive() for t in threads)
    seqs = sorted(s for r in results for s in r)
    assert seqs == list(range(n * m))
    for r in results:  # one caller's appends are applied in its order
        assert r == sorted(r)
    contents = [e.data["content"] for e in chat.events().get()]
    assert sorted(contents) == sorted(f"{k}-{i}" for k in range(n) for i in range(m))


def test_stop_storm_never_hangs() -> None:
    """Threads pipelining calls while the session stops: each call returns or raises in bound."""
    for round_ in range(5):
        s = Session.start(f"storm-{round_}", timeout=BOUND)
        n = 4
        barrier = threading.Barrier(n + 1)
        started = threading.Event()
        stopped = threading.Event()  # the stop has returned
        outcomes: list[str] = []
        lock = threading.Lock()

        def caller(
            k: int,
            s: Session = s,
            barrier: threading.Barrier = barrier,
            started: threading.Event = started,
            stopped: threading.Event = stopped,
            outcomes: list[str] = outcomes,
            lock: threading.Lock = lock,
        ) -> None:
            barrier.wait(BOUND)
            futs = []
            # Keep calling until the stop is seen (at most 5,000 calls each: the stop
            # runs after every call queued before it, so the backlog it waits for must
            # stay within its bound on a loaded machine, as it did not with 20,000).
            for i in range(5_000):
                fut = s.append("user_message", {"content": "x"})
                futs.append(fut)
                if k == 0 and i == 200:
                    fut.get(timeout=BOUND)
                    started.set()
                if fut.done() and isinstance(_error_of(fut), SessionStopped):
                    break
            else:
                # A loaded machine ran every call before the stop was even sent: one
                # more call once the stop has returned, which must be refused.
                assert stopped.wait(BOUND * 3)
                futs.append(s.append("user_message", {"content": "x"}))
            for f in futs:
                try:
                    f.get(timeout=BOUND)
                    kind = "ok"
                except SessionStopped:
                    kind = "stopped"
                except CallTimeout:
                    kind = "HUNG"
                with lock:
                    outcomes.append(kind)

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        barrier.wait(BOUND)
        assert started.wait(BOUND)
        s.stop()
        stopped.set()
        for t in threads:
            t.join(BOUND * 3)
        assert not any(t.is_alive() for t in threads), "a caller thread hung"
        assert "HUNG" not in outcomes
        assert "ok" in outcomes
        assert "stopped" in outcomes
        assert set(outcomes) == {"ok", "stopped"}


def _error_of(fut: SessionFuture[object]) -> BaseException | None:
    try:
        fut.get(timeout=0)
    except BaseException as exc:
        return exc
    return None
