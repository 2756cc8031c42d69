"""What one call to a Ray shard costs, counted (no cluster needed): the shard runs in this
process on an event loop of its own, reached through a stand-in for its Ray actor handle
that pickles what crosses, as Ray does.

An awaited append is one Ray call carrying one argument, answered with one value; a
batch that comes in order never waits for its turn (no lock taken, no task made).
Ray's cost grows with each argument it serializes and each object of ours it walks, so
a batch crosses as one blob of bytes each way.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

import pytest
from bounds import BOUND
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ray")

from ray import cloudpickle

from nous_actor import ClusterError, MemoryStore
from nous_actor.cluster.ray import (
    CALL,
    FAILED,
    NOW,
    PROTOCOL,
    SEQ,
    RaySession,
    _Link,
    _Shard,
)
from nous_actor.cluster.ray._protocol import (
    _pack,
    _pack_batch,
    _pack_outcomes,
    _unpack,
)


class _Ref:
    def __init__(self, fut: Future[Any]) -> None:
        self._fut = fut

    def future(self) -> Future[Any]:
        return self._fut


class _Method:
    def __init__(self, actor: _Actor, name: str) -> None:
        self.actor = actor
        self.name = name

    def remote(self, *args: Any) -> _Ref:
        self.actor.sent.append((self.name, args))
        args = cloudpickle.loads(cloudpickle.dumps(args))  # what crosses is a copy
        method = getattr(self.actor.shard, self.name)
        crossed: Future[Any] = Future()

        def back(done: Future[Any]) -> None:
            try:
                self.actor.answers.append((self.name, done.result()))
                crossed.set_result(cloudpickle.loads(cloudpickle.dumps(done.result())))
            except Exception as exc:
                crossed.set_exception(exc)

        asyncio.run_coroutine_threadsafe(method(*args), self.actor.loop).add_done_callback(back)
        return _Ref(crossed)


class _Actor:
    """A stand-in for a shard's Ray actor handle: ``.run.remote(...)`` (and the other
    methods) run the shard's coroutine on its loop, recording what was sent."""

    def __init__(self, shard: _Shard, loop: asyncio.AbstractEventLoop) -> None:
        self.shard = shard
        self.loop = loop
        self.sent: list[tuple[str, tuple[Any, ...]]] = []
        self.answers: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


@pytest.fixture
def shard() -> Iterator[tuple[_Shard, _Actor]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="shard-loop", daemon=True)
    thread.start()
    shard = _Shard(MemoryStore, 0, 1, {"timeout": BOUND})
    try:
        yield shard, _Actor(shard, loop)
    finally:
        asyncio.run_coroutine_threadsafe(shard.close(BOUND), loop).result(BOUND)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(BOUND)
        loop.close()


def test_an_awaited_append_is_one_ray_call_of_one_argument_answered_with_bytes(
    shard: tuple[_Shard, _Actor],
) -> None:
    """Each append a lone caller awaits is one Ray call; its batch crosses as one
    argument of bytes and comes back as bytes (Ray serializes each argument, and walks
    every object of ours it is handed, at a cost of its own each)."""
    _, actor = shard
    chat = RaySession("s-1", _Link(actor, 0), timeout=BOUND)

    async def appends() -> list[int]:
        return [(await chat.append("user_message", {"content": f"m{i}"})).seq for i in range(5)]

    assert asyncio.run(appends()) == [0, 1, 2, 3, 4]
    assert [name for name, _ in actor.sent] == ["run"] * 5
    for _, args in actor.sent:
        assert len(args) == 1
        assert isinstance(args[0], bytes)
    assert (chat._link.calls, chat._link.sent) == (5, 5)


def test_an_append_is_answered_with_its_seq_and_the_event_made_by_the_driver(
    shard: tuple[_Shard, _Actor],
) -> None:
    """The event an append stores is the parts its caller sent under a seq: only the seq
    comes back, and the caller gets the very event the session holds."""
    _, actor = shard
    chat = RaySession("s-seq", _Link(actor, 0), timeout=BOUND)
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    got = [
        chat.append("user_message", {"content": "hi", "n": [1, 2]}, time=at).get(timeout=BOUND),
        chat.append("assistant_message", {"content": "hello"}).get(timeout=BOUND),
    ]
    assert [_unpack(blob) for _, blob in actor.answers] == [[(SEQ, 0)], [(SEQ, 1)]]
    assert got == chat.log().get(timeout=BOUND).events()
    assert got[0].time == at
    assert got[0].data == {"content": "hi", "n": [1, 2]}


def test_batches_that_come_in_order_never_wait_for_their_turn(
    shard: tuple[_Shard, _Actor],
) -> None:
    """A link's batches that reach the shard in order start at once: no lock is taken
    and no task is made to wait for the turn (the shard's condition is never made)."""
    the_shard, actor = shard
    link = _Link(actor, 0)
    chats = [RaySession(f"s-{i}", link, timeout=BOUND) for i in range(3)]
    for n in range(4):
        futs = [c.append("user_message", {"content": f"m{n}"}) for c in chats]
        assert [f.get(timeout=BOUND).seq for f in futs] == [n] * 3
    assert the_shard.turned is None
    assert the_shard.turns == {link.id: link._next}


def test_a_batch_that_comes_early_still_waits_for_the_earlier_one(
    shard: tuple[_Shard, _Actor],
) -> None:
    """Batch 2 of a link reaching the shard before batch 1 starts only after it."""
    the_shard, actor = shard
    loop = actor.loop

    ops: list[Any] = []

    class Recording:  # a link that keeps the calls its handle makes
        def submit(self, op: Any, fut: Any) -> None:
            ops.append(op)

    chat = RaySession("early", Recording(), timeout=BOUND)  # type: ignore[arg-type]
    for content in ("zero", "one", "two"):
        chat.append("user_message", {"content": content})
    made = dict(zip(("zero", "one", "two"), ops, strict=True))

    def op(content: str) -> Any:
        return made[content]

    def run(number: int, reset: bool, content: str) -> Future[Any]:
        blob = _pack_batch("link", number, reset, [op(content)])
        return asyncio.run_coroutine_threadsafe(the_shard.run(blob), loop)

    assert _unpack(run(0, True, "zero").result(BOUND)) == [(SEQ, 0)]
    later = run(2, False, "two")
    assert not later.done()
    assert _unpack(run(1, False, "one").result(BOUND)) == [(SEQ, 1)]
    assert _unpack(later.result(BOUND)) == [(SEQ, 2)]


def test_a_batch_of_another_protocol_is_refused_call_by_call(
    shard: tuple[_Shard, _Actor],
) -> None:
    """A blob of another protocol version gets a ClusterError for each of its calls."""
    the_shard, actor = shard
    ops = [(CALL, "proto", "h_read", ("count",))] * 2
    blob = _pack((PROTOCOL + 1, "link", 0, True, len(ops), _pack(ops)))
    got = _unpack(asyncio.run_coroutine_threadsafe(the_shard.run(blob), actor.loop).result(BOUND))
    assert [state for state, _ in got] == [FAILED, FAILED]
    assert all(isinstance(e, ClusterError) for _, e in got)
    assert "one version of nous_actor" in str(got[0][1])


def test_an_answer_that_cannot_be_pickled_fails_its_own_call_alone() -> None:
    """One outcome that cannot cross fails that call; the batch's others still cross."""
    lock = threading.Lock()
    blob = _pack_outcomes([(NOW, 1), (NOW, lock), (NOW, "x")])
    got = _unpack(blob)
    assert (got[0], got[2]) == ((NOW, 1), (NOW, "x"))
    assert got[1][0] == FAILED
    assert "could not be sent" in str(got[1][1])


@settings(max_examples=50, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_what_crosses_comes_back_equal(value: Any) -> None:
    assert _unpack(_pack_outcomes([(NOW, value)])) == [(NOW, value)]
    assert pickle.loads(_pack(value)) == value
