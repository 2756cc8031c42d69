"""nous_actor: an actor-based concurrent runtime for AI-agent session logs.

The pure core (`Message`, `Event`, `Log` and
`nous_actor.core.codec`) needs no threads. Sessions (`Session`) put
one log behind one Pykka actor and answer with futures.
"""

from typing import TYPE_CHECKING, Any

from nous_actor._version import __version__
from nous_actor.core._frozen import FrozenDict, FrozenList
from nous_actor.core.codec import CodecError
from nous_actor.core.compaction import (
    CompactionError,
    CompactionResult,
    Compactor,
    estimate_tokens,
)
from nous_actor.core.event import Event, EventType, InvalidEvent, Replace
from nous_actor.core.log import Log
from nous_actor.core.message import Message, Role, UnsendableMessage
from nous_actor.errors import (
    CallOutcomeUnknown,
    CallTimeout,
    ClusterError,
    ConflictError,
    FencedError,
    NousActorError,
    SessionCrashed,
    SessionError,
    SessionStopped,
    StoreError,
    SubscriptionLagged,
    TooManySessions,
    TurnBusy,
    TurnInterrupted,
)
from nous_actor.runtime import DispatchedActor, Dispatcher
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session, SessionHandle
from nous_actor.sessions.reader import SessionReader
from nous_actor.sessions.registry import RegistryActor, Sessions
from nous_actor.sessions.turn_handle import Turn
from nous_actor.store import MemoryStore, SessionInfo, SQLiteStore, Store, list_sessions
from nous_actor.store.base import CALL_RECORD_SECONDS
from nous_actor.store.subscription import Subscription
from nous_actor.supervision import (
    Backoff,
    ChildSpec,
    DispatchedSupervisedActor,
    RestartIntensityExceeded,
    RestartPolicy,
    SupervisedActor,
    Supervisor,
)

__all__ = [
    "Backoff",
    "CALL_RECORD_SECONDS",
    "CallOutcomeUnknown",
    "CallTimeout",
    "ChildSpec",
    "ClusterError",
    "CodecError",
    "CompactionError",
    "CompactionResult",
    "Compactor",
    "ConflictError",
    "DispatchedActor",
    "DispatchedSupervisedActor",
    "Dispatcher",
    "Event",
    "EventType",
    "FencedError",
    "FrozenDict",
    "FrozenList",
    "InvalidEvent",
    "Log",
    "MemoryStore",
    "Message",
    "NousActorError",
    "RegistryActor",
    "Replace",
    "RestartIntensityExceeded",
    "RestartPolicy",
    "Role",
    "SQLiteStore",
    "Session",
    "SessionActor",
    "SessionCrashed",
    "SessionError",
    "SessionFuture",
    "SessionHandle",
    "SessionInfo",
    "SessionReader",
    "SessionStopped",
    "Sessions",
    "Store",
    "StoreError",
    "Subscription",
    "SubscriptionLagged",
    "SupervisedActor",
    "Supervisor",
    "TooManySessions",
    "Turn",
    "TurnBusy",
    "TurnInterrupted",
    "UnsendableMessage",
    "__version__",
    "estimate_tokens",
    "list_sessions",
]

if TYPE_CHECKING:
    from nous_actor.store.postgres import PostgresStore as PostgresStore


def __getattr__(name: str) -> Any:
    """`PostgresStore`, loaded on first use (it needs the `postgres` extra). It is not
    in `__all__`: ``from nous_actor import *`` must work without psycopg."""
    if name == "PostgresStore":
        from nous_actor import store

        return store.PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
