"""Actors on a shared dispatcher: the runtime's threads scale with the cores, not the actors.

Pykka runs every `pykka.ThreadingActor` on a thread of its own, blocked on
its inbox. A `DispatchedActor` has no thread: a `Dispatcher` (a small pool
of threads, Akka's dispatcher, Erlang's schedulers) runs it when it has
messages, a turn of at most ``throughput`` messages at a time, then moves on
to the next runnable actor.

Built through the three hooks Pykka documents for implementors of new actor
types (`_create_actor_inbox`, `_create_future`, `_start_actor_loop`); Pykka's
own `_actor_loop_setup`, `_handle_receive`, `_handle_failure`, `_stop`, stop
message and `_actor_loop_teardown` are called, not copied; only the body of
its message loop is (`receive_one`: why, in `nous_actor.runtime.pykka_private`),
so refs, ``ask``/``tell``, proxies, futures
and the `pykka.ActorRegistry` work as on a `pykka.ThreadingActor`.

Guarantees:

* An actor is never run by two threads at once; the effects of one message
  are visible to the next, on whichever thread runs it.
* Messages from one sender are handled in the order sent.
* An actor handles at most ``throughput`` messages per turn before the
  others get theirs (fairness); a dispatcher thread parks only when no actor
  is runnable.
* Every ask is answered: one queued when the actor stops, or landing after
  it stopped (Pykka's stop race, which a thread per actor cannot close), is
  answered with `pykka.ActorDeadError`.
* The dispatcher's threads are daemon threads: they never keep a program
  from exiting (see `nous_actor.runtime.exit` for what is flushed then).

A handler that blocks holds a dispatcher thread: never wait inside a handler
for another actor on the same dispatcher (with one thread it deadlocks). Run
blocking work on `Workers` and send the result back as a message; an actor
that must block asks for a thread of its own (``pinned=True``).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import weakref
from _thread import LockType, allocate_lock
from collections import deque
from collections.abc import Callable
from itertools import count
from typing import Any, ClassVar, Final

import msgspec
import pykka
from pykka import ActorRegistry

from nous_actor._log import get_logger
from nous_actor.runtime import forks, scheduling, telemetry
from nous_actor.runtime.flag import Flag
from nous_actor.runtime.unique import unique_hex

__all__ = [
    "DEFAULT_THROUGHPUT",
    "CallEnvelope",
    "DispatchedActor",
    "Dispatcher",
    "Inbox",
    "Workers",
    "default_dispatcher",
    "default_threads",
    "receive_one",
]

logger = get_logger(__name__)

DEFAULT_THROUGHPUT: Final = 64
"""Messages an actor handles per turn before another runnable actor gets the thread."""

_counter = count()


def default_threads() -> int:
    """The default size of a dispatcher: the cores, at least 1 and at most 4 (the GIL
    lets one thread run Python at a time; more only help while others wait)."""
    return max(1, min(4, os.cpu_count() or 1))


def _check_size(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


class Dispatcher:
    """A pool of daemon threads that run `DispatchedActor` turns.

    Args:
        threads: how many threads (default `default_threads`); started on first use.
        throughput: messages an actor handles per turn before yielding the thread.
        name: the threads' name prefix.

    Raises:
        ValueError: ``threads`` or ``throughput`` is not an int >= 1.
    """

    def __init__(
        self,
        threads: int | None = None,
        *,
        throughput: int = DEFAULT_THROUGHPUT,
        name: str = "nous-dispatch",
    ) -> None:
        self.size = _check_size("threads", default_threads() if threads is None else threads)
        self.throughput = _check_size("throughput", throughput)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self.name = name
        # Runnable actors, oldest first, and the wake locks of the parked threads, the
        # last parked on top: a thread woken is the one that parked last, whose CPU
        # and caches are warm (waking them in turn puts a ping-pong across CPUs,
        # about twice its cost). Both are touched under ``_park_lock`` only where a
        # wake-up could be lost; append and popleft are atomic on their own.
        self._runq: deque[DispatchedActor] = deque()
        self._parked: list[LockType] = []
        self._park_lock = allocate_lock()
        self._threads: list[threading.Thread] = []
        self._start_lock = allocate_lock()
        self._closed = False
        self.parks = 0
        """How often a thread found no runnable actor and parked (its wake-ups)."""
        self.turns = 0
        """How many actor turns ran."""
        sink = telemetry.sink
        if sink is not None:
            sink.watch_dispatcher(self)

    # -- scheduling (any thread) -------------------------------------------------------------

    def _schedule(self, actor: DispatchedActor) -> None:
        if self._closed and actor.actor_stopped.is_set():
            # No thread reads the run queue any more (a pinned actor's, after it
            # stopped): what landed is answered here, in the sender's thread.
            inbox = actor.actor_inbox
            actor._actor_loop_teardown()
            inbox.give()
            if not inbox.empty() and inbox.take():
                self._schedule(actor)
            return
        if not self._threads:
            self._start_threads()
        self._runq.append(actor)
        if self._parked:  # (a thread parking now checks the queue under the lock)
            with self._park_lock:
                wake = self._parked.pop() if self._parked else None
            if wake is not None:
                wake.release()

    def _start_threads(self) -> None:
        with self._start_lock:
            if self._threads or self._closed:
                return
            n = next(_counter)
            threads = [
                threading.Thread(target=self._work, name=f"{self.name}-{n}.{i}", daemon=True)
                for i in range(self.size)
            ]
            for t in threads:
                t.start()
            self._threads = threads

    def threads(self) -> list[threading.Thread]:
        """The dispatcher's threads (none before its first actor ran)."""
        return list(self._threads)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads once the actors queued now have run their turn; later
        actors on this dispatcher never run (stop them first)."""
        with self._start_lock:
            self._closed = True
            threads = self._threads
        with self._park_lock:
            parked, self._parked = self._parked, []
        for wake in parked:
            wake.release()
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(timeout)

    # -- the threads -------------------------------------------------------------------------

    def queued(self) -> int:
        """How many runnable actors wait for a thread now."""
        return len(self._runq)

    def _work(self) -> None:
        runq = self._runq
        quota = self.throughput
        wake = allocate_lock()
        wake.acquire()
        again: DispatchedActor | None = None  # the actor to run next on this thread
        while True:
            try:
                if again is not None:
                    actor, again = again, None
                else:
                    actor = runq.popleft()
            except IndexError:
                with self._park_lock:
                    if runq:  # scheduled meanwhile: no need to park
                        continue
                    if self._closed:
                        return
                    self._parked.append(wake)
                self.parks += 1
                wake.acquire()  # released by _schedule (or close)
                continue
            self.turns += 1
            again = self._turn(actor, quota)
            # The parked thread refers to no actor (it would keep the actor, its log and
            # its store alive after it stopped, until this thread ran another).
            del actor

    def _turn(self, actor: DispatchedActor, quota: int) -> DispatchedActor | None:
        """Run one turn of ``actor``; the actor to run next on this thread, if any."""
        try:
            actor._turn(quota)
        except BaseException as exc:  # a turn never takes a dispatcher thread down
            try:
                logger.error(
                    "dispatcher.turn_failed",
                    actor=str(actor),
                    reason=type(exc).__name__,
                    error=repr(exc)[:200],
                )
            except BaseException:
                pass
        inbox = actor.actor_inbox
        inbox.give()
        if not inbox.empty() and inbox.take():
            if self._runq:  # others wait: to the back of the queue (fairness)
                self._schedule(actor)
            else:  # nobody else: its next turn here, waking no other thread
                return actor
        return None

    def __repr__(self) -> str:
        return f"<Dispatcher {self.name} threads={self.size} throughput={self.throughput}>"


_default: list[Dispatcher] = []
_default_lock = allocate_lock()


def _forget_default() -> None:
    """(In a forked child.) The parent's dispatcher has no threads here, and its run
    queue holds the parent's actors: the child's actors get a dispatcher of their own."""
    global _default_lock
    _default_lock = allocate_lock()
    _default.clear()


forks.after_fork(_forget_default)


def default_dispatcher() -> Dispatcher:
    """The process-wide dispatcher that actors run on unless told otherwise."""
    if _default:
        return _default[0]
    with _default_lock:
        if not _default:
            _default.append(Dispatcher())
        return _default[0]


_put: Final = queue.SimpleQueue.put


class CallEnvelope(msgspec.Struct, gc=False):
    """A call on its way to an actor whose messages are ``(handler, args, future)``
    (a session's): what Pykka's actor loop reads from the inbox (``message``,
    ``reply_to``); such calls carry their own future, so ``reply_to`` is always
    ``None``.

    The cyclic collector never sees an envelope (``gc=False``), and the envelope holds
    the call's parts itself (its ``message`` tuple is made as the actor reads it): a
    call queued behind others is two objects fewer for each collection (a caller that
    runs ahead of its session keeps thousands queued; with the envelope and its tuple
    tracked, the collections they set off took about a quarter of the time of 100k
    pipelined appends). An envelope is in no cycle of its own; what it holds could be
    in one only through a frame that holds the envelope, so none is kept by a frame a
    stored traceback refers to (the actor's loop lets go of it before it runs the
    call: `receive_one`)."""

    handler: Any
    args: Any
    future: Any
    reply_to: ClassVar[None] = None

    @property
    def message(self) -> tuple[Any, Any, Any]:
        """The call, ``(handler, args, future)``, as the actor reads it (made as it is
        read: a queued call holds no tuple of its own for the collector to visit)."""
        return (self.handler, self.args, self.future)


class _Plain(msgspec.Struct, gc=False):
    """A message with no one to answer (how `DispatchedActor` runs a `CallEnvelope`'s
    call through Pykka's handling)."""

    message: Any
    reply_to: ClassVar[None] = None


class Inbox(queue.SimpleQueue):  # type: ignore[type-arg]
    """A dispatched actor's inbox: a queue (put and get in C; a quarter of a deque's
    cost) that holds the token saying the actor is scheduled (taken from the moment it
    is put on the run queue until its turn ends).

    The queue itself and a one-byte ``bytearray`` for the token: no object of its own
    around a queue and a lock, two objects fewer per actor for the cyclic collector
    (a bytearray is none; ``bytearray.pop`` is atomic, as a lock's try-acquire is)."""

    __slots__ = ("_actor", "_token")

    def __init__(self) -> None:
        self._token = bytearray()  # empty: taken, until the actor is bound and started
        self._actor: DispatchedActor | None = None

    def put(self, envelope: Any, /) -> None:  # type: ignore[override]
        _put(self, envelope)
        if self._token and self.take():  # it was not scheduled: the taker schedules it
            actor = self._actor
            assert actor is not None
            actor._dispatcher._schedule(actor)

    def take(self) -> bool:
        """Take the token without waiting: whether it was free (the taker schedules the
        actor, or runs its turn)."""
        token = self._token
        if token:
            try:
                token.pop()
            except IndexError:  # another thread popped it first
                return False
            return True
        return False

    def give(self) -> None:
        """Give the token back (its taker's turn ended)."""
        token = self._token
        if token:
            raise RuntimeError("the inbox's token was given back twice")
        token.append(1)

    def get(self) -> Any:  # type: ignore[override]
        """The oldest envelope (the inbox must not be empty: this never blocks)."""
        return self.get_nowait()


_VARIANT: Final = "89ab89ab89ab89ab"  # a hex digit -> the same with RFC 4122's variant bits


def _urn() -> str:
    """A new actor's urn, in Pykka's form: a version-4 UUID's, unique in this process and
    across processes (`unique_hex`, with the version and variant bits put in)."""
    h = unique_hex()
    return f"urn:uuid:{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16)]}{h[17:20]}-{h[20:]}"


class DispatchedActor(pykka.Actor):
    """A Pykka actor that runs on a `Dispatcher` instead of a thread of its own.

    Use it as a `pykka.ThreadingActor`: subclass it, ``start()`` it, talk to it
    through its ref or a proxy. It runs on `default_dispatcher` unless its
    class (or the instance, before ``start`` returns) names another in
    ``dispatcher``; ``pinned = True`` gives each actor a dispatcher of one
    thread of its own (for an actor whose handlers block), which ends with it.
    """

    dispatcher: ClassVar[Dispatcher | None] = None
    pinned: ClassVar[bool] = False
    actor_inbox: Inbox
    # The handler whose calls the actor takes in runs (`_receive_run`), if any.
    _RUNS: ClassVar[Any] = None

    @staticmethod
    def _create_actor_inbox() -> Any:
        return Inbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return scheduling.current().future()

    # The ref copies ``actor_stopped`` when it is made: the actor and its ref share one
    # `Flag` (a `threading.Event` is a Condition and a lock, per actor, mostly never
    # waited for), and nothing is set on the ref afterwards.
    @property
    def actor_stopped(self) -> Flag:  # type: ignore[override]
        return self._stopped

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # What Pykka's ``Actor.__init__`` sets (tested against it), not calling it: it
        # names the actor with ``uuid.uuid4()``, a draw from ``os.urandom`` that lets go
        # of the GIL; with other threads busy the starting thread then waits ~0.2 ms to
        # get it back, and a registry opening 10,000 sessions paid that 10,000 times.
        # It would also make a ``threading.Event`` for ``actor_stopped``, which is a Flag.
        self.actor_urn = _urn()
        self.actor_inbox = self._create_actor_inbox()
        self._stopped = Flag()
        self._actor_ref = pykka.ActorRef(self)
        self._began = False
        self._ended = False
        self._dispatcher: Dispatcher = _NOT_BOUND
        # A subclass may change these in its __init__ (e.g. from its arguments).
        self._use_dispatcher: Dispatcher | None = type(self).dispatcher
        self._pin = type(self).pinned

    def _bind_dispatcher(self) -> Dispatcher:
        # A simulation's host runs every actor on its own dispatcher, pinned ones too.
        return scheduling.current().dispatcher(self._own_dispatcher)  # type: ignore[no-any-return]

    def _own_dispatcher(self) -> Dispatcher:
        if self._pin:
            return Dispatcher(1, name=f"nous-pinned-{type(self).__name__}")
        chosen = self._use_dispatcher
        return chosen if chosen is not None else default_dispatcher()

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        self._dispatcher = self._bind_dispatcher()
        inbox._actor = self
        # The token is held since the inbox was made: the first turn (on_start) is ours.
        self._dispatcher._schedule(self)

    # -- a turn, on a dispatcher thread ------------------------------------------------------

    def _turn(self, quota: int) -> None:
        if not self._began:
            self._began = True
            self._actor_loop_setup()
        stopped = self.actor_stopped
        q = self.actor_inbox
        empty, get = q.empty, q.get_nowait
        runs = type(self)._RUNS  # (read off the class: a function, not a bound method)
        while quota > 0 and not empty() and not stopped.is_set():
            envelope = get()
            if type(envelope) is CallEnvelope:  # `receive_one`'s first case, inline
                handler, args, future = envelope.handler, envelope.args, envelope.future
                del envelope  # (not held while the call runs: see `receive_one`)
                if handler is runs:
                    quota = self._receive_run(args, future, quota)
                    continue
                self._receive_call(handler, args, future)
            else:
                receive_one(self, envelope)
            quota -= 1
        if stopped.is_set():
            self._actor_loop_teardown()
            if not self._ended:
                self._ended = True
                try:
                    self._actor_ended()
                finally:
                    if self._pin:  # its thread ends with it
                        self._dispatcher.close(timeout=0)

    def _receive_call(self, handler: Any, args: Any, future: Any) -> None:
        """Run one call that came in a `CallEnvelope`: here, as Pykka runs a message
        ``(handler, args, future)``; an actor that takes such calls runs them itself."""
        receive_one(self, _Plain((handler, args, future)))

    def _receive_run(self, args: Any, future: Any, quota: int) -> int:
        """Run a call to the `_RUNS` handler and, if the actor can, the envelopes queued
        right behind it, at most ``quota`` in all (at least this one), each in order;
        returns the quota left. (Here: that one call alone.)"""
        self._receive_call(type(self)._RUNS, args, future)
        return quota - 1

    def _actor_loop_teardown(self) -> None:
        """Pykka's teardown: every queued ask is answered (a stop request with ``None``,
        the others with `pykka.ActorDeadError`); also run for envelopes that land after
        the actor stopped. An ask answered already is passed over (Pykka's loop would
        end at it, leaving the rest unanswered)."""
        while True:
            try:
                super()._actor_loop_teardown()
            except queue.Full:  # that envelope's future was set already: on to the next
                continue
            return

    def _actor_ended(self) -> None:
        """Hook: the actor has stopped and its inbox is answered (runs once)."""


class _NotBound(Dispatcher):
    """Placeholder before ``start``: scheduling on it is a bug."""

    def __init__(self) -> None:  # no threads, no queue
        pass

    def _schedule(self, actor: DispatchedActor) -> None:  # pragma: no cover
        raise RuntimeError("the actor is not started")


_NOT_BOUND: Final[Dispatcher] = _NotBound()


class Workers:
    """A bounded pool of daemon threads for blocking work (store reads, user callbacks):
    what must never run on a dispatcher thread. Threads start on demand, up to ``size``,
    and end after ``idle`` seconds without work."""

    def __init__(self, size: int, *, name: str = "nous-worker", idle: float = 5.0) -> None:
        self.size = _check_size("size", size)
        self.name = name
        self.idle = idle
        self._empty()
        _pools.add(self)

    def _empty(self) -> None:
        """No threads, no tasks (at the start; in a forked child, whose threads are gone
        and whose queued tasks are its parent's)."""
        self._q: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = allocate_lock()
        self._threads = 0
        self._waiting = 0  # threads blocked for the next task

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on a worker thread; what it raises is logged, never passed on."""
        scheduling.current().submit(self._put, fn, self.name)

    def _put(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)
        with self._lock:
            if self._waiting or self._threads >= self.size:
                return
            self._threads += 1
            n = self._threads
        threading.Thread(target=self._work, name=f"{self.name}-{n}", daemon=True).start()

    def _work(self) -> None:
        q = self._q
        while True:
            with self._lock:
                self._waiting += 1
            try:
                fn = q.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    self._waiting -= 1
                    if q.empty():
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._waiting -= 1
            _run_logged(fn)
            del fn  # a waiting thread keeps nothing of its last task alive


_pools: weakref.WeakSet[Workers] = weakref.WeakSet()


def _empty_pools() -> None:
    for pool in list(_pools):
        pool._empty()


forks.after_fork(_empty_pools)


def _run_logged(fn: Callable[[], None]) -> None:
    try:
        fn()
    except BaseException as exc:
        logger.error("worker.task_failed", reason=type(exc).__name__, error=repr(exc)[:200])


def receive_one(actor: Any, envelope: Any) -> None:
    """Pykka's ``_actor_loop_running`` body, for one envelope of ``actor`` (a dispatched
    actor's turn, or a simulation's step of any actor): the one copy of Pykka's loop,
    and why it is a copy, is in `nous_actor.runtime.pykka_private` (`COPIED`)."""
    # The envelope is not held while the call runs: ours are invisible to the cyclic
    # collector, and this frame can be kept by the traceback of an error the call stored
    # in its future (a cycle through the envelope would never be collected).
    if type(envelope) is CallEnvelope:
        handler, args, future = envelope.handler, envelope.args, envelope.future
        del envelope
        actor._receive_call(handler, args, future)
        return
    message, reply_to = envelope.message, envelope.reply_to
    del envelope
    try:
        response = actor._handle_receive(message)
        if reply_to is not None:
            reply_to.set(response)
    except Exception:
        if reply_to is not None:
            reply_to.set_exception()
        else:
            actor._handle_failure(*sys.exc_info())
            try:
                actor.on_failure(*sys.exc_info())
            except Exception:
                actor._handle_failure(*sys.exc_info())
    except BaseException as exc:
        # Pykka stops every actor on a BaseException: the actors registered now are
        # asked to stop, at once (a later actor is left alone), without waiting here
        # (their stops may need this very thread to run).
        logger.debug("actor.base_exception", actor=str(actor), reason=type(exc).__name__)
        actor._stop()
        ActorRegistry.stop_all(block=False)
