"""The session's store-facing side: the claim, the committer, and letting go.

At start the store is read off the actor and arrives as ``h_adopt``. Each
write is handed to the store's committer (`_submit`) and acknowledged from
the committer's thread once committed (`_on_commit`); the actor applies the
commits when it next runs (`_absorb`, ``h_committed``), and the calls that
waited for them (``_WAIT_FOR_COMMITS``) run then. On a stop every waiting call
is answered (`_shut`, `_drain`) and the writer claim is released once the
last operation in flight is done.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from typing import Any, Final

import pykka

from nous_actor._log import get_logger
from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log
from nous_actor.errors import FencedError, SessionStopped, StoreError
from nous_actor.runtime import telemetry
from nous_actor.sessions.actor._base import (
    _DEFER,
    _NONE,
    SessionState,
    _compaction_id_of,
    _safe_str,
)
from nous_actor.sessions.actor._compaction import Compacting
from nous_actor.sessions.actor._reads import Reads
from nous_actor.sessions.actor._writes import Writes
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.recovery import release
from nous_actor.sessions.turns import TurnHost
from nous_actor.store.base import Store
from nous_actor.store.committer import committer_for

logger = get_logger("nous_actor.sessions.actor")


class StoreSide(SessionState):
    """The session's claim, its commits and its stop (a part of `SessionActor`)."""

    __slots__ = ()

    # -- the store was read ----------------------------------------------------------------

    def h_adopt(
        self, token: str | None, log: Log | None, exc: BaseException | None, took: float
    ) -> None:
        """The store was read (by `READERS`): take the claim and the log, or fail to start."""
        self._loading = False
        self._store_op_done()
        retained = 0 if log is None else len(log.events())
        sink = telemetry.sink
        if sink is not None:
            end = time.time_ns()
            outcome = "failed" if log is None else "recovered" if log.count() else "new"
            links = () if self._trace_links is None else tuple(self._trace_links)
            sink.recovered(self.session_id, outcome, retained, end - int(took * 1e9), end, links)
        self._trace_links = None
        if exc is not None:
            self._start_failed(exc)
            return
        assert self.store is not None
        assert log is not None
        self.claim_token = token
        self.committer = committer_for(self.store)
        self.committer.reset(self.session_id)
        if log.count():
            logger.info(
                "session.recovered",
                session_id=self.session_id,
                reason="loaded_from_store",
                events=retained,
                count=log.count(),
                seconds=round(took, 6),
            )
        self._adopted(log)
        self.h_committed()  # the calls that waited for the log

    # -- commits ---------------------------------------------------------------------------

    def _submit(self, events: tuple[Event, ...], result: Any) -> Any:
        """Commit ``events`` (one atomic batch) and answer the current call with ``result``."""
        self.next_seq = events[-1].seq + 1
        sink = telemetry.sink
        if sink is not None:
            sink.appended(len(events))
        committer = self.committer
        if committer is None:
            for ev in events:
                self._apply(ev)
            return result
        inflight = self.inflight
        if inflight is _NONE:
            inflight = self.inflight = deque()
        inflight.extend(events)
        with self._done_lock:
            self._store_ops += 1
        committer.submit(
            self.session_id, events, partial(self._on_commit, events, self._fut, result)
        )
        return _DEFER

    def _on_commit(
        self,
        events: tuple[Event, ...],
        fut: SessionFuture[Any] | None,
        result: Any,
        err: StoreError | None,
    ) -> None:
        # In the committer's thread. Order matters:
        # 1. record the commit for the actor, which applies it when it next runs;
        # 2. if the session stopped meanwhile and this was its last append in
        #    flight, give up the writer claim *before* acknowledging, so that
        #    whoever saw the acknowledgement can reopen the session at once;
        # 3. acknowledge; 4. wake the actor only if something waits for the
        #    commit (a parked read, a subscriber) or the write failed.
        with self._done_lock:
            self._store_ops -= 1
            last = self._shutting and self._store_ops == 0
            if self._shutting:  # stopped: nobody applies it; its feeds still get it
                wake = False
                if err is None and self._closing_subs:
                    subs = self._closing_subs
                    for ev in events:
                        subs = [s for s in subs if s._push(ev)]
                    self._closing_subs = subs
            else:
                self._done.append((events, err))
                wake = (self._want_wake or err is not None) and not self._wake_sent
                if wake:
                    self._wake_sent = True
        try:
            if last:
                self._last_op_done()
            if fut is not None:
                if err is None:
                    fut._resolve(result)
                else:
                    fut._fail(err)
        finally:
            if wake:
                try:
                    self.actor_ref.tell((StoreSide.h_committed, (), None))
                except pykka.ActorDeadError:
                    pass

    def _apply(self, ev: Event) -> None:
        self.log = self.log.append_event(ev)
        if self.subscribers:
            self.subscribers = [s for s in self.subscribers if s._push(ev)]
        if ev.type is EventType.STEP_END and self._compaction_ids is not None:
            cid = _compaction_id_of(ev)
            if cid is not None:
                self._compaction_ids[cid] = ev.seq

    def _absorb(self) -> bool:
        """Apply the commits that landed; ``False`` if a failed one stopped the session."""
        with self._done_lock:
            done, self._done = self._done, []
            self._wake_sent = False
        for events, err in done:
            for ev in events:
                head = self.inflight.popleft()
                assert head is ev, "commits came back out of order"
                if err is None:
                    self._apply(ev)
            if err is not None and self.failed is None:
                self.failed = err
                self.next_seq = self.log.count()
                if isinstance(err, FencedError):  # not a crash: another writer took over
                    self._fenced(err)
                    return False
                if self.crash_on_store_failure:  # a supervisor restarts it from the store
                    self._die(err)
                    return False
        if not self.inflight:
            self.inflight = _NONE  # an idle session keeps no queue
        return True

    def _fenced(self, err: FencedError) -> None:
        """Another writer holds the session now: stop once, normally (no restart); the
        next call through a registry reopens it if the store allows."""
        logger.warning(
            "session.fenced", session_id=self.session_id, reason="fenced", error=_safe_str(err)
        )
        # Its claim is released as on any stop: a store ignores the release of a
        # claim that another writer holds now (the token is not theirs).
        self._stop()

    def h_committed(self) -> None:
        if self._done and not self._absorb():
            return
        parked = self.parked
        while parked and not (self.inflight and parked[0][0] in _WAIT_FOR_COMMITS):
            handler, args, fut = parked.popleft()
            self._run(handler, args, fut)

    # -- stopping: every waiting call answered, then the claim let go ------------------------

    def _shut(self, err: SessionStopped, feed_error: SessionStopped | None) -> None:
        """Answer everything still waiting and let go of the store (after ``actor_stopped``)."""
        self._drain(err)
        self._turns_shut(err)
        if self._ready is not None:  # stopped while recovering: its openers are told
            self._ready._fail(err)
        while self.parked:
            fut = self.parked.popleft()[2]
            if fut is not None:
                fut._fail(err)
        for fut in self._compacting.values():
            if fut is not None:
                fut._fail(err)
        self._compacting.clear()
        # Keep the writer claim until the work still with the committer (appends,
        # snapshot drops) is done: a successor must not recover the store first.
        # Subscribers get every append that commits meanwhile, then their end.
        subs, self.subscribers = self.subscribers, []
        with self._done_lock:
            self._shutting = True
            self._feed_error = feed_error
            idle = self._store_ops == 0
            done, self._done = self._done, []
            for events, failed in done:
                if failed is None:
                    for ev in events:
                        subs = [s for s in subs if s._push(ev)]
            if not idle:
                self._closing_subs = subs
                subs = []
        for sub in subs:
            sub._finish(feed_error)
        if idle:
            self._release_claim()

    def _store_op_done(self) -> None:
        """One submitted store operation finished (committer thread). If the session
        stopped meanwhile and this was the last, give up the claim now: before the
        caller's acknowledgement, so whoever saw it can reopen the session at once."""
        with self._done_lock:
            self._store_ops -= 1
            last = self._shutting and self._store_ops == 0
        if last:
            self._last_op_done()

    def _last_op_done(self) -> None:
        """The stopped session's last store operation is done: end the feeds that
        waited for it and give up the claim."""
        with self._done_lock:
            subs, self._closing_subs = self._closing_subs, []
        for sub in subs:
            sub._finish(self._feed_error)
        self._release_claim()

    def _release_claim(self) -> None:
        """Give up the claim, then set ``released`` (a successor waits for it)."""
        store, token, self.claim_token = self.store, self.claim_token, None
        if store is None or token is None:
            self.released.set()
        else:
            self._release_now(store, token)

    def _release_now(self, store: Store, token: str) -> None:
        try:
            store.release(self.session_id, token)
        except Exception as exc:
            logger.warning(
                "session.release_failed",
                session_id=self.session_id,
                reason=type(exc).__name__,
                error=_safe_str(exc),
            )
        finally:
            self.released.set()

    def _drain(self, err: SessionStopped) -> None:
        """Answer every call still in the inbox (run only after ``actor_stopped`` is set)."""
        inbox = self.actor_inbox
        while not inbox.empty():
            envelope = inbox.get()
            msg = envelope.message
            if type(msg) is tuple and len(msg) == 3 and msg[0] is StoreSide.h_adopt:
                # The store was read for a session that stopped meanwhile: let go of it.
                token = msg[1][0]
                if token is not None and self.store is not None:
                    release(self.store, self.session_id, token)
                self._loading = False
                self._store_op_done()
            elif type(msg) is tuple and len(msg) == 3 and isinstance(msg[2], SessionFuture):
                msg[2]._fail(err)
            elif envelope.reply_to is not None:
                try:
                    envelope.reply_to.set_exception(
                        (pykka.ActorDeadError, pykka.ActorDeadError(str(err)), None)
                    )
                except Exception:  # already answered
                    pass


# Calls that must see every append made before them (they wait for its commit).
_WAIT_FOR_COMMITS: Final = frozenset(
    {
        Reads.h_read,
        Reads.h_log,
        Writes.h_snapshot,
        Compacting.h_compact,
        Compacting.h_compact_summary,
        Compacting.h_compact_done,
        Writes.h_fork,
        Reads.h_flush,
        TurnHost.h_turn_read,
    }
)
