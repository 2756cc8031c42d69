"""The persisted form of events and logs: JSON records and JSON Lines.

An event record is ``{"seq", "type", "time", "data"}``: ``time`` is ISO-8601
with microseconds and offset, a replace's ``surface_op`` is
``["replace", start, stop]``. A log is one record a line, oldest first;
decoding restores every event under its own seq with `Log.append_at`,
so snapshot gaps survive the round trip. A v1 input, a JSON list of
messages, decodes through `Log.seed`.

>>> from nous_actor import Log
>>> log = Log().append("user_message", {"content": "hi"})
>>> text = to_jsonl(log)
>>> loads(text) == log
True
"""

from __future__ import annotations

import json
import math
import re
from builtins import type as type_of
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, Final, NoReturn

import msgspec

from nous_actor.core._frozen import (
    EMPTY_DICT,
    EMPTY_LIST,
    JSON_ENCODER,
    RECURSION_ERRORS,
    FrozenDict,
    FrozenList,
    _fill_dict,
    _list_from,
    _new_dict,
    _untrack_exact,
    encode_json,
    thaw,
)
from nous_actor.core.event import _LOOKUP as EVENT_TYPES
from nous_actor.core.event import (
    ROLE_OF,
    SURFACE_TYPES,
    Event,
    EventType,
    InvalidEvent,
    MessageFields,
    Replace,
    install_held_readers,
    parse_surface_op,
    passing_event,
    trusted_event,
)
from nous_actor.core.limits import MAX_SEQ
from nous_actor.core.log import Log, shadowed
from nous_actor.core.message import Message, Role, trusted_message

__all__ = [
    "CodecError",
    "dumps_event",
    "encode_data",
    "event_from_dict",
    "event_from_row",
    "events_from_rows",
    "event_to_dict",
    "from_jsonl",
    "from_v1",
    "iter_jsonl",
    "loads",
    "loads_event",
    "message_from_dict",
    "message_to_dict",
    "surface_from_rows",
    "to_jsonl",
]

_FIELDS = ("seq", "type", "time", "data")
_FIELD_SET = frozenset(_FIELDS)


class CodecError(ValueError):
    """A record could not be decoded; ``line`` (1-based, if known) and ``field`` say where.

    ``reason`` is the `InvalidEvent` reason when the record decoded but holds an event
    an append refuses (DESIGN.md §2: ``invalid_event``, ``unserializable_event_data``
    ...), else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        field: str | None = None,
        reason: str | None = None,
    ):
        where = f"line {line}: " if line is not None else ""
        super().__init__(where + message)
        self.line = line
        self.field = field
        self.reason = reason


def _fail(message: str, line: int | None, field: str | None) -> NoReturn:
    raise CodecError(message, line=line, field=field)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


# Built once: json.loads/dumps with options build a new decoder/encoder per call.
def _frozen_list(items: list[Any]) -> FrozenList:
    return _list_from([_frozen_list(v) if type(v) is list else v for v in items])


def _object_hook(untracked: Callable[[object], object]) -> Callable[[dict[str, Any]], FrozenDict]:
    def frozen_object(obj: dict[str, Any]) -> FrozenDict:
        # json calls this innermost first, so nested objects are frozen already;
        # only lists (which have no hook) are left to convert. Called for every
        # object of every stored row: `_dict_of` is inlined.
        for v in obj.values():
            if type(v) is list:
                for k, v2 in obj.items():
                    if type(v2) is list:
                        obj[k] = _frozen_list(v2)
                break
        fd: FrozenDict = _new_dict(FrozenDict)
        _fill_dict(fd, obj)
        untracked(fd)
        return fd

    return frozen_object


_frozen_object = _object_hook(_untrack_exact)
# A value read to be dropped stays with the cyclic collector (`id`: a C call that
# leaves it as it is, cheaper than the C call through ctypes that untracks it).
_passing_object = _object_hook(id)


def _finite_float(text: str) -> float:
    x = float(text)
    if math.isinf(x):
        raise ValueError(f"{text} overflows to infinity, which JSON data may not hold")
    return x


def _tree_freezers(
    untracked: Callable[[object], object],
) -> tuple[Callable[[dict[str, Any]], FrozenDict], Callable[[list[Any]], FrozenList]]:
    """Freeze a tree msgspec decoded (plain dicts and lists of exact JSON types, which
    nothing else holds), as the stdlib decoder's hook freezes what it reads."""

    def frozen_items(items: list[Any]) -> FrozenList:
        for i, v in enumerate(items):
            t = type(v)
            if t is dict:
                items[i] = frozen_tree(v)
            elif t is list:
                items[i] = frozen_items(v)
        return _list_from(items)

    def frozen_tree(obj: dict[str, Any]) -> FrozenDict:
        for k, v in obj.items():  # replacing a value leaves the dict's size as it is
            t = type(v)
            if t is dict:
                obj[k] = frozen_tree(v)
            elif t is list:
                obj[k] = frozen_items(v)
        fd: FrozenDict = _new_dict(FrozenDict)
        _fill_dict(fd, obj)
        untracked(fd)
        return fd

    return frozen_tree, frozen_items


_freezers = _tree_freezers(_untrack_exact)
_passing_freezers = _tree_freezers(id)
_frozen_tree, _passing_tree = _freezers[0], _passing_freezers[0]

_FAST_DECODE: Final[Callable[[str | bytes], Any]] = msgspec.json.Decoder().decode
"""The first reader of stored JSON: msgspec's strict decoder. Whatever it refuses (not
JSON, NaN, a float that overflows, a lone surrogate, an int past its range, nesting past
its recursion limit) is read again by the stdlib decoder below, which says what is wrong
or reads it; what msgspec accepts, the stdlib decoder reads as the same value."""


def _fast_object(
    data: str | bytes, freeze_tree: Callable[[dict[str, Any]], FrozenDict]
) -> FrozenDict | None:
    """``data`` decoded and frozen by the fast path when it is a JSON object msgspec
    reads; else ``None`` (the stdlib decoder decides)."""
    try:
        value = _FAST_DECODE(data)
        return freeze_tree(value) if type(value) is dict else None
    except (msgspec.MsgspecError, RecursionError, UnicodeError, TypeError):
        return None  # TypeError: not text at all (the stdlib path names it)


_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_finite_float, object_hook=_frozen_object
)
_PASSING_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_finite_float, object_hook=_passing_object
)
_ENCODER = JSON_ENCODER

# -- the decoder without recursion ---------------------------------------------------------
# The C scanner recurses once per container, so how deep it reads depends on the
# reader's recursion limit (and on how deep the reader's own stack is). When it runs
# out, the value is read again by this loop, which keeps its own stack: every reader
# reads what any writer stored, whatever the recursion limits of both.

_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = getattr(  # noqa: B009
    json.decoder, "scanstring"
)
_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")


def _ws(text: str, idx: int) -> int:
    """Where the JSON whitespace from ``idx`` on ends."""
    m = _WHITESPACE.match(text, idx)
    return idx if m is None else m.end()


_NUMBER: Final = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?").match
_LITERALS: Final = (("null", None), ("true", True), ("false", False))


def _scan_flat(
    text: str, idx: int, make_object: Callable[[dict[str, Any]], FrozenDict]
) -> tuple[Any, int]:
    """The JSON value at ``text[idx:]`` and where it ends, frozen as the scanner's hook
    freezes it, read with a stack of its own (no recursion).

    Raises:
        ValueError: not JSON (or NaN, ±Infinity, a float that overflows, an int
            longer than the interpreter's digit limit).
    """
    ws = _ws
    open_: list[dict[str, Any] | list[Any]] = []  # the containers being filled
    keys: list[str] = []  # for each open object, the key its next value goes under
    value: Any
    while True:
        idx = ws(text, idx)
        ch = text[idx : idx + 1]
        if ch == "{" or ch == "[":
            idx = ws(text, idx + 1)
            if text[idx : idx + 1] == ("}" if ch == "{" else "]"):
                value, idx = (make_object({}) if ch == "{" else _list_from([])), idx + 1
            else:
                if ch == "{":
                    key, idx = _object_key(text, idx)
                    keys.append(key)
                    open_.append({})
                else:
                    open_.append([])
                continue
        elif ch == '"':
            value, idx = _scanstring(text, idx + 1, True)
        else:
            value, idx = _scalar(text, idx)
        while True:  # a value is complete: put it in its container, close what ends
            if not open_:
                return value, idx
            top = open_[-1]
            if type(top) is dict:
                top[keys[-1]] = value
            else:
                top.append(value)  # type: ignore[union-attr]
            idx = ws(text, idx)
            ch = text[idx : idx + 1]
            if ch == ",":
                if type(top) is dict:
                    keys[-1], idx = _object_key(text, ws(text, idx + 1))
                else:
                    idx += 1
                break
            if ch != ("}" if type(top) is dict else "]"):
                raise ValueError(f"Expecting ',' delimiter: char {idx}")
            idx += 1
            open_.pop()
            if type(top) is dict:
                keys.pop()
                value = make_object(top)
            else:
                value = _list_from(top)  # type: ignore[arg-type]


def _object_key(text: str, idx: int) -> tuple[str, int]:
    if text[idx : idx + 1] != '"':
        raise ValueError(f"Expecting property name enclosed in double quotes: char {idx}")
    key, idx = _scanstring(text, idx + 1, True)
    idx = _ws(text, idx)
    if text[idx : idx + 1] != ":":
        raise ValueError(f"Expecting ':' delimiter: char {idx}")
    return key, _ws(text, idx + 1)


def _scalar(text: str, idx: int) -> tuple[Any, int]:
    for word, literal in _LITERALS:
        if text.startswith(word, idx):
            return literal, idx + len(word)
    for name in ("NaN", "Infinity", "-Infinity"):
        if text.startswith(name, idx):
            _reject_constant(name)
    m = _NUMBER(text, idx)
    if m is None:
        raise ValueError(f"Expecting value: char {idx}")
    whole, frac, exp = m.groups()
    if frac or exp:
        return _finite_float(whole + (frac or "") + (exp or "")), m.end()
    return int(whole), m.end()


def _decode_text(text: str) -> Any:
    """``text``, one JSON value and nothing else, decoded and frozen."""
    fast = _fast_object(text, _frozen_tree)
    if fast is not None:
        return fast
    try:
        return _DECODER.decode(text)
    except RECURSION_ERRORS:
        value, end = _scan_flat(text, 0, _frozen_object)
        if _ws(text, end) != len(text):
            raise ValueError(f"Extra data: char {end}") from None
        return value


def _json_loads(text: str | bytes, line: int | None) -> Any:
    try:
        if isinstance(text, (bytes, bytearray)):
            text = text.decode("utf-8")
        value = _decode_text(text)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        _fail(f"not valid JSON ({exc})", line, None)
    if ("\\ud" in text or "\\uD" in text) and _lone_surrogate(value):
        _fail(f"the record {_LONE}", line, None)
    return value


_LONE = (
    "holds a lone surrogate (a \\uD800-\\uDFFF escape that pairs with nothing), which no "
    "UTF-8 text can hold; an event may not hold one"
)


def _lone_surrogate(value: Any) -> bool:
    """Whether the decoded ``value`` holds a lone surrogate, which only a ``\\uD800``-
    ``\\uDFFF`` escape can spell in JSON text (the caller looks for one first)."""
    try:
        encode_json(value).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def format_time(t: datetime) -> str:
    """ISO-8601 with microseconds and offset, e.g. ``2026-01-01T00:00:00.000000+00:00``."""
    return t.isoformat(timespec="microseconds")


def event_to_dict(event: Event) -> dict[str, Any]:
    """The event as a plain, JSON-ready dict the caller owns."""
    return {
        "seq": event.seq,
        "type": event.type.value,
        "time": format_time(event.time),
        "data": thaw(event.data),
    }


def dumps_event(event: Event) -> str:
    """The event as one line of JSON (no newline)."""
    return encode_json(
        {
            "seq": event.seq,
            "type": event.type.value,
            "time": format_time(event.time),
            "data": event.data,
        }
    )


def encode_data(event: Event) -> str:
    """The event's ``data`` as compact JSON text (the stored form), whatever this
    thread's recursion limit; the text an event read from a store holds, as it is."""
    held = event._data
    return held if type_of(held) is str else encode_json(held)


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


Scan = Callable[[str, int], tuple[Any, int]]
RowDecoder = Callable[[int, str, str, "str | bytes"], Event]


def _stored_loader(
    scan: Scan,
    make_object: Callable[[dict[str, Any]], FrozenDict],
    freeze_tree: Callable[[dict[str, Any]], FrozenDict],
) -> Callable[[str | bytes, int], Any]:
    def load_stored(data: str | bytes, seq: int) -> Any:
        """Decode a stored ``data`` column: msgspec first; what it refuses, the stdlib
        decoder's scanner called directly (no per-row Python frames), the text
        required to be one JSON value and nothing else, read again without recursion
        if the scanner ran out of it."""
        fast = _fast_object(data, freeze_tree)
        if fast is not None:
            return fast
        try:
            text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
            try:
                value, end = scan(text, 0)
            except RECURSION_ERRORS:
                value, end = _scan_flat(text, 0, make_object)
        except StopIteration:
            _fail(f"seq {seq}: 'data' is not valid JSON (no value at the start)", None, "data")
        except (ValueError, RecursionError, UnicodeDecodeError, AttributeError, TypeError) as exc:
            _fail(f"seq {seq}: 'data' is not valid JSON ({exc})", None, "data")
        if end != len(text) and text[end:].strip():
            _fail(f"seq {seq}: 'data' has text after its JSON value", None, "data")
        if ("\\ud" in text or "\\uD" in text) and _lone_surrogate(value):
            _fail(f"seq {seq}: 'data' {_LONE}", None, "data")
        return value

    return load_stored


def _row_decoder(
    load_stored: Callable[[str | bytes, int], Any],
    make: Callable[[int, EventType, datetime, Any, Replace | None], Event],
) -> RowDecoder:
    def event_from_row(seq: int, type: str, time: str, data: str | bytes) -> Event:
        """Decode an event stored as columns (``data`` as JSON text).

        The fast path of recovery: the decoder refuses what JSON data may not hold,
        so only the rules a stored row could still break are checked (type, time,
        ``surface_op``). Every check is made here, at decoding: a corrupt row is
        found when it is read, never later. An event without a ``surface_op``
        keeps its checked text and freezes it when its ``data`` is first read
        (what the fold needs, type and ``surface_op``, is known already).

        Raises:
            CodecError: a column is malformed; ``.field`` names it.
        """
        if type_of(seq) is not int or seq < 0:
            _fail(f"'seq' must be an int >= 0, got {seq!r}", None, "seq")
        etype = EVENT_TYPES.get(type)
        if etype is None:
            _fail(f"seq {seq}: unknown event type {type!r}", None, "type")
        try:
            t = _fromisoformat(time)
        except (TypeError, ValueError):
            _fail(f"seq {seq}: 'time' is not ISO-8601: {time!r}", None, "time")
        if t.tzinfo is not UTC:
            if t.tzinfo is None:
                _fail(f"seq {seq}: 'time' has no UTC offset: {time!r}", None, "time")
            t = t.astimezone(UTC)
        if type_of(data) is str:
            try:
                value = _FAST_DECODE(data)  # the whole text is checked here, at reading
            except (msgspec.MsgspecError, RecursionError, UnicodeError):
                value = None  # the stdlib path below decides
            if type_of(value) is dict and value.get("surface_op") is None:
                return make(seq, etype, t, data, None)  # held as text, frozen when read
        frozen = load_stored(data, seq)
        if type_of(frozen) is not FrozenDict:
            _fail(
                f"seq {seq}: 'data' must be a JSON object, got {_json_kind(frozen)}", None, "data"
            )
        raw_op = frozen.get("surface_op")
        if raw_op is None:
            return make(seq, etype, t, frozen, None)
        try:
            if etype not in SURFACE_TYPES:
                raise InvalidEvent(
                    "surface_op_on_non_surface_event", "a bookkeeping event has one"
                )
            op = parse_surface_op(raw_op)
        except InvalidEvent as exc:
            raise CodecError(f"seq {seq}: {exc.reason}: {exc}", field="data") from None
        return make(seq, etype, t, frozen, op)

    return event_from_row


_load_stored = _stored_loader(
    getattr(_DECODER, "scan_once"),  # noqa: B009
    _frozen_object,
    _frozen_tree,
)
event_from_row: Final[RowDecoder] = _row_decoder(_load_stored, trusted_event)
"""Decode an event stored as columns (``data`` as JSON text): the fast path of
recovery. Only the rules a stored row could still break are checked (type, time,
``surface_op``), all at decoding: a corrupt row is found when it is read.
Raises `CodecError` (``.field`` names the column) for a malformed one."""

_load_passing = _stored_loader(
    getattr(_PASSING_DECODER, "scan_once"),  # noqa: B009
    _passing_object,
    _passing_tree,
)
passing_event_from_row: Final[RowDecoder] = _row_decoder(_load_passing, passing_event)
"""`event_from_row` for rows read to be looked at and dropped (a reader's cold read):
the same checks; the values are left to the cyclic collector, which costs a value
that dies young nothing, where taking each out of it costs a C call."""

Row = Sequence[Any]
"""A stored event's columns: ``(seq, type, time, data)``."""

_FAST_REFUSALS: Final = (ValueError, TypeError, msgspec.MsgspecError, RecursionError)
"""What reading a row's time or data on the fast path may raise (the row is then read
by the row decoder, which says what is wrong or reads it)."""


def _rows_decoder(
    one: RowDecoder, make: Callable[[int, EventType, datetime, Any, Replace | None], Event]
) -> Callable[[Iterable[Row]], list[Event]]:
    def events_from_rows(rows: Iterable[Row]) -> list[Event]:
        """``[event_from_row(*row) for row in rows]``, in one loop.

        The common row (an int seq, a known type, a time in UTC, data that msgspec
        reads as an object without a ``surface_op``) becomes its event here, as the
        row decoder makes it (holding its checked text); any other row is handed to
        the row decoder, whose event or `CodecError` it is.

        Raises:
            CodecError: a row is malformed; ``.field`` names its column.
        """
        out: list[Event] = []
        append = out.append
        lookup, fromiso, decode = EVENT_TYPES, _fromisoformat, _FAST_DECODE
        for seq, type_, time, data in rows:
            etype = lookup.get(type_) if type_of(seq) is int and type_of(data) is str else None
            if etype is not None and seq >= 0:
                try:
                    t = fromiso(time)
                    value = decode(data)  # the whole text is checked here, at reading
                except _FAST_REFUSALS:
                    value = None
                if type_of(value) is dict and t.tzinfo is UTC and value.get("surface_op") is None:
                    append(make(seq, etype, t, data, None))  # held as text, frozen when read
                    continue
            append(one(seq, type_, time, data))
        return out

    return events_from_rows


events_from_rows: Final = _rows_decoder(event_from_row, trusted_event)
"""``[event_from_row(*row) for row in rows]`` in one loop (recovery's read): the same
events, the same `CodecError` for the first malformed row."""

passing_events_from_rows: Final = _rows_decoder(passing_event_from_row, passing_event)
"""``[passing_event_from_row(*row) for row in rows]`` in one loop (a reader's read)."""


def _load_held(text: str, seq: int, tracked: bool) -> FrozenDict:
    """The data of an event that holds its stored text (checked when it was read)."""
    frozen: FrozenDict = (_load_passing if tracked else _load_stored)(text, seq)
    return frozen


class _MessageFields(msgspec.Struct):
    """What a surface event's projection reads of its data (DESIGN.md §3); msgspec
    skips every other key, and a key given twice is its last value, as in a dict."""

    content: Any = None
    reasoning_content: Any = None
    tool_calls: Any = None
    tool_call_id: Any = None
    name: Any = None
    metadata: Any = None


_FIELDS_DECODE: Final[Callable[[str], _MessageFields]] = msgspec.json.Decoder(
    _MessageFields
).decode


def _held_fields(text: str, seq: int, tracked: bool) -> MessageFields | None:
    """The message's fields out of an event's held text, each frozen as its data's
    would be; ``None`` should msgspec refuse the text here (say, nesting past this
    thread's recursion limit): the caller reads the whole data then."""
    try:
        f = _FIELDS_DECODE(text)
    except (msgspec.MsgspecError, RecursionError, UnicodeError):
        return None
    tree, items = _passing_freezers if tracked else _freezers
    return _frozen_fields(
        f.content, f.reasoning_content, f.tool_calls, f.tool_call_id, f.name, f.metadata,
        tree, items,
    )  # fmt: skip


def _frozen_fields(
    content: Any,
    reasoning: Any,
    calls: Any,
    call_id: Any,
    name: Any,
    meta: Any,
    tree: Callable[[dict[str, Any]], FrozenDict],
    items: Callable[[list[Any]], FrozenList],
) -> MessageFields:
    """A message's fields as decoded (plain dicts and lists of exact JSON types, which
    nothing else holds), each frozen as its data's would be."""
    # Text and None are the rule; any other value that is a container is frozen.
    if type_of(content) is not str and content is not None:
        content = _frozen_any(content, tree, items)
    if calls is not None:
        calls = _frozen_any(calls, tree, items)
    if meta is not None:
        meta = _frozen_any(meta, tree, items)
    if type_of(reasoning) is not str and reasoning is not None:
        reasoning = _frozen_any(reasoning, tree, items)
    if type_of(call_id) is not str and call_id is not None:
        call_id = _frozen_any(call_id, tree, items)
    if type_of(name) is not str and name is not None:
        name = _frozen_any(name, tree, items)
    return content, reasoning, calls, call_id, name, meta


def _frozen_any(
    v: Any,
    tree: Callable[[dict[str, Any]], FrozenDict],
    items: Callable[[list[Any]], FrozenList],
) -> Any:
    """``v`` frozen; an empty object or list is the shared empty one (a seeded message's
    ``metadata`` and ``tool_calls`` mostly are)."""
    t = type_of(v)
    if t is dict:
        return tree(v) if v else EMPTY_DICT
    if t is list:
        return items(v) if v else EMPTY_LIST
    return v


install_held_readers(_load_held, _held_fields)


# -- a cold read: rows straight to the surface ----------------------------------------------

_KINDS: Final[dict[object, Role | None]] = {
    t.value: ROLE_OF.get(t) for t in EventType
}  # a type's text: its role, None for a bookkeeping type; absent if unknown
_SURFACE_POS: Final = itemgetter(1)
_SURFACE_OP: Final = itemgetter(2)


def surface_from_rows(rows: Sequence[Row]) -> tuple[list[int], list[Message]]:
    """The surface of a session's stored rows (in seq order), projected: the seqs and the
    messages of ``Log.restore(passing_events_from_rows(rows)).derive_indexed()``, for a
    read that keeps only the messages (a reader's cold read).

    Every row is checked as `event_from_row` checks it before anything is returned, but
    no event is built: each row's data is decoded once, and only the messages that are
    visible are made. A row that needs more than the common path (a time not in UTC,
    data msgspec refuses, a malformed column) sends every row down the plain one
    (events, then the fold of a `Log`), which reads it or says what is wrong.

    Raises:
        CodecError: a row is malformed; ``.field`` names its column.
        InvalidEvent: ``seq_behind_head``: the seqs do not increase.
    """
    fast = _fast_surface(rows)
    if fast is not None:
        return fast
    pairs = Log.restore(passing_events_from_rows(rows)).derive_indexed()
    return [seq for seq, _ in pairs], [m for _, m in pairs]


_Found = tuple[int, int, "Replace | None", Role, datetime, "_RowFields"]
"""A surface row on the fast path: seq, position, replace, role, time, its fields."""


class _RowFields(_MessageFields, forbid_unknown_fields=True, gc=False):
    """A surface row's data when it holds no key but a message's and ``surface_op``:
    then decoding it into this reads (and checks) the whole text, as decoding it whole
    does, and gives the fields without a dict. Never on a cycle (decoded JSON only)."""

    surface_op: Any = None


_ROW_FIELDS_DECODE: Final[Callable[[str], _RowFields]] = msgspec.json.Decoder(_RowFields).decode


def _row_fields(data: str) -> _RowFields | None:
    """The fields of a row's data that holds other keys too (read whole), or ``None``
    if it is not an object msgspec reads."""
    try:
        value = _FAST_DECODE(data)
    except _FAST_REFUSALS:
        return None
    if type_of(value) is not dict:
        return None
    get = value.get
    return _RowFields(
        get("content"), get("reasoning_content"), get("tool_calls"),
        get("tool_call_id"), get("name"), get("metadata"), get("surface_op"),
    )  # fmt: skip


def _fast_surface(rows: Sequence[Row]) -> tuple[list[int], list[Message]] | None:
    """`surface_from_rows` for rows that all take the common path; ``None`` if one does
    not (nothing is returned from a partial read)."""
    found: list[_Found] = []
    append = found.append
    kinds, fromiso, decode, decode_fields = (
        _KINDS,
        _fromisoformat,
        _FAST_DECODE,
        _ROW_FIELDS_DECODE,
    )
    replaces = False
    last = -1
    for seq, type_, time, data in rows:
        if type_of(seq) is not int or seq <= last or type_of(data) is not str:
            return None
        last = seq
        try:
            role = kinds[type_]  # None for a bookkeeping type
            t = fromiso(time)
        except (KeyError, ValueError, TypeError):  # an unknown type, a time to look at
            return None
        if t.tzinfo is not UTC:
            return None
        if role is None:  # a bookkeeping row: checked whole, and it may not hold an op
            try:
                value = decode(data)
            except _FAST_REFUSALS:
                return None
            if type_of(value) is not dict or value.get("surface_op") is not None:
                return None
            continue
        f: _RowFields | None
        try:
            f = decode_fields(data)  # the whole text is checked here
        except msgspec.ValidationError:  # a key beyond a message's (or not an object)
            f = _row_fields(data)
        except _FAST_REFUSALS:
            return None
        if f is None:
            return None
        raw_op = f.surface_op
        if raw_op is not None:
            try:
                op = parse_surface_op(raw_op)
            except InvalidEvent:
                return None
            if op is not None:
                replaces = True
                append((seq, op.start, op, role, t, f))
                continue
        append((seq, seq, None, role, t, f))
    if replaces:  # the fold of DESIGN.md §3 (bookkeeping rows neither shadow nor show)
        flags = shadowed(found, len(found), _SURFACE_POS, _SURFACE_OP)
        found = [f for f, hidden in zip(found, flags, strict=True) if not hidden]
        found.sort(key=_SURFACE_POS)  # stable: ties keep seq order
    tree, items = _passing_freezers  # messages read to be dropped, as a passing event's
    messages: list[Message] = []
    append_message = messages.append
    for _, _, _, role, t, f in found:
        content, reasoning, calls = f.content, f.reasoning_content, f.tool_calls
        call_id, name, meta = f.tool_call_id, f.name, f.metadata
        if (
            type_of(content) is not str
            or calls is not None
            or meta is not None
            or reasoning is not None
            or call_id is not None
            or name is not None
        ):  # more than text alone (which has nothing to freeze)
            content, reasoning, calls, call_id, name, meta = _frozen_fields(
                content, reasoning, calls, call_id, name, meta, tree, items
            )
        append_message(
            trusted_message(
                role, content, reasoning, EMPTY_LIST if calls is None else calls,
                call_id, name, EMPTY_DICT if meta is None else meta, t,
            )
        )  # fmt: skip
    return [f[0] for f in found], messages


_fromisoformat: Final = datetime.fromisoformat


def event_from_dict(record: Any, *, line: int | None = None) -> Event:
    """Decode one event record.

    Raises:
        CodecError: the record is not an object with exactly ``seq``, ``type``,
            ``time`` and ``data``, or a field is malformed; ``.field`` names it.
    """
    if not isinstance(record, Mapping):
        _fail(f"an event record must be a JSON object, got {type(record).__name__}", line, None)
    missing = [f for f in _FIELDS if f not in record]
    if missing:
        _fail(f"event record lacks {', '.join(missing)}", line, missing[0])
    extra = sorted(str(k) for k in record if k not in _FIELD_SET)
    if extra:
        _fail(
            f"unknown field(s) {', '.join(extra)} in event record; "
            "expected exactly seq, type, time, data",
            line,
            extra[0],
        )
    seq, etype, raw_time, data = (record[f] for f in _FIELDS)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        _fail(f"'seq' must be an int >= 0, got {seq!r}", line, "seq")
    if seq > MAX_SEQ:
        raise CodecError(
            f"invalid_event: seq {seq} is past the last seq a store keeps, 2**63 - 1",
            line=line,
            field="seq",
            reason="invalid_event",
        )
    if not isinstance(etype, str):
        _fail(f"'type' must be a string, got {type(etype).__name__}", line, "type")
    if not isinstance(raw_time, str):
        _fail(f"'time' must be an ISO-8601 string, got {type(raw_time).__name__}", line, "time")
    try:
        t = datetime.fromisoformat(raw_time)
    except ValueError:
        _fail(f"'time' is not ISO-8601: {raw_time!r}", line, "time")
    if t.tzinfo is None:
        _fail(f"'time' has no UTC offset: {raw_time!r}", line, "time")
    if not isinstance(data, Mapping):
        _fail(f"'data' must be a JSON object, got {_json_kind(data)}", line, "data")
    try:
        return Event(seq, etype, t, data)
    except InvalidEvent as exc:
        field = {"unknown_event_type": "type", "invalid_event": "time"}.get(exc.reason, "data")
        raise CodecError(
            f"{exc.reason}: {exc}", line=line, field=field, reason=exc.reason
        ) from None


def loads_event(text: str | bytes, *, line: int | None = None) -> Event:
    """Decode one JSON line into an `Event`.

    Raises:
        CodecError: not JSON, or not a valid event record.
    """
    return event_from_dict(_json_loads(text, line), line=line)


def iter_jsonl(log: Log) -> Iterator[str]:
    """Each retained event of ``log`` as a JSON line (without the newline)."""
    for ev in log.events():
        yield dumps_event(ev)


def to_jsonl(log: Log) -> str:
    """The whole log as JSON Lines, one event a line, each ending in a newline."""
    return "".join(line + "\n" for line in iter_jsonl(log))


def from_jsonl(lines: str | Iterable[str]) -> Log:
    """Rebuild a log from JSON Lines, each event under its persisted seq.

    Blank lines are ignored.

    Raises:
        CodecError: a line is malformed or its seq does not increase; ``.line``
            is its 1-based number.
    """
    if isinstance(lines, str):
        # Only "\n" ends a record: str.splitlines() would also split inside a
        # string holding U+2028 or U+0085, which JSON leaves unescaped.
        lines = lines.split("\n")
    lg = Log()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        ev = loads_event(text, line=number)
        if ev.seq < lg.count():
            _fail(
                f"seq {ev.seq} is not after the previous event (next free seq is {lg.count()}); "
                "records must be in increasing seq order",
                number,
                "seq",
            )
        lg = lg.append_event(ev)
    return lg


def message_to_dict(message: Message) -> dict[str, Any]:
    """The message as a plain dict of its fields (``created_at`` as ISO-8601)."""
    return {
        "role": message.role.value,
        "content": thaw(message.content),
        "reasoning_content": message.reasoning_content,
        "tool_calls": thaw(message.tool_calls),
        "tool_call_id": message.tool_call_id,
        "name": message.name,
        "metadata": thaw(message.metadata),
        "created_at": format_time(message.created_at),
    }


def message_from_dict(record: Any, *, index: int | None = None) -> Message:
    """Decode a message dict: this library's field shape or the OpenAI shape.

    Raises:
        CodecError: malformed; ``.line`` is ``index + 1`` when given.
    """
    line = None if index is None else index + 1
    if not isinstance(record, Mapping):
        _fail(f"a message must be a JSON object, got {type(record).__name__}", line, None)
    created_raw = record.get("created_at")
    created: datetime | None = None
    if created_raw is not None:
        try:
            created = datetime.fromisoformat(created_raw)
        except (TypeError, ValueError):
            _fail(f"'created_at' is not ISO-8601: {created_raw!r}", line, "created_at")
    # Message takes tool calls in either shape, so only keys outside its own
    # fields, or a role only OpenAI's shape has (``developer``: a system message that
    # remembers its role, DESIGN.md §1), mark an OpenAI record (a record of ours
    # round-trips as it is).
    openai_shape = not set(record) <= _MESSAGE_FIELDS or record.get("role") == "developer"
    try:
        if openai_shape:
            plain = {k: v for k, v in record.items() if k not in ("metadata", "created_at")}
            m = Message.from_openai(plain, created_at=created)
            meta = record.get("metadata")
            if meta:
                m = Message(**{**_fields(m), "metadata": {**m.metadata, **meta}})
            return m
        kwargs = {k: v for k, v in record.items() if k != "created_at"}
        if created is not None:
            kwargs["created_at"] = created
        return Message(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, CodecError):
            raise
        _fail(str(exc), line, None)


_MESSAGE_FIELDS = frozenset(
    {
        "role",
        "content",
        "reasoning_content",
        "tool_calls",
        "tool_call_id",
        "name",
        "metadata",
        "created_at",
    }
)


def _fields(m: Message) -> dict[str, Any]:
    return {f: getattr(m, f) for f in _MESSAGE_FIELDS}


def from_v1(messages: Iterable[Any]) -> Log:
    """Seed a log from a v1 transcript: a list of message dicts (see `message_from_dict`).

    Raises:
        CodecError: a message is malformed; ``.line`` is its 1-based index.
    """
    return Log.seed(message_from_dict(m, index=i) for i, m in enumerate(messages))


def loads(text: str) -> Log:
    """Decode a whole stored session: JSON Lines, or a v1 JSON list of messages.

    Raises:
        CodecError: the input is neither, or a record in it is malformed.
    """
    if text.lstrip().startswith("["):
        data = _json_loads(text, None)
        if not isinstance(data, list):
            _fail("a v1 transcript must be a JSON list of messages", None, None)
        return from_v1(data)
    return from_jsonl(text)
