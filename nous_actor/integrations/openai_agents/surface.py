"""The replaces that hide items, since nothing is deleted: cleared markers and a pop's plan.

A cleared marker (a `system_message` with no content and
`metadata["openai_cleared"]`) stands for no item; `_plan_pop` works out the
replace `pop_item` appends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event, EventType
from nous_actor.core.message import Message
from nous_actor.integrations.openai_agents.items import items_of_message
from nous_actor.integrations.openai_agents.records import CLEARED_KEY, OP_KEY


def _message(ev: Event) -> Message:
    m = ev.to_message()
    assert m is not None  # surface events project
    return m


def _is_marker(ev: Event) -> bool:
    meta = ev.data.get("metadata")
    return isinstance(meta, Mapping) and CLEARED_KEY in meta


def _marker(op: str, start: int, stop: int, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": None,
        "metadata": {CLEARED_KEY: op},
        "surface_op": ["replace", start, stop],
        OP_KEY: record,
    }


def _plan_pop(
    surface: Sequence[Event],
) -> tuple[dict[str, Any], EventType, dict[str, Any], datetime] | None:
    """What `pop_item` appends: `(popped item, type, data, time)`, or `None` if empty."""
    per = [items_of_message(_message(ev)) for ev in surface]
    last = next((i for i in range(len(per) - 1, -1, -1) if per[i]), None)
    if last is None:
        return None
    ev, items = surface[last], per[last]
    popped = items[-1]
    keep: Event | None
    if len(items) > 1:  # another writer's assistant message: drop its last tool call
        keep, lo = ev, ev.position
        data = thaw(ev.data)
        data["tool_calls"] = data["tool_calls"][:-1]
        etype, time = ev.type, ev.time
    elif last > 0:  # a copy of the previous message stands in for both
        keep = surface[last - 1]
        lo = keep.position
        data = thaw(keep.data)
        etype, time = keep.type, keep.time
    else:
        keep, lo = None, ev.position
        data = _marker("pop_item", 0, 0, {})
        etype, time = EventType.SYSTEM_MESSAGE, datetime.now(UTC)
    hi = ev.position
    for other, its in zip(surface, per, strict=True):
        if other is not ev and other is not keep and its and lo <= other.position <= hi:
            raise RuntimeError(
                f"cannot pop the item of seq {ev.seq}: event seq {other.seq}, written by other "
                f"code, shares its surface position range {lo}..{hi}; nothing was appended"
            )
    data["surface_op"] = ["replace", lo, hi]
    data[OP_KEY] = {"op": "pop_item", "popped_seq": ev.seq}
    return popped, etype, data, time
