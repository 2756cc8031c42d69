"""Deeply immutable JSON values.

History never changes, so whatever enters a log is copied once into
`FrozenDict` and `FrozenList`.  They subclass ``dict`` and
``list`` so that they compare equal to plain JSON values, serialise with the
standard ``json`` module and pass ``isinstance(x, dict)`` checks, but every
mutating method raises `TypeError` and says how to make a changed copy.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

import msgspec

from nous_actor.core.limits import INT_BOUND, MAX_DATA_DEPTH, MAX_INT_DIGITS

__all__ = [
    "FrozenDict",
    "FrozenList",
    "NotJSON",
    "describe_error",
    "encode_json",
    "freeze",
    "freeze_measured",
    "short_repr",
    "thaw",
]


def _keep_tracked(value: object) -> None:
    """Where the collector cannot be told (not CPython): leave ``value`` tracked."""


def _recursion_errors() -> tuple[type[BaseException], ...]:
    """What running out of recursion raises: ``RecursionError``, or ctypes' ``ArgumentError``
    when it happens while `untrack`'s argument is converted (in a decoder's hook)."""
    try:
        from ctypes import ArgumentError
    except ImportError:  # a build without ctypes
        return (RecursionError,)
    return (RecursionError, ArgumentError)


RECURSION_ERRORS: Final = _recursion_errors()


_T = TypeVar("_T")

_UNTRACKABLE: Final[set[type]] = set()
"""The exact types whose instances `untrack` takes out of the collector (`untrackable`)."""


def untrackable(cls: type[_T]) -> type[_T]:
    """Let `untrack` take instances of exactly ``cls`` out of the cyclic collector: an
    immutable type with ``__slots__`` (or a dict or list subclass without a ``__dict__``)
    whose instances hold only values that cannot refer back to them. A subclass is
    never taken out (it may gain a ``__dict__``, and with it a cycle)."""
    _UNTRACKABLE.add(cls)
    return cls


def _gc_untrackers() -> tuple[Callable[[object], None], Callable[[object], None]]:
    """`untrack` and `_untrack_exact`: CPython's ``PyObject_GC_UnTrack`` for instances of
    the `untrackable` types, or no-ops where it cannot be called.

    Frozen values, events and the messages projected from them are trees of
    immutable values: nothing in them can ever point back at them, so they
    cannot be part of a reference cycle, and refcounting alone frees them. The
    cyclic collector would still visit every one of them at each full
    collection (100k events whose data and messages were read: 110 ms a full
    collection tracked, 57 ms untracked); untracked, it never does. CPython
    untracks an exact ``tuple`` or ``dict`` of atoms the same way; it cannot see
    that a frozen subclass is as safe.

    Anything else given is left as it is: CPython's function reads the collector's
    header of whatever it is handed, and an object without one (an int, a string)
    would be memory it does not own, so only the exact registered types, all of
    which the collector knows, ever reach it.
    """
    if sys.implementation.name != "cpython":
        return _keep_tracked, _keep_tracked
    try:
        import ctypes

        fn = ctypes.pythonapi.PyObject_GC_UnTrack
    except (ImportError, AttributeError, OSError):  # a build without ctypes
        return _keep_tracked, _keep_tracked
    fn.argtypes = [ctypes.py_object]
    fn.restype = None
    allowed = _UNTRACKABLE

    def untrack(value: object) -> None:
        if type(value) in allowed:
            fn(value)

    return untrack, fn


untrack, _untrack_exact = _gc_untrackers()
# `untrack`: take a value that can never be on a reference cycle out of the cyclic
# collector: an instance of exactly one of the `untrackable` types (anything else is
# left tracked).
# `_untrack_exact`: `untrack` without its check, for a FrozenDict or FrozenList its caller
# has just made as exactly that type (`_new_dict(FrozenDict)`, `list.__new__(FrozenList)`):
# the hot paths of freezing and decoding, where the check (a call and a lookup, about
# 80 ns) cost 8% of a plain `Log.append` and 6% of decoding JSON lines.


def _refuse_dict(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        "FrozenDict is immutable (it is part of an append-only log); "
        "build a changed copy instead, e.g. {**value, key: new}"
    )


def _refuse_list(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        "FrozenList is immutable (it is part of an append-only log); "
        "build a changed copy instead, e.g. [*value, item]"
    )


class _BuiltOnce(type):
    """The metaclass of FrozenDict and FrozenList: ``cls(...)`` builds the value in
    ``__new__`` alone, so ``__init__`` (which would fill it again) is never part of
    construction, and called on a built value it refuses."""

    if not TYPE_CHECKING:  # to a type checker, construction is __new__'s, as it is

        def __call__(cls, *args, **kwargs):
            return cls.__new__(cls, *args, **kwargs)


def _refuse_init(self: object, *args: object, **kwargs: object) -> NoReturn:
    name = type(self).__name__
    raise TypeError(
        f"{name} is immutable: it was built already, and __init__ cannot build it again; "
        f"make a new one, e.g. {name}(...)"
    )


@untrackable
class FrozenDict(dict[str, Any], metaclass=_BuiltOnce):
    """A ``dict`` that cannot be changed; equal to the plain dict it came from.

    >>> d = FrozenDict({"a": 1})
    >>> d == {"a": 1}
    True
    >>> d["a"] = 2
    Traceback (most recent call last):
    ...
    TypeError: FrozenDict is immutable (it is part of an append-only log); ...

    A subclass is kept by the cyclic collector (it may gain a ``__dict__``, so
    it can be on a cycle); only FrozenDict itself is taken out of it.
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> FrozenDict:
        # Deep-freeze (and so validate) whatever is given; the metaclass never calls
        # __init__, which refuses: a built FrozenDict cannot be filled again.
        self = dict.__new__(cls)
        try:
            plain = dict(*args, **kwargs)
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:
            raise NotJSON("FrozenDict", _unreadable(args[0] if args else kwargs, exc)) from exc
        dict.update(self, freeze(plain, "FrozenDict"))
        untrack(self)  # (a subclass stays tracked: see `untrackable`)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse_init(self)  # construction never calls it (see _BuiltOnce)

    __setitem__ = _refuse_dict
    __delitem__ = _refuse_dict
    __ior__ = _refuse_dict
    clear = _refuse_dict
    pop = _refuse_dict
    popitem = _refuse_dict
    setdefault = _refuse_dict
    update = _refuse_dict

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # Its values unpickle frozen already (each by its own reduce): no second walk.
        return (_dict_of, (dict(self),))


@untrackable
class FrozenList(list[Any], metaclass=_BuiltOnce):
    """A ``list`` that cannot be changed; equal to the plain list it came from.

    >>> FrozenList([1, 2]) == [1, 2]
    True
    """

    __slots__ = ()

    def __new__(cls, iterable: Iterable[Any] = ()) -> FrozenList:
        self = list.__new__(cls)
        try:
            plain = list(iterable)
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:
            raise NotJSON("FrozenList", _unreadable(iterable, exc)) from exc
        list.extend(self, freeze(plain, "FrozenList"))
        untrack(self)  # (a subclass stays tracked: see `untrackable`)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse_init(self)  # construction never calls it (see _BuiltOnce)

    __setitem__ = _refuse_list
    __delitem__ = _refuse_list
    __iadd__ = _refuse_list
    __imul__ = _refuse_list
    append = _refuse_list
    extend = _refuse_list
    insert = _refuse_list
    pop = _refuse_list
    remove = _refuse_list
    reverse = _refuse_list
    sort = _refuse_list
    clear = _refuse_list

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenList:
        return self

    def __reduce__(self) -> tuple[Any, tuple[list[Any]]]:
        # Its items unpickle frozen already (each by its own reduce): no second walk.
        return (_list_from, (list(self),))


_new_dict = dict.__new__
_fill_dict = dict.update


def _dict_of(items: dict[str, Any]) -> FrozenDict:
    """A FrozenDict over already frozen values (no second walk)."""
    fd: FrozenDict = _new_dict(FrozenDict)
    _fill_dict(fd, items)
    _untrack_exact(fd)
    return fd


def _list_from(items: list[Any]) -> FrozenList:
    """A FrozenList over already frozen values (no second walk)."""
    fl: FrozenList = list.__new__(FrozenList)
    list.extend(fl, items)
    _untrack_exact(fl)
    return fl


EMPTY_DICT = _dict_of({})
EMPTY_LIST = _list_from([])


class NotJSON(TypeError):
    """A value JSON cannot carry; ``path`` names where it sits."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


_SMALL: Final = 2**64
"""Ints in ``-_SMALL < n < _SMALL`` (at most 20 digits) need no look at their length."""

Meter = list[int]
"""What `freeze_measured` counted, in one number (one addition a container): the
weight ``chars + 6 * entries``, where ``chars`` are the characters of every key,
string and long int, and ``entries`` the entries of every object and array."""


def json_size_bounds(meter: Meter) -> tuple[int, int]:
    """Bounds ``(low, high)`` of the UTF-8 size of the compact JSON of a value
    `freeze_measured` counted.

    Each counted character takes one to six bytes (``\\u001f``, a 4-byte UTF-8
    character, ``\\"``) and each entry at least one byte besides them (a comma,
    a digit, a bracket) and at most 32 (quotes, colon, comma and a number of at
    most 24 characters, a literal or a container's brackets); the outermost
    brackets add 2. So the size is at least ``weight / 6`` and at most
    ``6 * weight + 2``.
    """
    weight = meter[0]
    return weight // 6, 6 * weight + 2


def freeze(value: Any, path: str = "value") -> Any:
    """Return a deeply immutable copy of the JSON value ``value``.

    Reading ``value`` runs the caller's code (a mapping's ``items``, a list
    subclass's ``__iter__``, ...). Each container is read once, and what is
    returned is what was read and checked. Whatever that reading raises (an
    ``Exception``, ``RecursionError`` included) becomes `NotJSON` naming the
    container that could not be read; nothing else escapes. Keys and strings
    come back as exact ``str``, numbers as exact ``int``/``float``.

    Raises:
        NotJSON: something at ``path`` (or below it) is not a JSON value:
            a non-``str`` key, a set, bytes, an arbitrary object, NaN or ±inf,
            an int of more than `MAX_INT_DIGITS` digits, a container that
            raises when read, or nesting deeper than `MAX_DATA_DEPTH`
            containers (a cyclic value is one).
    """
    return freeze_measured(value, path)[0]


def freeze_measured(value: Any, path: str = "value") -> tuple[Any, Meter]:
    """`freeze`, also returning what it counted for `json_size_bounds`, in the same walk."""
    meter: Meter = [0]
    try:
        return _freeze(value, path, MAX_DATA_DEPTH, meter), meter
    except RecursionError:
        raise NotJSON(
            path,
            "could not be walked: reading it recursed without end, or this thread's "
            f"recursion limit ({sys.getrecursionlimit()}) ran out before the value's end "
            f"(values may nest {MAX_DATA_DEPTH} containers deep); JSON values must be "
            "finite trees",
        ) from None


def _too_deep(path: str) -> NoReturn:
    raise NotJSON(
        path,
        f"nested deeper than {MAX_DATA_DEPTH} containers, the limit every reader of the log "
        "accepts (a value that contains itself is one); flatten it, or store the deep "
        "part as a JSON string",
    )


def _big_int(n: int, path: str, meter: Meter) -> int:
    """``n`` (at least 20 digits) if it has at most `MAX_INT_DIGITS` digits; counts them."""
    if -INT_BOUND < n < INT_BOUND:
        meter[0] += int((n.bit_length() - 1) * 0.30102999566398) + 1  # its digits, or fewer
        return n
    raise NotJSON(
        path,
        f"an int of about {int(n.bit_length() * 0.30103)} digits is longer than "
        f"{MAX_INT_DIGITS} digits, the most every reader of the log reads back; "
        "store it as a string",
    )


def _check_text(text: str, path: str) -> str:
    """Refuse a lone surrogate: no UTF-8 encoding (so no JSON text, no database) can hold it."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise NotJSON(
                path,
                f"text holds a lone surrogate {text[exc.start]!r} at index {exc.start}, which "
                "UTF-8 cannot encode; decode bytes with errors='replace' first",
            ) from None
    return text


def _freeze(
    value: Any,
    path: str,
    room: int,
    meter: Meter,
    plain: bool = False,
    _small: int = _SMALL,
    _low: int = -_SMALL,
    _len: Callable[[Any], int] = len,
) -> Any:
    """``value`` frozen; ``room`` is how many more containers deep it may nest (a
    container here takes one), ``meter`` what it weighs (see `Meter`).

    With ``plain``, the same checked copy in plain ``dict`` and ``list`` (a frozen
    container given stays as it is): for a value encoded at once and then dropped
    (`encode_plain`), which no one but the caller of this ever sees.

    (The keyword defaults are locals, not globals: every entry of every append is
    counted and every int compared, so each lookup saved is a saving per append.)
    """
    t = type(value)
    if t is str:
        meter[0] += _len(value)
        return _check_text(value, path)
    if t is int:
        return value if _low < value < _small else _big_int(value, path, meter)
    if t is bool or value is None:
        return value
    if t is float:
        if math.isfinite(value):
            return value
        raise NotJSON(path, f"{value!r} is not a JSON number; use a finite float or None")
    if t is FrozenDict or t is FrozenList:
        _measure(value, path, room, meter)
        return value
    try:  # free unless raised; the caller's own code runs below (items, __iter__, ...)
        if t is dict or isinstance(value, Mapping):
            if not room:
                _too_deep(path)
            out: dict[str, Any] = {}
            converted: set[str] | None = None  # keys that were str subclasses
            weight = 0
            for k, v in value.items():
                if type(k) is not str:
                    if not isinstance(k, str):
                        kr = short_repr(k)
                        raise NotJSON(
                            f"{path}[{kr}]",
                            f"key {kr} of type {_type_name(k)} is not a string; "
                            "JSON objects take str keys only",
                        )
                    k = str.__str__(k)
                    if k in out:
                        _duplicate_key(path, k)
                    if converted is None:
                        converted = set()
                    converted.add(k)
                elif converted is not None and k in converted:
                    _duplicate_key(path, k)
                if not k.isascii():
                    _check_text(k, f"{path}[{k!r}]")
                # Atomic values inline; the path is spelled out only to go deeper.
                tv = type(v)
                if tv is str:
                    weight += _len(k) + _len(v)
                    out[k] = v if v.isascii() else _check_text(v, f"{path}[{k!r}]")
                elif tv is int:
                    weight += _len(k)
                    out[k] = v if _low < v < _small else _big_int(v, f"{path}[{k!r}]", meter)
                elif tv is bool or v is None:
                    weight += _len(k)
                    out[k] = v
                else:
                    weight += _len(k)
                    out[k] = _freeze(v, f"{path}[{k!r}]", room - 1, meter, plain)
            if not out:
                return EMPTY_DICT
            meter[0] += weight + 6 * _len(out)
            if plain:
                return out
            fd = _new_dict(FrozenDict)  # _dict_of, inline: this is every append's path
            _fill_dict(fd, out)
            _untrack_exact(fd)
            return fd
        if t is list or t is tuple or isinstance(value, (list, tuple)):
            if not room:
                _too_deep(path)
            items = [
                _freeze(v, f"{path}[{i}]", room - 1, meter, plain) for i, v in enumerate(value)
            ]
            if not items:
                return EMPTY_LIST
            meter[0] += 6 * _len(items)
            return items if plain else _list_from(items)
        if isinstance(value, str):
            return _freeze(str.__str__(value), path, room, meter)
        if isinstance(value, int):
            return _freeze(int.__int__(value), path, room, meter)
        if isinstance(value, float):
            return _freeze(float.__float__(value), path, room, meter)
    except (NotJSON, RecursionError, MemoryError):
        raise
    except Exception as exc:
        raise NotJSON(path, _unreadable(value, exc)) from None
    raise NotJSON(
        path,
        f"{_type_name(value)} value {short_repr(value)} is not JSON; "
        "use str, int, float, bool, None, list or a dict with str keys",
    )


def _measure(value: FrozenDict | FrozenList, path: str, room: int, meter: Meter) -> None:
    """Weigh an already frozen ``value`` as `_freeze` weighs what it freezes, and hold
    it to the limits where it is put (it may be deep itself, or come from a decoder
    in a process that allowed longer ints)."""
    if not room:
        _too_deep(path)
    weight = 0
    if isinstance(value, FrozenDict):
        for k, v in value.items():
            weight += len(k)
            tv = type(v)
            if tv is str:
                weight += len(v)
            elif tv is int:
                if not -_SMALL < v < _SMALL:
                    _big_int(v, f"{path}[{k!r}]", meter)
            elif tv is FrozenDict or tv is FrozenList:
                _measure(v, f"{path}[{k!r}]", room - 1, meter)
    else:
        for i, v in enumerate(value):
            tv = type(v)
            if tv is str:
                weight += len(v)
            elif tv is int:
                if not -_SMALL < v < _SMALL:
                    _big_int(v, f"{path}[{i}]", meter)
            elif tv is FrozenDict or tv is FrozenList:
                _measure(v, f"{path}[{i}]", room - 1, meter)
    meter[0] += weight + 6 * len(value)


# -- JSON text: one encoder, whatever the recursion limit ---------------------------------

JSON_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
"""The one encoder of stored JSON text: compact, UTF-8 as it is, no NaN."""

_encode_str: Final[Callable[[str], str]] = getattr(json.encoder, "encode_basestring")  # noqa: B009


_FAST_ENCODE: Final[Callable[[Any], bytes]] = msgspec.json.Encoder().encode


def encode_plain(value: dict[str, Any]) -> str:
    """A value `_freeze` checked and copied with ``plain`` (exact JSON types only) as
    compact JSON text: the same text `encode_json` makes of its frozen twin."""
    try:
        return _FAST_ENCODE(value).decode("utf-8")
    except (TypeError, ValueError, RecursionError):
        return encode_json(value)


def encode_json(value: Any) -> str:
    """``value`` (a frozen or plain JSON value) as compact JSON text.

    A frozen value (exact JSON types, finite floats, text without lone surrogates:
    what freezing checked) is written by msgspec; anything else, or a frozen value
    msgspec cannot write, by the stdlib encoder, whose C part recurses once per
    container: should this thread's recursion limit run out before a value's end (it
    may nest `MAX_DATA_DEPTH` deep), the same text is made without recursion.
    """
    if type(value) is FrozenDict or type(value) is FrozenList:
        try:
            return _FAST_ENCODE(value).decode("utf-8")
        except (TypeError, ValueError, RecursionError):
            pass
    try:
        return JSON_ENCODER.encode(value)
    except RecursionError:
        return "".join(_iter_json(value))


def _atom_json(v: Any) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return _encode_str(v)
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"Out of range float values are not JSON compliant: {v!r}")
        return float.__repr__(v)
    raise TypeError(f"Object of type {type(v).__name__} is not JSON serializable")


def _iter_json(value: Any) -> Iterator[str]:
    """The pieces of ``value``'s compact JSON, walked with a stack of its own."""
    stack: list[tuple[Iterator[Any], bool]] = []  # (entries left, is an object)
    v = value
    while True:
        if isinstance(v, dict):
            yield "{"
            stack.append((iter(dict.items(v)), True))
            first = True
        elif isinstance(v, (list, tuple)):
            yield "["
            stack.append((iter(v), False))
            first = True
        else:
            yield _atom_json(v)
            first = False
        while stack:
            entries, is_object = stack[-1]
            nxt: Any = next(entries, _END)
            if nxt is _END:
                stack.pop()
                yield "}" if is_object else "]"
                first = False
                continue
            if not first:
                yield ","
            if is_object:
                key, v = nxt
                yield _encode_str(key) + ":"
            else:
                v = nxt
            break
        else:
            return


_END: Final = object()


def _duplicate_key(path: str, key: str) -> NoReturn:
    raise NotJSON(
        f"{path}[{key!r}]",
        "two keys of this object read as the same text (a str subclass with its own "
        "__eq__/__hash__); a JSON object holds each key once, so one would be lost",
    )


def _type_name(value: object) -> str:
    try:
        return str.__str__(type(value).__name__)
    except Exception:  # a metaclass with a broken __name__
        return "object"


def _unreadable(value: object, exc: BaseException) -> str:
    return (
        f"{_type_name(value)} raised {describe_error(exc)} when read; "
        "pass plain dicts, lists and scalars (e.g. copy it with dict(...) or list(...) first)"
    )


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"`` of an exception, cut to 100 characters; never raises."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a broken __str__ must not hide the real error
        text = f"{_type_name(exc)} (unprintable)"
    return text if len(text) <= 100 else text[:97] + "..."


def short_repr(value: object) -> str:
    """``repr(value)`` cut to 60 characters; never raises, even for a broken ``__repr__``."""
    try:
        r = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        r = f"<{type(value).__name__}>"
    return r if len(r) <= 60 else r[:57] + "..."


def safe_str(exc: BaseException) -> str:
    """``str(exc)``; never raises, even for a broken ``__str__``."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} with a broken __str__>"


def thaw(value: Any) -> Any:
    """Return a plain, mutable deep copy of a frozen (or plain) JSON value."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value
