"""A LangGraph thread read from its session's raw events: the checkpoint tree, its forks,
and a checkpoint's ``messages`` channel as a timeline.

The LangGraph checkpointer (``nous_actor.integrations.langgraph``) keeps a
thread in one session, one ``request_header`` event per record, its data a
mapping whose ``"lg"`` key names the record's kind:

* ``cp``: a checkpoint (``ns``, ``id``, ``parent``, ``meta``; ``full``, or only
  what changed since its parent: ``vals`` per channel ``["w", value]`` whole,
  ``["t", tail]`` a list extended, ``["r", [[task, idx], ...]]`` a list extended
  by the parent's pending writes; ``drop`` the channels it no longer has);
* ``w``: a task's pending writes to a checkpoint;
* ``del``, ``prune``, ``runs``: a delete of the thread, a prune, a delete of
  runs, each hiding earlier checkpoints from LangGraph (the events stay);
* ``run``: a run's turn ended.

A rollback of a run is the session's own replace over the run's turn: the
checkpoints inside it are hidden, and kept.

This module reads that format on its own (the viewer and the command may not
import the adapter, nor LangGraph): values kept as plain JSON (``["j", v]``) or
as LangChain messages (``["m", ...]``) are shown; a value kept by the saver's
serializer (``[type, base64]``, or ``[type, base85, "z"]`` compressed) is shown as
its type and size, never decoded. Nothing here writes; a malformed record is
counted and skipped, never raised.

`Thread` folds a session's events, in seq order, and is extended by the events
committed since (`Thread.extend`); `Thread.tree` lists its checkpoints (every
one: those hidden are marked, with what hid them), `Thread.messages` a
checkpoint's messages.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, unquote

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event, EventType

__all__ = [
    "MESSAGES",
    "RECORD_KEY",
    "Checkpoint",
    "NoCheckpoint",
    "Opaque",
    "Thread",
    "has_records",
    "is_record",
    "read_thread",
    "session_of",
]

RECORD_KEY: Final = "lg"
"""The data key that marks an event as a record of the LangGraph checkpointer."""

KINDS: Final = frozenset({"cp", "w", "del", "prune", "runs", "run"})
"""The record kinds."""

MESSAGES: Final = "messages"
"""The channel shown as a timeline by default."""

THREAD_PREFIX: Final = "langgraph/"
"""What the session id of a thread starts with (the thread id follows, percent-encoded)."""

TEXT_WIDTH: Final = 2000
"""Characters of a message's content kept in a timeline row."""

GONE_KINDS: Final = {
    "del": "deleted",
    "prune": "pruned",
    "runs": "run deleted",
    "rollback": "rolled back",
}
"""What hid a checkpoint, by the record (or replace) that did."""


class NoCheckpoint(LookupError):
    """A checkpoint asked for is not in the thread."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such checkpoint"


@dataclass(frozen=True, slots=True)
class Opaque:
    """A value the saver's serializer kept: shown as its type and size, not decoded.

    Attributes:
        type: the serializer's type tag (e.g. ``msgpack``).
        bytes: the size of the serialized value as kept (compressed, when it is).
        compressed: whether it is kept zlib-compressed.
    """

    type: str
    bytes: int
    compressed: bool

    def as_dict(self) -> dict[str, Any]:
        return {"opaque": self.type, "bytes": self.bytes, "compressed": self.compressed}

    def text(self) -> str:
        how = ", compressed" if self.compressed else ""
        return f"<{self.type} value, {self.bytes} bytes{how}: not decoded>"


def is_record(ev: Event) -> bool:
    """Whether ``ev`` is a record of the LangGraph checkpointer."""
    return ev.type is EventType.REQUEST_HEADER and ev.data.get(RECORD_KEY) in KINDS


def has_records(events: Iterable[Event]) -> bool:
    """Whether any of ``events`` is a record of the LangGraph checkpointer."""
    return any(is_record(ev) for ev in events)


def _size(kept: Sequence[Any]) -> Opaque:
    text = kept[1] if len(kept) > 1 and isinstance(kept[1], str) else ""
    compressed = len(kept) > 2 and kept[2] == "z"
    try:
        blob = base64.b85decode(text) if compressed else base64.b64decode(text)
        n = len(blob)
    except (ValueError, binascii.Error):
        n = len(text)
    return Opaque(str(kept[0]), n, compressed)


def _message(kind: Any, fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": str(kind)}
    if isinstance(fields, dict):
        out.update(fields)
    return out


def decode(kept: Any) -> Any:
    """A kept value as shown: plain JSON as itself, LangChain messages as dicts (their
    ``type`` and the fields kept), anything else an `Opaque`.

    Raises:
        ValueError: ``kept`` is not a kept value.
    """
    if not isinstance(kept, (list, tuple)) or not kept or not isinstance(kept[0], str):
        raise ValueError(f"not a kept value: {str(kept)[:80]}")
    tag = kept[0]
    if tag == "j":
        return thaw(kept[1]) if len(kept) > 1 else None
    if tag == "m":
        if len(kept) > 2:  # one message: ["m", [type, fields], 1]
            kind, fields = kept[1]
            return _message(kind, thaw(fields))
        return [_message(kind, thaw(fields)) for kind, fields in kept[1]]
    return _size(kept)


def _flatten(values: Iterable[Any]) -> list[Any]:
    """Write values as a list channel's reducer appends them."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, list):
            out.extend(v)
        else:
            out.append(v)
    return out


@dataclass(eq=False, slots=True)
class _Item:
    """One element of a list channel, and the checkpoint whose record added it."""

    value: Any
    added: str


@dataclass(eq=False)
class Checkpoint:
    """One checkpoint record of a thread.

    Attributes:
        seq: the seq of its record (of the later one, when it was put again).
        ns: its namespace (``""`` for the graph, a subgraph's otherwise).
        id: its id.
        parent: its parent's id (same namespace), or None.
        time: when its record was committed (ISO 8601).
        step, source, run: from its metadata (None when absent or not readable).
        full: whether its record holds its whole state (else what changed).
        updated: the channels its record says were updated.
        children: the ids of the checkpoints whose parent it is.
        gone: what hid it from LangGraph (`GONE_KINDS`' values), or None.
        gone_at: the seq of the record (or replace) that hid it.
        puts: how many records put it (the later stands).
        writes: pending writes of tasks to it.
        messages: how many elements its ``messages`` channel holds (None: not a list,
            or kept by the serializer).
    """

    seq: int
    ns: str
    id: str
    parent: str | None
    time: str
    rec: Mapping[str, Any] = field(repr=False)
    step: int | None = None
    source: str | None = None
    run: str | None = None
    full: bool = False
    updated: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    gone: str | None = None
    gone_at: int | None = None
    puts: int = 1
    writes: int = 0
    messages: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ns": self.ns,
            "id": self.id,
            "parent": self.parent,
            "time": self.time,
            "step": self.step,
            "source": self.source,
            "run": self.run,
            "full": self.full,
            "updated": list(self.updated),
            "children": len(self.children),
            "fork": len(self.children) > 1,
            "gone": self.gone,
            "gone_at": self.gone_at,
            "puts": self.puts,
            "writes": self.writes,
            "messages": self.messages,
        }


_Write = tuple[str, Any, str]  # channel, kept value, task path


class Thread:
    """The LangGraph records of one session, folded in seq order; extended by the events
    committed since (`extend`). Safe to share between threads (one lock)."""

    def __init__(self, session_id: str, events: Iterable[Event] = ()) -> None:
        if not isinstance(session_id, str):
            raise TypeError(
                f"session_id must be the thread's session id (a str), got "
                f"{type(session_id).__name__}"
            )
        self.session_id = session_id
        self._lock = threading.RLock()
        self.next_seq = 0
        self.records = 0
        self.cps: dict[tuple[str, str], Checkpoint] = {}
        self._order: list[tuple[str, str]] = []  # in the seq order of their first put
        self._writes: dict[tuple[str, str], dict[tuple[str, int], _Write]] = {}
        self._by_run: dict[str, list[Checkpoint]] = {}
        self.hides: list[dict[str, Any]] = []  # the records (and replaces) that hid some
        self.ended: list[dict[str, Any]] = []  # the runs' turns that ended
        self.unreadable: list[int] = []  # seqs of malformed records, skipped
        self.extend(events)

    @property
    def thread_id(self) -> str | None:
        """The LangGraph thread id its session id keeps, or None."""
        sid = self.session_id
        if sid.startswith(THREAD_PREFIX) and len(sid) > len(THREAD_PREFIX):
            return unquote(sid[len(THREAD_PREFIX) :])
        return None

    # -- folding ----------------------------------------------------------------------------

    def extend(self, events: Iterable[Event]) -> int:
        """Fold ``events`` (ascending seq) past those folded already; how many were new."""
        added = 0
        with self._lock:
            for ev in events:
                if not isinstance(ev, Event):
                    raise TypeError(
                        f"a thread folds the session's events (nous_actor Event), got "
                        f"{type(ev).__name__}; pass store.load(session_id)"
                    )
                if ev.seq < self.next_seq:
                    continue
                self.next_seq = ev.seq + 1
                added += 1
                if is_record(ev):
                    self.records += 1
                    try:
                        self._record(ev)
                    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
                        self.unreadable.append(ev.seq)
                elif ev.surface_op is not None and self.cps:
                    op = ev.surface_op
                    self._hide(
                        "rollback",
                        ev.seq,
                        [c for c in self.cps.values() if op.start <= c.seq <= op.stop < ev.seq],
                    )
        return added

    def _record(self, ev: Event) -> None:
        data = ev.data
        kind = data[RECORD_KEY]
        if kind == "cp":
            self._add_cp(ev)
        elif kind == "w":
            self._add_writes(data)
        elif kind == "del":
            self._hide("del", ev.seq, [c for c in self.cps.values() if c.seq < ev.seq])
        elif kind == "prune":
            keep = {(str(ns), str(i)) for ns, i in data.get("keep") or ()}
            self._hide(
                "prune",
                ev.seq,
                [c for k, c in self.cps.items() if c.seq < ev.seq and k not in keep],
            )
        elif kind == "runs":
            runs = [str(r) for r in data.get("runs") or ()]
            gone = [c for r in runs for c in self._by_run.get(r, ()) if c.seq < ev.seq]
            self._hide("runs", ev.seq, gone, runs=runs)
        elif kind == "run":
            self.ended.append({"seq": ev.seq, "run": data.get("run"), "how": data.get("how")})

    def _add_cp(self, ev: Event) -> None:
        data = ev.data
        ns, cid = str(data["ns"]), str(data["id"])
        parent = data.get("parent")
        meta: Any = None
        if "meta" in data:
            try:
                meta = decode(data["meta"])
            except (ValueError, TypeError):
                meta = None
        if not isinstance(meta, dict):
            meta = {}
        step = meta.get("step")
        source = meta.get("source")
        run = data.get("run", meta.get("run_id"))
        ts = data.get("ts")
        cp = Checkpoint(
            seq=ev.seq,
            ns=ns,
            id=cid,
            parent=None if parent is None else str(parent),
            time=ts if isinstance(ts, str) else ev.time.isoformat(),
            rec=data,
            step=step if isinstance(step, int) and not isinstance(step, bool) else None,
            source=source if isinstance(source, str) else None,
            run=run if isinstance(run, str) else None,
            full=bool(data.get("full")),
            updated=[str(c) for c in data.get("upd") or ()],
        )
        key = (ns, cid)
        old = self.cps.get(key)
        if old is not None:  # put again: the later record stands
            cp.puts = old.puts + 1
            cp.children = old.children
            cp.writes = old.writes
        else:
            self._order.append(key)
        self.cps[key] = cp
        if cp.parent is not None:
            up = self.cps.get((ns, cp.parent))
            if up is not None and cid not in up.children:
                up.children.append(cid)
        if cp.run is not None:
            self._by_run.setdefault(cp.run, []).append(cp)
        cp.messages = self._count(cp)

    def _count(self, cp: Checkpoint) -> int | None:
        """How many elements ``cp``'s ``messages`` channel holds (its parent's count and
        its own record), or None when that is not known."""
        rec = cp.rec
        before: int | None = 0
        if not cp.full and cp.parent is not None:
            up = self.cps.get((cp.ns, cp.parent))
            before = None if up is None else up.messages
        if MESSAGES in (rec.get("drop") or ()):
            before = 0
        entry = (rec.get("vals") or {}).get(MESSAGES)
        if entry is None:
            return before
        how, kept = entry[0], entry[1]
        if how == "r":
            if before is None:
                return None
            values = [self._written(cp.ns, cp.parent, t, i) for t, i in kept]
            if any(isinstance(v, Opaque) or v is None for v in values):
                return None
            return before + len(_flatten(values))
        value = decode(kept)
        if not isinstance(value, list):
            return None
        if how == "t":
            return None if before is None else before + len(value)
        return len(value)

    def _add_writes(self, data: Mapping[str, Any]) -> None:
        key = (str(data["ns"]), str(data["cp"]))
        task, path = str(data["task"]), str(data.get("path") or "")
        table = self._writes.setdefault(key, {})
        for idx, ch, kept in data["w"]:
            wkey = (task, int(idx))
            if wkey[1] >= 0 and wkey in table:
                continue  # a task's write is stored once
            table[wkey] = (str(ch), kept, path)
        cp = self.cps.get(key)
        if cp is not None:
            cp.writes = len(table)

    def _written(self, ns: str, cid: str | None, task: Any, idx: Any) -> Any:
        """The value of a pending write of checkpoint ``cid`` as shown, or None."""
        found = self._writes.get((ns, cid or ""), {}).get((str(task), int(idx)))
        return None if found is None else decode(found[1])

    def _hide(self, kind: str, seq: int, cps: list[Checkpoint], **more: Any) -> None:
        hidden = 0
        for cp in cps:
            if cp.gone is None:
                cp.gone, cp.gone_at = GONE_KINDS[kind], seq
                hidden += 1
        if kind != "rollback" or hidden:
            self.hides.append({"seq": seq, "kind": GONE_KINDS[kind], "hidden": hidden, **more})

    # -- reading -----------------------------------------------------------------------------

    def namespaces(self) -> list[str]:
        """The namespaces with a checkpoint: the graph's (``""``) first, then the others."""
        with self._lock:
            return sorted({ns for ns, _ in self.cps}, key=lambda n: (n != "", n))

    def head(self, ns: str = "") -> Checkpoint | None:
        """The checkpoint LangGraph reads as the latest of ``ns`` (the largest id not
        hidden), or None."""
        with self._lock:
            best: Checkpoint | None = None
            for (n, cid), cp in self.cps.items():
                if n == ns and cp.gone is None and (best is None or cid > best.id):
                    best = cp
            return best

    def find(self, ns: str, cid: str | None) -> Checkpoint:
        """Checkpoint ``cid`` of namespace ``ns`` (hidden or not), the head when None.

        Raises:
            NoCheckpoint: there is none such.
        """
        for name, value in (("ns", ns), ("checkpoint id", cid)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"the {name} must be a str, got {type(value).__name__}")
        with self._lock:
            cp = self.head(ns) if cid is None else self.cps.get((ns, cid))
            if cp is not None:
                return cp
            where = f"namespace {ns!r}" if ns else "the graph's namespace ('')"
            count = sum(1 for n, _ in self.cps if n == ns)
            if cid is None:
                raise NoCheckpoint(
                    f"the thread has no checkpoint LangGraph still sees in {where} "
                    f"({count} hidden); name one of them"
                )
            others = [n for n in self.namespaces() if (n, cid) in self.cps]
            hint = f"; it is in namespace {others[0]!r}" if others else ""
            raise NoCheckpoint(
                f"no checkpoint {cid!r} in {where} of this thread ({count} checkpoints "
                f"there{hint}); the tree lists them"
            )

    def tree(self) -> list[dict[str, Any]]:
        """Every checkpoint, hidden ones included, one row each: a namespace after the
        other, each as a tree in the order of its branches. The branch that leads to the
        head comes last at each fork, at the fork's ``depth``; the other branches come
        right after the fork, one level deeper. Each row is `Checkpoint.as_dict` with
        ``depth`` and ``head`` (it is its namespace's head)."""
        with self._lock:
            rows: list[dict[str, Any]] = []
            for ns in self.namespaces():
                rows.extend(self._ns_tree(ns))
            return rows

    def _ns_tree(self, ns: str) -> list[dict[str, Any]]:
        mine = {cid: cp for (n, cid), cp in self.cps.items() if n == ns}
        head = self.head(ns)
        on_path: set[str] = set()
        cur = head
        while cur is not None and cur.id not in on_path:
            on_path.add(cur.id)
            cur = mine.get(cur.parent) if cur.parent is not None else None
        latest: dict[str, str] = {}  # the largest id in each one's subtree
        for cid in sorted(mine, key=lambda c: mine[c].seq, reverse=True):
            top = max([cid, *(latest.get(k, k) for k in mine[cid].children if k in mine)])
            latest[cid] = top

        def order(kids: list[str]) -> list[str]:
            # Side branches first (oldest first), the main one (to the head) last.
            return sorted(
                (k for k in kids if k in mine),
                key=lambda k: (k in on_path, latest.get(k, k)),
            )

        roots = [c for c, cp in mine.items() if cp.parent is None or cp.parent not in mine]
        stack: list[tuple[str, int]] = [(r, 0) for r in reversed(order(roots))]
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        while stack:
            cid, depth = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            cp = mine[cid]
            row = cp.as_dict()
            row["depth"] = depth
            row["head"] = head is not None and cp is head
            rows.append(row)
            kids = order(cp.children)
            # Pushed so that side branches are popped first, each one level deeper.
            for i, k in enumerate(reversed(kids)):
                stack.append((k, depth if i == 0 else depth + 1))
        for cid in sorted(set(mine) - seen):  # a cycle (a hand-edited log): still listed
            row = mine[cid].as_dict()
            row["depth"], row["head"] = 0, mine[cid] is head
            rows.append(row)
        return rows

    def summary(self) -> dict[str, Any]:
        """The thread at a glance (no rows)."""
        with self._lock:
            cps = list(self.cps.values())
            heads = {}
            for ns in self.namespaces():
                h = self.head(ns)
                heads[ns] = None if h is None else h.id
            return {
                "session_id": self.session_id,
                "thread_id": self.thread_id,
                "records": self.records,
                "checkpoints": len(cps),
                "visible": sum(1 for c in cps if c.gone is None),
                "hidden": sum(1 for c in cps if c.gone is not None),
                "forks": sum(1 for c in cps if len(c.children) > 1),
                "namespaces": self.namespaces(),
                "heads": heads,
                "head": heads.get(""),
                "hides": list(self.hides),
                "ended": list(self.ended),
                "unreadable": list(self.unreadable),
                "next_seq": self.next_seq,
            }

    def channels(self, ns: str, cid: str | None) -> dict[str, Any]:
        """Every channel value of a checkpoint as shown (lists as lists).

        Raises:
            NoCheckpoint: there is no such checkpoint.
        """
        with self._lock:
            values, _ = self._fold(self.find(ns, cid))
            return {ch: _shown(v) for ch, v in values.items()}

    def messages(self, ns: str, cid: str | None, channel: str = MESSAGES) -> dict[str, Any]:
        """The ``channel`` of a checkpoint (the head of ``ns`` when ``cid`` is None) as a
        timeline: ``checkpoint`` (its row), ``channel``, ``present`` (the channel
        exists there), ``partial`` (an ancestor's record is missing: what it held is
        not shown), ``messages`` (one row per element: ``index``, ``type``, ``content``,
        ``tool_calls``, ``tool_call_id``, ``name``, ``id``, ``added_by``: the
        checkpoint whose record added it, ``opaque`` for a value kept by the
        serializer), ``metadata`` and ``writes`` (the checkpoint's pending writes,
        their values as shown).

        Raises:
            NoCheckpoint: there is no such checkpoint.
        """
        if not isinstance(channel, str):
            raise TypeError(f"the channel must be a str, got {type(channel).__name__}")
        with self._lock:
            cp = self.find(ns, cid)
            values, partial = self._fold(cp, only=channel)
            row = cp.as_dict()
            row["head"] = cp is self.head(ns)
            items = values.get(channel)
            shown: list[dict[str, Any]] = []
            if isinstance(items, list):
                shown = [_row(i, it) for i, it in enumerate(items)]
            elif items is not None:
                shown = [_row(0, items)]
            meta: Any = None
            try:
                meta = _plain(decode(cp.rec["meta"]))
            except (KeyError, ValueError, TypeError):
                pass
            writes = [
                {
                    "task": task,
                    "idx": idx,
                    "channel": ch,
                    "path": path,
                    "value": _plain(_safe_decode(kept)),
                }
                for (task, idx), (ch, kept, path) in sorted(
                    self._writes.get((cp.ns, cp.id), {}).items(),
                    key=lambda kv: (kv[1][2], kv[0][0], kv[0][1]),
                )
            ]
            return {
                "checkpoint": row,
                "channel": channel,
                "present": items is not None,
                "partial": partial,
                "messages": shown,
                "metadata": meta,
                "writes": writes,
            }

    def _fold(self, cp: Checkpoint, only: str | None = None) -> tuple[dict[str, Any], bool]:
        """The channel values of ``cp`` (of ``only`` alone when given): a list channel
        as a list of `_Item`, any other value an `_Item`; and whether the chain of
        records is broken (an ancestor missing)."""
        chain: list[Checkpoint] = []
        cur: Checkpoint | None = cp
        partial = False
        seen: set[str] = set()
        while cur is not None and cur.id not in seen:
            seen.add(cur.id)
            chain.append(cur)
            if cur.full or cur.parent is None:
                break
            nxt = self.cps.get((cur.ns, cur.parent))
            if nxt is None:
                partial = True
            cur = nxt
        values: dict[str, Any] = {}
        for step in reversed(chain):
            rec = step.rec
            if step.full:
                values = {}
            for ch in rec.get("drop") or ():
                values.pop(str(ch), None)
            for ch, entry in (rec.get("vals") or {}).items():
                if only is not None and ch != only:
                    continue
                try:
                    values[ch] = self._step(step, values.get(ch), entry)
                except (KeyError, TypeError, ValueError, IndexError):
                    values[ch] = _Item(Opaque("unreadable", 0, False), step.id)
        return values, partial

    def _step(self, cp: Checkpoint, current: Any, entry: Sequence[Any]) -> Any:
        how, kept = entry[0], entry[1]
        if how == "w":
            value = decode(kept)
            if not isinstance(value, list):
                return _Item(value, cp.id)
            before = current if isinstance(current, list) else []
            # An element equal to the one at its place before keeps who added it.
            return [
                before[i] if i < len(before) and before[i].value == v else _Item(v, cp.id)
                for i, v in enumerate(value)
            ]
        base = list(current) if isinstance(current, list) else []
        if isinstance(current, _Item):  # a tail on a value not shown as a list
            base = [current]
        if how == "t":
            tail = decode(kept)
            added = tail if isinstance(tail, list) else [tail]
        elif how == "r":
            found = [self._written(cp.ns, cp.parent, t, i) for t, i in kept]
            added = _flatten(Opaque("missing write", 0, False) if v is None else v for v in found)
        else:
            raise ValueError(f"unknown channel entry {how!r}")
        return base + [_Item(v, cp.id) for v in added]


def _safe_decode(kept: Any) -> Any:
    try:
        return decode(kept)
    except (ValueError, TypeError, IndexError):
        return Opaque("unreadable", 0, False)


def _plain(value: Any) -> Any:
    """``value`` with every `Opaque` as its dict: JSON-ready."""
    if isinstance(value, Opaque):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _shown(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(i.value) for i in value]
    if isinstance(value, _Item):
        return _plain(value.value)
    return _plain(value)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):  # content blocks: their text, others as JSON
        parts = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif isinstance(block, str):
                parts.append(block)
            else:
                parts.append(json.dumps(_plain(block), ensure_ascii=False, default=str))
        text = "\n".join(parts)
    else:
        text = json.dumps(_plain(content), ensure_ascii=False, default=str)
    return text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 1] + "…"


def _calls(value: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = value.get("tool_calls")
    out: list[dict[str, Any]] = []
    if isinstance(calls, list):
        for c in calls:
            if isinstance(c, dict):
                out.append(
                    {"name": c.get("name"), "args": _plain(c.get("args")), "id": c.get("id")}
                )
    return out


def _row(index: int, item: _Item) -> dict[str, Any]:
    """One element of a messages channel as a timeline row."""
    v = item.value
    row: dict[str, Any] = {
        "index": index,
        "type": "value",
        "content": "",
        "tool_calls": [],
        "tool_call_id": None,
        "name": None,
        "id": None,
        "added_by": item.added,
        "opaque": None,
    }
    if isinstance(v, Opaque):
        row.update(type="opaque", content=v.text(), opaque=v.as_dict())
    elif isinstance(v, dict):
        kind = v.get("type", v.get("role", "value"))
        row.update(
            type=str(kind),
            content=_text(v.get("content")),
            tool_calls=_calls(v),
            tool_call_id=v.get("tool_call_id") if isinstance(v.get("tool_call_id"), str) else None,
            name=v.get("name") if isinstance(v.get("name"), str) else None,
            id=v.get("id") if isinstance(v.get("id"), str) else None,
        )
    else:
        row["content"] = _text(v)
    return row


def _escape(ch: str) -> str:
    if ch in "/%" or ch.isspace() or not ch.isprintable():
        return quote(ch, safe="")
    return ch


def session_of(thread: str) -> str:
    """The session id that keeps LangGraph thread ``thread`` (as the checkpointer names
    it: ``langgraph/`` and the thread id, ``/``, ``%``, whitespace and unprintable
    characters percent-encoded); a session id given (``langgraph/...``) is itself.

    >>> session_of("chat 1")
    'langgraph/chat%201'
    >>> session_of("langgraph/chat%201")
    'langgraph/chat%201'

    Raises:
        ValueError: ``thread`` is empty.
    """
    if not isinstance(thread, str):
        raise TypeError(f"the thread id must be a str, got {type(thread).__name__}")
    if not thread:
        raise ValueError("the thread id is empty; name the thread (or its session id)")
    if thread.startswith(THREAD_PREFIX) and len(thread) > len(THREAD_PREFIX):
        return thread
    try:
        return THREAD_PREFIX + "".join(_escape(ch) for ch in thread)
    except UnicodeEncodeError:
        raise ValueError(f"the thread id {thread!r} holds a lone surrogate") from None


def read_thread(session_id: str, events: Iterable[Event]) -> Thread:
    """The thread a session's events hold (ascending seq)."""
    return Thread(session_id, events)
