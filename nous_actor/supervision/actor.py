"""Supervision, OTP style, on top of Pykka (which has none).

* `SupervisedActor`: a Pykka actor that reports its exit (normal, or a
  crash with its reason) to the supervisor that started it, and contains a
  ``BaseException`` (Pykka's default would stop every actor in the process).
* `Supervisor`: child specs, strategies ``one_for_one`` /
  ``one_for_all`` / ``rest_for_one``, restart types ``permanent`` /
  ``transient`` / ``temporary``, a sliding-window restart intensity with
  optional exponential backoff, escalation to the parent supervisor beyond
  it, and shutdown in reverse start order with a timeout per child.

What counts as a crash: an exception in a tell or in ``on_start``, a
``BaseException`` in any handler, and (for sessions) a store failure after
which memory and disk may disagree. Every restart, backoff, escalation and
shutdown timeout is a structlog event with the child id and the reason.

Where the library reaches into Pykka's private names (here: `_actor_loop`,
`_actor_loop_setup`, `_handle_receive`, `_handle_failure`, `_create_future`,
`_start_actor_loop`), and why, is listed in one place:
`nous_actor.runtime.pykka_private`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

import pykka

from nous_actor._log import get_logger
from nous_actor.core._frozen import short_repr
from nous_actor.errors import NousActorError
from nous_actor.runtime import forks, scheduling
from nous_actor.runtime.dispatcher import DispatchedActor, Inbox
from nous_actor.runtime.flag import Flag

__all__ = [
    "HANDLED_LATER",
    "ActorCrashed",
    "Cell",
    "DispatchedSupervisedActor",
    "Exit",
    "Monitor",
    "SupervisedActor",
    "cell_of",
    "start_monitored",
]

logger = get_logger(__name__)

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
RestartType = Literal["permanent", "transient", "temporary"]
Clock = Callable[[], float]
Scheduler = Callable[[float, Callable[[], None]], None]


class ActorCrashed(NousActorError):
    """The actor crashed while handling this call (a ``BaseException``); it is stopped."""


class RestartIntensityExceeded(NousActorError):
    """More than ``max_restarts`` restarts within ``max_seconds``: the supervisor gave up."""


@dataclass(frozen=True)
class Exit:
    """How an actor ended: ``reason`` is ``None`` for a normal stop, else what crashed it."""

    urn: str
    reason: BaseException | None
    # The actor's ``finished``, for a monitor that returns `HANDLED_LATER` to set.
    finished: Flag | None = field(default=None, compare=False, repr=False)
    # What the actor stands for to its monitor (its `_Supervised.exit_key`): one monitor
    # can then watch many actors (a registry's sessions), where each needed its own.
    key: str | None = field(default=None, compare=False)

    @property
    def normal(self) -> bool:
        return self.reason is None


HANDLED_LATER: Any = object()
"""What a monitor returns when it passed the exit on and will set the actor's
``finished`` itself once the exit is handled (so whoever waits for ``finished``
sees the supervisor's answer to it, and no thread ever blocks for that)."""

Monitor = Callable[[Exit], Any]


_CELLS_LOCK: Final = forks.lock()
"""Guards every cell's monitor and exit: each is taken once or twice in an actor's life,
so one lock serves them all rather than one per actor (an idle session's memory)."""


class Cell:
    """Ours, beside a supervised actor's Pykka ref: its ``started`` and ``finished``
    flags, and where its exit goes (Pykka's ref carries none of it).

    Made by the actor when it is created; whoever starts the actor gets it with
    `start_monitored` (or `cell_of`) and keeps it beside the ref (a supervisor's
    child record, the registry's entry). The monitor is given to the cell
    explicitly, by the ref ``start()`` returned: an exit that came first (the
    actor ended before ``start()`` returned) is kept and handed over then, and
    its ``finished`` is already set (no monitor could answer it earlier).
    """

    __slots__ = (
        "__weakref__",
        "_began",
        "_ended",
        "_exit",
        "_monitor",
        "_started",
        "finished",
        "urn",
    )

    def __init__(self, urn: str) -> None:
        self.urn = urn
        # ``started`` is made when first asked for (a supervisor asks; most actors'
        # starters never do): ``_began`` says whether it is set already.
        self._started: Flag | None = None
        self._began = False
        self.finished = Flag()
        """Set when the actor is done (after its last look at the inbox) and its exit
        is handled: the one signal that an actor has really stopped."""
        self._monitor: Monitor | None = None
        self._exit: Exit | None = None  # an exit no monitor has seen yet
        self._ended = False

    @property
    def started(self) -> Flag:
        """Set once ``on_start`` has returned (or failed): a supervisor starts its
        children one after the other, each done starting before the next."""
        flag = self._started
        if flag is None:
            with _CELLS_LOCK:
                flag = self._started
                if flag is None:
                    flag = self._started = Flag()
                    if self._began:
                        flag.set()
        return flag

    def began(self) -> None:
        """``on_start`` has returned (or failed): set `started`."""
        with _CELLS_LOCK:
            self._began = True
            flag = self._started
        if flag is not None:
            flag.set()

    def monitor(self, monitor: Monitor) -> None:
        """Report the actor's exit to ``monitor`` (at once if it has ended already)."""
        with _CELLS_LOCK:
            if self._monitor is not None:
                raise ValueError(f"actor {self.urn} has a monitor already (one per actor)")
            self._monitor = monitor
            exit, self._exit = self._exit, None
        if exit is not None:
            _deliver(monitor, exit)  # finished is set already: no answer to wait for

    def exited(self, exit: Exit) -> None:
        """The actor's last act: report ``exit``, then set ``finished`` (unless the
        monitor returned `HANDLED_LATER`: then it sets it)."""
        with _CELLS_LOCK:
            if self._ended:  # reported once
                return
            self._ended = True
            monitor = self._monitor
            if monitor is None:
                self._exit = exit
        later = False
        try:
            if monitor is not None:
                later = _deliver(monitor, exit) is HANDLED_LATER
        finally:
            if not later:
                self.finished.set()  # the very last thing: the exit has been reported

    def __repr__(self) -> str:
        flags = f"started={self._began} finished={self.finished.is_set()}"
        return f"<Cell {self.urn} {flags}>"


def _deliver(monitor: Monitor, exit: Exit) -> Any:
    try:
        return monitor(exit)
    except Exception as exc:  # a broken monitor must not hide the exit
        logger.error(
            "actor.monitor_failed",
            urn=exit.urn,
            reason=type(exc).__name__,
            error=short_repr(exc),
        )
        return None


# How whoever holds only an actor's ref (the ref ``start()`` returned) finds its cell,
# with nothing of ours set on Pykka's ref: a dispatched actor's inbox is ours and knows
# its actor, which holds the cell; any other actor's cell is kept here, by its ref
# (weakly: an entry goes with its ref).
_cells: weakref.WeakKeyDictionary[pykka.ActorRef[Any], Cell] = weakref.WeakKeyDictionary()


def cell_of(ref: pykka.ActorRef[Any]) -> Cell:
    """The `Cell` of a supervised actor's ref (its ``started``, ``finished`` and monitor).

    Raises:
        TypeError: ``ref`` is not the ref of a `SupervisedActor` (or of a
            `DispatchedSupervisedActor`).
    """
    cell: Cell | None = None
    if isinstance(ref, pykka.ActorRef):
        # (looked up on whatever stands for the inbox: a test may wrap it)
        actor = getattr(ref.actor_inbox, "_actor", None)
        cell = actor.cell if isinstance(actor, _Supervised) else _cells.get(ref)
    if cell is None:
        raise TypeError(
            f"{ref!r} is not the ref of a SupervisedActor: start a SupervisedActor "
            "(or a DispatchedSupervisedActor) subclass to have its exit reported"
        )
    return cell


def start_monitored(
    start: Callable[[], pykka.ActorRef[Any]], monitor: Monitor
) -> pykka.ActorRef[Any]:
    """Call ``start()``; the `SupervisedActor` whose ref it returns reports its exit to
    ``monitor`` (an exit before ``start()`` returned is reported at once).

    Raises:
        TypeError: ``start()`` returned no ref of a `SupervisedActor` (the actor is
            stopped: nothing would report its exit).
    """
    ref = start()
    try:
        cell = cell_of(ref)
    except TypeError:
        if isinstance(ref, pykka.ActorRef):
            ref.stop(block=False)
        raise
    cell.monitor(monitor)
    return ref


class _Supervised(pykka.Actor):
    """What a `Supervisor` needs of an actor, whatever runs it (a thread or a dispatcher).

    Its exit (a normal stop, or a crash: an exception in a tell or in
    ``on_start``, a ``BaseException`` anywhere) is reported to the monitor
    given to its `Cell` (by `start_monitored`). A ``BaseException`` stops only
    this actor.
    """

    cell_type: ClassVar[type[Cell]] = Cell
    """What the actor's cell is (a subclass may keep more of its own in it)."""

    exit_key: str | None = None
    """What the actor's `Exit` says it stands for (``Exit.key``): a subclass sets it
    (say, to a session's id) so that one monitor can tell its actors apart."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exit_reason: BaseException | None = None
        self.cell = self.cell_type(self.actor_urn)
        if type(self.actor_inbox) is not Inbox:  # (a dispatched one's inbox knows it)
            _cells[self.actor_ref] = self.cell
        self.finished = self.cell.finished

    def _actor_loop_setup(self) -> None:
        try:
            super()._actor_loop_setup()  # Pykka catches an Exception from on_start
        except BaseException as exc:  # ... but not a BaseException: a crash too
            self._crash(exc)
        finally:
            self.cell.began()

    def _handle_receive(self, message: Any) -> Any:
        try:
            return super()._handle_receive(message)
        except Exception:
            raise
        except BaseException as exc:  # contain it: stop only this actor
            self._crash(exc)
            # An ask gets this instead of an answer (Pykka would send None).
            raise ActorCrashed(
                f"{self} crashed with {type(exc).__name__} in an ask and stopped"
            ) from exc

    def _cleanup(self) -> None:
        """Hook run by the actor when it has stopped, however it stopped."""

    def _handle_failure(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        if self.exit_reason is None and exc_value is not None:
            self.exit_reason = exc_value
        super()._handle_failure(exc_type, exc_value, tb)

    def _crash(self, exc: BaseException) -> None:
        """Stop this actor now, as crashed by ``exc`` (call from the actor's own turn)."""
        if self.exit_reason is None:
            self.exit_reason = exc
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()

    def _report_exit(self) -> None:
        """Clean up, report the exit to the monitor, then set ``finished`` (runs once)."""
        try:
            self._cleanup()
        finally:
            self.cell.exited(Exit(self.actor_urn, self.exit_reason, self.finished, self.exit_key))


class SupervisedActor(_Supervised, pykka.ThreadingActor):
    """A Pykka actor a `Supervisor` can watch, on a thread of its own (its handlers
    may block).

    Its exit (a normal stop, or a crash: an exception in a tell or in
    ``on_start``, a ``BaseException`` anywhere) is reported to the monitor
    given to its `Cell` (by `start_monitored`). A ``BaseException`` stops only
    this actor. Its thread is a daemon thread: it never keeps the program from exiting
    (set ``use_daemon_thread = False`` on a subclass that must finish first).
    """

    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> Any:
        return scheduling.current().actor_inbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return scheduling.current().future()

    def _start_actor_loop(self) -> None:
        scheduling.current().start_actor(self, super()._start_actor_loop)

    def _actor_loop(self) -> None:
        try:
            super()._actor_loop()
        finally:
            self._report_exit()


class DispatchedSupervisedActor(_Supervised, DispatchedActor):
    """A `SupervisedActor` that runs on a shared `Dispatcher` instead of a thread of its
    own: its handlers must never block (see `nous_actor.runtime.dispatcher`)."""

    def _actor_ended(self) -> None:
        self._report_exit()


def _orphan_parents_actors() -> None:
    """(In a forked child.) The parent's actors of this library have no thread here (a
    dispatcher's, or their own): they leave Pykka's registry, so that the child's
    ``ActorRegistry.stop_all()`` or ``get_all()`` never waits on, nor lists, an actor
    of its parent; a dispatched one is stopped here too (a message to it fails with
    `pykka.ActorDeadError` at once: no thread here would ever run it). Pykka's own
    thread actors of the parent are Pykka's to deal with, and stay."""
    # A parent's thread may have held the registry's lock as it forked.
    pykka.ActorRegistry._actor_refs_lock = threading.RLock()
    for ref in pykka.ActorRegistry.get_all():
        actor_class = ref.actor_class
        if issubclass(actor_class, (DispatchedActor, _Supervised)):
            pykka.ActorRegistry.unregister(ref)
            if issubclass(actor_class, DispatchedActor):
                ref.actor_stopped.set()  # (a Flag: its lock was made afresh)


forks.after_fork(_orphan_parents_actors)
