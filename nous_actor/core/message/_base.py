"""The bottom of `nous_actor.core.message`: `Role`, `UnsendableMessage`, and the names of
OpenAI's chat-completions shape that the message and its conversion share."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["DEVELOPER", "OPENAI_EXTRA", "OPENAI_ROLE", "Role", "UnsendableMessage"]


class Role(StrEnum):
    """Who speaks a message. Plain strings (``"user"``) are accepted everywhere."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_ROLES = ", ".join(repr(r.value) for r in Role)
# Keys of an OpenAI chat-completions message that map onto Message fields.
_OPENAI_KEYS = frozenset(
    {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}
)
_ROLE_VALUES = frozenset(r.value for r in Role)


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
