"""Runs: `NousRunPlugin`, ADK's plugin that makes each run a turn of its session, the
two calls it makes (`_Runs`, which `NousSessionService` answers), and `refused_by_turn`,
which tells a run refused because another run holds its session."""

from __future__ import annotations

from typing import Any, Protocol

from nous_actor.errors import TurnBusy
from nous_actor.integrations.adk.framework import AdkSession, BasePlugin
from nous_actor.sessions.turns import Policy

__all__ = ["NousRunPlugin", "refused_by_turn"]


class _Runs(Protocol):
    """What `NousRunPlugin`'s hooks call: open a run's turn and close it
    (`NousSessionService` is one; the plugin knows no more of the service)."""

    async def _open_run(
        self, plugin: NousRunPlugin, session: AdkSession, invocation: str
    ) -> None: ...

    async def _close_run(self, session: AdkSession, invocation: str, failed: bool) -> None: ...


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
