"""What callers pass, checked before anything is sent or opened: the items of `add_items`
(built into their events) and the session settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from nous_actor.core._frozen import NotJSON, freeze
from nous_actor.core.event import InvalidEvent
from nous_actor.integrations.openai_agents.calls import Pending
from nous_actor.integrations.openai_agents.framework import (
    SessionSettings,
    coerce_session_settings,
)
from nous_actor.integrations.openai_agents.items import event_for_item


def _prepare(items: object) -> Pending:
    """Check every item and build its event; raise before anything is sent."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes, bytearray)):
        raise TypeError(
            f"add_items takes a list of items (dicts), got {type(items).__name__}; "
            "nothing was stored"
        )
    pending: Pending = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TypeError(
                f"add_items: item {i} is a {type(item).__name__}, not a dict "
                "(a Responses input item); nothing was stored"
            )
        try:
            frozen = freeze(item, f"items[{i}]")
        except NotJSON as exc:
            raise InvalidEvent(
                "unserializable_event_data", f"add_items: item {i}: {exc}; nothing was stored"
            ) from None
        pending.append(event_for_item(frozen))
    return pending


def _settings(value: SessionSettings | Mapping[str, Any] | None) -> SessionSettings:
    """The checked settings: unknown keys and bad limits refused, as the SDK's
    `coerce_session_settings` refuses them (and more strictly for `limit`: a negative one
    is refused; 0 is taken and means no item)."""
    if value is None:
        settings = SessionSettings()
    elif isinstance(value, SessionSettings):
        settings = value
    elif isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(SessionSettings) if f.init}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise TypeError(
                f"Unknown session settings: {', '.join(unknown)}; SessionSettings takes "
                f"{', '.join(sorted(known))}"
            )
        _check_limit(value.get("limit"))
        settings = coerce_session_settings(dict(value))
    else:
        raise TypeError(
            f"session_settings must be an agents SessionSettings, a dict or None, "
            f"got {type(value).__name__}"
        )
    _check_limit(settings.limit)
    return settings


def _check_limit(limit: object) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(
            f"session_settings limit must be an int (how many of the latest items "
            f"get_items returns) or None (every item), got {type(limit).__name__}"
        )
    if limit < 0:
        raise ValueError(
            f"session_settings limit must be 0 or more, got {limit}; give None for every "
            "item (0 gives none)"
        )
