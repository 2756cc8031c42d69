"""A registry's settings: the defaults, their checks, the `Settings` its actor starts
sessions with, and the refusal of a registry that is not running."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from nous_actor.core.args import check_seconds
from nous_actor.errors import SessionStopped
from nous_actor.runtime.dispatcher import Dispatcher
from nous_actor.sessions.turns import DanglingTurns
from nous_actor.store.base import Store
from nous_actor.supervision import Backoff, Clock, Scheduler

DEFAULT_BACKOFF = Backoff(0.005, 1.0, 0.1)
"""5 ms before the first restart, doubling up to 1 s, ±10 %."""

GiveUp = Literal["escalate", "log"]


@dataclass(frozen=True, slots=True)
class Settings:
    """What a `Sessions` registry's actor needs to start and supervise sessions, checked
    by the registry (its constructor's arguments of the same names)."""

    store: Store
    max_sessions: int
    max_restarts: int
    max_seconds: float
    on_give_up: GiveUp  # resolved: a registry under a parent escalates unless told
    backoff: Backoff | None
    timeout: float
    clock: Clock
    scheduler: Scheduler
    dispatcher: Dispatcher | None
    dangling_turns: DanglingTurns


def check_capacity(max_sessions: Any, idle_timeout: Any) -> None:
    """Raise ``ValueError`` unless ``max_sessions`` is an int >= 1 and ``idle_timeout``
    is ``None`` or a finite number of seconds > 0 (a registry's capacity settings)."""
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    if idle_timeout is not None:
        try:
            check_seconds(idle_timeout, "idle_timeout")
        except (TypeError, ValueError):
            raise ValueError(
                f"idle_timeout must be None or > 0 seconds, got {idle_timeout!r}"
            ) from None


def _not_running(session_id: str) -> SessionStopped:
    return SessionStopped(
        session_id,
        "the registry is not running (its supervisor restarts it, or it was stopped); try again",
    )
