"""`NousSession`: the SDK's session protocol over one session of a registry, its factory
`NousSession.sqlite`, and the ways beyond the protocol (`open`, `turn`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from nous_actor.core.event import Event, EventType
from nous_actor.core.ids import check_session_id
from nous_actor.integrations.openai_agents.calls import _Calls
from nous_actor.integrations.openai_agents.checks import _prepare, _settings
from nous_actor.integrations.openai_agents.framework import (
    AgentsSession,
    SessionSettings,
    TResponseInputItem,
)
from nous_actor.integrations.openai_agents.items import items_from_messages, items_of_message
from nous_actor.integrations.openai_agents.records import CLEARED_KEY, OP_KEY
from nous_actor.integrations.openai_agents.registries import (
    _acquire_registry,
    _Owned,
    _release_registry,
)
from nous_actor.integrations.openai_agents.shared import _turn_of
from nous_actor.integrations.openai_agents.surface import _is_marker, _marker, _message, _plan_pop
from nous_actor.integrations.openai_agents.turn import RunTurn
from nous_actor.sessions.handle import Session, SessionHandle
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import check_turn_args
from nous_actor.sessions.turns import DEFAULT_LEASE, Policy

__all__ = ["NousSession"]


class NousSession:
    """The Agents SDK's `Session` protocol over session `session_id` of `sessions`.

    Pass it wherever the SDK takes a session (`Runner.run(agent, input,
    session=...)`). Any number of `NousSession` objects, coroutines, event
    loops and threads may use one session at once: within one registry, the
    calls on one session id run one at a time, in arrival order. Any number
    of worker processes may too, each with its own registry on one store
    (`NousSession.sqlite` on one file, or a `Sessions` on one PostgreSQL
    database): a session another live process holds is called through that
    process (see `nous_actor.Sessions.open`), and one whose holder died moves
    to the next process that calls it.

    Guarantees:

    * When `add_items` returns, every item is durably stored (committed by
      the registry's store), after everything stored before it, and the items
      of one call are contiguous: they commit as one batch, and no other call
      (of this process or another) lands between them.
    * Items round-trip exactly: `get_items` returns plain dicts equal to the
      ones given (JSON values: a tuple comes back as a list).
    * `get_items() == items_from_messages(handle.derive_messages())`, always.
    * Nothing is ever deleted: `pop_item` and `clear_session` append replaces.
    * A crash of the session is survived: the registry restarts it from the
      store and delivers the calls it had not applied to the restarted
      session, in the order sent (this object sends nothing again).
    * Each `pop_item` pops a different item, also while other processes
      pop or add: a pop planned on a surface that changed before it was
      appended is planned again.
    * Calls never block the event loop (opening or reopening the session runs
      in a worker thread); every wait is bounded by the registry's `timeout`.
    * A mutation that is cancelled (`add_items`, `pop_item`, `clear_session`)
      finishes first, as the SDK's own sessions do, then raises
      `CancelledError`; one cancelled while waiting for its turn does nothing.

    Args:
        session_id: the session's id (see `nous_actor.core.ids`).
        sessions: the registry that runs the session; its store keeps it.
        session_settings: the SDK's `SessionSettings` (or a dict of them); its
            `limit` is the default of `get_items` (``0``: no item, as the SDK's
            own sessions read it).

    Every argument is checked here, before anything is opened.

    Raises:
        TypeError: `session_id` is not a str; `sessions` is not a
            `nous_actor.Sessions`; `session_settings` is not a
            `SessionSettings`, a dict or None, holds a key `SessionSettings`
            does not have (``Unknown session settings: limitt``, as the SDK
            says), or a `limit` that is not an int or None.
        ValueError: `session_id` is not a valid id, or the settings' `limit`
            is negative (give None for every item; 0 means none).
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        sessions: Sessions,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        self.session_id = check_session_id(session_id)
        if not isinstance(sessions, Sessions):
            raise TypeError(
                "NousSession takes a nous_actor.Sessions registry, got "
                f"{type(sessions).__name__}; or use NousSession.sqlite(session_id, path)"
            )
        self.session_settings = _settings(session_settings)
        self.sessions = sessions
        self._calls = _Calls(self.session_id, sessions)
        self._owned: _Owned | None = None

    @classmethod
    def sqlite(
        cls,
        session_id: str,
        path: str | Path,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> NousSession:
        """A session on the SQLite store at `path`, under a registry opened for it.

        The drop-in for `SQLiteSession(session_id, path)`. Every
        `NousSession.sqlite` on one file in this process shares one store and
        one registry (so the same id may be opened twice); `close()` of the
        last one closes them. `":memory:"` opens a store of its own each time.
        To choose the registry's settings, or run many sessions, open a
        `Sessions` yourself and pass it to `NousSession(...)`.

        Every argument is checked before the file is opened.

        Raises:
            TypeError: `session_id` is not a str, `path` is not a str or a
                path, or `session_settings` is not what `NousSession` takes.
            ValueError: `session_id` is not a valid id, `path` is empty, or
                the settings' `limit` is negative.
            StoreError: the file cannot be opened as a store (for instance,
                another application's database, which is left unchanged).
        """
        check_session_id(session_id)
        settings = _settings(session_settings)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"NousSession.sqlite takes the SQLite file as a str or a pathlib.Path "
                f"(or ':memory:'), got {type(path).__name__}"
            )
        if not str(path):
            raise ValueError(
                "NousSession.sqlite got an empty path; give the SQLite file, e.g. "
                "'chat.db', or ':memory:' for a store in memory"
            )
        owned = _acquire_registry(path)
        try:
            session = cls(session_id, owned.sessions, session_settings=settings)
        except BaseException:
            _release_registry(owned)
            raise
        session._owned = owned
        return session

    def close(self) -> None:
        """Stop using this object; later calls raise `NousSessionClosed`.

        For `NousSession.sqlite`, the last one of a file closes its registry
        (stopping its sessions; blocks until they stopped) and its store. A
        registry passed in stays open: it is yours.
        """
        if self._calls.closed:
            return
        self._calls.close()
        owned, self._owned = self._owned, None
        if owned is not None:
            _release_registry(owned)

    def __repr__(self) -> str:
        return f"<NousSession {self.session_id!r}>"

    # -- the SDK's protocol -----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with `limit`, only the latest `limit` of them.

        `limit=None` takes `session_settings.limit`; `0` gives `[]`; a negative
        limit gives every item (as `SQLiteSession`). The items are fresh plain
        dicts, the caller's to change. They are exactly
        `items_from_messages(derive_messages())` of the session, read after
        every call made on it before this one. While this process does not
        hold the session (another web worker does, or nobody), the committed
        history is read from the store without taking it (`Sessions.read`).

        Raises:
            TypeError: `limit` is not an int or `None`.
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            CallTimeout: no answer within the registry's `timeout`.
        """
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
        self._calls.check_open()
        await self._calls.shared.lock.acquire(self.sessions.timeout, self.session_id)
        try:
            if _turn_of(self._calls.shared) is None and not self._calls.held_here():
                # Not held here (another worker process holds it, or nobody): read the
                # committed history (every add_items returned) without taking it.
                messages = await self.sessions.read(self.session_id).derive_messages()
            else:
                messages = await self._calls.read(SessionHandle.derive_messages)
        finally:
            self._calls.shared.lock.release()
        if limit is None or limit < 0:
            items = items_from_messages(messages)
        elif limit == 0:
            items = []
        else:  # map only the tail that holds the latest `limit` items
            tail: list[list[dict[str, Any]]] = []
            found = 0
            for m in reversed(messages):
                its = items_of_message(m)
                tail.append(its)
                found += len(its)
                if found >= limit:
                    break
            items = [it for its in reversed(tail) for it in its][-limit:]
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` to the session, in order, as one contiguous run.

        Every item is checked before anything is sent: a bad one stores
        nothing. The items are appended as one batch: with a store, they
        commit in one transaction, all or none, when this returns.

        If the session crashes or moves before it applied the batch, the
        registry delivers it where the session runs next. A batch sent to a
        worker process that died before answering is looked up (the holder
        recorded it with its events): stored once either way.

        Raises:
            TypeError: `items` is not a list, or an item is not a dict (the
                message names its index); nothing was stored.
            InvalidEvent: an item holds a value JSON cannot carry (a set,
                bytes, NaN, a non-str key, ...; reason
                `unserializable_event_data`, the message names the path, e.g.
                `items[2]['content']`); nothing was stored.
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            CallOutcomeUnknown: three sends of the batch in a row were lost with
                the process that held the session, none stored.
            StoreError: the store failed; the batch may or may not be stored.
            CallTimeout: no answer within the registry's `timeout`.
        """
        pending = _prepare(items)
        self._calls.check_open()
        if not pending:
            return

        async def body() -> None:
            shared = self._calls.shared
            if shared.marker is False and await self._calls.count() != shared.after:
                shared.marker = None  # written since by another process (or other code)
            if shared.marker is not False:
                surface = await self._calls.read(SessionHandle.surface)
                if surface and _is_marker(surface[-1]):
                    last = surface[-1]
                    etype, data = pending[0]
                    pending[0] = (
                        etype,
                        {
                            **data,
                            "surface_op": ["replace", last.position, last.position],
                            OP_KEY: {"op": "add_items", "replaces_seq": last.seq},
                        },
                    )
            written = await self._calls.append(pending, datetime.now(UTC))
            shared.marker, shared.after = False, written[-1].seq + 1

        await self._calls.mutate(body)

    async def pop_item(self) -> TResponseInputItem | None:
        """Hide the most recent item and return it (as added), or `None` if there is none.

        Nothing is deleted: this appends one replace, durably stored when this
        returns. It covers the range from the previous surface message to the
        popped one and holds a copy of the previous message (same data, same
        time), so the surface loses exactly the popped item; popping the only
        item appends a cleared marker instead. An empty session appends nothing.
        A message written by other code that stands for several items (an
        assistant message with tool calls) is replaced by itself without its
        last tool call.

        Raises:
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            StoreError: the store failed; the pop may or may not be stored.
            CallTimeout: no answer within the registry's `timeout`, or other
                processes wrote the session before each pop planned for that
                long (nothing was appended).
            RuntimeError: the surface holds events of other code that share
                the popped item's position, so it cannot be hidden alone;
                nothing was appended.
        """
        self._calls.check_open()

        async def body() -> dict[str, Any] | None:
            for _ in self._calls.plans():  # again when another process wrote meanwhile
                plan, seq = await self._calls.planned(_plan_pop)
                if plan is None:
                    return None
                popped, etype, data, time = plan
                written = await self._calls.append_at(seq, etype, data, time)
                if written is not None:
                    self._calls.shared.after = written.seq + 1
                    break
            meta = data.get("metadata")
            if isinstance(meta, Mapping) and CLEARED_KEY in meta:
                self._calls.shared.marker = True
            return popped

        return cast("TResponseInputItem | None", await self._calls.mutate(body))

    async def clear_session(self) -> None:
        """Hide every item; the session's history stays in the log.

        Appends one cleared marker that replaces every surface message
        (durably stored when this returns); a session with no item appends
        nothing. The next `add_items` replaces the marker, so the surface holds
        only what was added after the clear.

        Raises:
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            StoreError: the store failed; the clear may or may not be stored.
            CallTimeout: no answer within the registry's `timeout`.
        """
        self._calls.check_open()

        async def body() -> None:
            for _ in self._calls.plans():  # again when another process wrote meanwhile
                data, seq = await self._calls.planned(_plan_clear)
                if data is None:
                    return
                now = datetime.now(UTC)
                if await self._calls.append_at(seq, EventType.SYSTEM_MESSAGE, data, now):
                    break
            self._calls.shared.marker = True  # (the surface is read at the next add)

        await self._calls.mutate(body)

    # -- beyond the protocol -------------------------------------------------------------

    async def open(self) -> Session:
        """The `nous_actor` handle of this session, for compaction, fork, audit, reads.

        Opens the session on first use without blocking the loop: here, or a
        handle whose calls go to the worker process that holds it.

        Raises:
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            TooManySessions, ConflictError, StoreError: as `Sessions.open`.
        """
        self._calls.check_open()
        await self._calls.shared.lock.acquire(self.sessions.timeout, self.session_id)
        try:
            return await self._calls.handle_of()
        finally:
            self._calls.shared.lock.release()

    def turn(
        self,
        policy: Policy = "enqueue",
        *,
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
        timeout: float | None = None,
        note: str | None = None,
    ) -> RunTurn:
        """A turn for one run: ``async with session.turn(): await Runner.run(...)``.

        Inside the block, this object's calls (in this task and the tasks it
        starts) go through one turn of the session (see
        `nous_actor.SessionHandle.turn` for ``policy``, ``owner``, ``lease``,
        ``timeout`` and ``note``), so no other run's items come between the
        run's own. Without it, each call is serialised but runs may
        interleave (the SDK never says when a run starts or ends).

        Raises:
            ValueError, TypeError: bad arguments (raised here).
            NousSessionClosed: this object is closed.
        """
        check_turn_args(policy, owner, lease, timeout, note)
        self._calls.check_open()
        return RunTurn(self._calls, policy, owner, lease, timeout, note)


def _plan_clear(surface: list[Event]) -> dict[str, Any] | None:
    """The cleared marker `clear_session` appends (replacing every surface message), or
    `None` when the surface holds no item."""
    count = sum(len(items_of_message(_message(ev))) for ev in surface)
    if not count:
        return None
    stop = max(ev.position for ev in surface)
    return _marker("clear_session", 0, stop, {"op": "clear_session", "items": count})


if TYPE_CHECKING:  # mypy checks that NousSession is a Session of the SDK

    def _is_a_session(session: NousSession) -> AgentsSession:
        return session
