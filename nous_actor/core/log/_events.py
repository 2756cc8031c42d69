"""What a log is given and what it refuses: `message_event` (a message as the event that
keeps it), `as_message`, `new_event` (a validated event, stamped now by default), and the
refusals of a seq behind the head or a boundary outside the log."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from nous_actor.core.clock import utcnow
from nous_actor.core.event import (
    EVENT_TYPE_OF,
    Event,
    EventType,
    InvalidEvent,
    check_event,
    trusted_event,
)
from nous_actor.core.message import Message, Role

__all__ = ["as_message", "message_event", "new_event"]

_utcnow = utcnow  # the wall clock, or a simulation's (nous_actor.core.clock)


_DICT_FIELDS: Final = ("content", "reasoning_content", "tool_calls", "tool_call_id", "name")


def message_event(
    message: Message | Mapping[str, Any],
) -> tuple[EventType, dict[str, Any], datetime | None]:
    """The event that keeps ``message``: ``(type, data, time)``, for ``append``.

    The type follows the role (``system`` → ``system_message``, ...).

    * A `Message`: ``data`` is its §3 seed shape (as `Log.seed` stores it:
      ``content``, ``metadata``, ``name``, and per role ``tool_calls``,
      ``reasoning_content`` when set, ``tool_call_id``); ``time`` is its
      ``created_at``.
    * An OpenAI chat-completions dict: ``data`` holds only the keys the dict
      has (as `Message.from_openai` reads them: function calls flat, custom
      calls as given), plus ``metadata`` when `Message.from_openai` puts
      something there (provider keys under ``openai_extra``, the ``developer``
      role under ``openai_role``); no ``"metadata": {}`` or ``"name": None``
      the dict never had. ``time`` is ``None``: the time of the append.

    Either way the event projects back to the message: for a dict,
    ``Message.from_openai(message, created_at=event.time)``.

    Raises:
        ValueError: a malformed dict (the message names the field).
        TypeError: neither a `Message` nor a mapping.
    """
    if isinstance(message, Message):
        return EVENT_TYPE_OF[message.role], _seed_data(message), message.created_at
    m = as_message(message)
    data = {k: getattr(m, k) for k in _DICT_FIELDS if k in message}
    if m.metadata:
        data["metadata"] = m.metadata
    return EVENT_TYPE_OF[m.role], data, None


def as_message(message: Message | Mapping[str, Any]) -> Message:
    """``message`` itself, or the `Message` of an OpenAI chat-completions dict.

    Raises:
        ValueError: a malformed dict. TypeError: neither.
    """
    if isinstance(message, Message):
        return message
    if isinstance(message, Mapping):
        return Message.from_openai(message)
    raise TypeError(
        f"append_message takes a Message or an OpenAI message dict, got {type(message).__name__}"
    )


def _check_boundary(seq: object, count: int, what: str) -> None:
    """``what`` is the call as the user wrote it, ``...`` standing for the seq."""
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"{what} takes an int seq, got {type(seq).__name__}")
    call = what.replace("...", str(seq)) if "..." in what else f"{what}({seq})"
    if seq < 0:
        raise ValueError(f"{call}: seq must be >= 0")
    if seq >= count:
        raise ValueError(
            f"{call} is past the head: the newest seq is {count - 1}"
            if count
            else f"{call}: the log is empty"
        )


def _behind_head(seq: int, count: int) -> InvalidEvent:
    return InvalidEvent(
        "seq_behind_head",
        f"append_at(seq={seq}) is behind the head: the next free seq is "
        f"{count}; use a seq >= {count}, or append() to take the next",
    )


def new_event(seq: int, type: object, data: Any, time: datetime | None) -> Event:
    """A validated Event (DESIGN.md §2 checks, in order); ``time`` defaults to now."""
    etype, t, frozen, op = check_event(seq, type, _utcnow() if time is None else time, data)
    return trusted_event(seq, etype, t, frozen, op)


def _seed_data(m: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"content": m.content, "metadata": m.metadata, "name": m.name}
    if m.role is Role.ASSISTANT:
        data["tool_calls"] = m.tool_calls
        if m.reasoning_content is not None:
            data["reasoning_content"] = m.reasoning_content
    elif m.role is Role.TOOL:
        data["tool_call_id"] = m.tool_call_id
    return data
