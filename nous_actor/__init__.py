"""nous_actor: an actor-based concurrent runtime for AI-agent session logs.

The pure core (:class:`Message`, :class:`Event`, :class:`Log` and
:mod:`nous_actor.codec`) needs no threads. Sessions (:class:`Session`) put
one log behind one Pykka actor and answer with futures.
"""

from nous_actor._frozen import FrozenDict, FrozenList
from nous_actor._version import __version__
from nous_actor.codec import CodecError
from nous_actor.errors import (
    CallTimeout,
    NousActorError,
    SessionCrashed,
    SessionError,
    SessionStopped,
    SubscriptionLagged,
)
from nous_actor.event import Event, EventType, InvalidEvent, Replace
from nous_actor.future import SessionFuture
from nous_actor.log import Log
from nous_actor.message import Message, Role
from nous_actor.session import Session
from nous_actor.subscription import Subscription

__all__ = [
    "CallTimeout",
    "CodecError",
    "Event",
    "EventType",
    "FrozenDict",
    "FrozenList",
    "InvalidEvent",
    "Log",
    "Message",
    "NousActorError",
    "Replace",
    "Role",
    "Session",
    "SessionCrashed",
    "SessionError",
    "SessionFuture",
    "SessionStopped",
    "Subscription",
    "SubscriptionLagged",
    "__version__",
]
