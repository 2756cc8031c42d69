"""An in-memory `Store`: same rules as the durable ones, no durability."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence

from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store.base import SessionInfo, valid_store_id

__all__ = ["MemoryStore"]


class MemoryStore:
    """A `Store` in a dict: same rules, no durability.

    Events are kept as the immutable `Event` values they are. `claim` and
    `write` refuse a session id that is not valid (see `nous_actor.core.ids`) with
    `StoreError`, storing nothing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, dict[int, Event]] = {}
        self._claims: dict[str, str] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed; open a new one")

    _valid_id = staticmethod(valid_store_id)

    def load(self, session_id: str) -> list[Event]:
        with self._lock:
            self._check_open()
            stored = self._events.get(session_id, {})
            return [stored[k] for k in sorted(stored)]

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        refused: dict[str, StoreError] = {}
        for sid, events in appends.items():
            if events:
                self._valid_id(sid)
        with self._lock:
            self._check_open()
            for sid, events in appends.items():
                stored = self._events.get(sid, {})
                seqs = [ev.seq for ev in events]
                taken = [s for s in seqs if s in stored]
                if taken or len(set(seqs)) != len(seqs):
                    refused[sid] = ConflictError(
                        f"seq {(taken or seqs)[0]} is already stored (another writer?); "
                        "reopen the session to continue from the store",
                        session_id=sid,
                    )
                    continue
                self._events.setdefault(sid, {}).update((ev.seq, ev) for ev in events)
        return refused

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        with self._lock:
            self._check_open()
            stored = self._events.get(session_id)
            if stored is not None:
                for s in seqs:
                    stored.pop(s, None)

    def sessions(self) -> list[str]:
        with self._lock:
            self._check_open()
            return sorted(sid for sid, evs in self._events.items() if evs)

    def delete(self, session_id: str) -> None:
        with self._lock:
            self._check_open()
            self._events.pop(session_id, None)
            self._claims.pop(session_id, None)

    def claim(self, session_id: str) -> str:
        session_id = self._valid_id(session_id)
        with self._lock:
            self._check_open()
            if session_id in self._claims:
                raise ConflictError(
                    "already has a live writer in this store; use its handle, "
                    "or stop that session first",
                    session_id=session_id,
                )
            token = uuid.uuid4().hex
            self._claims[session_id] = token
            return token

    def release(self, session_id: str, token: str) -> None:
        with self._lock:
            if self._claims.get(session_id) == token:
                del self._claims[session_id]

    def index(self) -> list[SessionInfo]:
        """Every stored session's size, next seq and latest time, sorted by id.

        Used by `nous_actor.store.list_sessions`.

        Raises:
            StoreError: the store is closed.
        """
        with self._lock:
            self._check_open()
            return [
                SessionInfo(sid, len(evs), max(evs) + 1, max(ev.time for ev in evs.values()))
                for sid, evs in sorted(self._events.items())
                if evs
            ]

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def __repr__(self) -> str:
        return f"<MemoryStore sessions={len(self._events)}>"
