"""The registries `NousSession.sqlite` opens: one per SQLite file in the process, shared by
every `NousSession.sqlite` on that file and closed with the last of them."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from nous_actor.runtime import forks
from nous_actor.sessions.registry import Sessions
from nous_actor.store.sqlite import SQLiteStore


@dataclass(eq=False)
class _Owned:
    key: str | None
    store: SQLiteStore
    sessions: Sessions
    users: int = 1


_OWNED_LOCK = threading.Lock()
_OWNED: dict[str, _Owned] = {}


def _forget_owned() -> None:
    """(In a forked child.) The registries are the parent's: a `NousSession.sqlite` made
    in the child opens one of its own."""
    global _OWNED_LOCK
    _OWNED_LOCK = threading.Lock()
    _OWNED.clear()


forks.after_fork(_forget_owned)


def _acquire_registry(path: str | Path) -> _Owned:
    if str(path) == ":memory:":
        store = SQLiteStore(":memory:")
        return _Owned(None, store, Sessions(store))
    key = str(Path(path).expanduser().resolve())
    with _OWNED_LOCK:
        owned = _OWNED.get(key)
        if owned is not None:
            owned.users += 1
            return owned
        store = SQLiteStore(key)
        owned = _OWNED[key] = _Owned(key, store, Sessions(store))
        return owned


def _release_registry(owned: _Owned) -> None:
    with _OWNED_LOCK:
        owned.users -= 1
        if owned.users > 0:
            return
        if owned.key is not None and _OWNED.get(owned.key) is owned:
            del _OWNED[owned.key]
    try:
        owned.sessions.close()
    finally:
        owned.store.close()
