"""Durable stores: the `Store` protocol, `MemoryStore`, `SQLiteStore`, helpers for any store."""

from nous_actor.store.base import (
    SessionInfo,
    Store,
    export_session,
    import_session,
    list_sessions,
)
from nous_actor.store.memory import MemoryStore
from nous_actor.store.sqlite import SQLiteStore

__all__ = [
    "MemoryStore",
    "SQLiteStore",
    "SessionInfo",
    "Store",
    "export_session",
    "import_session",
    "list_sessions",
]
