"""The store contract: what is written loads back exactly, and a conflicting write
is refused per session."""

from __future__ import annotations

from typing import Any

import pytest

from nous_actor.core.event import Replace
from nous_actor.core.log import Log
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store.base import Store
from nous_actor.testing.store_machine import assert_same_events
from nous_actor.testing.store_suite._helpers import (
    POISONS,
    _ev,
    _nested,
    _odd_times,
    _poisoned,
    _varied_log,
)


class WriteRules:
    """Write and load; conflicts (per-session atomicity)."""

    # -- write and load ---------------------------------------------------------------

    def test_is_a_store(self, store: Store) -> None:
        """The store implements the Store protocol (every method is there)."""
        assert isinstance(store, Store)

    def test_a_new_store_is_empty(self, store: Store) -> None:
        """A new store has no sessions, and loading any session gives []."""
        assert store.sessions() == []
        assert store.load("nobody") == []

    def test_written_events_load_back_equal(self, store: Store) -> None:
        """Events of every type load back equal: seq, type, time, data, surface_op."""
        events = list(_varied_log().events())
        assert store.write({"s": events}) == {}
        assert_same_events(store.load("s"), events)

    def test_a_replace_loads_back_as_a_replace(self, store: Store) -> None:
        """A replacing event keeps its surface_op, so the rebuilt surface is the same."""
        log = _varied_log()
        store.write({"s": log.events()})
        loaded = store.load("s")
        replaces = [e for e in loaded if e.surface_op is not None]
        assert [e.surface_op for e in replaces] == [Replace(1, 7)]
        assert list(replaces[0].data["surface_op"]) == ["replace", 1, 7]
        rebuilt = Log()
        for ev in loaded:
            rebuilt = rebuilt.append_event(ev)
        assert rebuilt.derive_indexed() == log.derive_indexed()

    def test_a_replace_far_past_the_head_loads_back(self, store: Store) -> None:
        """A replace whose range starts past its own seq and runs far beyond loads back."""
        ev = _ev(0, "system_message", {"content": "x", "surface_op": ["replace", 3, 10**6]})
        store.write({"s": [ev]})
        assert_same_events(store.load("s"), [ev])
        assert store.load("s")[0].surface_op == Replace(3, 10**6)

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
        assert [e.seq for e in store.load("s")] == [1, 3, 5]

    def test_successive_writes_add_up(self, store: Store) -> None:
        """Each write adds to what the session already holds."""
        store.write({"s": [_ev(0), _ev(1)]})
        store.write({"s": [_ev(2)]})
        store.write({"s": [_ev(3), _ev(4)]})
        assert_same_events(store.load("s"), [_ev(i) for i in range(5)])

    def test_seq_gaps_are_kept(self, store: Store) -> None:
        """Stored seqs need not be contiguous; load gives exactly the seqs written."""
        store.write({"s": [_ev(0), _ev(5), _ev(9)]})
        assert [e.seq for e in store.load("s")] == [0, 5, 9]

    def test_sessions_are_kept_apart(self, store: Store) -> None:
        """One write to several sessions stores each session's events under its own id."""
        a = [_ev(0, data={"content": "a0"}), _ev(1, data={"content": "a1"})]
        b = [_ev(0, data={"content": "b0"})]
        assert store.write({"a": a, "b": b}) == {}
        assert_same_events(store.load("a"), a)
        assert_same_events(store.load("b"), b)
        assert store.load("c") == []

    def test_a_write_with_nothing_to_store_changes_nothing(self, store: Store) -> None:
        """write({}) and a session with no events return {} and create no session."""
        assert store.write({}) == {}
        assert store.write({"empty": []}) == {}
        assert store.sessions() == []
        assert store.load("empty") == []

    def test_loaded_events_are_the_callers(self, store: Store) -> None:
        """Changing the list load returned changes nothing stored."""
        store.write({"s": [_ev(0), _ev(1)]})
        got = store.load("s")
        got.clear()
        assert [e.seq for e in store.load("s")] == [0, 1]

    def test_a_write_is_not_affected_by_later_changes_to_the_callers_list(
        self, store: Store
    ) -> None:
        """The store keeps what was written, not the caller's list object."""
        events = [_ev(0)]
        store.write({"s": events})
        events.append(_ev(1))
        assert [e.seq for e in store.load("s")] == [0]

    # -- conflicts: per-session atomicity ---------------------------------------------------

    def test_a_seq_already_stored_is_refused_with_conflict_error(self, store: Store) -> None:
        """Writing a stored seq again returns a ConflictError for that session."""
        store.write({"s": [_ev(0), _ev(1)]})
        refused = store.write({"s": [_ev(1, data={"content": "other"})]})
        assert set(refused) == {"s"}
        assert isinstance(refused["s"], ConflictError)
        assert_same_events(store.load("s"), [_ev(0), _ev(1)])

    def test_a_refused_write_stores_none_of_its_events(self, store: Store) -> None:
        """A session's write is all or nothing: the fresh seqs beside a stored one stay out."""
        store.write({"s": [_ev(0), _ev(1)]})
        refused = store.write({"s": [_ev(2), _ev(1), _ev(3)]})
        assert isinstance(refused["s"], ConflictError)
        assert [e.seq for e in store.load("s")] == [0, 1]

    def test_a_seq_twice_in_one_write_is_refused(self, store: Store) -> None:
        """Two events with one seq in the same write are a conflict; neither is stored."""
        refused = store.write({"s": [_ev(0), _ev(0, data={"content": "twin"})]})
        assert isinstance(refused["s"], ConflictError)
        assert store.load("s") == []

    def test_a_conflict_names_its_session(self, store: Store) -> None:
        """The ConflictError a write returns carries the session's id."""
        store.write({"s": [_ev(0)]})
        refused = store.write({"s": [_ev(0)]})
        assert refused["s"].session_id == "s"
        assert "s" in str(refused["s"])

    def test_a_conflict_leaves_other_sessions_in_the_same_write_stored(self, store: Store) -> None:
        """Only the conflicting session is refused; the others in that write commit."""
        store.write({"b": [_ev(0)]})
        refused = store.write({"a": [_ev(0)], "b": [_ev(0), _ev(1)], "c": [_ev(0), _ev(1)]})
        assert set(refused) == {"b"}
        assert isinstance(refused["b"], ConflictError)
        assert [e.seq for e in store.load("a")] == [0]
        assert [e.seq for e in store.load("b")] == [0]
        assert [e.seq for e in store.load("c")] == [0, 1]

    def test_the_store_takes_more_writes_after_a_conflict(self, store: Store) -> None:
        """A refused write leaves the store working: the session's next seq still commits."""
        store.write({"s": [_ev(0)]})
        store.write({"s": [_ev(0)]})
        assert store.write({"s": [_ev(1)]}) == {}
        assert [e.seq for e in store.load("s")] == [0, 1]

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
        assert set(refused) <= {"bad"}, refused
        assert [e.seq for e in store.load("a")] == [0, 1]
        assert [e.seq for e in store.load("b")] == [0, 1]
        if "bad" in refused:
            assert isinstance(refused["bad"], StoreError)
            assert refused["bad"].session_id == "bad"
            assert store.load("bad") == []  # none of its events: a session's write is atomic
        assert store.write({"bad": [_ev(5)], "a": [_ev(2)]}) == {}
        assert [e.seq for e in store.load("a")] == [0, 1, 2]

    def test_a_seq_of_2_to_the_63_is_refused_for_its_session(self, store: Store) -> None:
        """Seqs are below 2**63 in every store (SQL's integers are 64-bit): a larger one
        refuses its session's write with StoreError, beside a conflict of another one."""
        store.write({"c": [_ev(0)]})
        refused = store.write({"big": [_poisoned(0, "seq")], "c": [_ev(0)], "ok": [_ev(0)]})
        assert set(refused) == {"big", "c"}
        assert isinstance(refused["c"], ConflictError)
        assert type(refused["big"]) is StoreError
        assert "2**63" in str(refused["big"])
        assert store.load("big") == []
        assert [e.seq for e in store.load("ok")] == [0]
