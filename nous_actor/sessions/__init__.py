"""The session runtime: the actor that owns a session's log, the handle callers hold,
futures, subscriptions, the registry (a dynamic supervisor) and fault injection."""

from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import RegistryActor, Sessions

__all__ = ["RegistryActor", "Session", "SessionActor", "Sessions"]
