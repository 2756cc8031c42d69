"""One step of each kind of task: an actor's turn, a threaded actor's message, a commit,
a caller's resumption, a function or a timer."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from nous_actor.runtime.dispatcher import receive_one
from nous_actor.testing.simulation.faults import FailingStore, take_fault
from nous_actor.testing.simulation.schedule import DEFAULT_WAIT
from nous_actor.testing.simulation.tasks import CommitQueue, Task, is_done

if TYPE_CHECKING:
    from nous_actor.testing.simulation.core import Simulation

__all__: list[str] = []


def unqueue(sim: Simulation, task: Task) -> None:
    """Take ``task`` off the run list (it has nothing to do until made ready again)."""
    sim._ready.remove(task)
    task.queued = False


def run_once(sim: Simulation, task: Task) -> None:
    """A function (a thread of the runtime) or a timer: runs whole, once."""
    unqueue(sim, task)
    task.ended = True
    sim.trace.append(f"{sim.steps} {task.label}")
    task.obj()


def turn(sim: Simulation, task: Task) -> None:
    """A dispatched actor: one turn of at most ``throughput`` messages."""
    unqueue(sim, task)
    actor = task.obj
    inbox = actor.actor_inbox
    sim.trace.append(f"{sim.steps} {task.label} {inbox.qsize()}")
    try:
        actor._turn(sim.throughput)
    except BaseException as exc:  # a turn never takes the simulation down (as a thread)
        sim.trace.append(f"{sim.steps} {task.label} turn_failed {type(exc).__name__}")
    inbox._token.release()
    if not inbox._q.empty() and inbox._token.acquire(False):
        sim._make_ready(task)


def run_inline(task: Task) -> None:
    """A dispatched actor after the simulation ended: every message that lands, at once."""
    actor = task.obj
    inbox = actor.actor_inbox
    while True:
        actor._turn(1 << 30)
        inbox._token.release()
        if inbox._q.empty() or not inbox._token.acquire(False):
            return


def threaded_step(sim: Simulation, task: Task) -> None:
    """A thread-per-actor actor: its setup, one message, or its teardown."""
    actor = task.obj
    inbox = actor.actor_inbox
    sim.trace.append(f"{sim.steps} {task.label} {inbox.qsize()}")
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
        unqueue(sim, task)


def commit_step(sim: Simulation, task: Task) -> None:
    """A store's committer: one batch (its size a choice of the schedule), or a stall."""
    queue: CommitQueue = task.send
    items = queue.items
    committer = task.obj
    if not items:
        unqueue(sim, task)
        return
    slow = take_fault(sim, "slow_commit")
    if slow is not None:
        task.until = sim.now_seconds + slow.seconds
        sim.trace.append(f"{sim.steps} {task.label} slow {slow.seconds:g}")
        return
    n = 1 + sim.choose(min(len(items), 4))  # how much of the queue this batch takes
    if n == min(len(items), 4):
        n = len(items)
    batch = [items.popleft() for _ in range(n)]
    fail = take_fault(sim, "fail_commit") or take_fault(sim, "doubt_commit")
    sim.commits += 1
    described = ",".join(
        f"{item.session_id}:{'/'.join(str(ev.seq) for ev in item.events)}" for item in batch
    )
    tag = "" if fail is None else ("FAIL " if fail.kind == "fail_commit" else "DOUBT ")
    sim.trace.append(f"{sim.steps} {task.label} {tag}{len(batch)} {described}")
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
        unqueue(sim, task)


def caller_step(sim: Simulation, task: Task) -> None:
    """A generator caller: resumed until its next ``yield``."""
    sim.trace.append(f"{sim.steps} {task.label}")
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
        yielded = gen.send(_value_of(waited) if sub is None or hasattr(sub, "send") else None)
    except StopIteration:
        task.ended = True
        unqueue(sim, task)
        return
    except BaseException as exc:
        task.ended = True
        unqueue(sim, task)
        if sim._unwinding:
            return
        sim.trace.append(f"{sim.steps} {task.label} failed {type(exc).__name__}")
        if sim._failure is None:
            sim._failure = exc
        return
    if yielded is None:
        return
    if isinstance(yielded, int | float) and not isinstance(yielded, bool):
        task.until = sim.now_seconds + float(yielded)
        return
    # Wait for the future, at most its bound: then the caller goes on (its get()
    # raises the timeout).
    task.waiting = yielded
    bound = getattr(yielded, "_timeout", None)
    task.until = sim.now_seconds + (DEFAULT_WAIT if bound is None else bound)


def _value_of(fut: Any) -> Any:
    """What ``x = yield fut`` gives: the future's value once answered (``None`` if it
    failed or its bound passed first: its ``get()`` then raises)."""
    if fut is None or not is_done(fut):
        return None
    try:
        return fut.get(timeout=0)
    except BaseException:
        return None
