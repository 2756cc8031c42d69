"""The `nous_actor.store.Store` contract, as tests to run against a store of your own.

Every rule in the ``Store`` protocol's docstring is checked here, and two
rules of what a store's errors carry (`StoreContract` lists them): an error
that refuses one session, returned by ``write`` or raised by ``claim``, has
``session_id`` set to it; a seq of 2**63 or more is refused for its session
with a `StoreError` that is not a `ConflictError`, in any wording. Given a
second store object on the same backend (`StoreContract.make_peer`), the
rules between two store objects are checked too. A failed check says which
rule the store broke, under ``python -O`` too. This library runs the same suite
against `nous_actor.store.MemoryStore` and `nous_actor.store.SQLiteStore`. Subclass `StoreContract`
in a test module (the subclass's name must start with ``Test`` so that
pytest collects it) and say how to make a fresh, empty store::

    from nous_actor.store import Store
    from nous_actor.testing.store_contract import StoreContract, store_machine

    class TestMyStore(StoreContract):
        def make_store(self) -> Store:
            return MyStore(self.tmp_path / "events.db")  # a fresh, empty store

        def close_store(self, store: Store) -> None:  # optional; default store.close()
            store.close()

        def make_peer(self, store: Store) -> Store | None:  # optional; default None
            return MyStore(store.path)  # a second object on the same backend

`StoreContract.make_store` is called once per test, and many times by
the stateful test (one store per Hypothesis example): each call must return
a new, empty store. ``self.tmp_path`` is pytest's per-test temporary folder.
`StoreContract.make_peer` gives a second store object on the same backend
as ``store`` (what another process opening it has); the tests of the rules
between two store objects skip without it.

The stateful test alone, bound to your store by `store_machine`::

    TestMyStoreMachine = store_machine(lambda: MyStore(...)).TestCase

This module imports pytest and Hypothesis; the rest of the library never
imports it.
"""

from nous_actor.testing.store_machine import StoreMachine, assert_same_events, store_machine
from nous_actor.testing.store_suite import StoreContract

__all__ = ["StoreContract", "StoreMachine", "assert_same_events", "store_machine"]
