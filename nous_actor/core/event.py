"""Log events: `Event`, `EventType`, `Replace`, `InvalidEvent`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, NoReturn

import msgspec
import msgspec.structs

from nous_actor.core import limits as _limits
from nous_actor.core._frozen import (
    EMPTY_DICT,
    EMPTY_LIST,
    FrozenDict,
    FrozenList,
    NotJSON,
    _freeze,
    _list_from,
    describe_error,
    encode_json,
    encode_plain,
    freeze,
    freeze_measured,
    json_size_bounds,
    short_repr,
    untrack,
    untrackable,
)
from nous_actor.core.limits import MAX_DATA_DEPTH, MAX_SEQ, describe_bytes
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


@untrackable
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
        if _is_set(_START, self):
            raise TypeError(
                "Replace is immutable: it was built already, and __init__ cannot build it "
                "again; make a new one, e.g. Replace(start, stop)"
            )
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
        untrack(self)  # (a subclass, which may have a __dict__, stays tracked)

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
        return _list_from(["replace", self.start, self.stop])


_START: Final = Replace.__dict__["start"].__get__
_STOP: Final = Replace.__dict__["stop"].__get__


def _is_set(get: Any, obj: object) -> bool:
    """Whether the slot ``get`` reads is set on ``obj`` (its ``__init__`` ran already)."""
    try:
        get(obj)
    except AttributeError:
        return False
    return True


def parse_surface_op(raw: object) -> Replace | None:
    """Read a ``surface_op`` value: ``None`` for a plain append, else a `Replace`.

    A `Replace` subclass comes back as a plain `Replace` of the bounds it was
    built with (its own attributes are never read)."""
    if raw is None or (type(raw) is str and raw == "append"):
        return None
    if isinstance(raw, Replace):
        return raw if type(raw) is Replace else Replace(_START(raw), _STOP(raw))
    if isinstance(raw, str) and str.__str__(raw) == "append":
        return None
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
    ``utcoffset``). Each is read once, and every rule is checked on what was
    read: ``data`` is frozen first (keys, strings and numbers of exact types),
    and its ``surface_op`` is the frozen value's, so what is checked is what is
    stored. ``time`` becomes an exact UTC ``datetime`` read through
    ``datetime``'s own fields (a subclass's methods are never called).

    Whatever reading raises (an ``Exception``, ``RecursionError`` included) is
    refused as `InvalidEvent` like any other bad input: unreadable ``data`` is
    ``unserializable_event_data`` (JSON cannot carry it; the message names the
    path), an unreadable ``surface_op`` is ``invalid_surface_op``, an
    unreadable type ``unknown_event_type``, an unreadable ``seq`` or ``time``
    ``invalid_event``. The limits of `nous_actor.core.limits` (depth, int
    length, size of ``data``; ``seq <= MAX_SEQ``) are checked here too.

    Raises:
        InvalidEvent: with the ``reason`` of the first rule that fails.
    """
    try:
        # The common case, plain values of the exact types: the data is frozen (read
        # once) and its surface_op read from the frozen value.
        common = _common(seq, etype, time, data, False)
        if common is not None:
            kind, t, frozen, _ = common
            if frozen.get("surface_op") is None:
                return kind, t, frozen, None
            data = frozen  # a replace: its surface_op is checked on the frozen value
        return _check_event_guarded(seq, etype, time, data)
    except (InvalidEvent, MemoryError):
        raise
    except Exception as exc:  # a last resort: each read below has its own, sharper message
        raise InvalidEvent(
            "invalid_event",
            f"the event could not be read ({describe_error(exc)}); "
            "pass a str type, an int seq, a plain datetime and a plain dict",
        ) from None


def check_held(
    seq: object, etype: object, time: object, data: object
) -> tuple[EventType, datetime, FrozenDict | str, Replace | None]:
    """`check_event`, the data of a plain event then encoded once into its stored form.

    The text is what a store writes as it is and what the event holds (decoded only
    when something reads ``data``; a derive reads only a message's fields): checked
    and encoded in the caller's thread, so what was validated is what is stored, and
    a live event costs the bytes of its text, not a frozen tree. In the common case
    (plain values of the exact types) the data is checked into a plain copy, read
    once, and that copy encoded: no frozen container is made for it. A replace keeps
    its frozen data (its ``surface_op`` is kept outside the text).

    Raises:
        InvalidEvent: as `check_event`.
    """
    common = _common(seq, etype, time, data, True)
    if common is not None:
        kind, t, copy, text = common
        if copy.get("surface_op") is not None:
            return check_event(seq, kind, t, copy)  # a replace: the copy frozen
        return kind, t, encode_plain(copy) if text is None else text, None
    etype_, t, frozen, op = check_event(seq, etype, time, data)
    if op is None:
        return etype_, t, encode_json(frozen), None
    return etype_, t, frozen, op


def _common(
    seq: object, etype: object, time: object, data: object, plain: bool
) -> tuple[EventType, datetime, Any, str | None] | None:
    """The common case: every part a plain value of the exact type and the data JSON
    within the limits. Then the type, the time and the data checked (read once): frozen,
    or with ``plain`` a plain copy (`_freeze`); its size held to the limit unless it
    replaces (the caller checks its ``surface_op``, on it), and the text that took, if
    measuring it took encoding it (large data: encoded once, not again to store it).
    Else ``None``: the general path says which rule fails first."""
    if not (
        type(seq) is int
        and 0 <= seq <= MAX_SEQ
        and type(data) is dict
        and type(time) is datetime
        and time.tzinfo is UTC
    ):
        return None
    kind = _LOOKUP.get(etype) if type(etype) is str or type(etype) is EventType else None
    if kind is None:
        return None
    meter = [0]
    try:
        value = _freeze(data, "data", MAX_DATA_DEPTH, meter, plain)
    except (NotJSON, RecursionError):
        return None
    text = None
    if value.get("surface_op") is None and 6 * meter[0] + 2 > _limits._max_event_bytes:
        text = _check_size(value, meter, encode_plain if plain else encode_json)  # (bounds)
    return kind, time, value, text


def _freeze_data(data: Any) -> FrozenDict:
    """``data`` frozen and held to the depth, int and size limits."""
    try:
        frozen, meter = freeze_measured(data, "data")
    except NotJSON as exc:
        raise _not_json(exc) from None
    if json_size_bounds(meter)[1] > _limits._max_event_bytes:
        _check_size(frozen, meter)
    result: FrozenDict = frozen
    return result


def _not_json(exc: NotJSON) -> InvalidEvent:
    return InvalidEvent(
        "unserializable_event_data", f"{exc.path} cannot be stored as JSON: {exc.detail}"
    )


def _check_size(
    frozen: Mapping[str, Any], meter: list[int], encode: Callable[[Any], str] = encode_json
) -> str:
    """Refuse ``frozen`` (or its plain copy, with ``encode_plain``) if its compact UTF-8
    JSON is over the size limit: without encoding it when what was counted is over
    already, else by encoding it once; the text, when it is within the limit (for a
    caller that stores it)."""
    limit = _limits._max_event_bytes
    low, _ = json_size_bounds(meter)
    if low > limit:
        size, exact = low, False
    else:
        text = encode(frozen)
        size, exact = (len(text) if text.isascii() else len(text.encode("utf-8"))), True
        if size <= limit:
            return text
    raise InvalidEvent(
        "unserializable_event_data",
        f"data is {'' if exact else 'at least '}{size} bytes as JSON, over the event size "
        f"limit of {describe_bytes(limit)}; store a large blob elsewhere (a file, an object "
        "store) and put its reference in the event, or raise the limit with "
        "nous_actor.core.limits.set_max_event_bytes",
    )


_YEAR, _MONTH, _DAY = (date.__dict__[f].__get__ for f in ("year", "month", "day"))
_HOUR, _MINUTE, _SECOND, _MICRO = (
    datetime.__dict__[f].__get__ for f in ("hour", "minute", "second", "microsecond")
)
_TD_DAYS, _TD_SECONDS, _TD_MICRO = (
    timedelta.__dict__[f].__get__ for f in ("days", "seconds", "microseconds")
)


def _exact_time(time: datetime) -> datetime:
    """``time`` as an exact ``datetime`` in UTC, read through ``datetime``'s own fields
    and its tzinfo's ``utcoffset`` (called once); a subclass's methods never run.

    Raises:
        InvalidEvent: ``invalid_event``: naive, unreadable, or out of range in UTC.
    """
    try:
        offset = datetime.utcoffset(time)
    except Exception as exc:
        raise _unreadable("invalid_event", "time", exc) from None
    if offset is None:
        raise InvalidEvent(
            "invalid_event",
            "time is a naive datetime; use datetime.now(timezone.utc) or attach a tzinfo",
        )
    try:
        wall = datetime(
            _YEAR(time), _MONTH(time), _DAY(time),
            _HOUR(time), _MINUTE(time), _SECOND(time), _MICRO(time),
        )  # fmt: skip
        shift = timedelta(_TD_DAYS(offset), _TD_SECONDS(offset), _TD_MICRO(offset))
        return (wall - shift).replace(tzinfo=UTC)
    except OverflowError:
        raise InvalidEvent(
            "invalid_event",
            f"time {datetime.isoformat(time)} is out of range once converted to UTC; "
            "use a time between years 1 and 9999 in UTC",
        ) from None


def _top_level(data: Mapping[Any, Any]) -> tuple[dict[str, Any], NotJSON | None]:
    """Read the caller's mapping once: its entries under exact ``str`` keys, and the first
    key JSON cannot carry (reported after the ``surface_op`` rules, in §2 order)."""
    out: dict[str, Any] = {}
    bad: NotJSON | None = None
    try:
        entries = dict.items(data) if type(data) is dict else data.items()
        for k, v in entries:
            if type(k) is not str:
                if not isinstance(k, str):
                    kr = short_repr(k)
                    bad = bad or NotJSON(
                        f"data[{kr}]",
                        f"key {kr} of type {_type_name(k)} is not a string; "
                        "JSON objects take str keys only",
                    )
                    continue
                k = str.__str__(k)
            if k in out:
                bad = bad or NotJSON(
                    f"data[{k!r}]",
                    "two keys of this object read as the same text (a str subclass with its "
                    "own __eq__/__hash__); a JSON object holds each key once, so one would be "
                    "lost",
                )
                continue
            out[k] = v
    except (MemoryError, RecursionError):
        raise
    except Exception as exc:
        raise _unreadable_data("data", data, exc) from None
    return out, bad


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
    if int.__int__(seq) > MAX_SEQ:  # type: ignore[arg-type]
        raise InvalidEvent(
            "invalid_event",
            f"seq {int.__int__(seq)} is past the last seq a store keeps, 2**63 - 1 "  # type: ignore[arg-type]
            f"({MAX_SEQ}, its signed 64-bit integer); use a smaller seq",
        )
    if data is not None:
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
    if type(time) is not datetime or time.tzinfo is not UTC:
        time = _exact_time(time)
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
    if data is None:
        return kind, time, EMPTY_DICT, None
    assert isinstance(data, Mapping)
    entries, bad_key = _top_level(data)
    raw_op = entries.get("surface_op")
    if raw_op is not None and kind not in SURFACE_TYPES:
        raise InvalidEvent(
            "surface_op_on_non_surface_event",
            f"a {kind.value} event cannot carry surface_op={_short(raw_op)}: only "
            "system_message, user_message, assistant_message and tool_result enter the "
            "surface; drop the surface_op key",
        )
    op = None
    if raw_op is not None:
        if not isinstance(raw_op, Replace):
            try:  # parsed as it will be stored (and read back): frozen
                raw_op = freeze(raw_op, "data['surface_op']")
            except NotJSON as exc:
                _invalid_op(f"{_short(raw_op)} is not a known form ({exc.detail})")
        try:
            op = parse_surface_op(raw_op)
        except InvalidEvent:
            raise
        except Exception as exc:
            _invalid_op(f"{_short(raw_op)} could not be read ({describe_error(exc)})")
        entries["surface_op"] = raw_op if op is None else op.to_json()
    if bad_key is not None:
        raise _not_json(bad_key)
    return kind, time, _freeze_data(entries), op


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


class _EventMeta(msgspec.StructMeta):
    """The metaclass of `Event`: ``Event(seq, type, time, data)`` checks its parts
    (DESIGN.md §2) and builds the event of their normalised form; `trusted_event`
    builds one of parts checked already, with no check at all.

    A subclass (``class Tagged(Event): ...``) is as a Python subclass of a slotted
    class would be: it has a ``__dict__`` and weak references, so it may be on a
    reference cycle, and is left to the cyclic collector."""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _EventMeta:
        if any(isinstance(base, _EventMeta) for base in bases):
            for key in ("gc", "dict", "weakref"):
                kwargs.setdefault(key, True)
        return super().__new__(mcls, name, bases, namespace, **kwargs)

    if not TYPE_CHECKING:  # to a type checker, an Event is built as its class says

        def __call__(cls, seq, type, time, data):
            etype, t, frozen, op = check_event(seq, type, time, data)
            seq = int.__int__(seq)
            return _make(cls, seq, etype, t, frozen, op, seq if op is None else op.start)


_make: Final = msgspec.StructMeta.__call__
"""Build an Event (or a subclass) from its fields, with no check: msgspec's own
constructor, which the metaclass's ``__call__`` (the checked one) stands in front of."""


def passing_event(
    seq: int, etype: EventType, time: datetime, data: FrozenDict | str, op: Replace | None
) -> Event:
    """`trusted_event` for an event read to be looked at and dropped (a reader's cold
    read): what it decodes later (its data, its message) is left to the cyclic
    collector, which costs nothing for a value that dies young, where taking it out
    costs a C call per value."""
    ev: Event = _make(
        Event, seq, etype, time, data, op, seq if op is None else op.start, None, True
    )
    return ev


def trusted_event(
    seq: int, etype: EventType, time: datetime, data: FrozenDict | str, op: Replace | None
) -> Event:
    """An Event of already checked parts: the hot path of appends and of recovery.

    ``data`` is frozen, or stored JSON text the codec checked (see `Event`)."""
    ev: Event = _make(Event, seq, etype, time, data, op, seq if op is None else op.start)
    return ev


class Event(msgspec.Struct, metaclass=_EventMeta, frozen=True, gc=False, eq=False):
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

    An event is a frozen msgspec struct the cyclic collector never tracks: it holds
    immutable values only (its data, a `Replace`, its memoised `Message`, all frozen),
    so it can never be on a reference cycle, and a long session's hundreds of
    thousands of events cost a full collection nothing.

    ``_data`` is the frozen data, or the stored JSON text of an event read from a
    store or appended through a session, already checked to be a JSON object
    without a ``surface_op`` (see `nous_actor.core.codec.event_from_row`): it is
    decoded when something first reads ``data``, so what nothing reads (a shadowed
    event, a bookkeeping one, a session opened to be appended to) is never decoded.

    Raises:
        InvalidEvent: see DESIGN.md §2 for the reasons, checked in order.
    """

    seq: int
    type: EventType
    time: datetime
    _data: FrozenDict | str
    _op: Replace | None
    _pos: int
    _msg: Message | None = None
    _passing: bool = False  # read to be dropped (`passing_event`)

    if TYPE_CHECKING:  # what the metaclass's checked constructor takes

        def __init__(
            self, seq: int, type: EventType | str, time: datetime, data: Mapping[str, Any]
        ) -> None: ...

    _trusted = staticmethod(trusted_event)
    """An Event of parts `check_event` (or the row decoder) already checked."""

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Event is immutable; append a new event instead")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Event is immutable")

    @property
    def data(self) -> FrozenDict:
        """The event's data: a deeply immutable mapping, equal to the plain dict."""
        d = self._data
        return _read_held(self, d) if isinstance(d, str) else d

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
        return trusted_event(seq, self.type, self.time, self._data, self._op)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (
            self.seq == other.seq
            and self.type is other.type
            and self.time == other.time
            and self.data == other.data
        )

    def __ne__(self, other: object) -> bool:
        # Said outright: the base Struct's own comparison answers ``!=`` by identity.
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.seq, self.type, self.time))

    def __repr__(self) -> str:
        return (
            f"Event(seq={self.seq}, type={self.type.value!r}, "
            f"time={self.time.isoformat()!r}, data={dict.__repr__(self.data)})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (Event._trusted, (self.seq, self.type, self.time, self._data, self._op))

    def __copy__(self) -> Event:
        return self  # immutable: a copy is the event itself

    def __deepcopy__(self, memo: dict[int, object]) -> Event:
        return self


def _refuse_event_init(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        "Event is immutable: it was built already, and __init__ cannot build it "
        "again; make a new Event (or use with_seq)"
    )


# msgspec refuses an ``__init__`` in a struct's body; a built event refuses one called
# again (construction never calls it: the metaclass builds the event).
Event.__init__ = _refuse_event_init  # type: ignore[method-assign]
_set_field: Final = msgspec.structs.force_setattr

HeldLoader = Callable[[str, int, bool], FrozenDict]
"""Decode an event's held JSON text: ``(text, seq, tracked)``, ``tracked`` being whether
the event is left to the cyclic collector (a passing one), its data then too."""

MessageFields = tuple[Any, Any, Any, Any, Any, Any]
"""``content``, ``reasoning_content``, ``tool_calls``, ``tool_call_id``, ``name`` and
``metadata`` of a surface event's data, frozen, ``None`` where absent."""

HeldFields = Callable[[str, int, bool], MessageFields | None]
"""Read the `MessageFields` out of an event's held text (same arguments as
`HeldLoader`), decoding nothing else; ``None`` if only the whole data can be read."""


def _unregistered(text: str, seq: int, tracked: bool) -> Any:
    """Never called: importing any part of the package imports the codec, which
    registers its readers (`install_held_readers`) before it makes a held event."""
    raise RuntimeError("nous_actor.core.codec registers the readers of held event text")


_held_data: HeldLoader = _unregistered
_held_fields: HeldFields = _unregistered


def has_key(ev: Event, key: str) -> bool:
    """Whether ``ev.data`` has the top-level key ``key``, without decoding a held text
    that cannot hold it (no ``"key"`` in it, and no ``\\u`` escape that could spell it):
    a look for one key through a long history decodes only the events that may have it."""
    d = ev._data
    if type(d) is str and f'"{key}"' not in d and "\\u" not in d:
        return False
    return key in ev.data


def install_held_readers(load: HeldLoader, fields: HeldFields) -> None:
    """Name the codec's readers of held text (the codec imports this module, so it
    registers them rather than being imported here)."""
    global _held_data, _held_fields
    _held_data, _held_fields = load, fields


def _read_held(ev: Event, text: str) -> FrozenDict:
    """Decode the stored text an event holds, once: the frozen data replaces the text.

    Two threads reading it at once both decode it and get equal values; either
    value stays (both are the same data), and the text is never read again."""
    frozen = _held_data(text, ev.seq, ev._passing)
    _set_field(ev, "_data", frozen)
    return frozen


def project(ev: Event) -> Message:
    """Project a surface event to its message; memoised on the event."""
    m = ev._msg
    if m is None:
        d = ev._data
        passing = ev._passing  # an event read to be dropped: its message passes too
        # Held text: only the message's fields are decoded.
        fields = _held_fields(d, ev.seq, passing) if isinstance(d, str) else None
        if fields is not None:
            content, reasoning, calls, call_id, name, meta = fields
        else:
            d = ev.data
            content, reasoning = d.get("content"), d.get("reasoning_content")
            calls, call_id = d.get("tool_calls"), d.get("tool_call_id")
            name, meta = d.get("name"), d.get("metadata")
        m = trusted_message(
            ROLE_OF[ev.type],
            content,
            reasoning,
            EMPTY_LIST if calls is None else calls,
            call_id,
            name,
            EMPTY_DICT if meta is None else meta,
            ev.time,
        )
        if not passing:
            untrack(m)
        _set_field(ev, "_msg", m)
    return m
