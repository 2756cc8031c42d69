"""One flooded session never makes the others wait for its backlog: the store's committer
takes a share of every session that has work into each group commit (issue 30, item 18).

Fairness is checked by counting commits, never by timing them: a store whose first
write waits for a gate holds the committer while a flood and a quiet append are
queued behind it; once the gate opens, the quiet append must be in the first commit
after it (a first-in-first-out committer put it behind the whole backlog, two
2,000-event commits later).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bounds import BOUND
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import Event, MemoryStore, Session, SQLiteStore, Store, StoreError
from nous_actor.sessions.actor import SessionActor
from nous_actor.store.committer import Committer
from nous_actor.testing import DelegatingStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FLOOD = 5000  # items of the flooded session queued behind the gate: 2.5 commits of MAX_BATCH


def ev(seq: int) -> Event:
    return Event(seq, "user_message", T0, {"content": f"m{seq}"})


class Recording(DelegatingStore):
    """Records what each write holds (session -> seqs), in order; the first write waits
    for ``opened`` so that what is submitted meanwhile queues behind it."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.writes: list[dict[str, list[int]]] = []
        self._lock = threading.Lock()

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        if not self.entered.is_set():
            self.entered.set()
            assert self.opened.wait(BOUND)
        with self._lock:
            self.writes.append({sid: [e.seq for e in evs] for sid, evs in appends.items()})
        return self.inner.write(appends)

    def first_write_with(self, session_id: str) -> int:
        """The index of the first write holding ``session_id`` (0 is the gated one)."""
        with self._lock:
            for i, w in enumerate(self.writes):
                if session_id in w:
                    return i
        raise AssertionError(f"{session_id} was never written")


def test_a_quiet_sessions_item_goes_into_the_first_commit_after_a_flood() -> None:
    """5,000 items of one session are queued before one item of another: the other's
    item is in the first commit after the gate, not behind the backlog."""
    store = Recording(MemoryStore())
    committer = Committer(store)
    try:
        done = threading.Event()
        committer.submit("gate", [ev(0)], lambda err: None)
        assert store.entered.wait(BOUND)
        for seq in range(FLOOD):
            committer.submit("flood", [ev(seq)], lambda err: None)
        answers: list[StoreError | None] = []
        committer.submit("quiet", [ev(0)], lambda err: (answers.append(err), done.set()))
        last = threading.Event()
        committer.submit("flood", [ev(FLOOD)], lambda err: last.set())
        store.opened.set()
        assert done.wait(BOUND)
        assert last.wait(BOUND)
        assert answers == [None]
        assert store.first_write_with("quiet") == 1
        flooded = [seq for w in store.writes for seq in w.get("flood", [])]
        assert flooded == list(range(FLOOD + 1))  # all of it, in order
    finally:
        committer.close(BOUND)


def test_a_flooded_session_takes_a_bounded_share_of_each_commit() -> None:
    """A session alone with a backlog writes it in commits of at most ``alone`` events, so
    an append of another session that arrives meanwhile waits for a bounded commit, never
    for a whole batch of the flood; an item larger than that is never split."""
    store = Recording(MemoryStore())
    committer = Committer(store, share=10, alone=100, mixed_window=0.0)
    try:
        last = threading.Event()
        committer.submit("gate", [ev(0)], lambda err: None)
        assert store.entered.wait(BOUND)
        for seq in range(1000):
            committer.submit("flood", [ev(seq)], lambda err: None)
        committer.submit("flood", [ev(s) for s in range(1000, 1250)], lambda err: None)
        committer.submit("flood", [ev(1250)], lambda err: last.set())
        store.opened.set()
        assert last.wait(BOUND)
        sizes = [len(w["flood"]) for w in store.writes[1:]]
        assert sizes == [100] * 10 + [250, 1]
    finally:
        committer.close(BOUND)


@pytest.mark.parametrize(("window", "after"), [(3600.0, 10), (0.0, 100)])
def test_the_share_stays_small_while_other_sessions_wrote_lately(
    window: float, after: int
) -> None:
    """While another session writes too, the flood gets ``share`` events a commit (the
    other's next append waits for a short one); once it has been alone for
    ``mixed_window`` it gets ``alone`` (fewer fsyncs). Counted in commits."""
    store = Recording(MemoryStore())
    committer = Committer(store, share=10, alone=100, mixed_window=window)
    try:
        last = threading.Event()
        committer.submit("gate", [ev(0)], lambda err: None)
        assert store.entered.wait(BOUND)
        committer.submit("quiet", [ev(0)], lambda err: None)
        for seq in range(300):
            committer.submit("flood", [ev(seq)], lambda err: None)
        committer.submit("flood", [ev(300)], lambda err: last.set())
        store.opened.set()
        assert last.wait(BOUND)
        assert store.writes[1] == {"quiet": [0], "flood": list(range(10))}
        sizes = [len(w["flood"]) for w in store.writes[2:]]
        assert sizes[0] == after  # the quiet session wrote just before
        assert sum(sizes) == 291
        assert all(n <= after for n in sizes)
        assert [s for w in store.writes for s in w.get("flood", [])] == list(range(301))
    finally:
        committer.close(BOUND)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcdef"), st.integers(1, 5)),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 8),
    st.integers(1, 12),
)
def test_every_waiting_session_gets_into_the_next_commit_and_order_holds(
    plan: list[tuple[str, int]], share: int, max_batch: int
) -> None:
    """Items of several sessions (of 1-5 events each) queued behind a gated commit: every
    session that has items waiting gets at least one into the next commit (fewer
    sessions than the batch holds); each commit holds at most ``max_batch`` events and
    at most ``share`` of one session, unless a single item is larger; each session's
    events are written once, in order, and its answers come in order."""
    store = Recording(MemoryStore())
    committer = Committer(store, max_batch=max_batch, share=share, alone=share)
    try:
        committer.submit("gate", [ev(0)], lambda err: None)
        assert store.entered.wait(BOUND)
        next_seq: dict[str, int] = {}
        items: dict[str, list[int]] = {}  # session -> sizes of its items, in order
        answered: dict[str, list[int]] = {}
        for sid, size in plan:
            first = next_seq.get(sid, 0)
            next_seq[sid] = first + size
            items.setdefault(sid, []).append(size)
            n = len(items[sid]) - 1
            committer.submit(
                sid,
                [ev(s) for s in range(first, first + size)],
                lambda err, sid=sid, n=n: (
                    answered.setdefault(sid, []).append(n) if err is None else None
                ),
            )
        done = threading.Event()
        committer.submit("end", [ev(0)], lambda err: done.set())
        store.opened.set()
        assert done.wait(BOUND)
        if sum(sizes[0] for sizes in items.values()) <= max_batch:
            assert set(items) <= set(store.writes[1])  # the head item of each
        for w in store.writes[1:]:
            events = sum(len(seqs) for seqs in w.values())
            assert events <= max_batch or len(w) == 1  # one item larger than the batch
        for sid, sizes in items.items():
            seqs = [s for w in store.writes for s in w.get(sid, [])]
            assert seqs == list(range(next_seq[sid]))
            assert answered[sid] == list(range(len(sizes)))
            starts = {sum(sizes[:k]) for k in range(len(sizes))}
            for w in store.writes[1:]:
                mine = w.get(sid, [])
                assert len(mine) <= share or len(starts.intersection(mine)) == 1
    finally:
        committer.close(BOUND)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_quiet_session_is_committed_in_the_first_commit_during_a_flood(
    kind: str, tmp_path: Path
) -> None:
    """Through sessions: one session has 5,000 appends queued at the committer (not
    waited for) when another session appends one event; the quiet append is
    acknowledged by the first commit after the one in progress, and the flood's
    appends are all acknowledged, in order."""
    inner: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "f.db")
    store = Recording(inner)
    gate = Session.start("gate", store=store, timeout=BOUND)
    flood = Session.start("flood", store=store, timeout=BOUND)
    quiet = Session.start("quiet", store=store, timeout=BOUND)
    try:
        gate.append("user_message", {"content": "hold the writer"})
        assert store.entered.wait(BOUND)
        flooded = [flood.append("user_message", {"content": f"f{i}"}) for i in range(FLOOD)]
        flood._call(SessionActor.h_ping).get(timeout=BOUND)  # all handed to the committer
        mine = quiet.append("user_message", {"content": "a quiet question"})
        quiet._call(SessionActor.h_ping).get(timeout=BOUND)
        store.opened.set()
        assert mine.get(timeout=BOUND).seq == 0
        assert [f.get(timeout=BOUND).seq for f in flooded] == list(range(FLOOD))
        assert store.first_write_with("quiet") == 1
    finally:
        for s in (gate, flood, quiet):
            s.stop(timeout=BOUND)
        if kind == "sqlite":
            inner.close()


def test_a_transaction_gathers_the_sessions_that_await_each_call() -> None:
    """Sessions that each await every append are woken together by a commit and send
    their next appends one after the other: the writer waits (bounded) for the sessions
    that awaited lately, so their groups merge into one transaction a round instead of
    several. Counted in commits: 50 threads x 30 rounds took 57-72 commits without the
    wait (a median of 10-35 items), 31-32 with it (a median of all 50)."""
    sessions, rounds = 50, 30
    store = Recording(MemoryStore())
    store.entered.set()  # no gate
    store.opened.set()
    committer = Committer(store, gather=0.2)  # (a bound: the threads end unevenly)
    errors: list[BaseException] = []
    start = threading.Barrier(sessions)

    def session(name: str) -> None:
        try:
            start.wait(BOUND)  # they start together, as coroutines gathered at once do
            for seq in range(rounds):
                done = threading.Event()
                committer.submit(name, [ev(seq)], lambda err, done=done: done.set())
                assert done.wait(BOUND)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=session, args=(f"s{i}",)) for i in range(sessions)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND)
        assert errors == []
        sizes = [sum(len(seqs) for seqs in w.values()) for w in store.writes]
        assert sum(sizes) == sessions * rounds
        assert len(sizes) <= rounds + 10
        assert sorted(sizes)[len(sizes) // 2] == sessions  # (the median)
    finally:
        committer.close(BOUND)


def test_a_backlog_is_written_without_gathering() -> None:
    """The wait is only for sessions that await each call (one item each in the last
    transactions): after a transaction of a backlog (several items of one session)
    nothing is waited for, and a lone caller never waits (its one item is there).
    `_expect` says how many items the next transaction waits for."""
    from nous_actor.store.committer import _COHORTS, _expect, _Item

    def items(*sids: str) -> list[_Item]:
        return [_Item("write", sid, lambda err: None, [ev(0)]) for sid in sids]

    recent, n = _expect(items("a", "b"), ())
    assert n == 2
    recent, n = _expect(items("c"), recent)
    assert n == 3  # a and b, answered by the commit before, come too
    assert _expect(items("a", "a", "b"), recent) == ((), 0)  # a backlog: no wait
    assert _expect(items("a"), ())[1] == 1  # a lone caller
    for sid in "defghij":
        recent, n = _expect(items(sid), recent)
    assert n == _COHORTS  # only the last transactions count


@given(
    st.dictionaries(st.sampled_from("abcd"), st.integers(1, 3), max_size=4),
    st.lists(st.sampled_from("abcd"), max_size=6),
)
def test_a_light_session_beside_others_is_found_as_by_counting_all(
    waiting_sizes: dict[str, int], fresh_ids: list[str]
) -> None:
    """The writer's look for a one-item session beside others (which stops early) says
    what counting every session's items says."""
    from collections import deque

    from nous_actor.store.committer import _Item, _light_beside_others

    def item(sid: str) -> _Item:
        return _Item("write", sid, lambda err: None, [ev(0)])

    waiting = {sid: deque(item(sid) for _ in range(n)) for sid, n in waiting_sizes.items()}
    fresh = [item(sid) for sid in fresh_ids]
    pending = dict(waiting_sizes)
    for sid in fresh_ids:
        pending[sid] = pending.get(sid, 0) + 1
    expected = len(pending) > 1 and min(pending.values()) == 1
    assert _light_beside_others(waiting, fresh) == expected


def test_big_events_are_split_over_transactions_by_their_bytes() -> None:
    """Twelve pipelined appends of 6 MiB each and a small one of another session: no
    transaction holds more than `MAX_BATCH_BYTES` of event data (one bigger item goes
    alone), so a slow store's bound is never outlasted by one giant commit that would
    fail every write in it, the small one too (20 appends of 15 MiB made one of 300 MB
    on PostgreSQL); every item is written, in order."""
    from nous_actor.core.event import EventType, trusted_event
    from nous_actor.store.committer import MAX_BATCH_BYTES

    text = '{"content": "' + "x" * (6 * 1024 * 1024) + '"}'
    store = Recording(MemoryStore())
    committer = Committer(store)
    try:
        committer.submit("gate", [ev(0)], lambda err: None)
        assert store.entered.wait(BOUND)
        answers: list[StoreError | None] = []
        all_answered = threading.Event()

        def answer(err: StoreError | None) -> None:
            answers.append(err)
            if len(answers) == 13:
                all_answered.set()

        for seq in range(12):
            big = trusted_event(seq, EventType.USER_MESSAGE, T0, text, None)
            committer.submit("big", [big], answer)
        committer.submit("small", [ev(0)], answer)
        store.opened.set()
        assert all_answered.wait(BOUND)
        assert answers == [None] * 13
        per_write = [len(w.get("big", [])) * len(text) for w in store.writes[1:]]
        assert max(per_write) <= MAX_BATCH_BYTES
        assert [seq for w in store.writes for seq in w.get("big", [])] == list(range(12))
        assert store.first_write_with("small") == 1
    finally:
        committer.close(BOUND)
