"""Turns (nous_actor.sessions.turns, turn_handle): policies, leases, plain writes, restarts."""

from __future__ import annotations

import asyncio
import functools
import pickle
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
from bounds import BOUND
from structlog.testing import capture_logs

from nous_actor import (
    CallTimeout,
    Compactor,
    ConflictError,
    Event,
    EventType,
    MemoryStore,
    Message,
    Session,
    SessionCrashed,
    SessionError,
    Sessions,
    SessionStopped,
    StoreError,
    Turn,
    TurnBusy,
    TurnInterrupted,
)
from nous_actor.core.history import explain, turns
from nous_actor.runtime import scheduling
from nous_actor.sessions.faults import crash
from nous_actor.sessions.turns import DEFAULT_ROLLBACK_NOTE
from nous_actor.testing import DelegatingStore

T = TypeVar("T")


@pytest.fixture
def chat_id() -> str:
    """The shared `chat` fixture's session is named ``chat`` here (a repr names it)."""
    return "chat"


def contents(s: Session) -> list[object]:
    return [m.content for m in s.derive_messages().get()]


def types(s: Session) -> list[str]:
    return [ev.type.value for ev in s.events().get()]


# -- the events ---------------------------------------------------------------------------


def test_a_turn_is_recorded_by_turn_start_and_turn_end(chat: Session) -> None:
    """A closed turn leaves turn_start and turn_end with its id, owner, policy and how."""
    with chat.turn(owner="run-1") as turn:
        turn.append_message(Message.user("hi")).get()
    start, msg, end = chat.events().get()
    assert (start.type.value, msg.type.value, end.type.value) == (
        "turn_start",
        "user_message",
        "turn_end",
    )
    assert start.data["turn_id"] == end.data["turn_id"] == turn.turn_id
    assert start.data["owner"] == end.data["owner"] == "run-1"
    assert start.data["policy"] == "enqueue"
    assert end.data["how"] == "closed"
    assert turn.start_seq == 0


def test_a_block_that_raises_ends_its_turn_as_failed(chat: Session) -> None:
    """Leaving the block with an exception records how 'failed' and the exception's type;
    the block's own exception is what the caller sees."""

    def run() -> None:
        with chat.turn(owner="run-1") as turn:
            turn.append("user_message", {"content": "q"}).get()
            raise KeyError("boom")

    with pytest.raises(KeyError):
        run()
    end = chat.events().get()[-1]
    assert end.data["how"] == "failed"
    assert end.data["error"] == "KeyError"


def test_raw_turn_start_opens_no_managed_turn(chat: Session) -> None:
    """A raw turn_start append is bookkeeping only: plain writes do not wait after it."""
    chat.append("turn_start", {"turn": 1}).get()
    assert chat.append("user_message", {"content": "x"}).get(timeout=BOUND).seq == 1
    with chat.turn(policy="reject") as turn:  # nothing is open
        turn.append("assistant_message", {"content": "y"}).get()


# -- policies -----------------------------------------------------------------------------


def test_reject_fails_at_once_naming_the_open_turns_owner(chat: Session) -> None:
    """policy 'reject' raises TurnBusy (a ConflictError) at once and changes nothing."""
    with chat.turn(owner="run-1") as first:
        before = chat.count().get()
        with pytest.raises(TurnBusy, match="'run-1'") as caught:
            chat.turn(policy="reject", owner="run-2").open()
        assert isinstance(caught.value, ConflictError)
        assert caught.value.holder == "run-1"
        assert caught.value.turn_id == first.turn_id
        assert caught.value.lease_until is not None
        assert chat.count().get() == before


def test_enqueue_waits_first_come_first_served() -> None:
    """Queued turns open in the order they arrived, each once the one before closes."""

    async def main() -> list[str]:
        s = Session.start("fcfs", timeout=BOUND)
        first = await s.turn(owner="a").aopen()
        order: list[str] = []

        async def run(name: str) -> None:
            async with s.turn(owner=name) as turn:
                order.append(name)
                await turn.append("assistant_message", {"content": name})

        tasks = [asyncio.create_task(run(n)) for n in ("b", "c", "d")]
        closing = asyncio.create_task(first.aclose())  # sent after the three opens
        await asyncio.wait_for(asyncio.gather(closing, *tasks), BOUND)
        owners = [t["owner"] for t in turns(await s.log())]
        s.stop()
        assert owners == ["a", "b", "c", "d"]
        return order

    assert asyncio.run(main()) == ["b", "c", "d"]


def test_enqueue_gives_up_after_its_timeout_with_turn_busy(chat: Session) -> None:
    """An enqueued turn waits at most its timeout, then TurnBusy; it never opens later."""
    with chat.turn(owner="run-1"):
        waiting = chat.turn(owner="run-2", timeout=0.2)
        with pytest.raises(TurnBusy, match=r"waited 0\.2 s"):
            waiting.open()
    assert [t["owner"] for t in turns(chat.log().get())] == ["run-1"]


def test_interrupt_ends_the_open_turn_and_its_events_stay(chat: Session) -> None:
    """'interrupt' ends the open turn; its holder's next call fails with TurnInterrupted
    and applies nothing; what it wrote stays on the surface."""
    old = chat.turn(owner="run-1").open()
    old.append("user_message", {"content": "kept"}).get()
    with chat.turn(policy="interrupt", owner="run-2") as new:
        with pytest.raises(TurnInterrupted, match="interrupted by turn") as caught:
            old.append("user_message", {"content": "refused"}).get()
        assert isinstance(caught.value, SessionError)
        assert caught.value.how == "interrupted"
        assert caught.value.turn_id == old.turn_id
        new.append("assistant_message", {"content": "new"}).get()
    assert contents(chat) == ["kept", "new"]
    rec_old, _ = turns(chat.log().get())
    assert rec_old["how"] == "interrupted"
    assert rec_old["by"] == new.turn_id


def test_rollback_leaves_one_note_and_keeps_history(chat: Session) -> None:
    """'rollback' hides the interrupted turn behind exactly one system note; its events
    stay in the log, and audit says which turn rolled back which."""
    chat.append("user_message", {"content": "question"}).get()
    old = chat.turn(owner="run-1").open()
    old.append("assistant_message", {"content": "half an answer"}).get()
    old.append("tool_result", {"content": "r", "tool_call_id": "c1"}).get()
    with chat.turn(policy="rollback", owner="run-2") as new:
        new.append("assistant_message", {"content": "answer"}).get()
    msgs = chat.derive_messages().get()
    assert [(m.role.value, m.content) for m in msgs] == [
        ("user", "question"),
        ("system", DEFAULT_ROLLBACK_NOTE),
        ("assistant", "answer"),
    ]
    log = chat.log().get()
    assert "half an answer" in [ev.data.get("content") for ev in log.events()]
    rec = turns(log)[0]
    assert (rec["how"], rec["by"]) == ("rolled_back", new.turn_id)
    hidden = explain(log, rec["note_seq"])["replaces"]
    assert hidden == list(range(rec["start_seq"], rec["end_seq"] + 1))
    with pytest.raises(TurnInterrupted, match="rolled_back"):
        old.close()


def test_rollback_note_is_configurable(chat: Session) -> None:
    """The rollback's note is the arriving turn's ``note``."""
    chat.turn(owner="run-1").open().append("user_message", {"content": "x"}).get()
    with chat.turn(policy="rollback", note="[retrying]"):
        pass
    assert contents(chat) == ["[retrying]"]


# -- the plain handle ---------------------------------------------------------------------


def _in_another_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` (e.g. a call on a session, returning its future) in a thread of its own."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=BOUND)


def test_plain_writes_wait_for_the_open_turn_and_reads_do_not(chat: Session) -> None:
    """A write through the plain handle (from another thread than the turn's) runs once
    the turn ends (after its turn_end); a read answers at once."""
    with chat.turn(owner="run-1") as turn:
        waiting = _in_another_thread(lambda: chat.append("user_message", {"content": "plain"}))
        assert contents(chat) == []  # a read: answered while the turn is open
        assert not waiting.done()  # the read was handled after the write arrived
        turn.append("assistant_message", {"content": "turn"}).get()
    assert waiting.get().seq == 3
    assert types(chat)[-2:] == ["turn_end", "user_message"]
    assert contents(chat) == ["turn", "plain"]


def test_a_plain_write_that_waits_out_its_bound_names_the_turn() -> None:
    """A write through the plain handle (from another thread than the turn's) fails with
    TurnBusy before its own bound, saying to write through the turn; nothing is applied."""
    s = Session.start("bounded", timeout=1.0)
    try:
        with s.turn(owner="run-1") as turn:
            waiting = _in_another_thread(lambda: s.append("user_message", {"content": "x"}))
            with pytest.raises(
                TurnBusy, match=r"'run-1'.*waited .*write through the turn"
            ) as caught:
                waiting.get(timeout=BOUND)
            assert caught.value.turn_id == turn.turn_id
        assert contents(s) == []
    finally:
        s.stop()


def test_compaction_through_the_plain_handle_waits_too(chat: Session) -> None:
    """compact() is a write: through the plain handle it waits for the open turn."""
    from nous_actor import Compactor

    for i in range(4):
        chat.append("user_message", {"content": f"m{i}"}).get()
    compactor = Compactor(budget=1, keep_recent=1, summarise=lambda ms: "sum")
    with chat.turn(owner="run-1"):
        fut = _in_another_thread(lambda: chat.compact(compactor, force=True))
        chat.count().get()
        assert not fut.done()
    assert fut.get().summary_seq is not None


def test_a_plain_write_from_the_turns_own_thread_fails_at_once() -> None:
    """A write through the plain handle from the thread that entered the open turn's
    ``with`` would wait for its own turn to end: it fails at once with TurnBusy saying
    to write through the turn (not after waiting out its bound), with any handle of the
    session; nothing is applied and the turn goes on."""
    with Sessions(MemoryStore(), timeout=BOUND) as reg:
        s, other = reg.open("own"), reg.open("own")
        with s.turn(owner="run-1") as turn:
            writes = [
                s.append("user_message", {"content": "plain"}),
                other.append_many([("user_message", {"content": "plain"})]),
                s.append_message(Message.user("plain")),
                s.compact(Compactor(budget=1, keep_recent=0, summarise=lambda ms: "s")),
            ]
            s.count().get()  # every write above was handled before this read
            for fut in writes:
                assert fut.done()
                with pytest.raises(TurnBusy, match=r"turn\.append\(\.\.\.\)") as caught:
                    fut.get()
                assert caught.value.turn_id == turn.turn_id
                assert "thread" in str(caught.value)
            turn.append("user_message", {"content": "through the turn"}).get()
        assert contents(s) == ["through the turn"]
        s.append("user_message", {"content": "after"}).get()  # the block ended: it runs


def test_other_threads_plain_writes_still_wait_for_the_turn(chat: Session) -> None:
    """Only the thread in the turn's block fails at once: another thread's plain write
    waits for the turn to end, then runs."""
    with chat.turn(owner="run-1") as turn:
        waiting = _in_another_thread(lambda: chat.append("user_message", {"content": "b"}))
        chat.count().get()
        assert not waiting.done()
        turn.append("user_message", {"content": "a"}).get()
    assert waiting.get().seq == 3
    assert contents(chat) == ["a", "b"]


def test_a_turns_thread_waits_for_a_turn_that_took_over_its_own() -> None:
    """A thread whose turn another turn interrupted is no longer in the open turn: its
    plain write waits for that other turn (it does not fail at once), then runs."""
    s = Session.start("taken", timeout=BOUND)
    try:

        def first() -> None:  # leaving the block: its turn was taken (TurnInterrupted)
            with s.turn(owner="first"):
                taker = _in_another_thread(lambda: s.turn("interrupt", owner="taker").open())
                waiting = s.append("user_message", {"content": "plain"})
                s.count().get()
                assert not waiting.done()
                taker.append("user_message", {"content": "taker's"}).get()
                _in_another_thread(taker.close)
                assert waiting.get().seq == 5

        with pytest.raises(TurnInterrupted):
            first()
        assert contents(s) == ["taker's", "plain"]
    finally:
        s.stop()


def test_a_plain_write_from_the_turns_own_task_fails_at_once_and_other_tasks_wait() -> None:
    """In asyncio the caller is the task, not the thread: a plain write from the task in
    the turn's ``async with`` fails at once; another task on the same loop (one started
    inside the block included) waits for the turn and then runs."""
    s = Session.start("tasks", timeout=BOUND)

    async def other(sent: asyncio.Event) -> int:
        fut = s.append("user_message", {"content": "other task"})
        sent.set()
        return (await fut).seq

    async def main() -> None:
        sent = asyncio.Event()
        async with s.turn(owner="task-1") as turn:
            own = s.append("user_message", {"content": "own task"})
            task = asyncio.create_task(other(sent))
            await sent.wait()
            await s.count()
            assert own.done()
            with pytest.raises(TurnBusy, match=r"asyncio task.*turn\.append"):
                await own
            assert not task.done()
            await turn.append("user_message", {"content": "through the turn"})
        assert await task == 3

    try:
        asyncio.run(main())
        assert contents(s) == ["through the turn", "other task"]
    finally:
        s.stop()


# -- leases -------------------------------------------------------------------------------


def test_a_vanished_holders_lease_ends_its_turn() -> None:
    """A turn nobody calls through for its lease ends as expired; a queued turn opens;
    the holder's next call fails with TurnInterrupted."""
    s = Session.start("lease", timeout=BOUND)
    try:
        gone = s.turn(owner="gone", lease=0.2).open()
        with capture_logs() as logs, s.turn(owner="next", timeout=BOUND):
            pass
        rec = turns(s.log().get())[0]
        assert (rec["owner"], rec["how"]) == ("gone", "expired")
        assert any(e["event"] == "session.turn_expired" and e["owner"] == "gone" for e in logs)
        with pytest.raises(TurnInterrupted, match="expired"):
            gone.renew().get()
    finally:
        s.stop()


def test_every_call_and_renew_extend_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease counts from the turn's last call (or renew), on the monotonic clock."""
    now = [1000.0]
    monkeypatch.setattr(scheduling, "monotonic", lambda: now[0])
    s = Session.start("renew", timeout=BOUND)
    try:
        turn = s.turn(owner="run-1", lease=10).open()
        now[0] += 9
        turn.renew().get()
        now[0] += 9  # 18 s after opening, 9 s after the renew
        turn.append("user_message", {"content": "a"}).get()
        now[0] += 9.5
        assert turn.count().get() == 2  # a read through the turn renews it too
        now[0] += 10
        with pytest.raises(TurnInterrupted, match="expired"):
            turn.append("user_message", {"content": "b"}).get()
        assert [t["how"] for t in turns(s.log().get())] == ["expired"]
    finally:
        s.stop()


def test_an_expired_turn_lets_waiting_plain_writes_through() -> None:
    """Plain writes waiting for a turn whose holder vanished run once its lease runs out."""
    s = Session.start("lease-w", timeout=BOUND)
    try:
        s.turn(owner="gone", lease=0.2).open()
        assert s.append("user_message", {"content": "after"}).get().seq == 2
        assert types(s) == ["turn_start", "turn_end", "user_message"]
    finally:
        s.stop()


# -- the turn object ----------------------------------------------------------------------


def test_a_turn_is_used_once(chat: Session) -> None:
    """Calls outside the block, and entering twice, fail saying what to do."""
    turn = chat.turn()
    with pytest.raises(RuntimeError, match="was not opened"):
        turn.append("user_message", {"content": "x"}).get()
    with turn:
        pass
    with pytest.raises(RuntimeError, match="is closed"):
        turn.count().get()
    with pytest.raises(RuntimeError, match="used once"):
        turn.open()
    with pytest.raises(RuntimeError, match="cannot open another turn"):
        turn.turn()
    assert types(chat) == ["turn_start", "turn_end"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"policy": "wait"}, ValueError, "policy must be one of"),
        ({"policy": 1}, ValueError, "policy must be one of"),
        ({"owner": ""}, ValueError, "owner must be a non-empty str"),
        ({"owner": 7}, TypeError, "owner must be a str"),
        ({"lease": 0}, ValueError, "lease must be a finite number"),
        ({"lease": float("nan")}, ValueError, "lease must be a finite number"),
        ({"lease": True}, ValueError, "lease must be a finite number"),
        ({"timeout": -1}, ValueError, "timeout must be a finite number"),
        ({"note": ""}, ValueError, "note must be a non-empty str"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(
    chat: Session, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    """turn() checks its arguments in the caller's thread; the session is unchanged."""
    with pytest.raises(error, match=match):
        chat.turn(**kwargs)  # type: ignore[arg-type]
    assert chat.count().get() == 0


def test_a_turn_is_made_on_a_session_handle_only(chat: Session) -> None:
    """Turn(...) refuses what is not a session's handle, a turn included."""
    with pytest.raises(TypeError, match=r"session.turn\(...\)"):
        Turn("chat")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="opened on a session's handle"):
        Turn(chat.turn())


def test_every_call_method_works_through_a_turn(chat: Session) -> None:
    """append_many, append_message, append_or_log, reads, fork and log go through the turn."""
    chat.append("system_message", {"content": "s"}).get()
    with chat.turn() as turn:
        turn.append_many([("user_message", {"content": "a"}), ("user_message", {"content": "b"})])
        turn.append_message({"role": "assistant", "content": "c"})
        assert turn.append_or_log("user_message", {"bad": {1, 2}}).get() is None
        assert [m.content for m in turn.derive_messages().get()] == ["s", "a", "b", "c"]
        assert turn.count().get() == 5
        assert len(turn.since(2).get()) == 3
        assert turn.log().get().count() == 5
        assert turn.fork(0).get().count() == 1
        with pytest.raises(ValueError, match="inside the turn"):
            turn.fork(2).get()
        assert turn.is_alive()
        with pytest.raises(RuntimeError, match="through its handle"):
            turn.stop()


def test_turn_errors_pickle_with_their_fields() -> None:
    """TurnBusy and TurnInterrupted cross a process boundary with their fields."""
    busy = pickle.loads(pickle.dumps(TurnBusy("m", session_id="s", holder="h", turn_id="t")))
    assert (busy.session_id, busy.holder, busy.turn_id) == ("s", "h", "t")
    assert str(busy) == "session 's': m"
    lost = pickle.loads(pickle.dumps(TurnInterrupted("s", "m", turn_id="t", how="expired")))
    assert (lost.session_id, lost.turn_id, lost.how) == ("s", "t", "expired")


# -- stops and restarts -------------------------------------------------------------------


def test_stopping_answers_the_calls_waiting_for_a_turn() -> None:
    """A session that stops answers its queued turns and held writes with SessionStopped."""
    s = Session.start("stop", timeout=BOUND)
    s.turn(owner="run-1").open()
    write = s.append("user_message", {"content": "x"})
    opened: list[BaseException] = []

    def queue() -> None:
        try:
            s.turn(owner="run-2").open()
        except BaseException as exc:
            opened.append(exc)

    t = threading.Thread(target=queue)
    t.start()
    s.stop()
    t.join(BOUND)
    with pytest.raises(SessionStopped):
        write.get()
    assert len(opened) == 1
    assert isinstance(opened[0], SessionStopped)


def test_a_restart_ends_an_open_turn_as_interrupted() -> None:
    """A session reopened from its store appends a turn_end (interrupted, reason restart)
    for the turn it left open; that turn's holder then hears TurnInterrupted."""
    with Sessions(MemoryStore(), timeout=BOUND) as reg:
        handle = reg.open("restart")
        turn = handle.turn(owner="run-1").open()
        turn.append("user_message", {"content": "kept"}).get()
        handle.stop()
        with pytest.raises(TurnInterrupted, match="restart"):
            turn.append("user_message", {"content": "refused"}).get()
        rec = turns(handle.log().get())[0]
        assert (rec["how"], rec["reason"]) == ("interrupted", "restart")
        assert contents(handle) == ["kept"]  # type: ignore[arg-type]
        with handle.turn(policy="reject"):  # nothing is open after the restart
            pass


def test_a_crash_ends_an_open_turn_as_interrupted() -> None:
    """A session restarted by its registry after a crash ends the turn it had open; a
    call through that turn fails with TurnInterrupted naming the restart."""
    with Sessions(MemoryStore(), timeout=BOUND, backoff=None) as reg:
        handle = reg.open("crash")
        turn = handle.turn(owner="run-1").open()
        turn.append("user_message", {"content": "kept"}).get()
        with pytest.raises(SessionCrashed):
            crash(handle).get()
        with pytest.raises(TurnInterrupted, match="reason 'restart'"):
            turn.append("user_message", {"content": "refused"}).get()
        assert [(t["how"], t["reason"]) for t in turns(handle.log().get())] == [
            ("interrupted", "restart")
        ]


class _HeldTurnEnds(DelegatingStore):
    """A store whose writes of a ``turn_end`` wait (bounded) until the test lets them go:
    a restart's own end of the turn stays in flight meanwhile."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.held = threading.Event()
        self.go = threading.Event()

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        if any(ev.type is EventType.TURN_END for evs in appends.values() for ev in evs):
            self.held.set()
            if not self.go.wait(BOUND):
                raise AssertionError("the test never let the turn's end be written")
        return self.inner.write(appends)


def test_a_turn_ended_by_a_restart_names_the_restart_while_its_end_is_in_flight() -> None:
    """The restart's end of the turn may still be on its way to the store when the turn's
    next call arrives: that call is told of the restart all the same (not that the turn
    never opened)."""
    store = _HeldTurnEnds(MemoryStore())
    with Sessions(store, timeout=BOUND, backoff=None) as reg:
        handle = reg.open("crash")
        turn = handle.turn(owner="run-1").open()
        turn.append("user_message", {"content": "kept"}).get()
        with pytest.raises(SessionCrashed):
            crash(handle).get()
        call = turn.append("user_message", {"content": "refused"})
        assert store.held.wait(BOUND), "the restart did not end the turn"
        try:
            with pytest.raises(TurnInterrupted, match="reason 'restart'"):
                call.get()
        finally:
            store.go.set()
        assert [(t["how"], t["reason"]) for t in turns(handle.log().get())] == [
            ("interrupted", "restart")
        ]


def test_a_call_without_a_name_runs_while_a_turn_is_open(chat: Session) -> None:
    """A call whose handler has no __name__ (a partial) is not a write to hold back."""
    with chat.turn():
        assert chat._call(functools.partial(lambda actor, x: x, x=7)).get() == 7


def test_an_open_turn_keeps_its_session_from_being_handed_over() -> None:
    """Another registry asking for the session waits while a turn is open there (then
    ConflictError); once the turn is closed, the session is handed over."""
    store = MemoryStore()
    with Sessions(store, timeout=BOUND) as holder_reg, Sessions(store, timeout=BOUND) as asker:
        held = holder_reg.open("chat")
        turn = held.turn(owner="run-1").open()
        with pytest.raises(ConflictError, match="still held"):
            asker.open("chat", wait=0.3)
        turn.append("user_message", {"content": "mine"}).get()
        turn.close()
        taken = asker.open("chat", wait=BOUND)
        assert [t["how"] for t in turns(taken.log().get())] == ["closed"]
        assert holder_reg.live() == []


def test_an_open_turn_is_abandoned_when_its_opener_gives_up() -> None:
    """An opener that stops waiting (CallTimeout) lets its turn go at once."""
    s = Session.start("abandon", timeout=BOUND)
    try:
        blocker = s.turn(owner="run-1").open()
        late = s.turn(owner="run-2", timeout=BOUND)
        fut = late._send_open()
        with pytest.raises(CallTimeout):
            fut.get(timeout=0.05)
        late._not_opened(fut)
        blocker.close()
        assert [t["owner"] for t in turns(s.log().get())] == ["run-1"]
        assert s.append("user_message", {"content": "x"}).get().seq == 2
    finally:
        s.stop()


def test_a_granted_turn_whose_opener_gave_up_ends_as_abandoned() -> None:
    """An opener that stops waiting after its turn was granted closes it (abandoned)."""
    s = Session.start("abandon-granted", timeout=BOUND)
    try:
        late = s.turn(owner="run-1")
        granted = late._send_open()
        granted.get()  # granted, but its opener is about to give up
        late._not_opened(granted)
        with s.turn(policy="reject"):  # nothing is open any more
            pass
        assert [t["how"] for t in turns(s.log().get())] == ["abandoned", "closed"]
    finally:
        s.stop()


def test_a_cancelled_open_lets_its_place_in_the_queue_go() -> None:
    """Cancelling a coroutine that waits to open a turn removes it from the queue: it
    never opens later."""

    async def main() -> list[str]:
        s = Session.start("cancel", timeout=BOUND)
        first = await s.turn(owner="a").aopen()
        waiting = asyncio.create_task(s.turn(owner="b").aopen())
        await asyncio.sleep(0)  # it sends its open
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await first.aclose()
        async with s.turn(policy="reject", owner="c"):  # b never held it
            pass
        owners = [t["owner"] for t in turns(await s.log())]
        s.stop()
        return owners

    assert asyncio.run(main()) == ["a", "c"]


def test_turn_repr_names_the_turn(chat: Session) -> None:
    """repr shows the turn id, owner, session and state."""
    turn = chat.turn(owner="run-1")
    assert repr(turn) == f"<Turn {turn.turn_id!r} of 'run-1' on 'chat' new>"
    assert isinstance(turn, Turn)


def test_a_session_in_a_turn_is_not_passivated_as_idle() -> None:
    """A run may hold its turn open longer than the registry's idle timeout (waiting on
    a model): passivation leaves that session alone, so the turn is not interrupted;
    once the turn ends the session is idle like any other."""
    with Sessions(MemoryStore(), idle_timeout=60.0, timeout=BOUND) as reg:
        chat = reg.open("c")
        turn = chat.turn(owner="run-1").open()
        turn.append("user_message", {"content": "question"}).get(timeout=BOUND)
        later = reg.clock() + 3600
        assert reg.passivate_idle(now=later) == []
        assert reg.live() == ["c"]
        turn.append("assistant_message", {"content": "answer"}).get(timeout=BOUND)
        turn.close()
        assert reg.passivate_idle(now=reg.clock() + 3600) == ["c"]
        assert [e["how"] for e in turns(reg.open("c").log().get(timeout=BOUND))] == ["closed"]


@pytest.mark.parametrize("policy", ["interrupt", "rollback"])
def test_a_compaction_through_a_turn_that_ended_meanwhile_applies_nothing(policy: str) -> None:
    """A compaction made through run A's turn, whose summary (a model call) comes back
    after another run took the session: it fails with `TurnInterrupted` and writes
    nothing (its summary landed inside run B's turn, the two runs' messages interleaved)."""
    release = threading.Event()
    started = threading.Event()

    def slow_summary(messages: Sequence[Message]) -> str:
        started.set()
        assert release.wait(BOUND)
        return "SUMMARY OF RUN A"

    with Sessions(MemoryStore(), timeout=BOUND) as registry:
        s = registry.open("S")
        for i in range(6):
            s.append("user_message", {"content": f"old {i} " * 30}).get(timeout=BOUND)
        a = s.turn(owner="run-A").open()
        a.append("user_message", {"content": "A asks"}).get(timeout=BOUND)
        for i in range(3):  # (a compaction in a turn summarises what the turn wrote)
            a.append("assistant_message", {"content": f"A step {i} " * 30}).get(timeout=BOUND)
        fut = a.compact(Compactor(budget=50, summarise=slow_summary, keep_recent=1))
        assert started.wait(BOUND)
        b = s.turn(owner="run-B", policy=policy).open()
        b.append("user_message", {"content": "B asks"}).get(timeout=BOUND)
        release.set()
        with pytest.raises(TurnInterrupted) as err:
            fut.get(timeout=BOUND)
        assert err.value.turn_id == a.turn_id
        b.close()
        contents = [e.data.get("content") for e in s.events().get(timeout=BOUND)]
        assert "SUMMARY OF RUN A" not in contents
        assert not [e for e in s.events().get(timeout=BOUND) if e.data.get("step") == "compaction"]


def test_a_raw_turn_start_with_a_turn_id_of_its_own_opens_no_managed_turn() -> None:
    """The application's own ``turn_start`` bookkeeping (a ``turn_id`` of its own, no
    policy) is not a managed turn (DESIGN.md §11): a restart after it ends nothing and
    answers no tool call for the app (it made up an interrupted result for ``t1``, and
    the app's real one made two)."""
    with Sessions(MemoryStore(), timeout=BOUND, backoff=None) as registry:
        s = registry.open("raw")
        s.append("turn_start", {"turn_id": "my-app-turn-1"}).get(timeout=BOUND)
        call = {"tool_calls": [{"id": "t1", "name": "f", "arguments": "{}"}]}
        s.append("assistant_message", call).get(timeout=BOUND)
        with pytest.raises(SessionCrashed):
            crash(s).get(timeout=BOUND)
        s.append("tool_result", {"tool_call_id": "t1", "content": "real"}).get(timeout=BOUND)
        assert [e.type.value for e in s.events().get(timeout=BOUND)] == [
            "turn_start",
            "assistant_message",
            "tool_result",
        ]
        results = [m.content for m in s.derive_messages().get(timeout=BOUND) if m.tool_call_id]
        assert results == ["real"]


def test_calls_waiting_for_a_turn_at_a_crash_reach_the_restarted_session() -> None:
    """Under a registry, a queued turn and a plain write held behind the open turn when
    the session crashes are delivered to the restarted session in the order they came,
    as the calls of its inbox are (they failed with `SessionStopped`): the crashed
    turn ends as interrupted by the restart, the queued one opens, and the held write
    is applied once that one closes."""
    from bounds import wait_until

    with Sessions(MemoryStore(), timeout=BOUND, backoff=None) as registry:
        s = registry.open("cw")
        a = s.turn(owner="A").open()
        a.append("user_message", {"content": "a1"}).get(timeout=BOUND)
        ref = registry._live_ref("cw", BOUND)
        assert ref is not None
        actor = ref.actor_inbox._actor  # type: ignore[attr-defined]

        def waiting() -> int:
            return 0 if actor.turns is None else len(actor.turns.waiting)

        with ThreadPoolExecutor(1) as pool:
            opening = pool.submit(lambda: s.turn(owner="B").open())
            wait_until(lambda: waiting() == 1, BOUND, "turn B queued behind A")
            write = _in_another_thread(lambda: s.append("user_message", {"content": "w"}))
            wait_until(lambda: waiting() == 2, BOUND, "the plain write held behind A")
            with pytest.raises(SessionCrashed):
                crash(s).get(timeout=BOUND)
            b = opening.result(timeout=BOUND)
        assert not write.done()  # held behind B's turn now
        b.append("user_message", {"content": "b1"}).get(timeout=BOUND)
        b.close()
        assert write.get(timeout=BOUND).data["content"] == "w"
        assert [(t["owner"], t["how"]) for t in turns(s.log().get(timeout=BOUND))] == [
            ("A", "interrupted"),
            ("B", "closed"),
        ]
        assert contents(s) == ["a1", "b1", "w"]
