"""The shard: a `nous_actor.Sessions` registry inside one (async) Ray actor.

Ray pickles `_Shard` by its module path into the shard workers, so this module
must be importable wherever Ray runs them (nous_actor installed there).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import secrets
import time
from collections.abc import Callable
from typing import Any

import ray

from nous_actor._log import get_logger
from nous_actor._version import __version__
from nous_actor.cluster.ray._protocol import (
    _CALLS,
    _READS,
    _WAIT,
    ALIVE,
    CALL,
    COMPACT,
    FAILED,
    LATER,
    MAX_POLL,
    NOW,
    OPEN,
    PROTOCOL,
    RESTARTS,
    SEQ,
    STOP,
    TURN_WAIT,
    Op,
    _mismatch,
    _pack,
    _pack_outcomes,
    _portable,
    _unpack,
    _unpack_each,
)
from nous_actor.core._frozen import short_repr
from nous_actor.core.compaction import CompactionError
from nous_actor.core.event import Event
from nous_actor.errors import (
    CallTimeout,
    NousActorError,
    SessionCrashed,
    SessionStopped,
    StoreError,
    SubscriptionLagged,
)
from nous_actor.runtime.tables import Sweep
from nous_actor.sessions.actor import HELD, SessionActor, _Compaction
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions
from nous_actor.store.base import Store, is_store
from nous_actor.store.subscription import Subscription

logger = get_logger("nous_actor.cluster.ray")  # the package's name, as before it was split

_HANDLES_SWEEP = 1024
"""The least size at which a shard sweeps the handles of stopped sessions out of its table."""


def _stopped(session_id: str, h: Session) -> bool:
    """Whether ``h``'s session no longer runs here (its handle may go)."""
    return h._ref is None or h._ref.actor_stopped.is_set()


def _store_name(store: object) -> str:
    """How messages name ``store``, so that two stores compare equal when they are the
    same journal: its type and location (a PostgreSQL server's database and schema,
    never a password; a SQLite file's absolute path), or its type alone for a store
    with no location of its own (a `nous_actor.MemoryStore`, private to each shard)."""
    kind = type(store).__name__
    location = getattr(store, "location", None)
    if isinstance(location, str):
        return f"{kind} on {location}"
    path = getattr(store, "path", None)
    if isinstance(path, str):
        return f"{kind} {path if path == ':memory:' else os.path.realpath(path)}"
    return kind


def _made_store(store_factory: Callable[[], Store]) -> str:
    """`_store_name` of a store ``store_factory`` makes, closed again at once."""
    store = store_factory()
    try:
        if not is_store(store):
            raise TypeError(
                f"store_factory must return a nous_actor Store, got {type(store).__name__}"
            )
        return _store_name(store)
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()


async def _outcome(waiting: Any) -> tuple[int, Any]:
    """What a call the shard waited for came to: ``(NOW, its value)``, or ``(FAILED, what
    it raised)`` in a form that survives the trip to the driver."""
    try:
        return NOW, await waiting
    except Exception as exc:
        return FAILED, _portable(exc)


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
        # A handle per session opened here; those of sessions stopped since (passivated,
        # moved) are swept out as the table grows (amortized: a sweep each time it
        # doubled since the last), so a shard that serves ever new sessions keeps the
        # live ones only. A batch uses the handles its `_open` returned, never this
        # table, so a sweep while it waits cannot take one from under it.
        self.handles: dict[str, Session] = {}
        self._handles_sweep: Sweep[str, Session] = Sweep(_stopped, _HANDLES_SWEEP)
        self.later: dict[int, Any] = {}
        self.subs: dict[int, Subscription] = {}
        # Tokens of calls answered later and of subscriptions: unique across the shard's
        # incarnations (a random 63-bit prefix each), so that a driver's poll or result
        # meant for an earlier incarnation, reaching this one after a restart, is told
        # that the shard does not know it, and never takes another call's token.
        self.tokens = itertools.count(secrets.randbits(63) << 64)
        self.closed = False  # `close` was called: subscriptions ended normally
        self.turns: dict[str, int] = {}  # each link's next batch number
        self.turned: asyncio.Condition | None = None  # made on the actor's loop, if needed
        self.waiting = 0  # batches waiting for an earlier batch of their link
        # Sessions a turn was opened on here: their writes may wait for a turn, so
        # they are answered later, never holding up the batch they came in.
        self.with_turns: set[str] = set()
        self.store: str | None = None  # `_store_name` of the store
        try:
            store = store_factory()
            if not is_store(store):
                raise TypeError(
                    f"store_factory must return a nous_actor Store, got {type(store).__name__}"
                )
            self.store = _store_name(store)
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
            "store": self.store,
            "error": self.error,
        }

    async def same_store(self, store_factory: Callable[[], Store]) -> tuple[str | None, str]:
        """The name of this shard's store, and that of a store ``store_factory`` makes
        (made in a thread, then closed): a driver that reaches this running shard checks
        that its factory makes the store the shard writes to.

        Raises whatever making or closing that store raises."""
        return self.store, await asyncio.to_thread(_made_store, store_factory)

    def _usable(self, session_id: str) -> bool:
        h = self.handles.get(session_id)
        return h is not None and not _stopped(session_id, h)

    async def _open(self, ops: list[Op]) -> tuple[dict[str, Session], dict[str, Exception]]:
        """Open (recovering from the store, off the loop) every session these calls
        need that is not running here: the handles of the sessions the calls name, and
        the ones that could not be opened, and why."""
        assert self.sessions is not None
        handles: dict[str, Session] = {}
        need: list[str] = []
        for kind, sid, _, _ in ops:
            if kind in (ALIVE, RESTARTS) or sid in need:
                continue
            if kind == OPEN or not self._usable(sid):
                need.append(sid)
            else:
                handles[sid] = self.handles[sid]
        refused: dict[str, Exception] = {}
        if need:
            got = await asyncio.gather(
                *(self.sessions.aopen(sid) for sid in need), return_exceptions=True
            )
            for sid, h in zip(need, got, strict=True):
                if isinstance(h, Session):
                    self.handles[sid] = handles[sid] = h
                elif isinstance(h, Exception):
                    refused[sid] = _portable(h)
                else:
                    raise h
            self._handles_sweep.after(self.handles)
        return handles, refused

    def _later(self, waiting: Any) -> tuple[int, Any]:
        token = next(self.tokens)
        self.later[token] = waiting
        return LATER, token

    def _start(self, op: Op, handles: dict[str, Session]) -> tuple[int, Any]:
        """Put one call in its session's inbox (in order); what to wait for."""
        assert self.sessions is not None
        kind, sid, name, args = op
        if kind == ALIVE:
            return NOW, sid in self.sessions.live()
        if kind == RESTARTS:
            return NOW, self.sessions.restart_count(sid)
        h = handles[sid]
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
            blob, at, force, cid, explicit, turn_id = args
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
            if turn_id is None:
                return self._later(h._call(SessionActor.h_compact, req))
            return self._later(h._call(SessionActor.h_turn_call, turn_id, "h_compact", (req,)))
        if kind == STOP:
            return self._later(asyncio.ensure_future(h.astop(args[0])))
        raise NousActorError(f"a shard runs no call of kind {kind!r}")

    async def _turn(self, link: str, number: int, reset: bool) -> None:
        """Wait until every earlier batch of ``link`` has been started (a batch that
        comes in order waits for nothing: no lock is taken, no task made)."""
        expected = self.turns.get(link)
        if reset or expected is None:
            # The link's first batch (or its first since a batch failed): its count
            # starts here. A shard restarted behind a link's back knows no count
            # either: the link learns of the restart from its failed batches.
            self.turns[link] = number
            return
        if expected >= number:
            return
        if self.turned is None:
            self.turned = asyncio.Condition()
        self.waiting += 1
        try:
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
        finally:
            self.waiting -= 1

    async def _turned(self, link: str, number: int) -> None:
        """Batch ``number`` of ``link`` was started: wake the later batches waiting for it
        (the loop runs one coroutine at a time, so the count needs no lock of its own)."""
        if self.turns[link] <= number:
            self.turns[link] = number + 1
        if self.waiting and self.turned is not None:
            async with self.turned:
                self.turned.notify_all()

    async def run(self, *batch: Any) -> bytes | list[tuple[int, Any]]:
        """Apply a batch of calls, in order, after the link's earlier batches; one
        outcome per call, packed (`_pack_outcomes`).

        The batch is one blob of bytes (`_pack`): ``(protocol, link, number, reset,
        count, calls)``, the calls packed again, so that calls this shard cannot read
        still leave the link's count right and fail each, one by one: only those that
        hold a value of a class it cannot import, when the others can be read."""
        if len(batch) != 1 or not isinstance(batch[0], bytes):
            # A driver of protocol 2 or older, refused in the form it reads.
            calls = len(batch[-1]) if batch and isinstance(batch[-1], list) else 0
            return [(FAILED, _mismatch(self.index, batch[0] if batch else "none"))] * calls
        try:
            header = _unpack(batch[0])
        except Exception:
            header = None
        if not isinstance(header, tuple) or len(header) != 6 or header[0] != PROTOCOL:
            count = header[4] if isinstance(header, tuple) and len(header) > 4 else 0
            protocol = header[0] if isinstance(header, tuple) and header else "unreadable"
            fail = (FAILED, _mismatch(self.index, protocol))
            return _pack([fail] * (count if isinstance(count, int) else 0))
        _, link, number, reset, count, blob = header
        if self.error is not None or self.sessions is None:
            return _pack([(FAILED, self.error)] * count)
        await self._turn(link, number, reset)
        try:
            unread: dict[int, str] = {}
            try:
                ops: list[Op] = _unpack(blob)
            except Exception as exc:
                try:  # fail only the calls that hold what cannot be loaded here
                    ops, unread = _unpack_each(blob)
                except Exception:
                    ops = []
                if len(ops) != count or not unread:
                    error = NousActorError(
                        f"shard {self.index} could not read the calls it was sent "
                        f"({type(exc).__name__}: {short_repr(exc)}): run one version of "
                        "nous_actor, with the same modules, on every node"
                    )
                    return _pack([(FAILED, error)] * count)
            handles, refused = await self._open(
                [op for i, op in enumerate(ops) if i not in unread]
            )
            started: list[tuple[int, Any]] = []
            for i, op in enumerate(ops):
                if i in unread:
                    started.append((FAILED, self._unreadable(unread[i])))
                    continue
                why = refused.get(op[1])
                if why is not None:
                    started.append((FAILED, why))
                    continue
                try:
                    started.append(self._start(op, handles))
                except Exception as exc:
                    started.append((FAILED, _portable(exc)))
        finally:
            await self._turned(link, number)
        outcomes = [await _outcome(v) if state == _WAIT else (state, v) for state, v in started]
        for i, (op, (state, value)) in enumerate(zip(ops, outcomes, strict=True)):
            if state == NOW and op[2] == "h_append" and type(value) is Event:
                outcomes[i] = (SEQ, value.seq)  # the driver has the rest: see SEQ
        return _pack_outcomes(outcomes)

    def _unreadable(self, why: str) -> NousActorError:
        """What a call gets whose arguments this shard cannot load."""
        return NousActorError(
            f"shard {self.index} could not read this call, whose arguments hold a value "
            f"of a class it cannot import ({why}): pass plain values, or define the class "
            "in a module installed (or shipped with Ray's runtime_env) wherever the shards "
            "run"
        )

    async def result(self, token: int, session_id: str = "*") -> bytes:
        """The outcome of a call answered later (a compaction, a stop), packed as a
        batch's (one outcome); ``session_id``: the call's session, for the error if this
        shard holds no such call (it was restarted since it answered: the call may or
        may not have been applied)."""
        waiting = self.later.pop(token, None)
        if waiting is None:
            return _pack([(FAILED, self._unknown(session_id, "call"))])
        return _pack_outcomes([await _outcome(waiting)])

    async def subscribe(
        self, session_id: str, from_seq: int, buffer: int, timeout: float
    ) -> tuple[int, Any]:
        if self.error is not None:
            return FAILED, self.error
        handles, refused = await self._open([(OPEN, session_id, "", ())])
        if session_id in refused:
            return FAILED, refused[session_id]
        try:
            sub = await handles[session_id].asubscribe(from_seq, buffer=buffer, timeout=timeout)
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

    def _unknown(self, session_id: str, what: str) -> SessionCrashed:
        """A token this shard does not know: it was given by an earlier incarnation of the
        shard (tokens are never reused), whose calls and subscribers died with it."""
        return SessionCrashed(
            session_id,
            f"its shard {self.index} was restarted and no longer holds this {what} (it "
            f"died with the shard's previous worker); "
            + (
                "the call may or may not have been applied"
                if what == "call"
                else "subscribe again from the next seq you need"
            ),
        )

    async def poll(
        self, token: int, wait: float, session_id: str = "*"
    ) -> tuple[list[Any], bool, Exception | None]:
        """The next events of a subscription (waiting at most ``wait`` for the first);
        whether it ended, and with which error. A token this shard does not know ends the
        subscription with `SessionCrashed` (its subscriber died with an earlier incarnation
        of the shard), unless the shard was closed, which ends every subscription."""
        sub = self.subs.get(token)
        if sub is None:
            return [], True, None if self.closed else self._unknown(session_id, "subscription")
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
        self.closed = True
        for sub in list(self.subs.values()):
            sub.close()
        self.subs.clear()
        if self.sessions is not None:
            await self.sessions.aclose(timeout)
