"""The :class:`Store` protocol: where sessions' events persist.

A store knows events and their JSON form (the codec), never actors. The
session layer calls it from one writer thread per store (group commit) and
from session actors (load, claim, release).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from nous_actor.codec import iter_jsonl, loads
from nous_actor.errors import ConflictError, StoreError
from nous_actor.event import Event

__all__ = ["Store", "export_session", "import_session"]


@runtime_checkable
class Store(Protocol):
    """A durable home for the events of many sessions.

    Rules every implementation keeps (the contract suite in
    :mod:`nous_actor.testing.store_contract` checks them):

    * ``write`` is atomic per session: a session's events in one call are
      all stored or none is; seqs already stored are refused with
      :class:`ConflictError` for that session, the others still commit.
    * ``load`` returns what was written and not dropped, in seq order, equal
      to the events written (seq, type, time to the microsecond, data).
    * One live writer per session: ``claim`` refuses a second claim while
      the first holder is alive (in this process or, where the store is
      shared, another one).
    * Errors are :class:`StoreError` (or its subclass ``ConflictError``),
      never a backend's own exception type.
    """

    def load(self, session_id: str) -> list[Event]:
        """The stored events of ``session_id`` in seq order (``[]`` if none)."""
        ...

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        """Store each session's events; one transaction for all where the backend can.

        Returns the sessions whose events were refused, each with its error
        (a :class:`ConflictError` for a seq already stored); every other
        session's events are stored when this returns.

        Raises:
            StoreError: nothing was stored (the backend failed as a whole).
        """
        ...

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        """Delete the given seqs of one session (used by snapshot); unknown seqs are ignored."""
        ...

    def sessions(self) -> list[str]:
        """Ids of every session with at least one stored event, sorted."""
        ...

    def delete(self, session_id: str) -> None:
        """Delete every event of ``session_id`` (and its writer claim)."""
        ...

    def claim(self, session_id: str) -> str:
        """Become the one writer of ``session_id``; returns a token for :meth:`release`.

        Raises:
            ConflictError: another live writer holds the session.
        """
        ...

    def release(self, session_id: str, token: str) -> None:
        """Give up a claim (a no-op if ``token`` no longer holds it)."""
        ...

    def close(self) -> None:
        """Release resources; later calls raise :class:`StoreError`."""
        ...


def export_session(store: Store, session_id: str) -> str:
    """One session's stored events as JSON Lines (see :mod:`nous_actor.codec`).

    Raises:
        StoreError: the session has no events, or the store failed.
    """
    events = store.load(session_id)
    if not events:
        raise StoreError("no such session to export", session_id=session_id)
    from nous_actor.log import Log

    log = Log()
    for ev in events:
        log = log.append_event(ev)
    return "".join(line + "\n" for line in iter_jsonl(log))


def import_session(store: Store, session_id: str, text: str) -> int:
    """Store a session from JSON Lines, or seed it from a v1 JSON list of messages.

    Returns the number of events stored.

    Raises:
        CodecError: the text is malformed (nothing is stored).
        ConflictError: the session already has events (import into a new id).
        StoreError: the store failed.
    """
    log = loads(text)
    if store.load(session_id):
        raise ConflictError(
            "already has events; import into a new session id or delete it first",
            session_id=session_id,
        )
    events = log.events()
    refused = store.write({session_id: events})
    if session_id in refused:
        raise refused[session_id]
    return len(events)
