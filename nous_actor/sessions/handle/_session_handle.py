"""`SessionHandle`: what every handle to a session offers, wherever the session runs:
the call methods (`SessionCalls`, which a turn shares), turns, and the session's life."""

from __future__ import annotations

from functools import partial
from typing import Any

from nous_actor.sessions.actor import _Compaction
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle._calls import SessionCalls
from nous_actor.sessions.handle._checks import _off_loop
from nous_actor.sessions.turn_handle import Turn
from nous_actor.sessions.turns import DEFAULT_LEASE, Policy


class SessionHandle(SessionCalls):
    """What every handle to a session offers; every call returns a `SessionFuture`.

    `Session` is the handle to a session in this process. A handle to a
    session hosted elsewhere (e.g. ``nous_actor.cluster.ray.RaySession``) has
    the same methods, the same checks in the caller's thread and the same typed
    errors, so code written against this class runs on either.

    Besides the call methods (`SessionCalls`, which a `Turn` has too) a handle
    opens turns (`turn`) and sees and ends the session's life (`is_alive`, `stop`).
    """

    __slots__ = ()

    # -- turns ---------------------------------------------------------------------------

    def turn(
        self,
        policy: Policy = "enqueue",
        *,
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
        timeout: float | None = None,
        note: str | None = None,
    ) -> Turn:
        """A turn on this session: use it as ``with`` (or ``async with``) and write through it.

        Entering opens it (nothing is sent before). A turn is a run that writes
        the session while no other run does: while it is open, writes through
        the plain handle wait for it to end (at most their bound less a
        quarter of it, or less 1 s if that is shorter; then
        `nous_actor.TurnBusy`); reads never wait. A plain write from the
        thread (in asyncio, the task) inside the open turn's ``with`` (``async
        with``) block would wait for its own turn: it fails at once with
        `nous_actor.TurnBusy`, saying to write through the turn. It is recorded
        by ``turn_start``/``turn_end`` events (turn id, owner, policy, and how
        it ended).

        ``policy`` says what this turn does when another is open: ``reject``
        (`nous_actor.TurnBusy` at once, naming the open turn's owner),
        ``enqueue`` (wait, first come first served, at most ``timeout``
        seconds, default the handle's bound, then ``TurnBusy``),
        ``interrupt`` (the open turn ends as interrupted; its holder's next
        call through it fails with `nous_actor.TurnInterrupted`; its events
        stay) or ``rollback`` (as ``interrupt``, and one replace hides the
        interrupted turn's events behind a system note ``note``, by default
        `nous_actor.sessions.turns.DEFAULT_ROLLBACK_NOTE`).

        The turn holds a lease of ``lease`` seconds, renewed by every call
        through it: if its holder goes silent that long, it ends as expired.
        A restart of the session ends an open turn as interrupted.

        ``owner`` names the holder (default: host, process id, thread, task).

        Raises:
            ValueError, TypeError: bad arguments (raised here; nothing is sent).
        """
        return Turn(self, policy, owner=owner, lease=lease, timeout=timeout, note=note)

    def _compact_in_turn(self, req: _Compaction, turn_id: str) -> SessionFuture[Any]:
        """Send the compaction ``req`` through the open turn ``turn_id`` (a turn's
        ``compact``). A handle to a session hosted elsewhere sends the compactor
        itself, to run where the session runs (its ``_compact``); a handle that
        cannot refuses it through the future."""
        compact = getattr(self, "_compact", None)
        if compact is None:
            return self._failed(
                TypeError(
                    f"a turn of a {type(self).__name__} cannot compact; compact "
                    "through the handle once the turn is closed"
                )
            )
        return compact(req, turn_id)  # type: ignore[no-any-return]

    # -- life ----------------------------------------------------------------------------

    def is_alive(self) -> bool:
        """Whether the session this handle talks to is running now."""
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> None:
        """Stop the session after the calls already queued; waits at most ``timeout``.

        Raises:
            CallTimeout: not stopped within ``timeout``.
        """
        raise NotImplementedError

    async def astop(self, timeout: float | None = None) -> None:
        """`stop` for asyncio code: awaited without blocking the loop."""
        await _off_loop(partial(self.stop, timeout))
