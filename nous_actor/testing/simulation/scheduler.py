"""`Simulation`: the scheduler that hands a baton to one simulated thread at a time, on a
virtual clock, and the step each kind of task takes with it (an actor's turn, a threaded
actor's message, a commit, a caller's resumption, a callback of the loop, a function or a
timer)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import heapq
import inspect
import math
import os
import random
import sys
import threading
import time
import uuid
from _thread import allocate_lock
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pykka

from nous_actor import _log
from nous_actor.core import clock as core_clock
from nous_actor.core.args import check_count
from nous_actor.runtime import scheduling, telemetry
from nous_actor.runtime import unique as unique_ids
from nous_actor.runtime.dispatcher import DispatchedActor, _run_logged, receive_one
from nous_actor.store import committer as committer_module
from nous_actor.testing.simulation.aio import SimEventLoop, describe
from nous_actor.testing.simulation.faults import FailingStore, Faults, strike, targets_of
from nous_actor.testing.simulation.schedule import (
    DEFAULT_STEP_TIMEOUT,
    DEFAULT_WAIT,
    EPOCH,
    Fault,
    Schedule,
    SimulationError,
    SimulationStalled,
    _number_from,
)
from nous_actor.testing.simulation.tasks import (
    ACTOR,
    CALLER,
    COMMITTER,
    FUNCTION,
    LOOP,
    THREADED,
    TIMER,
    CommitQueue,
    SimCondition,
    SimDispatcher,
    SimFuture,
    SimInbox,
    Task,
    actor_label,
    finished,
    is_done,
    nothing,
    run_inline,
    value_of,
)

__all__ = ["Simulation"]

Caller = Callable[[], Any] | Generator[Any, Any, Any] | Coroutine[Any, Any, Any]


class Simulation:
    """A deterministic run of actors, threads, timers and coroutines, one simulated thread
    at a time (a context manager).

    Args:
        schedule: the seed, or pinned choices, and the faults (default: seed 0,
            no faults). A plain int is a seed.
        max_steps: a run that takes more steps fails with `SimulationError`.
        throughput: messages a dispatched actor handles per step.
        quiet: keep the runtime's log events in `logged` instead of printing them.
        restarts: the least restart intensity (restarts per window) supervisors and
            registries get (``0``: what they ask for).
        step_timeout: real seconds one step may hold the simulation (a turn, a
            commit, a caller's resumption, an executor function) before the run fails
            with `SimulationStalled` naming its task: such a step blocks on something
            the simulation does not run (a ``queue.Queue``, a real lock or event, I/O),
            which nothing could answer, since nothing else runs meanwhile. ``None``:
            wait for ever.

    Use it as ``with Simulation(seed) as sim:``; create the registry, sessions
    and stores inside, start callers with `go` (generators, or coroutines: those
    run on `loop`), then `run`. Leaving the block cancels the coroutines still
    running, stops every actor the simulation ran and puts the runtime back on
    real threads and time. Simulations do not nest, and other threads of the
    process must not use the runtime meanwhile: a wait on one raises
    `SimulationError`, and a send from one that wakes a task fails the run (it
    lands at a real time, which no seed replays).
    """

    def __init__(
        self,
        schedule: Schedule | int = 0,
        *,
        max_steps: int = 50_000,
        throughput: int = 1,
        quiet: bool = True,
        restarts: int = 1_000,
        step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        if isinstance(schedule, int) and not isinstance(schedule, bool):
            schedule = Schedule(seed=schedule)
        if not isinstance(schedule, Schedule):
            raise TypeError(f"a simulation runs a Schedule or an int seed, got {schedule!r}")
        if step_timeout is not None and (
            isinstance(step_timeout, bool)
            or not isinstance(step_timeout, int | float)
            or not 0 < step_timeout < math.inf
        ):
            raise ValueError(
                f"step_timeout is None or a finite number of seconds > 0, got {step_timeout!r}"
            )
        max_steps = check_count(max_steps, "max_steps", 1)
        restarts = check_count(restarts, "restarts")
        self.schedule = schedule
        self.step_timeout = step_timeout
        self.max_steps = max_steps
        self.throughput = throughput
        self.quiet = quiet
        self.restarts = restarts
        self.logged: list[tuple[str, str, dict[str, Any]]] = []
        """The runtime's log events of a quiet run: (level, event, context)."""
        self.rng = random.Random(schedule.seed)
        self._ids = random.Random(schedule.seed ^ 0x5EED)
        faults = schedule.faults
        if schedule.rates is not None:  # drawn from the seed, besides the explicit ones
            faults = (*faults, *schedule.rates.draw(random.Random(schedule.seed ^ 0xFA17)))
        self._faults = Faults(faults)
        self.now_seconds = 0.0
        self.steps = 0
        self.trace: list[str] = []
        self.decisions: list[int] = []
        self.commits = 0
        self.handoffs = 0
        """How often the baton passed from one real thread to another (what a step costs
        most: a step taken by the thread that chose it passes none)."""
        self._dispatcher = SimDispatcher(throughput, self._actor_ready)
        self._ready: list[Task] = []
        self._timers: list[tuple[float, int, Task, bool]] = []
        self._tasks: dict[int, Task] = {}  # id(obj) -> task, for actors and committers
        self._actors: list[Task] = []  # every actor task, in creation order
        self._callers: list[Task] = []
        self._coroutines: list[tuple[str, asyncio.Task[Any]]] = []  # started by go()
        self._loop: SimEventLoop | None = None
        self._stack: list[Task] = []  # tasks whose step is under way (maybe suspended)
        self._me: dict[int, _Thread] = {}  # real thread ident -> simulated thread
        self._main = _Thread("main", pooled=False)
        self._suspended: list[_Thread] = []  # threads waiting, in the order they began
        self._idle: list[_Thread] = []  # pooled threads with no step
        self._threads: list[tuple[_Thread, threading.Thread]] = []
        self._workers = 0
        self._halt: BaseException | None = None  # the run cannot go on (max_steps, a defect)
        self._unwinding = False
        self._striking = False  # a fault is being applied, inside the choice of a step
        self._callers_ok = True
        self._last = 0
        self._conditions = 0  # condition variables made (a subscriber's): switch points
        self.preemptive = True
        """Whether a session's turn may be switched away from right after it woke a
        subscriber (``False``: each turn is one step, as before)."""
        self._next_id = 0
        self._failure: BaseException | None = None
        self._open = False
        self._closed = False
        self._saved: list[Any] = []
        self._committers: list[tuple[Any, Any]] = []
        self._baton = self._main  # the simulated thread handed the baton last
        self._stalled: _Thread | None = None  # the thread of a step that never ended
        self._callback = ""  # the loop's callback run last (its task's name)

    # -- entering and leaving ------------------------------------------------------------------

    def __enter__(self) -> Simulation:
        if self._open or self._closed:
            raise SimulationError("a Simulation runs once; make a new one")
        # What the runtime sets up once per process, on its first registry or session, is
        # set up now, before ids come from the seed: the OpenTelemetry sink's import draws
        # uuid4s at import time, which would shift the seeded ids of the first run in a
        # process against every later one (a replay would not see the run it replays).
        telemetry.probe()
        scheduling.install(self)
        self._open = True
        main = self._main
        main.ident = threading.get_ident()
        self._me[main.ident] = main
        ids = self._ids
        self._saved = [
            uuid.uuid4,
            unique_ids._reseed(f"{ids.getrandbits(64):016x}"),
            core_clock.set_utcnow(self.utcnow),
            random.getstate(),
            _log._Logger._emit,
        ]
        if self.quiet:  # kept in `logged`, not printed (crashes are a simulation's point)
            logged = self.logged

            def keep(_self: Any, level: str, event: str, context: dict[str, Any]) -> None:
                logged.append((level, event, context))

            _log._Logger._emit = keep  # type: ignore[method-assign,assignment]
        uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
        random.seed(self.schedule.seed)  # Backoff's jitter draws from the module's generator
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the coroutines still running, stop every actor the simulation ran and
        put the runtime back on threads."""
        if not self._open:
            return
        try:
            try:
                if self._stalled is None:  # else nothing may run: a step still holds it
                    self._end_coroutines()
                    self._stop_actors()
            except Exception:
                if self._failure is None:
                    raise
            finally:
                self._unwind_threads()
        finally:
            self._open = False
            self._closed = True
            loop = self._loop
            if loop is not None:
                if self._stalled is not None:  # its stalled callback never returns
                    loop._thread_id = None
                loop.close()
            uuid4, unique, clock, state, emit = self._saved
            uuid.uuid4 = uuid4
            unique_ids._restore(unique)
            core_clock.set_utcnow(clock)
            random.setstate(state)
            _log._Logger._emit = emit  # type: ignore[method-assign]
            with committer_module._committers_lock:
                for store, c in self._committers:
                    if committer_module._committers.get(store) is c:
                        del committer_module._committers[store]
            scheduling.uninstall(self)

    def _end_coroutines(self) -> None:
        """Callers left unfinished stay so; the loop's tasks are cancelled and run to
        their end (as ``asyncio.run`` does), so that what they hold is let go."""
        for task in self._callers:
            if not task.ended:
                task.ended = True
                if task.queued:
                    self._unqueue(task)
        loop = self._loop
        if loop is None:
            return
        pending = loop.pending_tasks()
        if not pending:
            return
        for t in pending:
            t.cancel()
        self._run_quietly(callers=True)

    def _stop_actors(self) -> None:
        for task in self._actors:
            actor = task.obj
            if not actor.actor_stopped.is_set():
                try:
                    actor.actor_ref.stop(block=False)
                except pykka.ActorDeadError:
                    pass
        self._run_quietly(callers=False)

    def _run_quietly(self, callers: bool) -> None:
        """Run to the end whatever failed before (a closing run: its own limit)."""
        saved, self.max_steps = self.max_steps, self.steps + 100_000
        failure, self._failure = self._failure, None
        halt, self._halt = self._halt, None
        try:
            self.run(callers=callers)
        finally:
            self.max_steps = saved
            self._failure = failure
            if halt is not None:
                self._halt = halt

    # -- the Host protocol (what the runtime calls) ----------------------------------------

    def now(self) -> float:
        """The virtual clock, in seconds."""
        return self.now_seconds

    def utcnow(self) -> datetime:
        """The virtual clock as a time: `EPOCH` plus the virtual seconds."""
        return EPOCH + timedelta(seconds=self.now_seconds)

    def _task(self, kind: int, label: str, obj: Any) -> Task:
        self._next_id += 1
        return Task(kind, f"{label}#{self._next_id}", obj, self._next_id)

    def spawn(self, fn: Callable[[], None], name: str) -> None:
        task = self._task(FUNCTION, name, fn)
        self._make_ready(task)

    def call_later(
        self, delay: float, fn: Callable[[], None], name: str, daemon: bool = False
    ) -> None:
        task = self._task(TIMER, name, fn)
        task.daemon = daemon
        self._next_id += 1
        heapq.heappush(
            self._timers, (self.now_seconds + max(delay, 0.0), self._next_id, task, daemon)
        )

    def call_at(self, when: float, fn: Callable[[], None], name: str) -> None:
        self.call_later(when - self.now_seconds, fn, name)

    def service(
        self, run: Callable[[], None], name: str, every: float, tick: Callable[[], bool]
    ) -> Any:
        def again() -> None:
            if tick():
                self.call_later(every, again, name, daemon=True)

        self.call_later(every, again, name, daemon=True)
        return again

    def future(self) -> Any:
        return SimFuture(self)

    def restart_intensity(self, max_restarts: int, max_seconds: float) -> tuple[int, float]:
        """At least `restarts` restarts in the window: a simulation's faults come many
        per virtual second (its steps take no time), which no real window foresees."""
        return max(max_restarts, self.restarts), max_seconds

    def end_faults(self) -> None:
        """End the fault window: no fault fires from now on (call it before a scenario's
        own final checks)."""
        self._faults.end()

    @property
    def faults(self) -> deque[Fault]:
        """The faults of the schedule not yet due, in the order of their steps."""
        return self._faults.pending

    @property
    def injected(self) -> list[Fault]:
        """The faults injected so far, in order."""
        return self._faults.injected

    def condition(self) -> threading.Condition:
        self._conditions += 1
        return SimCondition(self.preempt)

    def dispatcher(self, own: Callable[[], Any]) -> Any:
        return self._dispatcher

    def actor_inbox(self) -> SimInbox:
        return SimInbox(self._make_ready)

    def foreign(self, what: str) -> SimulationError:
        """The error for using, inside this simulation, ``what``, made outside it (its
        actors run on real threads, which the simulation does not control)."""
        return SimulationError(
            f"{what} was made before this simulation began (its actors run on real "
            "threads, which the simulation does not control): make and start it inside "
            "the simulation"
        )

    def start_actor(self, actor: Any, start: Callable[[], None]) -> None:
        """Run a thread-per-actor actor as a task: its inbox, made by this host through
        Pykka's ``_create_actor_inbox``, is bound to the task (nothing is set on the
        actor or its ref).

        Raises:
            SimulationError: the actor was made before the simulation began (its inbox
                is a real queue): make and start it inside the simulation.
        """
        inbox = actor.actor_inbox
        if not isinstance(inbox, SimInbox):
            raise SimulationError(
                f"{actor_label(actor)} was made before this simulation began (its inbox "
                "is a thread's queue): make and start it inside the simulation"
            )
        task = self._task(THREADED, actor_label(actor), actor)
        self._actors.append(task)
        self._tasks[id(actor)] = task
        inbox.bind(task)
        self._make_ready(task)

    def submit(
        self, put: Callable[[Callable[[], None]], None], fn: Callable[[], None], name: str
    ) -> None:
        self.spawn(partial(_run_logged, fn), name)

    def committer_queue(self, committer: Any) -> Any:
        task = self._task(COMMITTER, "committer", committer)
        store = committer._store()
        self._committers.append((store, committer))
        queue = CommitQueue(task, self._make_ready)
        task.send = queue
        return queue

    def _actor_ready(self, actor: DispatchedActor) -> None:
        task = self._tasks.get(id(actor))
        if task is None or task.obj is not actor:
            task = self._task(ACTOR, actor_label(actor), actor)
            self._tasks[id(actor)] = task
            self._actors.append(task)
        if self._closed:  # the simulation ended: answer what lands, here
            run_inline(task)
            return
        self._make_ready(task)

    def _make_ready(self, task: Task) -> None:
        if self._closed and task.kind == THREADED:  # ended: answer what lands, here
            while not task.ended and not task.obj.actor_inbox.empty():
                self._threaded_step(task)
            return
        if threading.get_ident() not in self._me and self._open and not self._closed:
            self._foreign(task)
        if not task.queued and not task.ended:
            task.queued = True
            self._ready.append(task)

    def _foreign(self, task: Task) -> None:
        """A thread the simulation does not run woke ``task`` (a send to a session, a
        registry or the committer): its sends land at real times, between any two
        steps, so the run is no longer the schedule's. The run fails (once)."""
        if self._failure is not None or self._unwinding:
            return
        name = threading.current_thread().name
        self.trace.append(f"{self.steps} foreign thread woke {task.label}")
        self._failure = SimulationError(
            f"thread {name!r}, which the simulation does not run, sent to {task.label} "
            "while the simulation ran: what it sends lands at real times, between any two "
            "steps, so a seed would not replay this run. Start that work with sim.go() (a "
            "caller) instead of a thread of your own, or make and use the runtime's objects "
            "outside the simulation"
        )

    # -- waiting: a simulated thread suspends; the scheduler hands the baton on ---------------

    def wait(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        block: Callable[[float | None], bool] | None = None,
    ) -> bool:
        """Suspend the calling simulated thread until ``done()``, or until ``timeout``
        virtual seconds passed (``False``); other threads run meanwhile, one at a time.
        The test's own thread also gets ``False`` once nothing else can run."""
        if block is None:
            block = _ask(done)
        if done() or self._closed or self._unwinding:
            return block(0)
        me = self._me.get(threading.get_ident())
        if me is None:
            raise SimulationError(
                "a wait on a thread the simulation does not run (other threads of the "
                "process must not use the runtime while a simulation runs)"
            )
        if me.abandoned:  # its step outlived its bound: the run failed without it
            raise _Unwound
        me.done = done
        me.deadline = float("inf") if timeout is None else self.now_seconds + max(timeout, 0.0)
        self._suspended.append(me)
        self._hand_on(me)
        me.done = None
        if me.unwind:
            raise _Unwound
        if me is self._main and self._halt is not None:
            raise self._halt
        return block(0)

    def preempt(self) -> None:
        """A switch point (a subscriber was just woken): the schedule may run any other
        thread before this one goes on, as real threads may. Only a session's turn
        that holds none of its locks switches here (and never the test's own thread)."""
        if not self._open or self._closed or self._unwinding or not self.preemptive:
            return
        if self._striking:  # the scheduler itself crashes an actor: no switch inside it
            return
        me = self._me.get(threading.get_ident())
        if me is None or me is self._main or me.task is None or me.task.kind != ACTOR:
            return
        if me.own is not None or me.abandoned:  # a turn lent a caller's thread (made when
            return  # none could switch), or a step that outlived its bound
        actor = me.task.obj
        # The lock the committer's thread shares with the actor (its commit ledger's): a
        # switch while it is held could hand the baton to a thread that blocks on it.
        lock = getattr(getattr(actor, "ledger", None), "lock", None)
        if lock is None:
            lock = getattr(actor, "_done_lock", None)
        if lock is not None and lock.locked():
            return
        me.done = _always
        me.deadline = float("inf")
        self._suspended.append(me)
        self._hand_on(me)
        me.done = None
        if me.unwind:
            raise _Unwound

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, running other tasks meanwhile (for a
        summariser or a callback that stands for slow work).

        Raises:
            TypeError, ValueError: ``seconds`` is not a finite number >= 0.
        """
        seconds = _number_from("sleep(seconds)", seconds, 0.0)
        until = self.now_seconds + seconds
        self.call_later(seconds, nothing, "sleep")
        self.wait(lambda: self.now_seconds >= until, None)

    # -- callers -------------------------------------------------------------------------------

    @property
    def loop(self) -> SimEventLoop:
        """The simulation's asyncio event loop (made at first use): coroutines given to
        `go` run on it, one callback a step, on the virtual clock."""
        loop = self._loop
        if loop is None:
            if self._closed:
                raise SimulationError("the simulation has ended: its loop is closed")
            loop = self._loop = SimEventLoop(self)
            task = self._task(LOOP, "loop", loop)
            task.queued = True  # on the run list for good: runnable when a callback is
            self._ready.append(task)
        return loop

    def go(self, caller: Caller, name: str = "caller") -> asyncio.Task[Any] | None:
        """Start a caller.

        * A generator (or a function returning one; a plain function runs in one
          step) is resumed until each ``yield``: ``yield future`` waits for the
          future, ``yield seconds`` sleeps on the virtual clock, a bare ``yield``
          lets others run.
        * A coroutine (or a coroutine function) becomes a task of `loop`, which is
          returned: it awaits as asyncio code does (``await`` a session's future,
          ``await sessions.aopen(...)``, ``async for`` over a subscription,
          ``asyncio.sleep``, ``asyncio.wait_for``), on the virtual clock.

        What a caller raises fails the run.

        Raises:
            TypeError: ``caller`` is none of those, or ``name`` is not a str.
            SimulationError: the simulation has ended.
        """
        if self._closed:
            raise SimulationError("the simulation has ended; start callers in a new one")
        if not isinstance(name, str):
            raise TypeError(f"go(name=) is a str, got {type(name).__name__}")
        if not (callable(caller) or inspect.iscoroutine(caller) or isinstance(caller, Generator)):
            raise TypeError(
                "go() takes a generator, a coroutine, or a function returning one (or "
                f"running in one step), got {type(caller).__name__}"
            )
        if inspect.iscoroutinefunction(caller):
            caller = caller()
        if inspect.iscoroutine(caller):
            self._next_id += 1
            label = f"{name}#{self._next_id}"
            atask = self.loop.create_task(caller, name=label)
            atask.add_done_callback(partial(self._coroutine_done, label))
            self._coroutines.append((label, atask))
            return atask
        task = self._task(CALLER, name, caller)
        if isinstance(caller, Generator):
            task.gen = caller
        self._callers.append(task)
        self._make_ready(task)
        return None

    def _coroutine_done(self, label: str, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self.trace.append(f"{self.steps} {label} cancelled")
            return
        exc = task.exception()
        if exc is not None:
            self.trace.append(f"{self.steps} {label} failed {type(exc).__name__}")
            if self._failure is None:
                self._failure = exc

    # -- running -------------------------------------------------------------------------------

    def run(self, *, callers: bool = True, until: float | None = None) -> None:
        """Run until nothing is left to do (timers that re-arm themselves forever, as the
        passivator's, alone do not keep it going), or the virtual clock reaches ``until``.

        Raises:
            SimulationError: more than ``max_steps`` steps.
            Exception: whatever a caller raised (the run's failure).
        """
        if self._closed:
            raise SimulationError("the simulation has ended; make a new one")
        main = self._main
        if not self._open:
            raise SimulationError(
                "the simulation was not entered: run it inside `with Simulation(...) as sim:`"
            )
        if threading.get_ident() != main.ident:
            raise SimulationError("run() is called by the thread that entered the simulation")
        saved = self._callers_ok
        self._callers_ok = callers
        main.in_run = True
        main.done = _never
        main.deadline = float("inf") if until is None else until
        self._suspended.append(main)
        try:
            self._hand_on(main)
        finally:
            main.in_run = False
            main.done = None
            self._callers_ok = saved
        if self._halt is not None:
            raise self._halt
        if until is not None and self.now_seconds < until:
            self.now_seconds = until
        if self._failure is not None:
            raise self._failure
        if until is None and callers:
            stuck = [t.label for t in self._callers if not t.ended]
            stuck += [label for label, t in self._coroutines if not t.done()]
            if stuck:
                raise SimulationError(f"callers {stuck} never finished (nothing left to run)")

    def choose(self, n: int) -> int:
        """One decision of the schedule among ``n`` options (recorded in `decisions`)."""
        if n <= 1:
            return 0
        pinned = self.schedule.choices
        i = len(self.decisions)
        c = self._draw(n) if pinned is None else (pinned[i] % n if i < len(pinned) else 0)
        self.decisions.append(c)
        return c

    def _draw(self, n: int) -> int:
        """A seeded decision: uniform, or (``bias``) the previous option kept with the
        schedule's bias, else uniform among the others (long runs of one thread)."""
        rng = self.rng
        bias = self.schedule.bias
        if bias and self._last < n and rng.random() < bias:
            return self._last
        c = rng.randrange(n)
        self._last = c
        return c

    def _runnable(self, task: Task) -> bool:
        if task.running:
            return False
        th = task.thread
        if th is not None and th.task is not None:  # its thread is lent (a step waits)
            return False
        kind = task.kind
        if kind == CALLER:
            if not self._callers_ok:
                return False
            w = task.waiting
            if w is not None and is_done(w):
                return True
            return task.until <= self.now_seconds  # slept enough, or waited its bound
        if kind == COMMITTER:
            return task.until <= self.now_seconds
        if kind == LOOP:
            return self._callers_ok and task.obj.runnable()
        return True

    def _wakes(self, th: _Thread) -> bool:
        """Whether a suspended thread may go on: what it waits for is done, or its bound
        passed (the test's thread in `run`: only at ``until``)."""
        task = th.task
        if task is not None and not self._callers_ok and task.kind in (CALLER, LOOP):
            return False
        if th.deadline <= self.now_seconds:
            return True
        done = th.done
        return done is not None and done()

    def _hand_on(self, me: _Thread) -> None:
        """``me`` gives up the baton: choose what runs next and hand it over; return when
        ``me`` is chosen again (with a step to take, or its wait over)."""
        runner = self._pick(me)
        if runner is me:
            return
        self.handoffs += 1
        runner.lock.release()
        if me is self._main and self.step_timeout is not None:
            self._await_baton(me, self.step_timeout)
        else:
            me.lock.acquire()

    def _await_baton(self, main: _Thread, limit: float) -> None:
        """The test's thread waits for the baton, watching the steps: one that holds it
        for ``limit`` real seconds fails the run (`_stall`), and the test's thread goes
        on without it."""
        poll = limit / 8
        seen = self.steps
        since = time.monotonic()
        while not main.lock.acquire(True, poll):
            now = time.monotonic()
            if self.steps != seen or self._baton is main:
                seen, since = self.steps, now
            elif now - since >= limit:
                self._stall(limit)
                return

    def _stall(self, limit: float) -> None:
        """The step of the thread holding the baton has not ended in ``limit`` real
        seconds: it is abandoned (if it ever ends, it ends alone), nothing runs any more,
        and the run fails with `SimulationStalled`."""
        th = self._baton
        th.abandoned = True
        self._stalled = th
        task = th.task
        label = th.label if task is None else task.label
        if task is not None and task.kind == LOOP:  # a callback blocks the loop: whose
            label = f"{label} running {self._callback}"
        self.trace.append(f"{self.steps} STALLED {label}")
        where = _blocked_in(th.ident)
        self._halt = SimulationStalled(
            f"{label} held the simulation for {limit:g} s of real time without handing it "
            f"on (step {self.steps}{where}): it waits on something the simulation does not "
            "run (a queue.Queue, a real lock or threading.Event, I/O, a busy loop), and "
            "nothing else runs meanwhile, so nothing in the run can answer it. Wait on what "
            "the simulation runs instead (await an asyncio future, queue or event; a "
            "session's future; yield from a generator caller); in a run_in_executor "
            "function, hand what it waits for over before it starts, or keep the waiting "
            "in the coroutine. A step that is only slow needs a larger "
            "Simulation(step_timeout=...)",
            label,
        )
        self._wake_main()

    def _pick(self, me: _Thread) -> _Thread:
        """The thread to run next, with its step assigned (the test's thread once nothing
        else can run, the run failed or halted)."""
        main = self._main
        while True:
            if self._halt is not None or (self._failure is not None and main.in_run):
                return self._wake_main()
            self._fire_timers()
            cands: list[Task | _Thread] = [t for t in self._ready if self._runnable(t)]
            cands += [th for th in self._suspended if self._wakes(th)]
            if cands:
                break
            nxt = self._next_wake()
            if nxt is None:
                return self._wake_main()
            self.now_seconds = nxt
        if self.steps >= self.max_steps:
            self._halt = SimulationError(
                f"no end after {self.max_steps} steps (a livelock, or raise max_steps)"
            )
            return self._wake_main()
        self._faults.inject(self.steps, self._strike)
        chosen = cands[self.choose(len(cands))]
        self.steps += 1
        if isinstance(chosen, _Thread):
            self._suspended.remove(chosen)
            if chosen is not main:
                self.trace.append(f"{self.steps} {chosen.label} goes on")
            self._baton = chosen
            return chosen
        runner = self._runner_for(chosen, me)
        runner.task = chosen
        chosen.running = True
        self._stack.append(chosen)
        self._baton = runner
        return runner

    def _wake_main(self) -> _Thread:
        main = self._main
        if main in self._suspended:
            self._suspended.remove(main)
        self._baton = main
        return main

    def _runner_for(self, task: Task, me: _Thread) -> _Thread:
        """The thread that takes ``task``'s step: its own (a caller, a thread-per-actor
        actor), else ``me`` if it is between steps and may take it (a pooled thread takes
        any; a caller's or an actor's thread only a step that cannot block: a hand-off
        between real threads is what a step costs most), else a pooled thread."""
        if task.kind in _DEDICATED:
            th: _Thread | None = task.thread
            if th is None:
                th = task.thread = self._new_thread(f"nous-sim-{task.label}", own=task)
            return th
        free = me.task is None and not me.finished and me is not self._main
        if free and (me.pooled or self._cannot_block(task)):
            return me
        if self._idle:
            return self._idle.pop()
        self._workers += 1
        return self._new_thread(f"nous-sim-worker-{self._workers}")

    def _cannot_block(self, task: Task) -> bool:
        """Whether ``task``'s step never waits nor reaches a switch point: a commit (it
        writes and answers), or a dispatched actor's turn (its handlers never block) while
        no condition variable exists whose notice could be a switch point. Such a step
        may run on the thread of a caller or an actor between its own steps: that task
        cannot run before the step ends, as it could not if the step took no time."""
        kind = task.kind
        return kind == COMMITTER or (
            kind == ACTOR and (self._conditions == 0 or not self.preemptive)
        )

    def _new_thread(self, name: str, own: Task | None = None) -> _Thread:
        th = _Thread(name, pooled=own is None)
        th.own = own
        real = threading.Thread(target=self._serve, args=(th,), name=name, daemon=True)
        self._threads.append((th, real))
        real.start()
        return th

    def _serve(self, th: _Thread) -> None:
        """A simulated thread: take each step it is handed, one at a time, with the baton."""
        th.ident = threading.get_ident()
        self._me[th.ident] = th
        th.lock.acquire()
        while not th.unwind:
            task = th.task
            assert task is not None
            own = task is th.own  # (else a pooled step, or one lent this thread)
            try:
                if own:
                    self._take(task)
                else:
                    contextvars.Context().run(self._take, task)
            except _Unwound:
                pass
            except BaseException as exc:  # the simulation's own defect: fail the run
                if self._halt is None and not self._unwinding:
                    self._halt = exc
            finally:
                task.running = False
                if task in self._stack:
                    self._stack.remove(task)
                th.task = None
            if th.abandoned:  # its step outlived its bound: the run went on without it
                return
            if th.unwind:
                break
            if own and task.ended:  # its task is over: so is this thread
                th.finished = True
                runner = self._pick(th)
                self.handoffs += 1
                runner.lock.release()
                return
            if th.pooled:
                self._idle.append(th)
            runner = self._pick(th)
            if runner is th:
                if th.pooled:
                    self._idle.remove(th)
                continue
            self.handoffs += 1
            runner.lock.release()
            th.lock.acquire()
        th.finished = True
        self._main.lock.release()

    def _unwind_threads(self) -> None:
        """Wake every simulated thread still parked and let it end (a wait raises in it)."""
        self._unwinding = True
        main = self._main
        for th, real in self._threads:
            if th.finished or th.abandoned:  # (an abandoned one never gives the baton back)
                continue
            th.unwind = True
            th.lock.release()
            main.lock.acquire()
            real.join(5.0)

    def _next_wake(self) -> float | None:
        """The next virtual time at which something becomes runnable; ``None`` if nothing
        but timers that re-arm themselves forever would ever run."""
        keep: list[float] = [when for when, _, _, daemon in self._timers if not daemon]
        for t in self._ready:
            timed = t.kind == COMMITTER or (t.kind == CALLER and self._callers_ok)
            if timed and t.until > self.now_seconds and not t.running:
                keep.append(t.until)
        for th in self._suspended:
            task = th.task
            if task is not None and not self._callers_ok and task.kind in (CALLER, LOOP):
                continue
            if self.now_seconds < th.deadline != float("inf"):
                keep.append(th.deadline)
        if self._callers_ok and self._loop is not None:
            when = self._loop.next_timer()
            if when is not None:
                keep.append(when)
        if not keep:
            return None
        nxt = min(keep)
        if self._timers:  # a daemon timer due first fires on time
            nxt = min(nxt, self._timers[0][0])
        return max(nxt, self.now_seconds)

    def _fire_timers(self) -> None:
        timers = self._timers
        while timers and timers[0][0] <= self.now_seconds:
            _, _, task, _ = heapq.heappop(timers)
            self._make_ready(task)

    def _strike(self, fault: Fault) -> bool:
        """Crash or stop the target of an armed fault; ``False`` if no actor can take it
        now."""
        self._actors = [t for t in self._actors if not finished(t)]
        targets = targets_of(fault, self._actors, self._stack)
        if not targets:
            return False
        task = targets[fault.target % len(targets)]
        self.trace.append(f"{self.steps} FAULT {fault.kind} {task.label}")
        self._striking = True
        try:
            ready = strike(fault, task, self.steps)
        finally:
            self._striking = False
        if ready:
            self._make_ready(task)
        return True

    # -- the steps: one of each kind of task ---------------------------------------------------

    def _take(self, task: Task) -> None:
        kind = task.kind
        if kind == ACTOR:
            self._turn(task)
        elif kind == THREADED:
            self._threaded_step(task)
        elif kind == COMMITTER:
            self._commit_step(task)
        elif kind == CALLER:
            self._caller_step(task)
        elif kind == LOOP:
            self._loop_step(task)
        else:  # a function or a timer: runs once
            self._run_once(task)

    def _unqueue(self, task: Task) -> None:
        """Take ``task`` off the run list (it has nothing to do until made ready again), if
        it is on it: a caller whose step was suspended in a wait when the simulation's
        close ended the callers (and took it off) ends that step later."""
        if task.queued:
            self._ready.remove(task)
            task.queued = False

    def _run_once(self, task: Task) -> None:
        """A function (a thread of the runtime) or a timer: runs whole, once."""
        self._unqueue(task)
        task.ended = True
        self.trace.append(f"{self.steps} {task.label}")
        task.obj()

    def _turn(self, task: Task) -> None:
        """A dispatched actor: one turn of at most 1 to 4 times ``throughput`` messages,
        as the schedule chooses when more wait (a real turn takes up to 64 in a row: the
        appends queued together run as one, `SessionActor._receive_run`)."""
        self._unqueue(task)
        actor = task.obj
        inbox = actor.actor_inbox
        waiting = inbox.qsize()
        self.trace.append(f"{self.steps} {task.label} {waiting}")
        quota = self.throughput * (1 + self.choose(min(waiting, 4)))
        try:
            actor._turn(quota)
        except BaseException as exc:  # a turn never takes the simulation down (as a thread)
            self.trace.append(f"{self.steps} {task.label} turn_failed {type(exc).__name__}")
        inbox.give()
        if not inbox.empty() and inbox.take():
            self._make_ready(task)

    def _threaded_step(self, task: Task) -> None:
        """A thread-per-actor actor: its setup, one message, or its teardown."""
        actor = task.obj
        inbox = actor.actor_inbox
        self.trace.append(f"{self.steps} {task.label} {inbox.qsize()}")
        if not task.began:
            task.began = True
            actor._actor_loop_setup()
        elif not actor.actor_stopped.is_set() and not inbox.empty():
            receive_one(actor, inbox.get())
        if actor.actor_stopped.is_set() and not task.ended:
            task.ended = True
            try:
                actor._actor_loop_teardown()
            finally:
                report = getattr(actor, "_report_exit", None)
                if report is not None:
                    report()
        idle = task.ended or (inbox.empty() and not actor.actor_stopped.is_set())
        if idle and task.queued:
            self._unqueue(task)

    def _commit_step(self, task: Task) -> None:
        """A store's committer: one batch (its size a choice of the schedule), or a stall."""
        queue: CommitQueue = task.send
        items = queue.items
        committer = task.obj
        if not items:
            self._unqueue(task)
            return
        faults = self._faults
        slow = faults.take("slow_commit")
        if slow is not None:
            task.until = self.now_seconds + slow.seconds
            self.trace.append(f"{self.steps} {task.label} slow {slow.seconds:g}")
            return
        n = 1 + self.choose(min(len(items), 4))  # how much of the queue this batch takes
        if n == min(len(items), 4):
            n = len(items)
        batch = [items.popleft() for _ in range(n)]
        fail = faults.take("fail_commit") or faults.take("doubt_commit")
        self.commits += 1
        described = ",".join(
            f"{item.session_id}:{'/'.join(str(ev.seq) for ev in item.events)}" for item in batch
        )
        tag = "" if fail is None else ("FAIL " if fail.kind == "fail_commit" else "DOUBT ")
        self.trace.append(f"{self.steps} {task.label} {tag}{len(batch)} {described}")
        if fail is not None:
            real = committer._store
            written = fail.kind == "doubt_commit"
            committer._store = lambda: FailingStore(real(), written)
            try:
                committer._write(batch)
            finally:
                committer._store = real
        else:
            committer._write(batch)
        if not items:
            self._unqueue(task)

    def _caller_step(self, task: Task) -> None:
        """A generator caller: resumed until its next ``yield``."""
        self.trace.append(f"{self.steps} {task.label}")
        waited, task.waiting = task.waiting, None
        task.until = 0.0  # a bare ``yield`` next: runnable at once (not at an old bound)
        gen = task.gen
        try:
            if gen is None:
                out = task.obj()
                if isinstance(out, Generator):
                    task.gen = gen = out
                else:
                    raise StopIteration
            # The value goes to the generator (``x = yield fut``), unless it delegates to a
            # plain iterator (``yield from [f1, f2]``), which takes none.
            sub = getattr(gen, "gi_yieldfrom", None)
            yielded = gen.send(value_of(waited) if sub is None or hasattr(sub, "send") else None)
            while (wrong := _wrong_yield(yielded, task.label)) is not None:
                yielded = gen.throw(wrong)  # raised at the caller's yield
        except StopIteration:
            task.ended = True
            self._unqueue(task)
            return
        except BaseException as exc:
            ended, task.ended = task.ended, True
            self._unqueue(task)
            if self._unwinding or ended:  # (ended: the simulation's close ended the callers
                return  # while this step waited; what it raises then is not the run's)
            self.trace.append(f"{self.steps} {task.label} failed {type(exc).__name__}")
            if self._failure is None:
                self._failure = exc
            return
        if yielded is None:
            return
        if isinstance(yielded, int | float):  # (checked: >= 0, not a bool)
            task.until = self.now_seconds + float(yielded)
            return
        # Wait for the future, at most its bound: then the caller goes on (its get()
        # raises the timeout).
        task.waiting = yielded
        bound = getattr(yielded, "_timeout", None)
        task.until = self.now_seconds + (DEFAULT_WAIT if bound is None else bound)

    def _loop_step(self, task: Task) -> None:
        """The event loop: one ready callback."""
        loop: SimEventLoop = task.obj
        handle = loop.next_handle()
        self._callback = what = describe(handle)
        self.trace.append(f"{self.steps} {task.label} {what}")
        for exc in loop.run_handle(handle):
            self.trace.append(f"{self.steps} loop error {type(exc).__name__}")

    # -- results -------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        """Add a line to the trace (a caller's observation, part of the digest)."""
        self.trace.append(f"{self.steps} note {text}")

    def digest(self) -> str:
        """A hash of the trace: equal digests, equal runs."""
        h = hashlib.sha256()
        for line in self.trace:
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()

    def replay_schedule(self) -> Schedule:
        """This run as a pinned schedule (its decisions and the faults it injected)."""
        return Schedule(self.schedule.seed, tuple(self.decisions), self._faults.planned)


_DEDICATED = frozenset((CALLER, THREADED))
"""Kinds of task that are one thread each, for the thread's identity (a caller's turn
blocks, a registry's own thread); the others take their steps on pooled threads, or on
the thread that chose them."""


class _Unwound(BaseException):
    """Raised in a simulated thread still waiting when its simulation closes."""


class _Thread:
    """A simulated thread: a real thread that runs only while it holds the baton."""

    __slots__ = (
        "abandoned",
        "deadline",
        "done",
        "finished",
        "ident",
        "in_run",
        "label",
        "lock",
        "own",
        "pooled",
        "task",
        "unwind",
    )

    def __init__(self, label: str, pooled: bool) -> None:
        self.label = label
        self.pooled = pooled
        self.own: Task | None = None  # the task it is the thread of (None: pooled, main)
        self.lock = allocate_lock()
        self.lock.acquire()  # released to hand it the baton
        self.task: Task | None = None  # the step it takes (or is suspended in)
        self.done: Callable[[], bool] | None = None  # what it waits for
        self.deadline = float("inf")
        self.ident = 0
        self.in_run = False
        self.unwind = False
        self.finished = False
        self.abandoned = False  # its step outlived the simulation's step_timeout

    def __repr__(self) -> str:
        return f"<simulated thread {self.label}>"


def _always() -> bool:
    return True


def _wrong_yield(yielded: Any, label: str) -> Exception | None:
    """The error for what a generator caller yielded, if it is not ``None``, a number of
    virtual seconds >= 0 or a future (something with ``done()``, or a Pykka future)."""
    if yielded is None:
        return None
    if isinstance(yielded, int | float) and not isinstance(yielded, bool):
        if yielded >= 0:  # (inf: for ever; nan fails the comparison)
            return None
        return ValueError(
            f"caller {label} yielded {yielded!r}: a caller sleeps a number of virtual seconds "
            ">= 0 (yield 1.5), or yields a future or nothing"
        )
    if isinstance(yielded, pykka.Future) or callable(getattr(yielded, "done", None)):
        return None
    return TypeError(
        f"caller {label} yielded {yielded!r}: a caller yields a future to wait for it "
        "(x = yield chat.append(...)), a number of virtual seconds to sleep (yield 0.5), "
        "or nothing to let the others run (yield)"
    )


def _blocked_in(ident: int) -> str:
    """Where the real thread ``ident`` is (its innermost frames), for a stalled step."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return ""
    frames: list[str] = []
    while frame is not None and len(frames) < 4:
        code = frame.f_code
        frames.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return "; blocked in " + " < ".join(frames)


def _never() -> bool:
    return False


def _ask(done: Callable[[], bool]) -> Callable[[float | None], bool]:
    return lambda _timeout: done()
