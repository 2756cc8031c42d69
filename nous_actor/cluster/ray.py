"""Sessions hosted on Ray: shard actors across processes and nodes, one shared store.

Ray decides where a session runs; the store's claim on a session (for
`nous_actor.PostgresStore`, its lease and fencing) alone decides who may
write it::

    from functools import partial

    import ray
    from nous_actor import PostgresStore
    from nous_actor.cluster.ray import RaySessions

    ray.init(address="auto")  # a running cluster (`ray start --head`)
    with RaySessions(partial(PostgresStore, dsn), shards=4) as sessions:
        chat = sessions.open("chat-42")
        chat.append("user_message", {"content": "hi"}).get()

* `RaySessions` starts ``shards`` **shard actors** on Ray (restarted by Ray
  without limit, named and optionally detached), each hosting a
  `nous_actor.Sessions` registry on a store of its own, made in the shard's
  worker process by ``store_factory``. A session id maps to a shard by a
  stable hash (jump consistent hashing of its BLAKE2b digest), the same in
  every process; each session is one actor inside its shard, with every
  guarantee of a local session.
* `RaySessions.open` returns a `RaySession`: a `nous_actor.SessionHandle`
  with every method of a local `nous_actor.Session` handle. Input is checked
  and frozen in the caller's thread, so bad input fails its own call with the
  same typed errors; every call returns a `nous_actor.SessionFuture` (a
  bounded ``get``, awaitable without blocking the event loop).
* Calls to one shard travel in batches: while one batch is in flight, later
  calls (of every session of that shard, from every thread and coroutine of
  this process) queue and go together as the next batch, in one Ray call. A
  session's calls are applied in the order they were made.
* A shard whose worker dies (SIGKILL, ``ray.kill``, a lost node) is restarted
  by Ray, and its sessions recover from the store on their next call. Calls in
  flight at that moment fail with `nous_actor.SessionCrashed` (they may or
  may not have been applied; an acknowledged append is never lost); later
  calls reach the restarted shard through the same handles. A shard stopped
  for good (`RaySessions.shutdown`, ``ray.kill(no_restart=True)``) is not
  restarted: its calls fail with `nous_actor.SessionCrashed` saying so.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import pickle
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any, Final, TypeVar

import ray
import ray.exceptions
from ray import cloudpickle

from nous_actor._log import get_logger
from nous_actor._version import __version__
from nous_actor.core._frozen import short_repr
from nous_actor.core.compaction import CompactionError
from nous_actor.core.ids import check_session_id
from nous_actor.errors import (
    CallTimeout,
    ClusterError,
    NousActorError,
    SessionCrashed,
    SessionStopped,
    StoreError,
    SubscriptionLagged,
)
from nous_actor.runtime import telemetry
from nous_actor.sessions.actor import Handler, SessionActor, _Compaction
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.handle import Session, SessionHandle, _check_handle_args
from nous_actor.sessions.registry import Sessions, check_capacity
from nous_actor.sessions.turns import HELD
from nous_actor.store.base import Store
from nous_actor.store.subscription import Subscription

__all__ = ["RaySession", "RaySessions", "shard_of"]

logger = get_logger(__name__)

T = TypeVar("T")

PROTOCOL: Final = 1
"""The version of what drivers and shards say to each other; both sides check it."""

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
# What comes back for each: (NOW, value) | (FAILED, exception) | (LATER, token).
NOW, FAILED, LATER = range(3)
_WAIT = 3  # inside a shard only: (_WAIT, a future to await before answering)

_CALLS: Final[dict[str, Handler]] = {
    name: getattr(SessionActor, name)
    for name in (
        "h_append",
        "h_append_many",
        "h_append_at",
        "h_snapshot",
        "h_fork",
        "h_read",
        "h_log",
        "h_turn_open",
        "h_turn_call",
        "h_turn_read",
        "h_turn_end",
    )
}
_READS: Final = frozenset(
    {"derive_messages", "derive_indexed", "surface", "events", "since", "count", "as_of"}
)


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


# -- the shard: inside a Ray actor ----------------------------------------------------------


class _Shard:
    """One shard: a `Sessions` registry on its own store, inside one (async) Ray actor.

    Every method is a coroutine on the actor's event loop; the sessions run in
    their own Pykka threads, so a slow call of one session never holds up the
    shard's other sessions.
    """

    def __init__(
        self,
        store_factory: Callable[[], Store],
        index: int,
        shards: int,
        options: dict[str, Any],
    ) -> None:
        self.index = index
        self.shards = shards
        self.started = time.time()
        self.error: Exception | None = None
        self.sessions: Sessions | None = None
        self.handles: dict[str, Session] = {}
        self.later: dict[int, Any] = {}
        self.subs: dict[int, Subscription] = {}
        self.tokens = itertools.count()
        self.turns: dict[str, int] = {}  # each link's next batch number
        self.turned: asyncio.Condition | None = None  # made on the actor's loop
        # Sessions a turn was opened on here: their writes may wait for a turn, so
        # they are answered later, never holding up the batch they came in.
        self.with_turns: set[str] = set()
        try:
            store = store_factory()
            if not isinstance(store, Store):
                raise TypeError(
                    f"store_factory must return a nous_actor Store, got {type(store).__name__}"
                )
            self.sessions = Sessions(store, **options)
        except TypeError as exc:
            self.error = _portable(exc)
        except Exception as exc:
            what = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            self.error = StoreError(f"shard {index} could not open its store: {what}")

    async def ready(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "version": __version__,
            "index": self.index,
            "shards": self.shards,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "started": self.started,
            "error": self.error,
        }

    def _usable(self, session_id: str) -> bool:
        h = self.handles.get(session_id)
        return h is not None and h._ref is not None and not h._ref.actor_stopped.is_set()

    async def _open(self, ops: list[Op]) -> dict[str, Exception]:
        """Open (recovering from the store, off the loop) every session these calls
        need that is not running here; the ones that could not be opened, and why."""
        assert self.sessions is not None
        need: list[str] = []
        for kind, sid, _, _ in ops:
            if kind in (ALIVE, RESTARTS) or sid in need:
                continue
            if kind == OPEN or not self._usable(sid):
                need.append(sid)
        refused: dict[str, Exception] = {}
        if need:
            got = await asyncio.gather(
                *(self.sessions.aopen(sid) for sid in need), return_exceptions=True
            )
            for sid, h in zip(need, got, strict=True):
                if isinstance(h, Session):
                    self.handles[sid] = h
                elif isinstance(h, Exception):
                    refused[sid] = _portable(h)
                else:
                    raise h
        return refused

    def _later(self, waiting: Any) -> tuple[int, Any]:
        token = next(self.tokens)
        self.later[token] = waiting
        return LATER, token

    def _start(self, op: Op) -> tuple[int, Any]:
        """Put one call in its session's inbox (in order); what to wait for."""
        assert self.sessions is not None
        kind, sid, name, args = op
        if kind == ALIVE:
            return NOW, sid in self.sessions.live()
        if kind == RESTARTS:
            return NOW, self.sessions.restart_count(sid)
        h = self.handles[sid]
        if kind == OPEN:
            return NOW, None
        if kind == CALL:
            handler = _CALLS.get(name)
            if handler is None or (name == "h_read" and not (args[:1] and args[0] in _READS)):
                raise NousActorError(f"a shard runs no call {name!r}")
            if name == "h_turn_open":
                self.with_turns.add(sid)
            call = h._call(handler, *args)
            if name == "h_turn_open":  # it waits for the open turn, then as a call
                call._timeout = args[0].wait + h.timeout
            if name == "h_turn_open" or (name in HELD and sid in self.with_turns):
                return self._later(call)  # it may wait for a turn: the batch does not
            return _WAIT, call
        if kind == COMPACT:
            blob, at, force, cid, explicit = args
            try:
                compactor = pickle.loads(blob)
            except Exception as exc:
                raise CompactionError(
                    f"the compactor could not be loaded in shard {self.index} "
                    f"({type(exc).__name__}: {short_repr(exc)}); the module of its "
                    "summariser must be importable where the shards run (install it "
                    "there, or ship it with Ray's runtime_env)"
                ) from None
            req = _Compaction(compactor, at, force, cid, explicit, asyncio.get_running_loop())
            return self._later(h._call(SessionActor.h_compact, req))
        if kind == STOP:
            return self._later(asyncio.ensure_future(h.astop(args[0])))
        raise NousActorError(f"a shard runs no call of kind {kind!r}")

    async def _turn(self, link: str, number: int, reset: bool) -> None:
        """Wait until every earlier batch of ``link`` has been started."""
        if self.turned is None:
            self.turned = asyncio.Condition()
        if reset or link not in self.turns:
            # The link's first batch (or its first since a batch failed): its count
            # starts here. A shard restarted behind a link's back knows no count
            # either: the link learns of the restart from its failed batches.
            self.turns[link] = number
            return
        async with self.turned:
            try:
                await asyncio.wait_for(
                    self.turned.wait_for(lambda: self.turns[link] >= number), TURN_WAIT
                )
            except TimeoutError:
                logger.error(
                    "ray.batch_out_of_order",
                    shard=self.index,
                    batch=number,
                    expected=self.turns[link],
                    reason="an earlier batch never arrived",
                )

    async def _turned(self, link: str, number: int) -> None:
        assert self.turned is not None
        async with self.turned:
            if self.turns[link] <= number:
                self.turns[link] = number + 1
            self.turned.notify_all()

    async def run(self, protocol: int, *batch: Any) -> list[tuple[int, Any]]:
        """Apply a batch of calls (``link, number, reset, ops``), in order, after the
        link's earlier batches; one outcome per call."""
        ops: list[Op] = batch[-1] if batch and isinstance(batch[-1], list) else []
        if protocol != PROTOCOL or len(batch) != 4:
            return [(FAILED, _mismatch(self.index, protocol))] * len(ops)
        link, number, reset, _ = batch
        if self.error is not None or self.sessions is None:
            return [(FAILED, self.error)] * len(ops)
        await self._turn(link, number, reset)
        try:
            refused = await self._open(ops)
            started: list[tuple[int, Any]] = []
            for op in ops:
                why = refused.get(op[1])
                if why is not None:
                    started.append((FAILED, why))
                    continue
                try:
                    started.append(self._start(op))
                except Exception as exc:
                    started.append((FAILED, _portable(exc)))
        finally:
            await self._turned(link, number)
        out: list[tuple[int, Any]] = []
        for state, value in started:
            if state != _WAIT:
                out.append((state, value))
                continue
            try:
                out.append((NOW, await value))
            except Exception as exc:
                out.append((FAILED, _portable(exc)))
        return out

    async def result(self, token: int) -> tuple[int, Any]:
        """The outcome of a call answered later (a compaction, a stop)."""
        waiting = self.later.pop(token, None)
        if waiting is None:
            return FAILED, NousActorError(f"shard {self.index} holds no call {token}")
        try:
            return NOW, await waiting
        except Exception as exc:
            return FAILED, _portable(exc)

    async def subscribe(
        self, session_id: str, from_seq: int, buffer: int, timeout: float
    ) -> tuple[int, Any]:
        if self.error is not None:
            return FAILED, self.error
        refused = await self._open([(OPEN, session_id, "", ())])
        if session_id in refused:
            return FAILED, refused[session_id]
        try:
            sub = await self.handles[session_id].asubscribe(
                from_seq, buffer=buffer, timeout=timeout
            )
        except Exception as exc:
            return FAILED, _portable(exc)
        token = next(self.tokens)
        self.subs[token] = sub
        return NOW, (token, self._drain(sub, [], 1 << 62))

    @staticmethod
    def _drain(sub: Subscription, events: list[Any], limit: int) -> list[Any]:
        while len(events) < limit:
            ev = sub.get_nowait()
            if ev is None:
                break
            events.append(ev)
        return events

    async def poll(self, token: int, wait: float) -> tuple[list[Any], bool, Exception | None]:
        """The next events of a subscription (waiting at most ``wait`` for the first);
        whether it ended, and with which error."""
        sub = self.subs.get(token)
        if sub is None:
            return [], True, None
        events: list[Any] = []
        try:
            if not sub.pending():
                try:
                    events.append(await sub.aget(wait))
                except CallTimeout:
                    return events, False, None
            return self._drain(sub, events, MAX_POLL), False, None
        except (SessionStopped, SubscriptionLagged):
            self.subs.pop(token, None)
            error = sub._error
            return events, True, None if error is None else _portable(error)

    async def unsubscribe(self, token: int) -> None:
        sub = self.subs.pop(token, None)
        if sub is not None:
            sub.close()

    async def live(self) -> list[str]:
        return [] if self.sessions is None else self.sessions.live()

    async def close(self, timeout: float) -> None:
        for sub in list(self.subs.values()):
            sub.close()
        self.subs.clear()
        if self.sessions is not None:
            await self.sessions.aclose(timeout)


# -- the driver's side ----------------------------------------------------------------------


class _Link:
    """This process's side of one shard: calls queue here and go in batches.

    Up to ``max_in_flight`` batches are in flight at once; each carries this
    link's id and a number, and the shard starts them strictly in that order
    (its turns), so a session's calls are applied in the order they were made.
    After a batch failed as a whole (the shard was lost), the next one resets
    the shard's count and goes alone until it is answered.
    """

    __slots__ = (
        "_futs",
        "_in_flight",
        "_lock",
        "_next",
        "_ops",
        "_reset",
        "actor",
        "calls",
        "closed",
        "id",
        "index",
        "max_in_flight",
        "sent",
    )

    def __init__(self, actor: Any, index: int, max_in_flight: int = DEFAULT_IN_FLIGHT) -> None:
        self.actor = actor
        self.index = index
        self.max_in_flight = max_in_flight
        self.id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._futs: list[SessionFuture[Any]] = []
        self._in_flight = 0
        self._next = 0  # the number of the next batch
        self._reset = True  # the next batch starts the shard's count for this link
        self.closed: str | None = None
        self.calls = 0  # Ray calls made
        self.sent = 0  # session calls they carried

    def submit(self, op: Op, fut: SessionFuture[Any]) -> None:
        if self.closed is not None:
            fut._fail(SessionStopped(op[1], self.closed))
            return
        with self._lock:
            self._ops.append(op)
            self._futs.append(fut)
            batch = self._take()
        if batch is not None:
            self._send(*batch)

    def _take(self) -> tuple[list[Op], list[SessionFuture[Any]], int, bool] | None:
        """The next batch to send, if one may go now (under the lock)."""
        if not self._ops or self._in_flight >= (1 if self._reset else self.max_in_flight):
            return None
        ops, futs = self._ops, self._futs
        if len(ops) > MAX_BATCH:
            self._ops, self._futs = ops[MAX_BATCH:], futs[MAX_BATCH:]
            ops, futs = ops[:MAX_BATCH], futs[:MAX_BATCH]
        else:
            self._ops, self._futs = [], []
        number, reset = self._next, self._reset
        self._next += 1
        self._in_flight += 1
        return ops, futs, number, reset

    def _send(
        self, ops: list[Op], futs: list[SessionFuture[Any]], number: int, reset: bool
    ) -> None:
        start = time.time_ns() if telemetry.sink is not None else 0
        try:
            ref = self.actor.run.remote(PROTOCOL, self.id, number, reset, ops)
        except Exception as exc:  # Ray refused the call (shut down, not connected)
            self._finished(ops, futs, exc, lost=False)
            return
        self.calls += 1
        self.sent += len(ops)
        ref.future().add_done_callback(partial(self._done, ops, futs, start))

    def _done(
        self, ops: list[Op], futs: list[SessionFuture[Any]], start: int, answer: Future[Any]
    ) -> None:
        # In Ray's callback thread. The next batch goes first, then this one is answered.
        try:
            outcomes = answer.result()
            if not isinstance(outcomes, list) or len(outcomes) != len(ops):
                raise _mismatch(self.index, None)
        except Exception as exc:
            self._report(start, len(ops), failed=True)
            self._finished(ops, futs, exc, lost=True)
            return
        self._report(start, len(ops), failed=False)
        with self._lock:
            self._in_flight -= 1
            self._reset = False
            batch = self._take()
        if batch is not None:
            self._send(*batch)
        for op, fut, (state, value) in zip(ops, futs, outcomes, strict=True):
            if state == NOW:
                fut._resolve(value)
            elif state == FAILED:
                fut._fail(value)
            else:
                self._follow(op[1], fut, value)

    def _report(self, start: int, calls: int, *, failed: bool) -> None:
        sink = telemetry.sink
        if sink is not None and start:
            sink.batch_done(f"shard-{self.index}", calls, start, time.time_ns(), failed)

    def _finished(
        self, ops: list[Op], futs: list[SessionFuture[Any]], exc: BaseException, *, lost: bool
    ) -> None:
        """A batch failed as a whole: fail its calls; the next batch resets the count."""
        with self._lock:
            self._in_flight -= 1
            self._reset = True
            batch = self._take()
        for op, fut in zip(ops, futs, strict=True):
            fut._fail(_lost(op[1], self.index, exc))
        if batch is not None:
            self._send(*batch)

    def _follow(self, session_id: str, fut: SessionFuture[Any], token: int) -> None:
        """Ask for the outcome of a call the shard answers later."""
        try:
            ref = self.actor.result.remote(token)
        except Exception as exc:
            fut._fail(_lost(session_id, self.index, exc))
            return
        ref.future().add_done_callback(partial(self._settle, session_id, fut))

    def _settle(self, session_id: str, fut: SessionFuture[Any], answer: Future[Any]) -> None:
        try:
            state, value = answer.result()
        except Exception as exc:
            fut._fail(_lost(session_id, self.index, exc))
            return
        if state == NOW:
            fut._resolve(value)
        else:
            fut._fail(value)


class _Feed:
    """Feeds a local `Subscription` from its shard by long polls, each sent when the
    last one answered (no thread of its own)."""

    __slots__ = ("closed", "link", "session_id", "sub", "token")

    def __init__(self, link: _Link, session_id: str, sub: Subscription, token: int) -> None:
        self.link = link
        self.session_id = session_id
        self.sub = sub
        self.token = token
        self.closed = False

    def poll(self) -> None:
        if self.closed:
            return
        try:
            ref = self.link.actor.poll.remote(self.token, POLL_WAIT)
        except Exception as exc:
            self._end(exc)
            return
        ref.future().add_done_callback(self._polled)

    def _polled(self, answer: Future[Any]) -> None:
        try:
            events, ended, error = answer.result()
        except Exception as exc:
            self._end(exc)
            return
        for ev in events:
            if not self.sub._push(ev):  # closed here, or this reader lags behind
                self.close(self.sub)
                return
        if ended:
            self.closed = True
            self.sub._finish(error)
            return
        self.poll()

    def _end(self, exc: BaseException) -> None:
        self.closed = True
        if self.link.closed is not None:
            self.sub._finish(None)
        else:
            self.sub._finish(_lost(self.session_id, self.link.index, exc))

    def close(self, sub: Subscription) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.link.actor.unsubscribe.remote(self.token)
        except Exception:  # the shard is gone: so is its subscriber
            pass


class RaySession(SessionHandle):
    """The handle to a session hosted in a shard of `RaySessions`.

    Every method of `nous_actor.SessionHandle`, with the same checks (in the
    caller's thread), futures and typed errors as a local `nous_actor.Session`.
    The differences come from the process boundary:

    * A compactor given to `compact` runs in the shard, so it must be
      picklable (its summariser too); refused with ``TypeError`` otherwise.
    * Results are copies: a `nous_actor.Log` from `log` or `fork` is the
      session's value at that moment, sent over.
    * Calls in flight when the shard is lost fail with
      `nous_actor.SessionCrashed` (they may or may not have been applied);
      later calls reach the restarted shard. A subscription ends with that
      error too: subscribe again from the next seq you need. A shard stopped
      for good (by `RaySessions.shutdown`, ``ray.kill(no_restart=True)``, or
      the exit of the driver that created it without ``detached``) is not
      restarted, and every call fails with a `nous_actor.SessionCrashed` that
      says so.

    Get one from `RaySessions.open` (or ``aopen``). A handle belongs to the
    process that opened it; open the session id again in another process.
    """

    __slots__ = ("_link",)

    def __init__(self, session_id: str, link: _Link, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        _check_handle_args(session_id, timeout)
        self.session_id = session_id
        self.timeout = float(timeout)
        self._link = link

    def _send(self, kind: int, name: str = "", args: tuple[Any, ...] = ()) -> SessionFuture[Any]:
        fut: SessionFuture[Any] = SessionFuture(self.session_id, self.timeout)
        self._link.submit((kind, self.session_id, name, args), fut)
        return fut

    def _call(self, handler: Handler, *args: Any) -> SessionFuture[Any]:
        if handler is SessionActor.h_compact:
            req: _Compaction = args[0]
            try:
                blob = cloudpickle.dumps(req.compactor)  # type: ignore[no-untyped-call]
            except Exception as exc:
                return self._failed(
                    TypeError(
                        "the compactor runs in the session's shard, so it (and its "
                        "summariser) must be picklable: "
                        f"{type(exc).__name__}: {short_repr(exc)}"
                    )
                )
            return self._send(COMPACT, "", (blob, req.time, req.force, req.cid, req.explicit))
        name = getattr(handler, "__name__", "")
        if name not in _CALLS:
            return self._failed(NousActorError(f"a RaySession cannot send {name!r}"))
        return self._send(CALL, name, args)

    def _register(self, sub: Subscription, timeout: float) -> None:
        """The shard holds the session's subscriber; ``sub`` is fed from it by long polls."""
        if self._link.closed is not None:
            raise SessionStopped(self.session_id, self._link.closed)
        actor = self._link.actor
        try:
            ref = actor.subscribe.remote(self.session_id, sub.from_seq, sub.buffer, timeout)
            state, value = ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            # Registered late, if at all: let the shard drop that subscriber.
            ref.future().add_done_callback(partial(_drop_late, actor))
            raise CallTimeout(
                self.session_id, f"the subscription was not registered within {timeout:g} s"
            ) from None
        except Exception as exc:
            raise _lost(self.session_id, self._link.index, exc) from None
        if state == FAILED:
            raise value
        token, events = value
        sub._catch_up(events)
        feed = _Feed(self._link, self.session_id, sub, token)
        sub._on_close = feed.close
        feed.poll()

    def is_alive(self) -> bool:
        """Whether the session is running in its shard now (a ``False`` is not final:
        the next call starts it there again)."""
        return bool(self._send(ALIVE).get())

    def stop(self, timeout: float | None = None) -> None:
        """Stop the session in its shard after the calls already queued; waits at most
        ``timeout`` (plus one round trip to the shard).

        The next call on a handle starts the session again, recovering it from
        the store.

        Raises:
            CallTimeout: not stopped within ``timeout``.
        """
        bound = self.timeout if timeout is None else timeout
        self._send(STOP, "", (bound,)).get(timeout=bound + min(self.timeout, 5.0))

    async def astop(self, timeout: float | None = None) -> None:
        """`stop` for asyncio code: awaited without blocking the loop (and with no thread)."""
        bound = self.timeout if timeout is None else timeout
        await self._send(STOP, "", (bound,))

    def __reduce__(self) -> Any:
        raise TypeError(
            "a RaySession belongs to the process that opened it; send the session id "
            "and open it with RaySessions there"
        )


def _drop_late(actor: Any, answer: Future[Any]) -> None:
    try:
        state, value = answer.result()
    except Exception:
        return
    if state == NOW:
        try:
            actor.unsubscribe.remote(value[0])
        except Exception:
            pass


_H2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""What an HTTP/2 client sends first: the connection preface, then empty SETTINGS."""


def _where(address: str | None) -> tuple[str, int] | None:
    """The host and port of a Ray ``address`` (``None`` for ``auto``, ``local`` or none).

    Raises:
        ClusterError: the address cannot be read.
    """
    if address is None or address in ("auto", "local"):
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(
            f"cannot read the Ray address {address!r}: give 'host:port' (the head "
            "node's address that `ray start --head` printed), 'ray://host:port' or 'auto'"
        )
    return host.strip("[]"), int(port)


def _probe(address: str, host: str, port: int, timeout: float) -> None:
    """Check, within ``timeout`` seconds, that what listens at ``address`` speaks gRPC as
    Ray's GCS and Ray Client server do: it answers an HTTP/2 preface with its SETTINGS.
    (``ray.init`` waits without bound on a listener that never answers.)

    Raises:
        ClusterError: nothing listens there, or what listens is not a Ray cluster.
    """
    fix = (
        "give the address of the head node that `ray start --head` printed "
        "(its GCS, port 6379 by default), or 'ray://host:port' for a Ray Client server"
    )
    deadline = time.monotonic() + timeout
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ClusterError(
            f"no Ray cluster answers at {address!r} ({exc.strerror or exc}); start one "
            "with `ray start --head`, or pass the address it printed"
        ) from None
    head = b""
    with conn:
        try:
            conn.sendall(_H2_PREFACE)
            while len(head) < 9:
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except TimeoutError:
            raise ClusterError(
                f"something at {address!r} accepts connections but did not answer within "
                f"{timeout:g} s, so it is not a Ray cluster (its GCS answers at once): {fix}"
            ) from None
        except OSError:
            pass  # it closed the connection: judged by what it said before
    if len(head) == 9 and head[3] == 4 and not head[4] & 1 and not any(head[5:9]):
        return  # an HTTP/2 SETTINGS frame on stream 0: a gRPC server
    if head.startswith(b"HTTP/") or head.lstrip().startswith(b"<"):
        what = f"it answered {head.decode('ascii', 'replace')!r}..., like an HTTP/1 server"
    elif head:
        what = "it does not speak gRPC (HTTP/2)"
    else:
        what = "it closed the connection without answering"
    raise ClusterError(f"what listens at {address!r} is not a Ray cluster: {what}; {fix}")


def _connect(address: str | None, timeout: float) -> None:
    """Connect this process to Ray unless it is already: a `ClusterError` within about
    ``timeout`` seconds, never a hang, for an address (``address``, or ``RAY_ADDRESS``
    when it is ``None``) where no Ray cluster listens."""
    if ray.is_initialized():
        return
    target = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    where = _where(target)
    if where is not None and target is not None:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            # TLS comes first there: an HTTP/2 preface in clear proves nothing.
            try:
                socket.create_connection(where, timeout=timeout).close()
            except OSError as exc:
                raise ClusterError(
                    f"no Ray cluster answers at {target!r} ({exc.strerror or exc}); start "
                    "one with `ray start --head`, or pass the address it printed"
                ) from None
        else:
            _probe(target, *where, timeout)
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"could not connect to Ray at {address!r}: {exc}") from None


_OWN_OPTIONS: Final = {
    "name": "name=",
    "namespace": "namespace=",
    "lifetime": "detached=True",
    "get_if_exists": "name= (shards of that name that run already are reached, not started)",
}
"""Ray actor options that `RaySessions` sets from its own arguments: which argument."""


def _shard_options(remote: Any, actor_options: object) -> dict[str, Any]:
    """The Ray options of the shard actors: ours updated with ``actor_options``, checked by
    Ray (which needs no connection for that), so that a bad one is refused before
    anything starts.

    Raises:
        TypeError: ``actor_options`` is not a mapping of option names, or Ray refuses
            the type of a value.
        ValueError: an option Ray does not know, a bad value, or one that an argument of
            `RaySessions` sets (the message names the argument).
    """
    if actor_options is None:
        actor_options = {}
    if not isinstance(actor_options, Mapping):
        raise TypeError(
            "actor_options must be a mapping of Ray actor options, e.g. "
            f"{{'resources': {{'gpu_node': 1}}}}, or None; got {type(actor_options).__name__}"
        )
    for key in actor_options:
        if not isinstance(key, str):
            raise TypeError(f"actor_options keys must be Ray option names (str), got {key!r}")
        if key in _OWN_OPTIONS:
            raise ValueError(
                f"actor_options may not set {key!r}: pass {_OWN_OPTIONS[key]} to RaySessions"
            )
    base: dict[str, Any] = {
        "max_restarts": -1,
        "max_task_retries": 0,
        "num_cpus": 0,
        # Ray places an actor that asks for no resource on a random node whatever
        # its strategy: a token of memory makes SPREAD (and soft affinity) apply.
        "memory": 1 << 20,
        "scheduling_strategy": "SPREAD",
        **actor_options,
    }
    try:
        remote.options(**base)
    except TypeError as exc:
        raise TypeError(f"actor_options: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"actor_options: {exc}") from None
    return base


class RaySessions:
    """Sessions hosted in shard actors on a Ray cluster, journaled in a shared store.

    Args:
        store_factory: makes the store of one shard, called in that shard's
            worker process (again after each restart); it must be picklable,
            e.g. ``functools.partial(PostgresStore, dsn)``. Every shard must
            reach the same journal: a `nous_actor.PostgresStore` for more than
            one machine.
        shards: how many shard actors host the sessions.
        name: name the shard actors ``"{name}.{i}"`` (in ``namespace``), so
            that another driver with the same name reaches the same shards: a
            shard of that name that runs already is reached, not started again
            (and `close` leaves it running).
        namespace: the Ray namespace of named shards (default: the driver's).
        detached: keep the shards running when this driver exits (needs
            ``name``); `close` then leaves them serving and `shutdown` stops them.
        address: where the cluster is, when this process is not connected to Ray
            yet (passed to ``ray.init``; ``None``: Ray's default).
        timeout: the handles' default bound on every wait.
        start_timeout: how long the shards may take to start.
        max_sessions, idle_timeout: for each shard's `nous_actor.Sessions`.
        max_in_flight: batches this process may have in flight to one shard (a
            session's calls are applied in order whatever it is). One makes the
            largest batches, the cheapest when CPUs are busy; more hide network
            latency between nodes.
        actor_options: more Ray options for the shard actors (resources,
            ``scheduling_strategy``; default ``num_cpus=0``, 1 MiB of ``memory``,
            spread over nodes); not ``name``, ``namespace``, ``lifetime`` or
            ``get_if_exists``, which the arguments above set.

    Use it as a context manager (``with``, or ``async with``): leaving the
    block calls `close` (``aclose``).

    Every argument is checked before anything starts (or connects to Ray).

    Raises:
        ClusterError: Ray cannot be reached (within ``start_timeout``, at most 5 s,
            whatever listens at ``address``), or the address cannot be read; the
            shards did not start in time, or shards of that ``name`` run with
            another number of shards. The shards this call created are stopped.
        StoreError: a shard could not open its store (the shards this call created
            are stopped).
        TypeError: ``store_factory``, ``name``, ``namespace``, ``detached``,
            ``address`` or ``actor_options`` of the wrong type (nothing is
            started); ``store_factory`` cannot be pickled, or makes no store.
        ValueError: a count or a number of seconds that is not one (``shards="4"``)
            or out of range, an empty ``name``, an ``actor_options`` key that an
            argument sets or that Ray refuses (nothing is started).
    """

    def __init__(
        self,
        store_factory: Callable[[], Store],
        *,
        shards: int = 4,
        name: str | None = None,
        namespace: str | None = None,
        detached: bool = False,
        address: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        start_timeout: float = 60.0,
        max_sessions: int = 10_000,
        idle_timeout: float | None = None,
        max_in_flight: int = DEFAULT_IN_FLIGHT,
        actor_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(store_factory):
            raise TypeError(
                "store_factory must be a callable that makes a store in each shard, "
                f"e.g. functools.partial(PostgresStore, dsn); got {type(store_factory).__name__}"
            )
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {shards!r}")
        for arg, value in (("name", name), ("namespace", namespace)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{arg} must be a str or None, got {type(value).__name__}")
            if value is not None and not value.strip():
                raise ValueError(f"{arg} must be a non-empty str or None, got {value!r}")
        if not isinstance(detached, bool):
            raise TypeError(f"detached must be True or False, got {detached!r}")
        if detached and name is None:
            raise ValueError("detached shards need a name= (to be found again by later drivers)")
        if address is not None and not isinstance(address, str):
            raise TypeError(
                "address must be a str ('host:port', 'ray://host:port' or 'auto') or None, "
                f"got {type(address).__name__}"
            )
        _where(address)
        _check_handle_args("shards", timeout)
        if (
            isinstance(start_timeout, bool)
            or not isinstance(start_timeout, (int, float))
            or not 0 < start_timeout < float("inf")
        ):
            raise ValueError(
                f"start_timeout must be a finite number of seconds > 0, got {start_timeout!r}"
            )
        check_capacity(max_sessions, idle_timeout)
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or not 1 <= max_in_flight <= 64
        ):
            raise ValueError(f"max_in_flight must be an int in [1, 64], got {max_in_flight!r}")
        remote = ray.remote(_Shard)
        base = _shard_options(remote, actor_options)
        self.shards = shards
        self.name = name
        self.namespace = namespace
        self.detached = detached
        self.timeout = float(timeout)
        self._closed = False
        options = {"max_sessions": max_sessions, "idle_timeout": idle_timeout, "timeout": timeout}
        _connect(address, min(start_timeout, 5.0))
        self._actors, self._created = self._start_shards(
            remote, base, store_factory, options, start_timeout
        )
        self._links = [_Link(a, i, max_in_flight) for i, a in enumerate(self._actors)]

    def _get_or_create(
        self, remote: Any, opts: dict[str, Any], args: tuple[Any, ...]
    ) -> tuple[Any, bool]:
        """The shard actor for ``opts``, and whether this call created it: a named shard
        that runs already is reached, not created (what Ray's ``get_if_exists`` does, but
        knowing which of the two happened)."""
        name = opts.get("name")
        if name is None:
            return remote.options(**opts).remote(*args), True
        try:
            return ray.get_actor(name, namespace=self.namespace), False
        except ValueError:  # no live actor of that name: create it
            pass
        try:
            return remote.options(**opts).remote(*args), True
        except ray.exceptions.ActorAlreadyExistsError:  # another driver was faster
            return ray.get_actor(name, namespace=self.namespace), False

    def _start_shards(
        self,
        remote: Any,
        base: dict[str, Any],
        store_factory: Callable[[], Store],
        options: dict[str, Any],
        start_timeout: float,
    ) -> tuple[list[Any], list[bool]]:
        """Create the shards, or reach those of ``name`` that run already, and wait until
        each answers: each shard, and whether this object created it. If start-up fails,
        the shards created here are killed, and only those."""
        actors: list[Any] = []
        created: list[bool] = []

        def fail(error: Exception) -> Exception:
            _kill([a for a, new in zip(actors, created, strict=True) if new])
            return error

        try:
            for i in range(self.shards):
                opts = dict(base)
                if self.name is not None:
                    opts["name"] = f"{self.name}.{i}"
                    if self.namespace is not None:
                        opts["namespace"] = self.namespace
                if self.detached:
                    opts["lifetime"] = "detached"
                actor, new = self._get_or_create(
                    remote, opts, (store_factory, i, self.shards, options)
                )
                actors.append(actor)
                created.append(new)
        except Exception as exc:
            if isinstance(exc, (TypeError, pickle.PicklingError)):
                raise fail(
                    TypeError(f"store_factory must be picklable (it runs in each shard): {exc}")
                ) from None
            raise fail(ClusterError(f"could not start the shards on Ray: {exc}")) from None
        refs = [a.ready.remote() for a in actors]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=start_timeout)
        if pending:
            raise fail(
                ClusterError(
                    f"{len(pending)} of {self.shards} shards did not start within "
                    f"{start_timeout:g} s: check `ray status` for free resources, and that "
                    "nous_actor (with the extras its store needs) is installed wherever "
                    "Ray runs workers"
                )
            )
        infos: list[dict[str, Any]] = []
        for i, ref in enumerate(refs):
            try:
                infos.append(ray.get(ref))
            except Exception as exc:
                raise fail(ClusterError(f"shard {i} failed to start: {short_repr(exc)}")) from None
        for info in infos:
            if info.get("protocol") != PROTOCOL:
                raise fail(
                    ClusterError(
                        f"the shards named {self.name!r} run nous_actor "
                        f"{info.get('version', 'of another protocol')}, this driver "
                        f"{__version__}: run one version of nous_actor on every node"
                    )
                )
            if info["shards"] != self.shards:
                raise fail(
                    ClusterError(
                        f"the shards named {self.name!r} run as {info['shards']} shards, not "
                        f"{self.shards}: open them with shards={info['shards']}, or use "
                        "another name"
                    )
                )
        for info in infos:
            if info["error"] is not None:
                raise fail(info["error"])
        return actors, created

    # -- the user's side -------------------------------------------------------------------

    def shard_of(self, session_id: str) -> int:
        """The shard that hosts ``session_id`` (see `nous_actor.cluster.ray.shard_of`)."""
        check_session_id(session_id)
        return shard_of(session_id, self.shards)

    def _check_open(self, session_id: str) -> _Link:
        check_session_id(session_id)
        if self._closed:
            raise SessionStopped(session_id, "the registry is closed")
        return self._links[shard_of(session_id, self.shards)]

    def _handle(self, session_id: str, link: _Link) -> RaySession:
        return RaySession(session_id, link, timeout=self.timeout)

    def open(self, session_id: str) -> RaySession:
        """Start or find ``session_id`` in its shard (recovering it from the store) and
        return a handle that survives restarts of the session and of the shard.

        Raises:
            ValueError, TypeError: ``session_id`` is not a valid id.
            ConflictError: another live writer holds the session in the store.
            StoreError: the store failed while recovering the session.
            TooManySessions: the shard is at its ``max_sessions``.
            SessionStopped: this registry is closed, or the shard was lost meanwhile.
        """
        link = self._check_open(session_id)
        h = self._handle(session_id, link)
        h._send(OPEN).get()
        return h

    async def aopen(self, session_id: str) -> RaySession:
        """`open` for asyncio code: awaited without blocking the loop. Raises as `open`."""
        link = self._check_open(session_id)
        h = self._handle(session_id, link)
        await h._send(OPEN)
        return h

    def restart_count(self, session_id: str) -> int:
        """How many times ``session_id`` was restarted after a crash in its current shard
        process (a restarted shard counts from 0)."""
        link = self._check_open(session_id)
        return int(self._handle(session_id, link)._send(RESTARTS).get())

    def live(self) -> list[str]:
        """Ids of the sessions running now in every shard, sorted."""
        if self._closed:
            return []
        found = self._ask_all("live")
        return sorted(itertools.chain.from_iterable(found))

    def shard_info(self) -> list[dict[str, Any]]:
        """Each shard's ``index``, worker ``pid``, ``node_id`` and ``started`` time (an
        answer from each shard, so also a health check)."""
        infos = self._ask_all("ready")
        return [{k: v for k, v in info.items() if k != "error"} for info in infos]

    def _ask_all(self, method: str) -> list[Any]:
        """One answer from every shard, within the handles' bound."""
        try:
            return list(
                ray.get([getattr(a, method).remote() for a in self._actors], timeout=self.timeout)
            )
        except ray.exceptions.GetTimeoutError:
            raise CallTimeout("*", f"not every shard answered within {self.timeout:g} s") from None
        except ray.exceptions.RayActorError as exc:
            why = _gone(exc)
            if why is not None:
                raise SessionStopped(
                    "*",
                    f"a shard is dead and Ray will not restart it ({why}): make a new "
                    "RaySessions to start it again",
                ) from None
            raise SessionStopped(
                "*", f"a shard is being restarted by Ray ({type(exc).__name__}); try again"
            ) from None

    def shard_actor(self, index: int) -> Any:
        """The Ray actor handle of shard ``index`` (e.g. to ``ray.kill`` it in a fault drill)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.shards:
            raise ValueError(f"index must be an int in [0, {self.shards}), got {index!r}")
        return self._actors[index]

    def stats(self) -> dict[str, int]:
        """``calls``: Ray calls made to the shards for session calls; ``sent``: the
        session calls they carried (so ``sent / calls`` is the mean batch)."""
        return {
            "calls": sum(link.calls for link in self._links),
            "sent": sum(link.sent for link in self._links),
        }

    def close(self, timeout: float = 10.0) -> None:
        """Stop using the shards: the handles' calls fail with `nous_actor.SessionStopped`.

        Shards this object created, without ``detached``, are stopped too (every
        session first, each within ``timeout``), and only those: shards of ``name``
        that ran already when it was made (another driver's, or another
        `RaySessions` object's) keep serving, as do detached shards; `shutdown`
        stops them.
        """
        if self._closed:
            return
        self._closed = True
        self._unlink("the registry is closed")
        if not self.detached:
            self._stop_shards(
                timeout, [a for a, new in zip(self._actors, self._created, strict=True) if new]
            )

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every session and every shard actor, detached or not, created by this object
        or reached by name: for every driver (their calls then fail with
        `nous_actor.SessionCrashed`, saying that Ray will not restart the shard)."""
        self._closed = True
        self._unlink("the registry was shut down")
        self._stop_shards(timeout, self._actors)

    async def aclose(self, timeout: float = 10.0) -> None:
        """`close` for asyncio code: awaited without blocking the loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close, timeout)

    def _unlink(self, why: str) -> None:
        for link in self._links:
            link.closed = why

    def _stop_shards(self, timeout: float, actors: list[Any]) -> None:
        if not actors:
            return
        refs = [a.close.remote(timeout) for a in actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=timeout + self.timeout)
        finally:
            _kill(actors)

    def __enter__(self) -> RaySessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RaySessions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        named = "" if self.name is None else f" name={self.name!r}"
        return f"<RaySessions shards={self.shards}{named}>"


def _kill(actors: list[Any]) -> None:
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass
