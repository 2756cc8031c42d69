"""What a forwarded call's arguments become on their way to the holder: exactly what the
caller's handle made, whatever the event (an append's events travel flat, their type by
name and their time in microseconds, which costs pickle less than an enum and a datetime
with its time zone)."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nous_actor.core.event import EventType, check_held
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.forwarding.links import _travelling, arrived

times = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone.min]),
)
parts = st.builds(
    lambda kind, t, data: check_held(0, kind, t, data),
    st.sampled_from(list(EventType)),
    times,
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)


def _sent(name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    handler = getattr(SessionActor, name)
    blob = pickle.dumps(_travelling(handler, args), pickle.HIGHEST_PROTOCOL)
    return arrived(name, pickle.loads(blob))


def _same(a: Any, b: Any) -> None:
    assert a == b
    assert type(a[0]) is EventType
    assert a[0] is b[0]
    assert b[1].tzinfo is UTC
    assert b[1].utcoffset() == timedelta(0)


@given(st.lists(parts, min_size=1, max_size=5), st.integers(0, 2**40))
def test_an_appends_events_arrive_as_they_were_sent(batch: list[Any], seq: int) -> None:
    many = _sent("h_append_many", (tuple(batch),))
    assert len(many) == 1
    assert len(many[0]) == len(batch)
    for got, made in zip(many[0], batch, strict=True):
        _same(made, got)
    (one,) = _sent("h_append", (batch[0],))
    _same(batch[0], one)
    at, one_at = _sent("h_append_at", (seq, batch[0]))
    assert at == seq
    _same(batch[0], one_at)


def test_other_calls_travel_as_they_are() -> None:
    assert _sent("h_log", ()) == ()
    assert _sent("h_read", ("since", 3)) == ("since", 3)
