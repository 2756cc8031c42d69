"""One session as a timeline: every event in seq order, what shadows what, the replaces as spans.

A `Timeline` is built once from a session's stored events and then extended
by the events committed since, so a live session is followed without
refolding. What it keeps, per event (DESIGN.md §3's rules):

* the seq of the **first** replace that shadows it (the lowest seq), or -1:
  an event is shadowed as of seq ``t`` iff that seq is ``<= t``, so one
  number per event gives the greying of every rewind;
* for each replace, its **span**: the rows (events in seq order) whose
  positions its range covers and that come before it, and its **lane**: how
  deep the replaces it encloses go (a prune or a first summary is lane 0; a
  summary of summaries sits one lane further out than the deepest it covers).

Shadowing is computed in O(n log n) for n events (a union-find over plain
events, a sorted list of the replaces' positions); lanes in O(r log r) for r
replaces, again whenever a replace is added.
"""

from __future__ import annotations

import json
import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nous_actor.core.codec import event_to_dict
from nous_actor.core.event import SURFACE_TYPES, Event, EventType, project
from nous_actor.core.message import tool_call_parts
from nous_actor.viewer.langgraph import is_record

__all__ = ["MAX_LANES", "Span", "Timeline"]

MAX_LANES: Final = 8
"""Lanes of spans drawn beside a window of rows; the outer ones are counted, not drawn."""

TEXT_WIDTH: Final = 200
"""Characters of an event's text in a row (the event's page shows it all)."""

LISTED: Final = 500
"""Seqs listed by an audit answer before it only counts them."""


@dataclass(slots=True)
class Span:
    """One replace drawn over the rows it shadows.

    Attributes:
        seq: the replace's seq.
        start, stop: its range of positions (as given: ``stop`` may lie past the end).
        lo, hi: the first and last row (index in seq order) under it; ``hi < lo``
            when it shadows nothing that came before it.
        kind: ``"prune"`` (a tool result put in place of one), ``"summary"`` (a
            system message over a range) or ``"replace"`` (any other).
        lane: how many levels of replaces it encloses (0: none).
    """

    seq: int
    start: int
    stop: int
    lo: int
    hi: int
    kind: str
    lane: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "start": self.start,
            "stop": self.stop,
            "lo": self.lo,
            "hi": self.hi,
            "kind": self.kind,
            "lane": self.lane,
        }


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def event_text(ev: Event) -> str:
    """What an event says, on one line: a message's content and tool calls, else its data."""
    data = {k: v for k, v in ev.data.items() if k != "surface_op"}
    if ev.type in SURFACE_TYPES:
        parts = [] if data.get("content") is None else [_json_text(data["content"])]
        calls = data.get("tool_calls") or ()
        if isinstance(calls, Sequence) and not isinstance(calls, str) and calls:
            shown = []
            for call in calls:
                if isinstance(call, Mapping):
                    _, name, args = tool_call_parts(call)
                    shown.append(f"{name}({'' if args is None else _json_text(args)})")
                else:
                    shown.append(_json_text(call))
            parts.append("-> " + ", ".join(shown))
        text = " ".join(parts)
    else:
        text = json.dumps(data, ensure_ascii=False, default=str) if data else ""
    text = text.replace("\n", " ")
    return text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 1] + "…"


class Timeline:
    """A session's events with their shadowing, spans, turns and fork, kept current by
    `extend`. Safe to share between threads (every method holds one lock)."""

    def __init__(self, session_id: str, events: Iterable[Event] = ()) -> None:
        self.session_id = session_id
        self._lock = threading.RLock()
        self.events: list[Event] = []
        self.seqs: list[int] = []
        self.first_shadow: list[int] = []  # seq of the first replace shadowing it, or -1
        self.turn_of: list[int] = []  # seq of the turn_start of the turn it is in, or -1
        self._next: list[int] = [0]  # union-find over rows (+ a sentinel): next unshadowed plain
        self._replace_pos: list[tuple[int, int]] = []  # (position, row) of unshadowed replaces
        self.spans: list[Span] = []
        self._span_of: dict[int, Span] = {}
        self._lanes_dirty = False
        self._open_turn = -1
        self.forked_from: dict[str, Any] | None = None
        self.compactions: list[int] = []
        self.turn_starts: list[int] = []
        self._count = 0
        self.langgraph = 0  # records of the LangGraph checkpointer
        self._as_of_cache: tuple[int, int, list[dict[str, Any]], int] | None = None
        self.extend(events)

    # -- building ----------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The seq the session's next event gets."""
        return self._count

    def extend(self, events: Iterable[Event]) -> int:
        """Add events committed after the last one held (older seqs are skipped);
        returns how many were added."""
        added = 0
        with self._lock:
            for ev in events:
                if ev.seq < self._count:
                    continue  # held already
                self._add(ev)
                self._count = ev.seq + 1
                added += 1
            if added:
                self._as_of_cache = None
        return added

    def _find(self, i: int) -> int:
        nxt = self._next
        root = i
        while nxt[root] != root:
            root = nxt[root]
        while nxt[i] != root:
            nxt[i], i = root, nxt[i]
        return root

    def _add(self, ev: Event) -> None:
        row = len(self.events)
        self.events.append(ev)
        self.seqs.append(ev.seq)
        self.first_shadow.append(-1)
        op = ev.surface_op
        # A replace is not a plain row: the union-find walks past it.
        self._next[row] = row + 1 if op is not None else row
        self._next.append(row + 1)  # the new sentinel
        if ev.type is EventType.TURN_START:
            self._open_turn = ev.seq
            self.turn_starts.append(ev.seq)
        self.turn_of.append(self._open_turn)
        if ev.type is EventType.TURN_END:
            self._open_turn = -1
        if ev.type is EventType.REQUEST_HEADER and self.forked_from is None:
            forked = ev.data.get("forked_from")
            if isinstance(forked, Mapping):
                self.forked_from = dict(forked)
        if is_record(ev):
            self.langgraph += 1
        if ev.type is EventType.STEP_END and ev.data.get("step") == "compaction":
            self.compactions.append(ev.seq)
        if op is not None:
            self._shadow(ev, row, op.start, op.stop)

    def _shadow(self, ev: Event, row: int, start: int, stop: int) -> None:
        seqs = self.seqs
        lo = bisect_left(seqs, start, 0, row)
        hi = bisect_right(seqs, min(stop, ev.seq - 1), 0, row)  # rows lo .. hi-1
        i = self._find(lo)
        while i < hi:
            self.first_shadow[i] = ev.seq
            self._next[i] = i + 1
            i = self._find(i + 1)
        # Replaces standing at a position in range are shadowed too (each only once).
        rp = self._replace_pos
        j = bisect_left(rp, (start, -1))
        k = j
        while k < len(rp) and rp[k][0] <= stop:
            self.first_shadow[rp[k][1]] = ev.seq
            k += 1
        del rp[j:k]
        insort(rp, (start, row))
        kind = "replace"
        if start == stop and ev.type is EventType.TOOL_RESULT:
            kind = "prune"
        elif ev.type is EventType.SYSTEM_MESSAGE:
            kind = "summary"
        span = Span(ev.seq, start, stop, lo, hi - 1, kind)
        self.spans.append(span)
        self._span_of[ev.seq] = span
        self._lanes_dirty = True

    def _lanes(self) -> None:
        """Give each span its lane: one more than the deepest span it encloses."""
        if not self._lanes_dirty:
            return
        self._lanes_dirty = False
        live = [s for s in self.spans if s.hi >= s.lo]
        for s in self.spans:
            s.lane = 0
        live.sort(key=lambda s: (s.lo, -s.hi, -s.seq))
        stack: list[Span] = []

        def close(inner: Span) -> None:
            if stack:
                outer = stack[-1]
                if outer.lo <= inner.lo and inner.hi <= outer.hi:
                    outer.lane = max(outer.lane, inner.lane + 1)

        for s in live:
            while stack and stack[-1].hi < s.lo:
                close(stack.pop())
            stack.append(s)
        while stack:
            close(stack.pop())

    # -- reading -------------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        """The session at a glance: counts, its fork, its compactions and turns."""
        with self._lock:
            visible = sum(
                1
                for ev, sh in zip(self.events, self.first_shadow, strict=True)
                if sh < 0 and ev.type in SURFACE_TYPES
            )
            return {
                "session_id": self.session_id,
                "rows": len(self.events),
                "next_seq": self.next_seq,
                "first_seq": self.seqs[0] if self.seqs else None,
                "replaces": len(self.spans),
                "prunes": sum(1 for s in self.spans if s.kind == "prune"),
                "summaries": sum(1 for s in self.spans if s.kind == "summary"),
                "compactions": len(self.compactions),
                "turns": len(self.turn_starts),
                "surface_events": visible,
                "shadowed": sum(1 for sh in self.first_shadow if sh >= 0),
                "forked_from": self.forked_from,
                "langgraph": self.langgraph,
            }

    def rows(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Rows ``lo`` to ``hi - 1`` (indices in seq order), each a JSON-ready dict."""
        with self._lock:
            lo, hi = max(lo, 0), min(hi, len(self.events))
            out = []
            fork_through = -1
            if self.forked_from is not None:
                through = self.forked_from.get("through_seq")
                fork_through = through if isinstance(through, int) else -1
            for i in range(lo, hi):
                ev = self.events[i]
                op = ev.surface_op
                shadow = self.first_shadow[i]
                shadow_span = self._span_of.get(shadow)
                out.append(
                    {
                        "row": i,
                        "seq": ev.seq,
                        "type": ev.type.value,
                        "time": ev.time.isoformat(),
                        "position": ev.position,
                        "replace": None if op is None else [op.start, op.stop],
                        "kind": None if op is None else self._span_of[ev.seq].kind,
                        "surface": ev.type in SURFACE_TYPES,
                        "shadowed_by": shadow if shadow >= 0 else None,
                        "pruned": shadow_span is not None and shadow_span.kind == "prune",
                        "turn": self.turn_of[i] if self.turn_of[i] >= 0 else None,
                        "inherited": ev.seq <= fork_through,
                        "text": event_text(ev),
                    }
                )
            return out

    def spans_over(self, lo: int, hi: int) -> dict[str, Any]:
        """The spans over any of rows ``lo`` to ``hi - 1``: the `MAX_LANES` innermost lanes,
        and how many spans further out are left undrawn."""
        with self._lock:
            self._lanes()
            over = [s for s in self.spans if s.hi >= s.lo and s.lo < hi and s.hi >= lo]
            lanes = sorted({s.lane for s in over})
            kept = set(lanes[:MAX_LANES])
            drawn = [s.as_dict() for s in over if s.lane in kept]
            column = {lane: k for k, lane in enumerate(lanes[:MAX_LANES])}
            for d in drawn:
                d["column"] = column[d["lane"]]
            return {"spans": drawn, "more": len(over) - len(drawn)}

    def row_of(self, seq: int) -> int:
        """The row of the event at ``seq``, or of the first one after it (the end if none)."""
        with self._lock:
            return bisect_left(self.seqs, seq)

    def _row_exact(self, seq: int) -> int:
        i = bisect_left(self.seqs, seq)
        if i >= len(self.seqs) or self.seqs[i] != seq:
            raise KeyError(seq)
        return i

    def event(self, seq: int) -> dict[str, Any]:
        """One event in full, with its audit: the replaces that shadow it and, for a
        replace, what it shadows.

        Raises:
            KeyError: no retained event has that seq.
        """
        with self._lock:
            i = self._row_exact(seq)
            ev = self.events[i]
            pos = ev.position
            over = [
                s.seq for s in self.spans if s.seq > ev.seq and s.start <= pos <= s.stop
            ]  # seq order already
            out: dict[str, Any] = {
                "row": i,
                "event": event_to_dict(ev),
                "first_shadowed_by": self.first_shadow[i] if self.first_shadow[i] >= 0 else None,
                "shadowed_by": over[:LISTED],
                "shadowed_by_count": len(over),
                "turn": self.turn_of[i] if self.turn_of[i] >= 0 else None,
            }
            span = self._span_of.get(ev.seq)
            if span is not None:
                out["replaces"] = self._replaced(span)
            return out

    def _replaced(self, span: Span) -> dict[str, Any]:
        """What the replace ``span`` shadows: every event, those it hid first, the
        replaces among them (the summaries it summarises)."""
        rows = range(span.lo, span.hi + 1) if span.hi >= span.lo else range(0)
        plain = [self.seqs[i] for i in rows if self.events[i].surface_op is None]
        nested = [
            s.seq for s in self.spans if s.seq < span.seq and span.start <= s.start <= span.stop
        ]
        every = sorted([*plain, *nested])
        first = [seq for seq in every if self.first_shadow[self._row_exact(seq)] == span.seq]
        return {
            "kind": span.kind,
            "range": [span.start, span.stop],
            "rows": [span.lo, span.hi],
            "count": len(every),
            "seqs": every[:LISTED],
            "first_hidden_here": len(first),
            "nested_replaces": nested[-LISTED:],
            "nested_count": len(nested),
            "pruned_original": plain[0] if span.kind == "prune" and plain else None,
        }

    def surface_as_of(self, seq: int | None, limit: int = 2000) -> dict[str, Any]:
        """The messages the model saw right after event ``seq`` (now, for ``None``):
        the first ``limit`` of them in full, and how many there were.

        No refold: an event is on the surface as of ``seq`` iff it is a surface
        event with a seq up to ``seq`` that no replace up to ``seq`` shadows, that
        is, whose first shadowing replace (if any) comes after ``seq``; the
        surface is those events stably sorted by position (DESIGN §3).

        Raises:
            ValueError: ``seq`` is negative or past the head.
        """
        with self._lock:
            count = self.next_seq
            at = count - 1 if seq is None else seq
            if not -1 <= at < count or (seq is not None and seq < 0):
                raise ValueError(f"as of seq {seq}: give a seq from 0 to {count - 1}")
            cached = self._as_of_cache
            if cached is not None and cached[0] == at and cached[1] == count:
                shown, total = cached[2], cached[3]
            else:
                end = bisect_right(self.seqs, at)
                kept = [
                    ev
                    for ev, first in zip(self.events[:end], self.first_shadow[:end], strict=True)
                    if ev.type in SURFACE_TYPES and not 0 <= first <= at
                ]
                kept.sort(key=_position)  # stable: ties keep seq order
                total = len(kept)
                shown = []
                for ev in kept[:limit]:
                    m = project(ev)
                    shown.append(
                        {
                            "seq": ev.seq,
                            "role": m.role.value,
                            "text": _message_text(m.content, m.tool_calls),
                            "tool_call_id": m.tool_call_id,
                        }
                    )
                self._as_of_cache = (at, count, shown, total)
            return {"as_of": at, "count": total, "messages": shown}


def _position(ev: Event) -> int:
    return ev.position


def _message_text(content: Any, calls: Sequence[Any]) -> str:
    parts = [] if content is None else [_json_text(content)]
    if calls:
        shown = []
        for call in calls:
            _, name, args = tool_call_parts(call)
            shown.append(f"{name}({'' if args is None else _json_text(args)})")
        parts.append("-> " + ", ".join(shown))
    text = " ".join(parts)
    return text if len(text) <= 4 * TEXT_WIDTH else text[: 4 * TEXT_WIDTH - 1] + "…"
