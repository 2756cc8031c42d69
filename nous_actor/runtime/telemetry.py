"""Where the runtime reports what it does, for metrics and traces.

Each place that does something worth counting (an append, a commit, a
recovery, a restart, a compaction, a subscriber cut off) calls a hook of the
installed `Sink`, if one is installed: one global read and one comparison when
none is. With the optional extra ``otel`` (``opentelemetry-api``) the sink of
`nous_actor.runtime.otel` is installed the first time a session starts, and
reports through OpenTelemetry's API: nothing is recorded until the application
sets up an SDK with an exporter (the library configures none, as it configures no
logging), and the API's no-op instruments cost a fraction of a microsecond.

Spans join the caller's trace: a call that opens work a span will cover (a turn, a
compaction, an open that reads the store, a call batched to a Ray shard) takes
`context()` on the caller's thread (or asyncio task), and the hook gets it back
when the work is done, on whatever thread that is: the span of a turn or a
compaction is a child of it, the span of a recovery or a batch, which serves many
callers, links to each of theirs. With no sink installed `context()` is one global
read; the calls on the hot path (appends) take none.

Turn it off with the environment variable ``NOUS_ACTOR_OTEL=off`` (read at
the first session start), or at any time with ``install(None)``. A sink of
your own (a test's, or another metrics system's) is installed with `install`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["Sink", "context", "install", "probe", "sink"]


class Sink(Protocol):
    """What the runtime reports. Every method is called from runtime threads: keep it
    short, never block, never raise. Times are ``time.time_ns()`` readings, so that a
    sink can draw spans after the fact (the work they cover ran across threads).

    A caller's context is whatever the sink's `context` returned on the caller's
    thread (``None``: none to join); it may travel to another process (a Ray shard),
    so keep it small and picklable."""

    def context(self) -> object | None:
        """The calling thread's (or task's) trace context, handed back to a hook when
        the work the call opened is done (optional: a sink without it joins no trace)."""

    def recovered(
        self,
        session_id: str,
        outcome: str,
        events: int,
        start_ns: int,
        end_ns: int,
        links: Sequence[object] = (),
    ) -> None:
        """An open read the session's log from its store: ``outcome`` is ``recovered``,
        ``new`` (nothing stored) or ``failed``; ``events`` were read; ``links``: the
        contexts of the callers that opened it."""

    def appended(self, events: int) -> None:
        """A call appended ``events`` events (handed to the store, if it has one)."""

    def committed(self, events: int, start_ns: int, end_ns: int, failed: bool) -> None:
        """A store transaction of ``events`` events ran from ``start_ns`` to ``end_ns``."""

    def restarted(self, reason: str) -> None:
        """A supervisor restarted a session after a crash of type ``reason``."""

    def compacted(
        self,
        session_id: str,
        start_ns: int,
        end_ns: int,
        summary: tuple[int, int] | None,
        parent: object | None = None,
    ) -> None:
        """A compaction was recorded; ``summary`` is when its summariser ran (``None``:
        the compactor needed none); ``parent``: the context of the ``compact`` call."""

    def turn_ended(
        self,
        session_id: str,
        owner: str,
        how: str,
        start_ns: int,
        end_ns: int,
        parent: object | None = None,
    ) -> None:
        """A managed turn ended (``how``: closed, interrupted, rolled back, expired, ...);
        ``parent``: the context of the call that opened it."""

    def batch_done(
        self,
        target: str,
        calls: int,
        start_ns: int,
        end_ns: int,
        failed: bool,
        links: Sequence[object] = (),
    ) -> None:
        """A batch of ``calls`` session calls to another process (a Ray shard, ``target``)
        was answered, or failed as a whole; ``links``: the contexts of its callers."""

    def lagged(self) -> None:
        """A subscriber was cut off for lagging."""

    def watch_dispatcher(self, dispatcher: Any) -> None:
        """A dispatcher exists: report its run queue's depth."""


sink: Sink | None = None
"""The installed sink (``None``: nothing is reported)."""

_probed = False
_capture: Callable[[], object | None] | None = None  # the installed sink's ``context``


def install(new: Sink | None) -> Sink | None:
    """Install ``new`` (``None``: report nothing); returns the sink it replaces."""
    global sink, _probed, _capture
    _capture = getattr(new, "context", None)
    old, sink, _probed = sink, new, True
    return old


def context() -> object | None:
    """The calling thread's (or task's) trace context for the installed sink, to hand
    back to a hook; ``None`` when no sink is installed or it keeps none."""
    capture = _capture
    return None if capture is None else capture()


def probe() -> None:
    """Install the OpenTelemetry sink if ``opentelemetry-api`` is importable and
    ``NOUS_ACTOR_OTEL`` does not say ``off`` (once; the sessions call this as their
    first registry is made or first session starts)."""
    global _probed
    if _probed:
        return
    _probed = True
    if os.environ.get("NOUS_ACTOR_OTEL", "").strip().lower() in ("off", "0", "false", "no"):
        return
    try:
        from nous_actor.runtime import otel
    except ImportError:  # the extra is not installed
        return
    install(otel.OpenTelemetrySink())
