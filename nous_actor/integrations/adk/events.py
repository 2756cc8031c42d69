"""Event mapping: an ADK event to the log event that keeps it verbatim with its chat view,
and back; the service's own records read from a log event."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event, EventType
from nous_actor.integrations.adk.framework import AdkEvent, to_jsonable_python
from nous_actor.integrations.adk.records import ADK_EVENT_KEY, RECORD_KEY, TIME_KEY

__all__ = ["event_data"]


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
