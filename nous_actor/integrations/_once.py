"""A batch an adapter appends exactly once, also when the process holding its session dies
between taking the batch and answering it.

That death is the one ambiguous case of a forwarded call (`CallOutcomeUnknown`): the
holder recorded the call's id with its events, in their transaction, so the session's
next holder tells whether it was applied (``applied(call_id)``). Applied, its events are
read back; not applied, the batch is sent again. An adapter's caller (the Agents SDK,
ADK, LangGraph) thus never sees the ambiguity, and never stores a batch twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from nous_actor.core.event import Event
from nous_actor.errors import CallOutcomeUnknown
from nous_actor.sessions.handle import SessionHandle

__all__ = ["ATTEMPTS", "append_once", "append_one_once"]

ATTEMPTS: Final = 3
"""Sends of one batch at most, each lost with its holder (then the error is raised)."""


async def append_once(
    handle: SessionHandle, send: Callable[[], Awaitable[list[Event]]]
) -> list[Event]:
    """``send()`` (an ``append_many`` through ``handle`` or a turn of its session), applied
    exactly once: its events, as stored.

    Raises:
        CallOutcomeUnknown: `ATTEMPTS` sends in a row were lost with their holder, none
            applied.
        Whatever ``send`` raises otherwise.
    """
    for attempt in range(ATTEMPTS):
        try:
            return await send()
        except CallOutcomeUnknown as lost:
            seqs = await handle.applied(lost.call_id)
            if seqs is not None:  # applied: its events, read back
                return (await handle.since(seqs[0]))[: len(seqs)]
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


async def append_one_once(handle: SessionHandle, send: Callable[[], Awaitable[Event]]) -> Event:
    """`append_once` for a call that appends one event (``append``, ``append_at``)."""

    async def batch() -> list[Event]:
        return [await send()]

    return (await append_once(handle, batch))[0]
