"""ADK's state: a state (or delta) split by scope and checked as JSON, and `_ScopedState`,
which reads the ``app:`` and ``user:`` state merged into a session's and writes app and
user state and a user's directory of sessions, each in a session of its own; and, as
those writes follow the session's own in separate logs, completes the calls whose
process died between them (`_ScopedState.settle`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final, cast

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event, EventType, InvalidEvent
from nous_actor.integrations._once import append_one_once
from nous_actor.integrations.adk.events import _adk_payload, _record
from nous_actor.integrations.adk.folds import _Readable, _StateView
from nous_actor.integrations.adk.framework import State, to_jsonable_python
from nous_actor.integrations.adk.ids import app_key, directory_key, session_key, user_key
from nous_actor.integrations.adk.loads import Scope, _Load
from nous_actor.integrations.adk.logs import CACHE_SIZE, _Logs
from nous_actor.integrations.adk.records import RECORD_KEY, SCOPED_KEY, STATE_CHECKPOINT_EVERY
from nous_actor.integrations.adk.turns import MAX_ATTEMPTS, _RunTurns

SETTLED_KEPT: Final = 4 * CACHE_SIZE
"""How many sessions a service remembers as complete up to a count of their log (past
it, the memory starts again: a read then looks once more)."""


def _json_state(state: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``state`` as JSON values, checked before anything of a call is written: a value JSON
    cannot store (an object pydantic cannot serialise, a NaN or an infinity, which the log
    would refuse only after a part of the call was written) is a TypeError."""
    try:
        jsonable = cast(dict[str, Any], to_jsonable_python(dict(state)))
        bad = _non_finite(jsonable, "")
        if bad is not None:
            raise ValueError(f"{bad} is not a JSON number; use a finite float or None")
    except Exception as exc:
        raise TypeError(
            f"{what} holds a value that cannot be stored as JSON ({exc}); store plain "
            "JSON values (str, numbers, bools, None, lists, dicts) or pydantic models"
        ) from None
    return jsonable


def _non_finite(value: Any, where: str) -> str | None:
    """Where in ``value`` (JSON values) a NaN or infinite float is (``[key]...``, then its
    value), or ``None`` if there is none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where or 'the value'} = {value}"
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def _completes(ev: Event) -> bool:
    """Whether ``ev`` of a session's log is one a call completes with state and directory
    writes: a create or delete record, or an ADK event."""
    rec = _record(ev)
    if rec is not None:
        return rec.get("op") in ("create", "delete")
    return _adk_payload(ev) is not None


def _before(writer: tuple[str, int] | None, source: tuple[str, int]) -> bool:
    """Whether ``writer`` (the session-log event a key's last write completes) is an event
    of ``source``'s session before ``source``: a write ``source`` follows in that log, so
    its completion writes over it (two calls of one session killed half-done are
    completed in their log's order, the later one's value kept)."""
    return writer is not None and writer[0] == source[0] and writer[1] < source[1]


def _split(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """App, user and session parts of a state (or delta), the prefixes stripped from the
    first two; ``temp:`` keys dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = value
    return app, user, own


class _ScopedState:
    """The state kept beside the sessions: the app's and each user's (``app:`` and
    ``user:`` keys, read merged into a session's), and each user's directory of sessions
    (what `list_sessions` reads); read through ``logs``, written through ``turns``."""

    def __init__(self, logs: _Logs, turns: _RunTurns) -> None:
        self._logs = logs
        self._turns = turns
        self._settled: dict[str, int] = {}  # session key -> count of its log known complete

    async def merged(self, app_name: str, user_id: str, own: Mapping[str, Any]) -> dict[str, Any]:
        merged, _ = await self.merged_seen(app_name, user_id, own)
        return merged

    async def merged_seen(
        self, app_name: str, user_id: str, own: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[Scope, int]]:
        """The merged state, and how much of the user's and the app's logs it holds."""
        app, user = await asyncio.gather(
            self._logs.state(app_key(app_name)), self._logs.state(user_key(app_name, user_id))
        )
        merged: dict[str, Any] = thaw(own)  # the caller's own copy, nested values too
        for k, v in app.state.items():
            merged[State.APP_PREFIX + k] = thaw(v)
        for k, v in user.state.items():
            merged[State.USER_PREFIX + k] = thaw(v)
        return merged, {"user": user.seen, "app": app.seen}

    async def stale_keys(
        self, app_name: str, user_id: str, load: _Load, delta: dict[Scope, dict[str, Any]]
    ) -> list[str]:
        """The keys of ``delta`` (by scope) written since the object of ``load`` saw them:
        writing them would lose that write."""
        stale: list[str] = []
        for scope, keys in delta.items():
            if not keys:
                continue
            if scope == "session":
                continue  # the caller checks the session's own keys against its view
            view = await self._logs.state(
                app_key(app_name) if scope == "app" else user_key(app_name, user_id)
            )
            prefix = State.APP_PREFIX if scope == "app" else State.USER_PREFIX
            stale += [prefix + k for k in keys if view.writes.get(k, -1) >= load.since(scope, k)]
        return stale

    async def seen(
        self, app_name: str, user_id: str, app: dict[str, Any], user: dict[str, Any]
    ) -> dict[Scope, int]:
        """The counts of the app's and user's logs, of those ``app`` and ``user`` (parts of a
        delta) write: what a roll-forward of the delta may not overwrite (`settle`)."""
        seen: dict[Scope, int] = {}
        if app:
            seen["app"] = (await self._logs.state(app_key(app_name))).seen
        if user:
            seen["user"] = (await self._logs.state(user_key(app_name, user_id))).seen
        return seen

    async def write_scoped(
        self,
        app_name: str,
        user_id: str,
        app: dict[str, Any],
        user: dict[str, Any],
        source: tuple[str, int] | None = None,
        seen: Mapping[str, int] | None = None,
    ) -> dict[Scope, int]:
        """Write the app and user parts of a delta, of the session-log event ``source``
        (session key, seq), written when the app's and user's logs counted ``seen`` (by
        scope; `seen`); the seq of each write, by scope. A part a roll-forward wrote
        already (`settle`, the same source) is not written again: its seq is given."""
        now = datetime.now(UTC)
        seqs: dict[Scope, int] = {}
        for scope, delta, key in (
            ("app", app, app_key(app_name)),
            ("user", user, user_key(app_name, user_id)),
        ):
            if not delta:
                continue
            if source is not None:
                after = int((seen or {}).get(scope, 0))
                done = (await self._logs.state(key)).source(source, after)
                if done is not None:
                    seqs[scope] = done  # type: ignore[index]
                    continue
            op: dict[str, Any] = {"op": "state", "delta": delta}
            if source is not None:
                op["source"] = list(source)
            [ev] = await self._turns.write(
                key, [(EventType.REQUEST_HEADER, {RECORD_KEY: op}, now)]
            )
            seqs[scope] = ev.seq  # type: ignore[index]
            await self._checkpoint(key, ev.seq)
        return seqs

    async def _checkpoint(self, key: str, seq: int) -> None:
        """Write the app's or user's state in session ``key`` whole (a checkpoint record) if
        `STATE_CHECKPOINT_EVERY` writes or more followed its last one (its write at
        ``seq`` the latest): with each key's last write and the event that write
        completes (what `stale_keys` and a roll-forward read), as of the last event
        folded. A fresh service folds the log from there."""
        known = self._logs.state_folded(key)
        if known is not None and seq - known.checkpoint < STATE_CHECKPOINT_EVERY:
            return  # not due (nothing read: a write's hot path)
        view = await self._logs.state(key)
        if view.seen - 1 - view.checkpoint < STATE_CHECKPOINT_EVERY:
            return
        view.checkpoint = view.seen  # (one checkpoint, whoever else writes meanwhile)
        op = {
            "op": "checkpoint",
            "upto": view.seen - 1,
            "state": thaw(view.state),
            "writes": dict(view.writes),
            "writers": {k: list(w) if w is not None else None for k, w in view.writers.items()},
        }
        await self._turns.write(
            key, [(EventType.REQUEST_HEADER, {RECORD_KEY: op}, datetime.now(UTC))]
        )

    def completed(self, key: str, seq: int) -> None:
        """Note that this process completed the call that wrote session ``key``'s event at
        ``seq`` (its state and directory writes too): if every event before it was
        complete, a read need not look for missing writes up to it."""
        if self._settled.get(key, -1) >= seq:
            self._settled[key] = seq + 1

    async def settle(
        self,
        app_name: str,
        user_id: str,
        sid: str,
        log: _Readable | None,
        events: list[Event] | None = None,
        count: int | None = None,
    ) -> None:
        """Complete the calls on session ``sid`` whose process died after writing the
        session's log and before its app and user state or its directory entry (ADK's
        database service writes a call in one transaction; here the session's log,
        written first, is the source of truth).

        The session's events after the latest its directory entry is written for (from
        ``log``, its log as read now, or ``events``, those read from the store when its
        log counted ``count``; neither: a log with no events) are the
        calls not known complete: each one's ``app:`` and ``user:`` parts (`SCOPED_KEY`)
        are written unless a state record of that event exists (`write_scoped` marks
        them), each key only if its log has not written it since the event was written
        (never over a newer value); then the directory entry of the latest (a deletion
        for a delete record). A call still under way in a live process is completed
        alike: its own writes then find the marks and write nothing twice.
        """
        key = session_key(app_name, user_id, sid)
        if log is not None:
            count = log.count()
        elif events is None:
            count = 0
        if count is not None and self._settled.get(key, -1) >= count:
            return
        if count == 0:
            self._settle(key, 0)
            return
        directory = await self._logs.state(directory_key(app_name, user_id))
        done = directory.done(sid)
        if events is None:
            events = log.since(done + 1) if log is not None else []
        pending = [ev for ev in events if ev.seq > done and _completes(ev)]
        for ev in pending:
            scoped = ev.data.get(SCOPED_KEY)
            source = (key, ev.seq)
            if isinstance(scoped, Mapping) and not await self._roll_forward(
                app_name, user_id, source, scoped
            ):
                return  # outpaced by other writes: the next read tries again
        if pending:
            last = pending[-1]
            rec = _record(last)
            if rec is not None and rec.get("op") == "delete":
                await self.write_directory(app_name, user_id, sid, last.seq, None, deleted=True)
            else:
                view = await self._logs.view(key)
                if view.created is not None and view.last >= last.seq:
                    await self.write_directory(
                        app_name, user_id, sid, last.seq, view.state, view.last_update
                    )
        if count is not None:
            self._settle(key, count)

    async def settle_scoped(
        self, app_name: str, user_id: str, sid: str, events: list[Event]
    ) -> None:
        """Write the ``app:`` and ``user:`` parts of those of session ``sid``'s ``events``
        (in log order, each carrying them) that no state record completes yet, as `settle`
        does, without its directory entry (a read of a session's latest events completes
        its state from the events it read; the app's and user's logs it reads anyway)."""
        key = session_key(app_name, user_id, sid)
        app, user = await asyncio.gather(
            self._logs.state(app_key(app_name)), self._logs.state(user_key(app_name, user_id))
        )
        for ev in events:
            scoped = ev.data.get(SCOPED_KEY)
            if not isinstance(scoped, Mapping):
                continue
            source = (key, ev.seq)
            seen = scoped.get("seen")
            seen = seen if isinstance(seen, Mapping) else {}
            if (
                not scoped.get("app") or app.source(source, int(seen.get("app", 0))) is not None
            ) and (
                not scoped.get("user") or user.source(source, int(seen.get("user", 0))) is not None
            ):
                continue
            if not await self._roll_forward(app_name, user_id, source, scoped):
                return  # outpaced by other writes: the next read tries again
            app, user = await asyncio.gather(
                self._logs.state(app_key(app_name)),
                self._logs.state(user_key(app_name, user_id)),
            )

    async def settle_listed(
        self, app_name: str, user_id: str, sid: str, count: int, directory: _StateView
    ) -> bool:
        """`settle` session ``sid`` for a listing, its log counting ``count`` in the store's
        index and its user's directory as ``directory`` (caught up): its events after
        the latest its entry is written for are read from the store (the session is not
        opened), if any; whether anything was missing (then written)."""
        key = session_key(app_name, user_id, sid)
        if self._settled.get(key, -1) >= count:
            return False
        done = directory.done(sid)
        events = []
        if count - 1 > done:
            events = await self._logs.sessions.read(key).since(done + 1)
        if not any(_completes(ev) for ev in events):
            self._settle(key, count)
            return False
        await self.settle(app_name, user_id, sid, None, events, count)
        return True

    def _settle(self, key: str, count: int) -> None:
        """Remember that session ``key``'s log is complete up to ``count``."""
        if len(self._settled) > SETTLED_KEPT:
            self._settled.clear()
        self._settled[key] = max(count, self._settled.get(key, -1))

    async def _roll_forward(
        self, app_name: str, user_id: str, source: tuple[str, int], scoped: Mapping[str, Any]
    ) -> bool:
        """Write the app and user parts ``scoped`` of the session-log event ``source``
        unless a state record of it exists; a key written in its log since the event's
        ``seen`` count is left as it is, unless that write completes an earlier event of
        the same session (the session's log orders the two). Each write is at the log's
        next seq as read (a write meanwhile, another roll-forward's too, makes it read and
        decide again, at most `MAX_ATTEMPTS` times); whether both parts are written now."""
        seen = scoped.get("seen")
        seen = seen if isinstance(seen, Mapping) else {}
        for scope, key in (("app", app_key(app_name)), ("user", user_key(app_name, user_id))):
            delta = scoped.get(scope)
            if not isinstance(delta, Mapping) or not delta:
                continue
            after = int(seen.get(scope, 0))
            handle = await self._logs.handle(key)
            for _ in range(MAX_ATTEMPTS):
                view = await self._logs.state(key)
                if view.source(source, after) is not None:
                    break
                fresh = {
                    k: thaw(v)
                    for k, v in delta.items()
                    if view.writes.get(k, -1) < after or _before(view.writers.get(k), source)
                }
                op = {"op": "state", "delta": fresh, "source": list(source)}
                write = partial(
                    handle.append_at,
                    view.seen,
                    EventType.REQUEST_HEADER,
                    {RECORD_KEY: op},
                    datetime.now(UTC),
                )
                try:
                    await append_one_once(handle, write)
                    break
                except InvalidEvent as exc:
                    if exc.reason != "seq_behind_head":
                        raise
            else:
                return False
            await self._checkpoint(key, view.seen)
        return True

    async def write_directory(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        seq: int,
        state: Mapping[str, Any] | None,
        ts: float | None = None,
        deleted: bool = False,
    ) -> None:
        """Write the session's entry in its user's directory as of its event at ``seq``:
        its last update time ``ts``, its whole state if given; or its deletion."""
        op: dict[str, Any]
        if deleted:
            op = {"op": "session_deleted"}
        else:
            op = {"op": "session", "ts": ts}
            if state is not None:
                op["state"] = dict(state)
        record = {RECORD_KEY: {**op, "id": session_id, "seq": seq}}
        await self._turns.write(
            directory_key(app_name, user_id),
            [(EventType.REQUEST_HEADER, record, datetime.now(UTC))],
        )

    async def user_state(self, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, without the prefix (``{}`` when there is none)."""
        view = await self._logs.state(user_key(app_name, user_id))
        return thaw(view.state)  # type: ignore[no-any-return]
