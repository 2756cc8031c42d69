"""`StoreContract`, the suite's face: how a subclass makes and closes its store, the
fixtures, the rules of every other module of the suite, the threads and the stateful test."""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    run_state_machine_as_test,
)

from nous_actor.errors import StoreError
from nous_actor.store.base import Store
from nous_actor.testing.store_machine import assert_same_events, store_machine
from nous_actor.testing.store_suite._helpers import (
    _ev,
)
from nous_actor.testing.store_suite._sessions import SessionRules
from nous_actor.testing.store_suite._sharing import SharingRules
from nous_actor.testing.store_suite._transfer import TransferRules
from nous_actor.testing.store_suite._writes import WriteRules

__all__ = ["StoreContract"]


class StoreContract(WriteRules, SessionRules, TransferRules, SharingRules, abc.ABC):
    """Every rule of the ``Store`` protocol, as pytest tests; subclass it per store.

    Implement `make_store`; override `close_store` if closing
    needs more than ``store.close()``, and `machine_settings` to run the
    stateful test longer or shorter.
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

    # -- the stateful test ---------------------------------------------------------------

    @pytest.mark.usefixtures("_contract_tmp_path")
    def test_agrees_with_a_model_under_random_operations(self) -> None:
        """Random writes, conflicts, drops, deletes and claims leave the store equal to a
        plain dict model after every step (see `StoreMachine`)."""
        machine = store_machine(self.make_store, self.close_store)
        run_state_machine_as_test(machine, settings=self.machine_settings())
