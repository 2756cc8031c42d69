"""The model-visible message: `Message` and `Role`.

The package's modules, each importing only those above it: ``_role`` (`Role`),
``_openai`` (OpenAI's chat-completions shape: its names, `UnsendableMessage`,
tool calls and fields to and from it, `tool_call_parts`) and ``_message``
(`Message` itself, `trusted_message`).
"""

from __future__ import annotations

from nous_actor.core.message._message import Message as Message
from nous_actor.core.message._message import trusted_message as trusted_message
from nous_actor.core.message._openai import DEVELOPER as DEVELOPER
from nous_actor.core.message._openai import OPENAI_EXTRA as OPENAI_EXTRA
from nous_actor.core.message._openai import OPENAI_ROLE as OPENAI_ROLE
from nous_actor.core.message._openai import UnsendableMessage as UnsendableMessage
from nous_actor.core.message._openai import tool_call_parts as tool_call_parts
from nous_actor.core.message._role import Role as Role

__all__ = ["Message", "Role", "UnsendableMessage", "tool_call_parts"]
