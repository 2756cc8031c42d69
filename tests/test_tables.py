"""`Sweep` and `WeakValues`: tables keyed by session id that do not grow with the
ids a long-running process has met, only with the entries still alive."""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st

from nous_actor.runtime.tables import WeakValues


class _Value:
    """A value that can be referred to weakly (a route stands for one)."""

    __slots__ = ("__weakref__", "n")

    def __init__(self, n: int) -> None:
        self.n = n


def test_a_value_is_read_back_while_alive_and_reads_as_absent_once_gone() -> None:
    table: WeakValues[str, _Value] = WeakValues(least=4)
    kept = _Value(1)
    table["a"] = kept
    table["b"] = _Value(2)
    gc.collect()
    assert table.get("a") is kept
    assert table["a"] is kept
    assert table.get("b") is None
    assert table.get("c") is None
    assert sorted(table) == ["a"]
    assert table.values() == [kept]
    assert len(table) == 1


@given(st.lists(st.booleans(), max_size=300))
def test_the_table_holds_at_most_twice_what_is_alive_plus_its_floor(keep: list[bool]) -> None:
    """Entries whose values died are swept as the table doubles: a process that met
    many ids keeps entries in proportion to the values alive, not to the ids met."""
    least = 8
    table: WeakValues[int, _Value] = WeakValues(least=least)
    alive = []
    for n, k in enumerate(keep):
        value = _Value(n)
        table[n] = value
        if k:
            alive.append(value)
        del value
        assert len(table._refs) <= max(least, 2 * len(alive) + 2)
    assert sorted(table) == [v.n for v in alive]
    assert all(table[v.n] is v for v in alive)
