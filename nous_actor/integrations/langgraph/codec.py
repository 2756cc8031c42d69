"""How channel values, writes and metadata are kept in event data, and the tail delta.

A value is kept as ``["j", value]`` when it is plain JSON (exactly ``str``,
``int`` within 2**53, finite ``float``, ``bool``, ``None``, ``list``, ``dict``
with ``str`` keys), which reads back equal and costs no serializer; a LangChain
message or a list of them as JSON too (``["m", ...]``, readable in the log), when
that reads back equal; anything else as ``[type, base64]`` of the saver's
serializer (``serde.dumps_typed``, LangGraph's ``JsonPlusSerializer`` unless
told), zlib-compressed (``[type, base85, "z"]``) when it is large and that saves
a fifth.

A channel value that *extends* the one its parent checkpoint held (a list whose
prefix is the parent's list: the ``messages`` channel under ``add_messages``)
is kept as its tail alone (`delta`); `apply` folds a delta back onto the
parent's value. A list that keeps some of the parent's elements otherwise (a
message removed, or replaced by id) is kept as an edit of the parent's list
(`edit`: the runs of the parent's elements it keeps, and its new elements).
Anything else is kept whole.

Whether a value is the one its parent held is decided by what would be stored
(`stored_same`): the same object, or an equal value of the same type whose
stored form is the same (an equal datetime in another time zone, ``Decimal("1.1")``
for ``Decimal("1.10")``, a dict in another key order, ``0.0`` for ``-0.0`` are
changes).
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from nous_actor.core._frozen import thaw
from nous_actor.integrations.langgraph.framework import (
    BaseMessage,
    SerializerProtocol,
    messages_from_dict,
)

__all__ = [
    "JSON_TAG",
    "TAIL",
    "WHOLE",
    "EDIT",
    "WRITTEN",
    "apply",
    "decode",
    "delta",
    "edit",
    "encode",
    "flatten",
    "reads_back_as_is",
    "same",
    "stored_same",
]

JSON_TAG: Final = "j"
"""The type tag of a value kept as plain JSON."""

MESSAGES_TAG: Final = "m"
"""The type tag of a list of LangChain messages kept as JSON: ``["m", [[type, fields],
...]]``, each message's fields those that differ from their defaults (a single message:
``["m", [type, fields], 1]``)."""

WHOLE: Final = "w"
"""A channel entry holding the whole value: ``["w", encoded]``."""

TAIL: Final = "t"
"""A channel entry holding what extends the parent's list: ``["t", encoded tail]``."""

COMPRESSED: Final = "z"
"""The third element of a serialized value kept zlib-compressed, in base85 (JSON-safe, and
smaller than base64): ``[type, base85, "z"]``."""

COMPRESS_FROM: Final = 1024
"""Serialized values of at least this many bytes are compressed when that saves a fifth."""

WRITTEN: Final = "r"
"""A channel entry whose tail is what the parent checkpoint's pending writes to the channel
hold, in LangGraph's order: ``["r", [[task id, idx], ...]]`` (the tail is not kept twice)."""

EDIT: Final = "e"
"""A channel entry holding a list as an edit of the parent's list: ``["e", [run, ...]]``,
each run ``["k", start, stop]`` (the parent's elements ``start:stop``, kept) or ``["n",
encoded list]`` (new elements), in order."""

_INT_LIMIT: Final = 2**53
_MAX_DEPTH: Final = 32


def _plain(value: object, depth: int = 0) -> bool:
    """Whether ``value`` is JSON that reads back as an equal value of the same types."""
    t = type(value)
    if value is None or t is bool or t is str:
        return t is not str or _utf8(value)  # type: ignore[arg-type]
    if t is int:
        return -_INT_LIMIT < value < _INT_LIMIT  # type: ignore[operator]
    if t is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    if depth >= _MAX_DEPTH:
        return False
    if t is list:
        return all(_plain(v, depth + 1) for v in value)  # type: ignore[attr-defined]
    if t is dict:
        return all(
            type(k) is str and _utf8(k) and _plain(v, depth + 1)
            for k, v in value.items()  # type: ignore[attr-defined]
        )
    return False


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _message_fields(value: object) -> list[Any] | None:
    """``[type, fields]`` of a LangChain message, its fields those not at their default,
    when they are plain JSON; else None."""
    if not isinstance(value, BaseMessage):
        return None
    fields = value.model_dump(exclude_defaults=True)
    return [value.type, fields] if _plain(fields) else None


def _messages(value: object) -> list[Any] | None:
    """A message, or a list of messages, kept as JSON (see `MESSAGES_TAG`) when that reads
    back equal to ``value`` (same classes, same fields); else None."""
    if type(value) is list and value:
        kept: list[Any] = []
        for m in value:
            one = _message_fields(m)
            if one is None:
                return None
            kept.append(one)
        form: list[Any] = [MESSAGES_TAG, kept]
    else:
        one = _message_fields(value)
        if one is None:
            return None
        form = [MESSAGES_TAG, one, 1]
    try:
        back = _read_messages(form)
    except Exception:  # a message class LangChain's reader does not know
        return None
    return form if back == value else None


def _read_messages(kept: Sequence[Any]) -> Any:
    if len(kept) > 2:
        return messages_from_dict([{"type": kept[1][0], "data": thaw(kept[1][1])}])[0]
    return messages_from_dict([{"type": t, "data": thaw(d)} for t, d in kept[1]])


def encode(serde: SerializerProtocol, value: Any) -> list[Any]:
    """``value`` in the form an event's data keeps it (see the module docs)."""
    if _plain(value):
        return [JSON_TAG, value]
    messages = _messages(value)
    if messages is not None:
        return messages
    kind, blob = serde.dumps_typed(value)
    if len(blob) >= COMPRESS_FROM:
        packed = zlib.compress(blob, 1)
        if len(packed) * 5 <= len(blob) * 4:
            return [kind, base64.b85encode(packed).decode("ascii"), COMPRESSED]
    return [kind, base64.b64encode(blob).decode("ascii")]


def decode(serde: SerializerProtocol, kept: Sequence[Any]) -> Any:
    """The value `encode` kept as ``kept`` (a fresh, mutable copy)."""
    if kept[0] == JSON_TAG:
        return thaw(kept[1])
    if kept[0] == MESSAGES_TAG:
        return _read_messages(kept)
    if len(kept) > 2 and kept[2] == COMPRESSED:
        blob = zlib.decompress(base64.b85decode(kept[1]))
    else:
        blob = base64.b64decode(kept[1])
    return serde.loads_typed((str(kept[0]), blob))


def same(a: object, b: object) -> bool:
    """Whether ``a`` may stand for ``b``: the same object, or equal values of one type."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an __eq__ that raises: not known to be the same
        return False


def reads_back_as_is(kept: Sequence[Any]) -> bool:
    """Whether the value `encode` kept as ``kept`` reads back as an equal value of the same
    types (plain JSON, LangChain messages), so that the value put may stand for it."""
    return bool(kept[0] == JSON_TAG or kept[0] == MESSAGES_TAG)


def _text(kept: Sequence[Any]) -> str:
    return json.dumps(kept, ensure_ascii=False, separators=(",", ":"))


def stored_same(serde: SerializerProtocol, a: object, b: object, depth: int = 0) -> bool:
    """Whether ``a`` may stand for ``b`` in what is stored: the same object, or equal values
    of one type stored alike: lists and dicts element by element (a dict's keys in the
    same order), floats with the same sign (``-0.0`` is not ``0.0``), any other value
    whose stored form is the same (a datetime in another time zone, ``Decimal("1.1")``
    for ``Decimal("1.10")`` are not)."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    if t is str or t is int or t is bool:
        return bool(a == b)
    if t is float:
        return repr(a) == repr(b)
    if depth < _MAX_DEPTH:
        if t is list:
            x, y = cast(list[Any], a), cast(list[Any], b)
            return len(x) == len(y) and all(
                stored_same(serde, i, j, depth + 1) for i, j in zip(x, y, strict=True)
            )
        if t is dict:
            p, q = cast(dict[Any, Any], a), cast(dict[Any, Any], b)
            return (
                len(p) == len(q)
                and all(stored_same(serde, k, m, depth + 1) for k, m in zip(p, q, strict=True))
                and all(stored_same(serde, p[k], q[k], depth + 1) for k in p)
            )
    if not same(a, b):
        return False
    try:
        return _text(encode(serde, a)) == _text(encode(serde, b))
    except Exception:  # a value the serializer refuses: not known to be the same
        return False


def delta(
    parent: object, value: object, serde: SerializerProtocol | None = None
) -> list[Any] | None:
    """The tail ``value`` adds to ``parent`` when ``value`` is a list that extends the
    list ``parent`` (every element of ``parent`` in its place: `stored_same` given
    ``serde``, else `same`); else ``None``."""
    if type(value) is not list or type(parent) is not list:
        return None
    n = len(parent)
    if len(value) < n:
        return None
    for a, b in zip(value, parent, strict=False):
        if a is b:
            continue
        if not (same(a, b) if serde is None else stored_same(serde, a, b)):
            return None
    return value[n:]


def edit(serde: SerializerProtocol, parent: object, value: object) -> list[list[Any]] | None:
    """``value`` as an edit of ``parent`` when both are lists and ``value`` keeps some of
    ``parent``'s elements in their order: runs ``["k", start, stop]`` (``parent[start:
    stop]`` kept) and ``["n", [new elements]]`` (not yet encoded); else None.

    An element of ``value`` is the parent's element it is (the same object, at or after
    the last kept one: the elements between are removed), else the parent's next
    element when `stored_same`, else new (a message replaced by id is new; the one it
    replaces is not kept)."""
    if type(value) is not list or type(parent) is not list or not parent:
        return None
    where: dict[int, int] = {}
    for at, e in enumerate(parent):
        where.setdefault(id(e), at)
    runs: list[list[Any]] = []
    fresh: list[Any] = []
    i = 0  # the parent's next element
    kept = 0
    n = len(parent)
    for x in value:
        found = where.get(id(x))
        j: int | None
        if found is not None and found >= i and parent[found] is x:
            j = found
        elif i < n and stored_same(serde, x, parent[i]):
            j = i
        else:
            j = None
        if j is None:
            fresh.append(x)
            continue
        if fresh:
            runs.append(["n", fresh])
            fresh = []
        last = runs[-1] if runs else None
        if last is not None and last[0] == "k" and last[2] == j:
            last[2] = j + 1
        else:
            runs.append(["k", j, j + 1])
        i = j + 1
        kept += 1
    if fresh:
        runs.append(["n", fresh])
    return runs if kept else None


def flatten(values: list[Any]) -> list[Any]:
    """Write values as a list channel's reducer appends them: a list's elements, or the
    value itself."""
    out: list[Any] = []
    for v in values:
        if type(v) is list:
            out.extend(v)
        else:
            out.append(v)
    return out


def apply(parent: object, tail: list[Any]) -> list[Any]:
    """``parent`` (a list) extended by ``tail``: a new list."""
    if not isinstance(parent, list):
        raise ValueError(
            "a stored tail extends a channel value that is not a list; the thread's "
            "history is inconsistent (was its log changed by hand?)"
        )
    return [*parent, *tail]


def plain_mapping(value: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict copy of a (frozen) mapping read from an event."""
    out: dict[str, Any] = thaw(value)
    return out
