"""The OpenTelemetry sink: the runtime's reports as OpenTelemetry metrics and spans.

Needs the optional extra ``otel`` (``opentelemetry-api``); `nous_actor.runtime.telemetry`
installs it when the first session starts. It uses only the API: the application
sets up the SDK and its exporters (until it does, the instruments are no-ops).
Every instrument is made once, here, under the meter ``nous_actor``:

======================================== ============== ===================================
name                                     kind (unit)    attributes
======================================== ============== ===================================
``nous_actor.session.live``              up-down counter
                                         (``{session}``,
                                         observed)
``nous_actor.session.opens``             counter        ``nous_actor.outcome``: recovered,
                                         (``{session}``) new, failed
``nous_actor.session.recovery.duration`` histogram (s)  ``nous_actor.outcome``
``nous_actor.session.appends``           counter
                                         (``{event}``,
                                         observed)
``nous_actor.store.commit.duration``     histogram (s)  ``nous_actor.outcome``: ok, failed
``nous_actor.store.commit.size``         histogram
                                         (``{event}``)
``nous_actor.session.restarts``          counter        ``nous_actor.reason``: the crash's
                                                        exception type
``nous_actor.compaction.count``          counter
``nous_actor.compaction.duration``       histogram (s)
``nous_actor.compaction.summariser.``    histogram (s)
``duration``
``nous_actor.batch.size``                histogram      ``nous_actor.outcome``
                                         (``{call}``)
``nous_actor.subscription.lagged``       counter
``nous_actor.dispatcher.queue.depth``    gauge          ``nous_actor.dispatcher``: its name
                                         (``{actor}``)
======================================== ============== ===================================

Spans (tracer ``nous_actor``), drawn when the work they cover is done (it ran
across threads): ``nous_actor.session.recover`` (an open's read of its store),
``nous_actor.compaction`` with its child ``nous_actor.compaction.summarise``, and
``nous_actor.turn``, each with ``session.id``; and ``nous_actor.batch``, a batch
of calls to a Ray shard (``nous_actor.target``, ``nous_actor.calls``).

They join the caller's trace. A turn's span is a child of the span current where
the turn was opened, a compaction's of the one current at the ``compact`` call
(captured on the caller's thread or asyncio task, as the work runs elsewhere); a
recovery and a batch serve many callers, so their spans are roots that link to
each caller's span (at most `MAX_LINKS`, distinct). A caller's context is kept
as a plain tuple (trace id, span id, flags, trace state, process id), so that it
travels to a Ray shard with the call.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Final

import pykka

from nous_actor.runtime.extras import missing_extra

try:
    from opentelemetry import metrics, trace
    from opentelemetry.context import Context
except ImportError as exc:
    missing_extra("otel", __name__, exc)

from nous_actor._version import __version__

__all__ = ["MAX_LINKS", "METER", "OpenTelemetrySink"]

METER: Final = "nous_actor"
"""The name of the library's meter and tracer."""

MAX_LINKS: Final = 128
"""The most callers a recovery or batch span links to (the SDK's default limit)."""

# A caller's span, as captured: trace id, span id, trace flags, trace state (its
# header, "" if none), the capturing process's id (a parent from elsewhere is remote).
Captured = tuple[int, int, int, str, int]


def _capture() -> Captured | None:
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    state = sc.trace_state.to_header() if sc.trace_state else ""
    return (sc.trace_id, sc.span_id, int(sc.trace_flags), state, os.getpid())


def _span_context(captured: object) -> trace.SpanContext | None:
    """The span context a capture stands for (``None``: not one of ours)."""
    if type(captured) is not tuple or len(captured) != 5:
        return None
    trace_id, span_id, flags, state, pid = captured
    return trace.SpanContext(
        trace_id,
        span_id,
        is_remote=pid != os.getpid(),
        trace_flags=trace.TraceFlags(flags),
        trace_state=trace.TraceState.from_header([state]) if state else None,
    )


def _parent(captured: object | None) -> Context | None:
    sc = None if captured is None else _span_context(captured)
    return None if sc is None else trace.set_span_in_context(trace.NonRecordingSpan(sc))


def _links(captured: Sequence[object]) -> list[trace.Link] | None:
    if not captured:
        return None
    seen: set[tuple[int, int]] = set()
    out = []
    for c in captured:
        sc = _span_context(c)
        if sc is None or (sc.trace_id, sc.span_id) in seen:
            continue
        seen.add((sc.trace_id, sc.span_id))
        out.append(trace.Link(sc))
        if len(out) == MAX_LINKS:
            break
    return out or None


_NO_TRACING: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
"""The global tracer providers whose spans record nothing: the API's own, until the
application sets up the SDK."""

_OK: Final = {"nous_actor.outcome": "ok"}
_FAILED: Final = {"nous_actor.outcome": "failed"}


class OpenTelemetrySink:
    """Reports through the global meter and tracer providers of OpenTelemetry's API."""

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        meter = metrics.get_meter(METER, __version__, meter_provider)
        self.tracer = trace.get_tracer(METER, __version__, tracer_provider)
        self._global_tracing = tracer_provider is None
        meter.create_observable_up_down_counter(
            "nous_actor.session.live",
            [self._live],
            "{session}",
            "Sessions live in this process",
        )
        self.opens = meter.create_counter(
            "nous_actor.session.opens", "{session}", "Sessions opened, by outcome"
        )
        self.recovery = meter.create_histogram(
            "nous_actor.session.recovery.duration", "s", "Time to read a session's log at open"
        )
        # Appends are counted in a cell per thread (no lock, no instrument call on the
        # hot path) and summed when the metrics are collected. The cell of a thread that
        # ended is folded into ``_retired`` (a process that runs a pinned session per
        # conversation starts ever new threads).
        self._cells: dict[int, list[int]] = {}
        self._retired = 0
        self._cells_lock = threading.Lock()
        self._local = threading.local()
        meter.create_observable_counter(
            "nous_actor.session.appends",
            [self._appends],
            "{event}",
            "Events appended to sessions",
        )
        self.commit = meter.create_histogram(
            "nous_actor.store.commit.duration", "s", "Time of one store transaction"
        )
        self.commit_size = meter.create_histogram(
            "nous_actor.store.commit.size", "{event}", "Events written by one store transaction"
        )
        self.restarts = meter.create_counter(
            "nous_actor.session.restarts", "{restart}", "Restarts by a supervisor, by reason"
        )
        self.compactions = meter.create_counter(
            "nous_actor.compaction.count", "{compaction}", "Compactions recorded"
        )
        self.compaction = meter.create_histogram(
            "nous_actor.compaction.duration", "s", "Time of a compaction, summariser included"
        )
        self.summariser = meter.create_histogram(
            "nous_actor.compaction.summariser.duration", "s", "Time a summariser took"
        )
        self.batches = meter.create_histogram(
            "nous_actor.batch.size", "{call}", "Session calls carried by one call to a shard"
        )
        self.lags = meter.create_counter(
            "nous_actor.subscription.lagged", "{subscriber}", "Subscribers cut off for lagging"
        )
        self._dispatchers: weakref.WeakSet[Any] = weakref.WeakSet()
        meter.create_observable_gauge(
            "nous_actor.dispatcher.queue.depth",
            [self._queue_depths],
            "{actor}",
            "Actors waiting for a dispatcher thread",
        )

    # -- the caller's thread ------------------------------------------------------------------

    def context(self) -> Captured | None:
        """The span current on the calling thread (or task), if any, as a plain tuple."""
        return _capture()

    # -- the hooks (runtime threads) ---------------------------------------------------------

    def recovered(
        self,
        session_id: str,
        outcome: str,
        events: int,
        start_ns: int,
        end_ns: int,
        links: Sequence[object] = (),
    ) -> None:
        attributes = {"nous_actor.outcome": outcome}
        self.opens.add(1, attributes)
        if outcome == "new":
            return
        self.recovery.record((end_ns - start_ns) / 1e9, attributes)
        self._span(
            "nous_actor.session.recover",
            start_ns,
            end_ns,
            {"session.id": session_id, "nous_actor.outcome": outcome, "nous_actor.events": events},
            failed=outcome == "failed",
            links=links,
        )

    def appended(self, events: int) -> None:
        try:
            self._local.cell[0] += events  # only this thread writes its cell
        except AttributeError:
            cell = [events]
            # Kept by this thread's local only: freed as the thread ends, which folds
            # the cell into the total.
            mark = _ThreadMark()
            weakref.finalize(mark, _retire, weakref.ref(self), cell)
            with self._cells_lock:
                self._cells[id(cell)] = cell
            self._local.cell = cell
            self._local.mark = mark

    def _retire(self, cell: list[int]) -> None:
        """A thread that counted appends in ``cell`` ended: its count joins the total."""
        with self._cells_lock:
            if self._cells.pop(id(cell), None) is not None:
                self._retired += cell[0]

    def committed(self, events: int, start_ns: int, end_ns: int, failed: bool) -> None:
        attributes = _FAILED if failed else _OK
        self.commit.record((end_ns - start_ns) / 1e9, attributes)
        self.commit_size.record(events, attributes)

    def restarted(self, reason: str) -> None:
        self.restarts.add(1, {"nous_actor.reason": reason})

    def compacted(
        self,
        session_id: str,
        start_ns: int,
        end_ns: int,
        summary: tuple[int, int] | None,
        parent: object | None = None,
    ) -> None:
        self.compactions.add(1)
        self.compaction.record((end_ns - start_ns) / 1e9)
        attributes = {"session.id": session_id}
        span = self.tracer.start_span(
            "nous_actor.compaction", _parent(parent), attributes=attributes, start_time=start_ns
        )
        if summary is not None:
            self.summariser.record((summary[1] - summary[0]) / 1e9)
            child = self.tracer.start_span(
                "nous_actor.compaction.summarise",
                trace.set_span_in_context(span),
                attributes=attributes,
                start_time=summary[0],
            )
            child.end(summary[1])
        span.end(end_ns)

    def turn_ended(
        self,
        session_id: str,
        owner: str,
        how: str,
        start_ns: int,
        end_ns: int,
        parent: object | None = None,
    ) -> None:
        self._span(
            "nous_actor.turn",
            start_ns,
            end_ns,
            {"session.id": session_id, "nous_actor.turn.owner": owner, "nous_actor.turn.end": how},
            parent=parent,
        )

    def batch_done(
        self,
        target: str,
        calls: int,
        start_ns: int,
        end_ns: int,
        failed: bool,
        links: Sequence[object] = (),
    ) -> None:
        self.batches.record(calls, _FAILED if failed else _OK)
        self._span(
            "nous_actor.batch",
            start_ns,
            end_ns,
            {"nous_actor.target": target, "nous_actor.calls": calls},
            failed=failed,
            links=links,
        )

    def lagged(self) -> None:
        self.lags.add(1)

    def watch_dispatcher(self, dispatcher: Any) -> None:
        self._dispatchers.add(dispatcher)

    def _span(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        *,
        failed: bool = False,
        parent: object | None = None,
        links: Sequence[object] = (),
    ) -> None:
        if self._global_tracing and isinstance(trace.get_tracer_provider(), _NO_TRACING):
            return  # no SDK set up (yet): the span would be a no-op, its links built for nothing
        span = self.tracer.start_span(
            name,
            _parent(parent),
            attributes=attributes,
            links=_links(links),
            start_time=start_ns,
        )
        if failed:
            span.set_status(trace.StatusCode.ERROR)
        span.end(end_ns)

    # -- observed at export ------------------------------------------------------------------

    def _appends(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        with self._cells_lock:
            total = self._retired + sum(cell[0] for cell in self._cells.values())
        return [metrics.Observation(total)]

    def _live(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return [metrics.Observation(len(pykka.ActorRegistry.get_by_class_name("SessionActor")))]

    def _queue_depths(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return [
            metrics.Observation(d.queued(), {"nous_actor.dispatcher": d.name})
            for d in list(self._dispatchers)
        ]


class _ThreadMark:
    """(Held by one thread's local only.) Freed as its thread ends."""

    __slots__ = ("__weakref__",)


def _retire(sink: weakref.ref[OpenTelemetrySink], cell: list[int]) -> None:
    """(As a thread that counted appends ends.) Fold its cell into the sink's total."""
    alive = sink()
    if alive is not None:
        alive._retire(cell)
