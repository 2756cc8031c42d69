"""A naive reference fold, written straight from the rules of DESIGN.md §3.

It is O(n·r) on purpose: every event is checked against every replace. Use it
as an oracle in tests (it is what `nous_actor.Log`'s fold is checked
against) and as the baseline in benchmarks; never in production code.
"""

from __future__ import annotations

from collections.abc import Sequence

from nous_actor.core.event import SURFACE_TYPES, Event, parse_surface_op
from nous_actor.core.message import Message

__all__ = [
    "reference_derive_indexed",
    "reference_project",
    "reference_shadowed",
    "reference_surface",
]


def _position(ev: Event) -> int:
    op = parse_surface_op(ev.data.get("surface_op"))
    return ev.seq if op is None else op.start


def reference_shadowed(events: Sequence[Event]) -> set[int]:
    """Seqs of the events some later replace shadows (§3, read literally)."""
    replaces = []
    for r in events:
        op = parse_surface_op(r.data.get("surface_op"))
        if op is not None:
            replaces.append((r.seq, op.start, op.stop))
    shadowed = set()
    for c in events:
        p = _position(c)
        for r_seq, start, stop in replaces:
            if c.seq < r_seq and start <= p <= stop:
                shadowed.add(c.seq)
                break
    return shadowed


def reference_surface(events: Sequence[Event]) -> list[Event]:
    """Unshadowed surface-typed events, stably sorted by position."""
    shadowed = reference_shadowed(events)
    kept = [e for e in events if e.type in SURFACE_TYPES and e.seq not in shadowed]
    return sorted(kept, key=_position)


def reference_derive_indexed(events: Sequence[Event]) -> list[tuple[int, Message]]:
    """``(seq, message)`` pairs of `reference_surface`, projected per §3."""
    return [(e.seq, reference_project(e)) for e in reference_surface(events)]


_ROLE = {
    "system_message": "system",
    "user_message": "user",
    "assistant_message": "assistant",
    "tool_result": "tool",
}


def reference_project(ev: Event) -> Message:
    """The §3 projection, through the public `Message` constructor."""
    d = ev.data
    return Message(
        _ROLE[ev.type.value],
        d.get("content"),
        reasoning_content=d.get("reasoning_content"),
        tool_calls=d.get("tool_calls") or [],
        tool_call_id=d.get("tool_call_id"),
        name=d.get("name"),
        metadata=d.get("metadata") or {},
        created_at=ev.time,
    )
