"""`Compactions`: a session's compactions in flight, and the ids of those in its log."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from nous_actor.core.compaction import CompactionResult
from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log
from nous_actor.errors import SessionStopped
from nous_actor.runtime import telemetry
from nous_actor.sessions.future import SessionFuture

MAX_COMPACTION_RETRIES: Final = 2
"""How often a compaction is planned again when a replace appended while its summary
was being written overlaps it, before it fails with ``CompactionError``."""


class Compactions:
    """What a session's actor keeps of its compactions (made by its first ``compact``).

    Invariants: ``running`` holds each compaction whose summary is being written off
    the actor (by id, with the future of the call that waits for it): the session is
    not idle while one is; each is answered once (by its result, or at the stop).
    ``ids`` (built on first use, then kept current by `applied`) maps each compaction
    id in the log to its record's seq, so a compaction id already applied is never
    applied again. ``times`` holds the timing of each compaction being made while
    telemetry is on (``[start, summariser start, summariser end, caller's context]``).
    ``replaced`` holds every replace applied to the log since ``watched_from`` (the
    log's count when the oldest compaction running began) while one was running:
    the only events that can make its plan wrong (see `appended_since`); a
    compaction is committed in the call that saw it land, so none is applied
    between the last one landing and its commit.
    """

    __slots__ = ("ids", "replaced", "running", "times", "watched_from")

    def __init__(self) -> None:
        self.running: dict[str, SessionFuture[Any] | None] = {}
        self.ids: dict[str, int] | None = None
        self.times: dict[str, list[Any]] | None = None
        self.replaced: list[Event] = []
        self.watched_from: int | None = None

    # -- in flight -------------------------------------------------------------------------

    def begin(self, cid: str, fut: SessionFuture[Any] | None, count: int) -> None:
        """The summary of compaction ``cid``, planned on a log of ``count`` events, is
        being written; ``fut`` waits for it."""
        if not self.running:  # the first one running: the replaces are watched from here
            self.replaced = []
            self.watched_from = count
        self.running[cid] = fut

    def saw(self, ev: Event) -> None:
        """``ev`` was applied to the log while a compaction runs: kept if it is a replace
        (`appended_since`)."""
        if ev.surface_op is not None:
            self.replaced.append(ev)

    def appended_since(self, log: Log, count: int) -> Sequence[Event]:
        """What may make a plan made on ``count`` events wrong, for `Plan.overlaps`.

        An event appended after the plan stands at its seq (``>= count``), past
        every range the plan replaces, unless it is a replace: so the replaces
        applied since are all it needs to look at, when this watched every event
        applied since ``count`` — not every event appended while a summary was
        written, which a busy session makes thousands of. Otherwise (a plan
        committed in the call that made it) the log's events since ``count``.
        """
        since = self.watched_from
        if since is not None and since <= count:
            return [ev for ev in self.replaced if ev.seq >= count]
        return log.since(count)

    def landed(self, cid: str) -> None:
        """The summary of compaction ``cid`` came back (or was never sent)."""
        self.running.pop(cid, None)

    def stop(self, err: SessionStopped) -> None:
        """The session stops: every call waiting for a summary is answered with ``err``."""
        for fut in self.running.values():
            if fut is not None:
                fut._fail(err)
        self.running.clear()

    # -- the ids in the log ----------------------------------------------------------------

    def applied(self, ev: Event) -> None:
        """``ev`` (a ``step_end``) was applied: index it if it records a compaction."""
        ids = self.ids
        if ids is not None:
            _index(ids, ev)

    def _ids(self, log: Log) -> dict[str, int]:
        """The index of the compaction ids in ``log`` (built from it on first use)."""
        ids = self.ids
        if ids is None:
            ids = {}
            for ev in log.events():
                if ev.type is EventType.STEP_END:
                    _index(ids, ev)
            self.ids = ids
        return ids

    def absorbed(self, log: Log, summarised: tuple[int, int] | None) -> list[str]:
        """The ids of the compactions whose records a summary of the positions
        ``summarised`` shadows (a later snapshot drops them): the new record carries them
        (the newest `MAX_ABSORBED`), so that a retried compaction is never applied again,
        after a restart too."""
        if summarised is None:
            return []
        start, stop = summarised
        ids = self._ids(log)
        return [cid for cid, seq in ids.items() if start <= seq <= stop][-MAX_ABSORBED:]

    def known(self, log: Log, cid: str) -> CompactionResult | None:
        """The result of compaction ``cid`` if ``log`` holds it already (the record of a
        later compaction that absorbed its record: how many events it pruned or summarised
        is then not known, only that it was applied)."""
        seq = self._ids(log).get(cid)
        if seq is None:
            return None
        rec = log.since(seq)[:1]
        data: Any = rec[0].data if rec and rec[0].seq == seq else {}
        if data.get("compaction_id") != cid:
            return CompactionResult(log._view(), 0, 0, (), None, None, seq, cid, None)
        summarised = data.get("summarised")
        return CompactionResult(
            log._view(),
            data.get("estimate_before", 0),
            data.get("estimate_after", 0),
            tuple(data.get("pruned") or ()),
            tuple(summarised) if summarised else None,
            data.get("summary_seq"),
            seq,
            cid,
            data.get("budget"),
        )

    # -- timing (telemetry) ----------------------------------------------------------------

    def timed(self, cid: str, context: object) -> None:
        """Compaction ``cid`` is being made (timed from its first plan, retries included)."""
        times = self.times
        if times is None:
            times = self.times = {}
        times.setdefault(cid, [time.time_ns(), 0, 0, context])

    def mark(self, cid: str, which: int) -> bool:
        """Its summariser started (``which`` 1) or ended (2); ``False`` if not timed."""
        times = self.times
        if times is None or cid not in times:
            return False
        times[cid][which] = time.time_ns()
        return True

    def report(self, session_id: str, cid: str | None, *, report: bool = True) -> None:
        """Compaction ``cid`` ended: its span is reported (unless not ``report``)."""
        times = self.times
        if times is None or cid is None:
            return
        started = times.pop(cid, None)
        if not times:
            self.times = None
        sink = telemetry.sink
        if started is None or sink is None or not report:
            return
        start, summary_start, summary_end, context = started
        summary = (summary_start, summary_end) if summary_end else None
        sink.compacted(session_id, start, time.time_ns(), summary, context)


MAX_ABSORBED: Final = 64
"""The most compaction ids a compaction's record carries of those whose records its
summary shadows (a retry comes within seconds of its first try, not 64 compactions
later; a record carrying every id ever used would grow with the session)."""


def _index(ids: dict[str, int], ev: Event) -> None:
    """Index the compaction ``ev`` records, if it records one, and those it absorbed."""
    cid = compaction_id_of(ev)
    if cid is None:
        return
    ids[cid] = ev.seq
    absorbed = ev.data.get("absorbed")
    if isinstance(absorbed, Sequence) and not isinstance(absorbed, str):
        for old in absorbed:
            if isinstance(old, str):
                ids.pop(old, None)  # (newest last: the order `absorbed` takes the newest by)
                ids[old] = ev.seq


def compaction_id_of(ev: Event) -> str | None:
    """The compaction id a ``step_end`` records, if it records a compaction."""
    data = ev.data
    if data.get("step") != "compaction":
        return None
    cid = data.get("compaction_id")
    return cid if isinstance(cid, str) else None
