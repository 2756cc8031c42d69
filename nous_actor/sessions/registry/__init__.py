"""The session registry: a dynamic supervisor of sessions, and the one object users hold.

One object to the user::

    with Sessions(SQLiteStore("agents.db")) as sessions:
        chat = sessions.open("chat-42")
        chat.append("user_message", {"content": "hi"}).get()

* ``open(id)`` starts the session (recovering it from the store) or finds it.
* A crashed session is restarted from the store, within a per-session
  restart intensity and with backoff; its handles keep working: calls in
  flight at the crash fail with a clear error, later calls reach the new actor.
* Beyond a session's intensity the registry gives that session up (logged)
  or, when it runs under a parent `Supervisor`, escalates: it crashes with
  `RestartIntensityExceeded`, stopping its sessions, and the parent's
  strategy decides what restarts (``on_give_up=``).
* ``max_sessions`` caps the live sessions; ``idle_timeout`` passivates idle
  ones (stops them; the next call reopens them from the store).
* ``close()`` (or leaving the ``with`` block) stops every session.

Behind the object is an actor (OTP's ``DynamicSupervisor``), `RegistryActor`:
it starts, watches and restarts the sessions with the same `RestartPolicy`
as `Supervisor`, and can itself be a child of one (`Sessions.child_spec`).

Every restart, recovery, give-up, stop and passivation is a structlog event
with ``session_id`` and ``reason`` (and ``restart_count`` where it counts);
docs/supervision.md lists every event the library logs.

The package's modules, each importing only those above it: ``_settings`` (the
defaults, their checks, the `Settings` the actor starts sessions with),
``_passivation`` (`Passivation`: when each session was last used, the idle ones,
the passivator), ``_supervisor`` (`RegistryActor`, the dynamic supervisor, and
its `Restarts`) and ``_sessions`` (`Sessions`, the one class users hold; its
hand-over is `nous_actor.sessions.handoff.HandOver`).
"""

from __future__ import annotations

from nous_actor.sessions.registry._passivation import Passivation as Passivation
from nous_actor.sessions.registry._sessions import Sessions as Sessions
from nous_actor.sessions.registry._settings import DEFAULT_BACKOFF as DEFAULT_BACKOFF
from nous_actor.sessions.registry._settings import GiveUp as GiveUp
from nous_actor.sessions.registry._settings import Settings as Settings
from nous_actor.sessions.registry._settings import _not_running as _not_running
from nous_actor.sessions.registry._settings import check_capacity as check_capacity
from nous_actor.sessions.registry._supervisor import RegistryActor as RegistryActor
from nous_actor.sessions.registry._supervisor import Restarts as Restarts
from nous_actor.sessions.registry._supervisor import Started as Started

__all__ = ["DEFAULT_BACKOFF", "RegistryActor", "Sessions"]

# The public classes are named by this package, where users import them from.
RegistryActor.__module__ = __name__
Sessions.__module__ = __name__
