"""What a forwarded call's arguments become on their way to the holder: exactly what the
caller's handle made, whatever the event (an append's events travel flat, their type by
name and their time in microseconds, which costs pickle less than an enum and a datetime
with its time zone)."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from bounds import BOUND
from hypothesis import given, settings
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


# -- frames on the socket --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 200_000), min_size=1, max_size=8),
    st.lists(st.integers(1, 300_000), min_size=1, max_size=6),
    st.data(),
)
def test_a_frame_reader_reads_every_frame_as_sent(
    sizes: list[int], cuts: list[int], data: st.DataObject
) -> None:
    """Frames of any size (past the reader's chunk, empty, long-headed as
    `multiprocessing.connection` writes past 2 GiB), written in pieces cut anywhere and
    some by ``send_bytes``, are read back whole, in order, each once; the peer's close
    ends the reading with `EOFError`, and the reader keeps no big frame's room."""
    import socket
    import threading
    from multiprocessing.connection import Connection

    from nous_actor.sessions.forwarding.links import FrameReader, _frame

    payloads = [bytes([k % 251]) * n for k, n in enumerate(sizes)]
    wire = b"".join(
        (len(p).to_bytes(4, "big", signed=True) + p)
        if data.draw(st.booleans(), label=f"short head {k}")
        else (b"\xff\xff\xff\xff" + len(p).to_bytes(8, "big") + p)
        for k, p in enumerate(payloads)
    )
    assert _frame(payloads[0]) == len(payloads[0]).to_bytes(4, "big", signed=True) + payloads[0]
    a, b = socket.socketpair()
    writer = Connection(a.detach())
    reader = Connection(b.detach())

    def write() -> None:
        at = 0
        for cut in cuts * (len(wire) // sum(cuts) + 1):
            if at >= len(wire):
                break
            writer._send(wire[at : at + cut])  # type: ignore[attr-defined]
            at += cut
        writer.send_bytes(b"last")
        writer.close()

    t = threading.Thread(target=write, daemon=True)
    t.start()
    frames = FrameReader(reader)
    got: list[bytes] = []
    try:
        while len(got) < len(payloads) + 1:
            got += frames.frames()
        with pytest.raises(EOFError):
            frames.frames()
    finally:
        t.join(BOUND)
        reader.close()
    assert got == [*payloads, b"last"]
    assert len(frames._buf) == 1 << 16  # all read: a big frame's room is let go


def test_a_frame_reader_refuses_a_length_that_is_none() -> None:
    """A frame whose length is negative (and not the long head's -1) is refused with
    `ValueError`, which ends the peer's connection where it is read."""
    import socket
    from multiprocessing.connection import Connection

    from nous_actor.sessions.forwarding.links import FrameReader

    a, b = socket.socketpair()
    try:
        a.sendall((-5).to_bytes(4, "big", signed=True) + b"xxxxx")
        reader = Connection(b.detach())
        with pytest.raises(ValueError, match="length is -5"):
            FrameReader(reader).frames()
        reader.close()
    finally:
        a.close()
