"""The ready state machine: sessions of a registry under simulation against a model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings

from nous_actor.sessions.registry import Sessions
from nous_actor.store.base import Store
from nous_actor.store.sqlite import SQLiteStore
from nous_actor.testing.sim_machine import SimulationMachine


class MemoryMachine(SimulationMachine):
    """The machine as shipped: a MemoryStore, a default registry."""


class SQLiteMachine(SimulationMachine):
    """The machine on a SQLite file, with idle sessions passivated (a virtual minute)."""

    def make_store(self) -> Store:
        self._folder = tempfile.TemporaryDirectory()
        return SQLiteStore(str(Path(self._folder.name) / "m.db"), durability="normal")

    def make_sessions(self, store: Store) -> Sessions:
        return Sessions(store, idle_timeout=60.0)

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if hasattr(self, "store"):
                self.store.close()
            if hasattr(self, "_folder"):
                self._folder.cleanup()


MemoryMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
SQLiteMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=15, deadline=None)
TestMemoryMachine = MemoryMachine.TestCase
TestSQLiteMachine = SQLiteMachine.TestCase
