"""nous_actor: an actor-based concurrent runtime for AI-agent session logs.

The pure core is importable on its own: :class:`Message`, :class:`Event`,
:class:`Log` and the :mod:`nous_actor.codec`.
"""

from nous_actor._frozen import FrozenDict, FrozenList
from nous_actor._version import __version__
from nous_actor.codec import CodecError
from nous_actor.event import Event, EventType, InvalidEvent, Replace
from nous_actor.log import Log
from nous_actor.message import Message, Role

__all__ = [
    "CodecError",
    "Event",
    "EventType",
    "FrozenDict",
    "FrozenList",
    "InvalidEvent",
    "Log",
    "Message",
    "Replace",
    "Role",
    "__version__",
]
