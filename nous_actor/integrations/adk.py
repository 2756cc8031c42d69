"""Google ADK's session service, kept in supervised, durable nous_actor sessions.

`NousSessionService` implements ADK's `BaseSessionService` (``create_session``,
``get_session`` with its config, ``list_sessions``, ``delete_session``,
``append_event``, ``get_user_state``) over the sessions of a
`nous_actor.Sessions` registry, on any store. Swap

    service = DatabaseSessionService("sqlite+aiosqlite:///app.db")

for

    service = NousSessionService(sessions)              # a registry you run, or
    service = NousSessionService.sqlite("app.db")       # one opened for you

and add ``service.plugin()`` to the runner's plugins, so that each ADK run is
a turn of its session (see "Runs" below).

**Ids.** An ADK session is keyed by (app, user, session id). It lives in the
nous_actor session ``adk/s/<app>/<user>/<session>``, each part
percent-encoded where it must be (``/``, ``%``, whitespace and characters
that are not printable become ``%XX`` of their UTF-8 bytes; everything else
stays as it is), so the id obeys `nous_actor.core.ids` and `parse_key` gives
the three parts back. App state lives in ``adk/a/<app>``,
user state in ``adk/u/<app>/<user>``, the directory of a user's sessions (their
ids and state, which `list_sessions` reads) in ``adk/d/<app>/<user>``. A key
longer than the id rule allows (256 characters) is refused with a `ValueError`
naming the part to shorten.

**Events.** Each ADK event becomes one log event whose
``data["metadata"]["adk_event"]`` keeps it verbatim (``model_dump(mode="json",
exclude_none=True)``, as ADK's own database service stores it), so
`get_session` gives back equal events. The other fields are its chat view, so
``derive_messages``, compaction, fork and audit work on the session: a user's
text is a ``user_message``, a model's text (its thoughts as
``reasoning_content``) and function calls an ``assistant_message`` with tool
calls, function responses a ``tool_result``; an event with no content is a
``request_header`` (no message). The session-scoped part of its state delta is
kept beside it (``data["adk_state"]``), so the state folds without decoding
events.

**State** is ADK's: session-scoped keys in the session, ``app:`` and ``user:``
keys in sessions of their own (one per app, one per app and user), written by
the same state deltas and merged into every session `get_session` and
`list_sessions` return; ``temp:`` keys live only in the `Session` object of
the run and are never stored.

**Compaction.** An ADK compaction event (``actions.compaction``) becomes a
``system_message`` holding the summary that *replaces* the range of the
events it covers: the model-visible surface shows the summary, while the
events stay in the log (and `get_session` returns them all, as ADK expects).

**Nothing is deleted.** `delete_session` appends a deletion record: the
session is gone for ADK (``get_session`` gives ``None``, listings leave it
out, its id may be created again), while its history stays for audit.

**Runs.** The service never sees a run start or end, so the plugin does:
``service.plugin()`` opens a turn (`nous_actor.SessionHandle.turn`) on the
session when a run starts (ADK's ``on_user_message_callback``, else
``before_run_callback``) and closes it when the run ends
(``after_run_callback``, ``on_run_error_callback``). A concurrent run on the
same session then waits for it (policy ``enqueue``, the default) instead of
interleaving its events, and its `Session` object is brought up to date with
the first run's events before it goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, cast
from urllib.parse import quote, unquote

try:
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event as AdkEvent
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session as AdkSession
    from google.adk.sessions.state import State
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "nous_actor.integrations.adk needs Google ADK; "
        "install it with: pip install 'nous-actor[adk]'"
    ) from exc

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event, EventType, InvalidEvent
from nous_actor.core.ids import check_session_id
from nous_actor.core.log import Log
from nous_actor.errors import SessionCrashed, SessionStopped, TurnInterrupted
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import Turn, check_turn_args
from nous_actor.sessions.turns import Policy
from nous_actor.store.base import SessionInfo, list_sessions
from nous_actor.store.sqlite import SQLiteStore

__all__ = [
    "ADK_EVENT_KEY",
    "NousRunPlugin",
    "NousSessionService",
    "app_key",
    "directory_key",
    "event_data",
    "parse_key",
    "session_key",
    "user_key",
]

ADK_EVENT_KEY: Final = "adk_event"
"""Key of ``data["metadata"]`` under which a log event keeps its ADK event verbatim."""

RECORD_KEY: Final = "adk"
"""Top-level ``data`` key of the service's own records (``request_header`` events):
``{"op": "create", "state": {...}}``, ``{"op": "delete"}``, ``{"op": "state",
"delta": {...}}``, ``{"op": "checkpoint", "upto": seq, "state": {...}}`` and, in a
user's directory, ``{"op": "session", "id": ..., "seq": ..., "state": {...}}`` (what
`list_sessions` reads)."""

STATE_KEY: Final = "adk_state"
"""Top-level ``data`` key holding the session-scoped part of an event's state delta."""

TIME_KEY: Final = "adk_ts"
"""Top-level ``data`` key holding the ADK timestamp (a float, exactly as given)."""

MAX_ATTEMPTS: Final = 5
"""How often a write is sent again when its session stopped (or restarted) before
applying it."""

CHECKPOINT_EVERY: Final = 256
"""A session's state is written whole (a checkpoint record) after this many events, so
that a recent-events read folds only the deltas since the last one."""

CACHE_SIZE: Final = 1024
"""How many sessions' decoded views a service keeps (least recently used first out)."""

Kind = Literal["session", "user", "directory", "app"]

# -- ids ------------------------------------------------------------------------------------


def _escape(ch: str) -> str:
    if ch in "/%" or ch.isspace() or not ch.isprintable():
        return quote(ch, safe="")
    return ch


def _part(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if value.isprintable() and "/" not in value and "%" not in value and " " not in value:
        return value
    try:
        return "".join(_escape(ch) for ch in value)
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {value!r} holds a lone surrogate, which no store keeps"
        ) from None


def _checked(key: str, what: str) -> str:
    try:
        return check_session_id(key)
    except ValueError:
        raise ValueError(
            f"the nous_actor session id of this {what} ({len(key)} characters once encoded) "
            "is longer than the 256 a session id may have; use a shorter app name, user id "
            "or session id (each '/', '%', whitespace or unprintable character costs 3 to 12 "
            "once encoded)"
        ) from None


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The nous_actor session id of ADK session (``app_name``, ``user_id``, ``session_id``).

    >>> session_key("shop", "ann", "chat 1")
    'adk/s/shop/ann/chat%201'
    >>> parse_key(session_key("a/b", "ü", "%"))
    ('session', ('a/b', 'ü', '%'))

    Raises:
        TypeError: a part is not a str.
        ValueError: a part holds a lone surrogate, or the id would be too long.
    """
    app, user, sid = (
        _part(app_name, "app_name"),
        _part(user_id, "user_id"),
        _part(session_id, "session_id"),
    )
    return _checked(f"adk/s/{app}/{user}/{sid}", "session")


def user_key(app_name: str, user_id: str) -> str:
    """The id of the session holding ``user:`` state of one user of an app."""
    return _checked(f"adk/u/{_part(app_name, 'app_name')}/{_part(user_id, 'user_id')}", "user")


def directory_key(app_name: str, user_id: str) -> str:
    """The id of the session holding the directory of one user's sessions of an app (each
    session's id and state, for `NousSessionService.list_sessions`)."""
    return _checked(
        f"adk/d/{_part(app_name, 'app_name')}/{_part(user_id, 'user_id')}", "directory"
    )


def app_key(app_name: str) -> str:
    """The id of the session holding an app's ``app:`` state."""
    return _checked(f"adk/a/{_part(app_name, 'app_name')}", "app")


_KINDS: Final[dict[str, tuple[Kind, int]]] = {
    "s": ("session", 3),
    "u": ("user", 2),
    "a": ("app", 1),
}


def parse_key(key: str) -> tuple[Kind, tuple[str, ...]]:
    """The kind and decoded parts of a key made here (the inverse of the ``*_key`` functions).

    Raises:
        ValueError: ``key`` was not made by `session_key`, `user_key` or `app_key`.
    """
    parts = key.split("/") if isinstance(key, str) else []
    if len(parts) >= 2 and parts[0] == "adk" and parts[1] in _KINDS:
        kind, n = _KINDS[parts[1]]
        if len(parts) == n + 2:
            return kind, tuple(unquote(p) for p in parts[2:])
    raise ValueError(f"{key!r} is not the id of an ADK session, user or app kept by this module")


# -- ADK events -> log events --------------------------------------------------------------


def _dumped(event: AdkEvent) -> dict[str, Any]:
    return event.model_dump(mode="json", exclude_none=True)


def _text_of(parts: Sequence[Any], thought: bool) -> str | None:
    texts = [p.text for p in parts if p.text is not None and bool(p.thought) == thought]
    return "".join(texts) if texts else None


def event_data(event: AdkEvent) -> tuple[EventType, dict[str, Any]]:
    """The log event type and data that keep ``event`` verbatim, with its chat view.

    ``data["metadata"]["adk_event"]`` is the event as ADK's database service
    stores it. The chat view: content of role ``user`` with text is a
    ``user_message``; content with function responses is a ``tool_result``
    (``tool_call_id`` of the first, ``content`` the responses as JSON); other
    content (role ``model``) is an ``assistant_message`` with its text, its
    thought text as ``reasoning_content`` and its function calls as tool calls;
    an event without content is a ``request_header`` (no message). A compaction
    event is made a replace by `NousSessionService.append_event`, not here.
    """
    data: dict[str, Any] = {"metadata": {ADK_EVENT_KEY: _dumped(event)}, TIME_KEY: event.timestamp}
    content = event.content
    parts = list(content.parts or []) if content is not None else []
    if content is None or not parts:
        return EventType.REQUEST_HEADER, data
    responses = [p.function_response for p in parts if p.function_response is not None]
    calls = [p.function_call for p in parts if p.function_call is not None]
    data["name"] = event.author
    if responses:
        data["tool_call_id"] = responses[0].id
        data["content"] = json.dumps(
            [to_jsonable_python(r.response) for r in responses], ensure_ascii=False
        )
        return EventType.TOOL_RESULT, data
    data["content"] = _text_of(parts, False)
    if content.role == "user" and not calls:
        return EventType.USER_MESSAGE, data
    reasoning = _text_of(parts, True)
    if reasoning is not None:
        data["reasoning_content"] = reasoning
    if calls:
        data["tool_calls"] = [
            {
                "id": c.id,
                "name": c.name,
                "arguments": json.dumps(to_jsonable_python(c.args or {}), ensure_ascii=False),
            }
            for c in calls
        ]
    return EventType.ASSISTANT_MESSAGE, data


def _json_state(state: Mapping[str, Any], what: str) -> dict[str, Any]:
    try:
        return cast(dict[str, Any], to_jsonable_python(dict(state)))
    except Exception as exc:
        raise TypeError(
            f"{what} holds a value that cannot be stored as JSON ({exc}); store plain "
            "JSON values (str, numbers, bools, None, lists, dicts) or pydantic models"
        ) from None


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


def _record(ev: Event) -> Mapping[str, Any] | None:
    if ev.type is not EventType.REQUEST_HEADER:
        return None
    rec = ev.data.get(RECORD_KEY)
    return rec if isinstance(rec, Mapping) else None


def _adk_payload(ev: Event) -> Mapping[str, Any] | None:
    meta = ev.data.get("metadata")
    if isinstance(meta, Mapping):
        payload = meta.get(ADK_EVENT_KEY)
        if isinstance(payload, Mapping):
            return payload
    return None


def _decode(ev: Event) -> AdkEvent:
    return AdkEvent.model_validate(thaw(_adk_payload(ev)))


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


# -- folds of the logs ------------------------------------------------------------------------


@dataclass
class _View:
    """One ADK session as folded from its log (up to ``seen`` events)."""

    seen: int = 0
    created: int | None = None  # seq of the create record in force; None: no session
    state: dict[str, Any] = field(default_factory=dict)
    seqs: list[int] = field(default_factory=list)  # seqs of its ADK events, in order
    times: list[float] = field(default_factory=list)  # their timestamps
    positions: list[int] = field(default_factory=list)  # their positions (a replace: its start)
    decoded: dict[int, AdkEvent] = field(default_factory=dict)
    last_update: float = 0.0
    checkpoint: int = -1  # seq of the latest checkpoint (or create) record
    log: Log | None = None

    def catch_up(self, log: Log) -> None:
        if log.count() <= self.seen:  # nothing new (or an older snapshot of the log)
            return
        for ev in log.since(self.seen):
            rec = _record(ev)
            if rec is not None:
                op = rec.get("op")
                if op == "checkpoint":
                    self.checkpoint = max(self.checkpoint, ev.seq)
                    continue
                if op == "create":
                    self.created = self.checkpoint = ev.seq
                    self.state = thaw(rec.get("state") or {})
                    self.seqs, self.times, self.positions, self.decoded = [], [], [], {}
                    self.last_update = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
                    continue
                if op == "delete":
                    self.created = None
                    self.state, self.seqs, self.times, self.decoded = {}, [], [], {}
                    self.positions = []
                    continue
            if self.created is None or _adk_payload(ev) is None:
                continue
            ts = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
            self.seqs.append(ev.seq)
            self.times.append(ts)
            self.positions.append(ev.position)
            delta = ev.data.get(STATE_KEY)
            if delta:
                self.state.update(thaw(delta))
            self.last_update = ts
        self.seen = log.count()
        self.log = log

    def events(self, first: int) -> list[AdkEvent]:
        """The decoded ADK events from index ``first`` of ``seqs`` on."""
        wanted = self.seqs[first:]
        missing = [s for s in wanted if s not in self.decoded]
        if missing and self.log is not None:
            for ev in self.log.since(missing[0]):
                payload = _adk_payload(ev)
                if payload is not None and ev.seq not in self.decoded:
                    self.decoded[ev.seq] = _decode(ev)
        return [self.decoded[s] for s in wanted]


@dataclass
class _Tail:
    """The latest events of a session and its state, read from the end of its log."""

    events: list[Event]
    state: dict[str, Any]
    last_update: float


def _tail(log: Log, n: int) -> _Tail | None:
    """The last ``n`` ADK events of the session in ``log`` and its state, reading the log
    from its end back to the latest checkpoint (or create) record and the ``n``-th event
    (not the whole history); ``None`` if there is no session (never created, or deleted).
    """
    count = log.count()
    window = max(64, 2 * n)
    while True:
        start = max(0, count - window)
        picked: list[Event] = []
        deltas: list[Any] = []
        base: dict[str, Any] | None = None
        upto = -1  # with a checkpoint: the deltas of events after this seq still apply
        last: float | None = None
        done = False
        for ev in reversed(log.since(start)):
            rec = _record(ev)
            op = rec.get("op") if rec is not None else None
            if op == "delete" and base is None:
                return None
            if op == "create":
                if base is None:
                    base = thaw(rec.get("state") or {}) if rec is not None else {}
                if last is None:
                    last = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
                done = True
                break
            if op == "checkpoint" and base is None and rec is not None:
                base = thaw(rec.get("state") or {})
                upto = int(rec.get("upto", ev.seq))
                continue
            if _adk_payload(ev) is None:
                continue
            if last is None:
                last = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
            if len(picked) < n:
                picked.append(ev)
            if (base is None or ev.seq > upto) and ev.data.get(STATE_KEY):
                deltas.append(ev.data[STATE_KEY])
            if base is not None and ev.seq <= upto and len(picked) >= n:
                done = True
                break
        if done and base is not None and last is not None:
            for delta in reversed(deltas):
                base.update(thaw(delta))
            picked.reverse()
            return _Tail(picked, base, last)
        if start == 0:
            return None  # no create record: no session
        window *= 4


@dataclass
class _StateView:
    """App or user state, or a user's directory of sessions."""

    seen: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    directory: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def catch_up(self, log: Log) -> None:
        if log.count() <= self.seen:
            return
        for ev in log.since(self.seen):
            rec = _record(ev)
            if rec is None:
                continue
            op = rec.get("op")
            if op == "state":
                self.state.update(thaw(rec.get("delta") or {}))
            elif op == "session":
                sid, seq = str(rec.get("id")), int(rec.get("seq", 0))
                known = self.directory.get(sid)
                if known is None or known[0] <= seq:
                    self.directory[sid] = (seq, thaw(rec.get("state") or {}))
            elif op == "session_deleted":
                sid, seq = str(rec.get("id")), int(rec.get("seq", 0))
                known = self.directory.get(sid)
                if known is None or known[0] <= seq:
                    self.directory.pop(sid, None)
        self.seen = log.count()


# -- the service -------------------------------------------------------------------------


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
      write, so appends from concurrent runs never fail as stale (ADK's
      database service raises "modified in storage"); with `plugin`, runs of
      one session take turns instead of interleaving.
    * A crash of a session is survived: the registry restarts it from the
      store, and a write it refused is sent again (up to `MAX_ATTEMPTS`
      times); a run's turn that the restart ended is opened again.
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
        self._handles: OrderedDict[str, Session] = OrderedDict()
        self._views: OrderedDict[str, _View] = OrderedDict()
        self._states: OrderedDict[str, _StateView] = OrderedDict()
        self._turns: dict[tuple[str, str], Turn] = {}

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

    # -- plumbing ------------------------------------------------------------------------

    async def _handle(self, key: str) -> Session:
        handle = self._handles.get(key)
        if handle is None:
            handle = await self.sessions.aopen(key)
            self._handles[key] = handle
            if len(self._handles) > 4 * CACHE_SIZE:
                self._handles.popitem(last=False)
        else:
            self._handles.move_to_end(key)
        return handle

    async def _let_go(self, key: str) -> None:
        """Stop the session ``key`` this service opened only to find it empty (a lookup of
        an id never created), so that lookups of unknown ids leave nothing running."""
        self._views.pop(key, None)
        handle = self._handles.pop(key, None)
        if handle is not None:
            await handle.astop()

    async def _log(self, key: str) -> Log:
        for attempt in range(MAX_ATTEMPTS):
            handle = await self._handle(key)
            try:
                return await handle.log()
            except SessionStopped as exc:
                if isinstance(exc, SessionCrashed) or attempt == MAX_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _view(self, key: str) -> _View:
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = _View()
            if len(self._views) > CACHE_SIZE:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(key)
        view.catch_up(await self._log(key))
        return view

    async def _state(self, key: str) -> _StateView:
        view = self._states.get(key)
        if view is None:
            view = self._states[key] = _StateView()
            if len(self._states) > CACHE_SIZE:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(key)
        view.catch_up(await self._log(key))
        return view

    async def _write(
        self,
        key: str,
        items: list[tuple[EventType, dict[str, Any], datetime]],
        invocation_id: str | None = None,
    ) -> list[Event]:
        """Append ``items`` as one batch: through the run's turn when one is open."""
        for attempt in range(MAX_ATTEMPTS):
            turn = self._turns.get((key, invocation_id)) if invocation_id else None
            if turn is not None:
                try:
                    return await turn.append_many(items)
                except TurnInterrupted as exc:
                    if attempt == MAX_ATTEMPTS - 1 or not await self._ended_by_restart(key, exc):
                        raise
                    await self._reopen_turn(key, cast(str, invocation_id), turn)
                    continue
                except SessionStopped as exc:
                    if isinstance(exc, SessionCrashed) or attempt == MAX_ATTEMPTS - 1:
                        raise
                    continue
            handle = await self._handle(key)
            try:
                return await handle.append_many(items)
            except SessionStopped as exc:
                if isinstance(exc, SessionCrashed) or attempt == MAX_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ended_by_restart(self, key: str, exc: TurnInterrupted) -> bool:
        """Whether the turn ``exc`` names ended because its session restarted (not because
        another run took the session)."""
        log = await self._log(key)
        for ev in reversed(log.since(max(0, log.count() - 4096))):
            if ev.type is EventType.TURN_END and ev.data.get("turn_id") == exc.turn_id:
                return ev.data.get("reason") == "restart"
        return exc.how is None  # "not open here": the session restarted

    # -- runs (the plugin's side) ----------------------------------------------------------

    async def _open_run(self, plugin: NousRunPlugin, session: AdkSession, invocation: str) -> None:
        key = session_key(session.app_name, session.user_id, session.id)
        if (key, invocation) in self._turns:
            return
        handle = await self._handle(key)
        turn = handle.turn(
            plugin.policy,
            owner=f"adk invocation {invocation}",
            lease=plugin.lease,
            timeout=plugin.wait,
        )
        await turn.aopen()
        self._turns[(key, invocation)] = turn
        await self._refresh(session)

    async def _reopen_turn(self, key: str, invocation: str, old: Turn) -> None:
        handle = await self._handle(key)
        turn = handle.turn(
            cast(Policy, old.policy), owner=old.owner, lease=old.lease, timeout=old.wait
        )
        await turn.aopen()
        self._turns[(key, invocation)] = turn

    async def _close_run(self, session: AdkSession, invocation: str, failed: bool) -> None:
        key = session_key(session.app_name, session.user_id, session.id)
        turn = self._turns.pop((key, invocation), None)
        if turn is None:
            return
        if failed:
            await turn.__aexit__(RuntimeError, None, None)
            return
        try:
            await turn.aclose()
        except TurnInterrupted:
            pass  # ended already (a restart, an expired lease): nothing left to close

    async def _refresh(self, session: AdkSession) -> None:
        """Bring ``session`` (a run's object) up to date with what other runs wrote."""
        view = await self._view(session_key(session.app_name, session.user_id, session.id))
        if view.created is None:
            return
        have = session.events[-1].id if session.events else None
        now = view.events(len(view.seqs) - 1)[0].id if view.seqs else None
        if have == now:
            return
        keep = len(session.events)
        session.events[:] = view.events(max(0, len(view.seqs) - keep) if keep else 0)
        temp = {k: v for k, v in session.state.items() if k.startswith(State.TEMP_PREFIX)}
        session.state.clear()
        session.state.update(await self._merged(session.app_name, session.user_id, view.state))
        session.state.update(temp)
        session.last_update_time = view.last_update

    # -- the service API ------------------------------------------------------------------

    async def _merged(self, app_name: str, user_id: str, own: Mapping[str, Any]) -> dict[str, Any]:
        app, user = await asyncio.gather(
            self._state(app_key(app_name)), self._state(user_key(app_name, user_id))
        )
        merged: dict[str, Any] = thaw(own)  # the caller's own copy, nested values too
        for k, v in app.state.items():
            merged[State.APP_PREFIX + k] = thaw(v)
        for k, v in user.state.items():
            merged[State.USER_PREFIX + k] = thaw(v)
        return merged

    async def _write_scoped(
        self, app_name: str, user_id: str, app: dict[str, Any], user: dict[str, Any]
    ) -> None:
        now = datetime.now(UTC)
        if app:
            record = {RECORD_KEY: {"op": "state", "delta": app}}
            await self._write(app_key(app_name), [(EventType.REQUEST_HEADER, record, now)])
        if user:
            record = {RECORD_KEY: {"op": "state", "delta": user}}
            await self._write(
                user_key(app_name, user_id), [(EventType.REQUEST_HEADER, record, now)]
            )

    async def _write_directory(
        self,
        app_name: str,
        user_id: str,
        session_id: str,
        seq: int,
        state: Mapping[str, Any] | None,
    ) -> None:
        op = (
            {"op": "session", "state": dict(state)}
            if state is not None
            else {"op": "session_deleted"}
        )
        record = {RECORD_KEY: {**op, "id": session_id, "seq": seq}}
        await self._write(
            directory_key(app_name, user_id),
            [(EventType.REQUEST_HEADER, record, datetime.now(UTC))],
        )

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
                JSON-storable values.
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
        view = await self._view(key)
        if view.created is not None:
            raise AlreadyExistsError(f"Session with id {sid} already exists.")
        record = {RECORD_KEY: {"op": "create", "state": own}, TIME_KEY: now}
        for attempt in range(MAX_ATTEMPTS):
            handle = await self._handle(key)
            try:  # at the seq after the log seen: a create that raced this one wins alone
                ev = await handle.append_at(view.seen, EventType.REQUEST_HEADER, record, _utc(now))
                break
            except InvalidEvent as exc:
                if exc.reason == "seq_behind_head":
                    raise AlreadyExistsError(f"Session with id {sid} already exists.") from None
                raise
            except SessionStopped as exc:  # stopped by a lookup that found it empty
                if isinstance(exc, SessionCrashed) or attempt == MAX_ATTEMPTS - 1:
                    raise
                self._handles.pop(key, None)
        await self._write_scoped(app_name, user_id, app, user)
        await self._write_directory(app_name, user_id, sid, ev.seq, own)
        merged = await self._merged(app_name, user_id, own)
        return AdkSession(
            id=sid, app_name=app_name, user_id=user_id, state=merged, last_update_time=now
        )

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
            ValueError: the encoded id is too long.
        """
        if config is not None and not isinstance(config, GetSessionConfig):
            raise TypeError(
                f"config must be a GetSessionConfig or None, got {type(config).__name__}"
            )
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
        sid = session_id.strip()
        if not sid:
            return None
        key = session_key(app_name, user_id, sid)
        if (
            key not in self._views
            and config is not None
            and config.num_recent_events is not None
            and config.after_timestamp is None
        ):  # a first read of the latest events: from the tail, not the whole history
            log = await self._log(key)
            tail = _tail(log, config.num_recent_events)
            if tail is None:
                if not log.count():
                    await self._let_go(key)
                return None
            return AdkSession(
                id=sid,
                app_name=app_name,
                user_id=user_id,
                state=await self._merged(app_name, user_id, tail.state),
                events=[_decode(ev) for ev in tail.events],
                last_update_time=tail.last_update,
            )
        view = await self._view(key)
        if view.created is None:
            if not view.seen:
                await self._let_go(key)
            return None
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
        merged = await self._merged(app_name, user_id, view.state)
        return AdkSession(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=merged,
            events=events,
            last_update_time=view.last_update,
        )

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
        app = _part(app_name, "app_name")
        if user_id is not None:
            prefix = f"adk/s/{app}/{_part(user_id, 'user_id')}/"
        else:
            prefix = f"adk/s/{app}/"
        index = asyncio.ensure_future(asyncio.to_thread(_index, self.sessions, prefix))
        known: dict[str, tuple[_StateView, dict[str, Any]]] = {}
        if user_id is not None:  # read the user's directory and state meanwhile
            try:
                known[user_id] = await asyncio.gather(
                    self._state(directory_key(app_name, user_id)),
                    self._merged(app_name, user_id, {}),
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
                    self._state(directory_key(app_name, user)), self._merged(app_name, user, {})
                )
            directory, merged = known[user]
            for sid, info in groups[user]:
                entry = directory.directory.get(sid)
                if entry is None:
                    continue  # deleted (or never created: only opened)
                state: dict[str, Any] = thaw(entry[1])  # each session's own, nested too
                if merged:
                    state.update(thaw(merged))
                stamp = info.last_time.timestamp() if info.last_time is not None else 0.0
                found.append(_listed(sid, app_name, user, state, stamp))
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse.model_construct(sessions=found)

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
        view = await self._view(key)
        if view.created is None:
            return
        record = {RECORD_KEY: {"op": "delete"}}
        [ev] = await self._write(key, [(EventType.REQUEST_HEADER, record, datetime.now(UTC))])
        await self._write_directory(app_name, user_id, sid, ev.seq, None)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, without the prefix (``{}`` when there is none)."""
        view = await self._state(user_key(app_name, user_id))
        return thaw(view.state)  # type: ignore[no-any-return]

    async def append_event(self, session: AdkSession, event: AdkEvent) -> AdkEvent:
        """Append ``event`` to ``session`` (the stored one and the object), applying its
        state delta; a partial event is returned untouched and not stored.

        ``temp:`` keys of the delta go to the object's state only and are
        removed from the event; ``app:`` and ``user:`` keys go to the app's
        and user's state; the rest to the session's. A compaction event
        (``actions.compaction``) also replaces, on the model-visible surface,
        the events whose timestamps it covers by its summary. Durably stored
        when this returns; during a run (see `plugin`), written through the
        run's turn.

        Raises:
            TypeError: ``session`` or ``event`` is not ADK's `Session` / `Event`.
            SessionNotFoundError: the session does not exist (or was deleted).
            TurnInterrupted: the run's turn was taken by another run (policy
                ``interrupt`` or ``rollback``); nothing was stored.
            TurnBusy: another run holds the session, and this write (outside
                any run) waited its bound.
        """
        if not isinstance(session, AdkSession):
            raise TypeError(f"session must be an ADK Session, got {type(session).__name__}")
        if not isinstance(event, AdkEvent):
            raise TypeError(f"event must be an ADK Event, got {type(event).__name__}")
        if event.partial:
            return event
        key = session_key(session.app_name, session.user_id, session.id)
        view = await self._view(key)
        if view.created is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        delta = dict(event.actions.state_delta) if event.actions else {}
        app, user, own = _split(_json_state(delta, "the event's state delta"))
        etype, data = event_data(event)
        if own:
            data[STATE_KEY] = own
        compaction = event.actions.compaction if event.actions else None
        if compaction is not None:
            etype, data = self._as_replace(view, compaction, data)
        [ev] = await self._write(key, [(etype, data, _utc(event.timestamp))], event.invocation_id)
        if ev.seq - view.checkpoint >= CHECKPOINT_EVERY:
            view.checkpoint = ev.seq  # (one checkpoint, whoever else appends meanwhile)
            await self._checkpoint(key, event.invocation_id)
        await self._write_scoped(session.app_name, session.user_id, app, user)
        if own:
            view = await self._view(key)
            await self._write_directory(
                session.app_name, session.user_id, session.id, ev.seq, view.state
            )
        self._update_session_state(session, event)
        session.events.append(event)
        session.last_update_time = event.timestamp
        return event

    async def _checkpoint(self, key: str, invocation_id: str | None) -> None:
        """Write the session's state as of the last event folded (a checkpoint record)."""
        view = await self._view(key)
        if view.created is None:
            return
        record = {RECORD_KEY: {"op": "checkpoint", "upto": view.seen - 1, "state": view.state}}
        await self._write(
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


class NousRunPlugin(BasePlugin):
    """ADK's plugin that makes each run a turn of its session: get it from
    `NousSessionService.plugin` and pass it in the runner's (or app's) ``plugins``.

    The turn opens at the run's first hook (``on_user_message_callback``, or
    ``before_run_callback`` for a run without a new message), which comes
    after the runner read the session: so, once the turn is open, the run's
    `Session` object is brought up to date (events, state) with what runs
    before it wrote. It closes at ``after_run_callback`` (or
    ``on_run_error_callback``, as failed). A run cancelled without either
    hook holds the session until its lease runs out.
    """

    def __init__(self, service: NousSessionService, policy: Policy, lease: float, wait: float):
        super().__init__(name="nous_actor_turns")
        self.service = service
        self.policy = policy
        self.lease = lease
        self.wait = wait

    async def on_user_message_callback(
        self, *, invocation_context: Any, user_message: Any
    ) -> None:
        await self.service._open_run(
            self, invocation_context.session, invocation_context.invocation_id
        )

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        await self.service._open_run(
            self, invocation_context.session, invocation_context.invocation_id
        )

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        await self.service._close_run(
            invocation_context.session, invocation_context.invocation_id, failed=False
        )

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        await self.service._close_run(
            invocation_context.session, invocation_context.invocation_id, failed=True
        )
