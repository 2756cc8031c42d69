"""Folds of the logs: an ADK session as read from its log (`_View`, caught up by what was
appended since), its latest events read from the log's end (`_tail`), and app or user
state or a user's directory of sessions (`_StateView`). A fold reads a `Log`, or
anything that answers `count` and `since` as one does (`_Readable`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nous_actor.core._frozen import thaw
from nous_actor.core.event import Event
from nous_actor.integrations.adk.events import _adk_payload, _decode, _record
from nous_actor.integrations.adk.framework import AdkEvent
from nous_actor.integrations.adk.records import (
    SCOPED_KEY,
    STATE_CHECKPOINT_EVERY,
    STATE_KEY,
    TIME_KEY,
)


class _Readable(Protocol):
    """What a fold reads of a log (a `nous_actor.Log` answers both)."""

    def count(self) -> int:
        """The next seq."""
        ...

    def since(self, seq: int) -> list[Event]:
        """The events with ``seq >= seq``, in order."""
        ...


@dataclass
class _View:
    """One ADK session as folded from its log (up to ``seen`` events)."""

    seen: int = 0
    created: int | None = None  # seq of the create record in force; None: no session
    state: dict[str, Any] = field(default_factory=dict)
    seqs: list[int] = field(default_factory=list)  # seqs of its ADK events, in order
    times: list[float] = field(default_factory=list)  # their timestamps
    positions: list[int] = field(default_factory=list)  # their positions (a replace: its start)
    decoded: dict[int, AdkEvent] = field(default_factory=dict)
    last_update: float = 0.0
    checkpoint: int = -1  # seq of the latest checkpoint (or create) record
    log: _Readable | None = None
    writes: dict[str, int] = field(default_factory=dict)  # state key -> seq of its last write
    ids: dict[str, list[int]] = field(default_factory=dict)  # ADK event id -> seqs with it
    last: int = -1  # seq of the last create or delete record or ADK event

    def catch_up(self, log: _Readable) -> None:
        if log.count() <= self.seen:  # nothing new (or an older snapshot of the log)
            return
        for ev in log.since(self.seen):
            rec = _record(ev)
            if rec is not None:
                op = rec.get("op")
                if op == "checkpoint":
                    self.checkpoint = max(self.checkpoint, ev.seq)
                    continue
                if op == "create":
                    self.created = self.checkpoint = self.last = ev.seq
                    self.state = thaw(rec.get("state") or {})
                    self.writes = dict.fromkeys(self.state, ev.seq)
                    self.seqs, self.times, self.positions, self.decoded = [], [], [], {}
                    self.ids = {}
                    self.last_update = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
                    continue
                if op == "delete":
                    self.created, self.last = None, ev.seq
                    self.state, self.seqs, self.times, self.decoded = {}, [], [], {}
                    self.positions, self.writes, self.ids = [], {}, {}
                    continue
            payload = _adk_payload(ev)
            if self.created is None or payload is None:
                continue
            self.ids.setdefault(str(payload.get("id")), []).append(ev.seq)
            self.last = ev.seq
            ts = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
            self.seqs.append(ev.seq)
            self.times.append(ts)
            self.positions.append(ev.position)
            delta = ev.data.get(STATE_KEY)
            if delta:
                self.state.update(thaw(delta))
                for key in delta:
                    self.writes[key] = ev.seq
            self.last_update = ts
        self.seen = log.count()
        self.log = log

    def stored(self, seq: int) -> Mapping[str, Any] | None:
        """The ADK event at ``seq`` as stored (its dump, as `_adk_payload` reads it)."""
        if self.log is None:
            return None
        for ev in self.log.since(seq):
            return _adk_payload(ev) if ev.seq == seq else None
        return None

    def events(self, first: int) -> list[AdkEvent]:
        """The decoded ADK events from index ``first`` of ``seqs`` on."""
        wanted = self.seqs[first:]
        missing = [s for s in wanted if s not in self.decoded]
        if missing and self.log is not None:
            for ev in self.log.since(missing[0]):
                payload = _adk_payload(ev)
                if payload is not None and ev.seq not in self.decoded:
                    self.decoded[ev.seq] = _decode(ev)
        return [self.decoded[s] for s in wanted]


@dataclass
class _Tail:
    """The latest events of a session and its state, read from the end of its log, and the
    events read on the way (back to its latest checkpoint or create record and its
    ``n``-th latest event) that carry ``app:``/``user:`` parts (`SCOPED_KEY`), in order."""

    events: list[Event]
    state: dict[str, Any]
    last_update: float
    scoped: list[Event] = field(default_factory=list)  # those read with app/user parts


def _tail(log: _Readable, n: int) -> _Tail | None:
    """The last ``n`` ADK events of the session in ``log`` and its state, reading the log
    from its end back to the latest checkpoint (or create) record and the ``n``-th event
    (not the whole history); ``None`` if there is no session (never created, or deleted).
    """
    count = log.count()
    window = max(64, 2 * n)
    while True:
        start = max(0, count - window)
        picked: list[Event] = []
        deltas: list[Any] = []
        base: dict[str, Any] | None = None
        upto = -1  # with a checkpoint: the deltas of events after this seq still apply
        last: float | None = None
        done = False
        scoped: list[Event] = []
        for ev in reversed(log.since(start)):
            rec = _record(ev)
            op = rec.get("op") if rec is not None else None
            if SCOPED_KEY in ev.data and (op == "create" or _adk_payload(ev) is not None):
                scoped.append(ev)
            if op == "delete" and base is None:
                return None
            if op == "create":
                if base is None:
                    base = thaw(rec.get("state") or {}) if rec is not None else {}
                if last is None:
                    last = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
                done = True
                break
            if op == "checkpoint" and base is None and rec is not None:
                base = thaw(rec.get("state") or {})
                upto = int(rec.get("upto", ev.seq))
                continue
            if _adk_payload(ev) is None:
                continue
            if last is None:
                last = float(ev.data.get(TIME_KEY, ev.time.timestamp()))
            if len(picked) < n:
                picked.append(ev)
            if (base is None or ev.seq > upto) and ev.data.get(STATE_KEY):
                deltas.append(ev.data[STATE_KEY])
            if base is not None and ev.seq <= upto and len(picked) >= n:
                done = True
                break
        if done and base is not None and last is not None:
            for delta in reversed(deltas):
                base.update(thaw(delta))
            picked.reverse()
            scoped.reverse()
            return _Tail(picked, base, last, scoped)
        if start == 0:
            return None  # no create record: no session
        window *= 4


def _origin(rec: Mapping[str, Any]) -> tuple[str, int] | None:
    """The session-log event (session key, seq) a ``state`` record completes, if it names one."""
    source = rec.get("source")
    if isinstance(source, (list, tuple)) and len(source) == 2:
        return (str(source[0]), int(source[1]))
    return None


@dataclass
class _Listed:
    """A session as its user's directory lists it: its state as of the event at
    ``state_seq``, its last update time as of the event at ``ts_seq`` (``None``: written
    before directories kept it)."""

    state_seq: int
    state: dict[str, Any]
    ts_seq: int = -1
    ts: float | None = None


@dataclass
class _StateView:
    """App or user state, or a user's directory of sessions."""

    seen: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)  # state key -> seq of its last write
    directory: dict[str, _Listed] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)  # session id -> seq of its deletion
    # (session key, seq) of the session-log event a state record completes -> its seq here
    sources: dict[tuple[str, int], int] = field(default_factory=dict)
    # state key -> the session-log event (session key, seq) its last write completes (None:
    # a write of no such event)
    writers: dict[str, tuple[str, int] | None] = field(default_factory=dict)
    read: int = 0  # events of its log read by its folds (for tests)
    # An app's or user's state log, which its writers checkpoint (`STATE_CHECKPOINT_EVERY`):
    # a first fold starts from its latest checkpoint record, not from its first write.
    checkpointed: bool = False
    checkpoint: int = -1  # seq of the latest checkpoint record folded (-1: none)
    # The first seq from which ``sources`` holds every state record (after the checkpoint a
    # fold started from; 0: from the log's start); `source` looks further back when asked.
    base: int = 0
    log: _Readable | None = None

    def done(self, sid: str) -> int:
        """The seq of the latest event of session ``sid`` its directory entry is written
        for (its deletion's included); -1 if none."""
        known = self.directory.get(sid)
        listed = max(known.state_seq, known.ts_seq) if known is not None else -1
        return max(listed, self.deleted.get(sid, -1))

    def catch_up(self, log: _Readable) -> None:
        if log.count() <= self.seen:
            return
        self.log = log
        if self.seen == 0 and self.checkpointed:
            self._start(log)
        for ev in log.since(self.seen):
            self.read += 1
            rec = _record(ev)
            if rec is None:
                continue
            op = rec.get("op")
            if op == "checkpoint":
                self.checkpoint = max(self.checkpoint, ev.seq)
            elif op == "state":
                delta = rec.get("delta") or {}
                self.state.update(thaw(delta))
                origin = _origin(rec)
                if origin is not None:
                    self.sources[origin] = ev.seq
                for key in delta:
                    self.writes[key] = ev.seq
                    self.writers[key] = origin
            elif op == "session":
                self._listed(rec)
            elif op == "session_deleted":
                sid, seq = str(rec.get("id")), int(rec.get("seq", 0))
                known = self.directory.get(sid)
                if known is None or max(known.state_seq, known.ts_seq) <= seq:
                    self.directory.pop(sid, None)
                    self.deleted[sid] = max(seq, self.deleted.get(sid, -1))
        self.seen = log.count()

    def _start(self, log: _Readable) -> None:
        """Start a first fold from the latest checkpoint record of ``log`` (read from its
        end back to it: a writer writes one every `STATE_CHECKPOINT_EVERY` writes), if it
        has one: its state, each key's last write and the event that write completes, as
        of the record's ``upto`` seq; the fold goes on from the seq after it."""
        count = log.count()
        window = 2 * STATE_CHECKPOINT_EVERY
        while True:
            start = max(0, count - window)
            for ev in reversed(log.since(start)):
                self.read += 1
                rec = _record(ev)
                if rec is None or rec.get("op") != "checkpoint":
                    continue
                upto = int(rec.get("upto", ev.seq))
                self.state = thaw(rec.get("state") or {})
                self.writes = {str(k): int(v) for k, v in (rec.get("writes") or {}).items()}
                self.writers = {
                    str(k): (str(v[0]), int(v[1])) if v is not None else None
                    for k, v in (rec.get("writers") or {}).items()
                }
                self.checkpoint = ev.seq
                self.seen = self.base = upto + 1
                return
            if start == 0:
                return  # none yet: the fold starts from the log's start
            window *= 4

    def source(self, source: tuple[str, int], after: int) -> int | None:
        """The seq of the state record that completes the session-log event ``source`` (whose
        call read this log when it counted ``after``: any such record is at or after
        that), or ``None`` if there is none. A fold started from a checkpoint looks back
        in the log for one written before it (a call killed long ago)."""
        found = self.sources.get(source)
        if found is not None or after >= self.base or self.log is None:
            return found
        for ev in self.log.since(after):  # the record follows its event shortly: few read
            if ev.seq >= self.base:
                break
            self.read += 1
            rec = _record(ev)
            if rec is not None and rec.get("op") == "state" and _origin(rec) == source:
                self.sources[source] = ev.seq
                return ev.seq
        return None

    def _listed(self, rec: Any) -> None:
        """Fold one ``session`` record: records of one session may arrive out of order
        (concurrent appends), so each part keeps the one of the latest event."""
        sid, seq = str(rec.get("id")), int(rec.get("seq", 0))
        if seq <= self.deleted.get(sid, -1):
            return  # a record of the session before it was deleted
        known = self.directory.get(sid)
        if known is None:
            known = self.directory[sid] = _Listed(-1, {})
        if "state" in rec and known.state_seq <= seq:
            known.state_seq, known.state = seq, thaw(rec.get("state") or {})
        ts = rec.get("ts")
        if ts is not None and known.ts_seq <= seq:
            known.ts_seq, known.ts = seq, float(ts)
