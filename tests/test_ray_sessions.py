"""Sessions on Ray: the session contract through `RaySession` handles, on PostgreSQL.

Shard actors run in Ray worker processes of a real local cluster (see
tests/ray_cluster.py); the journal is the PostgreSQL server of
tests/postgres_server.py. Under CI both are required; elsewhere these tests
skip, saying why, when Ray or the server is missing.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

if TYPE_CHECKING:
    from postgres_server import Server

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")

from nous_actor import (  # noqa: E402
    ClusterError,
    CompactionResult,
    Compactor,
    ConflictError,
    InvalidEvent,
    Log,
    Message,
    Session,
    SessionHandle,
    SessionStopped,
    StoreError,
)
from nous_actor.cluster.ray import RaySession, RaySessions, shard_of  # noqa: E402
from nous_actor.store.postgres import PostgresStore  # noqa: E402


def _sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def module_schema(pg_server: Server) -> Iterator[str]:
    """One schema for the whole module: the module's cluster journals in it, and tests
    that meet the cluster's sessions open it too (see conftest's per-test ``schema``)."""
    name = pg_server.fresh_schema()
    yield name
    pg_server.drop_schema(name)


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, pg_server: Server, module_schema: str) -> Iterator[RaySessions]:
    """Two shards on the test cluster, journaled in one schema of the test server."""
    sessions = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=module_schema), shards=2, timeout=20
    )
    try:
        yield sessions
    finally:
        sessions.shutdown()


def _contents(messages: list[Message]) -> list[Any]:
    return [m.content for m in messages]


# -- the same API ---------------------------------------------------------------------------


def test_the_ray_handle_has_every_method_of_a_local_handle_with_the_same_signature() -> None:
    """Code written against a local Session runs on a RaySession: the same public
    methods (apart from the local constructors), with the same signatures."""

    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(getattr(cls, name))
            for name in dir(cls)
            if not name.startswith("_")
            and name not in ("start", "child")
            and callable(getattr(cls, name))
        }

    assert issubclass(RaySession, SessionHandle)
    local, remote = methods(Session), methods(RaySession)
    assert len(local) >= 20
    assert remote == local


# Today's placement, pinned as literal values: a change of `shard_of` would move the
# sessions of existing users between shards, so it must fail here. (Python's salted hash()
# would give other values in every process.)
SHARD_COUNTS = (1, 2, 3, 4, 8, 64, 1000)
PLACEMENT = {
    # session id: its shard with each of SHARD_COUNTS shards
    "chat-42": (0, 0, 0, 0, 6, 40, 906),
    "a": (0, 0, 0, 0, 6, 11, 379),
    "sessão-1": (0, 1, 1, 3, 3, 15, 534),
    "会话": (0, 1, 2, 2, 6, 55, 520),
    "user:123/run:7": (0, 1, 2, 3, 4, 32, 388),
}


def test_a_session_id_maps_to_the_same_shard_in_every_process() -> None:
    """The placement is a stable hash (pinned here), not Python's salted hash()."""
    assert [shard_of(f"chat-{i}", 4) for i in range(12)] == [3, 2, 2, 0, 3, 3, 2, 2, 2, 3, 2, 1]
    placed = {sid: tuple(shard_of(sid, n) for n in SHARD_COUNTS) for sid in PLACEMENT}
    assert placed == PLACEMENT


@settings(max_examples=200)
@given(st.text(min_size=1, max_size=30), st.integers(1, 64))
def test_growing_the_shards_by_one_moves_a_session_only_to_the_new_shard(
    session_id: str, n: int
) -> None:
    """Jump consistent hashing: with one more shard a session stays where it was or
    moves to the new shard, never between old ones."""
    before, after = shard_of(session_id, n), shard_of(session_id, n + 1)
    assert 0 <= before < n
    assert after in (before, n)


# -- the contract through Ray handles ----------------------------------------------------


def test_appends_reads_and_history_through_a_ray_handle(cluster: RaySessions) -> None:
    chat = cluster.open(_sid("chat"))
    assert chat.append("user_message", {"content": "hi"}).get().seq == 0
    assert chat.append_message({"role": "assistant", "content": "hello"}).get().seq == 1
    batch = chat.append_many([("user_message", {"content": "q"}), ("tool_call", {"id": "t"})])
    assert [e.seq for e in batch.get()] == [2, 3]
    assert _contents(chat.derive_messages().get()) == ["hi", "hello", "q"]
    assert [s for s, _ in chat.derive_indexed().get()] == [0, 1, 2]
    assert chat.count().get() == 4
    assert [e.seq for e in chat.since(2).get()] == [2, 3]
    log = chat.log().get()
    assert isinstance(log, Log)
    assert log.count() == 4
    assert _contents(chat.as_of(1).get().derive_messages()) == ["hi", "hello"]
    fork = chat.fork(1).get()
    assert [e.seq for e in fork.events()] == [0, 1]
    assert chat.is_alive() is True


def test_bad_input_fails_only_its_own_call_with_the_local_typed_error(
    cluster: RaySessions,
) -> None:
    """Refused in the caller's process (InvalidEvent, UnsendableMessage, TypeError) or
    in the shard (InvalidEvent seq_behind_head, ValueError of fork): the same types as
    a local session, never a Ray wrapper, and the session runs on unchanged."""
    chat = cluster.open(_sid("bad"))
    chat.append("user_message", {"content": "one"}).get()
    with pytest.raises(InvalidEvent, match="unknown event type"):
        chat.append("no_such_type", {}).get()
    with pytest.raises(InvalidEvent):
        chat.append("user_message", {"content": {1, 2}}).get()
    with pytest.raises(ValueError, match="role"):
        chat.append_message({"role": "narrator", "content": "x"}).get()
    with pytest.raises(TypeError):
        chat.append_many([("user_message",)]).get()  # type: ignore[list-item]
    with pytest.raises(InvalidEvent) as behind:
        chat.append_at(0, "user_message", {"content": "again"}).get()
    assert behind.value.reason == "seq_behind_head"
    with pytest.raises(ValueError, match="past"):
        chat.fork(99).get()
    assert chat.append_or_log("no_such_type", {}).get() is None
    assert _contents(chat.derive_messages().get()) == ["one"]
    assert chat.append("user_message", {"content": "two"}).get().seq == 1


def test_an_invalid_session_id_is_refused_before_anything_is_sent(cluster: RaySessions) -> None:
    calls = cluster.stats()["calls"]
    for bad in ("", " x", "a\nb", 42):
        with pytest.raises((ValueError, TypeError)):
            cluster.open(bad)  # type: ignore[arg-type]
    assert cluster.stats()["calls"] == calls


def test_a_fork_into_the_store_is_a_session_of_its_own(cluster: RaySessions) -> None:
    parent = cluster.open(_sid("parent"))
    for text in ("a", "b", "c"):
        parent.append("user_message", {"content": text}).get()
    child_id = _sid("child")
    parent.fork(1, child_id).get()
    child = cluster.open(child_id)
    assert _contents(child.derive_messages().get()) == ["a", "b"]
    with pytest.raises(ConflictError):
        parent.fork(1, child_id).get()


def test_calls_are_batched_and_applied_in_the_order_they_were_made(
    cluster: RaySessions,
) -> None:
    """500 pipelined appends of one caller reach the shard in far fewer Ray calls than
    appends, and get the seqs 0..499 in the order they were made."""
    chat = cluster.open(_sid("pipe"))
    before = cluster.stats()
    futures = [chat.append("user_message", {"content": str(i)}) for i in range(500)]
    events = [f.get() for f in futures]
    after = cluster.stats()
    assert [e.seq for e in events] == list(range(500))
    assert [e.data["content"] for e in events] == [str(i) for i in range(500)]
    assert after["sent"] - before["sent"] == 500
    assert after["calls"] - before["calls"] <= 50


def test_with_several_batches_in_flight_a_sessions_calls_still_apply_in_order(
    ray_cluster: Any, pg_server: Server, module_schema: str
) -> None:
    """Four batches in flight to one shard while another thread keeps opening fresh
    sessions (a batch that opens one waits for the store): the shard starts batches
    in the order they were sent, so one caller's appends get their seqs in order."""
    sessions = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=module_schema), shards=1, max_in_flight=4
    )
    try:
        chat = sessions.open(_sid("order"))
        stop = threading.Event()

        def opener() -> None:
            while not stop.is_set():
                sessions.open(_sid("fresh"))

        t = threading.Thread(target=opener)
        t.start()
        try:
            futures = [chat.append("user_message", {"content": str(i)}) for i in range(1500)]
            events = [f.get() for f in futures]
        finally:
            stop.set()
            t.join(30)
        assert [e.data["content"] for e in events] == [str(i) for i in range(1500)]
        assert [e.seq for e in events] == list(range(1500))
    finally:
        sessions.shutdown()


def test_threads_and_coroutines_share_sessions_and_nothing_is_lost_or_reordered(
    cluster: RaySessions,
) -> None:
    """8 threads and 20 coroutines append to 4 sessions at once, each waiting for every
    append; each session holds exactly its callers' events, each caller's in order."""
    ids = [_sid("mix") for _ in range(4)]
    handles = [cluster.open(i) for i in ids]

    def worker(t: int) -> None:
        h = handles[t % 4]
        for n in range(30):
            h.append("user_message", {"content": f"t{t}-{n}"}).get()

    async def coroutines() -> None:
        async def one(c: int) -> None:
            h = await cluster.aopen(ids[c % 4])
            for n in range(15):
                await h.append("user_message", {"content": f"c{c}-{n}"})

        await asyncio.gather(*(one(c) for c in range(20)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    asyncio.run(coroutines())
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    total = 0
    for i, h in enumerate(handles):
        contents = [e.data["content"] for e in h.events().get()]
        total += len(contents)
        callers = {c.split("-")[0] for c in contents}
        expected = {f"t{t}" for t in range(8) if t % 4 == i} | {
            f"c{c}" for c in range(20) if c % 4 == i
        }
        assert callers == expected
        for caller in callers:
            mine = [int(c.split("-")[1]) for c in contents if c.split("-")[0] == caller]
            assert mine == list(range(len(mine)))
    assert total == 8 * 30 + 20 * 15


def test_an_awaited_call_leaves_the_event_loop_free(cluster: RaySessions) -> None:
    """While coroutines await appends through Ray, a probe coroutine keeps ticking."""
    chat = cluster.open(_sid("loop"))

    async def main() -> int:
        ticks = 0
        done = asyncio.Event()

        async def probe() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(probe())
        for i in range(50):
            await chat.append("user_message", {"content": str(i)})
        done.set()
        await task
        return ticks

    assert asyncio.run(main()) >= 50


def test_a_subscription_sees_every_event_once_in_order_across_the_process_boundary(
    cluster: RaySessions,
) -> None:
    """Catch-up, then live events appended by another thread meanwhile: seqs 0..n-1,
    each once, in order; closing ends the feed."""
    chat = cluster.open(_sid("feed"))
    for i in range(5):
        chat.append("user_message", {"content": str(i)}).get()
    sub = chat.subscribe(0)
    writer = threading.Thread(
        target=lambda: [
            chat.append("user_message", {"content": str(i)}).get() for i in range(5, 200)
        ]
    )
    writer.start()
    seen = [sub.get(timeout=20).seq for _ in range(200)]
    writer.join(60)
    assert seen == list(range(200))
    assert sub.get_nowait() is None
    sub.close()
    with pytest.raises(SessionStopped):
        sub.get(timeout=5)


def test_an_async_subscription_from_a_seq(cluster: RaySessions) -> None:
    chat = cluster.open(_sid("afeed"))
    for i in range(3):
        chat.append("user_message", {"content": str(i)}).get()

    async def main() -> list[int]:
        seqs: list[int] = []
        async with await chat.asubscribe(1) as sub:
            await chat.append("user_message", {"content": "3"})
            async for ev in sub:
                seqs.append(ev.seq)
                if ev.seq == 3:
                    break
        return seqs

    assert asyncio.run(main()) == [1, 2, 3]


# The summarisers below run in the shards, which cannot import this test module: send
# its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _slow_summary(messages: list[Message]) -> str:
    import time

    time.sleep(1.5)  # the workload: a model call that takes a while
    return f"summary of {len(messages)}"


def test_a_slow_summariser_runs_in_the_shard_and_never_blocks_the_session(
    cluster: RaySessions,
) -> None:
    """While the summariser takes 1.5 s in the shard, the same session answers appends
    and reads; then the compaction commits, valid with them."""
    chat = cluster.open(_sid("compact"))
    for i in range(10):
        chat.append("user_message", {"content": f"m{i}"}).get()
    compaction = chat.compact(
        Compactor(budget=0, summarise=_slow_summary, keep_recent=2), force=True
    )
    for i in range(10, 15):
        chat.append("user_message", {"content": f"m{i}"}).get(timeout=1.0)
        assert not compaction.done()
    result = compaction.get(timeout=20)
    assert isinstance(result, CompactionResult)
    contents = _contents(chat.derive_messages().get())
    assert contents[0].startswith("summary of")
    assert contents[-5:] == [f"m{i}" for i in range(10, 15)]


def test_a_compactor_that_cannot_travel_to_the_shard_fails_only_its_call(
    cluster: RaySessions,
) -> None:
    chat = cluster.open(_sid("nopickle"))
    chat.append("user_message", {"content": "x"}).get()
    lock = threading.Lock()
    unpicklable = Compactor(budget=0, summarise=lambda ms: str(lock))
    with pytest.raises(TypeError, match="picklable"):
        chat.compact(unpicklable, force=True).get()
    assert chat.count().get() == 1


def test_a_shard_refuses_calls_of_another_protocol_with_a_cluster_error(
    cluster: RaySessions,
) -> None:
    """A driver of another version of the library gets a ClusterError for each call
    (saying to run one version everywhere), not a Ray wrapper or a hang."""
    from nous_actor.cluster.ray import CALL, FAILED, PROTOCOL

    op = (CALL, _sid("proto"), "h_read", ("count",))
    answer = ray.get(cluster.shard_actor(0).run.remote(PROTOCOL + 1, "x", 0, True, [op]))
    assert len(answer) == 1
    assert answer[0][0] == FAILED
    assert isinstance(answer[0][1], ClusterError)
    assert "one version of nous_actor" in str(answer[0][1])


def test_a_handle_refuses_to_be_pickled(cluster: RaySessions) -> None:
    chat = cluster.open(_sid("pickle"))
    with pytest.raises(TypeError, match="open it with RaySessions"):
        pickle.dumps(chat)


def test_stop_then_call_starts_the_session_again_from_the_store(cluster: RaySessions) -> None:
    sid = _sid("stop")
    chat = cluster.open(sid)
    chat.append("user_message", {"content": "kept"}).get()
    chat.stop()
    assert chat.is_alive() is False
    assert sid not in cluster.live()
    assert _contents(chat.derive_messages().get()) == ["kept"]
    assert sid in cluster.live()


def test_a_second_writer_of_a_session_held_by_a_shard_is_refused(
    cluster: RaySessions, pg_server: Server, module_schema: str
) -> None:
    """The store alone decides who writes: a local session on the same journal cannot
    claim a session its shard holds."""
    sid = _sid("held")
    cluster.open(sid).append("user_message", {"content": "x"}).get()
    with PostgresStore(pg_server.dsn, schema=module_schema) as store, pytest.raises(ConflictError):
        Session.start(sid, store=store, timeout=5)


# -- model versus real --------------------------------------------------------------------


AT = datetime(2026, 1, 1, tzinfo=UTC)


class RayHandleMachine(RuleBasedStateMachine):
    """A RaySession against the pure Log it stands for: every call, valid or not."""

    sessions: RaySessions

    def __init__(self) -> None:
        super().__init__()
        self.handle = self.sessions.open(_sid("machine"))
        self.model = Log()

    @rule(text=st.text(max_size=20), role=st.sampled_from(["user", "assistant"]))
    def append_message(self, text: str, role: str) -> None:
        message = Message(role, text, created_at=AT)
        ev = self.handle.append_message(message).get()
        self.model = self.model.append_message(message)
        assert ev == self.model.events()[-1]

    @rule(n=st.integers(1, 4))
    def append_many(self, n: int) -> None:
        items = [("user_message", {"content": str(i)}, AT) for i in range(n)]
        got = self.handle.append_many(items).get()
        for kind, data, at in items:
            self.model = self.model.append(kind, data, at)
        assert got == self.model.events()[-n:]

    @rule(kind=st.sampled_from(["bogus", "user_message"]), data=st.sampled_from([{1}, None]))
    def append_invalid(self, kind: str, data: Any) -> None:
        if kind == "user_message" and data is None:
            return
        with pytest.raises(InvalidEvent):
            self.handle.append(kind, data).get()

    @precondition(lambda self: self.model.count() > 0)
    @rule(data=st.data())
    def replace(self, data: st.DataObject) -> None:
        top = self.model.count() - 1
        start = data.draw(st.integers(0, top))
        end = data.draw(st.integers(start, top))
        payload = {"content": "replaced", "surface_op": ("replace", start, end)}
        try:
            self.model = self.model.append("system_message", payload, AT)
        except InvalidEvent:
            with pytest.raises(InvalidEvent):
                self.handle.append("system_message", payload, AT).get()
        else:
            assert (
                self.handle.append("system_message", payload, AT).get()
                == (self.model.events()[-1])
            )

    @rule()
    def snapshot(self) -> None:
        dropped = self.handle.snapshot().get()
        before = len(self.model.events())
        self.model = self.model.snapshot()
        assert dropped == before - len(self.model.events())

    @invariant()
    def same_surface(self) -> None:
        assert self.handle.derive_messages().get() == self.model.derive_messages()
        assert self.handle.count().get() == self.model.count()


@pytest.mark.timeout(300)
def test_a_ray_handle_behaves_as_the_log_it_stands_for(cluster: RaySessions) -> None:
    RayHandleMachine.sessions = cluster
    machine = RayHandleMachine.TestCase
    machine.settings = settings(max_examples=8, stateful_step_count=12, deadline=None)
    machine().runTest()


# -- configuration ----------------------------------------------------------------------


def test_bad_arguments_are_refused_before_anything_starts(pg_server: Server) -> None:
    factory = partial(PostgresStore, pg_server.dsn)
    with pytest.raises(TypeError, match="callable"):
        RaySessions("postgresql://x")  # type: ignore[arg-type]
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="shards"):
            RaySessions(factory, shards=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="detached"):
        RaySessions(factory, detached=True)
    with pytest.raises(ValueError, match="timeout"):
        RaySessions(factory, timeout=0)


def test_a_store_the_shards_cannot_reach_is_an_error_at_start_up(ray_cluster: Any) -> None:
    """A DSN whose server does not exist: a StoreError naming the shard, at once."""
    factory = partial(
        PostgresStore, "postgresql:///nowhere?host=/nonexistent-dir&connect_timeout=2"
    )
    with pytest.raises(StoreError, match="shard"):
        RaySessions(factory, shards=2, start_timeout=60)


def test_a_store_factory_that_cannot_travel_is_a_type_error(ray_cluster: Any) -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError, match="picklable"):
        RaySessions(lambda: lock, shards=1)  # type: ignore[arg-type,return-value]


def test_a_factory_that_makes_no_store_is_a_type_error(ray_cluster: Any) -> None:
    with pytest.raises(TypeError, match="must return a nous_actor Store"):
        RaySessions(dict, shards=1)  # type: ignore[arg-type]


def test_a_closed_registry_refuses_calls_with_session_stopped(
    ray_cluster: Any, pg_server: Server, module_schema: str
) -> None:
    sessions = RaySessions(partial(PostgresStore, pg_server.dsn, schema=module_schema), shards=1)
    chat = sessions.open(_sid("closed"))
    chat.append("user_message", {"content": "x"}).get()
    sessions.close()
    with pytest.raises(SessionStopped, match="closed"):
        chat.append("user_message", {"content": "y"}).get()
    with pytest.raises(SessionStopped, match="closed"):
        sessions.open(_sid("closed"))


def test_a_batch_to_a_shard_is_reported_with_its_calls(cluster: RaySessions) -> None:
    """With telemetry on, each batch sent to a shard is a span naming the shard and the
    session calls it carried."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nous_actor.runtime import telemetry
    from nous_actor.runtime.otel import OpenTelemetrySink

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    old = telemetry.install(OpenTelemetrySink(MeterProvider(), tracer_provider))
    try:
        h = cluster.open(_sid("batched"))
        futures = [h.append("user_message", {"content": f"m{k}"}) for k in range(20)]
        for f in futures:
            f.get(timeout=20)
    finally:
        telemetry.install(old)
    batches = [s for s in spans.get_finished_spans() if s.name == "nous_actor.batch"]
    assert batches
    carried = 0
    for s in batches:
        assert s.attributes is not None
        assert str(s.attributes["nous_actor.target"]).startswith("shard-")
        carried += int(s.attributes["nous_actor.calls"])  # type: ignore[arg-type]
    assert carried >= 20  # every append went in some batch (the open may add calls)
