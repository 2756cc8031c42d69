"""FrozenDict and FrozenList: immutable JSON containers that still behave as dict and list."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given

from nous_actor import FrozenDict, FrozenList
from nous_actor._frozen import NotJSON, freeze, thaw
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
