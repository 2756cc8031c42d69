"""OpenTelemetry: what the runtime reports, read back through the SDK's in-memory reader
and exporter (real instruments, real spans), and how the sink is turned on and off."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nous_actor import (
    Compactor,
    Dispatcher,
    Session,
    SessionCrashed,
    Sessions,
    SQLiteStore,
    SubscriptionLagged,
)
from nous_actor.runtime import telemetry
from nous_actor.runtime.otel import OpenTelemetrySink
from nous_actor.sessions.faults import crash


class Reported:
    """An OpenTelemetrySink on an SDK of its own, and what it reported."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.sink = OpenTelemetrySink(MeterProvider(metric_readers=[self.reader]), tracer_provider)

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            point
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]

    def total(self, name: str, **attributes: Any) -> float:
        """The sum of a counter's points (or a histogram's sums) with these attributes."""
        out = 0.0
        for p in self.points(name):
            if all(p.attributes.get(k) == v for k, v in attributes.items()):
                out += p.value if hasattr(p, "value") else p.sum
        return out

    def count(self, name: str, **attributes: Any) -> int:
        """How many values a histogram recorded with these attributes."""
        return sum(
            p.count
            for p in self.points(name)
            if all(p.attributes.get(k) == v for k, v in attributes.items())
        )

    def span_names(self) -> list[str]:
        return [s.name for s in self.spans.get_finished_spans()]


@pytest.fixture
def reported() -> Iterator[Reported]:
    r = Reported()
    old = telemetry.install(r.sink)
    try:
        yield r
    finally:
        telemetry.install(old)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "t.db"


def test_appends_are_counted_by_the_event(reported: Reported) -> None:
    s = Session.start("counted", timeout=BOUND)
    for k in range(7):
        s.append("user_message", {"content": f"m{k}"}).get(timeout=BOUND)
    s.append_many(
        [("user_message", {"content": "a"}), ("assistant_message", {"content": "b"})]
    ).get(timeout=BOUND)
    s.stop(timeout=BOUND)
    assert reported.total("nous_actor.session.appends") == 9


def test_commits_report_their_latency_and_size(reported: Reported, path: Path) -> None:
    with SQLiteStore(path) as store:
        s = Session.start("durable", store=store, timeout=BOUND)
        futures = [s.append("user_message", {"content": f"m{k}"}) for k in range(50)]
        for f in futures:
            f.get(timeout=BOUND)
        s.stop(timeout=BOUND)
    commits = reported.count("nous_actor.store.commit.duration", **{"nous_actor.outcome": "ok"})
    assert 1 <= commits <= 50
    assert reported.total("nous_actor.store.commit.size", **{"nous_actor.outcome": "ok"}) == 50
    assert reported.count("nous_actor.store.commit.size") == commits


def test_an_open_reports_its_outcome_its_read_time_and_a_span(
    reported: Reported, path: Path
) -> None:
    with SQLiteStore(path) as store:
        s = Session.start("reopened", store=store, timeout=BOUND)
        s.append("user_message", {"content": "kept"}).get(timeout=BOUND)
        s.stop(timeout=BOUND)
        again = Session.start("reopened", store=store, timeout=BOUND)
        again.stop(timeout=BOUND)
    assert reported.total("nous_actor.session.opens", **{"nous_actor.outcome": "new"}) == 1
    assert reported.total("nous_actor.session.opens", **{"nous_actor.outcome": "recovered"}) == 1
    assert reported.count("nous_actor.session.recovery.duration") == 1
    (span,) = [
        s for s in reported.spans.get_finished_spans() if s.name == "nous_actor.session.recover"
    ]
    assert span.attributes is not None
    assert span.attributes["session.id"] == "reopened"
    assert span.attributes["nous_actor.events"] == 1
    assert span.start_time is not None
    assert span.end_time is not None
    assert span.start_time <= span.end_time


def test_a_restart_is_counted_by_the_crash_type(reported: Reported, path: Path) -> None:
    class Boom(BaseException):  # crashes the session (an Exception fails only its call)
        pass

    restarted: queue.Queue[float] = queue.Queue()

    def scheduler(delay: float, fn: Callable[[], None]) -> None:  # the restart, at once
        fn()
        restarted.put(delay)

    with SQLiteStore(path) as store:
        registry = Sessions(store, timeout=BOUND, scheduler=scheduler)
        try:
            h = registry.open("crashy")
            h.append("user_message", {"content": "before"}).get(timeout=BOUND)
            with pytest.raises(SessionCrashed):
                crash(h, Boom("injected")).get(timeout=BOUND)
            restarted.get(timeout=BOUND)
            assert registry.restart_count("crashy") == 1
        finally:
            registry.close(timeout=BOUND)
    assert reported.total("nous_actor.session.restarts", **{"nous_actor.reason": "Boom"}) == 1


def test_a_compaction_reports_its_time_and_its_summariser_as_spans(reported: Reported) -> None:
    s = Session.start("compacted", timeout=BOUND)
    for k in range(12):
        s.append("user_message", {"content": f"message number {k} " * 20}).get(timeout=BOUND)
    compactor = Compactor(budget=200, summarise=lambda messages: "a short summary", keep_recent=2)
    result = s.compact(compactor).get(timeout=BOUND)
    s.stop(timeout=BOUND)
    assert result.summary_seq is not None
    assert reported.total("nous_actor.compaction.count") == 1
    assert reported.count("nous_actor.compaction.duration") == 1
    assert reported.count("nous_actor.compaction.summariser.duration") == 1
    spans = {sp.name: sp for sp in reported.spans.get_finished_spans()}
    parent, child = spans["nous_actor.compaction"], spans["nous_actor.compaction.summarise"]
    assert child.parent is not None
    assert child.parent.span_id == parent.context.span_id
    assert parent.start_time is not None
    assert child.start_time is not None
    assert parent.start_time <= child.start_time


def test_a_lagging_subscriber_is_counted(reported: Reported) -> None:
    s = Session.start("lagging", timeout=BOUND)
    sub = s.subscribe(buffer=2)
    for k in range(5):
        s.append("user_message", {"content": f"m{k}"}).get(timeout=BOUND)
    got = [sub.get(timeout=BOUND) for _ in range(2)]  # what fit in its buffer
    assert [ev.seq for ev in got] == [0, 1]
    with pytest.raises(SubscriptionLagged):
        sub.get(timeout=BOUND)
    s.stop(timeout=BOUND)
    assert reported.total("nous_actor.subscription.lagged") == 1


def test_live_sessions_and_the_dispatchers_queues_are_observed(reported: Reported) -> None:
    d = Dispatcher(1, name="observed")
    try:
        handles = [Session.start(f"live-{k}", dispatcher=d, timeout=BOUND) for k in range(3)]
        assert reported.total("nous_actor.session.live") >= 3
        depths = [
            p
            for p in reported.points("nous_actor.dispatcher.queue.depth")
            if p.attributes.get("nous_actor.dispatcher") == "observed"
        ]
        assert len(depths) == 1
        assert depths[0].value >= 0
        for h in handles:
            h.stop(timeout=BOUND)
        assert reported.total("nous_actor.session.live") == 0
    finally:
        d.close(timeout=BOUND)


def _child(code: str, **env: str) -> str:
    import os

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


PROBE = """
    import sys
    from nous_actor import Session
    from nous_actor.runtime import telemetry
    s = Session.start("probed")
    s.append("user_message", {"content": "x"}).get(timeout=10)
    s.stop()
    print(type(telemetry.sink).__name__)
"""


def test_the_sink_is_on_when_the_extra_is_installed_and_off_when_told() -> None:
    assert _child(PROBE) == "OpenTelemetrySink"
    assert _child(PROBE, NOUS_ACTOR_OTEL="off") == "NoneType"


def test_the_registry_sets_the_sink_up_so_no_open_imports_anything() -> None:
    # Importing OpenTelemetry takes milliseconds: a web worker's first open must not
    # pay them (nor the opens queued behind it), so Sessions() sets the sink up.
    code = """
        import sys, tempfile, os
        from nous_actor import Sessions, SQLiteStore
        from nous_actor.runtime import telemetry
        store = SQLiteStore(os.path.join(tempfile.mkdtemp(), "s.db"))
        sessions = Sessions(store)
        ready = type(telemetry.sink).__name__
        before = set(sys.modules)
        s = sessions.open("first")
        s.append("user_message", {"content": "x"}).get(timeout=10)
        s.derive_messages().get(timeout=10)
        print(ready, sorted(set(sys.modules) - before))
        sessions.close()
        store.close()
    """
    assert _child(code) == "OpenTelemetrySink []"


def test_without_opentelemetry_nothing_is_reported_and_sessions_work() -> None:
    blocked = "import sys; sys.modules['opentelemetry'] = None\n" + textwrap.dedent(PROBE)
    assert _child(blocked) == "NoneType"


def test_a_turn_is_a_span_with_its_owner_and_how_it_ended(reported: Reported) -> None:
    s = Session.start("turned", timeout=BOUND)
    with s.turn(owner="run-1") as turn:
        turn.append("user_message", {"content": "inside the turn"}).get(timeout=BOUND)
    s.stop(timeout=BOUND)
    (span,) = [sp for sp in reported.spans.get_finished_spans() if sp.name == "nous_actor.turn"]
    assert span.attributes is not None
    assert span.attributes["session.id"] == "turned"
    assert span.attributes["nous_actor.turn.owner"] == "run-1"
    assert span.attributes["nous_actor.turn.end"] == "closed"


def test_a_restart_is_counted_when_the_next_call_reopens_the_session_before_the_backoff(
    reported: Reported, path: Path
) -> None:
    """The usual case in a busy app: the caller's next call reopens the crashed session
    before the supervisor's restart fires; the late restart then finds it live. The crash
    is counted once, as the registry's own restart count counts it."""

    class Boom(BaseException):
        pass

    held: queue.Queue[Callable[[], None]] = queue.Queue()

    def scheduler(delay: float, fn: Callable[[], None]) -> None:  # fired by the test, later
        held.put(fn)

    with SQLiteStore(path) as store:
        registry = Sessions(store, timeout=BOUND, scheduler=scheduler)
        try:
            h = registry.open("busy")
            h.append("user_message", {"content": "before"}).get(timeout=BOUND)
            with pytest.raises(SessionCrashed):
                crash(h, Boom("injected")).get(timeout=BOUND)
            late_restart = held.get(timeout=BOUND)
            assert h.count().get(timeout=BOUND) == 1  # the caller's next call reopens it
            late_restart()  # finds it live: nothing to restart, nothing counted twice
            assert registry.restart_count("busy") == 1
        finally:
            registry.close(timeout=BOUND)
    assert reported.total("nous_actor.session.restarts", **{"nous_actor.reason": "Boom"}) == 1
    assert reported.total("nous_actor.session.restarts") == 1


# -- spans join the caller's trace ----------------------------------------------------------


@pytest.fixture
def tracer(reported: Reported) -> Any:
    """The application's own tracer, on the same SDK as the sink's."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(reported.spans))
    return provider.get_tracer("app")


def _one(reported: Reported, name: str) -> Any:
    (span,) = [sp for sp in reported.spans.get_finished_spans() if sp.name == name]
    return span


def test_a_turn_span_is_a_child_of_the_span_current_where_the_turn_was_opened(
    reported: Reported, tracer: Any
) -> None:
    s = Session.start("traced-turn", timeout=BOUND)
    with tracer.start_as_current_span("request") as request, s.turn(owner="run-1") as turn:
        turn.append("user_message", {"content": "inside"}).get(timeout=BOUND)
    s.stop(timeout=BOUND)
    span = _one(reported, "nous_actor.turn")
    assert span.context.trace_id == request.get_span_context().trace_id
    assert span.parent is not None
    assert span.parent.span_id == request.get_span_context().span_id
    assert not span.parent.is_remote


def test_a_turn_opened_in_an_asyncio_task_is_a_child_of_that_task_s_span(
    reported: Reported, tracer: Any
) -> None:
    s = Session.start("traced-async-turn", timeout=BOUND)
    ids: dict[str, int] = {}

    async def run(name: str) -> None:
        with tracer.start_as_current_span(name) as current:
            ids[name] = current.get_span_context().span_id
            async with s.turn(owner=name, policy="enqueue") as turn:
                await turn.append("user_message", {"content": name})

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(run("a"), run("b")), BOUND)

    asyncio.run(main())
    s.stop(timeout=BOUND)
    spans = [sp for sp in reported.spans.get_finished_spans() if sp.name == "nous_actor.turn"]
    assert len(spans) == 2
    for sp in spans:
        assert sp.parent is not None
        assert sp.parent.span_id == ids[sp.attributes["nous_actor.turn.owner"]]


def test_a_turn_opened_outside_any_span_is_a_root(reported: Reported) -> None:
    s = Session.start("untraced-turn", timeout=BOUND)
    with s.turn(owner="run-1"):
        pass
    s.stop(timeout=BOUND)
    assert _one(reported, "nous_actor.turn").parent is None


def test_a_compaction_span_is_a_child_of_the_span_current_at_the_compact_call(
    reported: Reported, tracer: Any
) -> None:
    s = Session.start("traced-compaction", timeout=BOUND)
    for k in range(12):
        s.append("user_message", {"content": f"message number {k} " * 20}).get(timeout=BOUND)
    compactor = Compactor(budget=200, summarise=lambda messages: "a short summary", keep_recent=2)
    with tracer.start_as_current_span("maintenance") as maintenance:
        future = s.compact(compactor)
    future.get(timeout=BOUND)  # answered after the caller's span ended: still its child
    s.stop(timeout=BOUND)
    span = _one(reported, "nous_actor.compaction")
    assert span.parent is not None
    assert span.parent.span_id == maintenance.get_span_context().span_id
    summarise = _one(reported, "nous_actor.compaction.summarise")
    assert summarise.parent is not None
    assert summarise.parent.span_id == span.context.span_id
    assert summarise.context.trace_id == maintenance.get_span_context().trace_id


def test_a_recovery_links_to_the_span_of_the_caller_that_opened_the_session(
    reported: Reported, tracer: Any, path: Path
) -> None:
    with SQLiteStore(path) as store:
        s = Session.start("traced-open", store=store, timeout=BOUND)
        s.append("user_message", {"content": "kept"}).get(timeout=BOUND)
        s.stop(timeout=BOUND)
        registry = Sessions(store, timeout=BOUND)
        try:
            with tracer.start_as_current_span("handler") as handler:
                registry.open("traced-open").count().get(timeout=BOUND)
        finally:
            registry.close(timeout=BOUND)
        with tracer.start_as_current_span("direct") as direct:
            Session.start("traced-open", store=store, timeout=BOUND).stop(timeout=BOUND)
    first, second = [
        sp for sp in reported.spans.get_finished_spans() if sp.name == "nous_actor.session.recover"
    ]
    for span, caller in ((first, handler), (second, direct)):
        assert span.parent is None  # it serves every caller that waits for it
        assert [link.context.span_id for link in span.links] == [caller.get_span_context().span_id]


def test_a_recovery_links_to_every_caller_that_waited_for_it(
    reported: Reported, tracer: Any, path: Path
) -> None:
    """Callers that arrive while a session is being read wait for that read: its span
    links to each of them."""
    with SQLiteStore(path) as store:
        s = Session.start("shared-open", store=store, timeout=BOUND)
        s.append_many([("user_message", {"content": f"m{k}"}) for k in range(2000)]).get(
            timeout=BOUND
        )
        s.stop(timeout=BOUND)
        gate = threading.Barrier(4)
        callers: list[int] = []
        registry = Sessions(store, timeout=BOUND)

        def caller(k: int) -> None:
            with tracer.start_as_current_span(f"caller-{k}") as span:
                callers.append(span.get_span_context().span_id)
                gate.wait(timeout=BOUND)
                registry.open("shared-open").count().get(timeout=BOUND)

        try:
            threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=BOUND)
        finally:
            registry.close(timeout=BOUND)
    span = _one(reported, "nous_actor.session.recover")
    linked = {link.context.span_id for link in span.links}
    assert linked  # the first opener at least; the others if they came while it read
    assert linked <= set(callers)
    assert span.parent is None


def test_a_ray_batch_links_to_the_spans_of_the_calls_it_carried(
    reported: Reported, tracer: Any
) -> None:
    pytest.importorskip("ray")
    from concurrent.futures import Future

    from nous_actor.cluster.ray._link import _Link
    from nous_actor.cluster.ray._protocol import NOW, _pack, _unpack
    from nous_actor.sessions.future import SessionFuture

    class Shard:  # answers a batch when the test says so
        def __init__(self) -> None:
            self.pending: list[tuple[Future[Any], int]] = []
            self.run = self

        def remote(self, batch: bytes) -> Any:  # (protocol, link, number, reset, count, ops)
            answer: Future[Any] = Future()
            self.pending.append((answer, _unpack(batch)[4]))
            return type("Ref", (), {"future": lambda _: answer})()

    shard = Shard()
    link = _Link(shard, 0, max_in_flight=1)
    futures: list[SessionFuture[Any]] = []
    spans: list[int] = []
    for k in range(5):  # the first goes alone; the other four wait and go as one batch
        with tracer.start_as_current_span(f"call-{k}") as call:
            spans.append(call.get_span_context().span_id)
            fut: SessionFuture[Any] = SessionFuture("s", BOUND)
            link.submit((k, "s", "h_count", ()), fut)
            futures.append(fut)
    with tracer.start_as_current_span("untraced-twin") as twin:  # the same span twice: one link
        spans.append(twin.get_span_context().span_id)
        for _ in range(2):
            fut = SessionFuture("s", BOUND)
            link.submit((9, "s", "h_count", ()), fut)
            futures.append(fut)
    first, n = shard.pending[0]
    first.set_result(_pack([(NOW, 0)] * n))
    second, n = shard.pending[1]
    second.set_result(_pack([(NOW, 0)] * n))
    for f in futures:
        f.get(timeout=BOUND)
    batches = [sp for sp in reported.spans.get_finished_spans() if sp.name == "nous_actor.batch"]
    assert [sp.attributes["nous_actor.calls"] for sp in batches] == [1, 6]
    assert [[lk.context.span_id for lk in sp.links] for sp in batches] == [spans[:1], spans[1:]]
    assert all(sp.parent is None for sp in batches)


def test_appends_never_take_the_caller_s_context(reported: Reported, tracer: Any) -> None:
    """Capturing a context is kept off the hot path: appends and reads take none."""
    taken = []
    capture = reported.sink.context

    def counting() -> Any:
        taken.append(1)
        return capture()

    reported.sink.context = counting  # type: ignore[method-assign]
    telemetry.install(reported.sink)  # the sink's context is looked up when installed
    s = Session.start("hot", timeout=BOUND)
    taken.clear()  # (a start takes one, for its recovery)
    with tracer.start_as_current_span("busy"):
        for k in range(50):
            s.append("user_message", {"content": f"m{k}"})
        s.append_many([("user_message", {"content": "x"})] * 3)
        s.count().get(timeout=BOUND)
        s.derive_messages().get(timeout=BOUND)
    s.stop(timeout=BOUND)
    assert taken == []


def test_without_a_sink_no_context_is_taken() -> None:
    old = telemetry.install(None)
    try:
        assert telemetry.context() is None
    finally:
        telemetry.install(old)


def test_spans_are_not_built_until_the_application_sets_up_tracing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sink on the global providers (opentelemetry-api installed, its SDK not set up
    yet) builds no span, whose links and attributes would be thrown away; once a
    provider is set up it does, with no new sink."""
    from opentelemetry import trace

    sink = OpenTelemetrySink(MeterProvider())
    made: list[str] = []

    class Spy:
        def start_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
            made.append(name)
            return trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)

    sink.tracer = Spy()  # type: ignore[assignment]
    for unset in (trace.ProxyTracerProvider(), trace.NoOpTracerProvider()):
        monkeypatch.setattr(trace, "get_tracer_provider", lambda unset=unset: unset)
        sink.recovered("s", "recovered", 3, 0, 10)
    assert made == []
    monkeypatch.setattr(trace, "get_tracer_provider", TracerProvider)
    sink.recovered("s", "recovered", 3, 0, 10)
    assert made == ["nous_actor.session.recover"]
    # A sink given its provider builds its spans whatever the global one is.
    given = OpenTelemetrySink(MeterProvider(), TracerProvider())
    given.tracer = Spy()  # type: ignore[assignment]
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    given.recovered("s", "recovered", 3, 0, 10)
    assert made == ["nous_actor.session.recover"] * 2
