"""Sessions on a durable store: acknowledged after commit, recovered on start, fail closed.

Every test runs on MemoryStore and on SQLiteStore (a file). Faults are real:
a relay store hands each call to the real store and, when told, blocks a
write on a threading.Event or fails it. Waits synchronise on futures and
events, each with a bound; ``settled(session)`` is a barrier that returns
once the session's actor has handled every call made before it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pykka
import pytest
from bounds import BOUND

from nous_actor import Event, InvalidEvent, Replace, Session, SessionFuture, Sessions
from nous_actor.errors import CallTimeout, ConflictError, StoreError
from nous_actor.store import MemoryStore, SQLiteStore, Store
from nous_actor.store.committer import committer_for
from nous_actor.testing.stores import DelegatingStore

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


class Relay(DelegatingStore):
    """A Store that hands every call to a real store and records each write."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.writes: list[dict[str, list[Event]]] = []

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self.writes.append({sid: list(evs) for sid, evs in appends.items()})
        return self.inner.write(appends)


class GatedStore(Relay):
    """Each write waits for ``gate`` (open at first); ``entered`` is set when one waits."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def hold(self) -> None:
        """Make the next writes wait until :meth:`open`."""
        self.entered.clear()
        self.gate.clear()

    def open(self) -> None:
        self.gate.set()

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self.entered.set()
        if not self.gate.wait(BOUND):
            raise StoreError("the test never opened the gate")
        return super().write(appends)


FAULTS = ["store_error", "exception", "conflict"]


class FaultyStore(GatedStore):
    """A gated relay whose next write (once armed) fails in the way ``fault`` names.

    * ``store_error``: raises StoreError, nothing stored
    * ``exception``: raises a non-StoreError (a broken driver), nothing stored
    * ``conflict``: refuses ``target`` with a ConflictError, stores the other sessions
    * ``conflict_unnamed``: the same with a ConflictError that carries no session id
    * ``commit_then_raise``: stores everything, then raises StoreError (a lost reply)
    * ``cancelled``: raises asyncio.CancelledError (a BaseException), nothing stored
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.fault: str | None = None
        self.target = "s"

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self.entered.set()
        if not self.gate.wait(BOUND):
            raise StoreError("the test never opened the gate")
        fault, self.fault = self.fault, None
        if fault is None:
            return super().write(appends)
        self.writes.append({sid: list(evs) for sid, evs in appends.items()})
        if fault == "store_error":
            raise StoreError("the disk is on fire")
        if fault == "exception":
            raise RuntimeError("driver bug")
        if fault == "cancelled":
            raise asyncio.CancelledError("the driver's loop went away")
        if fault == "commit_then_raise":
            self.inner.write(appends)
            raise StoreError("connection lost after COMMIT")
        others = {sid: evs for sid, evs in appends.items() if sid != self.target}
        refused = self.inner.write(others)
        named = self.target if fault == "conflict" else None
        refused[self.target] = ConflictError("seq already stored", session_id=named)
        return refused


@pytest.fixture(params=["memory", "sqlite"])
def real_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    store: Store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "db")
    yield store
    pykka.ActorRegistry.stop_all(block=True, timeout=BOUND)
    store.close()


@pytest.fixture
def gated(real_store: Store) -> Iterator[GatedStore]:
    store = GatedStore(real_store)
    yield store
    store.open()


@pytest.fixture
def faulty(real_store: Store) -> Iterator[FaultyStore]:
    store = FaultyStore(real_store)
    yield store
    store.open()


def start(store: Store, session_id: str = "s") -> Session:
    return Session.start(session_id, store=store, timeout=BOUND)


def settled(session: Session) -> None:
    """Return once the session's actor has handled every call made before this one.

    subscribe() is not held back by pending commits, so its answer means the
    actor has taken in every earlier call (and handed its appends to the store).
    Only for use while no read is parked (calls queue behind a parked read).
    """
    session.subscribe(from_seq=10**9).close()


def say(session: Session, text: str, i: int = 0) -> SessionFuture[Event]:
    return session.append("user_message", {"content": text}, T0 + timedelta(microseconds=i))


# -- acknowledged after commit ---------------------------------------------------------------


def test_an_append_is_acknowledged_only_after_its_commit(gated: GatedStore) -> None:
    """The append's future stays pending while the store's write is blocked."""
    s = start(gated)
    gated.hold()
    fut = say(s, "a")
    assert gated.entered.wait(BOUND)
    settled(s)
    assert not fut.done()
    assert gated.inner.load("s") == []
    gated.open()
    ev = fut.get()
    assert gated.inner.load("s") == [ev]


def test_a_read_after_a_pending_append_waits_for_its_commit(gated: GatedStore) -> None:
    """count() and events() asked after an uncommitted append answer only after the commit."""
    s = start(gated)
    gated.hold()
    fut = say(s, "a")
    assert gated.entered.wait(BOUND)
    settled(s)
    count, events = s.count(), s.events()
    assert not count.done()
    assert not events.done()
    gated.open()
    assert count.get() == 1
    assert events.get() == [fut.get()]


def test_a_subscriber_sees_only_committed_events_in_order(gated: GatedStore) -> None:
    """A live subscriber gets an event once it is committed, never before, in seq order."""
    s = start(gated)
    sub = s.subscribe()
    gated.hold()
    first = say(s, "a")
    assert gated.entered.wait(BOUND)
    settled(s)
    assert sub.pending() == 0
    gated.open()
    second = say(s, "b").get()
    assert sub.get(BOUND) == first.get()
    assert sub.get(BOUND) == second
    assert sub.get_nowait() is None


# -- recovery ------------------------------------------------------------------------------


def test_a_restarted_session_has_exactly_the_acknowledged_events(real_store: Store) -> None:
    """A new session on the store recovers every acknowledged event: seqs, times, data."""
    s = start(real_store)
    acked = [
        s.append("system_message", {"content": "be brief"}, T0).get(),
        s.append("turn_start", {"turn": 1}, T0 + timedelta(microseconds=1)).get(),
        say(s, "hi", 2).get(),
        s.append(
            "assistant_message",
            {"content": None, "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]},
            T0 + timedelta(days=1, microseconds=999999),
        ).get(),
        s.append("tool_result", {"content": "42", "tool_call_id": "c"}, T0).get(),
        s.append("system_message", {"content": "sum", "surface_op": Replace(2, 4)}, T0).get(),
    ]
    surface, messages = s.surface().get(), s.derive_messages().get()
    s.stop()
    again = start(real_store)
    assert again.events().get() == acked
    assert [e.time for e in again.events().get()] == [e.time for e in acked]
    assert again.count().get() == 6
    assert again.surface().get() == surface
    assert again.derive_messages().get() == messages
    assert say(again, "next").get().seq == 6


def test_append_at_gaps_are_stored_and_recovered(real_store: Store) -> None:
    """Events restored under persisted seqs keep their gaps across a restart."""
    s = start(real_store)
    s.append_at(3, "user_message", {"content": "a"}, T0).get()
    s.append_at(7, "user_message", {"content": "b"}, T0).get()
    s.stop()
    again = start(real_store)
    assert [e.seq for e in again.events().get()] == [3, 7]
    assert again.count().get() == 8


def test_snapshot_also_deletes_the_dropped_events_from_the_store(real_store: Store) -> None:
    """After snapshot, the store holds exactly the events the session kept."""
    s = start(real_store)
    for i in range(4):
        say(s, f"m{i}", i).get()
    s.append("system_message", {"content": "summary", "surface_op": Replace(0, 2)}, T0).get()
    assert s.snapshot().get() == 3
    assert real_store.load("s") == s.events().get()
    assert [e.seq for e in real_store.load("s")] == [3, 4]


def test_a_restarted_session_recovers_snapshot_gaps(real_store: Store) -> None:
    """A session restarted after a snapshot has the same events, count and surface."""
    s = start(real_store)
    for i in range(5):
        say(s, f"m{i}", i).get()
    s.append("system_message", {"content": "summary", "surface_op": Replace(1, 3)}, T0).get()
    say(s, "after", 9).get()
    s.snapshot().get()
    events, surface, count = s.events().get(), s.surface().get(), s.count().get()
    s.stop()
    again = start(real_store)
    assert again.events().get() == events
    assert [e.seq for e in events] == [0, 4, 5, 6]
    assert again.surface().get() == surface
    assert again.count().get() == count == 7


# -- concurrency and group commit ---------------------------------------------------------------


def test_concurrent_appenders_store_exactly_the_acknowledged_events(real_store: Store) -> None:
    """Appends from several threads at once: the store holds every acknowledged one, once."""
    s = start(real_store)
    acked: list[Event] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def appender(n: int) -> None:
        try:
            barrier.wait(BOUND)
            for chunk in range(4):
                futures = [say(s, f"t{n}-{chunk}-{k}") for k in range(10)]
                got = [f.get() for f in futures]
                with lock:
                    acked.extend(got)
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=appender, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 2)
    assert not any(t.is_alive() for t in threads), "an appender hung"
    assert not errors, errors
    acked.sort(key=lambda e: e.seq)
    assert [e.seq for e in acked] == list(range(160))
    assert real_store.load("s") == acked
    assert s.events().get() == acked


def test_pipelined_appends_share_commits(gated: GatedStore) -> None:
    """Appends queued while a commit is in progress go to the store in one write."""
    s = start(gated)
    gated.hold()
    first = say(s, "first")
    assert gated.entered.wait(BOUND)
    rest = [say(s, f"m{i}", i) for i in range(300)]
    settled(s)
    gated.open()
    events = [first.get(), *(f.get() for f in rest)]
    assert [e.seq for e in events] == list(range(301))
    assert len(gated.writes) <= 3, f"{len(gated.writes)} writes for 301 appends"
    assert gated.inner.load("s") == events


def test_appends_of_several_sessions_share_one_commit(gated: GatedStore) -> None:
    """Two sessions on one store: appends pending at the same time go in the same write."""
    a, b = start(gated, "a"), start(gated, "b")
    gated.hold()
    blocker = say(a, "a0")
    assert gated.entered.wait(BOUND)
    pending = [say(a, "a1"), say(b, "b0"), say(b, "b1")]
    settled(a)
    settled(b)
    gated.open()
    for fut in [blocker, *pending]:
        fut.get()
    assert any(set(w) == {"a", "b"} for w in gated.writes), gated.writes
    assert [e.seq for e in gated.inner.load("a")] == [0, 1]
    assert [e.seq for e in gated.inner.load("b")] == [0, 1]


# -- store failures --------------------------------------------------------------------------


def fail_one_append(store: FaultyStore, fault: str) -> tuple[Session, list[Event], StoreError]:
    """Start a session, commit two events, then make the third append fail with ``fault``.

    Returns the session, the acknowledged events, and the failed append's exception.
    """
    s = start(store)
    acked = [say(s, "a", 0).get(), say(s, "b", 1).get()]
    store.fault = fault
    with pytest.raises(StoreError) as info:
        say(s, "c", 2).get()
    return s, acked, info.value


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_write_fails_its_append_with_store_error_naming_the_session(
    faulty: FaultyStore, fault: str
) -> None:
    """The append whose write failed raises StoreError with the session's id."""
    _, _, err = fail_one_append(faulty, fault)
    assert isinstance(err, StoreError)
    assert err.session_id == "s"
    assert "'s'" in str(err)


@pytest.mark.parametrize("fault", FAULTS)
def test_appends_after_a_failed_write_are_refused_until_restart(
    faulty: FaultyStore, fault: str
) -> None:
    """After a store failure, every later append raises StoreError telling to restart."""
    s, _, _ = fail_one_append(faulty, fault)
    for call in (lambda: say(s, "d"), lambda: s.append_or_log("user_message", {"content": "e"})):
        with pytest.raises(StoreError, match="restart the session") as info:
            call().get()
        assert info.value.session_id == "s"
    assert s.is_alive()


@pytest.mark.parametrize("fault", FAULTS)
def test_reads_after_a_failed_write_serve_only_committed_events(
    faulty: FaultyStore, fault: str
) -> None:
    """After a failure, reads answer with the committed events only."""
    s, acked, _ = fail_one_append(faulty, fault)
    assert s.events().get() == acked
    assert s.count().get() == 2
    assert [m.content for m in s.derive_messages().get()] == ["a", "b"]


@pytest.mark.parametrize("fault", [*FAULTS, "commit_then_raise"])
def test_the_session_never_holds_an_event_the_store_lacks(faulty: FaultyStore, fault: str) -> None:
    """Appends pipelined behind a failed one fail too; memory is a subset of the store."""
    s = start(faulty)
    acked = [say(s, "a").get()]
    faulty.hold()
    faulty.fault = fault
    doomed = say(s, "b")
    assert faulty.entered.wait(BOUND)
    behind = [say(s, f"c{i}") for i in range(5)]
    settled(s)
    faulty.open()
    for fut in [doomed, *behind]:
        with pytest.raises(StoreError):
            fut.get()
    stored = faulty.inner.load("s")
    in_memory = s.events().get()
    assert in_memory == acked
    assert set(in_memory) <= set(stored)
    assert [e.seq for e in stored] == list(range(len(stored))), "the store has a hole"


@pytest.mark.parametrize("fault", [*FAULTS, "commit_then_raise"])
def test_a_restart_after_a_failure_recovers_exactly_what_was_stored(
    faulty: FaultyStore, fault: str
) -> None:
    """Restarting the session on the real store gives back exactly the stored events."""
    s, acked, _ = fail_one_append(faulty, fault)
    s.stop()
    stored = faulty.inner.load("s")
    assert stored[:2] == acked
    again = start(faulty.inner)
    assert again.events().get() == stored
    assert again.count().get() == len(stored)
    assert say(again, "d").get().seq == len(stored)
    assert faulty.inner.load("s")[-1].data == {"content": "d"}


def test_a_restart_on_the_same_store_object_clears_the_failure(faulty: FaultyStore) -> None:
    """Restarting on the store that failed (now healthy) takes appends again."""
    s, acked, _ = fail_one_append(faulty, "store_error")
    s.stop()
    again = start(faulty)
    assert again.events().get() == acked
    assert say(again, "c").get().seq == 2


def test_a_conflict_for_one_session_leaves_the_others_writing(faulty: FaultyStore) -> None:
    """A write refused for one session commits the other sessions' appends in it."""
    s, other = start(faulty, "s"), start(faulty, "other")
    faulty.hold()
    faulty.fault = "conflict"
    doomed = say(s, "x")
    assert faulty.entered.wait(BOUND)
    fine = say(other, "y")
    settled(other)
    faulty.open()
    with pytest.raises(ConflictError):
        doomed.get()
    assert fine.get().seq == 0
    assert say(other, "z").get().seq == 1
    assert [e.data["content"] for e in faulty.inner.load("other")] == ["y", "z"]


def test_a_subscriber_never_sees_an_event_whose_write_failed(faulty: FaultyStore) -> None:
    """Events whose write failed are never delivered to subscribers."""
    s = start(faulty)
    sub = s.subscribe()
    ok = say(s, "a").get()
    faulty.fault = "store_error"
    with pytest.raises(StoreError):
        say(s, "b").get()
    with pytest.raises(StoreError):
        say(s, "c").get()
    s.events().get()
    assert sub.get(BOUND) == ok
    assert sub.get_nowait() is None


def test_a_base_exception_from_the_store_also_fails_the_appends_behind_it(
    faulty: FaultyStore,
) -> None:
    """A write that raises a BaseException fails its appends and every one queued behind."""
    s = start(faulty)
    say(s, "a").get()
    faulty.hold()
    faulty.fault = "cancelled"
    doomed = say(s, "b")
    assert faulty.entered.wait(BOUND)
    behind = say(s, "c")
    settled(s)
    faulty.open()
    with pytest.raises(StoreError) as info:
        doomed.get()
    with pytest.raises(StoreError, match="restart the session"):
        behind.get()
    assert [e.seq for e in faulty.inner.load("s")] == [0], "the store has a hole"
    assert [e.seq for e in s.events().get()] == [0]
    assert info.value.session_id == "s"


def test_a_refusal_that_names_no_session_still_fails_the_append_naming_it(
    faulty: FaultyStore,
) -> None:
    """A store's refusal without a session id still fails the append with the session's id."""
    _, _, err = fail_one_append(faulty, "conflict_unnamed")
    assert isinstance(err, ConflictError)
    assert err.session_id == "s"


def test_an_append_holding_a_lone_surrogate_does_not_break_the_session(
    real_store: Store,
) -> None:
    """Data with a lone surrogate (json.loads makes one from an escaped \\ud800) is stored or
    refused as InvalidEvent; either way the session keeps taking appends."""
    s = start(real_store)
    broken = json.loads('{"content": "cut \\ud800 off", "tool_call_id": "c"}')
    try:
        s.append("tool_result", broken).get()
    except InvalidEvent:
        pass
    after = say(s, "next").get()
    assert real_store.load("s")[-1] == after
    s.stop()
    assert start(real_store).events().get() == real_store.load("s")


# -- one writer per session -------------------------------------------------------------------


def test_a_second_start_of_a_live_session_raises_conflict_error(real_store: Store) -> None:
    """Session.start of a session already running on the store raises ConflictError."""
    first = start(real_store)
    say(first, "a").get()
    with pytest.raises(ConflictError, match="live writer"):
        start(real_store)
    assert say(first, "b").get().seq == 1
    assert [e.data["content"] for e in real_store.load("s")] == ["a", "b"]


def test_a_stopped_session_can_be_started_again(real_store: Store) -> None:
    """Stopping a session releases its claim: the next start succeeds."""
    start(real_store).stop()
    again = start(real_store)
    assert again.count().get() == 0


def test_start_with_both_store_and_log_is_a_value_error(real_store: Store) -> None:
    """A session on a store recovers its log from it, so log= with store= is refused."""
    from nous_actor import Log

    with pytest.raises(ValueError, match="pass either log= or store="):
        Session.start("s", Log(), store=real_store)
    start(real_store)  # nothing was claimed


class GateOpensOnLoad(GatedStore):
    """Opens its gate right after a load (or a refused claim) once ``armed``; ``released``
    is set once a claim has been released."""

    armed = False

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.released = threading.Event()

    def load(self, session_id: str) -> list[Event]:
        events = super().load(session_id)
        if self.armed:
            self.open()
        return events

    def claim(self, session_id: str) -> str:
        try:
            return super().claim(session_id)
        except StoreError:
            if self.armed:
                self.open()
            raise

    def release(self, session_id: str, token: str) -> None:
        super().release(session_id, token)
        self.released.set()


def test_a_session_started_while_its_predecessor_has_a_pending_commit_recovers_it(
    real_store: Store,
) -> None:
    """stop() waits (bounded) for an append still being committed; once it lands the
    session is released, and a new session recovers it."""
    store = GateOpensOnLoad(real_store)
    try:
        old = start(store)
        store.hold()
        pending = say(old, "in flight")
        assert store.entered.wait(BOUND)
        with pytest.raises(CallTimeout, match="a commit is slow"):
            old.stop(timeout=0.2)
        with pytest.raises(ConflictError):  # the old writer still holds the session
            start(store)
        store.open()
        acked = pending.get()
        old.stop()  # returns now: the commit landed and the claim is released
        assert store.released.is_set()
        assert real_store.load("s") == [acked]
        new = start(store)
        assert new.events().get() == [acked]
        assert say(new, "next").get().seq == 1
    finally:
        store.open()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_store_nobody_uses_any_more_ends_its_writer_thread(kind: str, tmp_path: Path) -> None:
    """Once its sessions stopped and nothing refers to a store, its writer thread ends
    (it looks once a second): nothing of the last batch it wrote keeps the store alive
    (an item holds its session's callback, so the actor and the store)."""
    store: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.db")
    sessions = Sessions(store)
    sessions.open("s").append("user_message", {"content": "hi"}).get(timeout=BOUND)
    thread = committer_for(store)._thread
    assert thread is not None
    assert thread.is_alive()
    gone = weakref.ref(store)
    handover = sessions._handover._thread  # (it ends at its next look after close)
    sessions.close()
    store.close()
    if handover is not None:
        handover.join(BOUND)  # its frame holds the store while it waits for a change
        assert not handover.is_alive()
    del store, sessions
    gc.collect()
    assert gone() is None
    thread.join(BOUND)
    assert not thread.is_alive()
