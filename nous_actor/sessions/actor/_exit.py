"""What a session owes at exit: every append whose call returned is committed first.

`_flush_at_exit` is the session layer's exit hook (`nous_actor.runtime.exit`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Final

import pykka

from nous_actor._log import get_logger
from nous_actor.runtime import forks
from nous_actor.runtime.dispatcher import CallEnvelope
from nous_actor.runtime.exit import SLOW_EXIT, at_exit
from nous_actor.sessions.actor._session_actor import SessionActor
from nous_actor.sessions.future import SessionFuture

logger = get_logger("nous_actor.sessions.actor")


def _flush_at_exit() -> None:
    """Every append whose call had returned is committed, or has failed with a store
    error, before the process goes (the session layer's exit hook).

    Each live session with a store is sent two calls: one that counts its appends not
    yet committed (it runs once every call before it has been given its seq), then a
    barrier (``h_flush``, answered once they are all committed). There is no bound on
    the wait: it says so on the log after `SLOW_EXIT` s and goes on while the stores
    answer. It gives up only when no store has answered anything (no batch written,
    no barrier answered) for `EXIT_STALL` s plus the longest ``timeout`` of the stores
    waited for (a store that retries within its ``timeout`` fails its writes before
    that). Appends that failed, or that were still waiting when it gave up, are
    counted at error level (``session.exit_lost``).
    """
    waits: list[tuple[SessionActor, SessionFuture[Any], SessionFuture[Any]]] = []
    for ref in pykka.ActorRegistry.get_by_class(SessionActor):
        actor = ref.actor_inbox._actor  # type: ignore[attr-defined]
        if not isinstance(actor, SessionActor) or (
            actor.committer is None and not actor.ledger.in_flight()
        ):
            continue  # no store (nor its first read under way): nothing to make durable
        if forks.forked_since(actor.born):
            continue  # a copy in a forked child: it runs (and commits) in its parent
        counted: SessionFuture[Any] = SessionFuture(actor.session_id)
        flushed: SessionFuture[Any] = SessionFuture(actor.session_id)
        try:
            ref.actor_inbox.put(CallEnvelope(_uncommitted, (), counted))  # type: ignore[arg-type]
            ref.actor_inbox.put(CallEnvelope(SessionActor.h_flush, (), flushed))  # type: ignore[arg-type]
        except Exception:
            continue
        waits.append((actor, counted, flushed))
    if not waits:
        return
    answered = threading.Event()
    for _, _, flushed in waits:
        flushed.add_done_callback(answered.set)
    patience = EXIT_STALL + max(_timeout_of(actor.store) for actor, _, _ in waits)
    start = last = time.monotonic()
    seen = _answers(waits)
    warned = gave_up = False
    try:
        while True:
            answered.clear()
            left = sum(1 for w in waits if not _settled(*w))
            if not left:
                break
            now = time.monotonic()
            now_seen = _answers(waits)
            if now_seen != seen:
                seen, last = now_seen, now
            elif now - last >= patience:
                gave_up = True
                break
            if not warned and now - start >= SLOW_EXIT:
                warned = True
                logger.warning(
                    "session.exit_waiting",
                    sessions=left,
                    seconds=round(now - start, 3),
                    reason="commits in flight at exit",
                )
            answered.wait(EXIT_POLL if warned else min(EXIT_POLL, start + SLOW_EXIT - now))
    except KeyboardInterrupt:  # interrupted while waiting: count what is lost, then go
        gave_up = True
    _report_lost(
        waits, "store unreachable" if gave_up else "store error", time.monotonic() - start
    )


def _uncommitted(actor: SessionActor) -> tuple[int, int]:
    """(events handed to the store and not yet known committed, the ledger's count of
    events stored): run by the actor at exit, after every call queued before it."""
    stored, untaken = actor.ledger.stored_untaken()
    return len(actor.inflight) - untaken, stored


def _settled(
    actor: SessionActor, counted: SessionFuture[Any], flushed: SessionFuture[Any]
) -> bool:
    """Whether nothing more of the session's appends will be committed: its barrier was
    answered, or the store's committer failed the session (it then fails every later
    append of it without writing, though the actor may not have heard yet: a crashed
    session letting go of its claim on an unreachable server waits for it)."""
    if flushed.done():
        return True
    committer = actor.committer
    return committer is not None and committer.failed(actor.session_id) is not None


def _timeout_of(store: object) -> float:
    """A store's own bound on a call (``timeout``), or 0 if it has none."""
    timeout = getattr(store, "timeout", None)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return min(float(timeout), EXIT_STALL_MAX)
    return 0.0


def _answers(waits: list[tuple[SessionActor, SessionFuture[Any], SessionFuture[Any]]]) -> int:
    """How much the stores have answered so far: batches written, barriers answered."""
    committers = {id(a.committer): a.committer for a, _, _ in waits if a.committer is not None}
    return sum(c.commits for c in committers.values()) + sum(f.done() for _, _, f in waits)


def _report_lost(
    waits: list[tuple[SessionActor, SessionFuture[Any], SessionFuture[Any]]],
    reason: str,
    seconds: float,
) -> None:
    """Log, at error level, how many appends whose call had returned are not stored."""
    lost = sessions = unknown = 0
    for actor, counted, flushed in waits:
        if flushed.done() and not flushed.failed():
            continue
        sessions += 1
        if not counted.done() or counted.failed():
            unknown += 1  # stopped before it could count
            continue
        unstored, stored = counted.get(timeout=0)
        lost += max(0, unstored - (actor.ledger.stored() - stored))
    if sessions:
        logger.error(
            "session.exit_lost",
            lost=lost,
            sessions=sessions,
            uncounted=unknown,
            seconds=round(seconds, 3),
            reason=reason,
        )


EXIT_STALL: Final = 30.0
"""Seconds without any answer from the stores after which the exit gives up (added to
the longest ``timeout`` of the stores it waits for)."""

EXIT_STALL_MAX: Final = 3600.0
"""The longest store ``timeout`` counted in the exit's patience."""

EXIT_POLL: Final = 0.5
"""Seconds between two looks at the stores' progress while the exit waits."""

at_exit(_flush_at_exit)
