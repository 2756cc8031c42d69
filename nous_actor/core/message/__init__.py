"""The model-visible message: `Message` and `Role`.

The package's modules, each importing only those above it: ``_base`` (`Role`,
`UnsendableMessage`, the names of OpenAI's shape), ``_openai`` (tool calls and
fields to and from OpenAI's chat-completions shape, `tool_call_parts`) and
``_message`` (`Message` itself, `trusted_message`).
"""

from __future__ import annotations

from nous_actor.core.message._base import DEVELOPER as DEVELOPER
from nous_actor.core.message._base import OPENAI_EXTRA as OPENAI_EXTRA
from nous_actor.core.message._base import OPENAI_ROLE as OPENAI_ROLE
from nous_actor.core.message._base import Role as Role
from nous_actor.core.message._base import UnsendableMessage as UnsendableMessage
from nous_actor.core.message._message import Message as Message
from nous_actor.core.message._message import trusted_message as trusted_message
from nous_actor.core.message._openai import tool_call_parts as tool_call_parts

__all__ = ["Message", "Role", "UnsendableMessage", "tool_call_parts"]
