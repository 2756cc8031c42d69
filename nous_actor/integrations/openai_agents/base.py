"""The bottom of the adapter: the SDK's names it uses, the keys it writes, its closed error.

The SDK is imported here alone (every other module of the package takes its
names from here), so that importing the adapter without the SDK says which
extra to install.
"""

from __future__ import annotations

from typing import Any, Final

from nous_actor.runtime.extras import missing_extra

try:
    from agents.items import TResponseInputItem
    from agents.memory import Session as AgentsSession
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    missing_extra("openai-agents", "nous_actor.integrations.openai_agents", exc)

from nous_actor.core.event import EventType
from nous_actor.errors import SessionStopped

__all__ = [
    "CLEARED_KEY",
    "ITEM_KEY",
    "MAX_ATTEMPTS",
    "OP_KEY",
    "AgentsSession",
    "NousSessionClosed",
    "Pending",
    "SessionSettings",
    "TResponseInputItem",
    "coerce_session_settings",
]

ITEM_KEY: Final = "openai_item"
"""Key of `metadata` under which an item's event keeps the item verbatim."""

CLEARED_KEY: Final = "openai_cleared"
"""Key of `metadata` that marks a cleared marker (it stands for no item); its value
names the call that wrote it, `"clear_session"` or `"pop_item"`."""

OP_KEY: Final = "openai_session_op"
"""Top-level `data` key (not projected, kept in the log) recording which call wrote a
replace and what it hid, for audit: `{"op": "pop_item", "popped_seq": 7}`, ..."""

MAX_ATTEMPTS: Final = 5
"""How often a call is sent again when its session stopped before applying it."""


Pending = list[tuple[EventType, dict[str, Any]]]


class NousSessionClosed(SessionStopped, RuntimeError):
    """A call on a `NousSession` after its `close()`.

    A `SessionStopped` like every stopped call of this library, and a
    `RuntimeError` like a call on a closed session of the SDK's own
    (`SQLiteSession` raises ``RuntimeError("SQLiteSession is closed")``), so
    code written for either catches it. Nothing was applied: make a new
    `NousSession` to go on.
    """
