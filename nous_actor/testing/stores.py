"""`DelegatingStore`: a store that hands every call of the `Store` protocol to another.

Subclass it to inject faults or record calls around a real store, overriding
only the methods you need (and nothing beyond the protocol: it has no
``index()``, so `list_sessions` loads each session through it)::

    class Flaky(DelegatingStore):
        def write(self, appends):
            raise StoreError("disk full")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nous_actor.core.event import Event
from nous_actor.errors import StoreError
from nous_actor.store.base import Store

__all__ = ["DelegatingStore"]


class DelegatingStore:
    """Every `Store` method, passed on to ``inner``."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def load(self, session_id: str) -> list[Event]:
        return self.inner.load(session_id)

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        return self.inner.write(appends)

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        self.inner.drop(session_id, seqs)

    def sessions(self) -> list[str]:
        return self.inner.sessions()

    def delete(self, session_id: str) -> None:
        self.inner.delete(session_id)

    def claim(self, session_id: str) -> str:
        return self.inner.claim(session_id)

    def release(self, session_id: str, token: str) -> None:
        self.inner.release(session_id, token)

    def close(self) -> None:
        self.inner.close()
