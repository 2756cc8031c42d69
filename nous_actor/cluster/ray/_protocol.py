"""The protocol of `nous_actor.cluster.ray`: what drivers and shards say to each other.

The protocol's version and limits, the shape of a call to a shard and of its
outcome, the calls a shard runs, the session-to-shard hash (`shard_of`), and
how a failure crosses the process boundary (`_portable`) or is told to the
caller when a whole Ray call failed (`_lost`). Imports nothing of the package.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any, Final

import ray
import ray.exceptions
from ray import cloudpickle

from nous_actor._version import __version__
from nous_actor.core._frozen import short_repr
from nous_actor.errors import ClusterError, NousActorError, SessionCrashed
from nous_actor.sessions.actor import Handler, SessionActor
from nous_actor.sessions.actor._calls import REMOTE, TURN_READS, handlers_with

PROTOCOL: Final = 3  # 2: a compaction may travel through a turn; 3: batches cross as bytes
"""The version of what drivers and shards say to each other; both sides check it."""

MAX_SHARDS: Final = 1024
"""Shards one `RaySessions` may have, at most: each is an actor (a worker process) that
every driver reaches, and more than a cluster's nodes can host by far only slows the
start-up (a round trip to Ray's control store per shard) and every `RaySessions.live`."""

MAX_BATCH: Final = 1000
"""Calls carried by one Ray call to a shard, at most."""

DEFAULT_IN_FLIGHT: Final = 1
"""Batches one process has in flight to one shard, at most, unless told otherwise: one
makes the largest batches, the cheapest on busy CPUs; more hide a slow network."""

TURN_WAIT: Final = 30.0
"""Seconds a shard waits for a link's earlier batch before starting a later one anyway
(never, unless Ray lost a call)."""

POLL_WAIT: Final = 1.0
"""Seconds a subscription's long poll waits in its shard for the next event."""

MAX_POLL: Final = 5000
"""Events one poll of a subscription carries, at most."""

# What a call to a shard is: (kind, session id, handler name, arguments).
Op = tuple[int, str, str, tuple[Any, ...]]
OPEN, CALL, COMPACT, STOP, ALIVE, RESTARTS = range(6)
# What comes back for each: (NOW, value) | (FAILED, exception) | (LATER, token) |
# (SEQ, seq): an h_append applied as sent, under that seq (the driver makes the event
# from the parts it sent, so the event does not travel back).
NOW, FAILED, LATER = range(3)
_WAIT = 3  # inside a shard only: (_WAIT, a future to await before answering)
SEQ: Final = 4

_CALLS: Final[dict[str, Handler]] = {h.__name__: h for h in handlers_with(REMOTE)}
"""The calls a shard runs, by name: the session actor's handlers declared `REMOTE`."""
_READS: Final = TURN_READS[SessionActor.h_read]
"""What a shard's ``h_read`` may be asked: the reads a turn may make."""


def shard_of(session_id: str, shards: int) -> int:
    """The shard (``0 <= shard < shards``) that hosts ``session_id``: the same in every
    process and run. Going from ``n`` to ``n + 1`` shards moves only about ``1/(n+1)``
    of the sessions (jump consistent hashing)."""
    key = int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big")
    b, j = -1, 0
    while j < shards:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def _portable(exc: BaseException) -> Exception:
    """``exc`` if it survives the trip to another process, else a `NousActorError`
    saying what it was."""
    if isinstance(exc, Exception):
        try:
            pickle.loads(pickle.dumps(exc))
            return exc
        except Exception:
            pass
    return NousActorError(f"{type(exc).__name__}: {short_repr(exc)}")


def _pack(value: Any) -> bytes:
    """``value`` as the one blob of bytes that crosses to the other side (a batch, or
    its answer): pickled by reference where it can be, by value (cloudpickle) where not.

    Ray serializes each argument of a call, and walks each object of ours it is handed,
    at a cost of its own each; one blob costs it one argument and no walk.
    """
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:
        return cloudpickle.dumps(value, protocol=5)  # type: ignore[no-any-return,no-untyped-call]


def _pack_outcomes(outcomes: list[tuple[int, Any]]) -> bytes:
    """A batch's answer as one blob; an outcome that cannot cross fails its own call,
    never its batch's others."""
    try:
        return _pack(outcomes)
    except Exception:
        pass
    crossing: list[tuple[int, Any]] = []
    for state, value in outcomes:
        try:
            _pack(value)
        except Exception as exc:
            state, value = (
                FAILED,
                NousActorError(
                    f"the answer ({type(value).__name__}) could not be sent back from the "
                    f"shard: {type(exc).__name__}: {short_repr(exc)}"
                ),
            )
        crossing.append((state, value))
    return _pack(crossing)


def _pack_batch(link: str, number: int, reset: bool, ops: list[Op]) -> bytes:
    """Batch ``number`` of ``link`` as the one argument of its Ray call: the calls packed
    again inside, so that a shard that cannot read them still knows the batch's place
    in its link's order and how many calls it carries."""
    return _pack((PROTOCOL, link, number, reset, len(ops), _pack(ops)))


def _unpack(blob: bytes) -> Any:
    """What `_pack` packed."""
    return pickle.loads(blob)


class _Unloadable:
    """Stands in a shard for a class it cannot import (`_unpack_each`): made from any
    arguments, keeps no state, and refuses to be pickled again, naming the class."""

    origin = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Unloadable:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __reduce__(self) -> Any:
        raise pickle.PicklingError(f"{self.origin} cannot be imported here")


class _Lenient(pickle.Unpickler):
    """Loads what it can: a class it cannot import becomes an `_Unloadable` of its name."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return type(name, (_Unloadable,), {"origin": f"{module}.{name}"})


def _unpack_each(blob: bytes) -> tuple[list[Any], dict[int, str]]:
    """The calls packed in ``blob``, which `_unpack` could not read, read leniently: the
    calls, and those that hold something this process cannot import (by index: what),
    so that they fail alone and the batch's other calls still run.

    Raises whatever the lenient load raises when the blob cannot be read even so."""
    ops = _Lenient(io.BytesIO(blob)).load()
    if not isinstance(ops, list):
        raise TypeError(f"the calls are a {type(ops).__name__}, not a list")
    unread: dict[int, str] = {}
    for i, op in enumerate(ops):
        try:
            pickle.dumps(op, protocol=5)
        except Exception as exc:
            unread[i] = f"{type(exc).__name__}: {short_repr(exc)}"
    return ops, unread


def _mismatch(index: int, protocol: object) -> ClusterError:
    """Driver and shard speak different versions: ``protocol`` is what the shard was sent
    (``None``: seen by the driver, in the shard's answer)."""
    if protocol is None:
        what = f"shard {index} answered in a form nous_actor {__version__} does not know"
    else:
        what = (
            f"shard {index} runs nous_actor {__version__} (protocol {PROTOCOL}) and was "
            f"sent calls of protocol {protocol!r}"
        )
    return ClusterError(f"{what}: run one version of nous_actor on every node")


def _disconnected() -> str | None:
    """Why this process cannot reach its shards any more, if it cannot: ``ray.shutdown()``
    ended its connection to Ray (a call through Ray would then start a local Ray
    instance, as ``ray.init()`` does, and fail there); ``None`` while it is connected."""
    if ray.is_initialized():
        return None
    return (
        "this process is no longer connected to Ray (ray.shutdown() was called): "
        "connect again with ray.init() and make a new RaySessions"
    )


def _gone(exc: BaseException) -> str | None:
    """Why the shard is dead for good, when ``exc`` (a failed Ray call to it) says that Ray
    will not restart it (``ray.kill(no_restart=True)``, a driver's `RaySessions.close` or
    `RaySessions.shutdown`, its owner's exit, no restarts left); ``None`` otherwise.

    Ray tells the two apart: ``ActorDiedError`` once the actor is dead for good,
    ``ActorUnavailableError`` while it is being restarted.
    """
    if not isinstance(exc, ray.exceptions.ActorDiedError):
        return None
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1].rstrip(".") if lines else type(exc).__name__


def _lost(session_id: str, index: int, exc: BaseException) -> Exception:
    """What a call gets when its Ray call failed as a whole. A restart is promised only
    when Ray is restarting the shard."""
    if isinstance(exc, ray.exceptions.RayActorError):
        why = _gone(exc)
        if why is not None:
            return SessionCrashed(
                session_id,
                f"its shard {index} is dead and Ray will not restart it ({why}); the call "
                "may or may not have been applied; calls through this RaySessions cannot "
                "reach that shard again: make a new RaySessions to start it again",
            )
        return SessionCrashed(
            session_id,
            f"its shard {index} was lost with this call in flight ({type(exc).__name__}); "
            "the call may or may not have been applied; Ray is restarting the shard, and "
            "later calls reach it once it runs again",
        )
    return NousActorError(
        f"session {session_id!r}: the call to its shard {index} failed: "
        f"{type(exc).__name__}: {short_repr(exc)}"
    )
