"""Deeply immutable JSON values.

History never changes, so whatever enters a log is copied once into
`FrozenDict` and `FrozenList`.  They subclass ``dict`` and
``list`` so that they compare equal to plain JSON values, serialise with the
standard ``json`` module and pass ``isinstance(x, dict)`` checks, but every
mutating method raises `TypeError` and says how to make a changed copy.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

__all__ = [
    "FrozenDict",
    "FrozenList",
    "NotJSON",
    "describe_error",
    "freeze",
    "short_repr",
    "thaw",
]


def _keep_tracked(value: object) -> None:
    """Where the collector cannot be told (not CPython): leave ``value`` tracked."""


def _gc_untracker() -> Callable[[object], None]:
    """CPython's ``PyObject_GC_UnTrack``, or a no-op where it cannot be called.

    Frozen values, events and the messages projected from them are trees of
    immutable values: nothing in them can ever point back at them, so they
    cannot be part of a reference cycle, and refcounting alone frees them. The
    cyclic collector would still visit every one of them at each full
    collection (a long session holds hundreds of thousands); untracked, it
    never does. CPython untracks an exact ``tuple`` or ``dict`` of atoms the
    same way; it cannot see that a frozen subclass is as safe.
    """
    if sys.implementation.name != "cpython":
        return _keep_tracked
    try:
        import ctypes

        fn = ctypes.pythonapi.PyObject_GC_UnTrack
    except (ImportError, AttributeError, OSError):  # a build without ctypes
        return _keep_tracked
    fn.argtypes = [ctypes.py_object]
    fn.restype = None
    return fn


untrack: Callable[[object], None] = _gc_untracker()
"""Take a value that can never be on a reference cycle out of the cyclic collector.

Only for instances of types the collector knows (a dict or list subclass, a class
with ``__slots__``): CPython reads the collector's header of whatever it is given,
and an object without one (``object()``, an int) would crash the interpreter."""


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


class FrozenDict(dict[str, Any]):
    """A ``dict`` that cannot be changed; equal to the plain dict it came from.

    >>> d = FrozenDict({"a": 1})
    >>> d == {"a": 1}
    True
    >>> d["a"] = 2
    Traceback (most recent call last):
    ...
    TypeError: FrozenDict is immutable (it is part of an append-only log); ...
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> FrozenDict:
        # Deep-freeze (and so validate) whatever is given; __init__ does nothing,
        # so calling it again on a FrozenDict cannot change it.
        self = dict.__new__(cls)
        try:
            plain = dict(*args, **kwargs)
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:
            raise NotJSON("FrozenDict", _unreadable(args[0] if args else kwargs, exc)) from exc
        dict.update(self, freeze(plain, "FrozenDict"))
        untrack(self)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

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

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        return (FrozenDict, (dict(self),))


class FrozenList(list[Any]):
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
        untrack(self)
        return self

    def __init__(self, iterable: Iterable[Any] = ()) -> None:
        pass

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

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:
        return (FrozenList, (list(self),))


_new_dict = dict.__new__
_fill_dict = dict.update


def _dict_of(items: dict[str, Any]) -> FrozenDict:
    """A FrozenDict over already frozen values (no second walk)."""
    fd: FrozenDict = _new_dict(FrozenDict)
    _fill_dict(fd, items)
    untrack(fd)
    return fd


def _list_from(items: list[Any]) -> FrozenList:
    """A FrozenList over already frozen values (no second walk)."""
    fl = list.__new__(FrozenList)
    list.extend(fl, items)
    untrack(fl)
    return fl


EMPTY_DICT = _dict_of({})
EMPTY_LIST = _list_from([])


class NotJSON(TypeError):
    """A value JSON cannot carry; ``path`` names where it sits."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


def _list_of(items: Iterable[Any], path: str) -> FrozenList:
    out = [_freeze(v, f"{path}[{i}]") for i, v in enumerate(items)]
    return _list_from(out) if out else EMPTY_LIST


def freeze(value: Any, path: str = "value") -> Any:
    """Return a deeply immutable copy of the JSON value ``value``.

    Reading ``value`` runs the caller's code (a mapping's ``items``, a list
    subclass's ``__iter__``, ...). Whatever that raises (an ``Exception``,
    ``RecursionError`` included) becomes `NotJSON` naming the container
    that could not be read; nothing else escapes.

    Raises:
        NotJSON: something at ``path`` (or below it) is not a JSON value:
            a non-``str`` key, a set, bytes, an arbitrary object, NaN or ±inf,
            a container that raises when read, or nesting so deep (or cyclic)
            that it cannot be walked.
    """
    try:
        return _freeze(value, path)
    except RecursionError:
        raise NotJSON(
            path,
            "nested too deeply (or it contains itself, or reading it recursed without end); "
            "JSON values must be finite trees",
        ) from None


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


def _freeze(value: Any, path: str) -> Any:
    t = type(value)
    if t is str:
        return _check_text(value, path)
    if t is int or t is bool or value is None:
        return value
    if t is float:
        if math.isfinite(value):
            return value
        raise NotJSON(path, f"{value!r} is not a JSON number; use a finite float or None")
    if t is FrozenDict or t is FrozenList:
        return value
    try:  # free unless raised; the caller's own code runs below (items, __iter__, ...)
        if t is dict or isinstance(value, Mapping):
            out: dict[str, Any] = {}
            converted: set[str] | None = None  # keys that were str subclasses
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
                    out[k] = v if v.isascii() else _check_text(v, f"{path}[{k!r}]")
                elif tv is int or tv is bool or v is None:
                    out[k] = v
                else:
                    out[k] = _freeze(v, f"{path}[{k!r}]")
            if not out:
                return EMPTY_DICT
            fd = _new_dict(FrozenDict)  # _dict_of, inline: this is every append's path
            _fill_dict(fd, out)
            untrack(fd)
            return fd
        if t is list or t is tuple or isinstance(value, (list, tuple)):
            return _list_of(value, path)
        if isinstance(value, str):
            return _check_text(str.__str__(value), path)
        if isinstance(value, int):
            return int.__int__(value)
        if isinstance(value, float):
            return _freeze(float.__float__(value), path)
    except (NotJSON, RecursionError, MemoryError):
        raise
    except Exception as exc:
        raise NotJSON(path, _unreadable(value, exc)) from None
    raise NotJSON(
        path,
        f"{_type_name(value)} value {short_repr(value)} is not JSON; "
        "use str, int, float, bool, None, list or a dict with str keys",
    )


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
