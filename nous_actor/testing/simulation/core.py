"""`Simulation`: the scheduler that steps every task on this thread, on a virtual clock."""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import inspect
import random
import uuid
from asyncio import events
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pykka

from nous_actor.core import clock as core_clock
from nous_actor.runtime import scheduling
from nous_actor.runtime.dispatcher import DispatchedActor
from nous_actor.store import committer as committer_module
from nous_actor.testing.simulation import steps
from nous_actor.testing.simulation.aio import SimEventLoop, describe
from nous_actor.testing.simulation.faults import inject_faults
from nous_actor.testing.simulation.schedule import (
    EPOCH,
    Fault,
    Schedule,
    SimulationError,
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
    SimDispatcher,
    SimFuture,
    SimInbox,
    Task,
    actor_label,
    drain_queue,
    is_done,
    nothing,
)

__all__ = ["Simulation"]

Caller = Callable[[], Any] | Generator[Any, Any, Any] | Coroutine[Any, Any, Any]


class Simulation:
    """A deterministic run of actors, threads, timers and coroutines on this thread (a
    context manager).

    Args:
        schedule: the seed, or pinned choices, and the faults (default: seed 0,
            no faults). A plain int is a seed.
        max_steps: a run that takes more steps fails with `SimulationError`.
        throughput: messages a dispatched actor handles per step.

    Use it as ``with Simulation(seed) as sim:``; create the registry, sessions
    and stores inside, start callers with `go` (generators, or coroutines: those
    run on `loop`), then `run`. Leaving the block cancels the coroutines still
    running, stops every actor the simulation ran and puts the runtime back on
    real threads and time. Simulations do not nest, and other threads of the
    process must not use the runtime meanwhile (they would run on it too).
    """

    def __init__(
        self,
        schedule: Schedule | int = 0,
        *,
        max_steps: int = 50_000,
        throughput: int = 1,
    ) -> None:
        if isinstance(schedule, int):
            schedule = Schedule(seed=schedule)
        self.schedule = schedule
        self.max_steps = max_steps
        self.throughput = throughput
        self.rng = random.Random(schedule.seed)
        self._ids = random.Random(schedule.seed ^ 0x5EED)
        faults = schedule.faults
        if not faults and schedule.rates is not None:
            faults = schedule.rates.draw(random.Random(schedule.seed ^ 0xFA17))
        self._planned = tuple(faults)
        self.faults: deque[Fault] = deque(sorted(faults, key=lambda f: f.step))
        self._armed: list[Fault] = []
        self.now_seconds = 0.0
        self.steps = 0
        self.trace: list[str] = []
        self.decisions: list[int] = []
        self.injected: list[Fault] = []
        self.commits = 0
        self.dispatcher = SimDispatcher(self)
        self._ready: list[Task] = []
        self._timers: list[tuple[float, int, Task, bool]] = []
        self._tasks: dict[int, Task] = {}  # id(obj) -> task, for actors and committers
        self._actors: list[Task] = []  # every actor task, in creation order
        self._callers: list[Task] = []
        self._coroutines: list[tuple[str, asyncio.Task[Any]]] = []  # started by go()
        self._loop: SimEventLoop | None = None
        self._loop_depth = 0  # > 0 while a callback of the loop runs
        self._stack: list[Task] = []
        self._next_id = 0
        self._failure: BaseException | None = None
        self._open = False
        self._closed = False
        self._saved: list[Any] = []
        self._committers: list[tuple[Any, Any]] = []

    # -- entering and leaving ------------------------------------------------------------------

    def __enter__(self) -> Simulation:
        if self._open or self._closed:
            raise SimulationError("a Simulation runs once; make a new one")
        scheduling.install(self)
        self._open = True
        ids = self._ids
        self._saved = [
            uuid.uuid4,
            core_clock.set_utcnow(self.utcnow),
            random.getstate(),
        ]
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
                self._end_coroutines()
                self._stop_actors()
            except Exception:
                if self._failure is None:
                    raise
        finally:
            self._open = False
            self._closed = True
            if self._loop is not None:
                self._loop.close()
            uuid4, clock, state = self._saved
            uuid.uuid4 = uuid4
            core_clock.set_utcnow(clock)
            random.setstate(state)
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
                    steps.unqueue(self, task)
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
        try:
            self.run(callers=callers)
        finally:
            self.max_steps = saved
            self._failure = failure

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

    def future(self) -> Any:
        return SimFuture(self)

    def adopt(self, actor: Any) -> None:
        task = self._task(THREADED, actor_label(actor), actor)
        inbox = SimInbox(self, task, drain_queue(actor.actor_inbox))
        actor.actor_inbox = inbox
        actor.actor_ref.actor_inbox = inbox
        self._actors.append(task)
        self._tasks[id(actor)] = task
        self._make_ready(task)

    def committer_queue(self, committer: Any) -> Any:
        task = self._task(COMMITTER, "committer", committer)
        store = committer._store()
        self._committers.append((store, committer))
        queue = CommitQueue(self, task)
        task.send = queue
        return queue

    def _actor_ready(self, actor: DispatchedActor) -> None:
        task = self._tasks.get(id(actor))
        if task is None or task.obj is not actor:
            task = self._task(ACTOR, actor_label(actor), actor)
            self._tasks[id(actor)] = task
            self._actors.append(task)
        if self._closed:  # the simulation ended: answer what lands, here
            steps.run_inline(task)
            return
        self._make_ready(task)

    def _make_ready(self, task: Task) -> None:
        if self._closed and task.kind == THREADED:  # ended: answer what lands, here
            while not task.ended and not task.obj.actor_inbox.empty():
                steps.threaded_step(self, task)
            return
        if not task.queued and not task.ended:
            task.queued = True
            self._ready.append(task)

    # -- waiting -------------------------------------------------------------------------------

    def wait(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Run other tasks until ``done()``; ``False`` once ``timeout`` virtual seconds
        passed with nothing left to run before then (the clock is then at the bound)."""
        if done():
            return True
        if self._closed:
            return False
        deadline = float("inf") if timeout is None else self.now_seconds + max(timeout, 0.0)
        # Callers (and the event loop) run inside the waits of callers and of the test,
        # never inside a wait of the runtime's tasks (an actor, the committer, a timer).
        callers = all(t.kind == CALLER or t.kind == LOOP for t in self._stack)
        while not done():
            if not self._step(deadline, callers):
                return done()
        return True

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, running other tasks meanwhile (for a
        summariser or a callback that stands for slow work)."""
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
        """
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
        """Run until nothing is left to do (timers of the passivator alone do not keep it
        going), or the virtual clock reaches ``until``.

        Raises:
            SimulationError: more than ``max_steps`` steps.
            Exception: whatever a caller raised (the run's failure).
        """
        deadline = float("inf") if until is None else until
        while self._step(deadline, callers, top=True):
            pass
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
        if pinned is not None:
            c = pinned[i] % n if i < len(pinned) else 0
        else:
            c = self.rng.randrange(n)
        self.decisions.append(c)
        return c

    def _runnable(self, task: Task, callers: bool) -> bool:
        if task in self._stack:
            return False
        kind = task.kind
        if kind == CALLER:
            if not callers:
                return False
            w = task.waiting
            if w is not None and is_done(w):
                return True
            return task.until <= self.now_seconds  # slept enough, or waited its bound
        if kind == COMMITTER:
            return task.until <= self.now_seconds
        if kind == LOOP:
            return callers and task.obj.runnable()
        # A timer that re-arms itself forever (the passivator, the hand-over) may ask the
        # registry; inside a wait of the registry's own step it could only wait out its
        # bound. It runs where callers run (a thread's timer would wait for the registry).
        return callers or not task.daemon

    def _step(self, deadline: float, callers: bool, top: bool = False) -> bool:
        """Take one step; ``False`` if nothing can run before ``deadline``."""
        if self._failure is not None and top:
            return False
        while True:
            self._fire_timers()
            ready = [t for t in self._ready if self._runnable(t, callers)]
            if ready:
                break
            nxt = self._next_wake(callers, top and deadline == float("inf"))
            if nxt is None or nxt > deadline:
                if deadline != float("inf") and self.now_seconds < deadline:
                    self.now_seconds = deadline
                return False
            self.now_seconds = nxt
        if self.steps >= self.max_steps:
            raise SimulationError(
                f"no end after {self.max_steps} steps (a livelock, or raise max_steps)"
            )
        inject_faults(self)
        task = ready[self.choose(len(ready))]
        self.steps += 1
        self._stack.append(task)
        try:
            if self._loop_depth and task.kind != LOOP:
                self._take_off_loop(task)  # as a thread would: no running loop
            else:
                self._take(task)
        finally:
            self._stack.pop()
        return True

    def _take_off_loop(self, task: Task) -> None:
        prev = events._get_running_loop()
        events._set_running_loop(None)
        try:
            self._take(task)
        finally:
            events._set_running_loop(prev)

    def _next_wake(self, callers: bool, quiet: bool) -> float | None:
        """The next virtual time at which something becomes runnable (``quiet``: the
        passivator's timers do not count)."""
        times = [when for when, _, _, daemon in self._timers if not (daemon and quiet)]
        for t in self._ready:
            timed = t.kind == COMMITTER or (t.kind == CALLER and callers)
            if timed and t.until > self.now_seconds:
                times.append(t.until)
        if callers and self._loop is not None:
            when = self._loop.next_timer()
            if when is not None:
                times.append(when)
        return min(times) if times else None

    def _fire_timers(self) -> None:
        timers = self._timers
        while timers and timers[0][0] <= self.now_seconds:
            _, _, task, _ = heapq.heappop(timers)
            self._make_ready(task)

    def _take(self, task: Task) -> None:
        kind = task.kind
        if kind == ACTOR:
            steps.turn(self, task)
        elif kind == THREADED:
            steps.threaded_step(self, task)
        elif kind == COMMITTER:
            steps.commit_step(self, task)
        elif kind == CALLER:
            steps.caller_step(self, task)
        elif kind == LOOP:
            loop = task.obj
            handle = loop._ready.popleft()
            self.trace.append(f"{self.steps} {task.label} {describe(handle)}")
            self._loop_depth += 1
            try:
                loop.run_handle(handle)
            finally:
                self._loop_depth -= 1
        else:  # a function or a timer: runs once
            steps.run_once(self, task)

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
        return Schedule(self.schedule.seed, tuple(self.decisions), self._planned)
