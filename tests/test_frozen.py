"""FrozenDict and FrozenList: immutable JSON containers that still behave as dict and list."""

from __future__ import annotations

import copy
import json
import pickle
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given

from nous_actor import FrozenDict, FrozenList
from nous_actor.core._frozen import NotJSON, freeze, thaw
from nous_actor.testing import json_values


def _fd() -> FrozenDict:
    return FrozenDict({"a": 1, "b": FrozenList([1, 2])})


def _fl() -> FrozenList:
    return FrozenList([3, 1, 2])


def test_frozen_dict_equals_the_plain_dict() -> None:
    """A FrozenDict compares equal to a plain dict with the same items."""
    assert FrozenDict({"a": 1, "b": [1, 2]}) == {"a": 1, "b": [1, 2]}


def test_frozen_list_equals_the_plain_list() -> None:
    """A FrozenList compares equal to a plain list with the same items."""
    assert FrozenList([1, {"a": 2}]) == [1, {"a": 2}]


def test_frozen_values_pass_isinstance_checks() -> None:
    """FrozenDict is a dict and FrozenList is a list for isinstance checks."""
    assert isinstance(FrozenDict(), dict)
    assert isinstance(FrozenList(), list)


@given(json_values())
def test_freeze_result_equals_its_input(value: Any) -> None:
    """A frozen JSON value compares equal to the value it was frozen from."""
    assert freeze(value) == value


@given(json_values())
def test_json_dumps_of_frozen_value_matches_plain(value: Any) -> None:
    """json.dumps gives the same text for a frozen value as for the plain one."""
    assert json.dumps(freeze(value)) == json.dumps(value)


def test_frozen_dict_hash_ignores_insertion_order() -> None:
    """Equal FrozenDicts built in different key orders hash the same."""
    assert hash(FrozenDict({"a": 1, "b": 2})) == hash(FrozenDict({"b": 2, "a": 1}))


@given(json_values())
def test_equal_frozen_values_hash_equal(value: Any) -> None:
    """Two independently frozen copies of one JSON value are equal and hash equal."""
    a, b = freeze(value), freeze(thaw(value))
    assert a == b
    assert hash(a) == hash(b)


def test_frozen_values_work_as_set_members() -> None:
    """Nested frozen values can be put in a set and found again."""
    members = {freeze({"k": [1, {"x": None}]}), freeze([1, 2])}
    assert freeze({"k": [1, {"x": None}]}) in members
    assert freeze([1, 2]) in members


@pytest.mark.parametrize("make", [_fd, _fl], ids=["dict", "list"])
def test_copy_returns_the_same_object(make: Callable[[], Any]) -> None:
    """copy.copy of a frozen value returns the value itself (it cannot change)."""
    value = make()
    assert copy.copy(value) is value


@pytest.mark.parametrize("make", [_fd, _fl], ids=["dict", "list"])
def test_deepcopy_returns_the_same_object(make: Callable[[], Any]) -> None:
    """copy.deepcopy of a frozen value returns the value itself."""
    value = make()
    assert copy.deepcopy(value) is value


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip_keeps_type_and_value(protocol: int) -> None:
    """Pickling a nested frozen value restores equal values of the frozen types."""
    value = freeze({"a": [1, {"b": [2]}]})
    back = pickle.loads(pickle.dumps(value, protocol))
    assert back == value
    assert type(back) is FrozenDict
    assert type(back["a"]) is FrozenList
    assert type(back["a"][1]) is FrozenDict


_DICT_MUTATIONS: dict[str, Callable[[FrozenDict], object]] = {
    "setitem": lambda d: d.__setitem__("a", 2),
    "setitem_new": lambda d: d.__setitem__("z", 2),
    "delitem": lambda d: d.__delitem__("a"),
    "ior": lambda d: d.__ior__({"z": 1}),
    "clear": lambda d: d.clear(),
    "pop": lambda d: d.pop("a"),
    "pop_default": lambda d: d.pop("missing", None),
    "popitem": lambda d: d.popitem(),
    "setdefault": lambda d: d.setdefault("z", 1),
    "update": lambda d: d.update({"z": 1}),
    "update_kwargs": lambda d: d.update(z=1),
}


@pytest.mark.parametrize("mutate", _DICT_MUTATIONS.values(), ids=_DICT_MUTATIONS.keys())
def test_frozen_dict_refuses_every_mutator(mutate: Callable[[FrozenDict], object]) -> None:
    """Every mutating dict method raises TypeError saying how to build a changed copy."""
    d = _fd()
    with pytest.raises(TypeError, match=r"FrozenDict is immutable.*changed copy.*\{\*\*value"):
        mutate(d)
    assert d == {"a": 1, "b": [1, 2]}


def test_frozen_dict_refuses_augmented_or_assignment() -> None:
    """The |= statement on a FrozenDict raises TypeError and leaves it unchanged."""
    d = _fd()
    with pytest.raises(TypeError, match="FrozenDict is immutable"):
        d |= {"z": 1}
    assert d == {"a": 1, "b": [1, 2]}


def _set_slice(x: FrozenList) -> None:
    x[0:1] = [9]


def _del_slice(x: FrozenList) -> None:
    del x[0:1]


_LIST_MUTATIONS: dict[str, Callable[[FrozenList], object]] = {
    "setitem": lambda x: x.__setitem__(0, 9),
    "setitem_slice": _set_slice,
    "delitem": lambda x: x.__delitem__(0),
    "delitem_slice": _del_slice,
    "iadd": lambda x: x.__iadd__([9]),
    "imul": lambda x: x.__imul__(2),
    "append": lambda x: x.append(9),
    "extend": lambda x: x.extend([9]),
    "insert": lambda x: x.insert(0, 9),
    "pop": lambda x: x.pop(),
    "remove": lambda x: x.remove(1),
    "reverse": lambda x: x.reverse(),
    "sort": lambda x: x.sort(),
    "clear": lambda x: x.clear(),
}


@pytest.mark.parametrize("mutate", _LIST_MUTATIONS.values(), ids=_LIST_MUTATIONS.keys())
def test_frozen_list_refuses_every_mutator(mutate: Callable[[FrozenList], object]) -> None:
    """Every mutating list method raises TypeError saying how to build a changed copy."""
    x = _fl()
    with pytest.raises(TypeError, match=r"FrozenList is immutable.*changed copy.*\[\*value"):
        mutate(x)
    assert x == [3, 1, 2]


def test_frozen_list_refuses_augmented_add() -> None:
    """The += statement on a FrozenList raises TypeError and leaves it unchanged."""
    x = _fl()
    with pytest.raises(TypeError, match="FrozenList is immutable"):
        x += [9]
    assert x == [3, 1, 2]


def test_suggested_dict_copy_gives_a_plain_changed_dict() -> None:
    """The suggested copy, {**value, key: new}, is a plain dict holding the change."""
    d = _fd()
    changed = {**d, "a": 2}
    assert changed == {"a": 2, "b": [1, 2]}
    assert d["a"] == 1


def test_suggested_list_copy_gives_a_plain_changed_list() -> None:
    """The copy the error message suggests, [*value, item], is a plain list with the change."""
    x = _fl()
    changed = [*x, 9]
    changed.append(10)
    assert changed == [3, 1, 2, 9, 10]
    assert x == [3, 1, 2]


def test_freeze_converts_nested_containers() -> None:
    """freeze turns every nested dict, list and tuple into frozen containers."""
    frozen = freeze({"a": [{"b": (1, 2)}]})
    assert type(frozen) is FrozenDict
    assert type(frozen["a"]) is FrozenList
    assert type(frozen["a"][0]) is FrozenDict
    assert type(frozen["a"][0]["b"]) is FrozenList


def test_freeze_copies_so_caller_mutation_does_not_leak() -> None:
    """Mutating the source after freezing never changes the frozen copy."""
    inner = [1]
    source: dict[str, Any] = {"a": inner}
    frozen = freeze(source)
    inner.append(2)
    source["b"] = 3
    assert frozen == {"a": [1]}


@given(json_values())
def test_thaw_gives_plain_mutable_containers(value: Any) -> None:
    """thaw of a frozen value equals it and contains no frozen container at any depth."""
    plain = thaw(freeze(value))
    assert plain == value

    def check(v: Any) -> None:
        assert type(v) not in (FrozenDict, FrozenList)
        if isinstance(v, dict):
            for item in v.values():
                check(item)
        elif isinstance(v, list):
            for item in v:
                check(item)

    check(plain)


def test_freeze_names_the_path_of_a_bad_value() -> None:
    """freeze raises NotJSON whose path points at the offending nested value."""
    with pytest.raises(NotJSON) as info:
        freeze({"a": [0, {"b": b"bytes"}]}, "data")
    assert info.value.path == "data['a'][1]['b']"


# -- values that fail when read ----------------------------------------------------------


class Unprintable(Exception):
    """An exception whose own __str__ raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class RaisingMapping(Mapping[str, Any]):
    """A Mapping whose ``fail`` method raises ``exc`` (``items`` goes through __iter__)."""

    def __init__(self, items: dict[str, Any], fail: str, exc: BaseException) -> None:
        self._items, self._fail, self._exc = items, fail, exc

    def _check(self, name: str) -> None:
        if self._fail == name:
            raise self._exc

    def __getitem__(self, key: str) -> Any:
        self._check("__getitem__")
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        self._check("__iter__")
        return iter(self._items)

    def __len__(self) -> int:
        self._check("__len__")
        return len(self._items)


class RaisingItemsDict(dict[str, Any]):
    def items(self) -> Any:
        raise ValueError("items is broken")


class RaisingList(list[Any]):
    def __iter__(self) -> Iterator[Any]:
        raise ValueError("iteration is broken")


class RaisingTuple(tuple[Any, ...]):
    def __iter__(self) -> Iterator[Any]:
        raise RecursionError("maximum recursion depth exceeded (on purpose)")


class BrokenStr(str):
    """A str whose __str__, __repr__, __hash__ and __eq__ all raise."""

    def __str__(self) -> str:
        raise ValueError("__str__ is broken")

    def __repr__(self) -> str:
        raise ValueError("__repr__ is broken")

    def __hash__(self) -> int:
        raise ValueError("__hash__ is broken")

    def __eq__(self, other: object) -> bool:
        raise ValueError("__eq__ is broken")


class KeyStr(str):
    """A str key whose __hash__, __eq__ and __str__ raise once ``broken`` is set (it must
    hash to enter a dict first)."""

    broken = False

    def _check(self) -> None:
        if KeyStr.broken:
            raise ValueError("broken")

    def __hash__(self) -> int:
        self._check()
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        self._check()
        return str.__eq__(self, other)

    def __str__(self) -> str:
        self._check()
        return str.__str__(self)


class BrokenReprKey:
    """A non-str key (hashable) whose __repr__ raises."""

    def __repr__(self) -> str:
        raise ValueError("__repr__ is broken")


class IdentityStr(str):
    """A str subclass compared by identity: two of them with one text are two keys."""

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


UNREADABLE: list[tuple[Any, str, str]] = [
    (RaisingMapping({"a": 1}, "__iter__", ValueError("boom")), "data['m']", "ValueError: boom"),
    (RaisingMapping({"a": 1}, "__getitem__", KeyError("a")), "data['m']", "KeyError"),
    (RaisingMapping({"a": 1}, "__getitem__", Unprintable()), "data['m']", "unprintable"),
    (RaisingItemsDict(a=1), "data['m']", "ValueError: items is broken"),
    (RaisingList([1, 2]), "data['m']", "ValueError: iteration is broken"),
    ([0, RaisingList([1])], r"data['m'][1]", "iteration is broken"),
    ({"x": RaisingMapping({}, "__iter__", TypeError("t"))}, "data['m']['x']", "TypeError: t"),
]


@pytest.mark.parametrize(
    ("value", "path", "detail"), UNREADABLE, ids=[p for _, p, _ in UNREADABLE]
)
def test_a_container_that_raises_when_read_is_not_json_at_its_path(
    value: Any, path: str, detail: str
) -> None:
    """Whatever the caller's container raises while read becomes NotJSON naming its path."""
    with pytest.raises(NotJSON, match=re.escape(detail)) as info:
        freeze({"m": value}, "data")
    assert info.value.path == path
    assert "raised" in info.value.detail
    assert "pass plain dicts, lists and scalars" in info.value.detail


def test_a_mapping_whose_len_raises_is_still_read() -> None:
    """freeze never asks a mapping's length, so a broken __len__ alone does not matter."""
    assert freeze(RaisingMapping({"a": 1}, "__len__", ValueError("len"))) == {"a": 1}


def test_a_recursion_error_raised_while_reading_is_not_json() -> None:
    """A RecursionError from the caller's code is refused like nesting too deep, not raised."""
    with pytest.raises(NotJSON, match="recursed without end") as info:
        freeze({"m": RaisingTuple((1,))}, "data")
    assert info.value.path == "data"


def test_a_str_subclass_is_read_by_its_text_even_with_broken_methods() -> None:
    """A str subclass (as a value or a key) is stored as its plain text: its methods never run."""
    value = BrokenStr("v")
    key = KeyStr("k")
    d = {"plain": value, key: 1}
    KeyStr.broken = True
    try:
        frozen = freeze([value, d])
    finally:
        KeyStr.broken = False
    assert frozen == ["v", {"plain": "v", "k": 1}]
    assert type(frozen[0]) is str
    assert all(type(k) is str for k in frozen[1])


def test_a_non_str_key_with_a_broken_repr_is_named_without_calling_it() -> None:
    """A non-str key is refused with NotJSON even when its __repr__ raises."""
    with pytest.raises(NotJSON, match="of type BrokenReprKey is not a string"):
        freeze({BrokenReprKey(): 1}, "data")


def test_two_keys_with_the_same_text_are_refused_not_merged() -> None:
    """Two str-subclass keys that read as one text would lose a value: refused instead."""
    d = {IdentityStr("k"): 1, IdentityStr("k"): 2}
    assert len(d) == 2
    with pytest.raises(NotJSON, match="two keys of this object read as the same text"):
        freeze(d, "data")
    with pytest.raises(NotJSON, match="read as the same text"):
        freeze({IdentityStr("k"): 1, "k": 2}, "data")
    with pytest.raises(NotJSON, match="read as the same text"):
        freeze({"k": 1, IdentityStr("k"): 2}, "data")


@pytest.mark.parametrize(
    "make",
    [
        lambda: FrozenDict(RaisingMapping({"a": 1}, "__iter__", ValueError("x"))),
        lambda: FrozenList(RaisingList([1])),
    ],
    ids=["FrozenDict", "FrozenList"],
)
def test_frozen_constructors_refuse_an_unreadable_source_with_not_json(
    make: Callable[[], Any],
) -> None:
    """FrozenDict(x) / FrozenList(x) of a source that raises when read raise NotJSON (a
    TypeError), not the source's own exception."""
    with pytest.raises(NotJSON, match=r"raised ValueError: .* when read"):
        make()
