"""Durable stores: the :class:`Store` protocol, :class:`MemoryStore`, :class:`SQLiteStore`."""

from nous_actor.store.base import Store, export_session, import_session
from nous_actor.store.memory import MemoryStore
from nous_actor.store.sqlite import SQLiteStore

__all__ = ["MemoryStore", "SQLiteStore", "Store", "export_session", "import_session"]
