"""Not from Pykka: variants of Pykka's tests that its threading runtime cannot tell apart.

Pykka's ``test_all_actors_are_stopped_on_base_exception`` starts one actor
only, so it never checks that *the others* are stopped. With a thread per
actor they always are; on a dispatcher the actor that stops them runs on a
dispatcher thread, which the others need to handle their stop.
"""

from __future__ import annotations

from typing import Any

from pykka import ActorRegistry

from nous_actor.runtime import DispatchedActor, Dispatcher


class Raiser(DispatchedActor):
    def on_receive(self, message: Any) -> Any:
        if message == "raise base exception":
            raise BaseException
        return message


def test_other_actors_on_a_one_thread_dispatcher_are_stopped_on_base_exception() -> None:
    """Another actor on the same one-thread dispatcher is stopped too (the stop of every
    actor runs off the dispatcher thread, which would otherwise wait for itself)."""
    dispatcher = Dispatcher(1, name="pykka-port-base-exception")

    class OneThreadRaiser(Raiser):
        pass

    OneThreadRaiser.dispatcher = dispatcher
    raiser = OneThreadRaiser.start()
    other = OneThreadRaiser.start()
    assert other.ask("ping", timeout=5) == "ping"
    try:
        raiser.tell("raise base exception")

        assert other.actor_stopped.wait(3)
        assert len(ActorRegistry.get_all()) == 0
    finally:
        # With the bug, ``other`` can never be stopped (its only thread is stuck):
        # leave it out of the registry, so that the teardown's stop_all does not wait.
        ActorRegistry.unregister(other)
