"""The bottom of the adapter: ADK's names it uses, the keys it writes, its bounds.

Google ADK is imported here alone (every other module of the package takes
its names from here), so that importing the adapter without ADK says which
extra to install.
"""

from __future__ import annotations

from typing import Final, Literal

from nous_actor.runtime.extras import missing_extra

try:
    from google.adk.errors import StaleSessionError
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
    missing_extra("adk", "nous_actor.integrations.adk", exc)

__all__ = [
    "ADK_EVENT_KEY",
    "CACHE_SIZE",
    "CHECKPOINT_EVERY",
    "MAX_ATTEMPTS",
    "RECORD_KEY",
    "STATE_KEY",
    "TIME_KEY",
    "AdkEvent",
    "AdkSession",
    "AlreadyExistsError",
    "BasePlugin",
    "BaseSessionService",
    "GetSessionConfig",
    "Kind",
    "ListSessionsResponse",
    "SessionNotFoundError",
    "StaleSessionError",
    "State",
    "to_jsonable_python",
]

ADK_EVENT_KEY: Final = "adk_event"
"""Key of ``data["metadata"]`` under which a log event keeps its ADK event verbatim."""

RECORD_KEY: Final = "adk"
"""Top-level ``data`` key of the service's own records (``request_header`` events):
``{"op": "create", "state": {...}}``, ``{"op": "delete"}``, ``{"op": "state",
"delta": {...}}``, ``{"op": "checkpoint", "upto": seq, "state": {...}}`` and, in a
user's directory, ``{"op": "session", "id": ..., "seq": ..., "ts": ..., "state": {...}}``
(what `list_sessions` reads: ``ts`` the session's last update time as of the event at
``seq``, ``state`` present when it is written whole)."""

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
