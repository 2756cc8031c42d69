"""Every private name of Pykka the library touches, in one place, with why.

Pykka has no public hook for a new actor type beyond three documented ones, and
none for what a supervisor needs (a crash reported after the actor's last look
at its inbox, a ``BaseException`` kept to the actor it hit). The library
therefore reaches into Pykka only where an actor type must: its inbox, its
future and its loop, and the parts of Pykka's loop that a dispatched turn
reuses. Nothing else of Pykka's private surface is used.

`tests/test_pykka_private.py` keeps this list exact: it reads the package's
source and fails on a private Pykka name used but not listed here (or listed
and no longer used): a method of Pykka's defined in one of our actor or
future classes, any ``._name`` of Pykka's read or set on anything (a ref, an
actor, ``messages``), and any import of a private Pykka module or name
(``pykka._envelope``, ``pykka.messages._ActorStop``). It checks that each name
still exists in the installed Pykka, and that nothing of ours is set on
Pykka's refs (our state lives beside them: `nous_actor.supervision.Cell`).
CI installs the newest Pykka 4.x that pip resolves for ``pykka>=4,<5``, so a
release that renames one of them fails the suite, not a user's program.

Pykka's ``_stop`` must not be shadowed by a subclass: it is how
``ActorRef.stop`` reaches the actor.

Pykka's loop is reused, not copied, except for one part, listed in `COPIED`
with why (the test pins Pykka's original, so a Pykka release that changes it
fails the suite until the copy is checked against it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["COPIED", "PRIVATE"]

PRIVATE: Final[Mapping[str, str]] = {
    # -- a new actor type (the three hooks Pykka documents for one) ----------------------
    "_create_actor_inbox": (
        "DispatchedActor: a C SimpleQueue inbox (a put never takes a Python lock). "
        "SupervisedActor: the host's (Pykka's queue, or a simulation's inbox bound to "
        "the actor's task when it starts)"
    ),
    "_create_future": (
        "DispatchedActor and SupervisedActor: the future an ask returns (a light one "
        "that needs no thread to be answered)"
    ),
    "_start_actor_loop": (
        "DispatchedActor: no thread; the actor's turns run on a shared dispatcher. "
        "SupervisedActor: its thread is a daemon (a program that never stops it exits)"
    ),
    # -- the loop: what a dispatched turn reuses of Pykka's, and where a supervisor hooks in
    "_actor_loop": (
        "SupervisedActor: report the exit to its monitor, and set `finished`, after "
        "Pykka's last look at the inbox, however the actor ended"
    ),
    "_actor_loop_setup": (
        "DispatchedActor's first turn runs it (on_start); _Supervised: a BaseException "
        "from on_start stops only this actor (Pykka stops every actor)"
    ),
    "_actor_loop_teardown": (
        "DispatchedActor: the last turn calls Pykka's (and again for asks that land "
        "after the stop: Pykka's stop race); SessionActor and RegistryActor: answer what is left "
        "in the inbox with the session's own errors; the simulation runs it as a step"
    ),
    "_handle_receive": (
        "a dispatched turn calls it per message; _Supervised: a BaseException in a "
        "handler stays with this actor; SessionActor: its own calls are dispatched "
        "before Pykka's chain of isinstance checks (the hot path)"
    ),
    "_handle_failure": (
        "a dispatched turn calls it for a failed message; _Supervised: the exception "
        "that crashed a tell is recorded as the exit reason"
    ),
    "_actor_ref": (
        "DispatchedActor.__init__ makes the actor's ref as Pykka's Actor.__init__ does "
        "(see COPIED)"
    ),
    "_stop": (
        "a dispatched turn stops the actor as Pykka's loop does; SessionActor stops "
        "itself at once (a hand-off, a fatal store error) without a trip through its inbox"
    ),
    # -- a forked child -------------------------------------------------------------------
    "_actor_refs_lock": (
        "nous_actor.supervision.actor: in a forked child, the registry's lock is made "
        "afresh before the parent's actors (no thread of theirs is here) are unregistered "
        "(a parent's thread may have held it as it forked; Pykka registers no fork hook)"
    ),
    # -- futures --------------------------------------------------------------------------
    "_get_hook": (
        "SessionFuture and the simulation's future: a future made by map/filter/join "
        "is computed by a blocking get, which they must not replace"
    ),
    "_get_hook_result": (
        "SessionFuture: Pykka's Future.__init__ is done in place, its 'not computed yet' "
        "marker one shared instance (Pykka makes one per future, an object more for the "
        "cyclic collector to track per call in flight)"
    ),
    "_result": (
        "the simulation's future: whether it is answered, without blocking (the "
        "simulation runs other steps until it is)"
    ),
}
"""Pykka's private name -> where the library uses it, and why."""

COPIED: Final[Mapping[str, str]] = {
    "Actor._actor_loop_running": (
        "`nous_actor.runtime.dispatcher.receive_one` is the body of its loop, for one "
        "envelope. Pykka's method cannot be called for that: it blocks on the inbox "
        "until the actor stops (a dispatched turn ends after a quota of messages, a "
        "simulation's step after one), and on a BaseException it calls the blocking "
        "ActorRegistry.stop_all(), whose stop requests on a dispatcher thread would wait "
        "for that very thread (the copy stops the others without waiting). Also left "
        "out: Pykka's INFO log of an exception returned to the caller. Everything else "
        "(the answer, set_exception, _handle_failure then on_failure, _stop) is as in "
        "Pykka, which tests/pykka_port checks on DispatchedActor."
    ),
    "Actor.__init__": (
        "DispatchedActor.__init__ sets the same four fields (urn, inbox, stopped, ref) "
        "instead of calling it: Pykka names each actor with uuid.uuid4(), a draw from "
        "os.urandom that lets go of the GIL, and with other threads busy the thread "
        "starting the actor waits ~0.2 ms to get it back (opening 10,000 sessions paid "
        "it 10,000 times on the registry's thread); the urn is made by "
        "nous_actor.core.ids.unique_hex, in Pykka's form. It would also make a "
        "threading.Event for actor_stopped that a Flag replaces at once."
    ),
}
"""Pykka's code that the library copies instead of calling -> where, and why."""
