"""Log events: `Event`, `EventType`, `Replace`, `InvalidEvent`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, NoReturn

from nous_actor.core._frozen import (
    EMPTY_DICT,
    EMPTY_LIST,
    FrozenDict,
    FrozenList,
    NotJSON,
    describe_error,
    freeze,
    short_repr,
    untrack,
)
from nous_actor.core.message import Message, Role, trusted_message

__all__ = [
    "BOOKKEEPING_TYPES",
    "SURFACE_TYPES",
    "Event",
    "EventType",
    "InvalidEvent",
    "Replace",
]


class EventType(StrEnum):
    """The ten event types. Plain strings (``"user_message"``) are accepted everywhere."""

    SYSTEM_MESSAGE = "system_message"
    USER_MESSAGE = "user_message"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_RESULT = "tool_result"
    TOOL_CALL = "tool_call"
    TURN_START = "turn_start"
    TURN_END = "turn_end"
    STEP_START = "step_start"
    STEP_END = "step_end"
    REQUEST_HEADER = "request_header"


SURFACE_TYPES: Final = frozenset(
    {
        EventType.SYSTEM_MESSAGE,
        EventType.USER_MESSAGE,
        EventType.ASSISTANT_MESSAGE,
        EventType.TOOL_RESULT,
    }
)
"""Types that project to a model-visible message."""

BOOKKEEPING_TYPES: Final = frozenset(EventType) - SURFACE_TYPES
"""Types that project to nothing."""

ROLE_OF: Final = {
    EventType.SYSTEM_MESSAGE: Role.SYSTEM,
    EventType.USER_MESSAGE: Role.USER,
    EventType.ASSISTANT_MESSAGE: Role.ASSISTANT,
    EventType.TOOL_RESULT: Role.TOOL,
}
EVENT_TYPE_OF: Final = {role: etype for etype, role in ROLE_OF.items()}

_TYPES_TEXT = ", ".join(t.value for t in EventType)
_LOOKUP: Final[dict[object, EventType]] = {t.value: t for t in EventType}


class InvalidEvent(ValueError):
    """An event was refused; ``reason`` is one of the codes of DESIGN.md §2.

    The codes, in the order they are checked: ``invalid_event``,
    ``unknown_event_type``, ``surface_op_on_non_surface_event``,
    ``invalid_surface_op``, ``unserializable_event_data``, ``seq_behind_head``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type[InvalidEvent], tuple[str, str]]:
        return (InvalidEvent, (self.reason, str(self)))


def _invalid_op(detail: str) -> NoReturn:
    raise InvalidEvent(
        "invalid_surface_op",
        f"invalid surface_op: {detail}; use None, 'append', Replace(start, stop), "
        "('replace', start, stop) or ['replace', start, stop] with 0 <= start <= stop",
    )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class Replace:
    """A replace of the inclusive position range ``start..stop``.

    ``stop`` has no upper bound: the part of the range past the end matches nothing.

    >>> Replace(2, 5)
    Replace(start=2, stop=5)
    >>> Replace(5, 2)
    Traceback (most recent call last):
    ...
    nous_actor.core.event.InvalidEvent: invalid surface_op: stop 2 < start 5; use None, ...
    """

    __slots__ = ("start", "stop")
    start: int
    stop: int

    def __init__(self, start: int, stop: int) -> None:
        if not _is_int(start) or not _is_int(stop):
            _invalid_op(
                f"start and stop must be ints, got {type(start).__name__} "
                f"and {type(stop).__name__}"
            )
        start, stop = int.__int__(start), int.__int__(stop)  # plain ints, whatever subclass
        if start < 0:
            _invalid_op(f"start {start} is negative")
        if stop < start:
            _invalid_op(f"stop {stop} < start {start}")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "stop", stop)
        untrack(self)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Replace is immutable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Replace):
            return self.start == other.start and self.stop == other.stop
        return NotImplemented

    def __hash__(self) -> int:
        return hash((Replace, self.start, self.stop))

    def __repr__(self) -> str:
        return f"Replace(start={self.start}, stop={self.stop})"

    def __reduce__(self) -> tuple[type[Replace], tuple[int, int]]:
        return (Replace, (self.start, self.stop))

    def to_json(self) -> FrozenList:
        """The persisted form, ``["replace", start, stop]``."""
        return FrozenList(["replace", self.start, self.stop])


def parse_surface_op(raw: object) -> Replace | None:
    """Read a ``surface_op`` value: ``None`` for a plain append, else a `Replace`."""
    if raw is None or raw == "append":
        return None
    if isinstance(raw, Replace):
        return raw
    if isinstance(raw, (tuple, list)):
        if len(raw) == 3 and raw[0] == "replace":
            return Replace(raw[1], raw[2])
        _invalid_op(f"{_short(raw)} is not ('replace', start, stop)")
    _invalid_op(f"{_short(raw)} is not a known form")


_short = short_repr


def check_event(
    seq: object, etype: object, time: object, data: object
) -> tuple[EventType, datetime, FrozenDict, Replace | None]:
    """Validate one event in DESIGN.md §2 order; return its normalised parts.

    Every argument is the caller's and may run the caller's code when read (a
    mapping's ``items``, a str subclass's ``__hash__``, a tzinfo's
    ``utcoffset``). Whatever that raises (an ``Exception``, ``RecursionError``
    included) is refused as `InvalidEvent` like any other bad input:
    unreadable ``data`` is ``unserializable_event_data`` (JSON cannot carry
    it; the message names the path), an unreadable ``surface_op`` is
    ``invalid_surface_op``, an unreadable type ``unknown_event_type``, an
    unreadable ``seq`` or ``time`` ``invalid_event``.

    Raises:
        InvalidEvent: with the ``reason`` of the first rule that fails.
    """
    try:
        # The common case, plain values of the exact types: no caller code can run
        # while they are read, so none of the guards of the general path is needed.
        if (
            type(seq) is int
            and seq >= 0
            and type(data) is dict
            and type(time) is datetime
            and time.tzinfo is UTC
        ):
            kind = _LOOKUP.get(etype) if type(etype) is str or type(etype) is EventType else None
            if kind is not None and data.get("surface_op") is None:
                return kind, time, _freeze_data(data), None
        return _check_event_guarded(seq, etype, time, data)
    except (InvalidEvent, MemoryError):
        raise
    except Exception as exc:  # a last resort: each read below has its own, sharper message
        raise InvalidEvent(
            "invalid_event",
            f"the event could not be read ({describe_error(exc)}); "
            "pass a str type, an int seq, a plain datetime and a plain dict",
        ) from None


def _freeze_data(data: Any) -> FrozenDict:
    try:
        frozen: FrozenDict = freeze(data, "data")
    except NotJSON as exc:
        raise InvalidEvent(
            "unserializable_event_data",
            f"{exc.path} cannot be stored as JSON: {exc.detail}",
        ) from None
    return frozen


def _check_event_guarded(
    seq: object, etype: object, time: object, data: object
) -> tuple[EventType, datetime, FrozenDict, Replace | None]:
    try:
        bad_seq = not _is_int(seq) or int.__int__(seq) < 0  # type: ignore[arg-type]
    except Exception as exc:
        raise _unreadable("invalid_event", "seq", exc) from None
    if bad_seq:
        raise InvalidEvent(
            "invalid_event", f"seq must be an int >= 0 (not a bool), got {_short(seq)}"
        )
    if data is None:
        data = EMPTY_DICT
    else:
        try:
            is_mapping = isinstance(data, Mapping)
        except Exception as exc:
            raise _unreadable_data("data", data, exc) from None
        if not is_mapping:
            raise InvalidEvent(
                "invalid_event",
                f"data must be a mapping (a JSON object), got {_type_name(data)}; "
                'wrap the value, e.g. {"content": value}',
            )
    if not isinstance(time, datetime):
        raise InvalidEvent(
            "invalid_event",
            f"time must be a timezone-aware datetime, got {_type_name(time)}",
        )
    try:
        aware = time.tzinfo is not None and time.utcoffset() is not None
    except Exception as exc:
        raise _unreadable("invalid_event", "time", exc) from None
    if not aware:
        raise InvalidEvent(
            "invalid_event",
            "time is a naive datetime; use datetime.now(timezone.utc) or attach a tzinfo",
        )
    try:
        if type(etype) is EventType:
            kind: EventType | None = etype
        elif isinstance(etype, str):
            kind = _LOOKUP.get(str.__str__(etype))
        else:
            kind = None
    except Exception as exc:
        raise _unreadable("unknown_event_type", "the event type", exc) from None
    if kind is None:
        raise InvalidEvent(
            "unknown_event_type",
            f"unknown event type {_short(etype)}; use one of: {_TYPES_TEXT}",
        )
    assert isinstance(data, Mapping)
    try:
        raw_op = data.get("surface_op")
    except Exception as exc:
        raise _unreadable_data("data", data, exc) from None
    if raw_op is not None and kind not in SURFACE_TYPES:
        raise InvalidEvent(
            "surface_op_on_non_surface_event",
            f"a {kind.value} event cannot carry surface_op={_short(raw_op)}: only "
            "system_message, user_message, assistant_message and tool_result enter the "
            "surface; drop the surface_op key",
        )
    try:
        op = parse_surface_op(raw_op)
    except InvalidEvent:
        raise
    except Exception as exc:
        _invalid_op(f"{_short(raw_op)} could not be read ({describe_error(exc)})")
    if op is not None:
        try:
            data = {**data, "surface_op": op.to_json()}
        except Exception as exc:
            raise _unreadable_data("data", data, exc) from None
    frozen = _freeze_data(data)
    if time.tzinfo is not UTC:
        try:
            time = time.astimezone(UTC)
        except Exception as exc:
            raise _unreadable("invalid_event", "time", exc) from None
    return kind, time, frozen, op


def type_text(etype: object) -> str:
    """How to show a caller's event type in a log line or a message; never raises.

    A str (or str subclass) is shown as its plain text without running its
    methods; anything else as a short ``repr``.

    >>> type_text("user_message"), type_text(EventType.TOOL_CALL), type_text(3)
    ('user_message', 'tool_call', '3')
    """
    try:
        return str.__str__(etype) if isinstance(etype, str) else short_repr(etype)
    except Exception:  # an object whose __class__ raises
        return f"<unreadable {_type_name(etype)}>"


def _type_name(value: object) -> str:
    try:
        return str.__str__(type(value).__name__)
    except Exception:
        return "object"


def _unreadable(reason: str, what: str, exc: BaseException) -> InvalidEvent:
    return InvalidEvent(
        reason,
        f"{what} could not be read: it raised {describe_error(exc)}; "
        "pass a plain value (an int seq, a str type, a datetime with a standard tzinfo)",
    )


def _unreadable_data(path: str, value: object, exc: BaseException) -> InvalidEvent:
    return InvalidEvent(
        "unserializable_event_data",
        f"{path} cannot be stored as JSON: {_type_name(value)} raised {describe_error(exc)} "
        "when read; pass plain dicts, lists and scalars (e.g. copy it with dict(...) first)",
    )


_new = object.__new__
_set = object.__setattr__


class _EventSlots:
    """The fields of an `Event`; set once, while it is built (see `trusted_event`)."""

    __slots__ = ("_msg", "_op", "_pos", "data", "seq", "time", "type")


class _Building(_EventSlots):
    """An `Event` being filled in: its fields are set as on any object, then it
    becomes an Event (same layout), which refuses every later assignment."""

    __slots__ = ()
    seq: int
    type: EventType
    time: datetime
    data: FrozenDict
    _op: Replace | None
    _pos: int
    _msg: Message | None


def passing_event(
    seq: int, etype: EventType, time: datetime, data: Any, op: Replace | None
) -> Event:
    """`trusted_event` for an event read to be looked at and dropped (a reader's cold
    read): left to the cyclic collector, which costs nothing for a value that dies
    young, where taking it out costs a C call per event."""
    ev = _new(_Building)
    ev.seq = seq
    ev.type = etype
    ev.time = time
    ev.data = data
    ev._op = op
    ev._pos = seq if op is None else op.start
    ev._msg = None
    ev.__class__ = Event  # type: ignore[assignment]
    return ev  # type: ignore[return-value]


def trusted_event(
    seq: int, etype: EventType, time: datetime, data: FrozenDict, op: Replace | None
) -> Event:
    """An Event of already checked parts: the hot path of appends and of recovery."""
    ev = passing_event(seq, etype, time, data, op)
    untrack(ev)
    return ev


class Event(_EventSlots):
    """One immutable log event: ``Event(seq, type, time, data)``.

    ``data`` is deeply frozen on construction (a caller mutating its dict
    afterwards never changes the event); a replace's ``surface_op`` is stored
    in its persisted form ``["replace", start, stop]``; ``time`` is kept in UTC.

    >>> from datetime import datetime, timezone
    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> e = Event(3, "system_message", t, {"content": "summary",
    ...                                   "surface_op": ("replace", 0, 2)})
    >>> e.type, e.surface_op, e.position
    (<EventType.SYSTEM_MESSAGE: 'system_message'>, Replace(start=0, stop=2), 0)

    Raises:
        InvalidEvent: see DESIGN.md §2 for the reasons, checked in order.
    """

    __slots__ = ()
    seq: int
    type: EventType
    time: datetime
    data: FrozenDict
    _op: Replace | None
    _pos: int
    _msg: Message | None

    def __init__(self, seq: int, type: EventType | str, time: datetime, data: Mapping[str, Any]):
        etype, t, frozen, op = check_event(seq, type, time, data)
        _fill(self, int.__int__(seq), etype, t, frozen, op)

    _trusted = staticmethod(trusted_event)
    """An Event of parts `check_event` (or the row decoder) already checked."""

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Event is immutable; append a new event instead")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Event is immutable")

    @property
    def surface_op(self) -> Replace | None:
        """``None`` for a plain event, the `Replace` for a replacing one."""
        return self._op

    @property
    def position(self) -> int:
        """Where the event stands on the surface: ``start`` for a replace, else ``seq``."""
        return self._pos

    @property
    def is_surface(self) -> bool:
        """Whether the type projects to a message."""
        return self.type in SURFACE_TYPES

    def to_message(self) -> Message | None:
        """The projected `Message` (DESIGN.md §3), or ``None`` for bookkeeping."""
        if self.type not in SURFACE_TYPES:
            return None
        return project(self)

    def with_seq(self, seq: int) -> Event:
        """The same event under another seq (used to copy an event into another log)."""
        return trusted_event(seq, self.type, self.time, self.data, self._op)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (
            self.seq == other.seq
            and self.type is other.type
            and self.time == other.time
            and self.data == other.data
        )

    def __hash__(self) -> int:
        return hash((self.seq, self.type, self.time))

    def __repr__(self) -> str:
        return (
            f"Event(seq={self.seq}, type={self.type.value!r}, "
            f"time={self.time.isoformat()!r}, data={dict.__repr__(self.data)})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (Event._trusted, (self.seq, self.type, self.time, self.data, self._op))


def _fill(
    ev: Event, seq: int, etype: EventType, t: datetime, data: FrozenDict, op: Replace | None
) -> None:
    _set(ev, "seq", seq)
    _set(ev, "type", etype)
    _set(ev, "time", t)
    _set(ev, "data", data)
    _set(ev, "_op", op)
    _set(ev, "_pos", seq if op is None else op.start)
    _set(ev, "_msg", None)
    untrack(ev)


def project(ev: Event) -> Message:
    """Project a surface event to its message; memoised on the event."""
    m = ev._msg
    if m is None:
        d = ev.data
        calls = d.get("tool_calls")
        meta = d.get("metadata")
        m = trusted_message(
            ROLE_OF[ev.type],
            d.get("content"),
            d.get("reasoning_content"),
            EMPTY_LIST if calls is None else calls,
            d.get("tool_call_id"),
            d.get("name"),
            EMPTY_DICT if meta is None else meta,
            ev.time,
        )
        untrack(m)
        _set(ev, "_msg", m)
    return m
