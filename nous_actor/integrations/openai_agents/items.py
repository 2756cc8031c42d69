"""Item mapping: Responses input items to the events that keep them, surface messages back.

`event_for_item` gives the event of an item (the item verbatim under
`metadata["openai_item"]`, with its chat view); `items_of_message` and
`items_from_messages` give back the items a surface stands for, also for
messages other code wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from nous_actor.core._frozen import thaw
from nous_actor.core.event import EventType
from nous_actor.core.message import Message, Role, tool_call_parts
from nous_actor.integrations.openai_agents.records import CLEARED_KEY, ITEM_KEY

__all__ = ["event_for_item", "items_from_messages", "items_of_message"]

_TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})


# -- items -> events ------------------------------------------------------------------------


def event_for_item(item: Mapping[str, Any]) -> tuple[EventType, dict[str, Any]]:
    """The event type and data that keep `item` (a Responses input item).

    `data["metadata"]["openai_item"]` is `item` itself; the other fields are
    its chat view:

    * a message with role `user`: a `user_message` with its `content`;
    * a message with role `system` or `developer`: a `system_message`;
    * a message with role `assistant`: an `assistant_message`;
    * a `function_call`: an `assistant_message` with one tool call
      `{"id": call_id, "name", "arguments"}`;
    * a `function_call_output`: a `tool_result` with the output as `content`
      and `tool_call_id = call_id`;
    * a `reasoning` item: an `assistant_message` whose `reasoning_content` is
      the text of its summary (else of its content);
    * any other `*_call` with a `call_id`: an `assistant_message` with one tool
      call named by its `name` (or its type);
    * any other `*_output` with a `call_id`: a `tool_result`;
    * anything else: an `assistant_message` with no content.

    `content` is the item's string, or the text of its parts joined when every
    part is text (`input_text`, `output_text`, `refusal`), or else its parts in
    the chat-completions shape (`{"type": "text"}`, `{"type": "image_url"}`,
    other parts as they are). Every field has the type `Message` requires,
    whatever the item holds, so no item can make the surface unreadable.
    """
    kind = item.get("type")
    role = item.get("role")
    data: dict[str, Any] = {"metadata": {ITEM_KEY: item}}
    call_id = item.get("call_id")
    if kind in (None, "message") and role in ("user", "system", "developer", "assistant"):
        data["content"] = _chat_content(item.get("content"))
        if role == "user":
            return EventType.USER_MESSAGE, data
        if role == "assistant":
            return EventType.ASSISTANT_MESSAGE, data
        return EventType.SYSTEM_MESSAGE, data
    if kind == "function_call":
        data["content"] = None
        data["tool_calls"] = [
            {"id": call_id, "name": item.get("name"), "arguments": item.get("arguments")}
        ]
        return EventType.ASSISTANT_MESSAGE, data
    if kind == "reasoning":
        data["content"] = None
        data["reasoning_content"] = _joined_text(item.get("summary")) or _joined_text(
            item.get("content")
        )
        return EventType.ASSISTANT_MESSAGE, data
    if isinstance(kind, str) and isinstance(call_id, str):
        if kind.endswith("_output"):
            data["content"] = _output_content(item.get("output"))
            data["tool_call_id"] = call_id
            return EventType.TOOL_RESULT, data
        if kind.endswith("_call"):
            name = item.get("name")
            data["content"] = None
            data["tool_calls"] = [
                {
                    "id": call_id,
                    "name": name if isinstance(name, str) else kind,
                    "arguments": _call_arguments(item),
                }
            ]
            return EventType.ASSISTANT_MESSAGE, data
    if kind == "function_call_output":  # without a str call_id
        data["content"] = _output_content(item.get("output"))
        return EventType.TOOL_RESULT, data
    data["content"] = None
    return EventType.ASSISTANT_MESSAGE, data


def _part_text(part: Any) -> str | None:
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        text = part.get("text")
    elif kind == "refusal":
        text = part.get("refusal")
    else:
        return None
    return text if isinstance(text, str) else None


def _chat_part(part: Any) -> Any:
    text = _part_text(part)
    if text is not None:
        if part.get("type") == "refusal":
            return {"type": "refusal", "refusal": text}
        return {"type": "text", "text": text}
    if isinstance(part, Mapping) and part.get("type") == "input_image":
        url = part.get("image_url")
        if isinstance(url, str):
            image: dict[str, Any] = {"url": url}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            return {"type": "image_url", "image_url": image}
    return part


def _chat_content(value: Any) -> str | list[Any] | None:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return None
    texts = [_part_text(p) for p in value]
    if all(t is not None for t in texts):
        return "".join(cast(list[str], texts))
    return [_chat_part(p) for p in value]


def _joined_text(parts: Any) -> str | None:
    if not isinstance(parts, list):
        return None
    texts = [p["text"] for p in parts if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
    return "\n".join(cast(list[str], texts)) if texts else None


def _output_content(output: Any) -> str | list[Any] | None:
    if output is None or isinstance(output, (str, list)):
        return _chat_content(output)
    return json.dumps(output, ensure_ascii=False)


def _call_arguments(item: Mapping[str, Any]) -> str:
    for key in ("arguments", "input"):
        if isinstance(item.get(key), str):
            return cast(str, item[key])
    rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status", "name")}
    return json.dumps(rest, ensure_ascii=False)


# -- messages -> items ----------------------------------------------------------------------


def items_of_message(message: Message) -> list[dict[str, Any]]:
    """The Responses input items one surface message stands for (fresh, plain dicts).

    * a message with `metadata["openai_item"]` (written by `NousSession`): that item;
    * a cleared marker (`metadata["openai_cleared"]`): none;
    * any other message (a compaction summary, a pruned tool result, a seeded
      transcript): its chat content as items: a system or user message, an
      assistant message (when it has content) followed by one `function_call`
      per tool call, a tool message as a `function_call_output`. An assistant
      message with neither gives one empty assistant message.
    """
    meta = message.metadata
    if CLEARED_KEY in meta:
        return []
    item = meta.get(ITEM_KEY)
    if isinstance(item, Mapping):
        return [thaw(item)]
    return _foreign_items(message)


def items_from_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The items of a surface: `items_of_message` of each message, in order.

    For a `NousSession` on a session, `await nous.get_items()` equals
    `items_from_messages(await handle.derive_messages())` of that session.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        out.extend(items_of_message(m))
    return out


def _foreign_items(m: Message) -> list[dict[str, Any]]:
    if m.role is Role.TOOL:
        return [
            {
                "type": "function_call_output",
                "call_id": m.tool_call_id,
                "output": _responses_content(m.content, "input_text"),
            }
        ]
    if m.role is not Role.ASSISTANT:
        return [{"role": m.role.value, "content": _responses_content(m.content, "input_text")}]
    out: list[dict[str, Any]] = []
    if m.content not in (None, "", []):
        out.append({"role": "assistant", "content": _responses_content(m.content, "output_text")})
    for call in m.tool_calls:
        cid, name, args = tool_call_parts(call)
        arguments = args if isinstance(args, str) else json.dumps(thaw(args), ensure_ascii=False)
        out.append({"type": "function_call", "call_id": cid, "name": name, "arguments": arguments})
    return out or [{"role": "assistant", "content": ""}]


def _responses_content(content: Any, text_type: str) -> Any:
    if content is None:
        return ""
    if not isinstance(content, list):
        return content
    texts = [_part_text(p) for p in content]
    if all(t is not None for t in texts):
        return "".join(cast(list[str], texts))
    parts: list[Any] = []
    for p, text in zip(content, texts, strict=True):
        if text is not None:
            parts.append({"type": text_type, "text": text})
        elif isinstance(p, Mapping) and p.get("type") == "image_url":
            image = p.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            detail = image.get("detail") if isinstance(image, Mapping) else None
            parts.append({"type": "input_image", "image_url": url, "detail": detail or "auto"})
        else:
            parts.append(thaw(p))
    return parts
