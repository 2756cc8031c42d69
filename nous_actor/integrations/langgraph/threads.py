"""The fold of a thread's log: `ThreadLog`, what a thread's session says of its
checkpoints and writes, caught up event by event and memoised, so that reading the
latest checkpoint of a long thread costs what a short one costs."""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event
from nous_actor.integrations.langgraph.codec import (
    EDIT,
    TAIL,
    WHOLE,
    WRITTEN,
    decode,
    flatten,
    plain_mapping,
)
from nous_actor.integrations.langgraph.framework import SerializerProtocol
from nous_actor.integrations.langgraph.records import RECORD_KEY, State, joined

__all__ = ["Cp", "ThreadLog"]

RESOLVED_KEPT: Final = 8
"""How many checkpoints' resolved states a thread keeps (the most recently used)."""


@dataclass(eq=False)
class Cp:
    """One stored checkpoint of a thread: its record, where it is, and whether LangGraph
    may still see it."""

    seq: int
    ns: str
    id: str
    parent: str | None
    rec: Mapping[str, Any]
    run: str | None
    time: datetime
    hidden: bool = False
    meta: dict[str, Any] | None = field(default=None, repr=False)


_Write = tuple[str, str, Sequence[Any], str]  # task id, channel, kept value, task path


class ThreadLog:
    """The checkpoints and writes of one thread, folded from its session's events.

    Events are taken in seq order (`ingest` ignores those seen already); every
    method is called under `lock`, which the saver holds while it reads or
    changes the fold (never while it waits for the session).
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.lock = threading.Lock()
        self.next = 0  # the seq after the last event folded
        self.cps: dict[tuple[str, str], Cp] = {}
        self._visible: dict[str, list[str]] = {}  # ns -> ids of visible checkpoints, sorted
        self._writes: dict[tuple[str, str], dict[tuple[str, int], _Write]] = {}
        self._runs: dict[str, list[Cp]] = {}
        self._resolved: OrderedDict[tuple[str, str], State] = OrderedDict()
        self._parts: dict[str, list[Mapping[str, Any]]] = {}  # a large record's parts read

    # -- folding ----------------------------------------------------------------------------

    def ingest(self, events: Iterable[Event]) -> None:
        """Fold ``events`` (a session's, ascending seq) past those folded already."""
        for ev in events:
            if ev.seq < self.next:
                continue
            self.next = ev.seq + 1
            data: Mapping[str, Any] = ev.data
            if data.get(RECORD_KEY) == "part":
                of = str(data["of"])
                parts = self._parts.setdefault(of, [])
                parts.append(data)
                if len(parts) < int(data["n"]):
                    continue
                del self._parts[of]
                parts.sort(key=lambda p: int(p["i"]))
                data = joined(parts)
            self._fold(ev.seq, data, ev.time, ev.surface_op)

    def _fold(self, seq: int, data: Mapping[str, Any], time: datetime, op: Any) -> None:
        kind = data.get(RECORD_KEY)
        if kind == "cp":
            self._add_cp(seq, data, time)
        elif kind == "w":
            self._add_writes(data)
        elif kind == "del":
            self._hide(c for c in self.cps.values() if c.seq < seq)
        elif kind == "prune":
            keep = {(str(ns), str(i)) for ns, i in data.get("keep") or ()}
            self._hide(c for k, c in self.cps.items() if c.seq < seq and k not in keep)
        elif kind == "runs":
            for run in data.get("runs") or ():
                self._hide(c for c in self._runs.get(str(run), ()) if c.seq < seq)
        elif op is not None:  # a rollback's replace over a run's turn
            self._hide(c for c in self.cps.values() if op.start <= c.seq <= op.stop < seq)

    def caught_up_with(self, events: Sequence[Event]) -> None:
        """`ingest` the events of one of the saver's own appends, if they come right after
        those folded (else the next read's catch-up folds them, in order)."""
        if events and events[0].seq == self.next:
            self.ingest(events)

    def _add_cp(self, seq: int, data: Mapping[str, Any], time: datetime) -> None:
        ns, cid = str(data["ns"]), str(data["id"])
        parent = data.get("parent")
        run = data.get("run")
        cp = Cp(seq, ns, cid, None if parent is None else str(parent), data, run, time)
        old = self.cps.get((ns, cid))
        if old is not None:  # the same checkpoint put again: the later record stands
            if not old.hidden:
                self._unlist(old)
            self._resolved.pop((ns, cid), None)
        self.cps[(ns, cid)] = cp
        ids = self._visible.setdefault(ns, [])
        if not ids or ids[-1] < cid:
            ids.append(cid)
        else:
            bisect.insort(ids, cid)
        if isinstance(run, str):
            self._runs.setdefault(run, []).append(cp)

    def _add_writes(self, data: Mapping[str, Any]) -> None:
        key = (str(data["ns"]), str(data["cp"]))
        task, path = str(data["task"]), str(data.get("path") or "")
        table = self._writes.setdefault(key, {})
        for idx, ch, kept in data["w"]:
            wkey = (task, int(idx))
            if wkey[1] >= 0 and wkey in table:
                continue  # a write of a task is stored once (put_writes is idempotent)
            table[wkey] = (task, str(ch), kept, path)

    def _hide(self, cps: Iterable[Cp]) -> None:
        for cp in list(cps):
            if not cp.hidden:
                cp.hidden = True
                self._unlist(cp)

    def _unlist(self, cp: Cp) -> None:
        ids = self._visible.get(cp.ns)
        if ids is None:
            return
        i = bisect.bisect_left(ids, cp.id)
        if i < len(ids) and ids[i] == cp.id:
            del ids[i]
        if not ids:
            del self._visible[cp.ns]

    # -- what LangGraph sees -----------------------------------------------------------------

    def has(self, ns: str, cid: str) -> bool:
        """Whether checkpoint ``cid`` of ``ns`` is folded (seen or not)."""
        return (ns, cid) in self.cps

    def find(self, ns: str, cid: str | None) -> Cp | None:
        """Checkpoint ``cid`` of namespace ``ns`` (the latest when None), if visible."""
        if cid is None:
            ids = self._visible.get(ns)
            return self.cps[(ns, ids[-1])] if ids else None
        cp = self.cps.get((ns, cid))
        return None if cp is None or cp.hidden else cp

    def listed(self, ns: str | None) -> Iterator[Cp]:
        """The visible checkpoints of ``ns`` (of every namespace when None), newest id
        first."""
        if ns is not None:
            for cid in reversed(self._visible.get(ns, ())):
                yield self.cps[(ns, cid)]
            return
        every = [self.cps[(n, cid)] for n, ids in self._visible.items() for cid in ids]
        every.sort(key=lambda c: (c.id, c.ns), reverse=True)
        yield from every

    def namespaces(self) -> list[str]:
        """The namespaces with a visible checkpoint."""
        return list(self._visible)

    def latest_per_ns(self) -> list[tuple[str, str]]:
        """(namespace, id) of the latest visible checkpoint of each namespace."""
        return [(ns, ids[-1]) for ns, ids in self._visible.items()]

    def run_ids(self) -> set[str]:
        """The run ids of the visible checkpoints."""
        return {run for run, cps in self._runs.items() if any(not c.hidden for c in cps)}

    def writes(
        self, serde: SerializerProtocol, cp: Cp, channel: str | None = None
    ) -> list[tuple[str, str, Any]]:
        """The pending writes of ``cp`` (to ``channel`` only, when given), in LangGraph's
        order (task path, task id, idx)."""
        table = self._writes.get((cp.ns, cp.id))
        if not table:
            return []
        ordered = sorted(table.items(), key=lambda kv: (kv[1][3], kv[0][0], kv[0][1]))
        return [
            (task, ch, decode(serde, kept))
            for (task, _), (_, ch, kept, _) in ordered
            if channel is None or ch == channel
        ]

    def written(self, ns: str, cid: str, channel: str) -> tuple[list[Any], Sequence[Any]] | None:
        """The one pending write of checkpoint ``cid`` to ``channel``: its ``[task, idx]``
        and its value as kept (None if it has none, or more than one)."""
        table = self._writes.get((ns, cid))
        if not table:
            return None
        mine = [(k, w) for k, w in table.items() if w[1] == channel and k[1] >= 0]
        if len(mine) != 1:
            return None
        (task, idx), w = mine[0]
        return [task, idx], w[2]

    def raw_writes(self, cp: Cp) -> list[tuple[str, int, str, Sequence[Any], str]]:
        """The pending writes of ``cp`` as kept: (task, idx, channel, value, path)."""
        table = self._writes.get((cp.ns, cp.id)) or {}
        return [(t, i, ch, kept, path) for (t, i), (_, ch, kept, path) in table.items()]

    def metadata(self, serde: SerializerProtocol, cp: Cp) -> dict[str, Any]:
        """The metadata of ``cp`` (decoded once; the caller gets a copy of its own, nested
        dicts and lists included)."""
        if cp.meta is None:
            cp.meta = decode(serde, cp.rec["meta"])
        copied: dict[str, Any] = thaw(cp.meta)
        return copied

    def ancestry(
        self, cp: Cp, channels: Iterable[str]
    ) -> tuple[list[Cp], dict[str, tuple[int, int]]]:
        """``cp`` and its ancestors (hidden ones too: their values are the base of
        ``cp``'s), newest first, as far back as the nearest holding a value of each of
        ``channels`` (else to the first); and, for each channel one of them holds, the
        index of the nearest that holds it and of the one whose record set the value
        it holds (read from the records alone, nothing decoded)."""
        chain: list[Cp] = []
        since = dict.fromkeys(channels, 0)  # where each channel's undecided stretch begins
        found: dict[str, tuple[int, int]] = {}
        cur: Cp | None = cp
        while cur is not None and len(found) < len(since):
            at = len(chain)
            chain.append(cur)
            rec = cur.rec
            vals = rec.get("vals") or {}
            dropped = rec.get("drop") or ()
            full = bool(rec.get("full"))
            for ch, start in since.items():
                if ch in found:
                    continue
                if ch in vals:  # set here: every checkpoint since ``start`` holds it
                    found[ch] = (start, at)
                elif full or ch in dropped:
                    since[ch] = at + 1  # none from ``start`` to here holds it
            cur = None if cur.parent is None else self.cps.get((cur.ns, cur.parent))
        return chain, found

    def value_set(self, serde: SerializerProtocol, cp: Cp, channel: str) -> Any:
        """The value of ``channel`` that ``cp``'s record sets (decoded from the record
        alone when it is kept whole, else from ``cp``'s state)."""
        how, kept = cp.rec["vals"][channel]
        if how == WHOLE:
            return decode(serde, kept)
        return self.state(serde, cp).values[channel]

    # -- states ------------------------------------------------------------------------------

    def remember(self, ns: str, cid: str, state: State) -> None:
        """Keep ``state`` as checkpoint ``cid``'s resolved state (the one it was put with)."""
        self._keep((ns, cid), state)

    def states(self, serde: SerializerProtocol, cps: Iterable[Cp]) -> dict[Cp, State]:
        """The state of each of ``cps`` (see `state`), each folded onto the nearest
        ancestor among them, oldest first: so the states of a thread's whole history cost
        what its records hold, not what each checkpoint holds again."""
        known: dict[tuple[str, str], State] = {}
        out: dict[Cp, State] = {}
        for cp in sorted(cps, key=lambda c: c.seq):
            out[cp] = known[(cp.ns, cp.id)] = self.state(serde, cp, known)
        return out

    def state(
        self,
        serde: SerializerProtocol,
        cp: Cp,
        known: Mapping[tuple[str, str], State] | None = None,
    ) -> State:
        """The values, versions and versions seen of ``cp``, folded from its record and
        those of its ancestors back to one kept whole or resolved already (memoised:
        the latest checkpoint of a thread is resolved when it is put or first read; an
        ancestor's state in ``known`` serves as one resolved)."""
        hit = self._resolved.get((cp.ns, cp.id))
        if hit is not None:
            self._resolved.move_to_end((cp.ns, cp.id))
            return hit
        chain: list[Cp] = []
        cur: Cp | None = cp
        base: State | None = None
        while cur is not None:
            hit = self._resolved.get((cur.ns, cur.id))
            if hit is None and known is not None:
                hit = known.get((cur.ns, cur.id))
            if hit is not None:
                base = hit
                break
            chain.append(cur)
            if cur.rec.get("full") or cur.parent is None:
                break
            cur = self.cps.get((cur.ns, cur.parent))
        values: dict[str, Any] = dict(base.values) if base else {}
        versions: dict[str, Any] = dict(base.versions) if base else {}
        seen: dict[str, dict[str, Any]] = dict(base.seen) if base else {}
        owned: set[str] = set()  # channels whose list this fold made (extended in place)
        # A channel's value set whole (or dropped) by a later step of the chain makes
        # whatever earlier steps did to it moot: those are not read back.
        over: dict[str, int] = {}  # channel -> how many steps of the chain are moot for it
        for at, step in enumerate(reversed(chain)):
            for ch in step.rec.get("drop") or ():
                over[ch] = at
            for ch, (how, _) in (step.rec.get("vals") or {}).items():
                if how == WHOLE:
                    over[ch] = at
        for at, step in enumerate(reversed(chain)):
            rec = step.rec
            if rec.get("full"):
                values, versions, seen, owned = {}, {}, {}, set()
            for ch in rec.get("drop") or ():
                values.pop(ch, None)
            for ch, (how, kept) in (rec.get("vals") or {}).items():
                if at < over.get(ch, 0):
                    continue
                if how == TAIL:
                    current = values.get(ch)
                    if ch not in owned or not isinstance(current, list):
                        current = list(current) if isinstance(current, list) else []
                        values[ch] = current
                        owned.add(ch)
                    current.extend(decode(serde, kept))
                elif how == WHOLE:
                    values[ch] = decode(serde, kept)
                    owned.add(ch)
                elif how == EDIT:
                    current = values.get(ch)
                    parent = current if isinstance(current, list) else []
                    edited: list[Any] = []
                    for run in kept:
                        if run[0] == "k":
                            edited.extend(parent[run[1] : run[2]])
                        else:
                            edited.extend(decode(serde, run[1]))
                    values[ch] = edited
                    owned.add(ch)
                elif how == WRITTEN:
                    current = values.get(ch)
                    if ch not in owned or not isinstance(current, list):
                        current = list(current) if isinstance(current, list) else []
                        values[ch] = current
                        owned.add(ch)
                    table = self._writes.get((step.ns, step.parent or "")) or {}
                    kept_writes = [table[(str(t), int(i))][2] for t, i in kept]
                    current.extend(flatten([decode(serde, w) for w in kept_writes]))
            for k in rec.get("vers_drop") or ():
                versions.pop(k, None)
            versions.update(plain_mapping(rec.get("vers") or {}))
            for n in rec.get("seen_drop") or ():
                seen.pop(n, None)
            seen.update(plain_mapping(rec.get("seen") or {}))
        state = State(values, versions, seen)
        self._keep((cp.ns, cp.id), state)
        return state

    def _keep(self, key: tuple[str, str], state: State) -> None:
        self._resolved[key] = state
        self._resolved.move_to_end(key)
        while len(self._resolved) > RESOLVED_KEPT:
            self._resolved.popitem(last=False)
