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
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store import shared
from nous_actor.store.base import Store, export_session, import_session, list_sessions
from nous_actor.testing.store_machine import assert_same_events, store_machine
from nous_actor.testing.store_suite._helpers import (
    _CALLS_ON_A_CLOSED_STORE,
    POISONS,
    _at_once,
    _ev,
    _jsonl,
    _nested,
    _odd_times,
    _poisoned,
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


def _names_its_session(err: BaseException, session_id: str, what: str) -> None:
    """The rule that an error refusing one session names it: ``err.session_id`` (made
    with ``session_id=``), which the registry passes on to its callers as is."""
    got = getattr(err, "session_id", None)
    assert got == session_id, (
        f"{what} must name its session: make it with session_id={session_id!r} "
        f"(its .session_id is {got!r}: {err!r})"
    )


class StoreContract(abc.ABC):
    """Every rule of the ``Store`` protocol, as pytest tests; subclass it per store.

    Implement `make_store`; override `close_store` if closing
    needs more than ``store.close()``, and `machine_settings` to run the
    stateful test longer or shorter.

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

    # == Writes: what is written loads back exactly, and a conflict is refused per session ===

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
        """The ConflictError a write returns carries the session's id (``session_id=``)."""
        store.write({"s": [_ev(0)]})
        refused = store.write({"s": [_ev(0)]})
        assert isinstance(refused.get("s"), ConflictError), (
            f"a seq already stored must refuse its session with ConflictError, got {refused!r}"
        )
        _names_its_session(refused["s"], "s", "the ConflictError write() returned")

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
            assert isinstance(refused["bad"], StoreError), (
                f"write() returns a StoreError for each session it refuses, got {refused!r}"
            )
            _names_its_session(refused["bad"], "bad", "the StoreError write() returned")
            assert store.load("bad") == []  # none of its events: a session's write is atomic
        assert store.write({"bad": [_ev(5)], "a": [_ev(2)]}) == {}
        assert [e.seq for e in store.load("a")] == [0, 1, 2]

    def test_a_seq_of_2_to_the_63_is_refused_for_its_session(self, store: Store) -> None:
        """Seqs are below 2**63 in every store (SQL's integers are 64-bit): a larger one
        refuses its session's write with a StoreError that is not a ConflictError (which
        would say another writer stored that seq: the session would reload and try
        again), naming the session, beside a conflict of another one. Its wording is the
        store's own."""
        store.write({"c": [_ev(0)]})
        refused = store.write({"big": [_poisoned(0, "seq")], "c": [_ev(0)], "ok": [_ev(0)]})
        assert set(refused) == {"big", "c"}, (
            "a seq of 2**63 refuses its own session alone, and a seq already stored its "
            f"own: write() returned {refused!r}"
        )
        assert isinstance(refused["c"], ConflictError), refused
        big = refused["big"]
        rule = (
            "a seq of 2**63 or more is refused with a StoreError that is not a ConflictError "
            f"(no other writer stored it), got {big!r}"
        )
        assert isinstance(big, StoreError), rule
        assert not isinstance(big, ConflictError), rule
        _names_its_session(big, "big", "the StoreError refusing a seq of 2**63")
        assert store.load("big") == [], "a refused session's events are not stored"
        assert [e.seq for e in store.load("ok")] == [0]

    # == Sessions: drop, the list of sessions, delete, the writer claim, a closed store ======

    # -- drop ---------------------------------------------------------------------------

    def test_drop_deletes_exactly_the_given_seqs(self, store: Store) -> None:
        """drop removes the listed seqs of one session and nothing else."""
        store.write({"s": [_ev(i) for i in range(5)], "t": [_ev(i) for i in range(5)]})
        store.drop("s", [1, 3])
        assert [e.seq for e in store.load("s")] == [0, 2, 4]
        assert [e.seq for e in store.load("t")] == [0, 1, 2, 3, 4]

    def test_drop_ignores_unknown_seqs_and_sessions(self, store: Store) -> None:
        """Seqs never stored, and sessions never written, are ignored by drop."""
        store.write({"s": [_ev(0), _ev(1)]})
        store.drop("s", [1, 7, 1000])
        store.drop("nobody", [0])
        store.drop("s", [])
        assert [e.seq for e in store.load("s")] == [0]
        assert store.sessions() == ["s"]

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
        assert rebuilt == small
        assert rebuilt.count() == log.count()
        assert rebuilt.derive_indexed() == log.derive_indexed()

    def test_dropping_every_event_removes_the_session_from_sessions(self, store: Store) -> None:
        """A session left with no events is not listed by sessions()."""
        store.write({"s": [_ev(0), _ev(1)], "t": [_ev(0)]})
        store.drop("s", [0, 1])
        assert store.sessions() == ["t"]

    # -- sessions and delete --------------------------------------------------------------

    def test_sessions_lists_every_id_sorted(self, store: Store) -> None:
        """sessions() lists each id with events once, sorted (code point order)."""
        ids = ["b", "a", "B", "é", "a-1", "a_1", "10", "9", "日本", "a", "zz"]
        for sid in ids:
            store.write({sid: [_ev(len(store.load(sid)))]})
        assert store.sessions() == sorted(set(ids))

    def test_delete_removes_every_event_of_one_session(self, store: Store) -> None:
        """delete empties one session and leaves the others as they were."""
        store.write({"s": [_ev(0), _ev(1)], "t": [_ev(0)]})
        store.delete("s")
        assert store.load("s") == []
        assert store.sessions() == ["t"]
        assert [e.seq for e in store.load("t")] == [0]

    def test_delete_of_an_unknown_session_is_a_no_op(self, store: Store) -> None:
        """Deleting a session that has no events does nothing and raises nothing."""
        store.write({"t": [_ev(0)]})
        store.delete("nobody")
        assert store.sessions() == ["t"]

    def test_a_deleted_session_can_be_written_again_from_seq_0(self, store: Store) -> None:
        """After delete, the session's seqs are free again."""
        store.write({"s": [_ev(0), _ev(1)]})
        store.delete("s")
        assert store.write({"s": [_ev(0, data={"content": "new"})]}) == {}
        assert store.load("s")[0].data == {"content": "new"}

    # -- claims ------------------------------------------------------------------------

    def test_claim_returns_a_token(self, store: Store) -> None:
        """claim succeeds on a free session and returns a str token."""
        token = store.claim("s")
        assert isinstance(token, str)

    def test_a_second_claim_is_refused_with_conflict_error(self, store: Store) -> None:
        """While a claim is held, another claim of that session raises ConflictError."""
        store.claim("s")
        with pytest.raises(ConflictError) as info:
            store.claim("s")
        _names_its_session(info.value, "s", "the ConflictError claim() raised")

    def test_claim_after_release_succeeds(self, store: Store) -> None:
        """Releasing with the claim's token frees the session for the next claim."""
        token = store.claim("s")
        store.release("s", token)
        second = store.claim("s")
        assert second != token

    def test_release_with_a_stale_token_is_a_no_op(self, store: Store) -> None:
        """An old token releases nothing: the current holder keeps the session."""
        old = store.claim("s")
        store.release("s", old)
        store.claim("s")
        store.release("s", old)
        with pytest.raises(ConflictError):
            store.claim("s")

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
        with pytest.raises(ConflictError):
            store.claim("b")

    def test_a_claim_is_not_a_session_with_events(self, store: Store) -> None:
        """Claiming stores no event: the session is not listed and loads as []."""
        store.claim("s")
        assert store.sessions() == []
        assert store.load("s") == []

    def test_writes_do_not_need_a_claim(self, store: Store) -> None:
        """A claim coordinates writers; write itself works with or without one."""
        assert store.write({"s": [_ev(0)]}) == {}
        store.claim("s")
        assert store.write({"s": [_ev(1)]}) == {}

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
        assert import_session(store, "copy", text) == len(log.events())
        assert_same_events(store.load("copy"), store.load("s"))

    def test_export_is_json_lines_with_one_event_a_line(self, store: Store) -> None:
        """export_session gives one JSON record per stored event, each line ending in \\n."""
        events = list(_varied_log().events())
        store.write({"s": events})
        text = export_session(store, "s")
        assert text.endswith("\n")
        lines = text[:-1].split("\n")
        assert [loads_event(line) for line in lines] == events
        replace = json.loads(lines[-2])
        assert replace["data"]["surface_op"] == ["replace", 1, 7]

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
        assert import_session(store, "v1", json.dumps(v1)) == 4
        loaded = store.load("v1")
        assert_same_events(loaded, expected.events())
        rebuilt = Log()
        for ev in loaded:
            rebuilt = rebuilt.append_event(ev)
        assert [m.role.value for m in rebuilt.derive_messages()] == [
            "system",
            "user",
            "assistant",
            "tool",
        ]
        assert rebuilt.derive_messages() == expected.derive_messages()

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
        assert store.load("s") == []
        assert store.sessions() == []

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
            assert shared.load_since(store, "s", 6) == []
            assert shared.load_since(store, "unknown", 0) == []
        finally:
            store.release("s", token)

    def test_next_seq_counts_without_a_claim(self, store: Store) -> None:
        """``next_seq`` is the last stored seq + 1 (0 for a session with no events), read
        while another writer holds the session."""
        store.write({"s": [_ev(i) for i in range(6)]})
        token = store.claim("s")
        try:
            assert shared.next_seq(store, "s") == 6
            assert shared.next_seq(store, "unknown") == 0
        finally:
            store.release("s", token)

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
            got = [feed.get(timeout=10).seq for _ in range(4)]
            assert got == [1, 2, 3, 4]
            store.write({"s": [_ev(5)]})
            assert feed.get(timeout=10).seq == 5
            assert feed.get_nowait() is None  # nothing twice

    def test_a_watch_of_a_session_without_events_waits_for_its_first(self, store: Store) -> None:
        """A watch may start before the session has any event."""
        with shared.watch(store, "later") as feed:
            store.write({"later": [_ev(0, data={"content": "first"})]})
            ev = feed.get(timeout=10)
        assert (ev.seq, ev.data["content"]) == (0, "first")

    def test_wait_changed_returns_after_a_write(self, store: Store) -> None:
        """``wait_changed`` returns a larger counter once something was written, well
        within its bound."""
        seen = shared.wait_changed(store, -1, 0.0)
        store.write({"s": [_ev(0)]})
        started = time.monotonic()
        now = shared.wait_changed(store, seen, 10.0)
        assert now > seen
        assert time.monotonic() - started < 5.0

    def test_held_by_names_a_live_claim_only(self, store: Store) -> None:
        """A store that offers ``held_by`` names the holder of a claimed session, and
        nobody once it was released."""
        if not callable(getattr(store, "held_by", None)):
            pytest.skip("the store has no held_by (optional)")
        assert shared.held_by(store, "s") is None
        token = store.claim("s")
        holder = shared.held_by(store, "s")
        assert isinstance(holder, str)
        assert holder
        store.release("s", token)
        assert shared.held_by(store, "s") is None

    def test_a_claim_carries_the_address_advertised(self, store: Store) -> None:
        """A store that keeps holders' addresses (``advertise``, ``holder_address``)
        writes the address advertised with each claim it takes, and into the claims it
        holds when advertised again; nobody holds a released session."""
        if not shared.supports_forwarding(store):
            pytest.skip("the store keeps no holders' addresses (optional)")
        assert shared.holder_address(store, "s") is None
        shared.advertise(store, "addr-1")
        token = store.claim("s")
        try:
            found = shared.holder_address(store, "s")
            assert found is not None
            holder, address = found
            assert holder == shared.held_by(store, "s")
            assert address == "addr-1"
            shared.advertise(store, "addr-2")
            assert shared.holder_address(store, "s") == (holder, "addr-2")
            shared.advertise(store, None)
            assert shared.holder_address(store, "s") == (holder, None)
        finally:
            store.release("s", token)
        assert shared.holder_address(store, "s") is None

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
            assert shared.holder_address(store, "s") == (shared.held_by(store, "s"), "addr")
        finally:
            store.release("s", token)

    def test_the_forwarding_key_is_stable(self, store: Store) -> None:
        """A store with a secret gives the same 32 bytes at every call."""
        own = getattr(store, "forwarding_key", None)
        if not callable(own):
            pytest.skip("the store has no forwarding key (optional)")
        first = shared.forwarding_key(store)
        assert isinstance(first, bytes)
        assert len(first) == 32
        assert shared.forwarding_key(store) == first

    def test_a_write_in_the_store_s_turn_takes_no_other(self, store: Store) -> None:
        """Inside ``write_turn()`` (or its fallback), this thread's write is stored and
        answers: it takes no second turn (a turn that waited for itself would hang)."""
        done: list[dict[str, StoreError]] = []

        def in_turn() -> None:
            with shared.write_turn(store) as came:
                assert isinstance(came, bool)
                done.append(store.write({"t": [_ev(0)]}))

        writer = threading.Thread(target=in_turn, daemon=True)
        writer.start()
        writer.join(10)
        assert not writer.is_alive(), "a write inside write_turn() waited for another turn"
        assert done == [{}]
        assert [e.seq for e in store.load("t")] == [0]

    def test_handoff_requests_are_sessions_this_store_holds(self, store: Store) -> None:
        """Asking, withdrawing and listing requests work on claimed and unclaimed
        sessions alike; only sessions this store holds are ever listed."""
        token = store.claim("held")
        try:
            shared.ask_handoff(store, "held", 5.0)
            shared.ask_handoff(store, "free", 5.0)
            assert set(shared.handoff_requests(store)) <= {"held"}
            shared.withdraw_handoff(store, "held")
            shared.withdraw_handoff(store, "free")
            shared.withdraw_handoff(store, "never-asked")
        finally:
            store.release("held", token)
        assert shared.handoff_requests(store) == []

    def test_index_pages_and_filters_in_id_order(self, store: Store) -> None:
        """``list_sessions`` with ``prefix``, ``after`` and ``limit`` pages through the ids
        in order, and names the holder of a claimed session where the store can tell."""
        ids = ["app:b", "app:a", "user:x", "app:c", "apple"]
        for sid in ids:
            store.write({sid: [_ev(0), _ev(1)]})
        token = store.claim("app:b")
        try:
            every = list_sessions(store)
            assert [i.session_id for i in every] == sorted(ids)
            assert all((i.events, i.next_seq, i.error) == (2, 2, None) for i in every)
            pages: list[str] = []
            after: str | None = None
            while True:
                page = list_sessions(store, prefix="app:", after=after, limit=2)
                if not page:
                    break
                assert len(page) <= 2
                pages += [i.session_id for i in page]
                after = page[-1].session_id
            assert pages == ["app:a", "app:b", "app:c"]
            assert list_sessions(store, limit=0) == []
            holders = {i.session_id: i.holder for i in every}
            if callable(getattr(store, "held_by", None)):
                assert holders["app:b"] is not None
            assert holders["app:a"] is None
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
                    assert store.write({sid: [_ev(i)]}) == {}
                    assert len(store.load(sid)) == i + 1
                    store.sessions()
                store.release(sid, token)
            except BaseException as exc:  # reported in the test's thread
                errors.append(exc)

        workers = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert not any(w.is_alive() for w in workers), "a worker thread hung"
        assert not errors, errors
        assert store.sessions() == ["w0", "w1", "w2", "w3"]
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
            assert not other, (
                f"claim() of a held session raises ConflictError and returns a str token "
                f"otherwise; under {_RACERS} claims at once it gave {other!r}"
            )
            assert len(tokens) == 1, (
                f"one live writer per session: {_RACERS} threads claimed {sid!r} at once "
                f"and {len(tokens)} got a token (exactly one must; every other claim must "
                "raise ConflictError): claim must check that the session is free and take "
                "it in one step (under one lock, or in one transaction)"
            )
            for exc in refused:
                _names_its_session(exc, sid, "the ConflictError claim() raised")
            (token,) = tokens
            assert store.write({sid: [_ev(0)]}) == {}, "the claim's winner must be able to write"
            with pytest.raises(ConflictError):
                store.claim(sid)  # the winner still holds it
            store.release(sid, token)
            again = store.claim(sid)
            assert again != token, "a claim after the winner released takes a new token"
            store.release(sid, again)
            assert [e.seq for e in store.load(sid)] == [0]

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
            assert not raised, (
                "write() returns a refused session's ConflictError, it does not raise it; "
                f"under {_RACERS} writes of one seq at once it raised {raised!r}"
            )
            answers = [r for r in got if not isinstance(r, BaseException)]
            won = [n for n, r in enumerate(answers) if r == {}]
            assert len(won) == 1, (
                f"{_RACERS} threads wrote seqs 0 and 1 of {sid!r} at once and {len(won)} "
                "writes returned {} (exactly one must; every other must return a "
                "ConflictError for the session): write must check that the seqs are free "
                "and store them in one step (under one lock, or in one transaction)"
            )
            for n, answer in enumerate(answers):
                if n in won:
                    continue
                assert set(answer) == {sid}, f"a write of {sid!r} alone returned {answer!r}"
                assert isinstance(answer[sid], ConflictError), (
                    f"a write of seqs another writer stored returns ConflictError, got {answer!r}"
                )
                _names_its_session(answer[sid], sid, "the ConflictError write() returned")
            try:
                assert_same_events(store.load(sid), mine(won[0]))
            except AssertionError as exc:
                raise AssertionError(
                    f"the stored events of {sid!r} must be all those of the one write that "
                    f"succeeded (writer {won[0]}), and no other's: {exc}"
                ) from None
            assert store.write({sid: [_ev(2)]}) == {}
            assert [e.seq for e in store.load(sid)] == [0, 1, 2]

    # -- the stateful test ---------------------------------------------------------------

    @pytest.mark.usefixtures("_contract_tmp_path")
    def test_agrees_with_a_model_under_random_operations(self) -> None:
        """Random writes, conflicts, drops, deletes and claims leave the store equal to a
        plain dict model after every step (see `StoreMachine`)."""
        machine = store_machine(self.make_store, self.close_store)
        run_state_machine_as_test(machine, settings=self.machine_settings())
