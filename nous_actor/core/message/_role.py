"""Who speaks a message: `Role`, and its values as a message checks them."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Role"]


class Role(StrEnum):
    """Who speaks a message. Plain strings (``"user"``) are accepted everywhere."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_ROLES = ", ".join(repr(r.value) for r in Role)
_ROLE_VALUES = frozenset(r.value for r in Role)
