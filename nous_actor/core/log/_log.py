"""`Log` itself: the immutable, append-only event log, its storage shared by a chain of
versions, its appends, reads and history (`as_of`, `fork`)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from itertools import islice
from operator import lt
from typing import Any, Final

from nous_actor._log import get_logger
from nous_actor.core.event import (
    EVENT_TYPE_OF,
    SURFACE_TYPES,
    Event,
    EventType,
    InvalidEvent,
    check_event,
    trusted_event,
    type_text,
)
from nous_actor.core.log._events import (
    _behind_head,
    _check_boundary,
    _seed_data,
    _utcnow,
    message_event,
)
from nous_actor.core.log._fold import _Fold, _full_fold, _seq_of, _shadow_flags
from nous_actor.core.message import Message, Role, tool_call_parts

__all__ = ["Log"]

log = get_logger("nous_actor.core.log")  # the package's name, as before it was split

_new_log: Final = object.__new__


def _branch(events: list[Event], n: int, ev: Event) -> list[Event]:
    """A new storage list: ``events[:n]`` and then ``ev`` (the one O(n) copy of a branch)."""
    out = events[:n]
    out.append(ev)
    return out


class Log:
    """An immutable, append-only event log whose fold is the model-visible surface.

    >>> log = Log().append("user_message", {"content": "hi"})
    >>> log = log.append("assistant_message", {"content": "hello"})
    >>> log = log.append("system_message", {"content": "greeting",
    ...                                     "surface_op": ("replace", 0, 1)})
    >>> [m.content for m in log.derive_messages()]
    ['greeting']
    >>> log.count(), len(log.events()), len(log.snapshot().events())
    (3, 3, 1)

    Positions and shadowing (DESIGN.md §3): ``position(e)`` is ``start`` for a
    replace, else ``e.seq``. An event ``c`` is shadowed iff some replace ``r``
    has ``c.seq < r.seq`` and ``r.start <= position(c) <= r.stop``. The surface
    is every unshadowed surface-typed event, stably sorted by position.

    Cost: ``append`` is O(1) plus the size of ``data``, and after a fold has
    been computed (``materialize`` or any derive) appends and replaces keep it
    current in O(log n) plus a list splice. A full fold is O(n log n).
    ``since`` is O(log n + returned). Every returned list is the caller's.
    """

    __slots__ = ("_count", "_events", "_fold", "_n", "_own")

    _events: list[Event]
    _n: int
    _count: int
    _fold: _Fold | None
    _own: bool  # may extend ``_events`` in place (a view handed out may not)

    def __init__(self) -> None:
        self._events = []
        self._n = 0
        self._count = 0
        self._fold = None
        self._own = True

    @classmethod
    def new(cls) -> Log:
        """An empty log (same as ``Log()``)."""
        return cls()

    @classmethod
    def _make(
        cls, events: list[Event], n: int, count: int, fold: _Fold | None, own: bool = True
    ) -> Log:
        lg: Log = object.__new__(cls)
        lg._events = events
        lg._n = n
        lg._count = count
        lg._fold = fold
        lg._own = own
        return lg

    @classmethod
    def restore(cls, events: Iterable[Event]) -> Log:
        """A log of already-validated events (e.g. loaded from a store), in one step.

        Equivalent to `append_event` for each in turn, without building a
        version per event.

        Raises:
            TypeError: an item is not an `Event`.
            InvalidEvent: ``seq_behind_head`` if the seqs are not strictly increasing.
        """
        evs = list(events)
        if not evs:
            return cls._make(evs, 0, 0, None)
        # Both checks in C over the whole list; the loop below only to say what failed
        # (or to accept subclasses of Event).
        seqs = list(map(_seq_of, evs)) if set(map(type, evs)) == {Event} else None
        if seqs is None or not all(map(lt, seqs, islice(seqs, 1, None))):
            last = -1
            for ev in evs:
                if type(ev) is not Event and not isinstance(ev, Event):
                    raise TypeError(f"restore takes Events, got {type(ev).__name__}")
                if ev.seq <= last:
                    raise _behind_head(ev.seq, last + 1)
                last = ev.seq
        return cls._make(evs, len(evs), evs[-1].seq + 1, None)

    def _view(self) -> Log:
        """This log as a value that shares its storage but never extends it in place.

        A session hands these out, so that a caller appending to what it was
        given (a branch) never makes the session copy its own events.
        """
        return Log._make(self._events, self._n, self._count, None, own=False)

    # -- appending ------------------------------------------------------------------

    def append(
        self,
        type: EventType | str,
        data: Any = None,
        time: datetime | None = None,
    ) -> Log:
        """A new log with one more event, under ``seq = self.count()``.

        ``data`` is deeply copied and frozen: mutating the caller's dict
        afterwards never changes history. ``time`` defaults to now (UTC).

        Raises:
            InvalidEvent: the event is refused (``.reason`` says why); ``self`` is
                unchanged, as always.
        """
        return self._push(self._count, type, data, time)

    def append_at(
        self,
        seq: int,
        type: EventType | str,
        data: Any = None,
        time: datetime | None = None,
    ) -> Log:
        """Restore an event under its persisted ``seq``; afterwards ``count() == seq + 1``.

        Gaps are allowed (the seqs a snapshot dropped stay unused).

        Raises:
            InvalidEvent: ``seq_behind_head`` if ``seq < self.count()``, after the
                checks every event gets.
        """
        return self._push(seq, type, data, time, at=True)

    def append_or_log(
        self,
        type: EventType | str,
        data: Any = None,
        time: datetime | None = None,
    ) -> Log:
        """Like `append`, but a refused event is logged and dropped, never raised.

        The drop is a structlog warning ``log.event_dropped`` carrying ``type``,
        ``reason`` and ``error``; the log is returned unchanged.
        """
        try:
            return self._push(self._count, type, data, time)
        except InvalidEvent as exc:
            log.warning(
                "log.event_dropped",
                type=type_text(type),
                reason=exc.reason,
                error=str(exc),
            )
            return self

    def append_event(self, event: Event) -> Log:
        """A new log with ``event`` (already an `Event`) under its own seq.

        For restoring stored events without validating them twice; the seq
        rule is the one of `append_at`.

        Raises:
            TypeError: ``event`` is not an Event.
            InvalidEvent: ``seq_behind_head`` if ``event.seq < self.count()``.
        """
        if not isinstance(event, Event):
            raise TypeError(f"append_event takes an Event, got {type(event).__name__}")
        if event.seq < self._count:
            raise _behind_head(event.seq, self._count)
        return self._extend(event)

    def _push(
        self, seq: int, type: object, data: Any, time: datetime | None, at: bool = False
    ) -> Log:
        etype, t, frozen, op = check_event(seq, type, _utcnow() if time is None else time, data)
        seq = int.__int__(seq)  # an int subclass is stored as its plain value
        if at and seq < self._count:
            raise _behind_head(seq, self._count)
        return self._extend(trusted_event(seq, etype, t, frozen, op))

    def _extend(self, ev: Event) -> Log:
        evs, n = self._events, self._n
        if self._own and len(evs) == n:
            evs.append(ev)
            if evs[n] is not ev:  # another thread extended this version first
                evs = _branch(evs, n, ev)
        else:
            evs = _branch(evs, n, ev)
        fold = self._fold
        if fold is not None and fold.take():
            fold.add(ev)
            fold = _Fold(fold.evs, fold.msgs, fold.lazy)  # handed over, inline
        else:
            fold = None
        # Log._make, inline: this is every append's path.
        lg: Log = _new_log(Log)
        lg._events = evs
        lg._n = n + 1
        lg._count = ev.seq + 1
        lg._fold = fold
        lg._own = True
        return lg

    def _extend_run(self, run: list[Event]) -> Log:
        """`_extend` by each of ``run`` in turn (events already checked, in seq order from
        `count` on), made as one new version: the log a session's run of appends makes."""
        evs, n = self._events, self._n
        k = len(run)
        if self._own and len(evs) == n:
            evs += run
            if evs[n] is not run[0]:  # another thread extended this version first
                evs = evs[:n] + run
        else:
            evs = evs[:n] + run
        fold = self._fold
        if fold is not None and fold.take():
            for ev in run:
                fold.add(ev)
            fold = fold.handed_over()
        else:
            fold = None
        return Log._make(evs, n + k, run[-1].seq + 1, fold)

    def append_message(self, message: Message | Mapping[str, Any]) -> Log:
        """A new log with ``message`` as one surface event; the type follows the role.

        ``message`` is a `Message` or an OpenAI chat-completions message dict
        (tool calls in any shape, the ``developer`` role included); the event
        is `message_event`'s: a `Message` is stored as `Log.seed` stores it,
        at its ``created_at``, and a dict with only the keys it has, at the
        current time. Either way ``derive_messages()[-1] == message`` (for a
        dict: ``== Message.from_openai(message)`` made at the event's time).

        Raises:
            ValueError: a dict that is not an OpenAI message (the message names
                the field).
            TypeError: neither a `Message` nor a mapping.
            InvalidEvent: the message holds what JSON cannot carry.
        """
        etype, data, time = message_event(message)
        return self.append(etype, data, time)

    @classmethod
    def seed(cls, messages: Iterable[Message]) -> Log:
        """A log with one surface event per message, in order.

        ``system``/``user`` keep ``content``, ``metadata``, ``name``; ``assistant``
        also ``tool_calls`` and ``reasoning_content`` (when not ``None``); ``tool``
        keeps ``content``, ``metadata``, ``name``, ``tool_call_id``. The event time
        is the message's ``created_at``, so ``Log.seed(ms).derive_messages() == ms``.
        Anything that is not a `Message` is skipped with a structlog warning
        ``log.seed_skipped``.
        """
        lg = cls()
        for i, m in enumerate(messages):
            if not isinstance(m, Message):
                log.warning(
                    "log.seed_skipped",
                    index=i,
                    reason="not_a_message",
                    got=type(m).__name__,
                )
                continue
            lg = lg.append(EVENT_TYPE_OF[m.role], _seed_data(m), m.created_at)
        return lg

    # -- reading --------------------------------------------------------------------

    def count(self) -> int:
        """Number of events ever appended: the next seq (snapshot-dropped ones included)."""
        return self._count

    def events(self) -> list[Event]:
        """Every retained event, oldest first, shadowed ones included."""
        return self._events[: self._n]

    def last_event(self) -> Event | None:
        """The newest retained event (the one with seq ``count() - 1``), or ``None`` if empty."""
        return self._events[self._n - 1] if self._n else None

    def since(self, seq: int) -> list[Event]:
        """Retained events with ``event.seq >= seq``, oldest first; O(log n + returned).

        Raises:
            TypeError: ``seq`` is not an int.
        """
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise TypeError(f"since(seq) takes an int, got {type(seq).__name__}")
        i = bisect_left(self._events, seq, 0, self._n, key=_seq_of)
        return self._events[i : self._n]

    def _folded(self) -> _Fold:
        """A fold whose lists are safe to copy, computing it if this version has none."""
        fold = self._fold
        if fold is None or not fold.claim:
            fold = _full_fold(self._events, self._n)
            self._fold = fold
        return fold

    def _read(self, *attrs: str) -> list[list[Any]]:
        # Copy, then check the fold was not handed to a newer version meanwhile:
        # a claim is always made before the lists are touched.
        fold = self._folded()
        if fold.lazy and "msgs" in attrs:
            if fold.take():  # only an owner projects into the lists
                fold.settle()
                fold = self._fold = fold.handed_over()
            else:  # handed on meanwhile (a race with another thread): fold afresh
                fold = _full_fold(self._events, self._n)
                fold.settle()
                return [getattr(fold, a) for a in attrs]
        out: list[list[Any]] = [getattr(fold, a)[:] for a in attrs]
        if not fold.claim:
            fresh = _full_fold(self._events, self._n)
            fresh.settle()
            out = [getattr(fresh, a) for a in attrs]
        return out

    def surface(self) -> list[Event]:
        """Surface-typed events no later replace has shadowed, in position order."""
        return self._read("evs")[0]

    def derive_messages(self) -> list[Message]:
        """The surface projected to messages (DESIGN.md §3 projection)."""
        return self._read("msgs")[0]

    def derive_indexed(self) -> list[tuple[int, Message]]:
        """``(seq, message)`` for each surface event, in surface order."""
        evs, msgs = self._read("evs", "msgs")
        return [(ev.seq, m) for ev, m in zip(evs, msgs, strict=True)]

    def materialize(self) -> tuple[list[Message], Log]:
        """Derive the messages and return them with a log whose fold is memoised.

        Appends to the returned log (plain ones and replaces) keep the fold
        current incrementally.
        """
        return self._read("msgs")[0], self

    def snapshot(self) -> Log:
        """A log without the shadowed events: surface, ``count()`` and surviving seqs unchanged.

        Everything a dropped event could still influence is shadowed too, so
        every later append, replace and derive behaves as on the original.
        """
        return self._snapshot_keeping(None)

    def _snapshot_keeping(self, keep: int | None) -> Log:
        """`snapshot`, except that bookkeeping event ``keep`` (a seq; ``None``: none)
        stays even if shadowed: a session keeps its newest turn event (an open turn's
        ``turn_start``, which its restart must find; a closed one's ``turn_end``). A
        bookkeeping event projects to nothing, so the surface, ``count()`` and every
        later append, replace and derive are as after `snapshot`; a surface event named
        is dropped as `snapshot` drops it."""
        n = self._n
        flags = _shadow_flags(self._events, n)
        events = self._events[:n]
        if keep is not None:
            k = bisect_left(events, keep, key=_seq_of)
            if k < n and events[k].seq == keep and events[k].type not in SURFACE_TYPES:
                flags[k] = False
        kept = [ev for k, ev in enumerate(events) if not flags[k]]
        fold = self._fold
        fold = fold.handed_over() if fold is not None and fold.take() else None
        return Log._make(kept, len(kept), self._count, fold)

    # -- history ----------------------------------------------------------------------

    def as_of(self, seq: int) -> Log:
        """The log as it was right after event ``seq`` (rewind / time travel).

        Holds the retained events with ``event.seq <= seq`` and ``count() == seq + 1``;
        cheap (it shares this log's storage; its fold is computed on first use).
        Events a snapshot already dropped are not brought back.

        Raises:
            ValueError: ``seq`` is negative or past the head (``>= count()``).
            TypeError: ``seq`` is not an int.
        """
        return self._prefix(seq, "as_of")

    def _prefix(self, seq: int, what: str) -> Log:
        _check_boundary(seq, self._count, what)
        i = bisect_right(self._events, seq, 0, self._n, key=_seq_of)
        return Log._make(self._events, i, seq + 1, None, own=False)

    def fork(self, through_seq: int) -> Log:
        """A new log holding this one's prefix through ``through_seq``, seqs preserved.

        Like `as_of`, but refuses a boundary inside an open turn (a
        ``turn_start`` without its ``turn_end``) or between an assistant's tool
        call and its result (matched by ``tool_call_id``, wherever they stand):
        a fork starts a new timeline and must not begin half-way through a model
        turn, nor leave a call whose result lies beyond it.

        Raises:
            ValueError: the boundary is negative, past the head, inside an
                open turn (the message names the turn's ``turn_start`` seq), or
                between a tool call and its result (naming the call and the seq
                of its result).
            TypeError: ``through_seq`` is not an int.
        """
        prefix = self._prefix(through_seq, "fork(through_seq=...)")
        _check_no_split_tool_call(prefix, self.since(through_seq + 1), through_seq)
        open_turn: int | None = None
        for ev in prefix._events[: prefix._n]:
            if ev.type is EventType.TURN_START:
                open_turn = ev.seq
            elif ev.type is EventType.TURN_END:
                open_turn = None
        if open_turn is not None:
            raise ValueError(
                f"fork(through_seq={through_seq}) is inside the turn opened at seq {open_turn}; "
                f"fork before seq {open_turn} or after that turn's turn_end"
            )
        return prefix

    # -- value semantics ------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Log):
            return NotImplemented
        return self._count == other._count and self.events() == other.events()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Log count={self._count} retained={self._n}>"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (self._count, self.events()))


def _check_no_split_tool_call(prefix: Log, after: Sequence[Event], through_seq: int) -> None:
    """Refuse a fork boundary with a tool call in the prefix's surface whose result (by
    ``tool_call_id``) only comes after the boundary."""
    if not after:
        return
    later = {
        ev.data.get("tool_call_id"): ev.seq for ev in after if ev.type is EventType.TOOL_RESULT
    }
    if not later:
        return
    answered: set[object] = set()
    calls: list[object] = []
    for m in prefix.derive_messages():
        if m.role is Role.TOOL:
            answered.add(m.tool_call_id)
        elif m.role is Role.ASSISTANT:
            calls.extend(tool_call_parts(c)[0] for c in m.tool_calls)
    for call_id in calls:
        if call_id not in answered and call_id in later:
            raise ValueError(
                f"fork(through_seq={through_seq}) would split the tool call {call_id!r} from "
                f"its result at seq {later[call_id]}; fork at seq {later[call_id]} or later, "
                "or before the assistant message that made the call"
            )


def _rebuild(count: int, events: list[Event]) -> Log:
    return Log._make(list(events), len(events), count, None)
