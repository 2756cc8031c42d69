"""The store contract's optional part: sharing a store with other processes
(`nous_actor.store.shared`: reads without a claim, watches, hand-off, the index)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from nous_actor.errors import StoreError
from nous_actor.store import shared
from nous_actor.store.base import Store, list_sessions
from nous_actor.testing.store_machine import assert_same_events
from nous_actor.testing.store_suite._helpers import (
    _ev,
)


class SharingRules:
    """Sharing with other processes (optional methods)."""

    if TYPE_CHECKING:  # given by StoreContract

        def close_store(self, store: Store) -> None: ...

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
