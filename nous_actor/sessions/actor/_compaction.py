"""Compaction: planned on the actor, summarised elsewhere, committed on the actor.

The summary is written off the actor (`_summarise`: on the caller's event
loop, or in a thread of its own) and sent back as ``h_compact_summary``; the
batch commits like any append, and ``h_compact_done`` answers the call once it
is applied. A compaction id in the log already is never applied again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from typing import Any, Final

import pykka

from nous_actor._log import get_logger
from nous_actor.core.compaction import (
    CompactionError,
    CompactionResult,
    Compactor,
    Plan,
    log_compacted,
    run_summariser,
)
from nous_actor.core.event import EventType
from nous_actor.core.log import _utcnow, new_event
from nous_actor.errors import SessionStopped, StoreError
from nous_actor.runtime import scheduling, telemetry
from nous_actor.sessions.actor._base import _DEFER, SessionState, _compaction_id_of, _safe_str
from nous_actor.sessions.actor._summary import _Compaction, _is_async, _run_awaitable
from nous_actor.sessions.actor._writes import Writes
from nous_actor.sessions.future import SessionFuture

logger = get_logger("nous_actor.sessions.actor")

MAX_COMPACTION_RETRIES: Final = 2
"""How often a compaction is planned again when a replace appended while its summary
was being written overlaps it, before it fails with ``CompactionError``."""


class Compacting(SessionState):
    """The session's ``compact`` call and the steps it goes through (a part of
    `SessionActor`; ``h_committed`` is the store side's, reached through the
    actor's class)."""

    __slots__ = ()

    def h_compact(self, req: _Compaction) -> Any:
        try:
            return self._compact(req)
        finally:
            if req.slot is not None:  # no summary asked of it (a no-op once it was)
                req.slot.release()

    def _compact(self, req: _Compaction) -> Any:
        self._check_writable()
        known = self._known_compaction(req)
        if known is not None:
            return known
        c = req.compactor
        plan = c.plan(self.log.surface(), self.log.count(), force=req.force)
        if plan.empty:
            return CompactionResult(self.log._view(), plan.before, plan.before, budget=c.budget)
        if telemetry.sink is not None:  # timed from its first plan (retries included)
            times = self._compaction_times
            if times is None:
                times = self._compaction_times = {}
            times.setdefault(req.cid, [time.time_ns(), 0, 0, req.context])
        if not plan.needs_summary:
            return self._commit_compaction(req, plan, None)
        fut = self._fut
        self._compacting[req.cid] = fut
        try:
            self._summarise(req, plan, fut)
        except BaseException:
            self._compacting.pop(req.cid, None)
            raise
        return _DEFER

    def _summarise(self, req: _Compaction, plan: Plan, fut: SessionFuture[Any] | None) -> None:
        """Have the summary written off this actor, then sent back to it.

        A coroutine summariser runs on the caller's event loop when the call came
        from one, else (like a plain callable) in a thread of its own.
        """
        ref = self.actor_ref
        times = self._compaction_times
        if times is not None and req.cid in times:
            times[req.cid][1] = time.time_ns()

        def deliver(summary: Any, exc: BaseException | None) -> None:
            try:
                ref.tell((Compacting.h_compact_summary, (req, plan, summary, exc), fut))
            except pykka.ActorDeadError:
                if fut is not None:  # the session stopped while the summary was written
                    fut._fail(SessionStopped(self.session_id, "the session stopped"))

        slot = req.slot
        if slot is not None and slot.submit(req.compactor, plan.summary_input, deliver):
            return
        loop = req.loop
        if loop is not None and _is_async(req.compactor.summarise) and not loop.is_closed():
            coro = run_summariser(req.compactor, plan.summary_input)  # only makes the coroutine
            try:
                done = asyncio.run_coroutine_threadsafe(coro, loop)
            except RuntimeError:  # the loop closed meanwhile
                coro.close()
            else:

                def landed(cf: Any) -> None:
                    try:
                        deliver(cf.result(), None)
                    except BaseException as exc:
                        deliver(None, exc)

                done.add_done_callback(landed)
                return

        def work() -> None:
            try:
                out = run_summariser(req.compactor, plan.summary_input)
                if inspect.isawaitable(out):
                    out = _run_awaitable(out)
            except BaseException as exc:
                deliver(None, exc)
            else:
                deliver(out, None)

        name = f"nous-summarise-{self.session_id}"
        scheduling.spawn(work, name)  # a thread (a task, in a simulation)

    def h_compact_summary(
        self, req: _Compaction, plan: Plan, summary: Any, exc: BaseException | None
    ) -> Any:
        self._compacting.pop(req.cid, None)
        times = self._compaction_times
        if times is not None and req.cid in times:
            times[req.cid][2] = time.time_ns()
            if exc is not None:  # not recorded: not reported
                self._report_compaction(req.cid, report=False)
        if exc is not None:
            if isinstance(exc, CompactionError):
                raise exc
            raise CompactionError(
                f"the summariser failed: {type(exc).__name__}: {_safe_str(exc)}; log unchanged"
            ) from exc
        return self._commit_compaction(req, plan, summary)

    def _commit_compaction(self, req: _Compaction, plan: Plan, summary: Any) -> Any:
        self._check_writable()
        known = self._known_compaction(req)
        if known is not None:  # applied already: at most once
            return known
        clash = plan.overlaps(self.log.since(plan.count))
        if clash is not None:
            if req.attempt < MAX_COMPACTION_RETRIES:
                logger.info(
                    "session.compaction_retried",
                    session_id=self.session_id,
                    compaction_id=req.cid,
                    reason="overlapping_replace",
                    seq=clash.seq,
                )
                return self.h_compact(dataclasses.replace(req, attempt=req.attempt + 1))
            raise CompactionError(
                f"a replace appended while the summary was written (seq {clash.seq}) overlaps "
                f"the compaction's range, {req.attempt + 1} times; compact again later"
            )
        try:
            specs, result = req.compactor.events(plan, summary, self.next_seq, req.cid)
        except CompactionError:  # refused (no str, or larger): not recorded, not reported
            self._report_compaction(req.cid, report=False)
            raise
        t = _utcnow() if req.time is None else req.time
        events = tuple(
            new_event(self.next_seq + k, etype, data, t) for k, (etype, data) in enumerate(specs)
        )
        fut, self._fut = self._fut, None  # answered once applied, not once committed
        self._submit(events, None)
        if self.inflight:
            self._park().append((Compacting.h_compact_done, (result, req.compactor), fut))
            return _DEFER
        return self.h_compact_done(result, req.compactor)

    def h_compact_done(self, result: CompactionResult, compactor: Compactor) -> CompactionResult:
        record = self.log.since(result.record_seq or 0)[:1]
        if not record or record[0].seq != result.record_seq:
            raise self.failed or StoreError(
                "the compaction was not stored", session_id=self.session_id
            )
        if compactor.snapshot:  # runs next, before any later call
            self._park().appendleft((Writes.h_snapshot, (), None))
            self.actor_ref.tell((type(self).h_committed, (), None))
        out = dataclasses.replace(result, log=self.log._view())
        log_compacted(out, session_id=self.session_id)
        self._report_compaction(result.compaction_id)
        return out

    def _report_compaction(self, cid: str | None, *, report: bool = True) -> None:
        times = self._compaction_times
        if times is None or cid is None:
            return
        started = times.pop(cid, None)
        if not times:
            self._compaction_times = None
        sink = telemetry.sink
        if started is None or sink is None or not report:
            return
        start, summary_start, summary_end, context = started
        summary = (summary_start, summary_end) if summary_end else None
        sink.compacted(self.session_id, start, time.time_ns(), summary, context)

    def _known_compaction(self, req: _Compaction) -> CompactionResult | None:
        """The result of compaction ``req.cid`` if it is in the log already (only an id
        the caller chose can be: a fresh one is looked up nowhere)."""
        if not req.explicit:
            return None
        cid = req.cid
        ids = self._compaction_ids
        if ids is None:  # first use: index the compaction records in the log
            ids = {}
            for ev in self.log.events():
                if ev.type is EventType.STEP_END:
                    found = _compaction_id_of(ev)
                    if found is not None:
                        ids[found] = ev.seq
            self._compaction_ids = ids
        seq = ids.get(cid)
        if seq is None:
            return None
        rec = self.log.since(seq)[:1]
        data: Any = rec[0].data if rec and rec[0].seq == seq else {}
        summarised = data.get("summarised")
        return CompactionResult(
            self.log._view(),
            data.get("estimate_before", 0),
            data.get("estimate_after", 0),
            tuple(data.get("pruned") or ()),
            tuple(summarised) if summarised else None,
            data.get("summary_seq"),
            seq,
            cid,
            data.get("budget"),
        )
