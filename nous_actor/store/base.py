"""The `Store` protocol, where sessions' events persist, and what works on any store.

A store knows events and their JSON form (the codec), never actors. The
session layer calls it from one writer thread per store (group commit) and
from session actors (load, claim, release).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Any, Final, Protocol, Self, TypeGuard, runtime_checkable

from nous_actor.core._frozen import short_repr
from nous_actor.core.args import check_count
from nous_actor.core.codec import CodecError, events_from_rows, iter_jsonl, loads
from nous_actor.core.event import Event
from nous_actor.core.ids import check_session_id
from nous_actor.errors import ConflictError, StoreError

__all__ = [
    "CALL_RECORD_SECONDS",
    "CallRecords",
    "SessionInfo",
    "Store",
    "export_session",
    "import_session",
    "list_sessions",
]

CALL_RECORD_SECONDS: Final = 600
"""How long, at least, a store keeps the record of a call forwarded from another process
(its id, and the seqs of what it appended): the time its caller has to ask
``session.applied(call_id)`` after `nous_actor.CallOutcomeUnknown`."""

CallRecords = Mapping[str, Sequence[tuple[str, int, int]]]
"""The forwarded calls a write records, by session: ``(call id, first seq, last seq)``
of the events each call appended (all in the same write)."""


@runtime_checkable
class Store(Protocol):
    """A durable home for the events of many sessions.

    Rules every implementation keeps (the contract suite in
    `nous_actor.testing.store_contract` checks them):

    * ``write`` is atomic per session: a session's events in one call are
      all stored or none is; seqs already stored are refused with
      `ConflictError` for that session, the others still commit.
    * ``load`` returns what was written and not dropped, in seq order, equal
      to the events written (seq, type, time to the microsecond, data).
    * One live writer per session: ``claim`` refuses a second claim while
      the first holder is alive (in this process or, where the store is
      shared, another one).
    * Errors are `StoreError` (or its subclass ``ConflictError``),
      never a backend's own exception type.
    * An error that refuses one session names it: each ``StoreError`` (a
      ``ConflictError`` too) that ``write`` returns for a session, and the
      ``ConflictError`` that ``claim`` raises, has ``session_id`` set to that
      session's id (make it with ``session_id=``); a registry hands a refused
      claim to its caller as it is.
    * A seq of 2**63 or more refuses its session's events with a ``StoreError``
      that is not a ``ConflictError`` (no other writer stored it), in any
      wording; the other sessions of the write are stored.
    * Where the store is shared, ``delete`` and ``drop`` of a session another
      live writer holds raise `ConflictError` and change nothing.
    """

    def load(self, session_id: str) -> list[Event]:
        """The stored events of ``session_id`` in seq order (``[]`` if none)."""
        ...

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        """Store each session's events; one transaction for all where the backend can.

        Returns the sessions whose events were refused, each with its error
        (a `ConflictError` for a seq already stored); every other
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
        """Become the one writer of ``session_id``; returns a token for `release`.

        Raises:
            ConflictError: another live writer holds the session.
        """
        ...

    def release(self, session_id: str, token: str) -> None:
        """Give up a claim (a no-op if ``token`` no longer holds it)."""
        ...

    def close(self) -> None:
        """Release resources; later calls raise `StoreError`."""
        ...


_STORE_METHODS: Final = frozenset(
    name for name, value in vars(Store).items() if callable(value) and not name.startswith("_")
)
"""The methods a `Store` has (what ``isinstance(obj, Store)`` looks for)."""
_STORE_CLASSES: weakref.WeakSet[type] = weakref.WeakSet()
"""Classes whose instances are stores: each has every method of `Store` itself."""


def is_store(obj: object) -> TypeGuard[Store]:
    """``isinstance(obj, Store)``, answered from its class once one instance passed: the
    protocol's check looks up each of its methods (about 5 µs), and a web worker makes
    a `nous_actor.SessionReader`, which checks its store, at every request."""
    cls = type(obj)
    if cls in _STORE_CLASSES:
        return True
    if not isinstance(obj, Store):
        return False
    if all(callable(getattr(cls, name, None)) for name in _STORE_METHODS):
        _STORE_CLASSES.add(cls)  # (else its instances pass by attributes of their own)
    return True


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One stored session, as `list_sessions` reports it.

    Attributes:
        session_id: the session's id.
        events: how many events are stored (retained after snapshots).
        next_seq: the seq its next event gets (the highest stored seq + 1).
        last_time: the latest time among its stored events (UTC), or `None`
            if it could not be read.
        error: why the session could not be read (the other fields are then
            `0` or `None` where unknown), or `None` when it was read.
        holder: who holds a live claim on it (``"this process"``, ``"process
            4242"``, a PostgreSQL holder's name), or `None`: nobody, or the
            store cannot tell.
    """

    session_id: str
    events: int
    next_seq: int
    last_time: datetime | None
    error: str | None = None
    holder: str | None = None


def list_sessions(
    store: Store, *, prefix: str = "", after: str | None = None, limit: int | None = None
) -> list[SessionInfo]:
    """The sessions of `store` with at least one stored event, sorted by id (code point
    order), each with its size, next seq, latest time and holder.

    Filtered and paged: only ids starting with ``prefix``, only ids after ``after``
    (pass the last id of a page to get the next one), at most ``limit`` of them.

    Uses the store's fast `index()` method when it has one (`SQLiteStore`,
    `PostgresStore` and `MemoryStore` do: no event is decoded, one query);
    otherwise loads each session in turn. Either way a session that cannot be
    read does not fail the listing: it is listed with `error` saying why.

    A store of your own may offer ``index(*, prefix="", after=None, limit=None)
    -> list[SessionInfo]`` too (or ``index()`` without arguments: the page is
    then cut here); it is not part of the `Store` protocol.

    Raises:
        TypeError, ValueError: ``store`` is not a store, ``prefix`` not a str,
            ``after`` not ``None`` or a str, ``limit`` not ``None`` or an int >= 0.
        StoreError: the store failed as a whole (e.g. it is closed).
    """
    if not callable(getattr(store, "sessions", None)) or not callable(
        getattr(store, "load", None)
    ):
        hint = (
            f"; open it first: list_sessions(SQLiteStore({store!r}))"
            if isinstance(store, str | os.PathLike)
            else ""
        )
        raise TypeError(
            "list_sessions takes a store (a SQLiteStore, PostgresStore, MemoryStore or "
            f"one of your own), got {type(store).__name__}{hint}"
        )
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if after is not None and not isinstance(after, str):
        raise TypeError(f"after must be None or a session id (a str), got {type(after).__name__}")
    if limit is not None:
        check_count(limit, "limit")
    index: Callable[..., list[SessionInfo]] | None = getattr(store, "index", None)
    if callable(index):
        if _takes_page(index):
            return list(index(prefix=prefix, after=after, limit=limit))
        return _page(list(index()), prefix, after, limit)
    infos: list[SessionInfo] = []
    ids = _page_ids(store.sessions(), prefix, after)
    held_by: Callable[[str], str | None] | None = getattr(store, "held_by", None)
    for session_id in ids:
        if limit is not None and len(infos) >= limit:
            break
        try:
            events = store.load(session_id)
            holder = held_by(session_id) if callable(held_by) else None
        except Exception as exc:  # one unreadable session must not hide the others
            infos.append(SessionInfo(session_id, 0, 0, None, f"{type(exc).__name__}: {exc}"))
            continue
        if events:  # (a session deleted since sessions() answered is left out)
            last = max(ev.time for ev in events)
            infos.append(
                SessionInfo(session_id, len(events), events[-1].seq + 1, last, None, holder)
            )
    return infos


def _takes_page(index: Callable[..., object]) -> bool:
    try:
        params = inspect.signature(index).parameters
    except (TypeError, ValueError):
        return False
    return {"prefix", "after", "limit"} <= set(params)


def _page_ids(ids: Sequence[str], prefix: str, after: str | None) -> list[str]:
    return sorted(i for i in ids if i.startswith(prefix) and (after is None or i > after))


def _page(
    infos: list[SessionInfo], prefix: str, after: str | None, limit: int | None
) -> list[SessionInfo]:
    kept = sorted(
        (i for i in infos if i.session_id.startswith(prefix))
        if after is None
        else (i for i in infos if i.session_id.startswith(prefix) and i.session_id > after),
        key=lambda i: i.session_id,
    )
    return kept if limit is None else kept[:limit]


class ClosingStore:
    """A store used as a context manager: ``with SQLiteStore(path) as store:`` closes it."""

    def close(self) -> None:  # pragma: no cover - every store defines it
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def valid_store_id(session_id: str) -> str:
    """``session_id`` if it follows the id rule (`nous_actor.core.ids`), for a store's
    entry points, which refuse with `StoreError`, as the contract says.

    Raises:
        StoreError: the id is not valid (the message says why and what the rule is).
    """
    try:
        return check_session_id(session_id)
    except (TypeError, ValueError) as exc:
        raise StoreError(str(exc)) from exc


def valid_store_ids(session_ids: Iterable[str]) -> list[str]:
    """``session_ids`` (a list, tuple or other iterable of ids, never one str) checked as
    `valid_store_id` checks each, in order: what a batch entry point (``claim_many``,
    ``load_many``) takes.

    Raises:
        StoreError: an id is not valid, or ``session_ids`` is one str or not iterable (the
            message says to pass a list of ids).
    """
    if isinstance(session_ids, str | bytes) or not isinstance(session_ids, Iterable):
        raise StoreError(
            f"expected a list of session ids, got {type(session_ids).__name__} "
            f"{short_repr(session_ids)}: pass [session_id] for one session"
        )
    return [valid_store_id(sid) for sid in session_ids]


_SESSION_OF: Final = itemgetter(0)
_EVENT_COLUMNS: Final = itemgetter(1, 2, 3, 4)
"""A batch read's row: its session id, and its event's columns (``seq, type, time, data``)."""


def events_by_session(
    ids: Iterable[str],
    rows: Iterable[Sequence[Any]],
    malformed: Callable[[str, CodecError], StoreError],
) -> dict[str, list[Event] | StoreError]:
    """What a batch read (``load_many``) answers: each of ``ids`` mapped to its events, from
    ``rows`` of ``(session_id, seq, type, time, data)`` in session then seq order (an id
    without rows: no events), or to ``malformed(id, error)`` when one of its rows is
    malformed: that session alone fails, never the others."""
    out: dict[str, list[Event] | StoreError] = {sid: [] for sid in ids}
    for sid, run in groupby(rows, _SESSION_OF):  # each session's rows, one run each
        try:
            out[sid] = events_from_rows(map(_EVENT_COLUMNS, run))
        except CodecError as exc:
            out[sid] = malformed(sid, exc)
    return out


def export_session(store: Store, session_id: str) -> str:
    """One session's stored events as JSON Lines (see `nous_actor.core.codec`).

    Raises:
        TypeError, ValueError: `session_id` is not a valid session id (see
            `nous_actor.core.ids`).
        StoreError: the session has no events, or the store failed.
    """
    session_id = check_session_id(session_id)
    events = store.load(session_id)
    if not events:
        raise StoreError("no such session to export", session_id=session_id)
    from nous_actor.core.log import Log

    log = Log()
    for ev in events:
        log = log.append_event(ev)
    return "".join(line + "\n" for line in iter_jsonl(log))


def import_session(store: Store, session_id: str, text: str) -> int:
    """Store a session from JSON Lines, or seed it from a v1 JSON list of messages.

    The import holds the session's writer claim while it writes, as a fork
    does: it never writes into a session that has a live writer, and a
    session started while the import runs is refused. Either every
    event of `text` is stored, or none is. The claim is released on return
    (should releasing fail, the claim still ends with this process).

    Returns the number of events stored (at least 1).

    Raises:
        TypeError, ValueError: `session_id` is not a valid session id (see
            `nous_actor.core.ids`); nothing is stored.
        CodecError: the text is malformed, or holds no event (an empty
            input); nothing is stored.
        ConflictError: the session already has events (import into a new
            id, or delete it first), or has a live writer (stop that session
            first); nothing is stored.
        StoreError: the store failed.
    """
    session_id = check_session_id(session_id)
    events = loads(text).events()
    if not events:
        raise CodecError(
            "the input holds no events, so there is no session to import: give a JSON Lines "
            "export with at least one event, or a non-empty v1 list of messages"
        )
    try:
        token = store.claim(session_id)
    except ConflictError as exc:
        raise ConflictError(
            "cannot import into a session that has a live writer; stop that session first, "
            f"or import into a new session id ({getattr(exc, '_message', None) or exc})",
            session_id=session_id,
        ) from exc
    try:
        if store.load(session_id):
            raise ConflictError(
                "already has events; import into a new session id or delete it first",
                session_id=session_id,
            )
        refused = store.write({session_id: events})
        if session_id in refused:
            raise refused[session_id]
    finally:
        with contextlib.suppress(StoreError):
            store.release(session_id, token)
    return len(events)
