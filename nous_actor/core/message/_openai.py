"""A message's parts in OpenAI's chat-completions shape: the names of that shape the
message shares, `UnsendableMessage` (what cannot be sent), tool calls in either shape
(flat, OpenAI's, custom) to and from it, the role sent, plain values; `tool_call_parts`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from nous_actor.core._frozen import short_repr, thaw
from nous_actor.core.message._role import Role

__all__ = ["DEVELOPER", "OPENAI_EXTRA", "OPENAI_ROLE", "UnsendableMessage", "tool_call_parts"]

# Keys of an OpenAI chat-completions message that map onto Message fields.
_OPENAI_KEYS = frozenset(
    {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}
)


class UnsendableMessage(ValueError):
    """A message that cannot be sent to a provider as it is (raised by `Message.to_openai`).

    ``role`` and ``field`` name the message and the field (``"tool_calls[0]['name']"``);
    ``index`` is the message's position when a list was being sent
    (`Message.to_openai_list`), else ``None``. Nothing is guessed in its
    place: fix the field and send again.
    """

    def __init__(self, role: str, field: str, detail: str, index: int | None = None) -> None:
        where = f"{role} message" if index is None else f"message {index} ({role})"
        super().__init__(f"cannot send this {where}: {field} {detail}")
        self.role = role
        self.field = field
        self.detail = detail
        self.index = index

    def at(self, index: int) -> UnsendableMessage:
        """The same error, naming the message's position in the list being sent."""
        return UnsendableMessage(self.role, self.field, self.detail, index)

    def __reduce__(self) -> tuple[object, ...]:
        return (UnsendableMessage, (self.role, self.field, self.detail, self.index))


OPENAI_EXTRA = "openai_extra"
"""Metadata key under which `Message.from_openai` keeps provider keys it does not map."""

OPENAI_ROLE = "openai_role"
"""Metadata key under which a message keeps the OpenAI role it came with when that role
is not one of `Role`: ``"developer"`` on a ``system`` message (`Message.from_openai`
sets it; `Message.to_openai` sends ``"role": "developer"`` again)."""

DEVELOPER = "developer"
"""OpenAI's ``developer`` role: a ``system`` message that remembers it (`OPENAI_ROLE`)."""

_CALL_HELP = (
    'a tool call is {"id", "name", "arguments"} or OpenAI\'s {"id", "type": "function", '
    '"function": {"name", "arguments"}}, with a str id and name and the arguments as a '
    'JSON string or object; or OpenAI\'s custom call {"id", "type": "custom", "custom": '
    '{"name", "input"}} with str id, name and input'
)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _text_field(role: str, field: str, value: object) -> str:
    if not isinstance(value, str):
        raise UnsendableMessage(
            role, field, f"is a {type(value).__name__}; send a str or leave it unset (None)"
        )
    return value


_MISSING: Any = object()


def tool_call_parts(call: object) -> tuple[Any, Any, Any]:
    """``(id, name, arguments)`` of a tool call in either shape (flat or OpenAI's).

    For a custom call (``{"id", "type": "custom", "custom": {"name", "input"}}``)
    the arguments are its ``input``.

    A part that is missing is ``None``; nothing is checked (see
    `Message.to_openai` for that), so this never raises for a mapping.

    >>> tool_call_parts({"id": "c1", "type": "function",
    ...                  "function": {"name": "ls", "arguments": "{}"}})
    ('c1', 'ls', '{}')
    >>> tool_call_parts({"id": "c1", "name": "ls", "arguments": {"path": "/"}})
    ('c1', 'ls', {'path': '/'})
    """
    if not isinstance(call, Mapping):
        return None, None, None
    custom = call.get("custom")
    if call.get("type") == "custom" and isinstance(custom, Mapping):
        return call.get("id"), custom.get("name"), custom.get("input")
    fn = call.get("function")
    if isinstance(fn, Mapping) and "name" not in call and "arguments" not in call:
        return call.get("id"), fn.get("name"), fn.get("arguments")
    return call.get("id"), call.get("name"), call.get("arguments")


def _call_to_openai(role: str, i: int, call: object) -> dict[str, Any]:
    where = f"tool_calls[{i}]"

    def fail(field: str, detail: str) -> UnsendableMessage:
        return UnsendableMessage(role, f"{where}{field}", f"{detail}; {_CALL_HELP}")

    if not isinstance(call, Mapping):
        raise fail("", f"is a {type(call).__name__}, not a JSON object")
    kind = call.get("type", "function")
    if kind == "custom":
        problem = _custom_call_problem(call)
        if problem is not None:
            raise fail(*problem)
        return cast(dict[str, Any], _plain(call))
    if kind != "function":
        raise fail(
            "['type']",
            f"is {short_repr(kind)}, and only 'function' and 'custom' calls can be sent",
        )
    if "function" in call:
        if "name" in call or "arguments" in call:
            raise fail(
                "",
                "has both the flat keys ('name', 'arguments') and OpenAI's 'function'; "
                "keep one shape so that one name and one set of arguments is sent",
            )
        fn = call["function"]
        if not isinstance(fn, Mapping):
            raise fail("['function']", f"is a {type(fn).__name__}, not a JSON object")
        at = "['function']"
        name, args = fn.get("name", _MISSING), fn.get("arguments", _MISSING)
        fn_extra = {k: _plain(v) for k, v in fn.items() if k not in ("name", "arguments")}
        call_extra = {k: _plain(v) for k, v in call.items() if k not in ("id", "type", "function")}
    else:
        at = ""
        name, args = call.get("name", _MISSING), call.get("arguments", _MISSING)
        fn_extra = {}
        call_extra = {
            k: _plain(v) for k, v in call.items() if k not in ("id", "type", "name", "arguments")
        }
    call_id = call.get("id", _MISSING)
    for field, value in (("['id']", call_id), (f"{at}['name']", name)):
        if value is _MISSING or value is None:
            raise fail(field, "is missing")
        if not isinstance(value, str):
            raise fail(field, f"is a {type(value).__name__}, not a str")
    if args is _MISSING or args is None:
        raise fail(f"{at}['arguments']", "is missing (send '{}' for a call without arguments)")
    if isinstance(args, Mapping):
        args = json.dumps(thaw(args), ensure_ascii=False)
    elif not isinstance(args, str):
        raise fail(f"{at}['arguments']", f"is a {type(args).__name__}")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": args, **fn_extra},
        **call_extra,
    }


def _custom_call_problem(call: Mapping[str, Any]) -> tuple[str, str] | None:
    """What is wrong with a custom tool call, as ``(field, detail)``, or None."""
    if not isinstance(call.get("id"), str):
        return "['id']", f"must be a str, got {short_repr(call.get('id'))}"
    custom = call.get("custom")
    if not isinstance(custom, Mapping):
        return "['custom']", (
            f"must be an object with 'name' and 'input', got {short_repr(custom)}"
        )
    for key in ("name", "input"):
        if not isinstance(custom.get(key), str):
            return f"['custom'][{key!r}]", f"must be a str, got {short_repr(custom.get(key))}"
    return None


def _openai_role(role: str, metadata: Any) -> str:
    """The role `Message.to_openai` sends: ``developer`` for a system message marked so."""
    wanted = metadata.get(OPENAI_ROLE) if isinstance(metadata, Mapping) else None
    if wanted is None or wanted == role:
        return role
    if wanted == DEVELOPER and role == Role.SYSTEM.value:
        return DEVELOPER
    raise UnsendableMessage(
        role,
        f"metadata[{OPENAI_ROLE!r}]",
        f"is {short_repr(wanted)}; only {DEVELOPER!r} on a system message (or the "
        "message's own role) can be sent: change the role, or remove the key",
    )


def _call_from_openai(call: Any, i: int) -> dict[str, Any]:
    where = f"'tool_calls'[{i}]"
    if not isinstance(call, Mapping):
        raise ValueError(f"{where} must be a dict, got {type(call).__name__}")
    if not isinstance(call.get("id"), str):
        raise ValueError(f"{where}['id'] must be a str, got {short_repr(call.get('id'))}")
    kind = call.get("type", "function")
    if kind == "custom":
        problem = _custom_call_problem(call)
        if problem is not None:
            raise ValueError(f"{where}{problem[0]} {problem[1]}")
        return dict(call)  # kept as given
    if kind != "function":
        raise ValueError(f"{where}['type'] must be 'function' or 'custom', got {short_repr(kind)}")
    if "function" in call:
        if "name" in call or "arguments" in call:
            raise ValueError(
                f"{where} has both the flat keys ('name', 'arguments') and 'function'; "
                "give one shape"
            )
        fn = call["function"]
        if not isinstance(fn, Mapping):
            raise ValueError(f"{where}['function'] must be a dict with 'name' and 'arguments'")
        at = f"{where}['function']"
    else:
        fn = call
        at = where
    if not isinstance(fn.get("name"), str):
        raise ValueError(f"{at}['name'] must be a str, got {short_repr(fn.get('name'))}")
    if "arguments" not in fn:
        raise ValueError(
            f"{at}['arguments'] is missing; give a JSON string ('{{}}' for none) or an object"
        )
    args = fn["arguments"]
    if not isinstance(args, (str, Mapping)):
        raise ValueError(f"{at}['arguments'] must be a JSON string, got {type(args).__name__}")
    if fn is not call and set(fn) - {"name", "arguments"}:
        # The flat shape has no place for these: keep the call as OpenAI's.
        return {**call, "type": "function"}
    rest = {
        k: v for k, v in call.items() if k not in ("id", "type", "function", "name", "arguments")
    }
    return {"id": call["id"], "name": fn["name"], "arguments": args, **rest}
