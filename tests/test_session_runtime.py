"""The session runtime keeps the core's promises under an agent's workload.

Work is counted, not timed: full folds, copies of the event storage, wake-ups
of a session's actor and of an event loop. Compaction runs its summariser off
the actor; a stateful test interleaves slow compactions with appends from
threads and coroutines and checks the surface against a fresh fold.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka
import pytest
from bounds import SLOW_BOUND as BOUND
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

import nous_actor.core.log._fold as fold_module
import nous_actor.core.log._log as log_module
from nous_actor import (
    CompactionError,
    Compactor,
    Log,
    Message,
    Replace,
    Session,
    SessionStopped,
    SQLiteStore,
)
from nous_actor.sessions.actor import MAX_COMPACTION_RETRIES, SessionActor
from nous_actor.store.base import Store
from nous_actor.store.memory import MemoryStore
from nous_actor.testing.reference import reference_derive_indexed

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def summary(ms: Sequence[Message]) -> str:
    return f"summary of {len(ms)}"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store | None]:
    if request.param == "memory":
        yield None
    else:
        st_ = SQLiteStore(tmp_path / "s.db")
        yield st_
        st_.close()


class Counter:
    """Wraps a function of the log's modules and counts its calls, in every module that
    calls it (``_shadow_flags``: the fold's and the Log's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls = 0
        real = getattr(log_module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        for module in (fold_module, log_module):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, counted)


def turn(s: Session, i: int) -> None:
    s.append("user_message", {"content": f"question {i} " * 4}, T0)
    s.append("assistant_message", {"content": f"answer {i} " * 4}, T0)


# -- the fold and the storage survive everything ---------------------------------------


def test_a_long_compacting_session_never_refolds_nor_copies_its_events(
    store: Store | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of appends, a compaction every 100, reads, rewinds and forks: no full
    fold, no shadow pass and no copy of the event storage after the session's first
    read (a new session keeps no fold until something reads its surface: that read
    folds what is there once, here nothing)."""
    s = Session.start("long", store=store, timeout=BOUND)
    assert s.derive_messages().get() == []
    folds = Counter(monkeypatch, "_full_fold")
    shadows = Counter(monkeypatch, "_shadow_flags")
    copies = Counter(monkeypatch, "_branch")
    c = Compactor(budget=60, keep_recent=4, summarise=summary)
    compactions = 0
    for i in range(1500):
        turn(s, i)
        if i % 50 == 49:
            out = s.compact(c).get()
            assert out.changed
            compactions += 1
            assert len(s.derive_messages().get()) <= 6
            s.as_of(out.record_seq or 0).get()
            s.fork(out.record_seq or 0).get()
            s.log().get()
    assert s.count().get() == 3000 + 2 * compactions
    assert (folds.calls, shadows.calls, copies.calls) == (0, 0, 0)
    s.stop()


def test_a_session_keeps_a_fold_only_once_its_surface_is_read(
    store: Store | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new session only appended to keeps no fold (no full fold, nothing folded in per
    append); its first read folds what is there once, and from then on each append
    keeps the fold current. A session recovered with events is folded by recovery, off
    its thread: its first read folds nothing."""
    folds = Counter(monkeypatch, "_full_fold")
    added = [0]
    real_add = fold_module._Fold.add

    def counted_add(self: Any, ev: Any) -> None:
        added[0] += 1
        real_add(self, ev)

    monkeypatch.setattr(fold_module._Fold, "add", counted_add)
    s = Session.start("lazy", store=store, timeout=BOUND)
    for i in range(30):
        turn(s, i)
    s.count().get()
    assert (folds.calls, added[0]) == (0, 0)
    assert len(s.derive_messages().get()) == 60
    assert folds.calls == 1
    for i in range(30, 40):
        turn(s, i)
    assert len(s.derive_messages().get()) == 80
    assert (folds.calls, added[0]) == (1, 20)
    s.stop()
    if store is not None:
        again = Session.start("lazy", store=store, timeout=BOUND)
        assert again.count().get() == 80  # (answered once recovered)
        assert folds.calls == 2  # recovery folded the stored events
        assert len(again.derive_messages().get()) == 80
        assert folds.calls == 2
        again.stop()


def test_a_branch_of_a_log_taken_from_a_session_never_makes_the_session_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Appending to the Log a caller was given copies the caller's branch once; the
    session goes on appending in place, its fold (made by its first read) intact."""
    s = Session.start("branch", timeout=BOUND)
    assert s.derive_messages().get() == []
    for i in range(20):
        turn(s, i)
    given = s.log().get()
    copies = Counter(monkeypatch, "_branch")
    folds = Counter(monkeypatch, "_full_fold")
    branch = given.append("user_message", {"content": "what if"}, T0)
    assert copies.calls == 1
    for i in range(20, 40):
        turn(s, i)
    assert len(s.derive_messages().get()) == 80
    assert (copies.calls, folds.calls) == (1, 0)
    assert branch.count() == 41
    assert given.count() == 40
    assert [m.content for m in branch.derive_messages()][-1] == "what if"
    s.stop()


def test_recovery_restores_the_stored_log_in_one_step(tmp_path: Path) -> None:
    """A session on a store recovers every stored event, seqs and gaps as stored."""
    store = SQLiteStore(tmp_path / "r.db")
    s = Session.start("r", store=store, timeout=BOUND)
    for i in range(50):
        turn(s, i)
    s.compact(Compactor(budget=40, keep_recent=2, summarise=summary, snapshot=True)).get()
    before = s.log().get()
    s.stop()
    again = Session.start("r", store=store, timeout=BOUND)
    after = again.log().get()
    assert after == before
    assert again.derive_indexed().get() == before.derive_indexed()
    again.stop()
    store.close()


def test_log_restore_refuses_seqs_out_of_order() -> None:
    """Log.restore takes events in strictly increasing seq order, else seq_behind_head."""
    a = Log().append("user_message", {"content": "a"}, T0).events()[0]
    with pytest.raises(ValueError, match="behind the head"):
        Log.restore([a, a])
    with pytest.raises(TypeError, match="restore takes Events"):
        Log.restore([a, {"seq": 1}])  # type: ignore[list-item]


# -- wake-ups ------------------------------------------------------------------------------


def test_commits_wake_the_actor_only_when_someone_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined durable appends with no reader send the actor no wake-up per commit; a
    read waiting for commits gets one."""
    wakes: list[object] = []
    real_tell = pykka.ActorRef.tell

    def tell(self: pykka.ActorRef[Any], message: Any) -> None:
        if type(message) is tuple and message and message[0] is SessionActor.h_committed:
            wakes.append(message)
        real_tell(self, message)

    monkeypatch.setattr(pykka.ActorRef, "tell", tell)
    s = Session.start("quiet", store=MemoryStore(), timeout=BOUND)
    futs = [s.append("user_message", {"content": f"m{i}"}, T0) for i in range(500)]
    assert [f.get().seq for f in futs] == list(range(500))
    assert wakes == []
    s.append("user_message", {"content": "last"}, T0)
    assert s.count().get() == 501  # parked until the commit: at most one wake for it
    assert len(wakes) <= 1
    s.stop()


def test_asyncio_waiters_are_woken_once_per_batch_with_no_timer_per_await() -> None:
    """100 coroutines awaiting durable appends: the loop is woken far less than once per
    append, and bounds cost no timer per await."""
    store = MemoryStore()
    sessions = [Session.start(f"a{k}", store=store, timeout=BOUND) for k in range(100)]
    counts = {"threadsafe": 0, "timers": 0}

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        real_ts, real_at = loop.call_soon_threadsafe, loop.call_at

        def threadsafe(*args: Any, **kwargs: Any) -> Any:
            counts["threadsafe"] += 1
            return real_ts(*args, **kwargs)

        def call_at(*args: Any, **kwargs: Any) -> Any:
            counts["timers"] += 1
            return real_at(*args, **kwargs)

        loop.call_soon_threadsafe = threadsafe  # type: ignore[method-assign,assignment]
        loop.call_at = call_at  # type: ignore[method-assign,assignment]

        async def one(s: Session) -> int:
            last = -1
            for i in range(10):
                ev = await s.append("user_message", {"content": f"m{i}"}, T0)
                assert ev.seq == last + 1
                last = ev.seq
            return last

        return await asyncio.gather(*(one(s) for s in sessions))

    assert asyncio.run(main()) == [9] * 100
    assert counts["threadsafe"] < 1000 / 2
    assert counts["timers"] < 1000 / 10
    for s in sessions:
        s.stop()


def test_an_awaited_call_still_times_out_at_its_bound() -> None:
    """await on a call nobody answers raises CallTimeout about its bound later."""
    from nous_actor import CallTimeout
    from nous_actor.sessions.future import SessionFuture

    async def main() -> None:
        fut: SessionFuture[int] = SessionFuture("nobody", 0.1)
        with pytest.raises(CallTimeout, match=r"0\.1 s"):
            await asyncio.wait_for(fut, BOUND)

    asyncio.run(main())


# -- compaction off the actor --------------------------------------------------------------


def gated() -> tuple[threading.Event, list[int], Callable[[Sequence[Message]], str]]:
    gate = threading.Event()
    seen: list[int] = []

    def slow(ms: Sequence[Message]) -> str:
        seen.append(threading.get_ident())
        assert gate.wait(BOUND)
        return summary(ms)

    return gate, seen, slow


def test_calls_are_answered_while_a_summariser_runs(store: Store | None) -> None:
    """While compact's summariser is blocked, appends, reads and snapshots are answered."""
    s = Session.start("busy", store=store, timeout=BOUND)
    for i in range(10):
        turn(s, i)
    gate, seen, slow = gated()
    pending = s.compact(Compactor(budget=10, keep_recent=2, summarise=slow))
    for i in range(10, 15):
        turn(s, i)
    assert s.count().get() == 30
    assert len(s.derive_messages().get()) == 30
    assert s.snapshot().get() == 0
    assert not pending.done()
    assert seen
    assert seen[0] != threading.get_ident()
    gate.set()
    out = pending.get()
    assert out.changed
    assert out.summary_seq == 30
    # the summary replaced the 18 messages planned on, the 10 appended meanwhile stay
    assert next(m.content for m in s.derive_messages().get()) == "summary of 18"
    assert len(s.derive_messages().get()) == 1 + 2 + 10
    s.stop()


def test_a_coroutine_summariser_runs_on_the_callers_loop() -> None:
    """From asyncio, a coroutine summariser runs on the caller's loop, which stays free."""
    s = Session.start("async", timeout=BOUND)
    for i in range(10):
        turn(s, i)

    async def main() -> tuple[int, int]:
        release = asyncio.Event()
        where: list[int] = []

        async def summarise(ms: Sequence[Message]) -> str:
            where.append(threading.get_ident())
            await release.wait()
            return summary(ms)

        pending = s.compact(Compactor(budget=10, keep_recent=2, summarise=summarise))
        ev = await s.append("user_message", {"content": "meanwhile"}, T0)
        assert ev.seq == 20
        assert await s.count() == 21
        release.set()
        out = await pending
        assert where == [threading.get_ident()]
        return out.summary_seq or -1, out.record_seq or -1

    assert asyncio.run(main()) == (21, 22)
    s.stop()


def test_a_coroutine_summariser_outside_a_loop_runs_in_a_thread_of_its_own() -> None:
    """A coroutine summariser used from plain threads is run to completion off the actor."""
    s = Session.start("async-thread", timeout=BOUND)
    for i in range(10):
        turn(s, i)

    async def summarise(ms: Sequence[Message]) -> str:
        await asyncio.sleep(0)
        return summary(ms)

    out = s.compact(Compactor(budget=10, keep_recent=2, summarise=summarise)).get()
    assert out.changed
    assert s.derive_messages().get()[0].content == "summary of 18"
    s.stop()


def test_compactor_compact_refuses_a_coroutine_summariser_inside_a_running_loop() -> None:
    """Log-level compact() inside a loop says to use acompact; acompact awaits it."""
    log = Log()
    for i in range(10):
        log = log.append("user_message", {"content": f"q{i} " * 10}, T0)

    async def summarise(ms: Sequence[Message]) -> str:
        return summary(ms)

    c = Compactor(budget=10, keep_recent=2, summarise=summarise)

    async def main() -> None:
        with pytest.raises(CompactionError, match="acompact"):
            c.compact(log)
        out = await c.acompact(log)
        assert out.log.derive_messages()[0].content == "summary of 8"

    asyncio.run(main())
    assert c.compact(log).log.derive_messages()[0].content == "summary of 8"


def test_a_failing_summariser_fails_the_compaction_and_changes_nothing(
    store: Store | None,
) -> None:
    """A summariser that raises gives CompactionError; the log is as it was."""
    s = Session.start("fails", store=store, timeout=BOUND)
    for i in range(10):
        turn(s, i)
    before = s.events().get()

    def broken(ms: Sequence[Message]) -> str:
        raise RuntimeError("model is down")

    with pytest.raises(CompactionError, match="model is down"):
        s.compact(Compactor(budget=10, keep_recent=2, summarise=broken)).get()
    assert s.events().get() == before
    assert s.append("user_message", {"content": "on"}, T0).get().seq == 20
    s.stop()


def test_an_overlapping_replace_appended_meanwhile_makes_the_compaction_plan_again(
    store: Store | None,
) -> None:
    """A replace landing inside the planned range while the summary is written: the
    compaction is planned again on the new surface, never applied over it."""
    s = Session.start("overlap", store=store, timeout=BOUND)
    for i in range(10):
        turn(s, i)
    calls: list[int] = []
    first = threading.Event()
    go = threading.Event()

    def slow(ms: Sequence[Message]) -> str:
        calls.append(len(ms))
        if len(calls) == 1:
            first.set()
            assert go.wait(BOUND)
        return summary(ms)

    pending = s.compact(Compactor(budget=10, keep_recent=2, summarise=slow))
    assert first.wait(BOUND)
    s.append("system_message", {"content": "edited", "surface_op": Replace(3, 4)}, T0).get()
    go.set()
    out = pending.get()
    assert len(calls) == 2
    events = s.events().get()
    assert s.derive_indexed().get() == reference_derive_indexed(events)
    assert out.summary_seq is not None
    assert out.summary_seq > 20
    s.stop()


def test_a_compaction_looks_only_at_the_replaces_appended_while_its_summary_was_written(
    store: Store | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends made while the summary is written stand past the plan's ranges; only a
    replace can overlap them. The commit checks those replaces, not every event a busy
    session appended meanwhile (it did, holding up the session's other calls)."""
    from nous_actor.core.compaction import Plan

    looked_at: list[list[int]] = []
    overlaps = Plan.overlaps

    def counting(plan: Plan, appended: Sequence[Any]) -> Any:
        looked_at.append([ev.seq for ev in appended])
        return overlaps(plan, appended)

    monkeypatch.setattr(Plan, "overlaps", counting)
    s = Session.start("busy-while-summarised", store=store, timeout=BOUND)
    for i in range(10):
        turn(s, i)
    first = threading.Event()
    go = threading.Event()

    def slow(ms: Sequence[Message]) -> str:
        first.set()
        assert go.wait(BOUND)
        return summary(ms)

    pending = s.compact(Compactor(budget=10, keep_recent=2, summarise=slow))
    assert first.wait(BOUND)
    futs = [s.append("user_message", {"content": f"busy {i}"}, T0) for i in range(300)]
    # A replace past the plan's ranges (at the newest position): seen, no overlap.
    late = s.append("user_message", {"content": "fixed", "surface_op": Replace(300, 300)}, T0)
    last = s.append("user_message", {"content": "after"}, T0)
    for f in [*futs, late, last]:
        f.get()
    go.set()
    out = pending.get()
    assert looked_at == [[late.get().seq]]
    assert out.summary_seq is not None
    assert out.summary_seq > last.get().seq
    events = s.events().get()
    assert s.derive_indexed().get() == reference_derive_indexed(events)
    s.stop()


def test_a_compaction_with_no_summary_leaves_a_session_no_compaction_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compaction that only prunes is planned and committed in one call: the session
    keeps no record of compactions in flight for it (a session that keeps one applies
    its runs of appends one event at a time)."""
    from test_compaction import tool_log

    import nous_actor.sessions.actor._session_actor as actor_module
    from nous_actor.runtime import telemetry

    made: list[object] = []

    class Counted(actor_module.Compactions):
        def __init__(self) -> None:
            made.append(self)
            super().__init__()

    def never(ms: Sequence[Message]) -> str:
        raise AssertionError("no summary was asked for")

    monkeypatch.setattr(actor_module, "Compactions", Counted)
    old = telemetry.install(None)  # (a sink times each compaction: it keeps that state)
    try:
        s = Session.start("prune-only", timeout=BOUND)
        for ev in tool_log().events():
            s.append(ev.type, dict(ev.data), T0)
        compactor = Compactor(budget=200, keep_recent=2, prune_over=100, summarise=never)
        out = s.compact(compactor).get()
        assert out.pruned == (3,)
        assert made == []
        s.stop()
    finally:
        telemetry.install(old)


def test_an_overlap_that_persists_fails_with_compaction_error() -> None:
    """When every try finds a new overlapping replace, the compaction fails cleanly."""
    s = Session.start("overlap-again", timeout=BOUND)
    for i in range(10):
        turn(s, i)

    def meddling(ms: Sequence[Message]) -> str:
        s.append("user_message", {"content": "x", "surface_op": Replace(5, 5)}, T0).get()
        return summary(ms)

    with pytest.raises(CompactionError, match="overlaps"):
        s.compact(Compactor(budget=1, keep_recent=0, summarise=meddling)).get()
    events = s.events().get()
    assert len(events) == 20 + MAX_COMPACTION_RETRIES + 1
    assert not any(e.data.get("step") == "compaction" for e in events)
    s.stop()


def test_a_compaction_id_is_applied_at_most_once(store: Store | None) -> None:
    """compact() with an id already in the log resolves to that compaction, appending
    nothing — also after the session restarted from its store."""
    s = Session.start("once", store=store, timeout=BOUND)
    for i in range(10):
        turn(s, i)
    c = Compactor(budget=10, keep_recent=2, summarise=summary)
    first = s.compact(c, compaction_id="job-7").get()
    turn(s, 10)
    again = s.compact(c, compaction_id="job-7").get()
    assert (again.record_seq, again.summary_seq, again.compaction_id) == (
        first.record_seq,
        first.summary_seq,
        "job-7",
    )
    assert s.count().get() == 24
    if store is not None:
        s.stop()
        s = Session.start("once", store=store, timeout=BOUND)
        assert s.compact(c, compaction_id="job-7").get().record_seq == first.record_seq
        assert s.count().get() == 24
    s.stop()


def test_a_compaction_id_stays_applied_once_its_record_is_summarised_and_dropped(
    store: Store | None,
) -> None:
    """A later compaction's summary covers the first one's record and a snapshot drops it:
    a retry of the first id is still not applied again, after a restart too (its id was
    indexed from its record alone, so a restart forgot it and applied it once more)."""
    s = Session.start("absorbed", store=store, timeout=BOUND)
    for i in range(5):
        turn(s, i)
    c = Compactor(budget=10, keep_recent=2, summarise=summary)
    first = s.compact(c, compaction_id="job-1").get()
    for i in range(5, 8):
        turn(s, i)
    second = s.compact(
        Compactor(budget=10, keep_recent=2, summarise=summary, snapshot=True),
        compaction_id="job-2",
    ).get()
    assert second.summarised is not None
    assert second.summarised[0] <= first.record_seq <= second.summarised[1]
    seqs = [e.seq for e in s.events().get()]
    assert first.record_seq not in seqs  # the snapshot dropped the first record
    assert s.events().get()[-1].data["absorbed"] == ["job-1"]
    turn(s, 8)
    count = s.count().get()
    again = s.compact(c, compaction_id="job-1").get()
    assert (again.record_seq, again.compaction_id) == (second.record_seq, "job-1")
    assert s.count().get() == count
    if store is not None:
        s.stop()
        s = Session.start("absorbed", store=store, timeout=BOUND)
        again = s.compact(c, compaction_id="job-1").get()
        assert (again.record_seq, again.compaction_id) == (second.record_seq, "job-1")
        assert s.compact(c, compaction_id="job-2").get().record_seq == second.record_seq
        assert s.count().get() == count
    s.stop()


def test_the_compaction_record_carries_its_settings() -> None:
    """The step_end record holds the budget, keep_recent, prune_over and the id."""
    s = Session.start("settings", timeout=BOUND)
    for i in range(10):
        turn(s, i)
    out = s.compact(
        Compactor(budget=10, keep_recent=3, prune_over=500, summarise=summary),
        compaction_id="c-1",
    ).get()
    rec = s.events().get()[-1]
    assert rec.seq == out.record_seq
    assert {k: rec.data[k] for k in ("budget", "keep_recent", "prune_over", "compaction_id")} == {
        "budget": 10,
        "keep_recent": 3,
        "prune_over": 500,
        "compaction_id": "c-1",
    }
    s.stop()


def test_stopping_a_session_while_its_summariser_runs_answers_the_compaction() -> None:
    """A session stopped mid-summary fails the compaction with SessionStopped; nothing hangs."""
    s = Session.start("stopped", timeout=BOUND)
    for i in range(10):
        turn(s, i)
    gate, _, slow = gated()
    pending = s.compact(Compactor(budget=10, keep_recent=2, summarise=slow))
    assert s.count().get() == 20
    s.stop()
    gate.set()
    with pytest.raises(SessionStopped):
        pending.get()


def test_bad_compact_arguments_are_refused_at_the_call() -> None:
    """compact() refuses a non-Compactor, an empty id and a naive time, changing nothing."""
    s = Session.start("bad", timeout=BOUND)
    with pytest.raises(TypeError, match="Compactor"):
        s.compact("tiny")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compaction_id"):
        s.compact(Compactor(budget=1), compaction_id=" ")
    with pytest.raises(ValueError, match="naive"):
        s.compact(Compactor(budget=1), time=datetime(2026, 1, 1)).get()
    assert s.count().get() == 0
    s.stop()


def test_a_compaction_that_cannot_reach_its_budget_says_so() -> None:
    """within_budget is False and a warning is logged when the tail alone is over budget."""
    from structlog.testing import capture_logs

    s = Session.start("over", timeout=BOUND)
    for i in range(10):
        turn(s, i)
    with capture_logs() as logs:
        out = s.compact(Compactor(budget=1, keep_recent=6, summarise=summary)).get()
    assert out.changed
    assert not out.within_budget
    assert any(e["event"] == "log.compaction_over_budget" for e in logs)
    s.stop()


# -- the stateful model --------------------------------------------------------------------


class CompactionRace(RuleBasedStateMachine):
    """Appends from the test thread, a worker thread and coroutines on a loop thread,
    interleaved with compactions whose summariser waits until released and with replaces;
    the session's surface always equals a fresh fold of its events."""

    def __init__(self) -> None:
        super().__init__()
        self.session = Session.start("race", store=MemoryStore(), timeout=BOUND)
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.loop_thread.start()
        self.gates: list[threading.Event] = []
        self.pending: list[Any] = []
        self.appended = 0
        self.n = 0

    def _text(self) -> dict[str, str]:
        self.n += 1
        return {"content": f"message {self.n} " * 5}

    @rule(k=st.integers(1, 5))
    def append_here(self, k: int) -> None:
        futs = [self.session.append("user_message", self._text(), T0) for _ in range(k)]
        for f in futs:
            f.get()
        self.appended += k

    @rule(k=st.integers(1, 5))
    def append_from_a_thread(self, k: int) -> None:
        texts = [self._text() for _ in range(k)]
        out: list[int] = []

        def work() -> None:
            out.extend(
                f.get().seq
                for f in [self.session.append("assistant_message", t, T0) for t in texts]
            )

        t = threading.Thread(target=work)
        t.start()
        t.join(BOUND)
        assert out == sorted(out)
        assert len(out) == k
        self.appended += k

    @rule(k=st.integers(1, 5))
    def append_from_coroutines(self, k: int) -> None:
        texts = [self._text() for _ in range(k)]

        async def one(t: dict[str, str]) -> int:
            return (await self.session.append("user_message", t, T0)).seq

        async def all_of() -> list[int]:
            return await asyncio.gather(*(one(t) for t in texts))

        seqs = asyncio.run_coroutine_threadsafe(all_of(), self.loop).result(BOUND)
        assert len(set(seqs)) == k
        self.appended += k

    @rule(start=st.integers(0, 40), width=st.integers(0, 5))
    def append_a_replace(self, start: int, width: int) -> None:
        op = Replace(start, start + width)
        self.session.append("system_message", {"content": "edit", "surface_op": op}, T0).get()
        self.appended += 1

    @rule(budget=st.integers(0, 80), keep=st.integers(0, 4))
    def start_a_compaction(self, budget: int, keep: int) -> None:
        gate = threading.Event()
        self.gates.append(gate)

        def slow(ms: Sequence[Message]) -> str:
            assert gate.wait(BOUND)
            return summary(ms)

        c = Compactor(budget=budget, keep_recent=keep, summarise=slow)
        self.pending.append(self.session.compact(c))

    @precondition(lambda self: self.gates)
    @rule(which=st.integers(0, 10))
    def release_a_summariser(self, which: int) -> None:
        self.gates.pop(which % len(self.gates)).set()

    @precondition(lambda self: self.pending)
    @rule()
    def finish_the_compactions(self) -> None:
        for g in self.gates:
            g.set()
        self.gates.clear()
        for f in self.pending:
            try:
                f.get()
            except CompactionError as exc:
                assert "overlaps" in str(exc)
        self.pending.clear()

    @invariant()
    def surface_is_a_fresh_fold_of_the_events(self) -> None:
        # Both read in one call on the actor: a compaction may land between two calls.
        def both(actor: SessionActor) -> tuple[Any, Any]:
            return actor.log.derive_indexed(), actor.log.events()

        derived, events = self.session._call(both).get()
        assert derived == reference_derive_indexed(events)
        assert [e.seq for e in events] == sorted({e.seq for e in events})

    def teardown(self) -> None:
        for g in self.gates:
            g.set()
        for f in self.pending:
            try:
                f.get()
            except CompactionError:
                pass
        self.session.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.loop_thread.join(BOUND)
        self.loop.close()


CompactionRace.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestCompactionRace = CompactionRace.TestCase


def test_sessions_run_where_the_suite_placed_them(pytestconfig: pytest.Config) -> None:
    """With ``--pinned`` a session started without a dispatcher has a thread of its own;
    without it, it runs on the shared dispatcher (the suite runs on both placements)."""
    s = Session.start("placed", timeout=10.0)
    try:
        ref = s._actor()
        assert ref is not None
        actor = ref.actor_inbox._actor  # type: ignore[attr-defined]
        assert actor._pin is bool(pytestconfig.getoption("--pinned"))
    finally:
        s.stop(timeout=10.0)
