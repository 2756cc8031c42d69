"""The model-visible message itself: `Message`, checked and frozen on construction, its
constructors and its OpenAI conversion; `trusted_message` for the fold's hot path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, SupportsIndex

from nous_actor.core._frozen import EMPTY_DICT, EMPTY_LIST, NotJSON, freeze, untrackable
from nous_actor.core.clock import utcnow
from nous_actor.core.message._openai import (
    _CALL_HELP,
    _OPENAI_KEYS,
    DEVELOPER,
    OPENAI_EXTRA,
    OPENAI_ROLE,
    UnsendableMessage,
    _call_from_openai,
    _call_to_openai,
    _openai_role,
    _plain,
    _text_field,
)
from nous_actor.core.message._role import _ROLE_VALUES, _ROLES, Role

__all__ = ["Message", "trusted_message"]

_utcnow = utcnow  # the wall clock, or a simulation's (nous_actor.core.clock)


def _to_utc(value: datetime) -> datetime:
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def _json_field(name: str, value: Any) -> Any:
    try:
        return freeze(value, name)
    except NotJSON as exc:
        raise TypeError(f"Message.{exc}") from None


@untrackable  # (a projected message leaves the collector: `core.event.project`)
@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One model-visible message; an immutable value compared field by field.

    ``content``, ``tool_calls`` and ``metadata`` are deeply frozen on
    construction (`nous_actor.FrozenList` / `nous_actor.FrozenDict`,
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
        _fill(
            self,
            role,
            content,
            reasoning_content,
            tool_calls,
            tool_call_id,
            name,
            metadata,
            _utcnow() if created_at is None else created_at,
        )
        self._check()

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        """Pickled as its fields and unpickled by `trusted_message` (checked and frozen
        already: nothing is checked again, no field set through ``object.__setattr__``),
        its role by name: a third of the time of pickle's own way, both ways. A
        subclass is pickled pickle's way."""
        if type(self) is not Message:
            return object.__reduce_ex__(self, protocol)
        return _unpickled, (
            self.role.value,
            self.content,
            self.reasoning_content,
            self.tool_calls,
            self.tool_call_id,
            self.name,
            self.metadata,
            self.created_at,
        )

    def _check(self) -> None:
        set_ = object.__setattr__
        try:
            role = Role(self.role)
        except ValueError:
            hint = (
                f"; OpenAI's {DEVELOPER!r} role is a system message with "
                f"metadata={{{OPENAI_ROLE!r}: {DEVELOPER!r}}} (Message.from_openai makes one)"
                if self.role == DEVELOPER
                else ""
            )
            raise ValueError(
                f"Message.role must be one of {_ROLES} (or Role.*), got {self.role!r}{hint}"
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
        frozen_calls = _json_field("tool_calls", calls)
        for i, call in enumerate(frozen_calls):
            if not isinstance(call, Mapping):
                raise TypeError(
                    f"Message.tool_calls[{i}] must be a JSON object "
                    f'({{"id", "name", "arguments"}}), got {type(call).__name__}'
                )
        set_(self, "tool_calls", frozen_calls)
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

        Tool calls may be held in either shape, flat ``{"id", "name",
        "arguments"}`` or OpenAI's ``{"id", "type": "function", "function":
        {"name", "arguments"}}``; both are sent in OpenAI's, with ``arguments``
        as a JSON string (an object is ``json.dumps``-ed) and any other keys of
        the call kept. A custom tool call (``{"id", "type": "custom",
        "custom": {"name", "input"}}``) is sent exactly as it is held.
        ``name``, ``tool_call_id`` and ``reasoning_content`` are sent when set;
        ``metadata`` and ``created_at`` are not, except the provider keys
        `from_openai` kept under ``metadata["openai_extra"]``, which are put
        back, and ``metadata["openai_role"]``: a ``system`` message with
        ``"developer"`` there is sent as ``"role": "developer"`` (the key
        itself is not sent).

        >>> Message.tool("42", "c1").to_openai()
        {'role': 'tool', 'content': '42', 'tool_call_id': 'c1'}
        >>> Message.system("be brief", metadata={"openai_role": "developer"}).to_openai()
        {'role': 'developer', 'content': 'be brief'}

        Raises:
            UnsendableMessage: something cannot be sent as it is (a tool call
                without a str ``id`` or ``name`` or without ``arguments``, a
                custom call without a str ``custom['name']`` or
                ``custom['input']``, a call of another ``type``, a ``tool``
                message without ``tool_call_id``, ``content`` that is not a
                str, a list or ``None``, a ``metadata['openai_role']`` other
                than ``"developer"`` on a system message or the message's own
                role, ...); the message names the field. Nothing is ever sent
                as a guessed ``null`` or ``"{}"``.
        """
        role = self.role.value
        sent_role = _openai_role(role, self.metadata)
        content = self.content
        if content is not None and not isinstance(content, (str, list)):
            raise UnsendableMessage(
                role,
                "content",
                f"is a {type(content).__name__}; send a str, a list of content parts or None",
            )
        out: dict[str, Any] = {"role": sent_role, "content": _plain(content)}
        for field in ("name", "tool_call_id"):
            value = getattr(self, field)
            if value is not None:
                out[field] = _text_field(role, field, value)
        if self.role is Role.TOOL and self.tool_call_id is None:
            raise UnsendableMessage(
                role,
                "tool_call_id",
                "is missing; a tool message must name the call it answers, "
                "e.g. Message.tool(content, tool_call_id)",
            )
        calls = self.tool_calls
        if not isinstance(calls, list):
            raise UnsendableMessage(
                role, "tool_calls", f"is a {type(calls).__name__}, not a list; {_CALL_HELP}"
            )
        if calls:
            out["tool_calls"] = [_call_to_openai(role, i, c) for i, c in enumerate(calls)]
        if self.reasoning_content is not None:
            out["reasoning_content"] = _text_field(
                role, "reasoning_content", self.reasoning_content
            )
        meta = self.metadata
        extra = meta.get(OPENAI_EXTRA) if isinstance(meta, Mapping) else None
        if extra is not None:
            if not isinstance(extra, Mapping):
                raise UnsendableMessage(
                    role,
                    f"metadata[{OPENAI_EXTRA!r}]",
                    f"is a {type(extra).__name__}; it must be an object of provider keys "
                    "(as from_openai keeps them), or absent",
                )
            for k, v in extra.items():
                if k in _OPENAI_KEYS:
                    raise UnsendableMessage(
                        role,
                        f"metadata[{OPENAI_EXTRA!r}][{k!r}]",
                        "would stand in for the message's own field; set the Message "
                        f"field {k!r} instead",
                    )
                out[k] = _plain(v)
        return out

    @classmethod
    def to_openai_list(cls, messages: Iterable[Message]) -> list[dict[str, Any]]:
        """`to_openai` of each message, e.g. of ``log.derive_messages()``.

        Raises:
            UnsendableMessage: as `to_openai`, with ``index`` set to the
                position of the message that cannot be sent.
            TypeError: an item is not a `Message`.
        """
        out: list[dict[str, Any]] = []
        for i, m in enumerate(messages):
            if not isinstance(m, Message):
                raise TypeError(
                    f"to_openai_list takes Messages, got {type(m).__name__} at index {i}"
                )
            try:
                out.append(m.to_openai())
            except UnsendableMessage as exc:
                raise exc.at(i) from None
        return out

    @classmethod
    def from_openai(
        cls, message: Mapping[str, Any], *, created_at: datetime | None = None
    ) -> Message:
        """Build a message from an OpenAI chat-completions message dict.

        Keys that have no Message field (``refusal``, ``audio``, ...) are kept
        under ``metadata["openai_extra"]`` so `to_openai` can put them back.
        ``reasoning_content`` (as some providers send it) is mapped to its field.
        A ``developer`` message becomes a ``system`` message with
        ``metadata["openai_role"] = "developer"`` (`Role` has no developer),
        which `to_openai` sends as ``developer`` again.

        Function tool calls may come in either shape. Both become the flat
        ``{"id", "name", "arguments", ...}``, keeping every other key of the
        call; a call whose ``function`` holds keys besides ``name`` and
        ``arguments`` is kept in OpenAI's shape instead, so nothing is lost. A
        custom tool call (``{"id", "type": "custom", "custom": {"name",
        "input"}}``) is kept exactly as given. Either way
        ``from_openai(d).to_openai() == d``'s calls.

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
        if not isinstance(role, str) or (role not in _ROLE_VALUES and role != DEVELOPER):
            raise ValueError(f"'role' must be one of {_ROLES} or {DEVELOPER!r}, got {role!r}")
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
        extra = {k: v for k, v in message.items() if k not in _OPENAI_KEYS}
        metadata: dict[str, Any] = {OPENAI_EXTRA: extra} if extra else {}
        if role == DEVELOPER:
            role = Role.SYSTEM.value
            metadata[OPENAI_ROLE] = DEVELOPER
        try:
            return cls(
                role,
                content,
                reasoning_content=message.get("reasoning_content"),
                tool_calls=calls,
                tool_call_id=message.get("tool_call_id"),
                name=message.get("name"),
                metadata=metadata or EMPTY_DICT,
                created_at=_utcnow() if created_at is None else created_at,
            )
        except TypeError as exc:
            raise ValueError(str(exc)) from None


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
    """Build a Message from already frozen, already checked values (the fold's hot path).

    Filled in as a `_Building` (plain attribute stores, not eight calls of
    ``object.__setattr__``), then made a Message: the same slots, so the same layout.
    """
    m = _new(_Building)
    m.role = role
    m.content = content
    m.reasoning_content = reasoning_content
    m.tool_calls = tool_calls
    m.tool_call_id = tool_call_id
    m.name = name
    m.metadata = metadata
    m.created_at = created_at
    m.__class__ = Message  # type: ignore[assignment]
    return m  # type: ignore[return-value]


def _unpickled(role: str, *fields: Any) -> Message:
    """A pickled `Message` (see `Message.__reduce_ex__`): its role by name, then its
    other fields in order."""
    return trusted_message(_ROLE_NAMED[role], *fields)


_ROLE_NAMED: Final = {role.value: role for role in Role}


class _Building:
    """A `Message` being filled in by `trusted_message`."""

    __slots__ = Message.__slots__  # the same names in the same order: one layout
    role: Any
    content: Any
    reasoning_content: Any
    tool_calls: Any
    tool_call_id: Any
    name: Any
    metadata: Any
    created_at: Any


def _fill(
    m: Message,
    role: Any,
    content: Any,
    reasoning_content: Any,
    tool_calls: Any,
    tool_call_id: Any,
    name: Any,
    metadata: Any,
    created_at: Any,
) -> None:
    """Set every field of ``m`` (a frozen dataclass: through ``object.__setattr__``)."""
    _set(m, "role", role)
    _set(m, "content", content)
    _set(m, "reasoning_content", reasoning_content)
    _set(m, "tool_calls", tool_calls)
    _set(m, "tool_call_id", tool_call_id)
    _set(m, "name", name)
    _set(m, "metadata", metadata)
    _set(m, "created_at", created_at)
