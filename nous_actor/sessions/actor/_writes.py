"""The calls that write a session: appends, snapshot, fork.

An append is given its seq here and handed to the store side (`_submit`),
which answers it once it is committed.
"""

from __future__ import annotations

from typing import Any

from nous_actor._log import get_logger
from nous_actor.core.event import Event, InvalidEvent
from nous_actor.core.limits import MAX_SEQ
from nous_actor.core.log import Log, _behind_head, new_event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.sessions.actor._base import _DEFER, EventParts, SessionState

logger = get_logger("nous_actor.sessions.actor")


class Writes(SessionState):
    """The session's write calls (a part of `SessionActor`)."""

    __slots__ = ()

    # -- writes ----------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.failed is not None:
            raise StoreError(
                f"refuses appends after a store failure ({self.failed}); "
                "restart the session to reload it from the store",
                session_id=self.session_id,
            )

    def h_append(self, parts: EventParts) -> Any:
        """Append an event the caller's thread already checked and froze."""
        self._check_writable()
        if self.next_seq > MAX_SEQ:
            raise _past_last_seq(self.next_seq)
        ev = Event._trusted(self.next_seq, *parts)
        return self._submit((ev,), ev)

    def h_append_many(self, batch: tuple[EventParts, ...]) -> Any:
        """Append several checked events under consecutive seqs, as one atomic commit."""
        self._check_writable()
        if not batch:
            return []
        first = self.next_seq
        if first + len(batch) - 1 > MAX_SEQ:
            raise _past_last_seq(first + len(batch) - 1)
        events = tuple(Event._trusted(first + k, *parts) for k, parts in enumerate(batch))
        return self._submit(events, list(events))

    def h_append_at(self, seq: int, parts: EventParts) -> Any:
        self._check_writable()
        if seq < self.next_seq:
            raise _behind_head(seq, self.next_seq)
        ev = Event._trusted(seq, *parts)
        return self._submit((ev,), ev)

    def h_snapshot(self) -> Any:
        before = self.log.events()
        self.log = self.log.snapshot()
        kept = {ev.seq for ev in self.log.events()}
        dropped = [ev.seq for ev in before if ev.seq not in kept]
        if self.committer is None or not dropped:
            return len(dropped)
        fut = self._fut

        def done(err: StoreError | None) -> None:
            self._store_op_done()
            if fut is not None:
                if err is None:
                    fut._resolve(len(dropped))
                else:
                    fut._fail(err)

        with self._done_lock:
            self._store_ops += 1
        self.committer.submit_drop(self.session_id, dropped, done)
        return _DEFER

    # -- fork ------------------------------------------------------------------------------

    def h_fork(self, through_seq: int, new_id: str | None) -> Log:
        prefix = self.log.fork(through_seq)
        if self.store is None or new_id is None:
            return prefix
        if new_id == self.session_id:
            raise ValueError("fork into a new session id, not the session's own")
        token = self.store.claim(new_id)  # no live session may hold the new id
        try:
            return self._write_fork(prefix, through_seq, new_id)
        finally:
            self.store.release(new_id, token)

    def _write_fork(self, prefix: Log, through_seq: int, new_id: str) -> Log:
        assert self.store is not None
        record = new_event(
            prefix.count(),
            "request_header",
            {"forked_from": {"session_id": self.session_id, "through_seq": through_seq}},
            None,
        )
        forked = prefix.append_event(record)
        if self.store.load(new_id):
            raise ConflictError(
                "already has events; fork into a new session id", session_id=new_id
            )
        refused = self.store.write({new_id: forked.events()})
        if new_id in refused:
            raise refused[new_id]
        logger.info(
            "session.forked", session_id=self.session_id, fork_id=new_id, through_seq=through_seq
        )
        return forked


def _past_last_seq(seq: int) -> InvalidEvent:
    """A session whose next seq is past the last a store keeps (after an ``append_at``
    of the last one) refuses further appends at the call, as `Log.append` does."""
    return InvalidEvent(
        "invalid_event",
        f"seq {seq} is past the last seq a store keeps, 2**63 - 1 ({MAX_SEQ}); "
        "this session can take no more events",
    )
