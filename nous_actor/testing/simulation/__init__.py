"""Deterministic simulation: every interleaving a test can name, replayed from a seed.

Inside a `Simulation` every actor a test creates (sessions, registries,
supervisors) and everything the runtime would run on a thread of its own (the
store's committer, the recovery readers, summarisers, the passivator, restart
timers) is a *task* of a simulated thread, and exactly one simulated thread
runs at a time, one step at a time, in an order chosen by a seed (or pinned,
or drawn by Hypothesis). Each simulated thread is a real thread handed a baton
by the scheduler (as shuttle and Coyote do), so each has its own stack; a step
that cannot block (a commit, a dispatched actor's turn while no subscriber's
wake-up can be a switch point) runs on the thread that chose it, since passing
the baton between real threads is what a step costs most. Time
is virtual: call bounds, backoff, idle passivation and summariser delays
advance the simulation's clock, never the wall clock, and a timer fires when
the clock reaches it. Faults are part of the schedule: a session crashes, a
commit fails or is slow, a session is stopped, the registry crashes (its
supervisor restarts it).

The same schedule gives the same run, event for event: actor URNs, claim
tokens, compaction ids, event times and restart jitter all come from the seed
and the virtual clock. `Simulation.trace` lists what ran at every step and
`Simulation.digest` hashes it.

Steps are taken by:

* an actor on a dispatcher: one turn of at most ``throughput`` messages, or up
  to four times that when more wait, as the schedule chooses (a real turn takes
  many in a row: appends queued together run as one); a turn that wakes a
  subscriber may be switched away from before it answers;
* an actor with a thread of its own (a registry, a supervisor): one message;
* the store's committer: one batch (its size is a choice of the schedule);
* a reader, a summariser, a timer: the whole function;
* a *caller*: a generator function given to `Simulation.go`, resumed until
  its next ``yield`` (``x = yield future`` waits for it and gives its value,
  ``yield seconds`` sleeps on the virtual clock, ``yield`` alone lets others
  run);
* the simulation's event loop (`Simulation.loop`, a `SimEventLoop`): one ready
  callback. Coroutines given to `Simulation.go` run on it, and so does a
  coroutine summariser of a compaction they ask for; ``asyncio.sleep`` and
  every other timer of the loop wait on the virtual clock.

A blocking wait (``future.get()``, ``handle.stop()``, a registry's ask, a
turn's queue) suspends the simulated thread that waits until what it waits
for is done, or its bound passes on the virtual clock; the others run
meanwhile. A caller never runs inside another's wait. A wait the simulation
does not run (a ``queue.Queue``, a real lock or ``threading.Event``, I/O)
blocks the whole run, since nothing else runs meanwhile: a step that holds
the simulation for ``step_timeout`` real seconds (30 by default) fails the
run with `SimulationStalled`, naming its task. ``time.time()`` and
``time.monotonic()`` stay real: the virtual clock is `Simulation.now`.

The modules, each importing only those before it: `schedule` (schedules and
faults), `tasks` (the runtime's pieces as simulated: dispatcher, futures,
inboxes, the committer's queue, condition variables), `faults` (the faults of a
run and how an actor takes one), `aio` (the event loop), `scheduler`
(`Simulation`: the scheduler, its threads and the step of each kind of task),
`exploring` (replay, explore, find, shrink). Stores under simulation:
`MemoryStore` and `SQLiteStore`.
"""

from __future__ import annotations

from nous_actor.testing.simulation.aio import SimEventLoop
from nous_actor.testing.simulation.exploring import (
    Outcome,
    Scenario,
    SimulationFailure,
    explore,
    find,
    replay,
    shrink,
)
from nous_actor.testing.simulation.schedule import (
    DEFAULT_STEP_TIMEOUT,
    DEFAULT_WAIT,
    EPOCH,
    FAULT_KINDS,
    Fault,
    FaultKind,
    FaultRates,
    Schedule,
    SimulatedCrash,
    SimulationError,
    SimulationStalled,
)
from nous_actor.testing.simulation.scheduler import Simulation

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "DEFAULT_WAIT",
    "EPOCH",
    "FAULT_KINDS",
    "Fault",
    "FaultKind",
    "FaultRates",
    "Outcome",
    "Scenario",
    "Schedule",
    "SimEventLoop",
    "Simulation",
    "SimulationError",
    "SimulationFailure",
    "SimulationStalled",
    "SimulatedCrash",
    "explore",
    "find",
    "replay",
    "shrink",
]
