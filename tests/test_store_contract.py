"""The shipped Store contract (nous_actor.testing.store_contract), run against every store."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings

from nous_actor.store import MemoryStore, SQLiteStore, Store
from nous_actor.testing.store_contract import StoreContract, store_machine

_files = itertools.count()


class TestMemoryStore(StoreContract):
    """MemoryStore keeps every rule."""

    def make_store(self) -> Store:
        return MemoryStore()


class TestSQLiteStoreInMemory(StoreContract):
    """SQLiteStore(":memory:") keeps every rule."""

    def make_store(self) -> Store:
        return SQLiteStore(":memory:")


class TestSQLiteStoreFile(StoreContract):
    """SQLiteStore on a file (WAL, synchronous=FULL) keeps every rule."""

    def make_store(self) -> Store:
        return SQLiteStore(self.tmp_path / f"store-{next(_files)}.sqlite")


# The machine alone, bound the way the docs tell users to bind their own store (each
# class above already runs it through test_agrees_with_a_model_under_random_operations).
TestMemoryStoreMachine = store_machine(MemoryStore).TestCase
TestMemoryStoreMachine.settings = settings(
    max_examples=min(settings().max_examples, 20),
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
