"""Deterministic simulation: every interleaving a test can name, replayed from a seed.

Inside a `Simulation` every actor a test creates (sessions, registries,
supervisors) and everything the runtime would run on a thread of its own (the
store's committer, the recovery readers, summarisers, the passivator, restart
timers) is a *task* that runs on the test's own thread, one step at a time, in
an order chosen by a seed (or pinned, or drawn by Hypothesis). Time is
virtual: call bounds, backoff, idle passivation and summariser delays advance
the simulation's clock, never the wall clock. Faults are part of the schedule:
a session crashes, a commit fails or is slow, a session is stopped, the
registry crashes (its supervisor restarts it).

The same schedule gives the same run, event for event: actor URNs, claim
tokens, compaction ids, event times and restart jitter all come from the seed
and the virtual clock. `Simulation.trace` lists what ran at every step and
`Simulation.digest` hashes it.

Steps are taken by:

* an actor on a dispatcher: one turn of at most ``throughput`` messages;
* an actor with a thread of its own (a registry, a supervisor): one message;
* the store's committer: one batch (its size is a choice of the schedule);
* a reader, a summariser, a timer: the whole function;
* a *caller*: a generator function given to `Simulation.go`, resumed until
  its next ``yield`` (``yield future`` waits for it, ``yield seconds`` sleeps
  on the virtual clock, ``yield`` alone lets others run).

A blocking wait (``future.get()``, ``handle.stop()``, a registry's ask) runs
other tasks until what it waits for is done, or its bound passes on the
virtual clock. A wait inside a task runs only the runtime's tasks, never a
caller (a caller never runs inside another's wait).

Stores under simulation: `MemoryStore` and `SQLiteStore`.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import pykka

from nous_actor.core import clock as core_clock
from nous_actor.errors import StoreError
from nous_actor.runtime import scheduling
from nous_actor.runtime.dispatcher import DispatchedActor, Dispatcher, receive_one
from nous_actor.store import committer as committer_module

__all__ = [
    "EPOCH",
    "FAULT_KINDS",
    "Fault",
    "FaultKind",
    "FaultRates",
    "Outcome",
    "Schedule",
    "Simulation",
    "SimulationError",
    "SimulationFailure",
    "SimulatedCrash",
    "explore",
    "find",
    "replay",
    "shrink",
]

FaultKind = Literal[
    "crash", "stop", "fail_commit", "doubt_commit", "slow_commit", "restart_registry"
]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    "crash",
    "stop",
    "fail_commit",
    "doubt_commit",
    "slow_commit",
    "restart_registry",
)

DEFAULT_WAIT: Final = 30.0
"""Virtual seconds a caller waits for a yielded future without a bound of its own."""

EPOCH: Final = datetime(2030, 1, 1, tzinfo=UTC)
"""Virtual time 0 as a wall-clock time (the time of events made in a simulation)."""


class SimulationError(RuntimeError):
    """The simulation itself cannot go on (a step limit reached, a wrong use)."""


class SimulatedCrash(BaseException):
    """What a ``crash`` fault crashes an actor with (a ``BaseException``, as an actor's
    crash is: a handler that raised an ``Exception`` only fails its call)."""


@dataclass(frozen=True)
class Fault:
    """A fault the schedule injects: armed at ``step``, it fires at the first chance.

    * ``crash``: a live session crashes (the ``target``-th, modulo how many are live);
    * ``stop``: a live session is stopped (normally; its next call reopens it);
    * ``fail_commit``: the next commit fails (nothing written; sessions see a
      store failure);
    * ``doubt_commit``: the next commit is written but reported failed (a connection
      lost after the commit: its appends are stored, never acknowledged);
    * ``slow_commit``: the next commit waits ``seconds`` of virtual time;
    * ``restart_registry``: a live registry crashes (its supervisor restarts it).
    """

    step: int
    kind: FaultKind
    target: int = 0
    seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"a fault's kind is one of {FAULT_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class FaultRates:
    """Chances per step that a seeded schedule injects each fault (drawn up front)."""

    crash: float = 0.0
    stop: float = 0.0
    fail_commit: float = 0.0
    doubt_commit: float = 0.0
    slow_commit: float = 0.0
    restart_registry: float = 0.0
    horizon: int = 400
    """Steps over which faults are drawn."""

    def draw(self, rng: random.Random) -> tuple[Fault, ...]:
        out: list[Fault] = []
        rates = [(kind, getattr(self, kind)) for kind in FAULT_KINDS if getattr(self, kind)]
        rand = rng.random
        for step in range(self.horizon):
            for kind, rate in rates:
                if rand() < rate:
                    out.append(Fault(step, kind, rng.randrange(1 << 16), rng.choice((0.5, 2.0))))
        return tuple(out)


@dataclass(frozen=True)
class Schedule:
    """Everything that decides a run: a seed, or pinned choices, and the faults.

    With ``choices`` (a pinned schedule) every decision of the run is read from
    it in turn (modulo the number of options); past its end the first option is
    taken. Without, decisions are drawn from ``seed``. ``faults`` are injected as
    they come due; with ``rates`` and no explicit faults they are drawn from the seed.
    """

    seed: int = 0
    choices: tuple[int, ...] | None = None
    faults: tuple[Fault, ...] = ()
    rates: FaultRates | None = None

    def __str__(self) -> str:
        parts = [f"seed={self.seed}"]
        if self.choices is not None:
            parts.append(f"choices={list(self.choices)}")
        if self.faults:
            parts.append(f"faults={list(self.faults)}")
        return f"Schedule({', '.join(parts)})"


# -- tasks ---------------------------------------------------------------------------------

ACTOR, THREADED, FUNCTION, TIMER, CALLER, COMMITTER = range(6)


class _Task:
    __slots__ = (
        "began",
        "ended",
        "gen",
        "id",
        "kind",
        "label",
        "obj",
        "queued",
        "send",
        "until",
        "waiting",
    )

    def __init__(self, kind: int, label: str, obj: Any, tid: int) -> None:
        self.kind = kind
        self.label = label
        self.obj = obj
        self.id = tid
        self.queued = False  # in the run list
        self.began = False
        self.ended = False
        self.gen: Generator[Any, Any, Any] | None = None
        self.waiting: Any = None  # a future a caller waits for
        self.until = 0.0  # a caller's or committer's virtual wake time
        self.send: Any = None


class _SimDispatcher(Dispatcher):
    """The dispatcher of a simulation: a runnable actor becomes a ready task."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(1, throughput=sim.throughput, name="nous-sim")
        self._sim = sim

    def _schedule(self, actor: DispatchedActor) -> None:
        self._sim._actor_ready(actor)

    def close(self, timeout: float = 5.0) -> None:  # a pinned actor's end: nothing to stop
        pass


class _SimFuture(pykka.ThreadingFuture[Any]):
    """A Pykka future whose ``get`` runs the simulation while it waits."""

    def __init__(self, sim: Simulation | None = None) -> None:
        super().__init__()
        host = scheduling.host if sim is None else sim
        if not isinstance(host, Simulation):
            raise SimulationError("a simulated future outside its simulation")
        self._sim = host

    def _done(self) -> bool:
        return self._result is not None

    def get(self, *, timeout: float | None = None) -> Any:
        if self._result is None and self._get_hook is None:
            self._sim.wait(self._done, timeout)
            if self._result is None:
                raise pykka.Timeout(f"{timeout} seconds (virtual)")
        return super().get(timeout=timeout)


class _SimInbox:
    """The inbox of a thread-per-actor actor under simulation: a put makes it ready."""

    __slots__ = ("_q", "_sim", "_task")

    def __init__(self, sim: Simulation, task: _Task, items: Iterable[Any]) -> None:
        self._sim = sim
        self._task = task
        self._q: deque[Any] = deque(items)

    def put(self, envelope: Any, /) -> None:
        self._q.append(envelope)
        self._sim._make_ready(self._task)

    def put_nowait(self, envelope: Any, /) -> None:
        self.put(envelope)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return self._q.popleft()

    def get_nowait(self) -> Any:
        return self._q.popleft()

    def empty(self) -> bool:
        return not self._q

    def qsize(self) -> int:
        return len(self._q)


class _CommitQueue:
    """A committer's queue under simulation: items wait for the committer's next step."""

    __slots__ = ("_sim", "items", "task")

    def __init__(self, sim: Simulation, task: _Task) -> None:
        self._sim = sim
        self.task = task
        self.items: deque[Any] = deque()

    def put(self, item: Any) -> None:
        if item is None:  # close(): nothing to stop
            return
        self.items.append(item)
        self._sim._make_ready(self.task)

    def get_nowait(self) -> Any:
        return self.items.popleft()

    def empty(self) -> bool:
        return not self.items


class _FailingStore:
    """What a ``fail_commit`` fault writes to: it refuses every write, storing nothing (or,
    ``written``, stores it and then fails: a ``doubt_commit``)."""

    def __init__(self, store: Any, written: bool = False) -> None:
        self._store = store
        self._written = written

    def write(self, appends: Any) -> dict[str, StoreError]:
        if self._written:
            self._store.write(appends)
            raise StoreError(
                "simulated commit failure after the write (a fault of the schedule); "
                "whether it was stored is unknown"
            )
        raise StoreError("simulated commit failure (a fault of the schedule); nothing written")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


# -- the simulation ------------------------------------------------------------------------


class Simulation:
    """A deterministic run of actors, threads and timers on this thread (a context manager).

    Args:
        schedule: the seed, or pinned choices, and the faults (default: seed 0,
            no faults). A plain int is a seed.
        max_steps: a run that takes more steps fails with `SimulationError`.
        throughput: messages a dispatched actor handles per step.

    Use it as ``with Simulation(seed) as sim:``; create the registry, sessions
    and stores inside, start callers with `go`, then `run`. Leaving the block
    stops every actor the simulation ran and puts the runtime back on real
    threads and time. Simulations do not nest, and other threads of the
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
        self.dispatcher = _SimDispatcher(self)
        self._ready: list[_Task] = []
        self._timers: list[tuple[float, int, _Task, bool]] = []
        self._tasks: dict[int, _Task] = {}  # id(obj) -> task, for actors and committers
        self._actors: list[_Task] = []  # every actor task, in creation order
        self._callers: list[_Task] = []
        self._stack: list[_Task] = []
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
        """Stop every actor the simulation ran and put the runtime back on threads."""
        if not self._open:
            return
        try:
            try:
                self._stop_actors()
            except Exception:
                if self._failure is None:
                    raise
        finally:
            self._open = False
            self._closed = True
            uuid4, clock, state = self._saved
            uuid.uuid4 = uuid4
            core_clock.set_utcnow(clock)
            random.setstate(state)
            with committer_module._committers_lock:
                for store, c in self._committers:
                    if committer_module._committers.get(store) is c:
                        del committer_module._committers[store]
            scheduling.uninstall(self)

    def _stop_actors(self) -> None:
        for task in self._actors:
            actor = task.obj
            if not actor.actor_stopped.is_set():
                try:
                    actor.actor_ref.stop(block=False)
                except pykka.ActorDeadError:
                    pass
        saved, self.max_steps = self.max_steps, self.steps + 100_000
        failure, self._failure = self._failure, None  # stop them after a failure too
        try:
            self.run(callers=False)
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

    def _task(self, kind: int, label: str, obj: Any) -> _Task:
        self._next_id += 1
        return _Task(kind, f"{label}#{self._next_id}", obj, self._next_id)

    def spawn(self, fn: Callable[[], None], name: str) -> None:
        task = self._task(FUNCTION, name, fn)
        self._make_ready(task)

    def call_later(
        self, delay: float, fn: Callable[[], None], name: str, daemon: bool = False
    ) -> None:
        task = self._task(TIMER, name, fn)
        self._next_id += 1
        heapq.heappush(
            self._timers, (self.now_seconds + max(delay, 0.0), self._next_id, task, daemon)
        )

    def future(self) -> Any:
        return _SimFuture(self)

    def adopt(self, actor: Any) -> None:
        task = self._task(THREADED, _actor_label(actor), actor)
        inbox = _SimInbox(self, task, _drain_queue(actor.actor_inbox))
        actor.actor_inbox = inbox
        actor.actor_ref.actor_inbox = inbox
        self._actors.append(task)
        self._tasks[id(actor)] = task
        self._make_ready(task)

    def committer_queue(self, committer: Any) -> Any:
        task = self._task(COMMITTER, "committer", committer)
        store = committer._store()
        self._committers.append((store, committer))
        queue = _CommitQueue(self, task)
        task.send = queue
        return queue

    def _actor_ready(self, actor: DispatchedActor) -> None:
        task = self._tasks.get(id(actor))
        if task is None or task.obj is not actor:
            task = self._task(ACTOR, _actor_label(actor), actor)
            self._tasks[id(actor)] = task
            self._actors.append(task)
        if self._closed:  # the simulation ended: answer what lands, here
            self._run_inline(task)
            return
        self._make_ready(task)

    def _make_ready(self, task: _Task) -> None:
        if self._closed and task.kind == THREADED:  # ended: answer what lands, here
            while not task.ended and not task.obj.actor_inbox.empty():
                self._threaded_step(task)
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
        # Callers run inside the waits of callers (and of the test), never inside a
        # wait of the runtime's tasks (an actor, the committer, a timer).
        callers = all(t.kind == CALLER for t in self._stack)
        while not done():
            if not self._step(deadline, callers):
                return done()
        return True

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, running other tasks meanwhile (for a
        summariser or a callback that stands for slow work)."""
        until = self.now_seconds + seconds
        self.call_later(seconds, _nothing, "sleep")
        self.wait(lambda: self.now_seconds >= until, None)

    # -- callers -------------------------------------------------------------------------------

    def go(
        self, caller: Callable[[], Any] | Generator[Any, Any, Any], name: str = "caller"
    ) -> None:
        """Start a caller: a generator (or a function returning one, or a plain function,
        run in one step). It is resumed until each ``yield``: ``yield future`` waits for
        the future, ``yield seconds`` sleeps on the virtual clock, a bare ``yield`` lets
        others run. What it raises fails the run."""
        task = self._task(CALLER, name, caller)
        if isinstance(caller, Generator):
            task.gen = caller
        self._callers.append(task)
        self._make_ready(task)

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

    def _runnable(self, task: _Task, callers: bool) -> bool:
        if task in self._stack:
            return False
        if task.kind == CALLER:
            if not callers:
                return False
            w = task.waiting
            if w is not None and _is_done(w):
                return True
            return task.until <= self.now_seconds  # slept enough, or waited its bound
        if task.kind == COMMITTER:
            return task.until <= self.now_seconds
        return True

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
        self._inject_faults()
        task = ready[self.choose(len(ready))]
        self.steps += 1
        self._stack.append(task)
        try:
            self._take(task)
        finally:
            self._stack.pop()
        return True

    def _next_wake(self, callers: bool, quiet: bool) -> float | None:
        """The next virtual time at which something becomes runnable (``quiet``: the
        passivator's timers do not count)."""
        times = [when for when, _, _, daemon in self._timers if not (daemon and quiet)]
        for t in self._ready:
            timed = t.kind == COMMITTER or (t.kind == CALLER and callers)
            if timed and t.until > self.now_seconds:
                times.append(t.until)
        return min(times) if times else None

    def _fire_timers(self) -> None:
        timers = self._timers
        while timers and timers[0][0] <= self.now_seconds:
            _, _, task, _ = heapq.heappop(timers)
            self._make_ready(task)

    def _take(self, task: _Task) -> None:
        kind = task.kind
        if kind == ACTOR:
            self._ready.remove(task)
            task.queued = False
            self._turn(task)
        elif kind == THREADED:
            self._threaded_step(task)
        elif kind == COMMITTER:
            self._commit_step(task)
        elif kind == CALLER:
            self._caller_step(task)
        else:  # a function or a timer: runs once
            self._ready.remove(task)
            task.queued = False
            task.ended = True
            self.trace.append(f"{self.steps} {task.label}")
            task.obj()

    def _turn(self, task: _Task) -> None:
        actor = task.obj
        inbox = actor.actor_inbox
        n = inbox.qsize()
        self.trace.append(f"{self.steps} {task.label} {n}")
        try:
            actor._turn(self.throughput)
        except BaseException as exc:  # a turn never takes the simulation down (as a thread)
            self.trace.append(f"{self.steps} {task.label} turn_failed {type(exc).__name__}")
        inbox._token.release()
        if not inbox._q.empty() and inbox._token.acquire(False):
            self._make_ready(task)

    def _run_inline(self, task: _Task) -> None:
        actor = task.obj
        inbox = actor.actor_inbox
        while True:
            actor._turn(1 << 30)
            inbox._token.release()
            if inbox._q.empty() or not inbox._token.acquire(False):
                return

    def _threaded_step(self, task: _Task) -> None:
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
            self._ready.remove(task)
            task.queued = False

    def _commit_step(self, task: _Task) -> None:
        queue: _CommitQueue = task.send
        items = queue.items
        committer = task.obj
        if not items:
            self._ready.remove(task)
            task.queued = False
            return
        slow = self._take_fault("slow_commit")
        if slow is not None:
            task.until = self.now_seconds + slow.seconds
            self.trace.append(f"{self.steps} {task.label} slow {slow.seconds:g}")
            return
        n = 1 + self.choose(min(len(items), 4))  # how much of the queue this batch takes
        if n == min(len(items), 4):
            n = len(items)
        batch = [items.popleft() for _ in range(n)]
        fail = self._take_fault("fail_commit") or self._take_fault("doubt_commit")
        self.commits += 1
        described = ",".join(
            f"{item.session_id}:{'/'.join(str(ev.seq) for ev in item.events)}" for item in batch
        )
        tag = "" if fail is None else ("FAIL " if fail.kind == "fail_commit" else "DOUBT ")
        self.trace.append(f"{self.steps} {task.label} {tag}{len(batch)} {described}")
        if fail is not None:
            real = committer._store
            written = fail.kind == "doubt_commit"
            committer._store = lambda: _FailingStore(real(), written)
            try:
                committer._write(batch)
            finally:
                committer._store = real
        else:
            committer._write(batch)
        if not items:
            self._ready.remove(task)
            task.queued = False

    def _caller_step(self, task: _Task) -> None:
        self.trace.append(f"{self.steps} {task.label}")
        task.waiting = None
        gen = task.gen
        try:
            if gen is None:
                out = task.obj()
                if isinstance(out, Generator):
                    task.gen = gen = out
                else:
                    raise StopIteration
            yielded = next(gen)
        except StopIteration:
            task.ended = True
            self._ready.remove(task)
            task.queued = False
            return
        except BaseException as exc:
            task.ended = True
            self._ready.remove(task)
            task.queued = False
            self.trace.append(f"{self.steps} {task.label} failed {type(exc).__name__}")
            if self._failure is None:
                self._failure = exc
            return
        if yielded is None:
            return
        if isinstance(yielded, int | float) and not isinstance(yielded, bool):
            task.until = self.now_seconds + float(yielded)
            return
        # Wait for the future, at most its bound: then the caller goes on (its get()
        # raises the timeout).
        task.waiting = yielded
        bound = getattr(yielded, "_timeout", None)
        task.until = self.now_seconds + (DEFAULT_WAIT if bound is None else bound)

    # -- faults --------------------------------------------------------------------------------

    def _inject_faults(self) -> None:
        faults = self.faults
        while faults and faults[0].step <= self.steps:
            self._armed.append(faults.popleft())
        if not self._armed:
            return
        keep: list[Fault] = []
        for fault in self._armed:
            if fault.kind in ("fail_commit", "doubt_commit", "slow_commit"):
                keep.append(fault)  # taken by the committer's next step
            elif not self._apply(fault):
                keep.append(fault)
        self._armed = keep

    def _take_fault(self, kind: str) -> Fault | None:
        for i, fault in enumerate(self._armed):
            if fault.kind == kind:
                del self._armed[i]
                self.injected.append(fault)
                return fault
        return None

    def _apply(self, fault: Fault) -> bool:
        self._actors = [t for t in self._actors if not _finished(t)]
        if fault.kind == "restart_registry":
            targets = [
                t
                for t in self._actors
                if t.kind == THREADED
                and type(t.obj).__name__ == "RegistryActor"
                and not t.obj.actor_stopped.is_set()
                and t.began
                and t not in self._stack
            ]
        else:
            targets = [
                t
                for t in self._actors
                if hasattr(t.obj, "session_id")
                and t.kind == ACTOR
                and not t.obj.actor_stopped.is_set()
                and not getattr(t.obj, "_loading", False)
                and t.obj._began
                and t not in self._stack
            ]
        if not targets:
            return False
        task = targets[fault.target % len(targets)]
        actor = task.obj
        self.injected.append(fault)
        self.trace.append(f"{self.steps} FAULT {fault.kind} {task.label}")
        if fault.kind == "stop":
            actor.actor_ref.stop(block=False)
            return True
        crash = SimulatedCrash(f"{fault.kind} at step {self.steps} (a fault of the schedule)")
        if task.kind == THREADED:
            actor._crash(crash)
            self._make_ready(task)
            return True
        die = getattr(actor, "_die", None)
        if die is not None:
            die(crash)
        else:
            actor._crash(crash)
        inbox = actor.actor_inbox
        if inbox._token.acquire(False):  # not scheduled: its teardown needs a turn
            self._make_ready(task)
        return True

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


def _finished(task: _Task) -> bool:
    """An actor task whose actor has ended (stopped and answered its inbox)."""
    return task.ended or bool(getattr(task.obj, "_ended", False))


def _nothing() -> None:
    pass


def _is_done(fut: Any) -> bool:
    done = getattr(fut, "done", None)
    if done is not None:
        return bool(done())
    return getattr(fut, "_result", None) is not None


def _drain_queue(q: Any) -> list[Any]:
    items = []
    while not q.empty():
        items.append(q.get_nowait())
    return items


def _actor_label(actor: Any) -> str:
    sid = getattr(actor, "session_id", None)
    name = type(actor).__name__
    return name if sid is None else f"{name}({sid})"


# -- exploring, shrinking, replaying ----------------------------------------------------------

Scenario = Callable[[Simulation], None]
"""``scenario(sim)``: builds what it tests inside ``sim``, starts callers, runs it and
checks its invariants (raises ``AssertionError`` when one breaks)."""


@dataclass
class Outcome:
    """One run of a scenario: what broke (or ``None``), the trace and its digest."""

    schedule: Schedule
    error: BaseException | None
    trace: list[str] = field(repr=False)
    digest: str
    steps: int
    replay: Schedule = field(repr=False)


def replay(scenario: Scenario, schedule: Schedule | int, *, max_steps: int = 50_000) -> Outcome:
    """Run ``scenario`` once under ``schedule``: the same schedule, the same outcome."""
    sim = Simulation(schedule, max_steps=max_steps)
    error: BaseException | None = None
    try:
        with sim:
            scenario(sim)
            sim.run()
    except (AssertionError, SimulationError, Exception) as exc:
        error = exc
    return Outcome(sim.schedule, error, sim.trace, sim.digest(), sim.steps, sim.replay_schedule())


class SimulationFailure(AssertionError):
    """A scenario failed under a schedule: the seed, the shortest failing schedule found,
    and how to replay it."""

    def __init__(self, outcome: Outcome, shrunk: Outcome, tried: int) -> None:
        self.outcome = outcome
        self.shrunk = shrunk
        self.seed = outcome.schedule.seed
        self.schedule = shrunk.schedule
        self.schedules_run = tried
        super().__init__(
            f"the scenario failed under seed {self.seed} (schedule {tried} of the run): "
            f"{type(outcome.error).__name__}: {outcome.error}\n"
            f"shortest failing schedule ({len(shrunk.schedule.choices or ())} choices, "
            f"{len(shrunk.schedule.faults)} faults, {shrunk.steps} steps): {shrunk.schedule}\n"
            f"replay it with nous_actor.testing.simulation.replay(scenario, {shrunk.schedule!r})"
        )


def explore(
    scenario: Scenario,
    seeds: Iterable[int] = range(200),
    *,
    rates: FaultRates | None = None,
    max_steps: int = 50_000,
    shrink_runs: int = 200,
) -> int:
    """Run ``scenario`` under each seed; the number of schedules run if none failed.

    Raises:
        SimulationFailure: a schedule failed (with its seed and the shortest
            failing schedule found from it, pinned, to replay).
    """
    n = 0
    for n, seed in enumerate(seeds, 1):
        out = replay(scenario, Schedule(seed, rates=rates), max_steps=max_steps)
        if out.error is not None:
            raise SimulationFailure(out, shrink(scenario, out, runs=shrink_runs), n)
    return n


def find(
    scenario: Scenario,
    seeds: Iterable[int] = range(200),
    *,
    rates: FaultRates | None = None,
    max_steps: int = 50_000,
) -> tuple[int, Outcome] | None:
    """The first failing schedule among ``seeds``: (how many were run, its outcome)."""
    for n, seed in enumerate(seeds, 1):
        out = replay(scenario, Schedule(seed, rates=rates), max_steps=max_steps)
        if out.error is not None:
            return n, out
    return None


def shrink(scenario: Scenario, failing: Outcome, *, runs: int = 200) -> Outcome:
    """A shorter pinned schedule that still fails the same way (same exception type), by
    dropping faults and cutting and zeroing choices, within ``runs`` runs."""
    best = failing
    kind = type(failing.error)
    budget = [runs]

    def fails(s: Schedule) -> Outcome | None:
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        out = replay(scenario, s)
        return out if isinstance(out.error, kind) else None

    first = fails(failing.replay)
    if first is None:
        return failing
    best = first
    # drop faults one at a time
    i = 0
    while i < len(best.schedule.faults) and budget[0] > 0:
        faults = best.schedule.faults[:i] + best.schedule.faults[i + 1 :]
        out = fails(replace(best.schedule, faults=faults))
        if out is not None:
            best = replace(out, schedule=replace(out.schedule, faults=faults))
        else:
            i += 1
    # cut the choices: keep the shortest prefix that fails (past it, the first option)
    choices = list(best.schedule.choices or ())
    lo, hi = 0, len(choices)
    while lo < hi and budget[0] > 0:
        mid = (lo + hi) // 2
        out = fails(replace(best.schedule, choices=tuple(choices[:mid])))
        if out is not None:
            hi = mid
            best = out
        else:
            lo = mid + 1
    choices = list((best.schedule.choices or ())[:hi])
    # zero single choices, from the end
    for j in range(len(choices) - 1, -1, -1):
        if budget[0] <= 0:
            break
        if choices[j] == 0:
            continue
        trial = [*choices[:j], 0, *choices[j + 1 :]]
        out = fails(replace(best.schedule, choices=tuple(trial)))
        if out is not None:
            choices = trial
            best = out
    while choices and choices[-1] == 0:
        choices.pop()
    return replace(best, schedule=replace(best.schedule, choices=tuple(choices)))
