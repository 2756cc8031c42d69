"""`NousSessionService`: ADK's session service, one class holding its collaborators, each
owning its state: the logs and their cached folds (`logs`), what each returned `Session`
object has seen (`loads`), the locks of a write checked for staleness (`locks`), the
runs' turns that writes go through (`turns`), the app and user state and directories
(`state`) and the builds of returned objects (`reads`). ADK's writes
(`create_session`, `delete_session`, `append_event`) are its own."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event, EventType, InvalidEvent
from nous_actor.integrations._once import append_one_once
from nous_actor.integrations.adk.events import _dumped, _text_of, _utc, event_data
from nous_actor.integrations.adk.folds import _View
from nous_actor.integrations.adk.framework import (
    AdkEvent,
    AdkSession,
    AlreadyExistsError,
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
    SessionNotFoundError,
    StaleSessionError,
    State,
)
from nous_actor.integrations.adk.ids import app_key, session_key, user_key
from nous_actor.integrations.adk.loads import Scope, _Load, _Loads
from nous_actor.integrations.adk.locks import _NamedLocks
from nous_actor.integrations.adk.logs import _Logs
from nous_actor.integrations.adk.reads import _Reads
from nous_actor.integrations.adk.records import (
    CHECKPOINT_EVERY,
    RECORD_KEY,
    SCOPED_KEY,
    STATE_KEY,
    TIME_KEY,
)
from nous_actor.integrations.adk.runs import NousRunPlugin
from nous_actor.integrations.adk.state import _json_state, _ScopedState, _split
from nous_actor.integrations.adk.turns import _RunTurns
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import check_turn_args
from nous_actor.sessions.turns import Policy
from nous_actor.store.sqlite import SQLiteStore

__all__ = ["NousSessionService"]

RACED_WRITES: Final = 64
"""How many times in a row an append outside a run's turn is written at the seq after the
log as read, each outpaced by another append (then re-read, and the event looked for),
before it is written after whatever is there."""


class NousSessionService(BaseSessionService):
    """ADK's `BaseSessionService` over the sessions of `sessions` (any store).

    Guarantees:

    * When `create_session`, `append_event` or `delete_session` returns, what
      it wrote is durably stored (committed by the registry's store).
    * `get_session` returns the events appended, equal to the ones given, in
      order, and the state they and `create_session` set (``app:`` and
      ``user:`` keys merged in); with a config, only the events asked for,
      read from the tail of the log (recent events: without decoding the
      others).
    * One writer per session: the registry's session actor serialises every
      write, so appends of events from concurrent runs never fail as stale
      (ADK's database service raises "modified in storage"); with `plugin`,
      runs of one session take turns instead of interleaving, and a queued
      run's `Session` keeps the events it loaded and gains every one
      committed before its turn.
    * No lost update: outside a run's turn, an `append_event` whose state
      delta writes a key written in storage since that `Session` object was
      loaded raises ADK's `StaleSessionError`, nothing stored.
    * Any number of worker processes may serve one store, each with its own
      service: a session another live process holds is read and written
      through that process (see `nous_actor.Sessions.open`), nothing moves
      and nothing is refused; a session whose holder died moves to the next
      process that calls it.
    * A crash of a session is survived: the registry restarts it from the
      store, and the calls it had not applied are delivered to the restarted
      session in order (nothing is sent again by the service); a run's turn
      that the restart ended is opened again.
    * A call killed part-way is completed: each call writes the session's
      log first, then the ``app:``/``user:`` state and the user's directory;
      the next read of that session (`get_session`, `append_event`,
      `create_session` or `delete_session` of its id, `list_sessions` of its
      user) writes what a dead call left out, from the session's log, in its
      order, never over a newer value and never twice (`_ScopedState.settle`;
      a read of the latest events writes the state, not the directory entry).
    * Nothing is deleted: compaction and deletion append records; the log
      keeps every event for audit, fork and rewind.

    The events of a returned `Session` are shared with the service's cache of
    decoded events (as ADK's in-memory service shares them under its
    light-copy option): read them, do not change them in place.

    Args:
        sessions: the registry that runs the sessions; its store keeps them.

    Raises:
        TypeError: ``sessions`` is not a `nous_actor.Sessions`.
    """

    def __init__(self, sessions: Sessions) -> None:
        if not isinstance(sessions, Sessions):
            raise TypeError(
                "NousSessionService takes a nous_actor.Sessions registry, got "
                f"{type(sessions).__name__}; or use NousSessionService.sqlite(path)"
            )
        self.sessions = sessions
        self._owned: SQLiteStore | None = None
        self._logs = _Logs(sessions)
        self._loads = _Loads()
        self._locks = _NamedLocks()
        self._turns = _RunTurns(self._logs)
        self._state = _ScopedState(self._logs, self._turns)
        self._reads = _Reads(self._logs, self._loads, self._state)

    @classmethod
    def sqlite(cls, path: str | Path) -> NousSessionService:
        """A service on the SQLite store at ``path``, under a registry opened for it;
        `close` closes both.

        Raises:
            TypeError: ``path`` is not a str or a path.
            ValueError: ``path`` is empty.
            StoreError: the file cannot be opened as a store.
        """
        if not isinstance(path, (str, Path)):
            raise TypeError(f"path must be a str or a pathlib.Path, got {type(path).__name__}")
        if not str(path):
            raise ValueError("path is empty; give the SQLite file, e.g. 'adk.db'")
        store = SQLiteStore(path)
        service = cls(Sessions(store))
        service._owned = store
        return service

    async def close(self) -> None:
        """Close the registry and store opened by `sqlite` (a registry passed in is yours)."""
        store, self._owned = self._owned, None
        if store is not None:
            await self.sessions.aclose()
            store.close()

    def plugin(
        self,
        policy: Policy = "enqueue",
        *,
        lease: float = 300.0,
        wait: float = 300.0,
    ) -> NousRunPlugin:
        """The ADK plugin that makes each run a turn of its session (see the module docs).

        Args:
            policy: what a run does when another run holds the session:
                ``enqueue`` (wait, first come first served, at most ``wait``
                seconds, then `nous_actor.TurnBusy`), ``reject`` (`TurnBusy` at
                once), ``interrupt`` or ``rollback`` (see
                `nous_actor.SessionHandle.turn`).
            lease: seconds a run may go without writing before its turn
                expires (a run whose process vanished frees the session then).
            wait: seconds an ``enqueue`` run waits for the session.

        Raises:
            ValueError, TypeError: bad arguments.
        """
        check_turn_args(policy, None, lease, wait, None)
        return NousRunPlugin(self, policy, lease, wait)

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> AdkSession:
        """Create a session (a generated id when ``session_id`` is None or blank).

        Its ``app:`` and ``user:`` keys are written to the app's and user's
        state; ``temp:`` keys are dropped. Durably stored when this returns.

        Raises:
            AlreadyExistsError: the session exists (and was not deleted).
            TypeError: a name or id is not a str, or ``state`` is not a dict of
                JSON-storable values (a NaN or an infinity is not); nothing stored.
            ValueError: the encoded id is too long (see `session_key`).
        """
        if state is not None and not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict or None, got {type(state).__name__}")
        if session_id is not None and not isinstance(session_id, str):
            raise TypeError(f"session_id must be a str or None, got {type(session_id).__name__}")
        sid = (session_id or "").strip() or uuid.uuid4().hex
        key = session_key(app_name, user_id, sid)
        app, user, own = _split(_json_state(state or {}, "state"))
        now = time.time()
        view = await self._logs.view(key)
        await self._state.settle(app_name, user_id, sid, view.log)
        if view.created is not None:
            raise AlreadyExistsError(f"Session with id {sid} already exists.")
        record: dict[str, Any] = {RECORD_KEY: {"op": "create", "state": own}, TIME_KEY: now}
        if app or user:
            seen_before = await self._state.seen(app_name, user_id, app, user)
            record[SCOPED_KEY] = {"app": app, "user": user, "seen": seen_before}
        handle = await self._logs.handle(key)
        try:  # at the seq after the log seen: a create that raced this one wins alone
            ev = await append_one_once(
                handle,
                lambda: handle.append_at(view.seen, EventType.REQUEST_HEADER, record, _utc(now)),
            )
        except InvalidEvent as exc:
            if exc.reason == "seq_behind_head":
                raise AlreadyExistsError(f"Session with id {sid} already exists.") from None
            raise
        await self._state.write_scoped(
            app_name, user_id, app, user, (key, ev.seq), record.get(SCOPED_KEY, {}).get("seen")
        )
        await self._state.write_directory(app_name, user_id, sid, ev.seq, own, now)
        self._state.completed(key, ev.seq)
        merged, seen = await self._state.merged_seen(app_name, user_id, own)
        session = AdkSession(
            id=sid, app_name=app_name, user_id=user_id, state=merged, last_update_time=now
        )
        self._loads.remember(session, _Load({"session": ev.seq + 1, **seen}, ev.seq + 1))
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> AdkSession | None:
        """The session, or ``None`` if there is none (never created, or deleted).

        With ``config``: ``num_recent_events`` keeps the latest that many events
        (0: none), ``after_timestamp`` the latest run of events with timestamps
        at or after it (as ADK's in-memory service reads it); only those events
        are decoded.

        Raises:
            TypeError: a name or id is not a str, or ``config`` is not a
                `GetSessionConfig`.
            ValueError: the encoded id is too long, or ``config`` asks for what
                has no answer: a negative ``num_recent_events`` (ADK's config
                refuses one; a config built without its checks does not) or a
                NaN ``after_timestamp``.
        """
        if config is not None and not isinstance(config, GetSessionConfig):
            raise TypeError(
                f"config must be a GetSessionConfig or None, got {type(config).__name__}"
            )
        if config is not None:
            _check_config(config)
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
        sid = session_id.strip()
        if not sid:
            return None
        return await self._reads.get(app_name, user_id, sid, config)

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions of ``app_name`` (of ``user_id``, or of every user when None),
        without events, with their merged state, oldest update first.

        Read from the store's index and each user's directory (a session per
        user): no session's events are read.

        Raises:
            TypeError: ``app_name`` or ``user_id`` is not a str.
        """
        return await self._reads.listing(app_name, user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session for ADK: it is gone from `get_session` and listings, and its
        id may be created again. Its history stays in the log (a deletion record is
        appended). Deleting a session that does not exist does nothing.

        Raises:
            TypeError: a name or id is not a str.
            ValueError: the encoded id is too long.
        """
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
        sid = session_id.strip()
        if not sid:
            return
        key = session_key(app_name, user_id, sid)
        view = await self._logs.view(key)
        await self._state.settle(app_name, user_id, sid, view.log)  # a killed delete's too
        if view.created is None:
            return
        record = {RECORD_KEY: {"op": "delete"}}
        [ev] = await self._turns.write(
            key, [(EventType.REQUEST_HEADER, record, datetime.now(UTC))]
        )
        await self._state.write_directory(app_name, user_id, sid, ev.seq, None, deleted=True)
        self._state.completed(key, ev.seq)

    async def append_event(self, session: AdkSession, event: AdkEvent) -> AdkEvent:
        """Append ``event`` to ``session`` (the stored one and the object), applying its
        state delta; a partial event is returned untouched and not stored, and so is
        an event the stored session holds already (same id, equal once its ``temp:``
        keys are dropped: a retried append, also one racing its first try), which an
        object lacking it gains.

        ``temp:`` keys of the delta go to the object's state only and are
        removed from the event; ``app:`` and ``user:`` keys go to the app's
        and user's state; the rest to the session's. A compaction event
        (``actions.compaction``) also replaces, on the model-visible surface,
        the events whose timestamps it covers by its summary. Durably stored
        when this returns; during a run (see `plugin`), written through the
        run's turn.

        Raises:
            TypeError: ``session`` or ``event`` is not ADK's `Session` / `Event`, or
                the state delta holds a value JSON cannot store (a NaN, an
                infinity); nothing was stored.
            SessionNotFoundError: the session does not exist (or was deleted, also
                by another process while this call was under way); nothing was stored.
            TurnInterrupted: the run's turn was taken by another run (policy
                ``interrupt`` or ``rollback``); nothing was stored.
            TurnBusy: another run holds the session, and this write (outside
                any run) waited its bound. A compaction event does not wait for
                a run of this service: it is written through that run's turn.
            StaleSessionError: (ADK's) outside a run's turn, the delta writes a
                key (session, ``app:`` or ``user:``) written in storage since
                ``session`` was loaded by this service (`get_session`,
                `create_session`): storing it would lose that write. Nothing
                was stored; reload the session and apply the change again.
        """
        if not isinstance(session, AdkSession):
            raise TypeError(f"session must be an ADK Session, got {type(session).__name__}")
        if not isinstance(event, AdkEvent):
            raise TypeError(f"event must be an ADK Event, got {type(event).__name__}")
        if event.partial:
            return event
        key = session_key(session.app_name, session.user_id, session.id)
        view = await self._logs.view(key)
        await self._state.settle(session.app_name, session.user_id, session.id, view.log)
        if view.created is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        found = _stored_already(view, event)
        if found is not None:
            return await self._redelivered(session, event, found)
        delta = dict(event.actions.state_delta) if event.actions else {}
        stored = {k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)}
        app, user, own = _split(_json_state(stored, "the event's state delta"))
        load = self._loads.of(session)
        in_turn = self._turns.holds(key, event.invocation_id)
        if load is None or in_turn or not (app or user or own):
            return await self._append(session, event, key, view, load, app, user, own)
        # Outside a run's turn, a write of a key changed since the object saw it would lose
        # that change: checked and written under the service's locks of what it writes
        # (the app's state, the user's, the session's; always in that order).
        guards = [f"a/{session.app_name}"] if app else []
        if user:
            guards.append(f"u/{session.app_name}/{session.user_id}")
        guards.append(f"s/{key}")
        async with self._locks.hold(guards):
            view = await self._logs.view(key)
            if view.created is None:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            found = _stored_already(view, event)
            if found is not None:
                return await self._redelivered(session, event, found)
            stale = [k for k in own if view.writes.get(k, -1) >= load.since("session", k)]
            if view.created >= load.seen["session"] and own:
                stale = sorted(own)  # deleted and created again since it was loaded
            stale += await self._state.stale_keys(
                session.app_name, session.user_id, load, {"app": app, "user": user}
            )
            if stale:
                raise StaleSessionError(
                    f"The session {session.id} has been modified in storage since it was "
                    f"loaded: {', '.join(sorted(stale))} changed, and this event's state "
                    "delta would overwrite that. Reload the session (get_session) and "
                    "apply the change again, or run through the service's plugin (runs "
                    "take turns). Nothing was stored."
                )
            return await self._append(session, event, key, view, load, app, user, own)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, without the prefix (``{}`` when there is none)."""
        return await self._state.user_state(app_name, user_id)

    # -- what NousRunPlugin's hooks call (runs.py's _Runs) ----------------------------------

    async def _open_run(self, plugin: NousRunPlugin, session: AdkSession, invocation: str) -> None:
        """Open run ``invocation``'s turn of ``session`` (once), then bring the run's
        object up to date with what runs before it wrote."""
        key = session_key(session.app_name, session.user_id, session.id)
        if self._turns.holds(key, invocation):
            return
        owner = f"adk invocation {invocation}"
        await self._turns.open(key, invocation, plugin.policy, owner, plugin.lease, plugin.wait)
        await self._reads.refresh(session)

    async def _close_run(self, session: AdkSession, invocation: str, failed: bool) -> None:
        """Close run ``invocation``'s turn of ``session`` (as failed: ``how: "failed"``)."""
        key = session_key(session.app_name, session.user_id, session.id)
        await self._turns.close(key, invocation, failed)

    # -- ADK's writes, under append_event ---------------------------------------------------

    async def _append(
        self,
        session: AdkSession,
        event: AdkEvent,
        key: str,
        view: _View,
        load: _Load | None,
        app: dict[str, Any],
        user: dict[str, Any],
        own: dict[str, Any],
    ) -> AdkEvent:
        """`append_event`'s writes, checked already: the event, a checkpoint when due, the
        app and user state, the session's directory entry; then the object."""
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        etype, data = event_data(event)
        if own:
            data[STATE_KEY] = own
        if app or user:  # what completes this call if its process dies after the event
            seen = await self._state.seen(session.app_name, session.user_id, app, user)
            data[SCOPED_KEY] = {"app": app, "user": user, "seen": seen}
        compaction = event.actions.compaction if event.actions else None
        if compaction is not None:
            etype, data = self._as_replace(view, compaction, data)
        item = (etype, data, _utc(event.timestamp))
        if compaction is None and not self._turns.holds(key, event.invocation_id):
            written = await self._write_new(session.id, key, view, event, item)
            if isinstance(written, int):  # the same event, stored meanwhile (a racing retry)
                return await self._redelivered(session, event, written, applied=True)
            ev, view = written
        else:
            [ev] = await self._turns.write(
                key,
                [item],
                event.invocation_id,
                any_turn=compaction is not None,  # a replace of earlier events: never waits
            )
        if ev.seq - view.checkpoint >= CHECKPOINT_EVERY:
            view.checkpoint = ev.seq  # (one checkpoint, whoever else appends meanwhile)
            await self._checkpoint(key, event.invocation_id)
        seqs = await self._state.write_scoped(
            session.app_name,
            session.user_id,
            app,
            user,
            (key, ev.seq),
            data[SCOPED_KEY]["seen"] if app or user else None,
        )
        state = (await self._logs.view(key)).state if own else None
        await self._state.write_directory(
            session.app_name, session.user_id, session.id, ev.seq, state, event.timestamp
        )
        self._state.completed(key, ev.seq)
        if load is not None:
            for k in own:
                load.own["session", k] = ev.seq + 1
            for scope, keys in (("app", app), ("user", user)):
                for k in keys:
                    load.own[scope, k] = seqs[scope] + 1  # type: ignore[index]
        self._update_session_state(session, event)
        session.events.append(event)
        session.last_update_time = event.timestamp
        return event

    async def _write_new(
        self,
        sid: str,
        key: str,
        view: _View,
        event: AdkEvent,
        item: tuple[EventType, dict[str, Any], datetime],
    ) -> tuple[Event, _View] | int:
        """Write ``item`` (``event`` as stored) outside any run's turn, unless the session
        holds the event already: at the seq after the log ``view`` folded, so a write
        that lands first (the same event's retry racing this call, in this process or in
        another; a delete) makes this one read the log again and look again. The seq of
        the event if it is stored meanwhile, else the event written and the view it was
        written after. Outpaced by other appends `RACED_WRITES` times in a row, it is
        written after whatever is there (as an append outside the check is).

        Raises:
            SessionNotFoundError: the session was deleted meanwhile; nothing was stored.
        """
        handle = await self._logs.handle(key)
        created = view.created
        for _ in range(RACED_WRITES):
            at = view.seen
            try:
                ev = await append_one_once(handle, partial(handle.append_at, at, *item))
                return ev, view
            except InvalidEvent as exc:
                if exc.reason != "seq_behind_head":
                    raise
            view = await self._logs.view(key)
            if view.created != created:  # deleted meanwhile (and maybe created again)
                raise SessionNotFoundError(
                    f"Session {sid} not found: it was deleted while this "
                    "event was being appended; nothing was stored. Create the session "
                    "again (create_session) and append to the session it returns."
                )
            stored = _stored_already(view, event)
            if stored is not None:
                return stored
        [ev] = await self._turns.write(key, [item], event.invocation_id)
        return ev, view

    async def _redelivered(
        self, session: AdkSession, event: AdkEvent, seq: int, applied: bool = False
    ) -> AdkEvent:
        """``event``, stored already at ``seq`` (an equal event with its id), returned
        unchanged and not stored again; an object that lacks it (its first append timed
        out after the store committed it, or another object's raced it) gains it, as
        that append would have given it (``applied``: its ``temp:`` keys are applied
        already), with the writes of its state delta: the object has seen them, so its
        next write of those keys is not stale."""
        if any(e.id == event.id and e == event for e in session.events):
            return event
        if not applied:
            self._apply_temp_state(session, event)
            event = self._trim_temp_delta_state(event)
        self._update_session_state(session, event)
        session.events.append(event)
        session.last_update_time = event.timestamp
        load = self._loads.of(session)
        delta = event.actions.state_delta if event.actions else {}
        if load is None or not delta:
            return event
        app, user, own = _split(delta)
        key = session_key(session.app_name, session.user_id, session.id)
        if app or user:  # the first try may still be under way: its state is completed here
            view = await self._logs.view(key)
            await self._state.settle(session.app_name, session.user_id, session.id, view.log)
        seen: list[tuple[Scope, str, int]] = [("session", k, seq + 1) for k in own]
        for scope, part, log_key in (
            ("app", app, app_key(session.app_name)),
            ("user", user, user_key(session.app_name, session.user_id)),
        ):
            if part:  # the state record that completes the event (none yet: not seen)
                after = _seen_by(view, seq).get(scope, 0)
                done = (await self._logs.state(log_key)).source((key, seq), after)
                if done is not None:
                    seen += [(scope, k, done + 1) for k in part]  # type: ignore[misc]
        for scope, k, after in seen:
            load.own[scope, k] = max(after, load.since(scope, k))
        return event

    async def _checkpoint(self, key: str, invocation_id: str | None) -> None:
        """Write the session's state as of the last event folded (a checkpoint record)."""
        view = await self._logs.view(key)
        if view.created is None:
            return
        record = {RECORD_KEY: {"op": "checkpoint", "upto": view.seen - 1, "state": view.state}}
        await self._turns.write(
            key, [(EventType.REQUEST_HEADER, record, datetime.now(UTC))], invocation_id
        )

    def _as_replace(
        self, view: _View, compaction: Any, data: dict[str, Any]
    ) -> tuple[EventType, dict[str, Any]]:
        """A compaction event as a ``system_message`` replacing the covered events."""
        lo, hi = float(compaction.start_timestamp), float(compaction.end_timestamp)
        covered = [p for p, t in zip(view.positions, view.times, strict=True) if lo <= t <= hi]
        if not covered:
            return EventType.REQUEST_HEADER, data
        parts = compaction.compacted_content.parts or []
        text = _text_of(parts, False) or ""
        return EventType.SYSTEM_MESSAGE, {
            **data,
            "content": text,
            "name": "adk_compaction",
            "surface_op": ["replace", min(covered), max(covered)],
        }


def _check_config(config: GetSessionConfig) -> None:
    """Refuse a ``GetSessionConfig`` whose filter has no answer, as a ValueError."""
    count, after = config.num_recent_events, config.after_timestamp
    if isinstance(count, int) and count < 0:
        raise ValueError(
            f"config.num_recent_events must be at least 0 (or None), got {count!r}; "
            "give 0 for no events, or None for every event"
        )
    if after is not None and math.isnan(after):
        raise ValueError(
            "config.after_timestamp is NaN, which no event's timestamp is at or after; "
            "give a time in seconds since the epoch, or None for every event"
        )


def _seen_by(view: _View, seq: int) -> dict[str, int]:
    """The counts of the app's and user's logs the call that wrote the event at ``seq`` of
    the session of ``view`` read before writing it (`SCOPED_KEY`); ``{}`` if it has none."""
    for ev in view.log.since(seq) if view.log is not None else []:
        scoped = ev.data.get(SCOPED_KEY) if ev.seq == seq else None
        seen = scoped.get("seen") if isinstance(scoped, Mapping) else None
        return {str(k): int(v) for k, v in seen.items()} if isinstance(seen, Mapping) else {}
    return {}


def _stored_already(view: _View, event: AdkEvent) -> int | None:
    """The seq of the event of the session of ``view`` with ``event``'s id equal to it as
    it would be stored (its ``temp:`` keys dropped), or ``None``: an append of it again
    is a retry, which ADK's in-memory service answers without storing or applying it
    twice. An event that only shares the id is another event (kept, as that service
    keeps it)."""
    seqs = view.ids.get(event.id)
    if not seqs:
        return None
    dumped = _dumped(event)
    delta = dumped.get("actions", {}).get("state_delta")
    if delta:
        dumped["actions"]["state_delta"] = {
            k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)
        }
    return next((seq for seq in seqs if thaw(view.stored(seq)) == dumped), None)
