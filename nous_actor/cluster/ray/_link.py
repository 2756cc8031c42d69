"""Links and batching: this process's side of one shard, where calls queue and go in
batches, one Ray call each, started by the shard in the order sent."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future
from functools import partial
from typing import Any, Protocol

from nous_actor.cluster.ray._protocol import (
    DEFAULT_IN_FLIGHT,
    FAILED,
    MAX_BATCH,
    NOW,
    SEQ,
    Op,
    _disconnected,
    _lost,
    _mismatch,
    _pack_batch,
    _unpack,
)
from nous_actor.core.event import trusted_event
from nous_actor.errors import SessionStopped
from nous_actor.runtime import telemetry
from nous_actor.sessions.future import SessionFuture


class _Followed(Protocol):
    """What a link asks of a subscription's feed it follows (a `_Feed`, named by role:
    the feed's module imports this one)."""

    def unlinked(self) -> None:
        """The registry was closed: the subscription ends."""


# A batch ready to go: its calls, their futures, its number, whether it resets the count,
# its callers' trace contexts (telemetry; empty while no sink is installed).
_Batch = tuple[list[Op], list[SessionFuture[Any]], int, bool, list[object]]


class _Link:
    """This process's side of one shard: calls queue here and go in batches.

    Up to ``max_in_flight`` batches are in flight at once; each carries this
    link's id and a number, and the shard starts them strictly in that order
    (its turns), so a session's calls are applied in the order they were made.
    After a batch failed as a whole (the shard was lost), the next one resets
    the shard's count and goes alone until it is answered.
    """

    __slots__ = (
        "_contexts",
        "_flying",
        "_futs",
        "_in_flight",
        "_lock",
        "_next",
        "_ops",
        "_reset",
        "actor",
        "calls",
        "closed",
        "feeds",
        "id",
        "index",
        "max_in_flight",
        "sent",
    )

    def __init__(self, actor: Any, index: int, max_in_flight: int = DEFAULT_IN_FLIGHT) -> None:
        self.actor = actor
        self.index = index
        self.max_in_flight = max_in_flight
        self.id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._futs: list[SessionFuture[Any]] = []
        # The callers' trace contexts, beside their calls while a sink is installed (for
        # the links of a batch's span; a sink installed or removed meanwhile may shift
        # a batch's links by a few calls).
        self._contexts: list[object] = []
        self._in_flight = 0
        # The batches in flight, by number: their calls and futures, failed by `close`
        # should this process be disconnected from Ray (whose answers then never come).
        self._flying: dict[int, tuple[list[Op], list[SessionFuture[Any]]]] = {}
        self._next = 0  # the number of the next batch
        self._reset = True  # the next batch starts the shard's count for this link
        self.closed: str | None = None
        # The subscriptions fed from this shard, to be ended when the registry closes
        # (the shards may keep serving: detached, or another driver's).
        self.feeds: set[_Followed] = set()
        self.calls = 0  # Ray calls made
        self.sent = 0  # session calls they carried

    def attach(self, feed: _Followed) -> bool:
        """Follow ``feed`` until it ends or `close`; ``False`` if this link is closed."""
        with self._lock:
            if self.closed is not None:
                return False
            self.feeds.add(feed)
            return True

    def detach(self, feed: _Followed) -> None:
        """``feed`` ended: no longer followed."""
        with self._lock:
            self.feeds.discard(feed)

    def close(self, why: str) -> None:
        """The registry is closed: later calls fail with `SessionStopped` (``why``), and
        every subscription fed from this shard ends. If this process is no longer
        connected to Ray, the calls queued or in flight fail so too: no answer comes."""
        gone = _disconnected() is not None
        dropped: list[tuple[list[Op], list[SessionFuture[Any]]]] = []
        with self._lock:
            self.closed = why
            feeds, self.feeds = list(self.feeds), set()
            if gone:
                dropped = [*self._flying.values(), (self._ops, self._futs)]
                self._flying = {}
                self._ops, self._futs, self._contexts = [], [], []
        for ops, futs in dropped:
            for op, fut in zip(ops, futs, strict=True):
                fut._fail(SessionStopped(op[1], why))
        for feed in feeds:
            feed.unlinked()

    def submit(self, op: Op, fut: SessionFuture[Any]) -> None:
        if self.closed is not None:
            fut._fail(SessionStopped(op[1], self.closed))
            return
        context = None if telemetry.sink is None else telemetry.context()
        with self._lock:
            self._ops.append(op)
            self._futs.append(fut)
            if context is not None:
                self._contexts.append(context)
            batch = self._take()
        if batch is not None:
            self._send(*batch)
        elif (why := _disconnected()) is not None:  # what is in flight will never answer
            self.close(why)

    def _take(self) -> _Batch | None:
        """The next batch to send, if one may go now (under the lock)."""
        if not self._ops or self._in_flight >= (1 if self._reset else self.max_in_flight):
            return None
        ops, futs, contexts = self._ops, self._futs, self._contexts
        if len(ops) > MAX_BATCH:
            self._ops, self._futs = ops[MAX_BATCH:], futs[MAX_BATCH:]
            ops, futs = ops[:MAX_BATCH], futs[:MAX_BATCH]
        else:
            self._ops, self._futs = [], []
        if contexts:
            self._contexts, contexts = contexts[len(ops) :], contexts[: len(ops)]
        number, reset = self._next, self._reset
        self._next += 1
        self._in_flight += 1
        return ops, futs, number, reset, contexts

    def _release(self, *, reset: bool) -> _Batch | None:
        """A batch was answered (or failed as a whole, ``reset``): one fewer in flight;
        the next batch to send, if one may go now."""
        with self._lock:
            self._in_flight -= 1
            self._reset = reset
            return self._take()

    def _send(
        self,
        ops: list[Op],
        futs: list[SessionFuture[Any]],
        number: int,
        reset: bool,
        contexts: list[object],
    ) -> None:
        why = _disconnected()
        if why is not None:  # every later call fails as this batch's do
            self.close(why)
            batch = self._release(reset=True)
            for op, fut in zip(ops, futs, strict=True):
                fut._fail(SessionStopped(op[1], why))
            if batch is not None:
                self._send(*batch)
            return
        start = time.time_ns() if telemetry.sink is not None else 0
        try:
            ref = self.actor.run.remote(_pack_batch(self.id, number, reset, ops))
        except Exception as exc:  # unpicklable, or Ray refused the call (shut down, ...)
            self._finished(ops, futs, exc, lost=False)
            return
        self.calls += 1
        self.sent += len(ops)
        with self._lock:
            self._flying[number] = (ops, futs)
        ref.future().add_done_callback(partial(self._done, ops, futs, number, start, contexts))

    def _done(
        self,
        ops: list[Op],
        futs: list[SessionFuture[Any]],
        number: int,
        start: int,
        contexts: list[object],
        answer: Future[Any],
    ) -> None:
        # In Ray's callback thread. The next batch goes first, then this one is answered.
        with self._lock:
            self._flying.pop(number, None)
        try:
            packed = answer.result()
            outcomes = _unpack(packed) if isinstance(packed, bytes) else None
            if not isinstance(outcomes, list) or len(outcomes) != len(ops):
                raise _mismatch(self.index, None)
        except Exception as exc:
            self._report(start, len(ops), contexts, failed=True)
            self._finished(ops, futs, exc, lost=True)
            return
        self._report(start, len(ops), contexts, failed=False)
        batch = self._release(reset=False)
        if batch is not None:
            self._send(*batch)
        for op, fut, (state, value) in zip(ops, futs, outcomes, strict=True):
            if state == NOW:
                fut._resolve(value)
            elif state == SEQ:  # an h_append, applied as sent: its event is made here
                fut._resolve(trusted_event(value, *op[3][0]))
            elif state == FAILED:
                fut._fail(value)
            else:
                self._follow(op[1], fut, value)

    def _report(self, start: int, calls: int, contexts: list[object], *, failed: bool) -> None:
        sink = telemetry.sink
        if sink is not None and start:
            end = time.time_ns()
            sink.batch_done(f"shard-{self.index}", calls, start, end, failed, contexts)

    def _finished(
        self, ops: list[Op], futs: list[SessionFuture[Any]], exc: BaseException, *, lost: bool
    ) -> None:
        """A batch failed as a whole: fail its calls; the next batch resets the count."""
        why = _disconnected()
        if why is not None:  # ray.shutdown() failed it
            self.close(why)
        batch = self._release(reset=True)
        for op, fut in zip(ops, futs, strict=True):
            fut._fail(_lost(op[1], self.index, exc) if why is None else SessionStopped(op[1], why))
        if batch is not None:
            self._send(*batch)

    def _follow(self, session_id: str, fut: SessionFuture[Any], token: int) -> None:
        """Ask for the outcome of a call the shard answers later."""
        why = _disconnected()
        if why is not None:
            fut._fail(SessionStopped(session_id, why))
            return
        try:
            ref = self.actor.result.remote(token, session_id)
        except Exception as exc:
            fut._fail(_lost(session_id, self.index, exc))
            return
        ref.future().add_done_callback(partial(self._settle, session_id, fut))

    def _settle(self, session_id: str, fut: SessionFuture[Any], answer: Future[Any]) -> None:
        try:
            ((state, value),) = _unpack(answer.result())
        except Exception as exc:
            fut._fail(_lost(session_id, self.index, exc))
            return
        if state == NOW:
            fut._resolve(value)
        else:
            fut._fail(value)
