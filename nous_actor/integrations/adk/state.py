"""ADK's state: a state (or delta) split by scope and checked as JSON, and `_ScopedState`,
which reads the ``app:`` and ``user:`` state merged into a session's and writes app and
user state and a user's directory of sessions, each in a session of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from nous_actor.core._frozen import thaw
from nous_actor.core.event import EventType
from nous_actor.integrations.adk.framework import State, to_jsonable_python
from nous_actor.integrations.adk.ids import app_key, directory_key, user_key
from nous_actor.integrations.adk.loads import Scope, _Load
from nous_actor.integrations.adk.logs import _Logs
from nous_actor.integrations.adk.records import RECORD_KEY
from nous_actor.integrations.adk.turns import _RunTurns


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


class _ScopedState:
    """The state kept beside the sessions: the app's and each user's (``app:`` and
    ``user:`` keys, read merged into a session's), and each user's directory of sessions
    (what `list_sessions` reads); read through ``logs``, written through ``turns``."""

    def __init__(self, logs: _Logs, turns: _RunTurns) -> None:
        self._logs = logs
        self._turns = turns

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

    async def write_scoped(
        self, app_name: str, user_id: str, app: dict[str, Any], user: dict[str, Any]
    ) -> dict[Scope, int]:
        """Write the app and user parts of a delta; the seq of each write, by scope."""
        now = datetime.now(UTC)
        seqs: dict[Scope, int] = {}
        if app:
            record = {RECORD_KEY: {"op": "state", "delta": app}}
            [ev] = await self._turns.write(
                app_key(app_name), [(EventType.REQUEST_HEADER, record, now)]
            )
            seqs["app"] = ev.seq
        if user:
            record = {RECORD_KEY: {"op": "state", "delta": user}}
            [ev] = await self._turns.write(
                user_key(app_name, user_id), [(EventType.REQUEST_HEADER, record, now)]
            )
            seqs["user"] = ev.seq
        return seqs

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
