"""Which events a later replace shadows: the fold's flags, by their definition and their cost.

DESIGN.md §3: an event ``c`` is shadowed iff some replace ``r`` has ``c.seq < r.seq``
and ``r.start <= position(c) <= r.stop``. `shadowed` finds them in one reverse pass
over the replaces alone, flagging the plain events between two replaces by bisection:
these tests hold it to the definition, and count its work.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings

from nous_actor import Event, Log
from nous_actor.core.log import _shadow_flags, shadowed
from nous_actor.testing.strategies import logs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _by_definition(events: list[Event]) -> list[bool]:
    replaces = [r for r in events if r.surface_op is not None]
    return [
        any(
            c.seq < r.seq and r.surface_op.start <= c.position <= r.surface_op.stop  # type: ignore[union-attr]
            for r in replaces
        )
        for c in events
    ]


@settings(max_examples=300)
@given(logs(max_ops=60, max_pos=30))
def test_the_flags_are_the_definitions(log: Log) -> None:
    """For any log (replaces nested, overlapping, past the head; snapshot gaps), an
    event is flagged iff a later replace's range holds its position."""
    events = log.events()
    assert _shadow_flags(events, len(events)) == _by_definition(events)


@settings(max_examples=100)
@given(logs(max_ops=30, max_pos=20))
def test_the_flags_of_a_prefix_read_only_the_prefix(log: Log) -> None:
    """``n`` bounds what is read: the flags of ``events[:n]`` are those of the prefix."""
    events = log.events()
    for n in range(len(events) + 1):
        assert _shadow_flags(events, n) == _by_definition(events[:n])


def test_the_work_is_per_replace_not_per_event() -> None:
    """100,000 plain events and 10 replaces: positions are read a few hundred times, not
    once per event (the plain events between replaces are flagged by bisection)."""
    log = Log()
    n = 100_000
    events = [
        Event(seq, "user_message", T0, {"content": "x"})
        if seq % 10_000 != 9_999
        else Event(seq, "system_message", T0, {"surface_op": ["replace", seq - 5_000, seq - 10]})
        for seq in range(n)
    ]
    log = Log.restore(events)
    reads = [0]

    def position(ev: Event) -> int:
        reads[0] += 1
        return ev.position

    flags = shadowed(events, n, position, lambda ev: ev.surface_op)
    assert sum(flags) == 10 * 4_991
    assert reads[0] < 1_000
    assert len(log.derive_messages()) == n - 10 * 4_991
