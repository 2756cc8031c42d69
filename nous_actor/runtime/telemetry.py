"""Where the runtime reports what it does, for metrics and traces.

Each place that does something worth counting (an append, a commit, a
recovery, a restart, a compaction, a subscriber cut off) calls a hook of the
installed `Sink`, if one is installed: one global read and one comparison when
none is. With the optional extra ``otel`` (``opentelemetry-api``) the sink of
`nous_actor.runtime.otel` is installed the first time a session starts, and
reports through OpenTelemetry's API: nothing is recorded until the application
sets up an SDK with an exporter (the library configures none, as it configures no
logging), and the API's no-op instruments cost a fraction of a microsecond.

Turn it off with the environment variable ``NOUS_ACTOR_OTEL=off`` (read at
the first session start), or at any time with ``install(None)``. A sink of
your own (a test's, or another metrics system's) is installed with `install`.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

__all__ = ["Sink", "install", "probe", "sink"]


class Sink(Protocol):
    """What the runtime reports. Every method is called from runtime threads: keep it
    short, never block, never raise. Times are ``time.time_ns()`` readings, so that a
    sink can draw spans after the fact (the work they cover ran across threads)."""

    def recovered(
        self, session_id: str, outcome: str, events: int, start_ns: int, end_ns: int
    ) -> None:
        """An open read the session's log from its store: ``outcome`` is ``recovered``,
        ``new`` (nothing stored) or ``failed``; ``events`` were read."""

    def appended(self, events: int) -> None:
        """A call appended ``events`` events (handed to the store, if it has one)."""

    def committed(self, events: int, start_ns: int, end_ns: int, failed: bool) -> None:
        """A store transaction of ``events`` events ran from ``start_ns`` to ``end_ns``."""

    def restarted(self, reason: str) -> None:
        """A supervisor restarted a session after a crash of type ``reason``."""

    def compacted(
        self, session_id: str, start_ns: int, end_ns: int, summary: tuple[int, int] | None
    ) -> None:
        """A compaction was recorded; ``summary`` is when its summariser ran (``None``:
        the compactor needed none)."""

    def turn_ended(
        self, session_id: str, owner: str, how: str, start_ns: int, end_ns: int
    ) -> None:
        """A managed turn ended (``how``: closed, interrupted, rolled back, expired, ...)."""

    def batch_done(
        self, target: str, calls: int, start_ns: int, end_ns: int, failed: bool
    ) -> None:
        """A batch of ``calls`` session calls to another process (a Ray shard, ``target``)
        was answered, or failed as a whole."""

    def lagged(self) -> None:
        """A subscriber was cut off for lagging."""

    def watch_dispatcher(self, dispatcher: Any) -> None:
        """A dispatcher exists: report its run queue's depth."""


sink: Sink | None = None
"""The installed sink (``None``: nothing is reported)."""

_probed = False


def install(new: Sink | None) -> Sink | None:
    """Install ``new`` (``None``: report nothing); returns the sink it replaces."""
    global sink, _probed
    old, sink, _probed = sink, new, True
    return old


def probe() -> None:
    """Install the OpenTelemetry sink if ``opentelemetry-api`` is importable and
    ``NOUS_ACTOR_OTEL`` does not say ``off`` (once; the sessions call this as their
    first session starts)."""
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
