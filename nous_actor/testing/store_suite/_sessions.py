"""The store contract: drop, the list of sessions, delete, the writer claim, and a
closed store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nous_actor.core.log import Log
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store.base import Store
from nous_actor.testing.store_machine import assert_same_events
from nous_actor.testing.store_suite._helpers import (
    _CALLS_ON_A_CLOSED_STORE,
    _ev,
    _varied_log,
)


class SessionRules:
    """Drop, sessions and delete, claims, and a closed store."""

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
        assert info.value.session_id == "s"

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
