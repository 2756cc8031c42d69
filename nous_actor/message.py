"""The model-visible message: :class:`Message` and :class:`Role`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from nous_actor._frozen import EMPTY_DICT, EMPTY_LIST, NotJSON, freeze

__all__ = ["Message", "Role"]


class Role(StrEnum):
    """Who speaks a message. Plain strings (``"user"``) are accepted everywhere."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_ROLES = ", ".join(repr(r.value) for r in Role)
# Keys of an OpenAI chat-completions message that map onto Message fields.
_OPENAI_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
OPENAI_EXTRA = "openai_extra"
"""Metadata key under which :meth:`Message.from_openai` keeps provider keys it does not map."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _to_utc(value: datetime) -> datetime:
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def _json_field(name: str, value: Any) -> Any:
    try:
        return freeze(value, name)
    except NotJSON as exc:
        raise TypeError(f"Message.{exc}") from None


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One model-visible message; an immutable value compared field by field.

    ``content``, ``tool_calls`` and ``metadata`` are deeply frozen on
    construction (:class:`~nous_actor.FrozenList` / :class:`~nous_actor.FrozenDict`,
    equal to the plain values they came from), and ``created_at`` is kept in UTC.

    >>> m = Message.user("hello")
    >>> m.role, m.content
    (<Role.USER: 'user'>, 'hello')
    >>> m == Message("user", "hello", created_at=m.created_at)
    True

    Raises:
        ValueError: ``role`` is not one of system/user/assistant/tool, or
            ``created_at`` is a naive datetime.
        TypeError: a field has the wrong type, or holds something JSON cannot carry.
    """

    role: Role
    content: str | list[Any] | None
    reasoning_content: str | None
    tool_calls: Sequence[Mapping[str, Any]]
    tool_call_id: str | None
    name: str | None
    metadata: Mapping[str, Any]
    created_at: datetime

    def __init__(
        self,
        role: Role | str,
        content: str | list[Any] | None = None,
        reasoning_content: str | None = None,
        tool_calls: Sequence[Mapping[str, Any]] | None = EMPTY_LIST,
        tool_call_id: str | None = None,
        name: str | None = None,
        metadata: Mapping[str, Any] | None = EMPTY_DICT,
        created_at: datetime | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "role", role)
        set_(self, "content", content)
        set_(self, "reasoning_content", reasoning_content)
        set_(self, "tool_calls", tool_calls)
        set_(self, "tool_call_id", tool_call_id)
        set_(self, "name", name)
        set_(self, "metadata", metadata)
        set_(self, "created_at", _utcnow() if created_at is None else created_at)
        self._check()

    def _check(self) -> None:
        set_ = object.__setattr__
        try:
            role = Role(self.role)
        except ValueError:
            raise ValueError(
                f"Message.role must be one of {_ROLES} (or Role.*), got {self.role!r}"
            ) from None
        set_(self, "role", role)
        content = self.content
        if content is not None and not isinstance(content, (str, list, tuple)):
            raise TypeError(
                "Message.content must be a str, a list of content parts or None, "
                f"got {type(content).__name__}"
            )
        set_(self, "content", _json_field("content", content))
        for name in ("reasoning_content", "tool_call_id", "name"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"Message.{name} must be a str or None, got {type(v).__name__}")
        calls = self.tool_calls
        if calls is None:
            calls = EMPTY_LIST
        if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
            raise TypeError(
                "Message.tool_calls must be a sequence of JSON objects "
                '({"id", "name", "arguments"}), got ' + type(calls).__name__
            )
        for i, call in enumerate(calls):
            if not isinstance(call, Mapping):
                raise TypeError(
                    f"Message.tool_calls[{i}] must be a JSON object "
                    f'({{"id", "name", "arguments"}}), got {type(call).__name__}'
                )
        set_(self, "tool_calls", _json_field("tool_calls", calls))
        meta = EMPTY_DICT if self.metadata is None else self.metadata
        if not isinstance(meta, Mapping):
            raise TypeError(f"Message.metadata must be a JSON object, got {type(meta).__name__}")
        set_(self, "metadata", _json_field("metadata", meta))
        ts = self.created_at
        if not isinstance(ts, datetime):
            raise TypeError(f"Message.created_at must be a datetime, got {type(ts).__name__}")
        if ts.tzinfo is None or ts.utcoffset() is None:
            raise ValueError(
                "Message.created_at must be timezone-aware; "
                "use datetime.now(timezone.utc) or attach a tzinfo"
            )
        set_(self, "created_at", _to_utc(ts))

    # -- convenience constructors -------------------------------------------------

    @classmethod
    def system(cls, content: str | list[Any] | None, **fields: Any) -> Message:
        """A ``system`` message."""
        return cls(Role.SYSTEM, content, **fields)

    @classmethod
    def user(cls, content: str | list[Any] | None, **fields: Any) -> Message:
        """A ``user`` message."""
        return cls(Role.USER, content, **fields)

    @classmethod
    def assistant(
        cls,
        content: str | list[Any] | None = None,
        tool_calls: Sequence[Mapping[str, Any]] = (),
        **fields: Any,
    ) -> Message:
        """An ``assistant`` message, optionally carrying tool calls.

        >>> call = {"id": "c1", "name": "ls", "arguments": "{}"}
        >>> Message.assistant(tool_calls=[call]).tool_calls[0]["name"]
        'ls'
        """
        return cls(Role.ASSISTANT, content, tool_calls=tool_calls, **fields)

    @classmethod
    def tool(
        cls, content: str | list[Any] | None, tool_call_id: str | None, **fields: Any
    ) -> Message:
        """A ``tool`` result answering the call ``tool_call_id``."""
        return cls(Role.TOOL, content, tool_call_id=tool_call_id, **fields)

    # -- OpenAI chat-completions shape ---------------------------------------------

    def to_openai(self) -> dict[str, Any]:
        """This message as an OpenAI chat-completions message dict (plain, mutable).

        Tool calls become ``{"id", "type": "function", "function": {"name",
        "arguments"}}`` with ``arguments`` as a JSON string. ``reasoning_content``
        is included only when set; ``metadata`` and ``created_at`` are not sent,
        except the provider keys :meth:`from_openai` kept under
        ``metadata["openai_extra"]``, which are put back.

        >>> Message.tool("42", "c1").to_openai()
        {'role': 'tool', 'content': '42', 'tool_call_id': 'c1'}
        """
        out: dict[str, Any] = {"role": self.role.value, "content": _plain(self.content)}
        if self.name is not None:
            out["name"] = self.name
        if self.role is Role.TOOL:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [_call_to_openai(c) for c in self.tool_calls]
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        extra = self.metadata.get(OPENAI_EXTRA)
        if isinstance(extra, Mapping):
            for k, v in extra.items():
                out.setdefault(k, _plain(v))
        return out

    @classmethod
    def from_openai(
        cls, message: Mapping[str, Any], *, created_at: datetime | None = None
    ) -> Message:
        """Build a message from an OpenAI chat-completions message dict.

        Keys that have no Message field (``refusal``, ``audio``, ...) are kept
        under ``metadata["openai_extra"]`` so :meth:`to_openai` can put them back.
        ``reasoning_content`` (as some providers send it) is mapped to its field.

        >>> m = Message.from_openai({"role": "assistant", "content": None, "tool_calls": [
        ...     {"id": "c1", "type": "function",
        ...      "function": {"name": "ls", "arguments": "{}"}}]})
        >>> m.tool_calls[0]
        {'id': 'c1', 'name': 'ls', 'arguments': '{}'}

        Raises:
            ValueError: the dict is malformed; the message names the field.
        """
        if not isinstance(message, Mapping):
            raise ValueError(f"an OpenAI message must be a dict, got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLE_VALUES:
            raise ValueError(f"'role' must be one of {_ROLES}, got {role!r}")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(
                f"'content' must be a str, a list of content parts or null, "
                f"got {type(content).__name__}"
            )
        for key in ("name", "tool_call_id", "reasoning_content"):
            v = message.get(key)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{key!r} must be a str or null, got {type(v).__name__}")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise ValueError("'tool_call_id' is required on a 'tool' message")
        raw_calls = message.get("tool_calls")
        if raw_calls is None:
            raw_calls = []
        if not isinstance(raw_calls, list):
            raise ValueError(f"'tool_calls' must be a list, got {type(raw_calls).__name__}")
        calls = [_call_from_openai(c, i) for i, c in enumerate(raw_calls)]
        extra = {
            k: v for k, v in message.items() if k not in _OPENAI_KEYS and k != "reasoning_content"
        }
        try:
            return cls(
                role,
                content,
                reasoning_content=message.get("reasoning_content"),
                tool_calls=calls,
                tool_call_id=message.get("tool_call_id"),
                name=message.get("name"),
                metadata={OPENAI_EXTRA: extra} if extra else EMPTY_DICT,
                created_at=_utcnow() if created_at is None else created_at,
            )
        except TypeError as exc:
            raise ValueError(str(exc)) from None


_ROLE_VALUES = frozenset(r.value for r in Role)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _call_to_openai(call: Mapping[str, Any]) -> dict[str, Any]:
    args = call.get("arguments")
    if not isinstance(args, str):
        args = json.dumps(_plain(args) if args is not None else {})
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": call.get("name"), "arguments": args},
    }


def _call_from_openai(call: Any, i: int) -> dict[str, Any]:
    where = f"'tool_calls'[{i}]"
    if not isinstance(call, Mapping):
        raise ValueError(f"{where} must be a dict, got {type(call).__name__}")
    if not isinstance(call.get("id"), str):
        raise ValueError(f"{where}['id'] must be a str, got {call.get('id')!r}")
    kind = call.get("type", "function")
    if kind != "function":
        raise ValueError(f"{where}['type'] must be 'function', got {kind!r}")
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        raise ValueError(f"{where}['function'] must be a dict with 'name' and 'arguments'")
    if not isinstance(fn.get("name"), str):
        raise ValueError(f"{where}['function']['name'] must be a str, got {fn.get('name')!r}")
    args = fn.get("arguments", "")
    if not isinstance(args, (str, Mapping)):
        raise ValueError(
            f"{where}['function']['arguments'] must be a JSON string, got {type(args).__name__}"
        )
    return {"id": call["id"], "name": fn["name"], "arguments": args}


_new = object.__new__
_set = object.__setattr__


def trusted_message(
    role: Role,
    content: Any,
    reasoning_content: Any,
    tool_calls: Any,
    tool_call_id: Any,
    name: Any,
    metadata: Any,
    created_at: datetime,
) -> Message:
    """Build a Message from already frozen, already checked values (the fold's hot path)."""
    m = _new(Message)
    _set(m, "role", role)
    _set(m, "content", content)
    _set(m, "reasoning_content", reasoning_content)
    _set(m, "tool_calls", tool_calls)
    _set(m, "tool_call_id", tool_call_id)
    _set(m, "name", name)
    _set(m, "metadata", metadata)
    _set(m, "created_at", created_at)
    return m
