"""ADK's state: a state (or delta) split by scope and checked as JSON, and `_StateService`,
which reads the ``app:`` and ``user:`` state merged into a session's and writes app and
user state and a user's directory of sessions, each in a session of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from nous_actor.core._frozen import thaw
from nous_actor.core.event import EventType
from nous_actor.integrations.adk.base import RECORD_KEY, State, to_jsonable_python
from nous_actor.integrations.adk.core import _ServiceCore
from nous_actor.integrations.adk.ids import app_key, directory_key, user_key


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


class _StateService(_ServiceCore):
    """`NousSessionService`'s state: the merged view, the scoped writes, the directory."""

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

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, without the prefix (``{}`` when there is none)."""
        view = await self._state(user_key(app_name, user_id))
        return thaw(view.state)  # type: ignore[no-any-return]
