"""Runs: `NousRunPlugin`, ADK's plugin that makes each run a turn of its session, the
two calls it makes (`_Runs`), and `_RunService`, the service's side of them (open a
run's turn, close it, and bring the run's `Session` object up to date with what runs
before it wrote)."""

from __future__ import annotations

import bisect
from typing import Any, Protocol

from nous_actor.errors import TurnBusy, TurnInterrupted
from nous_actor.integrations.adk.framework import AdkSession, BasePlugin, State
from nous_actor.integrations.adk.ids import session_key
from nous_actor.integrations.adk.logs import _Load
from nous_actor.integrations.adk.state import _StateService
from nous_actor.sessions.turns import Policy

__all__ = ["NousRunPlugin", "refused_by_turn"]


class _Runs(Protocol):
    """What `NousRunPlugin`'s hooks call: open a run's turn and close it (the service's
    `_RunService` side is one; the plugin knows no more of the service)."""

    async def _open_run(
        self, plugin: NousRunPlugin, session: AdkSession, invocation: str
    ) -> None: ...

    async def _close_run(self, session: AdkSession, invocation: str, failed: bool) -> None: ...


class _RunService(_StateService):
    """`NousSessionService`'s side of the runs: what `NousRunPlugin`'s hooks call."""

    async def _open_run(self, plugin: NousRunPlugin, session: AdkSession, invocation: str) -> None:
        key = session_key(session.app_name, session.user_id, session.id)
        if (key, invocation) in self._turns:
            return
        await self._open_turn(
            key,
            invocation,
            plugin.policy,
            f"adk invocation {invocation}",
            plugin.lease,
            plugin.wait,
        )
        await self._refresh(session)

    async def _close_run(self, session: AdkSession, invocation: str, failed: bool) -> None:
        key = session_key(session.app_name, session.user_id, session.id)
        turn = self._turns.pop((key, invocation), None)
        if turn is None:
            return
        if failed:
            await turn.__aexit__(RuntimeError, None, None)
            return
        try:
            await turn.aclose()
        except TurnInterrupted:
            pass  # ended already (a restart, an expired lease): nothing left to close

    async def _refresh(self, session: AdkSession) -> None:
        """Bring ``session`` (a run's object) up to date with what other runs wrote: it
        keeps the events it was given and gains every event committed since (never
        fewer), and its state becomes the stored one (its ``temp:`` keys kept)."""
        key = session_key(session.app_name, session.user_id, session.id)
        view = await self._view(key)
        if view.created is None:
            return
        load = self._load_of(session)
        start = bisect.bisect_left(view.seqs, load.first) if load is not None else 0
        session.events[:] = view.events(start) if start < len(view.seqs) else []
        first = view.seqs[start] if start < len(view.seqs) else view.seen
        own, seen_here, last_update = dict(view.state), view.seen, view.last_update
        merged, seen = await self._merged_seen(session.app_name, session.user_id, own)
        temp = {k: v for k, v in session.state.items() if k.startswith(State.TEMP_PREFIX)}
        session.state.clear()
        session.state.update(merged)
        session.state.update(temp)
        session.last_update_time = last_update
        self._remember(session, _Load({"session": seen_here, **seen}, first))


def refused_by_turn(error: BaseException) -> TurnBusy | None:
    """The `nous_actor.TurnBusy` that refused a run, when ``error`` is one or was raised
    from one; else ``None``.

    ADK's plugin manager turns an error raised in a plugin's hook into a
    `RuntimeError` ("Error in plugin 'nous_actor_turns' during
    'on_user_message_callback' callback: ...") raised *from* it. So a run refused
    because another run holds its session (`NousSessionService.plugin` with policy
    ``reject``, or ``enqueue`` after waiting ``wait`` seconds) reaches the caller of
    ``runner.run_async`` as that `RuntimeError`, with the `TurnBusy` as its
    ``__cause__``. Tell it from other failures so::

        try:
            async for event in runner.run_async(...):
                ...
        except RuntimeError as exc:
            busy = refused_by_turn(exc)
            if busy is None:
                raise
            ...  # the session is busy (busy.holder runs it): nothing was stored

    Follows the ``__cause__`` chain (how ADK wraps it), not ``__context__`` (an
    error raised while handling a `TurnBusy` was not caused by it).

    Raises:
        TypeError: ``error`` is not an exception.
    """
    if not isinstance(error, BaseException):
        raise TypeError(
            f"refused_by_turn takes an exception (what runner.run_async raised), "
            f"got {type(error).__name__}"
        )
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, TurnBusy):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


class NousRunPlugin(BasePlugin):
    """ADK's plugin that makes each run a turn of its session: get it from
    `NousSessionService.plugin` and pass it in the runner's (or app's) ``plugins``.

    The turn opens at the run's first hook (``on_user_message_callback``, or
    ``before_run_callback`` for a run without a new message), which comes
    after the runner read the session: so, once the turn is open, the run's
    `Session` object is brought up to date (events, state) with what runs
    before it wrote. It closes at ``after_run_callback`` (or
    ``on_run_error_callback``, as failed). A run cancelled without either
    hook holds the session until its lease runs out.
    """

    def __init__(self, service: _Runs, policy: Policy, lease: float, wait: float):
        super().__init__(name="nous_actor_turns")
        self.service = service
        self.policy = policy
        self.lease = lease
        self.wait = wait

    async def on_user_message_callback(
        self, *, invocation_context: Any, user_message: Any
    ) -> None:
        await self.service._open_run(
            self, invocation_context.session, invocation_context.invocation_id
        )

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        await self.service._open_run(
            self, invocation_context.session, invocation_context.invocation_id
        )

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        await self.service._close_run(
            invocation_context.session, invocation_context.invocation_id, failed=False
        )

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        await self.service._close_run(
            invocation_context.session, invocation_context.invocation_id, failed=True
        )
