"""`StoreContract`: every rule of the `Store` protocol, as the tests of one class, by
section: writes (what is written loads back exactly, a conflict is refused per
session), sessions (drop, the list of sessions, delete, the writer claim, a closed
store), transfer (export and import, the backend's errors raised as `StoreError`),
sharing (the optional methods for other processes), then the threads and the
stateful test."""

from __future__ import annotations

import abc
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from nous_actor.core.codec import CodecError, from_v1, loads_event
from nous_actor.core.event import Event, Replace
from nous_actor.core.log import Log
from nous_actor.errors import CallTimeout, ConflictError, StoreError
from nous_actor.store import shared
from nous_actor.store.base import Store, export_session, import_session, list_sessions
from nous_actor.store.subscription import Subscription
from nous_actor.testing.store_machine import assert_same_events, store_machine
from nous_actor.testing.store_suite._helpers import (
    _CALLS_ON_A_CLOSED_STORE,
    POISONS,
    _at_once,
    _check,
    _ev,
    _expect,
    _expect_equal,
    _jsonl,
    _nested,
    _odd_times,
    _poisoned,
    _same,
    _stored_or_store_error,
    _varied_log,
)

__all__ = ["StoreContract"]

_RACERS = 8
"""How many threads race for one session in the threads tests: enough to overlap on a
2-CPU machine, few enough to start in milliseconds."""
_RACE_ROUNDS = 3
"""How many races each of those tests runs (a fresh session each): a check-then-act
window is usually caught at the first, and three keep the test well under a second."""


_FEED_WAIT_SECONDS = 10.0
"""The bound on waiting for a watch's next event (a store that keeps its rules gives it
in milliseconds; a polling fallback within a tenth of a second)."""


def _names_its_session(err: BaseException, session_id: str, what: str) -> None:
    """The rule that an error refusing one session names it: ``err.session_id`` (made
    with ``session_id=``), which the registry passes on to its callers as is."""
    got = getattr(err, "session_id", None)
    _check(
        got == session_id,
        f"{what} must name its session: make it with session_id={session_id!r} "
        f"(its .session_id is {got!r}: {err!r})",
    )


def _refused_claim(store: Store, session_id: str, rule: str) -> None:
    """Check that a claim of ``session_id`` through ``store`` is refused (``rule``: what
    it means if not); a claim that was taken is released again."""
    try:
        token = store.claim(session_id)
    except ConflictError as exc:
        _names_its_session(exc, session_id, "the ConflictError claim() raised")
    else:
        store.release(session_id, token)
        raise AssertionError(f"{rule} (it must raise ConflictError)")


def _next_event(feed: Subscription, what: str) -> Event:
    """``feed``'s next event, or a failure saying ``what`` gave none in time (a watch
    that lost an event would otherwise fail with a bare `CallTimeout`)."""
    try:
        return feed.get(timeout=_FEED_WAIT_SECONDS)
    except CallTimeout:
        raise AssertionError(
            f"{what} gave no event within {_FEED_WAIT_SECONDS:g} s: a watch gives every "
            "committed event of its session from its from_seq on, exactly once, in seq "
            "order, whichever store object committed it (did it skip or lose one?)"
        ) from None


class StoreContract(abc.ABC):
    """Every rule of the ``Store`` protocol, as pytest tests; subclass it per store.

    Implement `make_store`; override `close_store` if closing
    needs more than ``store.close()``, and `machine_settings` to run the
    stateful test longer or shorter. A store that several processes share
    overrides `make_peer` too (a second store object on the same backend):
    the rules between two store objects are then checked (one live writer
    per session across objects, release and takeover, conflicts, a watch of
    one following the other's commits, delete and drop refused while the
    other holds the session); without it those tests skip, saying so.

    Every check raises `AssertionError` saying the rule broken (the test and
    its docstring) and what the store gave, under ``python -O`` too.

    Besides the rules in the protocol's docstring, two rules of what a store's
    errors carry are checked (each failure says which rule it is):

    * An error that refuses one session names it: every `StoreError` (a
      `ConflictError` too) that ``write`` returns for a session, and the
      `ConflictError` that ``claim`` raises, has ``session_id`` set to that
      session's id (make it with ``session_id=``). The registry hands a
      refused claim to its caller as it is (``Sessions.open`` raises it).
    * A seq of 2**63 or more (past SQL's 64-bit integers) refuses its
      session's events with a `StoreError` that is not a `ConflictError`
      (no other writer stored it; a conflict would make the session reload
      and try again), worded as the store likes; the other sessions of the
      same write are stored.
    """

    tmp_path: Path

    @abc.abstractmethod
    def make_store(self) -> Store:
        """A new, empty store (called once per test, and once per stateful example)."""

    def close_store(self, store: Store) -> None:
        """Release ``store`` after a test (it may be closed already)."""
        store.close()

    def make_peer(self, store: Store) -> Store | None:
        """A second store object on the same backend as ``store`` (the same file, the
        same database and schema): what another process that opens the store has.
        ``None`` (the default) says the store has no such thing, and the tests of the
        rules between two store objects (the ``peer`` tests) skip, saying so.

        Called once per peer test, after `make_store` made ``store``; the peer is
        closed with `close_peer` before ``store`` is closed."""
        return None

    def close_peer(self, peer: Store) -> None:
        """Release a store object `make_peer` made (it may be closed already), leaving
        the backend to `close_store`."""
        peer.close()

    def machine_settings(self) -> settings:
        """Hypothesis settings of `test_agrees_with_a_model_under_random_operations`."""
        return settings(
            max_examples=min(settings().max_examples, 25),
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )

    @pytest.fixture(autouse=True)
    def _contract_tmp_path(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    @pytest.fixture
    def store(self, _contract_tmp_path: None) -> Iterator[Store]:
        """A fresh store from `make_store`, closed after the test."""
        store = self.make_store()
        try:
            yield store
        finally:
            with contextlib.suppress(StoreError):
                self.close_store(store)

    @pytest.fixture
    def peer(self, store: Store) -> Iterator[Store]:
        """A second store object on ``store``'s backend, from `make_peer` (the test skips
        when it gives ``None``), closed after the test."""
        made = self.make_peer(store)
        if made is None:
            pytest.skip(
                "make_peer() gives no second store object on the same backend, so the "
                "rules between two store objects (what two processes sharing the store "
                "have) are not checked: override make_peer(store) to return one"
            )
        try:
            yield made
        finally:
            with contextlib.suppress(StoreError):
                self.close_peer(made)

    # == Writes: what is written loads back exactly, and a conflict is refused per session ===

    # -- write and load ---------------------------------------------------------------

    def test_is_a_store(self, store: Store) -> None:
        """The store implements the Store protocol (every method is there)."""
        _expect(isinstance(store, Store), "isinstance(store, Store)")

    def test_a_new_store_is_empty(self, store: Store) -> None:
        """A new store has no sessions, and loading any session gives []."""
        _expect_equal(store.sessions(), [], "store.sessions() == []")
        _expect_equal(store.load("nobody"), [], 'store.load("nobody") == []')

    def test_written_events_load_back_equal(self, store: Store) -> None:
        """Events of every type load back equal: seq, type, time, data, surface_op."""
        events = list(_varied_log().events())
        _expect_equal(store.write({"s": events}), {}, 'store.write({"s": events}) == {}')
        assert_same_events(store.load("s"), events)

    def test_a_replace_loads_back_as_a_replace(self, store: Store) -> None:
        """A replacing event keeps its surface_op, so the rebuilt surface is the same."""
        log = _varied_log()
        store.write({"s": log.events()})
        loaded = store.load("s")
        replaces = [e for e in loaded if e.surface_op is not None]
        _expect_equal(
            [e.surface_op for e in replaces],
            [Replace(1, 7)],
            "[e.surface_op for e in replaces] == [Replace(1, 7)]",
        )
        _expect_equal(
            list(replaces[0].data["surface_op"]),
            ["replace", 1, 7],
            'list(replaces[0].data["surface_op"]) == ["replace", 1, 7]',
        )
        rebuilt = Log()
        for ev in loaded:
            rebuilt = rebuilt.append_event(ev)
        _expect_equal(
            rebuilt.derive_indexed(),
            log.derive_indexed(),
            "rebuilt.derive_indexed() == log.derive_indexed()",
        )

    def test_a_replace_far_past_the_head_loads_back(self, store: Store) -> None:
        """A replace whose range starts past its own seq and runs far beyond loads back."""
        ev = _ev(0, "system_message", {"content": "x", "surface_op": ["replace", 3, 10**6]})
        store.write({"s": [ev]})
        assert_same_events(store.load("s"), [ev])
        _expect_equal(
            store.load("s")[0].surface_op,
            Replace(3, 10**6),
            'store.load("s")[0].surface_op == Replace(3, 10**6)',
        )

    def test_times_load_back_to_the_microsecond_in_utc(self, store: Store) -> None:
        """Times load back as the same instant, microseconds kept, in UTC (any offset given)."""
        events = [_ev(i, time=t) for i, t in enumerate(_odd_times())]
        store.write({"s": events})
        assert_same_events(store.load("s"), events)

    def test_data_loads_back_with_its_json_types(self, store: Store) -> None:
        """Data keeps every JSON type and value: ints, floats, bools, null, nesting, unicode."""
        data: dict[str, Any] = {
            "content": "naïve café ☕ 日本語 \U0001f600",
            "ints": [0, -1, 2**53 + 1, 10**30, -(10**30)],
            "floats": [0.1, -0.0, 1e308, 5e-324, 1.5],
            "bools": [True, False, None],
            "one_and_true": {"one": 1, "float_one": 1.0, "true": True},
            "nested": {"a": [{"b": [[], {}, ""]}]},
            "escapes": 'quote " backslash \\ newline \n tab \t sep \u2028 nul \x00',
            "": "empty key",
        }
        events = [_ev(0, data=data), _ev(1, "turn_start", {"deep": _nested(40)})]
        store.write({"s": events})
        assert_same_events(store.load("s"), events)

    def test_load_is_in_seq_order_whatever_the_write_order(self, store: Store) -> None:
        """load returns events in seq order even when a write listed them out of order."""
        events = [_ev(5), _ev(1), _ev(3)]
        store.write({"s": events})
        _expect_equal(
            [e.seq for e in store.load("s")],
            [1, 3, 5],
            '[e.seq for e in store.load("s")] == [1, 3, 5]',
        )

    def test_successive_writes_add_up(self, store: Store) -> None:
        """Each write adds to what the session already holds."""
        store.write({"s": [_ev(0), _ev(1)]})
        store.write({"s": [_ev(2)]})
        store.write({"s": [_ev(3), _ev(4)]})
        assert_same_events(store.load("s"), [_ev(i) for i in range(5)])

    def test_seq_gaps_are_kept(self, store: Store) -> None:
        """Stored seqs need not be contiguous; load gives exactly the seqs written."""
        store.write({"s": [_ev(0), _ev(5), _ev(9)]})
        _expect_equal(
            [e.seq for e in store.load("s")],
            [0, 5, 9],
            '[e.seq for e in store.load("s")] == [0, 5, 9]',
        )

    def test_sessions_are_kept_apart(self, store: Store) -> None:
        """One write to several sessions stores each session's events under its own id."""
        a = [_ev(0, data={"content": "a0"}), _ev(1, data={"content": "a1"})]
        b = [_ev(0, data={"content": "b0"})]
        _expect_equal(store.write({"a": a, "b": b}), {}, 'store.write({"a": a, "b": b}) == {}')
        assert_same_events(store.load("a"), a)
        assert_same_events(store.load("b"), b)
        _expect_equal(store.load("c"), [], 'store.load("c") == []')

    def test_a_write_with_nothing_to_store_changes_nothing(self, store: Store) -> None:
        """write({}) and a session with no events return {} and create no session."""
        _expect_equal(store.write({}), {}, "store.write({}) == {}")
        _expect_equal(store.write({"empty": []}), {}, 'store.write({"empty": []}) == {}')
        _expect_equal(store.sessions(), [], "store.sessions() == []")
        _expect_equal(store.load("empty"), [], 'store.load("empty") == []')

    def test_loaded_events_are_the_callers(self, store: Store) -> None:
        """Changing the list load returned changes nothing stored."""
        store.write({"s": [_ev(0), _ev(1)]})
        got = store.load("s")
        got.clear()
        _expect_equal(
            [e.seq for e in store.load("s")], [0, 1], '[e.seq for e in store.load("s")] == [0, 1]'
        )

    def test_a_write_is_not_affected_by_later_changes_to_the_callers_list(
        self, store: Store
    ) -> None:
        """The store keeps what was written, not the caller's list object."""
        events = [_ev(0)]
        store.write({"s": events})
        events.append(_ev(1))
        _expect_equal(
            [e.seq for e in store.load("s")], [0], '[e.seq for e in store.load("s")] == [0]'
        )

    # -- conflicts: per-session atomicity ---------------------------------------------------

    def test_a_seq_already_stored_is_refused_with_conflict_error(self, store: Store) -> None:
        """Writing a stored seq again returns a ConflictError for that session."""
        store.write({"s": [_ev(0), _ev(1)]})
        refused = store.write({"s": [_ev(1, data={"content": "other"})]})
        _expect_equal(set(refused), {"s"}, 'set(refused) == {"s"}')
        _check(
            isinstance(refused.get("s"), ConflictError),
            f"a seq already stored (or twice in one write) refuses session 's' with "
            f"ConflictError: write() returned {refused!r}",
        )
        assert_same_events(store.load("s"), [_ev(0), _ev(1)])

    def test_a_refused_write_stores_none_of_its_events(self, store: Store) -> None:
        """A session's write is all or nothing: the fresh seqs beside a stored one stay out."""
        store.write({"s": [_ev(0), _ev(1)]})
        refused = store.write({"s": [_ev(2), _ev(1), _ev(3)]})
        _check(
            isinstance(refused.get("s"), ConflictError),
            f"a seq already stored (or twice in one write) refuses session 's' with "
            f"ConflictError: write() returned {refused!r}",
        )
        _expect_equal(
            [e.seq for e in store.load("s")], [0, 1], '[e.seq for e in store.load("s")] == [0, 1]'
        )

    def test_a_seq_twice_in_one_write_is_refused(self, store: Store) -> None:
        """Two events with one seq in the same write are a conflict; neither is stored,
        and a session the refused write would have begun is not listed."""
        refused = store.write({"s": [_ev(0), _ev(0, data={"content": "twin"})]})
        _check(
            isinstance(refused.get("s"), ConflictError),
            f"a seq already stored (or twice in one write) refuses session 's' with "
            f"ConflictError: write() returned {refused!r}",
        )
        _expect_equal(store.load("s"), [], 'store.load("s") == []')
        _same(
            store.sessions(),
            [],
            "sessions() lists the sessions with stored events: a refused write of a new "
            "session stores nothing, so it must not list it (add a session to the list "
            "in the same transaction as its events)",
        )

    def test_a_conflict_names_its_session(self, store: Store) -> None:
        """The ConflictError a write returns carries the session's id (``session_id=``)."""
        store.write({"s": [_ev(0)]})
        refused = store.write({"s": [_ev(0)]})
        _check(
            isinstance(refused.get("s"), ConflictError),
            f"a seq already stored must refuse its session with ConflictError, got {refused!r}",
        )
        _names_its_session(refused["s"], "s", "the ConflictError write() returned")

    def test_a_conflict_leaves_other_sessions_in_the_same_write_stored(self, store: Store) -> None:
        """Only the conflicting session is refused; the others in that write commit."""
        store.write({"b": [_ev(0)]})
        refused = store.write({"a": [_ev(0)], "b": [_ev(0), _ev(1)], "c": [_ev(0), _ev(1)]})
        _expect_equal(set(refused), {"b"}, 'set(refused) == {"b"}')
        _check(
            isinstance(refused.get("b"), ConflictError),
            f"a seq already stored (or twice in one write) refuses session 'b' with "
            f"ConflictError: write() returned {refused!r}",
        )
        _expect_equal(
            [e.seq for e in store.load("a")], [0], '[e.seq for e in store.load("a")] == [0]'
        )
        _expect_equal(
            [e.seq for e in store.load("b")], [0], '[e.seq for e in store.load("b")] == [0]'
        )
        _expect_equal(
            [e.seq for e in store.load("c")], [0, 1], '[e.seq for e in store.load("c")] == [0, 1]'
        )

    def test_the_store_takes_more_writes_after_a_conflict(self, store: Store) -> None:
        """A refused write leaves the store working: the session's next seq still commits."""
        store.write({"s": [_ev(0)]})
        store.write({"s": [_ev(0)]})
        _expect_equal(store.write({"s": [_ev(1)]}), {}, 'store.write({"s": [_ev(1)]}) == {}')
        _expect_equal(
            [e.seq for e in store.load("s")], [0, 1], '[e.seq for e in store.load("s")] == [0, 1]'
        )

    # -- one session's value never fails another's write ---------------------------------

    @pytest.mark.parametrize("how", POISONS)
    def test_a_session_that_cannot_be_stored_never_fails_the_others(
        self, store: Store, how: str
    ) -> None:
        """An event the store cannot store (a seq of 2**63, data it cannot encode, a
        time without a text form) refuses its own session alone, or is stored whole:
        every other session in the same write commits, and the store goes on."""
        store.write({"b": [_ev(0)]})
        appends = {
            "a": [_ev(0), _ev(1)],
            "bad": [_ev(0), _poisoned(1, how), _ev(2)],
            "b": [_ev(1)],
        }
        refused = store.write(appends)
        _check(
            set(refused) <= {"bad"},
            "a session the store cannot store refuses itself alone (or is stored): the "
            f"other sessions of the same write must commit, but write() returned {refused!r}",
        )
        _expect_equal(
            [e.seq for e in store.load("a")], [0, 1], '[e.seq for e in store.load("a")] == [0, 1]'
        )
        _expect_equal(
            [e.seq for e in store.load("b")], [0, 1], '[e.seq for e in store.load("b")] == [0, 1]'
        )
        if "bad" in refused:
            _check(
                isinstance(refused["bad"], StoreError),
                f"write() returns a StoreError for each session it refuses, got {refused!r}",
            )
            _names_its_session(refused["bad"], "bad", "the StoreError write() returned")
            _expect_equal(
                store.load("bad"), [], 'store.load("bad") == []'
            )  # none of its events: a session's write is atomic
        _expect_equal(
            store.write({"bad": [_ev(5)], "a": [_ev(2)]}),
            {},
            'store.write({"bad": [_ev(5)], "a": [_ev(2)]}) == {}',
        )
        _expect_equal(
            [e.seq for e in store.load("a")],
            [0, 1, 2],
            '[e.seq for e in store.load("a")] == [0, 1, 2]',
        )

    def test_a_seq_of_2_to_the_63_is_refused_for_its_session(self, store: Store) -> None:
        """Seqs are below 2**63 in every store (SQL's integers are 64-bit): a larger one
        refuses its session's write with a StoreError that is not a ConflictError (which
        would say another writer stored that seq: the session would reload and try
        again), naming the session, beside a conflict of another one. Its wording is the
        store's own."""
        store.write({"c": [_ev(0)]})
        refused = store.write({"big": [_poisoned(0, "seq")], "c": [_ev(0)], "ok": [_ev(0)]})
        _check(
            set(refused) == {"big", "c"},
            "a seq of 2**63 refuses its own session alone, and a seq already stored its "
            f"own: write() returned {refused!r}",
        )
        _check(
            isinstance(refused["c"], ConflictError),
            f"a seq already stored is refused with ConflictError, got {refused!r}",
        )
        big = refused["big"]
        rule = (
            "a seq of 2**63 or more is refused with a StoreError that is not a ConflictError "
            f"(no other writer stored it), got {big!r}"
        )
        _check(isinstance(big, StoreError), rule)
        _check(not isinstance(big, ConflictError), rule)
        _names_its_session(big, "big", "the StoreError refusing a seq of 2**63")
        _check(store.load("big") == [], "a refused session's events are not stored")
        _expect_equal(
            [e.seq for e in store.load("ok")], [0], '[e.seq for e in store.load("ok")] == [0]'
        )

    # == Sessions: drop, the list of sessions, delete, the writer claim, a closed store ======

    # -- drop ---------------------------------------------------------------------------

    def test_drop_deletes_exactly_the_given_seqs(self, store: Store) -> None:
        """drop removes the listed seqs of one session and nothing else."""
        store.write({"s": [_ev(i) for i in range(5)], "t": [_ev(i) for i in range(5)]})
        store.drop("s", [1, 3])
        _expect_equal(
            [e.seq for e in store.load("s")],
            [0, 2, 4],
            '[e.seq for e in store.load("s")] == [0, 2, 4]',
        )
        _expect_equal(
            [e.seq for e in store.load("t")],
            [0, 1, 2, 3, 4],
            '[e.seq for e in store.load("t")] == [0, 1, 2, 3, 4]',
        )

    def test_drop_ignores_unknown_seqs_and_sessions(self, store: Store) -> None:
        """Seqs never stored, and sessions never written, are ignored by drop."""
        store.write({"s": [_ev(0), _ev(1)]})
        store.drop("s", [1, 7, 1000])
        store.drop("nobody", [0])
        store.drop("s", [])
        _expect_equal(
            [e.seq for e in store.load("s")], [0], '[e.seq for e in store.load("s")] == [0]'
        )
        _expect_equal(store.sessions(), ["s"], 'store.sessions() == ["s"]')

    def test_snapshot_gaps_survive_a_reload(self, store: Store) -> None:
        """Writing a log, then dropping what snapshot drops, reloads as the snapshot."""
        log = _varied_log()
        store.write({"s": log.events()})
        small = log.snapshot()
        kept = {e.seq for e in small.events()}
        store.drop("s", [e.seq for e in log.events() if e.seq not in kept])
        loaded = store.load("s")
        assert_same_events(loaded, small.events())
        rebuilt = Log()
        for ev in loaded:
            rebuilt = rebuilt.append_event(ev)
        _expect_equal(rebuilt, small, "rebuilt == small")
        _expect_equal(rebuilt.count(), log.count(), "rebuilt.count() == log.count()")
        _expect_equal(
            rebuilt.derive_indexed(),
            log.derive_indexed(),
            "rebuilt.derive_indexed() == log.derive_indexed()",
        )

    def test_dropping_every_event_removes_the_session_from_sessions(self, store: Store) -> None:
        """A session left with no events is not listed by sessions()."""
        store.write({"s": [_ev(0), _ev(1)], "t": [_ev(0)]})
        store.drop("s", [0, 1])
        _expect_equal(store.sessions(), ["t"], 'store.sessions() == ["t"]')

    # -- sessions and delete --------------------------------------------------------------

    def test_sessions_lists_every_id_sorted(self, store: Store) -> None:
        """sessions() lists each id with events once, sorted (code point order)."""
        ids = ["b", "a", "B", "é", "a-1", "a_1", "10", "9", "日本", "a", "zz"]
        for sid in ids:
            store.write({sid: [_ev(len(store.load(sid)))]})
        _expect_equal(store.sessions(), sorted(set(ids)), "store.sessions() == sorted(set(ids))")

    def test_delete_removes_every_event_of_one_session(self, store: Store) -> None:
        """delete empties one session and leaves the others as they were."""
        store.write({"s": [_ev(0), _ev(1)], "t": [_ev(0)]})
        store.delete("s")
        _expect_equal(store.load("s"), [], 'store.load("s") == []')
        _expect_equal(store.sessions(), ["t"], 'store.sessions() == ["t"]')
        _expect_equal(
            [e.seq for e in store.load("t")], [0], '[e.seq for e in store.load("t")] == [0]'
        )

    def test_delete_of_an_unknown_session_is_a_no_op(self, store: Store) -> None:
        """Deleting a session that has no events does nothing and raises nothing."""
        store.write({"t": [_ev(0)]})
        store.delete("nobody")
        _expect_equal(store.sessions(), ["t"], 'store.sessions() == ["t"]')

    def test_a_deleted_session_can_be_written_again_from_seq_0(self, store: Store) -> None:
        """After delete, the session's seqs are free again."""
        store.write({"s": [_ev(0), _ev(1)]})
        store.delete("s")
        _expect_equal(
            store.write({"s": [_ev(0, data={"content": "new"})]}),
            {},
            'store.write({"s": [_ev(0, data={"content": "new"})]}) == {}',
        )
        _expect_equal(
            store.load("s")[0].data,
            {"content": "new"},
            'store.load("s")[0].data == {"content": "new"}',
        )

    # -- claims ------------------------------------------------------------------------

    def test_claim_returns_a_token(self, store: Store) -> None:
        """claim succeeds on a free session and returns a str token."""
        token = store.claim("s")
        _check(isinstance(token, str), f"claim() returns a str token, got {token!r}")

    def test_a_second_claim_is_refused_with_conflict_error(self, store: Store) -> None:
        """While a claim is held, another claim of that session raises ConflictError."""
        store.claim("s")
        _refused_claim(
            store,
            "s",
            "one live writer per session: while a claim of 's' is held, another claim of it "
            "returned a token",
        )

    def test_claim_after_release_succeeds(self, store: Store) -> None:
        """Releasing with the claim's token frees the session for the next claim."""
        token = store.claim("s")
        store.release("s", token)
        second = store.claim("s")
        _check(
            second != token,
            f"each claim takes a new token: a claim after release gave {token!r} again, "
            "so the old holder's stale token would release the new claim",
        )

    def test_release_with_a_stale_token_is_a_no_op(self, store: Store) -> None:
        """An old token releases nothing: the current holder keeps the session."""
        old = store.claim("s")
        store.release("s", old)
        store.claim("s")
        store.release("s", old)
        _refused_claim(
            store,
            "s",
            "release with a stale token is a no-op: a token released once, given again, "
            "freed the claim taken since (free a session only for the token that holds it)",
        )

    def test_release_of_an_unclaimed_session_is_a_no_op(self, store: Store) -> None:
        """Releasing a session nobody claimed raises nothing and changes nothing."""
        store.release("s", "not-a-token")
        store.claim("s")

    def test_release_of_one_session_leaves_other_claims(self, store: Store) -> None:
        """Claims are per session: releasing one leaves the other held."""
        a = store.claim("a")
        store.claim("b")
        store.release("a", a)
        store.claim("a")
        _refused_claim(
            store,
            "b",
            "claims are per session: releasing 'a' freed 'b' too (its claim was then taken again)",
        )

    def test_a_token_releases_its_own_session_only(self, store: Store) -> None:
        """``release(session_id, token)`` frees ``session_id`` alone: a token of another
        session, given with this one, releases neither (the token does not hold it)."""
        a = store.claim("a")
        store.claim("b")
        store.release("b", a)
        for sid in ("a", "b"):
            _refused_claim(
                store,
                sid,
                f"release('b', token of 'a') must release nothing (the token does not hold "
                f"'b'), yet a claim of {sid!r} then returned a token: free a session only "
                "when the token given is the one that holds that session",
            )
        store.release("a", a)

    def test_a_claim_is_not_a_session_with_events(self, store: Store) -> None:
        """Claiming stores no event: the session is not listed and loads as []."""
        store.claim("s")
        _expect_equal(store.sessions(), [], "store.sessions() == []")
        _expect_equal(store.load("s"), [], 'store.load("s") == []')

    def test_writes_do_not_need_a_claim(self, store: Store) -> None:
        """A claim coordinates writers; write itself works with or without one."""
        _expect_equal(store.write({"s": [_ev(0)]}), {}, 'store.write({"s": [_ev(0)]}) == {}')
        store.claim("s")
        _expect_equal(store.write({"s": [_ev(1)]}), {}, 'store.write({"s": [_ev(1)]}) == {}')

    def test_delete_also_drops_the_writer_claim(self, store: Store) -> None:
        """After delete, the session can be claimed again."""
        store.write({"s": [_ev(0)]})
        store.claim("s")
        store.delete("s")
        store.claim("s")

    # -- closed --------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "call",
        [c for _, c in _CALLS_ON_A_CLOSED_STORE],
        ids=[n for n, _ in _CALLS_ON_A_CLOSED_STORE],
    )
    def test_a_closed_store_raises_store_error(
        self, store: Store, call: Callable[[Store], object]
    ) -> None:
        """After close(), every call raises StoreError (not a backend's own error)."""
        store.write({"a": [_ev(0)]})
        store.close()
        with pytest.raises(StoreError):
            call(store)

    def test_release_on_a_closed_store_does_not_raise(self, store: Store) -> None:
        """release after close is harmless (sessions release while shutting down)."""
        token = store.claim("s")
        store.close()
        try:
            store.release("s", token)
        except StoreError:
            pass

    # == Transfer: export and import, and the backend's errors raised as StoreError ==========

    # -- export and import ----------------------------------------------------------------

    def test_export_then_import_round_trips_a_session(self, store: Store) -> None:
        """import_session(export_session(...)) under a new id stores the same events."""
        log = _varied_log().snapshot()
        store.write({"s": log.events()})
        text = export_session(store, "s")
        _expect_equal(
            import_session(store, "copy", text),
            len(log.events()),
            'import_session(store, "copy", text) == len(log.events())',
        )
        assert_same_events(store.load("copy"), store.load("s"))

    def test_export_is_json_lines_with_one_event_a_line(self, store: Store) -> None:
        """export_session gives one JSON record per stored event, each line ending in \\n."""
        events = list(_varied_log().events())
        store.write({"s": events})
        text = export_session(store, "s")
        _expect(text.endswith("\n"), 'text.endswith("\\n")')
        lines = text[:-1].split("\n")
        _expect_equal(
            [loads_event(line) for line in lines],
            events,
            "[loads_event(line) for line in lines] == events",
        )
        replace = json.loads(lines[-2])
        _expect_equal(
            replace["data"]["surface_op"],
            ["replace", 1, 7],
            'replace["data"]["surface_op"] == ["replace", 1, 7]',
        )

    def test_export_of_a_session_without_events_raises_store_error(self, store: Store) -> None:
        """There is nothing to export from a session with no events: StoreError."""
        with pytest.raises(StoreError):
            export_session(store, "nobody")

    def test_import_of_a_v1_message_list_seeds_the_session(self, store: Store) -> None:
        """A v1 JSON list of messages imports through Log.seed, one event per message."""
        when = "2026-01-01T00:00:00.000001+00:00"
        v1 = [
            {"role": "system", "content": "be brief", "created_at": when},
            {"role": "user", "content": "hi", "created_at": when},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
                "created_at": when,
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1", "created_at": when},
        ]
        expected = from_v1(v1)
        _expect_equal(
            import_session(store, "v1", json.dumps(v1)),
            4,
            'import_session(store, "v1", json.dumps(v1)) == 4',
        )
        loaded = store.load("v1")
        assert_same_events(loaded, expected.events())
        rebuilt = Log()
        for ev in loaded:
            rebuilt = rebuilt.append_event(ev)
        _expect_equal(
            [m.role.value for m in rebuilt.derive_messages()],
            ["system", "user", "assistant", "tool"],
            "the roles of the imported messages",
        )
        _expect_equal(
            rebuilt.derive_messages(),
            expected.derive_messages(),
            "rebuilt.derive_messages() == expected.derive_messages()",
        )

    def test_import_into_a_session_with_events_raises_conflict_error(self, store: Store) -> None:
        """Importing over existing events is refused with ConflictError and changes nothing."""
        store.write({"s": [_ev(0), _ev(1)]})
        text = export_session(store, "s")
        store.write({"t": [_ev(0, data={"content": "mine"})]})
        with pytest.raises(ConflictError):
            import_session(store, "t", text)
        assert_same_events(store.load("t"), [_ev(0, data={"content": "mine"})])

    def test_import_of_malformed_text_raises_codec_error_and_stores_nothing(
        self, store: Store
    ) -> None:
        """Text that is not a session raises CodecError; no event is stored."""
        good = _jsonl([_ev(0)])
        with pytest.raises(CodecError):
            import_session(store, "s", good + "{not json}\n")
        _expect_equal(store.load("s"), [], 'store.load("s") == []')
        _expect_equal(store.sessions(), [], "store.sessions() == []")

    # -- errors are StoreError, never the backend's own ---------------------------------------

    @pytest.mark.parametrize(
        "session_id",
        [
            "",
            "with space",
            "ünïcødé-日本",
            "a/b\\c",
            "'; DROP TABLE events; --",
            "%_*?",
            "x" * 1000,
            "nul\x00inside",
        ],
    )
    def test_any_str_session_id_round_trips_or_raises_store_error(
        self, store: Store, session_id: str
    ) -> None:
        """An awkward session id either works like any other or is refused with StoreError."""
        _stored_or_store_error(store, session_id, [_ev(0), _ev(1)])

    def test_a_session_id_with_a_lone_surrogate_round_trips_or_raises_store_error(
        self, store: Store
    ) -> None:
        """A str id holding a lone surrogate either works or is refused with StoreError."""
        _stored_or_store_error(store, "lone-\udc80", [_ev(0)])
        for call in (
            lambda: store.load("lone-\udc80"),
            lambda: store.claim("lone-\udc80"),
            lambda: store.delete("lone-\udc80"),
        ):
            with contextlib.suppress(StoreError):
                call()

    def test_a_seq_past_64_bits_round_trips_or_raises_store_error(self, store: Store) -> None:
        """A seq of 2**63 (past what `Event` accepts, so made past its checks) is
        stored or refused with StoreError."""
        _stored_or_store_error(store, "s", [_poisoned(0, "seq")])

    def test_the_largest_64_bit_seq_round_trips(self, store: Store) -> None:
        """Seq 2**63 - 1 loads back as written."""
        events = [_ev(0), _ev(2**63 - 1)]
        store.write({"s": events})
        assert_same_events(store.load("s"), events)

    def test_large_data_round_trips(self, store: Store) -> None:
        """An event with a megabyte of text loads back equal."""
        events = [_ev(0, "tool_result", {"content": "x" * 1_000_000, "tool_call_id": "c"})]
        store.write({"s": events})
        assert_same_events(store.load("s"), events)

    # == Sharing: the optional methods for other processes (nous_actor.store.shared) =========

    # -- sharing with other processes (nous_actor.store.shared; optional methods) ------

    def test_load_since_reads_a_suffix_without_a_claim(self, store: Store) -> None:
        """``load_since`` gives the stored events from a seq on, in order, while another
        writer holds the session (a read never needs the claim)."""
        events = [_ev(i) for i in range(6)]
        store.write({"s": events})
        token = store.claim("s")
        try:
            assert_same_events(shared.load_since(store, "s", 2), events[2:])
            assert_same_events(shared.load_since(store, "s", 0), events)
            _expect_equal(
                shared.load_since(store, "s", 6), [], 'shared.load_since(store, "s", 6) == []'
            )
            _expect_equal(
                shared.load_since(store, "unknown", 0),
                [],
                'shared.load_since(store, "unknown", 0) == []',
            )
        finally:
            store.release("s", token)

    def test_next_seq_counts_without_a_claim(self, store: Store) -> None:
        """``next_seq`` is the last stored seq + 1 (0 for a session with no events), read
        while another writer holds the session."""
        store.write({"s": [_ev(i) for i in range(6)]})
        token = store.claim("s")
        try:
            _expect_equal(shared.next_seq(store, "s"), 6, 'shared.next_seq(store, "s") == 6')
            _expect_equal(
                shared.next_seq(store, "unknown"), 0, 'shared.next_seq(store, "unknown") == 0'
            )
        finally:
            store.release("s", token)

    def test_load_since_and_next_seq_go_by_seq_across_gaps(self, store: Store) -> None:
        """``load_since`` selects by seq, not by position, and ``next_seq`` is the last
        seq + 1, not a count: the stored seqs may have gaps (a seq written past the head,
        events a snapshot dropped)."""
        store.write({"s": [_ev(0), _ev(1), _ev(2), _ev(5), _ev(6), _ev(9)]})
        store.drop("s", [1, 2])
        for from_seq, want in ((0, [0, 5, 6, 9]), (1, [5, 6, 9]), (3, [5, 6, 9]), (6, [6, 9])):
            _same(
                [e.seq for e in shared.load_since(store, "s", from_seq)],
                want,
                f"load_since(from_seq={from_seq}) gives the stored events with seq >= "
                f"{from_seq} (stored seqs 0, 5, 6, 9): select them by seq, not by position",
            )
        _same(
            shared.next_seq(store, "s"),
            10,
            "next_seq is the last stored seq + 1 (stored seqs 0, 5, 6, 9), not how many "
            "events are stored",
        )

    def test_load_since_refuses_a_bad_seq(self, store: Store) -> None:
        """``from_seq`` must be an int >= 0."""
        with pytest.raises(ValueError, match="from_seq"):
            shared.load_since(store, "s", -1)
        with pytest.raises(TypeError, match="from_seq"):
            shared.load_since(store, "s", "0")  # type: ignore[arg-type]

    def test_a_watch_catches_up_then_follows_exactly_once_in_order(self, store: Store) -> None:
        """A watch gives the stored events from ``from_seq``, then each committed one, each
        exactly once, in seq order."""
        store.write({"s": [_ev(i) for i in range(3)]})
        with shared.watch(store, "s", 1) as feed:
            store.write({"s": [_ev(3), _ev(4)]})
            store.write({"other": [_ev(0)]})
            what = "a watch from seq 1 of a session holding seqs 0 to 4"
            got = [_next_event(feed, what).seq for _ in range(4)]
            _expect_equal(got, [1, 2, 3, 4], "the seqs the watch gave == [1, 2, 3, 4]")
            store.write({"s": [_ev(5)]})
            _expect_equal(
                _next_event(feed, "a watch, after seq 5 was written").seq,
                5,
                "the seq the watch gave after seq 5 was written == 5",
            )
            extra = feed.get_nowait()
            _check(
                extra is None,
                f"a watch gives each event once: it gave seq {getattr(extra, 'seq', extra)} "
                "after seqs 1 to 5",
            )

    def test_a_watch_from_past_the_head_gives_nothing_below_its_seq(self, store: Store) -> None:
        """A watch may start past the session's head: it gives the events from its
        ``from_seq`` as they commit, none below."""
        store.write({"s": [_ev(i) for i in range(3)]})
        with shared.watch(store, "s", 5) as feed:
            store.write({"s": [_ev(i) for i in range(3, 8)]})
            what = "a watch from seq 5 of a session holding seqs 0 to 2, then 3 to 7"
            got = [_next_event(feed, what).seq for _ in range(3)]
            _same(
                got,
                [5, 6, 7],
                "a watch gives the committed events with seq >= its from_seq, even when "
                "from_seq was past the head when it started: the seqs it gave",
            )

    def test_a_watch_of_a_session_without_events_waits_for_its_first(self, store: Store) -> None:
        """A watch may start before the session has any event."""
        with shared.watch(store, "later") as feed:
            store.write({"later": [_ev(0, data={"content": "first"})]})
            ev = _next_event(feed, "a watch started before its session had any event")
        _expect_equal(
            (ev.seq, ev.data["content"]),
            (0, "first"),
            '(ev.seq, ev.data["content"]) == (0, "first")',
        )

    def test_wait_changed_returns_after_a_write(self, store: Store) -> None:
        """``wait_changed`` returns a larger counter once something was written, well
        within its bound."""
        seen = shared.wait_changed(store, -1, 0.0)
        store.write({"s": [_ev(0)]})
        started = time.monotonic()
        now = shared.wait_changed(store, seen, 10.0)
        _check(now > seen, f"wait_changed after a write gives a larger counter: {seen} then {now}")
        waited = time.monotonic() - started
        _check(waited < 5.0, f"wait_changed returned {waited:.1f} s after a write, not at once")

    def test_held_by_names_a_live_claim_only(self, store: Store) -> None:
        """A store that offers ``held_by`` names the holder of a claimed session, and
        nobody once it was released."""
        if not callable(getattr(store, "held_by", None)):
            pytest.skip("the store has no held_by (optional)")
        _expect(shared.held_by(store, "s") is None, 'shared.held_by(store, "s") is None')
        token = store.claim("s")
        holder = shared.held_by(store, "s")
        _check(
            isinstance(holder, str) and holder,
            f"held_by names the holder of a claimed session (a non-empty str), got {holder!r}",
        )
        store.release("s", token)
        _expect(shared.held_by(store, "s") is None, 'shared.held_by(store, "s") is None')

    def test_a_claim_carries_the_address_advertised(self, store: Store) -> None:
        """A store that keeps holders' addresses (``advertise``, ``holder_address``)
        writes the address advertised with each claim it takes, and into the claims it
        holds when advertised again; nobody holds a released session."""
        if not shared.supports_forwarding(store):
            pytest.skip("the store keeps no holders' addresses (optional)")
        _expect(
            shared.holder_address(store, "s") is None, 'shared.holder_address(store, "s") is None'
        )
        shared.advertise(store, "addr-1")
        token = store.claim("s")
        try:
            found = shared.holder_address(store, "s")
            if found is None:
                raise AssertionError(
                    "holder_address names the holder of a claimed session and the "
                    "address it advertised: it gave None for a session this store claimed "
                    "after advertise('addr-1')"
                )
            holder, address = found
            _expect_equal(
                holder, shared.held_by(store, "s"), 'holder == shared.held_by(store, "s")'
            )
            _expect_equal(address, "addr-1", 'address == "addr-1"')
            shared.advertise(store, "addr-2")
            _expect_equal(
                shared.holder_address(store, "s"),
                (holder, "addr-2"),
                'shared.holder_address(store, "s") == (holder, "addr-2")',
            )
            shared.advertise(store, None)
            _expect_equal(
                shared.holder_address(store, "s"),
                (holder, None),
                'shared.holder_address(store, "s") == (holder, None)',
            )
        finally:
            store.release("s", token)
        _expect(
            shared.holder_address(store, "s") is None, 'shared.holder_address(store, "s") is None'
        )

    def test_advertise_refuses_what_is_not_an_address(self, store: Store) -> None:
        """An address is a str (or ``None``); anything else is refused with nothing
        changed."""
        if not shared.supports_forwarding(store):
            pytest.skip("the store keeps no holders' addresses (optional)")
        shared.advertise(store, "addr")
        with pytest.raises(TypeError):
            shared.advertise(store, 42)  # type: ignore[arg-type]
        token = store.claim("s")
        try:
            _expect_equal(
                shared.holder_address(store, "s"),
                (shared.held_by(store, "s"), "addr"),
                'shared.holder_address(store, "s") == (shared.held_by(store, "s"), "addr")',
            )
        finally:
            store.release("s", token)

    def test_the_forwarding_key_is_stable(self, store: Store) -> None:
        """A store with a secret gives the same 32 bytes at every call."""
        own = getattr(store, "forwarding_key", None)
        if not callable(own):
            pytest.skip("the store has no forwarding key (optional)")
        first = shared.forwarding_key(store)
        if not isinstance(first, bytes) or len(first) != 32:
            raise AssertionError(f"forwarding_key() gives 32 bytes, got {first!r}")
        _expect_equal(shared.forwarding_key(store), first, "shared.forwarding_key(store) == first")

    def test_a_write_in_the_store_s_turn_takes_no_other(self, store: Store) -> None:
        """Inside ``write_turn()`` (or its fallback), this thread's write is stored and
        answers: it takes no second turn (a turn that waited for itself would hang)."""
        done: list[dict[str, StoreError]] = []

        def in_turn() -> None:
            with shared.write_turn(store) as came:
                _expect(isinstance(came, bool), "isinstance(came, bool)")
                done.append(store.write({"t": [_ev(0)]}))

        writer = threading.Thread(target=in_turn, daemon=True)
        writer.start()
        writer.join(10)
        _check(not writer.is_alive(), "a write inside write_turn() waited for another turn")
        _expect_equal(done, [{}], "done == [{}]")
        _expect_equal(
            [e.seq for e in store.load("t")], [0], '[e.seq for e in store.load("t")] == [0]'
        )

    def test_handoff_requests_are_sessions_this_store_holds(self, store: Store) -> None:
        """Asking, withdrawing and listing requests work on claimed and unclaimed
        sessions alike; only sessions this store holds are ever listed."""
        token = store.claim("held")
        try:
            shared.ask_handoff(store, "held", 5.0)
            shared.ask_handoff(store, "free", 5.0)
            _expect(
                set(shared.handoff_requests(store)) <= {"held"},
                'set(shared.handoff_requests(store)) <= {"held"}',
            )
            shared.withdraw_handoff(store, "held")
            shared.withdraw_handoff(store, "free")
            shared.withdraw_handoff(store, "never-asked")
        finally:
            store.release("held", token)
        _expect_equal(shared.handoff_requests(store), [], "shared.handoff_requests(store) == []")

    def test_index_pages_and_filters_in_id_order(self, store: Store) -> None:
        """``list_sessions`` with ``prefix``, ``after`` and ``limit`` pages through the ids
        in order, and names the holder of a claimed session where the store can tell."""
        ids = ["app:b", "app:a", "user:x", "app:c", "apple"]
        for sid in ids:
            store.write({sid: [_ev(0), _ev(1)]})
        token = store.claim("app:b")
        try:
            every = list_sessions(store)
            _expect_equal(
                [i.session_id for i in every],
                sorted(ids),
                "[i.session_id for i in every] == sorted(ids)",
            )
            _expect(
                all((i.events, i.next_seq, i.error) == (2, 2, None) for i in every),
                "all((i.events, i.next_seq, i.error) == (2, 2, None) for i in every)",
            )
            pages: list[str] = []
            after: str | None = None
            while True:
                page = list_sessions(store, prefix="app:", after=after, limit=2)
                if not page:
                    break
                _expect(len(page) <= 2, "len(page) <= 2")
                pages += [i.session_id for i in page]
                after = page[-1].session_id
            _expect_equal(
                pages, ["app:a", "app:b", "app:c"], 'pages == ["app:a", "app:b", "app:c"]'
            )
            _expect_equal(list_sessions(store, limit=0), [], "list_sessions(store, limit=0) == []")
            holders = {i.session_id: i.holder for i in every}
            if callable(getattr(store, "held_by", None)):
                _expect(holders["app:b"] is not None, 'holders["app:b"] is not None')
            _expect(holders["app:a"] is None, 'holders["app:a"] is None')
        finally:
            store.release("app:b", token)

    def test_index_refuses_bad_page_arguments(self, store: Store) -> None:
        """``prefix``, ``after`` and ``limit`` are checked before the store is read."""
        with pytest.raises(TypeError, match="prefix"):
            list_sessions(store, prefix=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="after"):
            list_sessions(store, after=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="limit"):
            list_sessions(store, limit=-1)

    def test_reads_and_watches_of_a_closed_store_raise_store_error(self, store: Store) -> None:
        """A closed store refuses ``load_since`` and ``watch`` with StoreError."""
        self.close_store(store)
        with pytest.raises(StoreError):
            shared.load_since(store, "s", 0)
        with pytest.raises(StoreError):
            shared.watch(store, "s")

    # == Peers: two store objects on one backend (what two processes sharing it have) =======

    # These tests take a second store object from `make_peer` and skip without one.

    def test_a_peer_reads_what_the_store_wrote(self, store: Store, peer: Store) -> None:
        """Two store objects on one backend are one store: what either writes, the other
        loads and lists."""
        rule = (
            "make_peer(store) must return a second store object on the same backend as "
            "store (the same file, the same database and schema), whose reads see every "
            "write of the other"
        )
        events = [_ev(0), _ev(1)]
        _same(store.write({"a": events}), {}, "a write of a free session stores it")
        try:
            assert_same_events(peer.load("a"), events)
        except AssertionError as exc:
            raise AssertionError(
                f"{rule}: the peer's load of what the store wrote: {exc}"
            ) from None
        _same(peer.sessions(), ["a"], f"{rule}: the peer's sessions()")
        _same(peer.write({"b": [_ev(0)]}), {}, "a write of a free session stores it")
        _same(
            [e.seq for e in store.load("b")], [0], f"{rule}: the store's load of the peer's write"
        )
        _same(store.sessions(), ["a", "b"], f"{rule}: the store's sessions()")

    def test_a_claim_held_by_one_object_is_refused_to_the_other(
        self, store: Store, peer: Store
    ) -> None:
        """One live writer per session across store objects: while one object holds a
        session's claim, a claim through the other raises ConflictError naming the
        session (either way round)."""
        pairs = (("the store", store, "its peer", peer), ("the peer", peer, "the store", store))
        for holder_name, holder, other_name, other in pairs:
            sid = f"held-by-{holder_name.split()[-1]}"
            token = holder.claim(sid)
            try:
                stolen = other.claim(sid)
            except ConflictError as exc:
                _names_its_session(exc, sid, "the ConflictError claim() raised")
            else:
                other.release(sid, stolen)
                raise AssertionError(
                    f"one live writer per session across store objects: {holder_name} holds "
                    f"the claim of {sid!r}, and a claim through {other_name} returned a token "
                    "(it must raise ConflictError): keep claims in the backend, where every "
                    "store object looks (a table of holders, a lease), not in the object"
                )
            holder.release(sid, token)

    def test_a_claim_released_by_one_object_can_be_taken_by_the_other(
        self, store: Store, peer: Store
    ) -> None:
        """A release frees the session for every object of the backend: the other takes
        it, holds it against the first, and frees it the same way."""
        token = store.claim("s")
        store.release("s", token)
        try:
            theirs = peer.claim("s")
        except ConflictError:
            raise AssertionError(
                "a released claim frees its session for every store object of the backend: "
                "the store released 's' and a claim through its peer was refused; release "
                "must remove the claim from the backend (where the peer looks)"
            ) from None
        _refused_claim(
            store,
            "s",
            "one live writer per session across store objects: the peer took 's' after the "
            "store released it, and a new claim through the store returned a token",
        )
        peer.release("s", theirs)
        store.release("s", store.claim("s"))

    def test_a_stale_token_releases_nothing_the_other_object_holds(
        self, store: Store, peer: Store
    ) -> None:
        """A token that no longer holds its session releases nothing, whichever object it
        is given to: the object that took the session since keeps it."""
        old = store.claim("s")
        store.release("s", old)
        theirs = peer.claim("s")
        store.release("s", old)
        peer.release("s", old)
        for name, obj in (("the store", store), ("the peer", peer)):
            _refused_claim(
                obj,
                "s",
                f"release with a stale token is a no-op: after the store released 's' with "
                f"it again, a claim through {name} returned a token while the peer held the "
                "session (release must free a session only for the token that holds it)",
            )
        peer.release("s", theirs)

    def test_claims_of_one_session_through_both_objects_at_once_give_it_one_writer(
        self, store: Store, peer: Store
    ) -> None:
        """One live writer per session holds under contention across store objects: of
        threads claiming one session at the same moment, half through the store and half
        through its peer, exactly one gets a token; every other gets ConflictError."""
        objects = (store, peer)
        for rnd in range(_RACE_ROUNDS):
            sid = f"peer-claim-race-{rnd}"

            def claim(n: int, sid: str = sid) -> str:
                return objects[n % 2].claim(sid)

            got = _at_once(_RACERS, "claim() through two store objects", claim)
            other = [r for r in got if not isinstance(r, str | ConflictError)]
            _check(
                not other,
                "claim() of a held session raises ConflictError and returns a str token "
                f"otherwise; under {_RACERS} claims at once through two store objects it "
                f"gave {other!r}",
            )
            won = [n for n, r in enumerate(got) if isinstance(r, str)]
            _check(
                len(won) == 1,
                f"one live writer per session across store objects: {_RACERS} threads "
                f"claimed {sid!r} at once through the store and its peer, and {len(won)} "
                "got a token (exactly one must): a claim must check that the session is "
                "free and take it in one step of the backend (one transaction), not of "
                "the store object",
            )
            for r in got:
                if isinstance(r, ConflictError):
                    _names_its_session(r, sid, "the ConflictError claim() raised")
            token = got[won[0]]
            assert isinstance(token, str)  # (for the type checker: checked just above)
            objects[won[0] % 2].release(sid, token)

    def test_a_seq_the_other_object_stored_is_refused_with_conflict_error(
        self, store: Store, peer: Store
    ) -> None:
        """A seq is stored once, whichever object writes it: a write through the peer
        of a seq the store stored returns ConflictError naming the session, and stores
        none of its events."""
        store.write({"s": [_ev(0), _ev(1)]})
        refused = peer.write({"s": [_ev(2), _ev(1, data={"content": "other"})]})
        _check(
            isinstance(refused.get("s"), ConflictError),
            "a seq already stored is refused with ConflictError whichever store object "
            f"writes it: the peer wrote seq 1, which the store had stored, and got {refused!r} "
            "(check the seqs in the backend, e.g. a primary key on (session, seq))",
        )
        _names_its_session(refused["s"], "s", "the ConflictError write() returned")
        _same(
            [e.seq for e in store.load("s")],
            [0, 1],
            "a refused write stores none of its events (seen through the other object)",
        )

    def test_a_watch_of_one_object_follows_the_other_objects_commits(
        self, store: Store, peer: Store
    ) -> None:
        """A watch through the peer gives what the store commits, each event exactly
        once, in seq order; ``load_since`` and ``next_seq`` of the peer see it too."""
        store.write({"s": [_ev(0)]})
        with shared.watch(peer, "s") as feed:
            store.write({"s": [_ev(1), _ev(2)]})
            store.write({"s": [_ev(3)]})
            got = [
                _next_event(feed, "a watch through the peer of what the store commits").seq
                for _ in range(4)
            ]
            _same(
                got,
                [0, 1, 2, 3],
                "a watch gives every committed event of its session exactly once, in seq "
                "order, whichever store object committed it: the seqs a watch through the "
                "peer gave",
            )
        _same(
            [e.seq for e in shared.load_since(peer, "s", 2)],
            [2, 3],
            "load_since through the peer sees what the store committed",
        )
        _same(
            shared.next_seq(peer, "s"),
            4,
            "next_seq through the peer counts what the store committed",
        )

    def test_delete_is_refused_while_the_other_object_holds_the_session(
        self, store: Store, peer: Store
    ) -> None:
        """Deleting a session another object holds would fork it under its live writer:
        delete raises ConflictError naming the session and deletes nothing; once the
        holder released it, delete works."""
        store.write({"s": [_ev(0), _ev(1)]})
        token = peer.claim("s")
        try:
            store.delete("s")
        except ConflictError as exc:
            _names_its_session(exc, "s", "the ConflictError delete() raised")
        else:
            raise AssertionError(
                "delete of a session another store object holds must raise ConflictError "
                "(the holder would go on writing a session that was deleted under it): the "
                "peer held 's' and the store deleted it; look for a live holder in the same "
                "transaction as the delete, and refuse unless it is this object"
            )
        _same([e.seq for e in peer.load("s")], [0, 1], "a refused delete deletes nothing")
        peer.release("s", token)
        store.delete("s")
        _same(peer.load("s"), [], "delete after the holder released the session")

    def test_drop_is_refused_while_the_other_object_holds_the_session(
        self, store: Store, peer: Store
    ) -> None:
        """Only a session's holder drops its events (a snapshot): drop through another
        object raises ConflictError naming the session and drops nothing; the holder's
        own drop works."""
        store.write({"s": [_ev(0), _ev(1), _ev(2)]})
        token = peer.claim("s")
        try:
            store.drop("s", [0])
        except ConflictError as exc:
            _names_its_session(exc, "s", "the ConflictError drop() raised")
        else:
            raise AssertionError(
                "drop of a session another store object holds must raise ConflictError "
                "(only the holder snapshots it): the peer held 's' and the store dropped "
                "seq 0 of it; look for a live holder in the same transaction as the drop, "
                "and refuse unless it is this object"
            )
        _same([e.seq for e in peer.load("s")], [0, 1, 2], "a refused drop drops nothing")
        peer.drop("s", [0])
        _same(
            [e.seq for e in store.load("s")], [1, 2], "the holder's drop, seen by the other object"
        )
        peer.release("s", token)

    def test_held_by_of_one_object_names_the_other_objects_claim(
        self, store: Store, peer: Store
    ) -> None:
        """A store that offers ``held_by`` names a holder whichever object holds the
        session, and nobody once it was released."""
        if not callable(getattr(peer, "held_by", None)):
            pytest.skip("the store has no held_by (optional)")
        token = store.claim("s")
        holder = shared.held_by(peer, "s")
        _check(
            isinstance(holder, str) and holder,
            "held_by names the live holder of a session, whichever store object holds it: "
            f"the store held 's' and the peer's held_by gave {holder!r}",
        )
        store.release("s", token)
        _same(shared.held_by(peer, "s"), None, "held_by after the holder released the session")

    # == Threads and the stateful test =======================================================

    # -- threads -------------------------------------------------------------------------

    def test_calls_from_several_threads_at_once_are_safe(self, store: Store) -> None:
        """Writes, loads and claims from several threads at once all take effect."""
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def worker(n: int) -> None:
            sid = f"w{n}"
            try:
                barrier.wait(10)
                token = store.claim(sid)
                for i in range(25):
                    _expect_equal(
                        store.write({sid: [_ev(i)]}), {}, "store.write({sid: [_ev(i)]}) == {}"
                    )
                    _expect_equal(len(store.load(sid)), i + 1, "len(store.load(sid)) == i + 1")
                    store.sessions()
                store.release(sid, token)
            except BaseException as exc:  # reported in the test's thread
                errors.append(exc)

        workers = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        _check(not any(w.is_alive() for w in workers), "a worker thread hung")
        _check(
            not errors,
            f"calls from several threads at once must all take effect; they raised {errors!r}",
        )
        _expect_equal(
            store.sessions(),
            ["w0", "w1", "w2", "w3"],
            'store.sessions() == ["w0", "w1", "w2", "w3"]',
        )
        for n in range(4):
            assert_same_events(store.load(f"w{n}"), [_ev(i) for i in range(25)])

    def test_claims_of_one_session_at_once_give_it_one_writer(self, store: Store) -> None:
        """One live writer per session holds under contention: of several threads
        claiming one session at the same moment, exactly one gets a token and every
        other gets ConflictError naming the session (a claim that checks the session is
        free, then takes it, in two steps lets two threads both in). The store is left
        consistent: the winner writes, the session stays held until it releases, then
        a new claim succeeds."""
        for rnd in range(_RACE_ROUNDS):
            sid = f"claim-race-{rnd}"

            def claim(_n: int, sid: str = sid) -> str:
                return store.claim(sid)

            got = _at_once(_RACERS, "claim()", claim)
            tokens = [r for r in got if isinstance(r, str)]
            refused = [r for r in got if isinstance(r, ConflictError)]
            other = [r for r in got if not isinstance(r, str | ConflictError)]
            _check(
                not other,
                f"claim() of a held session raises ConflictError and returns a str token "
                f"otherwise; under {_RACERS} claims at once it gave {other!r}",
            )
            _check(
                len(tokens) == 1,
                f"one live writer per session: {_RACERS} threads claimed {sid!r} at once "
                f"and {len(tokens)} got a token (exactly one must; every other claim must "
                "raise ConflictError): claim must check that the session is free and take "
                "it in one step (under one lock, or in one transaction)",
            )
            for exc in refused:
                _names_its_session(exc, sid, "the ConflictError claim() raised")
            (token,) = tokens
            _check(store.write({sid: [_ev(0)]}) == {}, "the claim's winner must be able to write")
            _refused_claim(
                store,
                sid,
                f"the winner of the race still holds {sid!r}, yet a new claim returned a token",
            )
            store.release(sid, token)
            again = store.claim(sid)
            _check(again != token, "a claim after the winner released takes a new token")
            store.release(sid, again)
            _expect_equal(
                [e.seq for e in store.load(sid)], [0], "[e.seq for e in store.load(sid)] == [0]"
            )

    def test_writes_of_one_seq_at_once_store_exactly_one(self, store: Store) -> None:
        """A conflict is refused under contention: of several threads writing the same
        seqs of one session at the same moment, exactly one write returns ``{}`` and every
        other returns a ConflictError for that session (a write that checks the seqs are
        free, then stores them, in two steps lets two writers both in); the stored events
        are the winner's, all of them, and the session takes its next seq."""

        def mine(n: int) -> list[Event]:
            return [_ev(seq, data={"content": f"writer {n}, event {seq}"}) for seq in (0, 1)]

        for rnd in range(_RACE_ROUNDS):
            sid = f"write-race-{rnd}"

            def write(n: int, sid: str = sid) -> dict[str, StoreError]:
                return store.write({sid: mine(n)})

            got = _at_once(_RACERS, "write()", write)
            raised = [r for r in got if isinstance(r, BaseException)]
            _check(
                not raised,
                "write() returns a refused session's ConflictError, it does not raise it; "
                f"under {_RACERS} writes of one seq at once it raised {raised!r}",
            )
            answers = [r for r in got if not isinstance(r, BaseException)]
            won = [n for n, r in enumerate(answers) if r == {}]
            _check(
                len(won) == 1,
                f"{_RACERS} threads wrote seqs 0 and 1 of {sid!r} at once and {len(won)} "
                "writes returned {} (exactly one must; every other must return a "
                "ConflictError for the session): write must check that the seqs are free "
                "and store them in one step (under one lock, or in one transaction)",
            )
            for n, answer in enumerate(answers):
                if n in won:
                    continue
                _check(set(answer) == {sid}, f"a write of {sid!r} alone returned {answer!r}")
                _check(
                    isinstance(answer[sid], ConflictError),
                    f"a write of seqs another writer stored returns ConflictError, got {answer!r}",
                )
                _names_its_session(answer[sid], sid, "the ConflictError write() returned")
            try:
                assert_same_events(store.load(sid), mine(won[0]))
            except AssertionError as exc:
                raise AssertionError(
                    f"the stored events of {sid!r} must be all those of the one write that "
                    f"succeeded (writer {won[0]}), and no other's: {exc}"
                ) from None
            _expect_equal(store.write({sid: [_ev(2)]}), {}, "store.write({sid: [_ev(2)]}) == {}")
            _expect_equal(
                [e.seq for e in store.load(sid)],
                [0, 1, 2],
                "[e.seq for e in store.load(sid)] == [0, 1, 2]",
            )

    # -- the stateful test ---------------------------------------------------------------

    @pytest.mark.usefixtures("_contract_tmp_path")
    def test_agrees_with_a_model_under_random_operations(self) -> None:
        """Random writes, conflicts, drops, deletes and claims leave the store equal to a
        plain dict model after every step (see `StoreMachine`)."""
        machine = store_machine(self.make_store, self.close_store)
        run_state_machine_as_test(machine, settings=self.machine_settings())
