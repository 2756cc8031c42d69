"""Audit: what shadowed an event, what a replace stands for, what compactions did.

Works on any `nous_actor.Log` (rewind one with ``log.as_of(seq)``
first to audit the past). Events a snapshot dropped are gone and cannot be
explained; audit before snapshotting if you need the full trail.

>>> from nous_actor import Log
>>> log = (Log().append("user_message", {"content": "q"})
...        .append("assistant_message", {"content": "a"})
...        .append("system_message", {"content": "s1", "surface_op": ("replace", 0, 1)})
...        .append("system_message", {"content": "s2", "surface_op": ("replace", 0, 0)}))
>>> shadowed_by(log, 0), shadowed_by(log, 0, transitive=True)
([2, 3], [2, 3])
>>> replaced(log, 3), replaced(log, 3, transitive=True)
([0, 2], [0, 1, 2])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log

__all__ = ["compactions", "explain", "replaced", "shadowed_by", "turns"]


def _event(log: Log, seq: int) -> Event:
    found = log.since(seq)
    if not found or found[0].seq != seq:
        raise KeyError(
            f"no retained event with seq {seq} (never appended, or dropped by a snapshot)"
        )
    return found[0]


def _shadows(r: Event, c: Event) -> bool:
    op = r.surface_op
    return op is not None and c.seq < r.seq and op.start <= c.position <= op.stop


def shadowed_by(log: Log, seq: int, *, transitive: bool = False) -> list[int]:
    """Seqs of the replaces that shadow event ``seq`` (sorted).

    With ``transitive``, also the replaces that shadow those, and so on: the
    whole chain of summaries the event disappeared into.

    Raises:
        KeyError: no retained event has that seq.
    """
    target = _event(log, seq)
    later = log.since(seq + 1)
    found: set[int] = set()
    frontier = [target]
    while frontier:
        c = frontier.pop()
        for r in later:
            if r.seq not in found and _shadows(r, c):
                found.add(r.seq)
                if transitive:
                    frontier.append(r)
        if not transitive:
            break
    return sorted(found)


def replaced(log: Log, seq: int, *, transitive: bool = False) -> list[int]:
    """Seqs of the events the replace at ``seq`` shadows (sorted; ``[]`` for a plain event).

    With ``transitive``, also what those replaced, and so on: everything a
    summary of summaries stands for.

    Raises:
        KeyError: no retained event has that seq.
    """
    target = _event(log, seq)
    earlier = log.events()
    found: set[int] = set()
    frontier = [target]
    while frontier:
        r = frontier.pop()
        for c in earlier:
            if c.seq >= r.seq:
                break
            if c.seq not in found and _shadows(r, c):
                found.add(c.seq)
                if transitive and c.surface_op is not None:
                    frontier.append(c)
        if not transitive:
            break
    return sorted(found)


def explain(log: Log, seq: int) -> dict[str, Any]:
    """A readable account of one event: type, position, visibility and its relations."""
    ev = _event(log, seq)
    direct = shadowed_by(log, seq)
    return {
        "seq": ev.seq,
        "type": ev.type.value,
        "position": ev.position,
        "surface_op": None if ev.surface_op is None else [ev.surface_op.start, ev.surface_op.stop],
        "visible": ev.is_surface and not direct,
        "shadowed_by": direct,
        "shadowed_by_transitive": shadowed_by(log, seq, transitive=True),
        "replaces": replaced(log, seq),
        "replaces_transitive": replaced(log, seq, transitive=True),
    }


def compactions(log: Log) -> list[dict[str, Any]]:
    """Every compaction recorded in the log (oldest first), with the seq of its record."""
    return [
        {"seq": ev.seq, "time": ev.time.isoformat(), **ev.data}
        for ev in log.events()
        if ev.type is EventType.STEP_END and ev.data.get("step") == "compaction"
    ]


def turns(log: Log) -> list[dict[str, Any]]:
    """Every managed turn in the log (oldest first): who held it and how it ended.

    One dict per ``turn_start`` that carries a ``turn_id`` (a raw
    ``turn_start`` without one is not a managed turn): ``turn_id``,
    ``owner``, ``policy``, ``start_seq``, and from its ``turn_end`` (``None``
    while open) ``end_seq``, ``how`` (``closed``, ``failed``,
    ``interrupted``, ``rolled_back``, ``expired``, ``abandoned``), ``by``
    (the turn that interrupted or rolled it back), ``reason`` (``restart``
    when a restart ended it), ``note_seq`` (the replace that hid a rolled
    back turn; `replaced` of it lists what it hides), and for a turn whose
    holder was gone ``dangling`` (what was done with its half run:
    ``rollback`` or ``close_tool_calls``) and ``closed_calls`` (the ids of
    the tool calls it left without a result, answered as interrupted).

    A turn whose ``turn_start`` a snapshot dropped (a summary shadowed it; a
    session's snapshot keeps only its newest managed turn event) is listed from
    its ``turn_end``, with ``start_seq`` ``None`` and the ``owner`` and
    ``policy`` the ``turn_end`` names.
    """
    out: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for ev in log.events():
        tid = ev.data.get("turn_id")
        if not isinstance(tid, str):
            continue
        if ev.type is EventType.TURN_START:
            _record(tid, ev.data, ev.seq, by_id, out)
        elif ev.type is EventType.TURN_END:
            # (A turn_end without its turn_start: a snapshot dropped the start.)
            rec = by_id.get(tid) or _record(tid, ev.data, None, by_id, out)
            rec["end_seq"] = ev.seq
            for key in ("how", "by", "reason", "note_seq", "dangling", "closed_calls"):
                rec[key] = ev.data.get(key)
    return out


def _record(
    tid: str,
    data: Mapping[str, Any],
    start_seq: int | None,
    by_id: dict[str, dict[str, Any]],
    out: list[dict[str, Any]],
) -> dict[str, Any]:
    """A new record of turn ``tid`` (listed in ``out``, found in ``by_id``): the owner
    and policy its event's ``data`` names (a ``turn_start``'s, or a ``turn_end``'s
    whose start is gone), nothing of its end yet."""
    rec: dict[str, Any] = {
        "turn_id": tid,
        "owner": data.get("owner"),
        "policy": data.get("policy"),
        "start_seq": start_seq,
        "end_seq": None,
        "how": None,
        "by": None,
        "reason": None,
        "note_seq": None,
        "dangling": None,
        "closed_calls": None,
    }
    by_id[tid] = rec
    out.append(rec)
    return rec
