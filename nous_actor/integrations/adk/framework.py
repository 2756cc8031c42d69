"""Google ADK's names that the adapter uses.

ADK is imported here alone (every other module of the package takes its
names from here), so that importing the adapter without ADK says which
extra to install.
"""

from __future__ import annotations

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
    "AdkEvent",
    "AdkSession",
    "AlreadyExistsError",
    "BasePlugin",
    "BaseSessionService",
    "GetSessionConfig",
    "ListSessionsResponse",
    "SessionNotFoundError",
    "StaleSessionError",
    "State",
    "to_jsonable_python",
]
