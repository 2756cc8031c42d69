"""Reads: `_Reads`, which builds the `Session` objects a service returns: a session got
(from the tail of the log for a first read of the latest events), the sessions listed
(from the store's index and each user's directory, no session's events read, built
fast), and a run's object brought up to date once its turn is open."""

from __future__ import annotations

import asyncio
import bisect
import inspect
from typing import Any, Final
from urllib.parse import unquote

from nous_actor.core._frozen import thaw
from nous_actor.integrations.adk.events import _decode
from nous_actor.integrations.adk.folds import _StateView, _tail
from nous_actor.integrations.adk.framework import (
    AdkSession,
    GetSessionConfig,
    ListSessionsResponse,
    State,
)
from nous_actor.integrations.adk.ids import _part, directory_key, parse_key, session_key
from nous_actor.integrations.adk.loads import _Load, _Loads
from nous_actor.integrations.adk.logs import _Logs
from nous_actor.integrations.adk.state import _ScopedState
from nous_actor.sessions.registry import Sessions
from nous_actor.store.base import SessionInfo, list_sessions


class _Reads:
    """The `Session` objects a service returns, built from the folds of ``logs`` and the
    state of ``state``; each one's `_Load` (what it has seen) is kept in ``loads``."""

    def __init__(self, logs: _Logs, loads: _Loads, state: _ScopedState) -> None:
        self._logs = logs
        self._loads = loads
        self._state = state

    async def get(
        self, app_name: str, user_id: str, sid: str, config: GetSessionConfig | None
    ) -> AdkSession | None:
        """The session ``sid`` (a non-blank id) as `get_session` gives it, or ``None``."""
        key = session_key(app_name, user_id, sid)
        folded = self._logs.folded(key)
        if not folded and not await self._logs.stored(key):
            return None  # never created: nothing opened (here, or in the holder's process)
        if (
            not folded
            and config is not None
            and config.num_recent_events is not None
            and config.after_timestamp is None
        ):  # a first read of the latest events: from the tail, not the whole history
            # A call killed part-way gets its app and user state from the events read
            # here (the app's and user's logs are read anyway); its directory entry is
            # left to the next whole read, append, create, delete or listing (the user's
            # directory is a log as long as all of the user's appends, which this read of
            # a few events must not pay).
            log = await self._logs.log(key)
            tail = _tail(log, config.num_recent_events)
            if tail is None:
                return None
            if tail.scoped:
                await self._state.settle_scoped(app_name, user_id, sid, tail.scoped)
            merged, seen = await self._state.merged_seen(app_name, user_id, tail.state)
            session = AdkSession(
                id=sid,
                app_name=app_name,
                user_id=user_id,
                state=merged,
                events=[_decode(ev) for ev in tail.events],
                last_update_time=tail.last_update,
            )
            first = tail.events[0].seq if tail.events else log.count()
            self._loads.remember(session, _Load({"session": log.count(), **seen}, first))
            return session
        view = await self._logs.view(key)
        await self._state.settle(app_name, user_id, sid, view.log)
        if view.created is None:
            return None
        own, seen_here, last_update = dict(view.state), view.seen, view.last_update
        first = 0
        n = len(view.seqs)
        if config is not None:
            if config.num_recent_events is not None:
                first = max(0, n - config.num_recent_events)
            if config.after_timestamp is not None:
                i = n - 1
                while i >= first and view.times[i] >= config.after_timestamp:
                    i -= 1
                if i >= first:
                    first = i + 1
        events = view.events(first) if first < n else []
        first_seq = view.seqs[first] if first < n else seen_here
        merged, seen = await self._state.merged_seen(app_name, user_id, own)
        session = AdkSession(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=merged,
            events=events,
            last_update_time=last_update,
        )
        self._loads.remember(session, _Load({"session": seen_here, **seen}, first_seq))
        return session

    async def listing(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        """The sessions of ``app_name`` (of ``user_id``, or of every user) as
        `list_sessions` gives them."""
        app = _part(app_name, "app_name")
        if user_id is not None:
            prefix = f"adk/s/{app}/{_part(user_id, 'user_id')}/"
        else:
            prefix = f"adk/s/{app}/"
        index = asyncio.ensure_future(asyncio.to_thread(_index, self._logs.sessions, prefix))
        known: dict[str, tuple[_StateView, dict[str, Any]]] = {}
        if user_id is not None:  # read the user's directory and state meanwhile
            try:
                known[user_id] = await asyncio.gather(
                    self._logs.state(directory_key(app_name, user_id)),
                    self._state.merged(app_name, user_id, {}),
                )
            except BaseException:
                index.cancel()
                raise
        infos = await index
        groups: dict[str, list[tuple[str, SessionInfo]]] = {}
        if user_id is not None:
            cut = len(prefix)
            groups[user_id] = [(unquote(i.session_id[cut:]), i) for i in infos]
        else:
            for info in infos:
                kind, parts = parse_key(info.session_id)
                if kind == "session" and parts[0] == app_name:
                    groups.setdefault(parts[1], []).append((parts[2], info))
        found: list[AdkSession] = []
        for user in sorted(groups):
            if user not in known:
                known[user] = await asyncio.gather(
                    self._logs.state(directory_key(app_name, user)),
                    self._state.merged(app_name, user, {}),
                )
            directory, merged = known[user]
            settled = [
                await self._state.settle_listed(app_name, user, sid, info.next_seq, directory)
                for sid, info in groups[user]
            ]
            if any(settled):  # a call killed after its session's log: completed, read again
                directory, merged = known[user] = await asyncio.gather(
                    self._logs.state(directory_key(app_name, user)),
                    self._state.merged(app_name, user, {}),
                )
            for sid, info in groups[user]:
                entry = directory.directory.get(sid)
                if entry is None or entry.state_seq < 0:
                    continue  # deleted (or never created: only opened)
                state: dict[str, Any] = thaw(entry.state)  # each session's own, nested too
                if merged:
                    state.update(thaw(merged))
                if entry.ts is not None:  # the time of its latest ADK event, as get_session's
                    stamp = entry.ts
                else:  # listed before directories kept it: the latest time of its log
                    stamp = info.last_time.timestamp() if info.last_time is not None else 0.0
                found.append(_listed(sid, app_name, user, state, stamp))
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse.model_construct(sessions=found)

    async def refresh(self, session: AdkSession) -> None:
        """Bring ``session`` (a run's object) up to date with what other runs wrote: it
        keeps the events it was given and gains every event committed since (never
        fewer), and its state becomes the stored one (its ``temp:`` keys kept)."""
        key = session_key(session.app_name, session.user_id, session.id)
        view = await self._logs.view(key)
        if view.created is None:
            return
        load = self._loads.of(session)
        start = bisect.bisect_left(view.seqs, load.first) if load is not None else 0
        session.events[:] = view.events(start) if start < len(view.seqs) else []
        first = view.seqs[start] if start < len(view.seqs) else view.seen
        own, seen_here, last_update = dict(view.state), view.seen, view.last_update
        merged, seen = await self._state.merged_seen(session.app_name, session.user_id, own)
        temp = {k: v for k, v in session.state.items() if k.startswith(State.TEMP_PREFIX)}
        session.state.clear()
        session.state.update(merged)
        session.state.update(temp)
        session.last_update_time = last_update
        self._loads.remember(session, _Load({"session": seen_here, **seen}, first))


def _listed_fast(sid: str, app: str, user: str, state: dict[str, Any], stamp: float) -> AdkSession:
    """A listed session built as ``model_construct`` builds one (its fields, its
    fields-set, its private attributes' defaults), without its per-call overhead: a
    listing builds thousands."""
    obj = _NEW_SESSION(AdkSession)
    _SET(
        obj,
        "__dict__",
        {
            "id": sid,
            "app_name": app,
            "user_id": user,
            "state": state,
            "events": [],
            "last_update_time": stamp,
        },
    )
    # One set for every listed session: it holds every field already, and pydantic only
    # ever adds a field's name to it (on assignment), so it never changes.
    _SET(obj, "__pydantic_fields_set__", _LISTED_FIELDS_SET)
    _SET(obj, "__pydantic_extra__", None)
    _SET(obj, "__pydantic_private__", dict(_PRIVATE_DEFAULTS))
    return obj


def _listed_checked(
    sid: str, app: str, user: str, state: dict[str, Any], stamp: float
) -> AdkSession:
    return AdkSession(
        id=sid, app_name=app, user_id=user, state=state, events=[], last_update_time=stamp
    )


_NEW_SESSION: Final = object.__new__
_SET: Final = object.__setattr__
_LISTED_FIELDS: Final = ("id", "app_name", "user_id", "state", "events", "last_update_time")
_LISTED_FIELDS_SET: Final = set(_LISTED_FIELDS)
_SAMPLE: Final = _listed_checked("s", "a", "u", {"k": 1}, 1.5)
_PRIVATE_DEFAULTS: Final[dict[str, Any]] = dict(_SAMPLE.__pydantic_private__ or {})
# The fast build is used only if it gives what pydantic gives on this pydantic and ADK.
_listed: Final = (
    _listed_fast
    if _listed_fast("s", "a", "u", {"k": 1}, 1.5) == _SAMPLE
    and set(AdkSession.model_fields) == set(_LISTED_FIELDS)
    and list(_listed_fast("s", "a", "u", {}, 0.0).__dict__) == list(_SAMPLE.__dict__)
    else _listed_checked
)

_FILTERED_INDEX: Final = "prefix" in inspect.signature(list_sessions).parameters


def _index(sessions: Sessions, prefix: str) -> list[SessionInfo]:
    """The stored sessions whose ids start with ``prefix``: from the store's filtered index
    where the library has one (one query for those ids alone), else from the whole index."""
    if _FILTERED_INDEX:
        infos = list_sessions(sessions.store, prefix=prefix)  # type: ignore[call-arg,unused-ignore]
    else:
        infos = list_sessions(sessions.store)
    return [i for i in infos if i.session_id.startswith(prefix)]
