"""The shipped Store contract (nous_actor.testing.store_contract), run against every store."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, settings

from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store import MemoryStore, SQLiteStore, Store
from nous_actor.testing.store_contract import StoreContract, store_machine
from nous_actor.testing.stores import DelegatingStore

_files = itertools.count()


class TestMemoryStore(StoreContract):
    """MemoryStore keeps every rule (it has no peers: one object is the whole store)."""

    def make_store(self) -> Store:
        return MemoryStore()


class TestSQLiteStoreInMemory(StoreContract):
    """SQLiteStore(":memory:") keeps every rule."""

    def make_store(self) -> Store:
        return SQLiteStore(":memory:")


class TestSQLiteStoreFile(StoreContract):
    """SQLiteStore on a file (WAL, synchronous=FULL) keeps every rule, and two store
    objects on one file keep the rules between peers."""

    def make_store(self) -> Store:
        return SQLiteStore(self.tmp_path / f"store-{next(_files)}.sqlite")

    def make_peer(self, store: Store) -> Store | None:
        assert isinstance(store, SQLiteStore)
        return SQLiteStore(store.path)  # what another process opening the file has


# The machine alone, bound the way the docs tell users to bind their own store (each
# class above already runs it through test_agrees_with_a_model_under_random_operations).
TestMemoryStoreMachine = store_machine(MemoryStore).TestCase
TestMemoryStoreMachine.settings = settings(
    max_examples=min(settings().max_examples, 20),
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- the rules of what a store's errors carry, as the suite states and checks them -----------


class _SeqRefusedInItsOwnWords(StoreError):
    """A store's own refusal of a seq it cannot keep."""


class _OwnWords(DelegatingStore):
    """Refuses a seq past 2**63 - 1 in its own words, with its own StoreError subclass."""

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        big = {sid for sid, evs in appends.items() if any(e.seq >= 2**63 for e in evs)}
        refused: dict[str, StoreError] = {
            sid: _SeqRefusedInItsOwnWords("that seq is out of range", session_id=sid)
            for sid in big
        }
        refused.update(self.inner.write({s: e for s, e in appends.items() if s not in big}))
        return refused


class _Unnamed(DelegatingStore):
    """Raises a ConflictError without its session from claim, returns one from write."""

    def claim(self, session_id: str) -> str:
        try:
            return self.inner.claim(session_id)
        except ConflictError as exc:
            raise ConflictError(str(exc)) from None

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        return {s: ConflictError(str(e)) for s, e in self.inner.write(appends).items()}


class _ConflictForBigSeqs(DelegatingStore):
    """Refuses a seq past 2**63 - 1 as a conflict (as if another writer had stored it)."""

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        refused = self.inner.write(appends)
        return {
            s: ConflictError(str(e), session_id=s) if "2**63" in str(e) else e
            for s, e in refused.items()
        }


class _Contract(StoreContract):
    def make_store(self) -> Store:
        return MemoryStore()


def test_a_seq_refusal_in_a_stores_own_words_keeps_the_contract() -> None:
    """The refusal of a seq of 2**63 needs neither the text "2**63" nor the exact class
    StoreError (both were required): a StoreError of the store's own, naming the
    session, passes."""
    _Contract().test_a_seq_of_2_to_the_63_is_refused_for_its_session(_OwnWords(MemoryStore()))


def test_a_seq_refused_as_a_conflict_breaks_the_rule_it_names() -> None:
    with pytest.raises(AssertionError, match="not a ConflictError"):
        _Contract().test_a_seq_of_2_to_the_63_is_refused_for_its_session(
            _ConflictForBigSeqs(MemoryStore())
        )


@pytest.mark.parametrize(
    "test",
    [
        "test_a_second_claim_is_refused_with_conflict_error",
        "test_a_conflict_names_its_session",
    ],
)
def test_an_error_without_its_session_fails_saying_which_rule(test: str) -> None:
    """A ConflictError from claim or write without session_id failed with a bare
    AssertionError; the failure now names the rule and what to pass."""
    with pytest.raises(
        AssertionError, match=r"must name its session: make it with session_id='s'"
    ):
        getattr(_Contract(), test)(_Unnamed(MemoryStore()))
