"""`CommitLedger`: everything a session's actor and its store's committer thread share.

The actor hands work to the committer (`begin`); the committer's thread records
each batch as it commits (`committed`) and each other operation as it ends
(`finished`); the actor takes the recorded batches when it next runs (`take`)
and applies them. All of it under one lock, in this one object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from nous_actor.core.event import Event
from nous_actor.errors import SessionStopped, StoreError
from nous_actor.runtime import forks
from nous_actor.runtime.flag import Flag
from nous_actor.store.subscription import Subscription

Done = tuple[tuple[Event, ...], "StoreError | None"]

_NOTHING: tuple[Any, ...] = ()
"""``done`` and ``closing`` while empty: a list is made only when something goes in (an
idle session holds none)."""

_LEDGER_LOCKS: Final = tuple(forks.lock() for _ in range(64))
"""The locks of all ledgers, in stripes (see `CommitLedger.__init__`)."""


class CommitLedger:
    """The commits between a session's actor and its store's committer.

    Invariants (under ``lock``):

    * ``ops`` counts the operations handed to the committer and not yet ended
      (appends, snapshot drops, the start's read of the store).
    * ``done`` holds, in commit order, the batches committed (or failed) that the
      actor has not taken yet.
    * The committer sends the actor one wake per batch of ``done`` (``wake_sent``),
      and only while the actor asked for them (``want``: a parked call or a
      subscriber waits) or a write failed.
    * Once ``shutting`` (the session stopped), nothing goes to ``done``: each batch
      that commits feeds ``closing`` (the stopped session's subscribers, ended with
      ``feed_error`` after the last operation), and the operation that brings
      ``ops`` to 0 lets go of the claim; ``released`` is set once it is let go (a
      successor waits for it).

    * ``stored()`` counts every event recorded as committed (a failed batch's are not),
      also after the session stopped; it never decreases.

    ``done`` and ``want`` are read without the lock on the actor's hot path (a stale
    read only delays the actor's look by one call).
    """

    __slots__ = (
        "_stored",
        "closing",
        "done",
        "feed_error",
        "lock",
        "ops",
        "released",
        "shutting",
        "wake_sent",
        "want",
    )

    def __init__(self, released: Flag | None = None) -> None:
        # Shared by ledgers in stripes (one lock each would be one more object per
        # session for the cyclic collector); each is held for a few reads and writes,
        # and never while another ledger's is.
        self.lock = _LEDGER_LOCKS[(id(self) >> 4) & 63]
        self.done: list[Done] | tuple[Done, ...] = _NOTHING
        self.want = False
        self.wake_sent = False
        self.ops = 0
        self._stored = 0
        self.shutting = False
        self.feed_error: SessionStopped | None = None
        self.closing: list[Subscription] | tuple[Subscription, ...] = _NOTHING  # (when stopping)
        # Set once the claim is let go (the session's cell shows it beside its ref).
        self.released = Flag() if released is None else released

    # -- the actor -------------------------------------------------------------------------

    def begin(self) -> None:
        """One operation is handed to the committer."""
        with self.lock:
            self.ops += 1

    def cancel(self) -> bool:
        """An operation begun never reached the committer (handing it over failed): it is
        no longer in flight. Whether it was the last in flight of a stopped session
        (then the claim is let go now)."""
        with self.lock:
            self.ops -= 1
            return self.shutting and self.ops == 0

    def take(self) -> Sequence[Done]:
        """The batches recorded since the last take (the next one wakes the actor again)."""
        with self.lock:
            done, self.done = self.done, _NOTHING
            self.wake_sent = False
        return done

    def wanted(self, want: bool) -> bool:
        """The actor now wants (or not) to be woken by commits; ``True`` if it must be
        woken now (commits it wants are recorded and no wake is on its way)."""
        with self.lock:
            self.want = want
            send = want and bool(self.done) and not self.wake_sent
            if send:
                self.wake_sent = True
        return send

    def _shut(
        self, subs: list[Subscription], feed_error: SessionStopped | None
    ) -> tuple[bool, list[Subscription]]:
        """The session stopped (its actor's ``_shut``, this ledger's part of it): the
        recorded commits go to ``subs``, and those still with the committer will too.
        ``(idle, subscribers to end now)``: ``idle`` if no operation is in flight (then
        the claim is let go now)."""
        with self.lock:
            self.shutting = True
            self.feed_error = feed_error
            idle = self.ops == 0
            done, self.done = self.done, _NOTHING
            for events, failed in done:
                if failed is None:
                    for ev in events:
                        subs = [s for s in subs if s._push(ev)]
            if not idle:
                self.closing = subs
                subs = []
        return idle, subs

    # -- any thread (the exit hook) ---------------------------------------------------------

    def stored(self) -> int:
        """How many events have been recorded as committed so far (never a failed batch's;
        also those committed after the session stopped, which no actor applies): the
        difference of two answers is what reached the store in between."""
        with self.lock:
            return self._stored

    def stored_untaken(self) -> tuple[int, int]:
        """(`stored`, how many of those events the actor has not taken yet), read at one
        instant (a commit landing between two reads would be counted twice)."""
        with self.lock:
            untaken = sum(len(events) for events, err in self.done if err is None)
            return self._stored, untaken

    def in_flight(self) -> int:
        """How many operations are with the committer and not ended (appends, snapshot
        drops, the start's read of the store): 0 for a session that has no store work."""
        with self.lock:
            return self.ops

    # -- the committer's thread ------------------------------------------------------------

    def committed(self, events: tuple[Event, ...], err: StoreError | None) -> tuple[bool, bool]:
        """Batch ``events`` committed (``err``: or failed). ``(last, wake)``: ``last`` if the
        session stopped and this was its last operation in flight; ``wake`` if the
        actor must be told (it wants commits, or the write failed)."""
        with self.lock:
            self.ops -= 1
            if err is None:
                self._stored += len(events)
            last = self.shutting and self.ops == 0
            if self.shutting:  # stopped: nobody applies it; its feeds still get it
                if err is None and self.closing:
                    subs = self.closing
                    for ev in events:
                        subs = [s for s in subs if s._push(ev)]
                    self.closing = subs
                return last, False
            if self.done:
                self.done.append((events, err))  # type: ignore[union-attr]
            else:
                self.done = [(events, err)]
            wake = (self.want or err is not None) and not self.wake_sent
            if wake:
                self.wake_sent = True
        return last, wake

    def finished(self) -> bool:
        """An operation other than a batch ended; ``True`` if the session stopped and it
        was the last in flight."""
        with self.lock:
            self.ops -= 1
            return self.shutting and self.ops == 0

    def closing_feeds(self) -> tuple[Sequence[Subscription], SessionStopped | None]:
        """The stopped session's subscribers that waited for its last operation, and how
        their feeds end."""
        with self.lock:
            subs, self.closing = self.closing, _NOTHING
        return subs, self.feed_error

    def __repr__(self) -> str:
        state: Any = "shutting" if self.shutting else "live"
        return f"<CommitLedger {state} ops={self.ops} done={len(self.done)}>"
