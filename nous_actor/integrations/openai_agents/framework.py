"""The OpenAI Agents SDK's names that the adapter uses.

The SDK is imported here alone (every other module of the package takes its
names from here), so that importing the adapter without the SDK says which
extra to install.
"""

from __future__ import annotations

from nous_actor.runtime.extras import missing_extra

try:
    from agents.items import TResponseInputItem
    from agents.memory import Session as AgentsSession
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    missing_extra("openai-agents", "nous_actor.integrations.openai_agents", exc)

__all__ = [
    "AgentsSession",
    "SessionSettings",
    "TResponseInputItem",
    "coerce_session_settings",
]
